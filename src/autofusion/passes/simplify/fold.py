"""Constant folding: evaluate at compile time the nodes whose inputs are all literals or constants.

In: a graph. Out: the same computation where such a node is replaced by its value: a `full` literal
when every element is equal (kernels keep those as immediates, free of memory traffic), otherwise a
`const` node holding the tensor in `Graph.constants`.

Values are computed by the reference runtime, so a folded value is exactly what the reference
runtime computes for that node. (Generated kernels compute half types in fp32 and round once at the
end; a folded fp16 chain rounds after each op, as eager torch does.)

Never folded: views of constants (reshape, permute, expand, slice, select: free as index arithmetic,
and a matmul reads a transposed constant in place, or as `linear`, where a folded copy would not),
sources themselves (const, full, arange), externs (an ATen op may be random or
depend on global state), anchors (library compute on constants is rare and large), and any node
whose result holds more than `max_elements` elements, so we never bake a huge tensor into the
graph (an `expand` of a scalar to an activation's shape stays a broadcast literal).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import torch

from autofusion.errors import ExecutionError
from autofusion.ir.catalog import VIEWS
from autofusion.ir.graph import Graph, Node
from autofusion.ir.interpret import run_node
from autofusion.ir.ops import FusionClass, get_op
from autofusion.ir.symbolic import contains_symbol
from autofusion.passes.rebuild import Emitter, rebuild

log = logging.getLogger("autofusion.passes")

SOURCES = frozenset({"const", "full", "arange"})
DEFAULT_MAX_ELEMENTS = 4096


def _literal_value(t: torch.Tensor) -> float | int | bool | None:
    """The single value every element of `t` holds, or None when they differ (NaN counts as equal)."""
    flat = t.reshape(-1)
    if flat.numel() == 0:
        return None
    first = flat[0]
    if t.dtype.is_floating_point and bool(torch.isnan(first)):
        same = bool(torch.isnan(flat).all())
    else:
        # Signed zeros must not merge: 1/x tells them apart.
        same = bool((flat == first).all()) and (
            not t.dtype.is_floating_point or bool((torch.signbit(flat) == torch.signbit(first)).all())
        )
    return first.item() if same else None


def _candidates(graph: Graph) -> bool:
    """Cheap superset test: some foldable-looking node reads only source values (skips the rebuild)."""
    sources = {v.id for n in graph.nodes if n.op in SOURCES for v in n.outputs}
    for n in graph.nodes:
        if (
            n.inputs
            and n.op not in SOURCES | VIEWS
            and n.op != "extern"
            and all(i in sources for i in n.inputs)
        ):
            return True
    return False


def fold_constants(graph: Graph, max_elements: int = DEFAULT_MAX_ELEMENTS) -> Graph:
    if not _candidates(graph):
        return graph
    values: dict[int, torch.Tensor] = {}  # new value id -> its compile-time value (sources and folded nodes)
    changed = False

    def source_value(e: Emitter, vid: int) -> torch.Tensor | None:
        if vid in values:
            return values[vid]
        node = e.producer(vid)
        if node is None or node.op not in SOURCES or e.type_of(vid).numel > max_elements:
            return None
        if node.op == "const":
            values[vid] = graph.constants[node.attr("name")]
        else:
            (values[vid],) = run_node(node, [], graph)
        return values[vid]

    def rewrite(e: Emitter, node: Node, ins: list[int]) -> Sequence[int] | None:
        nonlocal changed
        if not ins or node.op in SOURCES or node.op == "extern" or node.op in VIEWS:
            return None
        if get_op(node.op).fusion in (FusionClass.ANCHOR, FusionClass.OPAQUE):
            return None
        if any(contains_symbol(v.type.shape) for v in node.outputs):
            return None  # a symbolic size is no compile-time constant: folded, it would be the hint's
        if any(v.type.numel > max_elements for v in node.outputs):
            log.debug("constant_folding: %s (%s) not folded: its result exceeds %d elements",
                      node.name, node.op, max_elements)  # fmt: skip
            return None
        args = [source_value(e, i) for i in ins]
        if any(a is None for a in args):
            return None
        try:
            with torch.no_grad():
                results = run_node(node, [a for a in args if a is not None], graph)
        except ExecutionError as err:
            log.info(
                "constant_folding: %s (%s) not folded: %s", node.name, node.op, str(err).splitlines()[-1]
            )
            return None
        outs: list[int] = []
        for v, r in zip(node.outputs, results, strict=True):
            r = r.contiguous()
            lit = _literal_value(r)
            if lit is not None:
                attrs: dict[str, Any] = {"value": lit, "dtype": v.type.dtype}
                if v.type.shape:
                    attrs["shape"] = v.type.shape
                o = e("full", (), attrs)
            else:
                o = e.b.add_constant(f"{node.name}_folded", r.clone(), v.type.contiguous())
            values[o] = r
            outs.append(o)
        changed = True
        return outs

    out = rebuild(graph, rewrite)
    return out if changed else graph
