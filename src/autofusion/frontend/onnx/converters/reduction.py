"""ONNX reductions -> IR: ReduceMean/Sum/Max/Min/Prod (ArgMax/ArgMin are in `arg_reduce.py`, the composite
ones, ReduceL1/L2/SumSquare/LogSum/LogSumExp, in `reduce_composite.py`).

Axes come from the `axes` attribute (ReduceMean/Max/Min/Prod before opset 18) or from the second
input (ReduceSum from opset 13, the others from 18); both forms are read. Empty axes reduce every dim
unless noop_with_empty_axes is set, in which case the op is the identity.
"""

from __future__ import annotations

from autofusion.frontend.onnx.context import OnnxCtx, norm_axis, onnx_op, unsupported
from autofusion.frontend.torch.context import TV

_REDUCE = {
    "ReduceMean": "mean",
    "ReduceSum": "sum",
    "ReduceMax": "amax",
    "ReduceMin": "amin",
    "ReduceProd": "prod",
}


def reduce_axes(ctx: OnnxCtx, rank: int) -> tuple[int, ...] | None:
    """Normalised axes; () for "all dims"; None for the identity (empty axes with noop_with_empty_axes)."""
    axes = ctx.ints(1, "axes") if ctx.has(1) else None
    if axes is None and ctx.attr("axes") is not None:
        axes = [int(a) for a in ctx.attr("axes")]
    if not axes:
        return None if int(ctx.attr("noop_with_empty_axes", 0)) else tuple(range(rank))
    return tuple(sorted({norm_axis(a, rank) for a in axes}))


@onnx_op(*_REDUCE)
def _reduce(ctx: OnnxCtx) -> TV:
    x = ctx.tensor(0)
    kind = ctx.node.op_type
    axes = reduce_axes(ctx, x.rank)
    if axes is None:
        return x
    if kind == "ReduceMean" and not x.dtype.is_float:
        raise unsupported(f"ReduceMean of {x.dtype.short}")
    if x.rank == 0:
        out = x
    else:
        out = ctx.add(_REDUCE[kind], (x,), {"dims": axes, "keepdim": bool(int(ctx.attr("keepdims", 1)))})
    return out
