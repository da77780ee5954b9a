"""ONNX activations and masks that are compositions of IR elementwise ops: Celu, Selu, ThresholdedRelu,
Shrink, Swish, Hardmax and Trilu. Each is spelled with ops that fuse (where, compare, arange), so it
joins its neighbours' kernel instead of running alone."""

from __future__ import annotations

import math

from autofusion.frontend.onnx.context import OnnxCtx, norm_axis, onnx_op, unsupported
from autofusion.frontend.torch.context import TV
from autofusion.ir.dtypes import DType

# ONNX's Selu defaults (the float32 values the spec prints).
_SELU_ALPHA = 1.67326319217681884765625
_SELU_GAMMA = 1.05070102214813232421875


def _float_input(ctx: OnnxCtx) -> TV:
    x = ctx.tensor(0)
    if not x.dtype.is_float:
        raise unsupported(f"{ctx.node.op_type} of {x.dtype.short}")
    return x


@onnx_op("Celu")
def _celu(ctx: OnnxCtx) -> TV:
    # max(0, x) + min(0, alpha * (exp(x / alpha) - 1)): the two sides never overlap, so a select.
    x = _float_input(ctx)
    alpha = float(ctx.attr("alpha", 1.0))
    neg = ctx.add(
        "mul",
        (ctx.add("expm1", (ctx.add("div", (x, ctx.scalar(alpha, x.dtype))),)), ctx.scalar(alpha, x.dtype)),
    )
    return ctx.add("where", (ctx.add("gt", (x, ctx.scalar(0, x.dtype))), x, neg))


@onnx_op("Selu")
def _selu(ctx: OnnxCtx) -> TV:
    x = _float_input(ctx)
    alpha, gamma = float(ctx.attr("alpha", _SELU_ALPHA)), float(ctx.attr("gamma", _SELU_GAMMA))
    return ctx.add("mul", (ctx.add("elu", (x,), {"alpha": alpha}), ctx.scalar(gamma, x.dtype)))


@onnx_op("ThresholdedRelu")
def _thresholded_relu(ctx: OnnxCtx) -> TV:
    x = _float_input(ctx)
    alpha = float(ctx.attr("alpha", 1.0))
    keep = ctx.add("gt", (x, ctx.scalar(alpha, x.dtype)))
    return ctx.add("where", (keep, x, ctx.scalar(0, x.dtype)))


@onnx_op("Shrink")
def _shrink(ctx: OnnxCtx) -> TV:
    # x < -lambd: x + bias; x > lambd: x - bias; else 0 (any numeric type: integers too).
    x = ctx.tensor(0)
    if x.dtype.is_bool:
        raise unsupported("Shrink of bool")
    lambd, bias = float(ctx.attr("lambd", 0.5)), float(ctx.attr("bias", 0.0))
    if not x.dtype.is_float and (lambd != int(lambd) or bias != int(bias)):
        # The comparison is against the float threshold; the result is x -/+ bias in x's type.
        raise unsupported(f"Shrink of {x.dtype.short} with non-integer lambd/bias")
    t = (lambda v: v) if x.dtype.is_float else int
    zero = ctx.scalar(0, x.dtype)
    lo = ctx.add("lt", (x, ctx.scalar(t(-lambd), x.dtype)))
    hi = ctx.add("gt", (x, ctx.scalar(t(lambd), x.dtype)))
    b = ctx.scalar(t(bias), x.dtype)
    inner = ctx.add("where", (hi, ctx.add("sub", (x, b)), zero))
    return ctx.add("where", (lo, ctx.add("add", (x, b)), inner))


@onnx_op("Swish")
def _swish(ctx: OnnxCtx) -> TV:
    x = _float_input(ctx)
    alpha = float(ctx.attr("alpha", 1.0))
    if alpha == 1.0:
        return ctx.add("silu", (x,))
    scaled = ctx.add("mul", (x, ctx.scalar(alpha, x.dtype)))
    return ctx.add("mul", (x, ctx.add("sigmoid", (scaled,))))


def along(ctx: OnnxCtx, n: int, dim: int, rank: int) -> TV:
    """arange(n) as int64 shaped to broadcast along `dim` of a rank-`rank` tensor."""
    idx = ctx.add("arange", (), {"start": 0, "end": n, "step": 1, "dtype": DType.int64})
    return ctx.reshape(idx, tuple(n if d == dim else 1 for d in range(rank)))


@onnx_op("Hardmax")
def _hardmax(ctx: OnnxCtx) -> TV:
    # one_hot(argmax(x, axis)) with the first index of ties, as the spec (and numpy's argmax) takes
    x = ctx.tensor(0)
    if x.rank == 0 or math.prod(x.shape) == 0:
        raise unsupported(f"Hardmax of shape {x.shape}")
    axis = norm_axis(int(ctx.attr("axis", -1)), x.rank)
    arg = ctx.add("argmax", (x,), {"dim": axis, "keepdim": True})
    hit = ctx.add("eq", (along(ctx, x.shape[axis], axis, x.rank), arg))
    return ctx.add("where", (hit, ctx.scalar(1, x.dtype), ctx.scalar(0, x.dtype)))


@onnx_op("Trilu")
def _trilu(ctx: OnnxCtx) -> TV:
    x = ctx.tensor(0)
    if x.rank < 2:
        raise unsupported(f"Trilu of rank {x.rank}")
    upper = bool(int(ctx.attr("upper", 1)))
    rows, cols = x.shape[-2:]
    i = along(ctx, rows, 0, 2)
    j = along(ctx, cols, 1, 2)
    # keep j >= i + k (upper) or j <= i + k (lower); k is a graph input possibly computed at run time
    if ctx.has(1):
        k = ctx.const(1)
        shift = ctx.scalar(int(k.reshape(-1)[0]), DType.int64) if k is not None else ctx.tensor(1)
        if math.prod(shift.shape) != 1:
            raise unsupported(f"Trilu k of shape {shift.shape}")
        shift = ctx.reshape(ctx.cast(shift, DType.int64), ())
        i = ctx.add("add", (i, shift))
    keep = ctx.add("ge" if upper else "le", (j, i))
    zero = ctx.scalar(False if x.dtype.is_bool else 0, x.dtype)
    return ctx.add("where", (keep, x, zero))
