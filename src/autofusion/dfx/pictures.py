"""The pictures reports and debug directories show: the graph before fusion, the plan after it, and
one kernel's subgraph, as SVG (dfx/svg.py does the drawing).

In: a `Plan` (its graph is the decomposed graph the solver saw) or one `KernelStep`. Out: SVG text.
Literals (`full`) are left out of the pictures: they are constants folded into the kernels.
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence

from autofusion.dfx.svg import Box, graph_svg
from autofusion.ir.catalog import KERNEL_EXCLUDED, VIEWS
from autofusion.ir.graph import Graph, Node
from autofusion.plan.schedule import NO_TRAFFIC, KernelStep, Plan

HIDDEN = frozenset({"full"})


def _node_boxes(nodes: Sequence[Node], boxes: list[Box], owner: dict[int, str]) -> list[tuple[str, str]]:
    """Append a box per visible node and return the edges from the boxes that own each input;
    `owner` (value id -> box id) is updated as outputs appear."""
    edges: list[tuple[str, str]] = []
    for n in nodes:
        if n.op in HIDDEN:
            continue
        box = _node_box(n)
        boxes.append(box)
        edges += [(owner[i], box.id) for i in dict.fromkeys(n.inputs) if i in owner]
        for v in n.outputs:
            owner[v.id] = box.id
    return edges


def _kind(node: Node) -> str:
    if node.op in VIEWS:
        return "view"
    return "library" if node.op in KERNEL_EXCLUDED else "op"


def _node_box(node: Node) -> Box:
    return Box(
        f"n:{node.name}",
        [node.name, f"{node.op} {node.outputs[0].type}" if node.outputs else node.op],
        _kind(node),
    )


def _inputs(graph: Graph, used: set[int]) -> tuple[list[Box], dict[int, str]]:
    boxes, owner = [], {}
    for gi in graph.inputs:
        if gi.value.id in used:
            boxes.append(Box(f"in:{gi.value.id}", [gi.name, str(gi.value.type)], "input"))
            owner[gi.value.id] = boxes[-1].id
    return boxes, owner


def _outputs(graph: Graph, owner: dict[int, str]) -> tuple[list[Box], list[tuple[str, str]]]:
    boxes, edges = [], []
    for k, vid in enumerate(graph.outputs):
        boxes.append(Box(f"out:{k}", [f"output {k}"], "output"))
        if vid in owner:
            edges.append((owner[vid], boxes[-1].id))
    return boxes, edges


def before_svg(plan: Plan) -> str:
    g = plan.graph
    used = {i for n in g.nodes for i in n.inputs}
    boxes, owner = _inputs(g, used)
    edges = _node_boxes(g.nodes, boxes, owner)
    outs, out_edges = _outputs(g, owner)
    return graph_svg(boxes + outs, edges + out_edges, f"{g.name}: before fusion ({len(g.nodes)} IR nodes)")


def kernel_lines(step: KernelStep, width: int = 44) -> list[str]:
    ops = list(dict.fromkeys(str(n.op) for n in step.kernel.nodes if n.op not in NO_TRAFFIC)) or ["copy"]
    return [step.name, *textwrap.wrap(" ".join(ops), width)]


def after_svg(plan: Plan) -> str:
    g = plan.graph
    used = {v for s in plan.steps for v in s.inputs}
    boxes, owner = _inputs(g, used)
    edges: list[tuple[str, str]] = []
    for i, step in enumerate(plan.steps):
        if isinstance(step, KernelStep):
            box = Box(f"s:{i}", kernel_lines(step), "kernel")
        else:
            if step.node.op in HIDDEN:
                continue
            box = _node_box(step.node)
            box.id = f"s:{i}"
        ins, outs = step.inputs, step.outputs
        boxes.append(box)
        edges += [(owner[v], box.id) for v in dict.fromkeys(ins) if v in owner]
        for v in outs:
            owner[v] = box.id
    outs_b, out_edges = _outputs(g, owner)
    n_kernels = len(plan.kernels)
    title = f"{g.name}: after fusion ({n_kernels} fused kernels, {len(plan.steps) - n_kernels} other steps)"
    return graph_svg(boxes + outs_b, edges + out_edges, title)


def kernel_svg(step: KernelStep, graph: Graph) -> str:
    """One fused kernel: its input buffers, the IR nodes it computes, its outputs."""
    types = graph.value_types()
    boxes = [Box(f"in:{v}", [f"in {k}", str(types[v])], "input") for k, v in enumerate(step.inputs)]
    owner = {v: f"in:{v}" for v in step.inputs}
    edges = _node_boxes(step.kernel.nodes, boxes, owner)
    for k, vid in enumerate(step.outputs):
        boxes.append(Box(f"out:{vid}", [f"out {k}", str(types[vid])], "output"))
        if vid in owner:
            edges.append((owner[vid], boxes[-1].id))
    return graph_svg(boxes, edges, step.name)
