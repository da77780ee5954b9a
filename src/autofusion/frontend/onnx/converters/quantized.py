"""ONNX integer-quantized ops -> IR: QLinearMatMul, MatMulInteger, DynamicQuantizeLinear, and
QuantizeLinear/DequantizeLinear to and from (u)int8/16 per tensor or per axis (not blocked, not float8).

The integer products are exact: (a - a_zero) @ (b - b_zero) runs as a float matmul of small integers,
in fp32 while every partial sum stays below 2**24 (K * 255 * 255 < 2**24), else in fp64 (exact to
2**53). QLinearMatMul then requantizes as onnxruntime does: acc * (a_scale * b_scale / y_scale) in
fp32, rounded half to even, plus y_zero, saturated to the output type. Zero points and scales are
scalars or 1-D: per row of a (and of y), per column of b.
"""

from __future__ import annotations

from autofusion.frontend.onnx.context import OnnxCtx, dtype_of, norm_axis, onnx_op, unsupported
from autofusion.frontend.onnx.converters.nn import matmul
from autofusion.frontend.torch.context import TV
from autofusion.ir.dtypes import DType

_RANGE = {DType.uint8: (0, 255), DType.int8: (-128, 127)}
_EXACT_F32 = 2**24


def _per(ctx: OnnxCtx, v: TV, x: TV, side: str) -> TV:
    """A scale or zero point shaped to broadcast against `x`: per tensor, per row or per column."""
    if v.type.numel == 1:
        return ctx.reshape(v, ())
    rows = x.shape[-2] if x.rank >= 2 else 1
    if v.rank == 1 and side == "row" and v.shape[0] == rows:
        return ctx.reshape(v, (rows, 1))
    if v.rank == 1 and side == "col" and v.shape[0] == x.shape[-1]:
        return v
    raise unsupported(f"a {side} scale or zero point of shape {v.shape} for an operand {x.shape}")


def _centred(ctx: OnnxCtx, q: TV, zero: TV | None, side: str, dtype: DType) -> TV:
    if q.dtype not in _RANGE:
        raise unsupported(f"quantized operand of {q.dtype.short}")
    out = ctx.cast(q, dtype)
    if zero is None:
        return out
    return ctx.add("sub", (out, ctx.cast(_per(ctx, zero, q, side), dtype)))


def _int_product(ctx: OnnxCtx, a: TV, az: TV | None, b: TV, bz: TV | None) -> TV:
    k = a.shape[-1]
    dtype = DType.float32 if k * 255 * 255 < _EXACT_F32 else DType.float64
    return matmul(ctx, _centred(ctx, a, az, "row", dtype), _centred(ctx, b, bz, "col", dtype))


def _opt(ctx: OnnxCtx, i: int) -> TV | None:
    return ctx.tensor(i) if ctx.has(i) else None


@onnx_op("MatMulInteger")
def _matmul_integer(ctx: OnnxCtx) -> TV:
    a, b = ctx.tensor(0), ctx.tensor(1)
    return ctx.cast(_int_product(ctx, a, _opt(ctx, 2), b, _opt(ctx, 3)), DType.int32)


@onnx_op("QLinearMatMul")
def _qlinear_matmul(ctx: OnnxCtx) -> TV:
    a, a_scale, a_zero = ctx.tensor(0), ctx.tensor(1), ctx.tensor(2)
    b, b_scale, b_zero = ctx.tensor(3), ctx.tensor(4), ctx.tensor(5)
    y_scale, y_zero = ctx.tensor(6), ctx.tensor(7)
    out = y_zero.dtype
    if out not in _RANGE:
        raise unsupported(f"QLinearMatMul output of {out.short}")
    f32 = DType.float32
    acc = ctx.cast(_int_product(ctx, a, a_zero, b, b_zero), f32)
    a_s = ctx.cast(_per(ctx, a_scale, a, "row"), f32)
    b_s = ctx.cast(_per(ctx, b_scale, b, "col"), f32)
    y_s = ctx.cast(_per(ctx, y_scale, acc, "row"), f32)
    mult = ctx.add("div", (ctx.add("mul", (a_s, b_s)), y_s))
    y = ctx.add("round", (ctx.add("mul", (acc, mult)),))
    y = ctx.add("add", (y, ctx.cast(_per(ctx, y_zero, acc, "row"), f32)))
    lo, hi = _RANGE[out]
    return ctx.cast(ctx.add("clamp", (y,), {"min": float(lo), "max": float(hi)}), out)


@onnx_op("DynamicQuantizeLinear")
def _dynamic_quantize(ctx: OnnxCtx) -> tuple[TV, TV, TV]:
    """uint8 with the range stretched to hold 0: scale = (max(x, 0) - min(x, 0)) / 255, zero point
    round(-min / scale) saturated. An all-zero x would have scale 0: onnxruntime gives it scale 1
    (and zero point 0, values 0), and so do we."""
    x = ctx.tensor(0)
    if x.dtype is not DType.float32:
        raise unsupported(f"DynamicQuantizeLinear of {x.dtype.short}")
    f32 = DType.float32
    zero = ctx.scalar(0.0, f32)
    every = {"dims": (), "keepdim": False}
    lo = ctx.add("minimum", (ctx.add("amin", (x,), every), zero)) if x.type.numel else zero
    hi = ctx.add("maximum", (ctx.add("amax", (x,), every), zero)) if x.type.numel else zero
    scale = ctx.add("div", (ctx.add("sub", (hi, lo)), ctx.scalar(255.0, f32)))
    scale = ctx.add("where", (ctx.add("eq", (scale, zero)), ctx.scalar(1.0, f32), scale))
    sat = {"min": 0.0, "max": 255.0}
    zp = ctx.add("round", (ctx.add("clamp", (ctx.add("neg", (ctx.add("div", (lo, scale)),)),), sat),))
    y = ctx.add("add", (ctx.add("round", (ctx.add("div", (x, scale)),)), zp))
    y = ctx.cast(ctx.add("clamp", (y,), sat), DType.uint8)
    return y, scale, ctx.cast(zp, DType.uint8)


_INT_RANGE = {
    DType.uint8: (0, 255),
    DType.int8: (-128, 127),
    DType.uint16: (0, 65535),
    DType.int16: (-32768, 32767),
}


def _per_axis(ctx: OnnxCtx, v: TV, x: TV) -> TV:
    """A DequantizeLinear/QuantizeLinear scale or zero point: per tensor, or 1-D along `axis`."""
    if int(ctx.attr("block_size", 0)):
        raise unsupported("blocked quantization (block_size)")
    if v.type.numel == 1 and v.rank <= 1:
        return ctx.reshape(v, ())
    if v.rank != 1 or x.rank == 0:
        raise unsupported(f"a scale or zero point of shape {v.shape}")
    d = norm_axis(int(ctx.attr("axis", 1)), x.rank)
    if v.shape[0] != x.shape[d]:
        raise unsupported(f"a per-axis scale of {v.shape[0]} for dim {d} of {x.shape}")
    return ctx.reshape(v, tuple(x.shape[d] if i == d else 1 for i in range(x.rank)))


def _output_dtype(ctx: OnnxCtx, default: DType) -> DType:
    to = int(ctx.attr("output_dtype", 0))
    return dtype_of(to, f"output_dtype of node {ctx.name!r}") if to else default


@onnx_op("DequantizeLinear")
def _dequantize(ctx: OnnxCtx) -> TV:
    """(x - zero) * scale, computed in fp32 and rounded once to the scale's type."""
    x, scale = ctx.tensor(0), ctx.tensor(1)
    if x.dtype not in _INT_RANGE and x.dtype is not DType.int32:
        raise unsupported(f"DequantizeLinear of {x.dtype.short}")
    f32 = DType.float32
    v = ctx.cast(x, f32)
    if ctx.has(2):
        v = ctx.add("sub", (v, ctx.cast(_per_axis(ctx, ctx.tensor(2), x), f32)))
    y = ctx.add("mul", (v, ctx.cast(_per_axis(ctx, scale, x), f32)))
    return ctx.cast(y, _output_dtype(ctx, scale.dtype))


@onnx_op("QuantizeLinear")
def _quantize(ctx: OnnxCtx) -> TV:
    """saturate(round(x / scale) + zero), rounded half to even. The division is in `precision` when the
    node names one, else (as onnxruntime does) in the scale's type from opset 23 and in fp32 before:
    for half scales the two round differently."""
    x, scale = ctx.tensor(0), ctx.tensor(1)
    zero = ctx.tensor(2) if ctx.has(2) else None
    out = _output_dtype(ctx, zero.dtype if zero is not None else DType.uint8)
    if out not in _INT_RANGE:
        raise unsupported(f"QuantizeLinear to {out.short}")
    if not (x.dtype.is_float or x.dtype is DType.int32):
        raise unsupported(f"QuantizeLinear of {x.dtype.short}")
    f32 = DType.float32
    prec = int(ctx.attr("precision", 0))
    if prec:
        div_dtype = dtype_of(prec, f"precision of node {ctx.name!r}")
    else:
        div_dtype = scale.dtype if ctx.opset >= 23 else f32
    if not div_dtype.is_float:
        raise unsupported(f"QuantizeLinear precision {div_dtype.short}")
    q = ctx.add("div", (ctx.cast(x, div_dtype), ctx.cast(_per_axis(ctx, scale, x), div_dtype)))
    y = ctx.add("round", (ctx.cast(q, f32),))
    if zero is not None:
        y = ctx.add("add", (y, ctx.cast(_per_axis(ctx, zero, x), f32)))
    lo, hi = _INT_RANGE[out]
    return ctx.cast(ctx.add("clamp", (y,), {"min": float(lo), "max": float(hi)}), out)
