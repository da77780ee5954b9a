"""ONNX composite reductions -> IR: ReduceL1, ReduceL2, ReduceSumSquare, ReduceLogSum, ReduceLogSumExp.

Each is pre-step, sum, post-step: |x|, sum; x*x, sum, sqrt; x*x, sum; sum, log; and the stable
log-sum-exp m + log(sum(exp(x - m))) with m = max(x) (an infinite m is taken as 0, so all -inf gives
log(0) = -inf and +inf gives +inf, not NaN). With empty axes and noop_with_empty_axes the sum is
skipped and the other steps still run (ReduceL2 is |x|, ReduceLogSum is log(x)), as the spec says.
Half inputs are computed in fp32 and rounded once at the end (x*x overflows fp16 long before its
square root does). A reduction over an empty dim sums to 0 (log-sum-exp: -inf).
"""

from __future__ import annotations

import math

from autofusion.frontend.onnx.context import OnnxCtx, onnx_op, unsupported
from autofusion.frontend.onnx.converters.reduction import reduce_axes
from autofusion.frontend.torch.context import TV
from autofusion.ir.dtypes import DType

# ReduceL2 and ReduceLogSum of ints are computed in fp64 and truncated back, as onnxruntime does
# (log(0) = -inf becomes the type's minimum there, as x86's conversion gives); ReduceLogSumExp of ints
# is not in the opset-28 schema and onnxruntime's result for it is not the log-sum-exp.
_FLOAT_ONLY = ("ReduceLogSumExp",)
_VIA_F64 = ("ReduceL2", "ReduceLogSum")


def _reduced_shape(shape: tuple[int, ...], axes: tuple[int, ...], keep: bool) -> tuple[int, ...]:
    return tuple(1 if i in axes else s for i, s in enumerate(shape) if keep or i not in axes)


def _sum(ctx: OnnxCtx, x: TV, axes: tuple[int, ...] | None, keep: bool) -> TV:
    if axes is None or x.rank == 0:
        return x
    return ctx.add("sum", (x,), {"dims": axes, "keepdim": keep})


def _log_sum_exp(ctx: OnnxCtx, x: TV, axes: tuple[int, ...] | None, keep: bool) -> TV:
    if axes is None or x.rank == 0:
        return ctx.add("log", (ctx.add("exp", (x,)),))  # log(exp(x)) as the spec's steps give it
    out_shape = _reduced_shape(x.shape, axes, keep)
    if any(x.shape[a] == 0 for a in axes):
        return ctx.add("full", (), {"value": -math.inf, "dtype": x.dtype, "shape": out_shape})
    m = ctx.add("amax", (x,), {"dims": axes, "keepdim": True})
    m = ctx.add("where", (ctx.add("isinf", (m,)), ctx.scalar(0.0, x.dtype), m))
    s = ctx.add("sum", (ctx.add("exp", (ctx.add("sub", (x, m)),)),), {"dims": axes, "keepdim": True})
    return ctx.reshape(ctx.add("add", (ctx.add("log", (s,)), m)), out_shape)


@onnx_op("ReduceL1", "ReduceL2", "ReduceSumSquare", "ReduceLogSum", "ReduceLogSumExp")
def _composite(ctx: OnnxCtx) -> TV:
    kind = ctx.node.op_type
    x = ctx.tensor(0)
    dtype = x.dtype
    if not (dtype.is_float or dtype.is_int) or (kind in _FLOAT_ONLY and not dtype.is_float):
        raise unsupported(f"{kind} of {dtype.short}")
    axes = reduce_axes(ctx, x.rank)
    keep = bool(int(ctx.attr("keepdims", 1)))
    if dtype.is_half:
        x = ctx.cast(x, DType.float32)
    elif not dtype.is_float and kind in _VIA_F64:
        x = ctx.cast(x, DType.float64)
    if kind == "ReduceLogSumExp":
        out = _log_sum_exp(ctx, x, axes, keep)
    elif kind == "ReduceL1":
        out = _sum(ctx, ctx.add("abs", (x,)), axes, keep)
    elif kind == "ReduceLogSum":
        out = ctx.add("log", (_sum(ctx, x, axes, keep),))
    else:
        out = _sum(ctx, ctx.add("mul", (x, x)), axes, keep)
        if kind == "ReduceL2":
            out = ctx.add("sqrt", (out,))
    return ctx.cast(out, dtype)
