"""Common-subexpression elimination: one node for each (op, inputs, attributes).

In: a graph. Out: the graph where a node equal to an earlier one is dropped and its users read the
earlier node's outputs. One forward sweep in graph order (deterministic): O(nodes).

Equality is structural and exact. Attribute values are compared with their Python type and `repr`,
so 0.0 and -0.0, 1 and 1.0, and two NaNs are told apart the way results could be. Inputs of
commutative ops (add, mul, eq, logical and bitwise ops; exact in IEEE arithmetic, NaN and signed
zeros included) are compared as a sorted pair. maximum and minimum are not among them: for equal
operands they return the first, and +0.0 == -0.0. Two `const` nodes are the same when they name the
same tensor object. Externs whose ATen target draws random numbers are never merged: two draws are
two different values.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from autofusion.ir.catalog import COMMUTATIVE
from autofusion.ir.graph import Graph, Node
from autofusion.passes.rebuild import Emitter, rebuild

RANDOM_WORDS = ("rand", "normal", "bernoulli", "dropout", "multinomial", "uniform", "exponential", "poisson",
                "cauchy", "geometric", "log_normal")  # fmt: skip


def _key_of(v: Any) -> Any:
    if isinstance(v, tuple):
        return ("tuple", tuple(_key_of(x) for x in v))
    if isinstance(v, (bool, int, float, str)) or v is None:
        return (type(v).__name__, repr(v))
    return (type(v).__name__, v)  # DType, TensorType, Arg: hashable with exact equality


def _is_random(node: Node) -> bool:
    return node.op == "extern" and any(w in str(node.attr("target")).lower() for w in RANDOM_WORDS)


def _node_key(graph: Graph, node: Node, ins: Sequence[int]) -> Any:
    if node.op == "const":
        return ("const", id(graph.constants[node.attr("name")]), node.attr("type"))
    args = tuple(sorted(ins)) if node.op in COMMUTATIVE else tuple(ins)
    return (node.op, args, _key_of(node.attrs))


def _has_duplicates(graph: Graph) -> bool:
    """Without two equal nodes in the original graph, merging can never cascade: nothing to do."""
    keys = set()
    for n in graph.nodes:
        if _is_random(n):
            continue
        k = _node_key(graph, n, n.inputs)
        if k in keys:
            return True
        keys.add(k)
    return False


def eliminate_common_subexpressions(graph: Graph) -> Graph:
    if not _has_duplicates(graph):
        return graph
    seen: dict[Any, Sequence[int]] = {}
    changed = False

    def rewrite(e: Emitter, node: Node, ins: list[int]) -> Sequence[int] | None:
        nonlocal changed
        if _is_random(node):
            return None
        key = _node_key(graph, node, ins)
        if key in seen:
            changed = True
            return seen[key]
        outs = e.b.copy(node, ins, graph.constants)
        seen[key] = outs
        return outs

    out = rebuild(graph, rewrite)
    return out if changed else graph
