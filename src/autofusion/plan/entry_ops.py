"""Which op steps a SuperKernel entry can run itself, and the real layouts it needs for them.

In: a `Plan` and whether a C-callable sgemm was found. Out: `EntryOps`:
- `callable`: step index -> kind: "sgemm" (fp32 linear, contiguous operands), "gemv" (the same with
  one row: codegen/cpp/gemv.py), "bmm" (fp32 batched matmul, operands of any strides with one unit stride per
  matrix, through sgemm per batch entry), "sdpa" (fp32 attention on contiguous operands, a float or
  bool mask broadcast to the scores: codegen/cpp/attention.py), "dnnl_conv" (a convolution on the
  "dnnl" route: its oneDNN primitive called between the entry's parallel regions, plan/entry_conv.py), or
  "scatter" (an in-place row write into a graph input, a static KV cache's update: plan/entry_scatter.py,
  codegen/cpp/scatter.py; its result is the input itself), or "alias" (a view: no code at all, its
  pointer is the source's plus an offset, taken from torch once per signature or per call);
- `why_not`: step index -> why another op step cannot run inside an entry (for the split log);
- `strides`: value id -> the strides the value really has in memory where that differs from its IR
  type. The IR gives every value its logical (contiguous) layout; a view torch computes keeps its
  source's strides, so a bmm reading `q.permute(...)` needs the real ones, found by replaying the
  view ops on meta tensors from a source whose layout is known (a kernel's or a library call's output,
  or a graph input).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import torch

from autofusion.ir.catalog import VIEWS
from autofusion.ir.dtypes import DType
from autofusion.ir.graph import Arg, Node
from autofusion.ir.interpret import run_node
from autofusion.ir.types import TensorType, strides_match
from autofusion.plan.entry_conv import dnnl_conv_in_entry, is_conv_call
from autofusion.plan.entry_scatter import row_scatter, scatter_in_entry
from autofusion.plan.schedule import KernelStep, OpStep, Plan

_CONTIGUOUS_RESULT = {
    "linear",
    "bmm",
    "mm",
    "addmm",
    "conv",
    "sdpa",
}  # torch returns fresh, contiguous tensors


# Kinds the entry runs as its own code inside its parallel regions, phase members like kernel bodies
# (an orphaned `omp for nowait`), rather than as a library call between regions.
REGION_KINDS = frozenset({"gemv", "sdpa", "scatter"})


@dataclass(frozen=True)
class EntryOps:
    callable: dict[int, str] = field(default_factory=dict)
    why_not: dict[int, str] = field(default_factory=dict)
    strides: dict[int, tuple[int, ...]] = field(default_factory=dict)
    # Why the plan cannot run as SuperKernels at all ("" when it can): see `_gemm_operands`.
    no_super: str = ""


def linear_in_entry(node: Node, types: dict[int, TensorType]) -> str | None:
    """None when `node` (a linear op) can run inside a SuperKernel through BLAS sgemm, else why not."""
    ins = [types[i] for i in node.inputs]
    out = node.outputs[0].type
    if any(t.dtype is not DType.float32 for t in [*ins, out]):
        return "BLAS sgemm takes float32 only"
    if not all(t.is_contiguous for t in [*ins, out]):
        return "an operand is not contiguous"
    if any(v >= 2**31 for v in (out.numel, ins[0].numel, ins[1].numel)):  # not max(): it orders the sizes
        return "sizes exceed a 32-bit BLAS"
    return None


def one_row_linear(step: OpStep, types: dict[int, TensorType]) -> bool:
    """A linear with one row of activations (a decode step's): inside an entry it runs as a GEMV over
    the weight as the module holds it (codegen/cpp/gemv.py), which beats the BLAS and the prepacked
    library routes at M=1, so it need not stay out of the entry for a packed weight."""
    return one_row_node(step.node, types)


def one_row_node(node: Node, types: dict[int, TensorType]) -> bool:
    """`one_row_linear` for a graph node (the solver asks before there are steps)."""
    if node.op != "linear" or linear_in_entry(node, types) is not None:
        return False
    k = types[node.inputs[0]].shape[-1]
    return k > 0 and types[node.inputs[0]].numel == k


def sdpa_in_entry(node: Node, types: dict[int, TensorType]) -> str | None:
    """None when this `sdpa` can run inside an entry through `af_sdpa`, else why not."""
    q, k, v = (types[i] for i in node.inputs[:3])
    out = node.outputs[0].type
    if node.attr("has_mask") and node.attr("is_causal"):
        return "a mask together with is_causal (torch refuses it)"
    if any(t.dtype is not DType.float32 for t in (q, k, v, out)):
        return "the entry's attention takes float32 only"
    if q.rank not in (3, 4) or k.rank != q.rank or v.rank != q.rank:
        return "the entry's attention takes q, k, v of rank 3 or 4, all of one rank"
    if k.shape[:-2] != q.shape[:-2] or v.shape[:-2] != q.shape[:-2]:
        return "k or v broadcast over q's batch dims"
    if not all(t.is_contiguous for t in (q, k, v, out)):
        return "an operand is not contiguous"
    if node.attr("has_mask"):
        mask = types[node.inputs[3]]
        if mask.dtype not in (DType.float32, DType.bool):
            return f"a {mask.dtype.name} mask (the entry's attention takes float32 or bool)"
        if mask.rank > q.rank or not mask.is_contiguous:
            return "the mask is not a contiguous tensor broadcast to the scores"
        full = (*q.shape[:-1], k.shape[-2])
        for d, size in zip(reversed(mask.shape), reversed(full), strict=False):
            if d not in (1, size):
                return f"mask shape {mask.shape} does not broadcast to the scores {full}"
    return None


def _matrix_ok(shape: tuple[int, ...], strides: tuple[int, ...]) -> bool:
    """A [batch, rows, cols] operand sgemm can read: one of the two matrix strides is 1."""
    r, c = shape[1], shape[2]
    sr, sc = strides[1], strides[2]
    return r <= 1 or c <= 1 or sc == 1 or sr == 1


def _real_strides(plan: Plan) -> tuple[dict[int, tuple[int, ...]], dict[int, bool]]:
    """Real strides of every value whose layout can be known before running, and, for view op
    outputs, whether torch returns a view (True) or a copy (a reshape that cannot view)."""
    graph = plan.graph
    types = graph.value_types()
    real: dict[int, tuple[int, ...]] = {gi.value.id: gi.value.type.strides for gi in graph.inputs}
    is_view: dict[int, bool] = {}
    for s in plan.steps:
        if isinstance(s, KernelStep):
            for v in s.outputs:
                real[v] = types[v].strides
            continue
        node = s.node
        if node.op in _CONTIGUOUS_RESULT:
            for out in node.outputs:
                real[out.id] = _contiguous(out.type.shape)
        elif _returns_self(node) and node.inputs[0] in real:
            # An in-place ATen op (a static KV cache's `index_put_`) returns its first input itself.
            real[node.outputs[0].id] = real[node.inputs[0]]
        elif node.op in VIEWS and node.inputs and all(i in real for i in node.inputs):
            metas = [torch.empty_strided(types[i].shape, real[i], dtype=types[i].dtype.to_torch(),
                                         device="meta") for i in node.inputs]  # fmt: skip
            try:
                (res,) = run_node(node, metas, graph)
            except Exception:  # noqa: BLE001 - a view we cannot replay simply stays unknown
                continue
            real[node.outputs[0].id] = tuple(res.stride())
            is_view[node.outputs[0].id] = res._is_view()
    return real, is_view


def _returns_self(node: Node) -> bool:
    """An extern calling an in-place ATen op (`aten.index_put_.default`): by ATen's convention it
    returns its first argument, the tensor it updated, with that tensor's layout."""
    if node.op != "extern" or len(node.outputs) != 1 or not node.inputs:
        return False
    parts = str(node.attr("target")).split(".")
    if len(parts) != 3 or parts[0] != "aten" or not parts[1].endswith("_") or parts[1].startswith("_"):
        return False
    args = node.attr("args")
    return bool(args) and isinstance(args[0], Arg) and args[0].index == 0


def _contiguous(shape: tuple[int, ...]) -> tuple[int, ...]:
    out, acc = [], 1
    for d in reversed(shape):
        out.append(acc)
        acc *= max(d, 1)
    return tuple(reversed(out))


def entry_ops(
    plan: Plan, have_gemm: bool, gemm_status: str = "", keep_out: Mapping[int, str] | None = None,
    dnnl_status: str | None = "the oneDNN glue was not asked for",
) -> EntryOps:  # fmt: skip
    """`keep_out`: op steps (index -> why) that run outside any entry, e.g. a linear that runs faster
    on a prepacked weight through a library call than through sgemm inside the entry. `dnnl_status`:
    None when the oneDNN glue is loaded (routed convolutions may then run inside entries), else why
    not."""
    graph = plan.graph
    types = graph.value_types()
    real, is_view = _real_strides(plan)
    callable_: dict[int, str] = {}
    why_not: dict[int, str] = {}
    users: dict[int, list[int]] = {}
    for i, s in enumerate(plan.steps):
        for v in s.inputs:
            users.setdefault(v, []).append(i)
    kinds: dict[int, str] = {}
    # Values a step computes (a constant's step only names a tensor that exists before any call).
    computed = {v for s in plan.steps if not (isinstance(s, OpStep) and s.node.op == "const")
                for v in s.outputs}  # fmt: skip
    outputs = set(graph.outputs)
    inputs = {gi.value.id for gi in graph.inputs}
    for i, s in enumerate(plan.steps):
        if not isinstance(s, OpStep):
            continue
        node = s.node
        why: str | None
        if keep_out and i in keep_out:
            why_not[i] = keep_out[i]
            continue
        if node.op == "linear":
            why = linear_in_entry(node, types)
            if why is None and not all(v in real and strides_match(types[v].shape, real[v], types[v].strides)
                                       for v in node.inputs):  # fmt: skip
                why = "an operand is a view with another layout than its IR type"
            kind = "gemv" if one_row_node(node, types) else "sgemm"
        elif node.op == "bmm":
            a, b = node.inputs
            tys = [types[a], types[b], node.outputs[0].type]
            if any(t.dtype is not DType.float32 for t in tys):
                why = "BLAS sgemm takes float32 only"
            elif a not in real or b not in real:
                why = "an operand's memory layout is only known at run time"
            elif not (_matrix_ok(types[a].shape, real[a]) and _matrix_ok(types[b].shape, real[b])):
                why = "an operand has no unit stride in its matrix dims"
            elif max(t.numel for t in tys) >= 2**31:
                why = "sizes exceed a 32-bit BLAS"
            else:
                why = None
            kind = "bmm"
        elif node.op == "sdpa":
            why = sdpa_in_entry(node, types)
            if why is None and not all(v in real and strides_match(types[v].shape, real[v], types[v].strides)
                                       for v in node.inputs):  # fmt: skip
                why = "an operand is a view with another layout than its IR type"
            kind = "sdpa"
        elif (scatter := row_scatter(node)) is not None:
            why = scatter_in_entry(node, types, real, inputs, outputs, len(users.get(scatter.target, [])))
            kind = "scatter"
        elif is_conv_call(node):
            why = dnnl_conv_in_entry(node, types, real, computed, outputs)
            if why is None and dnnl_status is not None:
                why = f"the oneDNN glue is unavailable: {dnnl_status}"
            kind = "dnnl_conv"
        else:
            what = node.attr("target") if node.op == "extern" else node.op
            why = (f"{what} runs through torch; linear, bmm, sdpa, row scatters and dnnl-routed convolutions "
                   "have C-callable implementations here")  # fmt: skip
            kind = ""
        if why is None and not have_gemm and kind not in REGION_KINDS and kind != "dnnl_conv":
            why = f"no C-callable sgemm in the loaded libraries ({gemm_status})"
        if why is None:
            kinds[i] = kind
            callable_[i] = kind
        else:
            why_not[i] = why
    # Views feeding in-entry calls become aliases, decided consumers first (a chain of views).
    for i in range(len(plan.steps) - 1, -1, -1):
        s = plan.steps[i]
        if not isinstance(s, OpStep) or s.node.op not in VIEWS or len(s.node.outputs) != 1:
            continue
        v = s.node.outputs[0].id
        if not is_view.get(v):
            why_not[i] = (
                "torch must copy here: the source's layout cannot be viewed this way"
                if v in is_view
                else "the source's memory layout is only known at run time"
            )
            continue
        consumers = users.get(v, [])
        layout_ok = strides_match(types[v].shape, real[v], types[v].strides)
        fits = all(
            kinds.get(c) in ("bmm", "alias")
            or (layout_ok and (isinstance(plan.steps[c], KernelStep) or c in kinds))
            or (not isinstance(plan.steps[c], KernelStep) and c not in kinds)
            for c in consumers
        )  # fmt: skip
        if fits and any(isinstance(plan.steps[c], KernelStep) or c in kinds for c in consumers):
            kinds[i] = "alias"
            callable_[i] = "alias"
            why_not.pop(i, None)
    strides = {v: st for v, st in real.items() if not strides_match(types[v].shape, st, types[v].strides)}
    return EntryOps(callable_, why_not, strides, _gemm_operands(plan, strides, kinds, users))


def _gemm_operands(plan: Plan, strides: dict[int, tuple[int, ...]], kinds: dict[int, str],
                   users: dict[int, list[int]]) -> str:  # fmt: skip
    """A GEMM + epilogue kernel reads its operands as contiguous matrices (their IR type). An operand
    torch made as a view with other strides (a transpose before a reshape that copies, say) is then
    given in its IR layout: its entry from `strides` is dropped, so the executor copies it there. That
    is wrong only for another reader that takes the real strides (a bmm, a view made inside the entry):
    then the plan does not run as SuperKernels (the reason returned) rather than misread."""
    for s in plan.steps:
        if not isinstance(s, KernelStep) or s.gemm is None:
            continue
        for v in s.gemm.inputs:
            if v not in strides:
                continue
            if any(kinds.get(c) in ("bmm", "alias") for c in users.get(v, [])):
                return f"{s.name} reads %{v} contiguous, another step in an entry reads its real strides"
            del strides[v]
    return ""
