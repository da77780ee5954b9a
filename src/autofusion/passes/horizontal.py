"""Horizontal pattern fusion (pass `horizontal_pattern`): sibling matmuls.

Sibling `linear` nodes that read the same input x (the Q, K and V projections) become one `linear`
on weights concatenated along the output dim, followed by one `slice` per original output:

    linear(x, Wq, bq), linear(x, Wk, bk), linear(x, Wv, bv)
    -> y = linear(x, concat(Wq, Wk, Wv), concat(bq, bk, bv)); q, k, v = slices of y's last dim

and likewise `mm(x, W_i)` siblings on W concatenated along dim 1. The slices are views a fused
kernel folds into its indexing. Each result element is the same dot product as before, so the
values match (BLAS may block the longer GEMM differently: fp32 rounding, not semantics).

Conditions, each "no" logged with its reason: at least two siblings of one kind; same weight dtype
and reduction size (shapes must agree); all with a bias or all without. Siblings are grouped in
graph order and the group is emitted where its last member was, after every weight it reads.

Cost check: weights that are graph inputs (module parameters) are concatenated on every call, which
reads and writes their bytes once more. The rewrite is taken only when what it saves, re-reading
x once per extra sibling plus one dispatch per sibling dropped, is more than that copy costs
(profile bandwidth and dispatch overhead). Constant weights are concatenated at compile time and
always pay.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import torch

from autofusion.hw.profile import HardwareProfile
from autofusion.ir.graph import Graph, InputRole, Node
from autofusion.ir.types import TensorType
from autofusion.passes.rebuild import Emitter, rebuild

log = logging.getLogger("autofusion.passes")

KINDS = ("linear", "mm")


def _signature(node: Node, types: dict) -> tuple:
    """What siblings must share to be merged: op, weight dtype and reduction size, has_bias."""
    w = types[node.inputs[1]]
    if node.op == "linear":
        return ("linear", w.dtype, w.shape[1], bool(node.attr("has_bias")))
    return ("mm", w.dtype, w.shape[0], False)


def _groups(graph: Graph) -> list[list[int]]:
    """Indices of sibling matmul nodes to merge, each group in graph order."""
    types = graph.value_types()
    by_input: dict[int, list[int]] = {}
    for k, n in enumerate(graph.nodes):
        if n.op in KINDS and types[n.inputs[1]].rank == 2:
            by_input.setdefault(n.inputs[0], []).append(k)
    out: list[list[int]] = []
    for _x, members in sorted(by_input.items(), key=lambda kv: kv[1][0]):
        if len(members) < 2:
            continue
        buckets: dict[tuple, list[int]] = {}
        for k in members:
            buckets.setdefault(_signature(graph.nodes[k], types), []).append(k)
        for ks in buckets.values():
            if len(ks) >= 2:
                out.append(ks)
        if len(buckets) > 1:
            names = {str(sig): [graph.nodes[k].name for k in ks] for sig, ks in buckets.items()}
            log.info("horizontal_pattern: siblings of one input differ in (op, dtype, k, bias): %s", names)
    return out


def _pays(
    graph: Graph, ks: list[int], profile: HardwareProfile | None, const_weights: bool
) -> tuple[bool, str]:
    if const_weights or profile is None:
        return (
            True,
            "weights are constants, concatenated at compile time" if const_weights else "no cost model",
        )
    types = graph.value_types()
    first = graph.nodes[ks[0]]
    x_bytes = types[first.inputs[0]].nbytes
    param_bytes = sum(types[i].nbytes for k in ks for i in graph.nodes[k].inputs[1:])
    saved = (len(ks) - 1) * (x_bytes / profile.memory_bandwidth + profile.dispatch_overhead_s)
    cost = 2 * param_bytes / profile.memory_bandwidth + profile.dispatch_overhead_s * (
        2 if first.attr("has_bias") else 1
    )
    text = (
        f"saves {saved * 1e6:.2f} us (x re-reads, dispatches), "
        f"weight concat per call costs {cost * 1e6:.2f} us"
    )
    return saved > cost, text


def _weights_ready(graph: Graph, ks: list[int]) -> bool:
    """Every weight and bias of the group is defined before its first member (where it is emitted)."""
    defined_before = {gi.value.id for gi in graph.inputs}
    for n in graph.nodes[: ks[0]]:
        defined_before.update(v.id for v in n.outputs)
    return all(i in defined_before for k in ks for i in graph.nodes[k].inputs[1:])


def merge_sibling_matmuls(
    graph: Graph, profile: HardwareProfile | None = None, frozen: bool = False
) -> Graph:
    """`frozen`: a concat of parameters and buffers is folded once per version (passes/freeze.py), so it
    costs nothing per call and the merge always pays."""
    const_of: dict[int, str] = {n.out.id: n.attr("name") for n in graph.nodes if n.op == "const"}
    params = {gi.value.id for gi in graph.inputs if gi.role in (InputRole.PARAM, InputRole.BUFFER)}
    first_of: dict[int, tuple[list[int], bool]] = {}
    for ks in _groups(graph):
        names = ", ".join(graph.nodes[k].name for k in ks)
        weights = [i for k in ks for i in graph.nodes[k].inputs[1:]]
        const_weights = all(i in const_of for i in weights)
        # Constant weights are read from Graph.constants, wherever their const nodes sit.
        if not const_weights and not _weights_ready(graph, ks):
            log.info("horizontal_pattern: %s not merged: a weight is computed after the first sibling", names)
            continue
        if frozen and not const_weights and all(i in const_of or i in params for i in weights):
            ok, why = True, "weights are parameters, concatenated once per parameter version (freezing)"
        else:
            ok, why = _pays(graph, ks, profile, const_weights)
        log.info("horizontal_pattern: %s %s: %s", names, "merged" if ok else "not merged", why)
        if ok:
            first_of[ks[0]] = (ks, const_weights)
    if not first_of:
        return graph
    slices: dict[int, int] = {}  # member node index -> the new id of its slice
    index_of = {id(n): k for k, n in enumerate(graph.nodes)}

    def rewrite(e: Emitter, node: Node, ins: list[int]) -> Sequence[int] | None:
        k = index_of[id(node)]
        if k in slices:
            return (slices[k],)
        if k not in first_of:
            return None
        ks, const = first_of[k]
        nodes = [graph.nodes[j] for j in ks]
        # Every weight is defined before this node (checked), so e.env already maps it.
        is_linear = node.op == "linear"
        w = _cat(
            e,
            graph,
            [n.inputs[1] for n in nodes],
            0 if is_linear else 1,
            const,
            const_of,
            f"{node.name}_hweight",
        )
        args = [ins[0], w]
        if is_linear and node.attr("has_bias"):
            args.append(
                _cat(e, graph, [n.inputs[2] for n in nodes], 0, const, const_of, f"{node.name}_hbias")
            )
        y = e(node.op, args, {"has_bias": node.attr("has_bias")} if is_linear else {})
        rank = e.type_of(y).rank
        start = 0
        for j, n in zip(ks, nodes, strict=True):
            width = n.out.type.shape[-1]
            slices[j] = e("slice", [y], {"dim": rank - 1, "start": start, "end": start + width, "step": 1})
            start += width
        return (slices[k],)

    return rebuild(graph, rewrite)


def _cat(
    e: Emitter, graph: Graph, ids: list[int], dim: int, const: bool, const_of: dict[int, str], name: str
) -> int:
    """Concatenate original values `ids`: at compile time when all are constants, else a concat node."""
    if const:
        t = torch.cat([graph.constants[const_of[i]] for i in ids], dim)
        return e.b.add_constant(name, t, TensorType(graph.value_types()[ids[0]].dtype, tuple(t.shape)))
    return e("concat", [e.env[i] for i in ids], {"dim": dim})
