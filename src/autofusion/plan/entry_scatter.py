"""In-place row scatters inside SuperKernel entries: a static KV cache's update (`index_put_`, `index_copy_`).

In: an extern op step that calls `aten.index_put_` with one index tensor (indices `(None, ..., idx)`,
no accumulation) or `aten.index_copy_`, the value types and the real strides of the plan's values
(plan/entry_ops.py). Out: `row_scatter` (the op's operands, or None for any other op) and
`scatter_in_entry` (None when an entry can run it, else why not).

Why: a decode step on transformers' StaticCache writes one new key row and one new value row per layer
into the caller's cache (frontend/torch/mutation.py keeps those writes in place). Run through torch,
each write is a return to Python between two entries: four splits for a two-layer model, and the views
feeding them and the attention reading them move out of the entries with them. Inside an entry the
write is a few hundred bytes of memcpy (codegen/cpp/scatter.py).

What an entry may write: only a graph input (the caller's tensor, so no buffer of ours changes
meaning), only where nothing else reads its old value (the write happens in the entry's phase order,
which knows only data flow from the op's result), and only when the result is a graph output (the
mutation's new value, which is the caller's tensor itself: the executor hands the input back).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from autofusion.ir.dtypes import DType
from autofusion.ir.graph import Arg, Node
from autofusion.ir.types import TensorType, strides_match
from autofusion.plan.schedule import OpStep, PlanStep

INDEX_PUT = "aten.index_put_.default"
INDEX_COPY = "aten.index_copy_.default"


@dataclass(frozen=True)
class RowScatter:
    """target[..., index[j], ...] = values[..., j, ...] along `dim` (value ids), written in place."""

    target: int
    index: int
    values: int
    dim: int

    def axis(self, rank: int) -> int:
        """`dim` counted from the front, for a target of `rank` dims (may still be out of range)."""
        return self.dim + rank if self.dim < 0 else self.dim


def row_scatter(node: Node) -> RowScatter | None:
    """The operands of an in-place row scatter this module knows, or None."""
    if node.op != "extern" or len(node.outputs) != 1:
        return None
    target, args = node.attr("target"), node.attr("args")
    if node.attr("kwargs"):
        return None
    if target == INDEX_PUT:
        if len(args) not in (3, 4) or (len(args) == 4 and args[3] is not False):
            return None  # accumulate=True adds instead of writing
        dst, indices, src = args[:3]
        if not isinstance(indices, tuple):
            return None
        given = [d for d, a in enumerate(indices) if a is not None]
        if len(given) != 1 or not isinstance(indices[given[0]], Arg):
            return None
        dim, index = given[0], indices[given[0]]
    elif target == INDEX_COPY:
        if len(args) != 4 or not isinstance(args[1], int):
            return None
        dst, dim, index, src = args
    else:
        return None
    if not all(isinstance(a, Arg) for a in (dst, index, src)):
        return None
    return RowScatter(node.inputs[dst.index], node.inputs[index.index], node.inputs[src.index], dim)


def scatter_in_entry(
    node: Node,
    types: Mapping[int, TensorType],
    real: Mapping[int, tuple[int, ...]],
    graph_inputs: Collection[int],
    graph_outputs: Collection[int],
    readers: int,
) -> str | None:
    """None when this scatter can run inside an entry, else why not. `readers`: how many plan steps
    read its target (the scatter itself is one)."""
    sc = row_scatter(node)
    if sc is None:
        return "not an index_put_ with one index tensor (no accumulation) or an index_copy_"
    dst, idx, src = types[sc.target], types[sc.index], types[sc.values]
    dim = sc.axis(dst.rank)
    if not 0 <= dim < dst.rank:
        return f"dim {sc.dim} is out of range for a rank-{dst.rank} target"
    if sc.target not in graph_inputs:
        return "it writes a value of the plan's own, not a graph input"
    if node.outputs[0].id not in graph_outputs:
        return "its result is not a graph output (not a mutation of the caller's tensor)"
    if readers != 1:
        return "another step reads the target's old value"
    if idx.rank != 1 or idx.dtype not in (DType.int64, DType.int32):
        return f"the index is a rank-{idx.rank} {idx.dtype.name} tensor (the entry takes a 1-d int64/int32)"
    if src.dtype is not dst.dtype:
        return f"the values are {src.dtype.name}, the target {dst.dtype.name}"
    want = (*dst.shape[:dim], idx.shape[0], *dst.shape[dim + 1 :])
    if _unit_lead(src.shape) != _unit_lead(want):
        # leading 1s aside (torch broadcasts them away, the bytes are the same), no broadcasting
        return f"the values have shape {src.shape}, not {want} (no broadcasting inside the entry)"
    for v, t in ((sc.target, dst), (sc.values, src)):
        if v not in real or not (t.is_contiguous and strides_match(t.shape, real[v], t.strides)):
            return "the target or the values are not contiguous in memory"
    return None


def _unit_lead(shape: tuple[int, ...]) -> tuple[int, ...]:
    k = 0
    while k < len(shape) - 1 and shape[k] == 1:
        k += 1
    return shape[k:]


def in_place_results(
    steps: Sequence[PlanStep], callable_ops: Mapping[int, str], members: Sequence[int]
) -> dict[int, int]:
    """Result value -> the graph input it is, for the "scatter" members of one entry (the renderer
    gives both one pointer slot; the executor hands the input back as the result)."""
    out: dict[int, int] = {}
    for m in members:
        step = steps[m]
        if callable_ops.get(m) == "scatter" and isinstance(step, OpStep):
            sc = row_scatter(step.node)
            assert sc is not None
            out[step.node.outputs[0].id] = sc.target
    return out


__all__ = ("INDEX_COPY", "INDEX_PUT", "RowScatter", "in_place_results", "row_scatter", "scatter_in_entry")
