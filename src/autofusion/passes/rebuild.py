"""Copying a graph node by node into a fresh builder: the skeleton every rewriting pass shares.

`rebuild(graph, rewrite)` re-creates inputs and constants, then asks `rewrite(emitter, node, inputs)`
for each node: it returns the new output ids, or None to copy the node unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from autofusion.ir.dtypes import DType
from autofusion.ir.graph import Graph, GraphBuilder, Node
from autofusion.ir.types import TensorType


class Emitter:
    """Adds nodes on behalf of one original node, keeping its name and source location."""

    def __init__(self, b: GraphBuilder, node: Node, env: Mapping[int, int] | None = None) -> None:
        self.b = b
        self.node = node
        # Original value id -> new value id, for every value defined before `node` (read-only).
        self.env: Mapping[int, int] = env if env is not None else {}

    def __call__(self, op: str, inputs: Sequence[int], attrs: dict[str, Any] | None = None) -> int:
        return self.b.add(op, inputs, attrs, name=self.node.name, loc=self.node.loc)

    def scalar(self, value: float | int | bool, dtype: DType) -> int:
        return self("full", (), {"value": value, "dtype": dtype})

    def type_of(self, vid: int) -> TensorType:
        return self.b.type_of(vid)

    def producer(self, vid: int) -> Node | None:
        """The node of the new graph that defines `vid` (None for a graph input)."""
        return self.b.producer(vid)


Rewrite = Callable[[Emitter, Node, list[int]], Sequence[int] | None]


def rebuild(graph: Graph, rewrite: Rewrite, origin: list[int] | None = None) -> Graph:
    """`origin`, when given, receives for each new node the index of the original node it came from."""
    b = GraphBuilder(graph.name)
    env: dict[int, int] = {}
    for gi in graph.inputs:
        env[gi.value.id] = b.add_input(gi.value.type, gi.name, gi.role)
    for index, node in enumerate(graph.nodes):
        before = b.mark()[0]
        ins = [env[i] for i in node.inputs]
        b.scope = node.scope  # nodes a rewrite adds for this one keep its SuperKernel scope
        outs: Sequence[int] | None = rewrite(Emitter(b, node, env), node, ins)
        if outs is None:
            if node.op == "const":
                name = node.attr("name")
                outs = (b.add_constant(name, graph.constants[name], node.attr("type")),)
            else:
                outs = b.add_node(node.op, ins, dict(node.attrs), name=node.name, loc=node.loc)
        for v, o in zip(node.outputs, outs, strict=True):
            env[v.id] = o
        if origin is not None:
            origin.extend([index] * (b.mark()[0] - before))
    return b.build([env[o] for o in graph.outputs])


def rebuild_if_changed(graph: Graph, rewrite: Rewrite) -> Graph:
    """`rebuild`, but the original graph object when `rewrite` declined every node (returned None), so
    callers and the pipeline can tell "nothing changed" by identity."""
    changed = False

    def tracking(e: Emitter, node: Node, ins: list[int]) -> Sequence[int] | None:
        nonlocal changed
        out = rewrite(e, node, ins)
        changed |= out is not None
        return out

    out = rebuild(graph, tracking)
    return out if changed else graph
