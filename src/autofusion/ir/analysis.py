"""Use-def facts of a graph, computed once per `Graph` object and shared by every pass that asks.

A `Graph` is immutable (frozen, nodes a tuple), so what is derived from its nodes never goes stale: the
first call builds it in one walk over the nodes and later calls, from any pass, get the same read-only
maps. The cache holds graphs weakly (an entry goes with its graph) and is keyed by identity, because two
equal graphs are not one graph object and a Graph's fields are not hashable.

- `producer(g)`: value id -> index of the node that computes it (graph inputs are absent);
- `uses(g)`: value id -> indices of the nodes reading it, in node order, each node once;
- `node_users(g)`: node index -> indices of the nodes reading any of its outputs, in node order;
- `value_types(g)`: value id -> its TensorType, graph inputs included.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from autofusion.ir.graph import Graph
from autofusion.ir.types import TensorType


@dataclass(frozen=True)
class UseDef:
    producer: Mapping[int, int]
    uses: Mapping[int, tuple[int, ...]]
    node_users: tuple[tuple[int, ...], ...]
    value_types: Mapping[int, TensorType]


_CACHE: dict[int, tuple[weakref.ref[Graph], UseDef]] = {}
_LOCK = threading.Lock()


def use_def(graph: Graph) -> UseDef:
    """The graph's use-def facts (see the module docstring), built on first use."""
    key = id(graph)
    hit = _CACHE.get(key)
    if hit is not None and hit[0]() is graph:
        return hit[1]
    facts = _build(graph)

    def forget(ref: weakref.ref[Graph], key: int = key) -> None:
        with _LOCK:
            if _CACHE.get(key, (None,))[0] is ref:
                del _CACHE[key]

    with _LOCK:
        _CACHE[key] = (weakref.ref(graph, forget), facts)
    return facts


def _build(graph: Graph) -> UseDef:
    types = {i.value.id: i.value.type for i in graph.inputs}
    producer: dict[int, int] = {}
    uses: dict[int, list[int]] = {}
    node_users: list[list[int]] = [[] for _ in graph.nodes]
    for k, n in enumerate(graph.nodes):
        for i in dict.fromkeys(n.inputs):
            uses.setdefault(i, []).append(k)
            p = producer.get(i)
            if p is not None and (not node_users[p] or node_users[p][-1] != k):
                node_users[p].append(k)
        for v in n.outputs:
            producer[v.id] = k
            types[v.id] = v.type
    return UseDef(
        MappingProxyType(producer),
        MappingProxyType({v: tuple(ks) for v, ks in uses.items()}),
        tuple(tuple(ks) for ks in node_users),
        MappingProxyType(types),
    )


def producer(graph: Graph) -> Mapping[int, int]:
    return use_def(graph).producer


def uses(graph: Graph) -> Mapping[int, tuple[int, ...]]:
    return use_def(graph).uses


def node_users(graph: Graph) -> tuple[tuple[int, ...], ...]:
    return use_def(graph).node_users


def value_types(graph: Graph) -> Mapping[int, TensorType]:
    return use_def(graph).value_types
