"""Converters for elementwise ATen ops: unary math, binary arithmetic and comparisons, where, clamp, casts.

Type promotion is resolved here: every operand is cast to the compute dtype torch would use, so the
IR ops see inputs of one dtype (see autofusion.ir.catalog).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from autofusion.frontend.torch.context import TV, ConvCtx, converts, result_type, unsupported
from autofusion.ir import catalog
from autofusion.ir.dtypes import DType

# ATen names that differ from the IR op they become.
_UNARY_ALIASES = {"sgn": "sign", "fix": "trunc", "special_expit": "sigmoid", "special_erfinv": "erfinv"}
_FLOAT_UNARY = set(catalog.FLOAT_UNARY)


def _unary(ctx: ConvCtx, op: str, x: TV, **attrs: Any) -> TV:
    out = ctx.out_dtype
    if op in catalog.PREDICATE_UNARY:
        return ctx.add(op, (x,), attrs)
    # Float ops on int inputs compute in the float type torch returns (exp(int) -> float32).
    return ctx.add(op, (ctx.cast(x, out),), attrs)


def _register_unary(aten: str, op: str) -> None:
    converts(aten)(lambda ctx, a: _unary(ctx, op, a["self"]))


for _n in sorted(_FLOAT_UNARY | set(catalog.ANY_UNARY) | set(catalog.PREDICATE_UNARY) | {"bitwise_not"}):
    if _n not in ("silu", "hardsigmoid", "hardswish", "mish", "round"):
        _register_unary(_n, _n)
for _aten, _op in _UNARY_ALIASES.items():
    _register_unary(_aten, _op)


@converts("round")
def _round(ctx: ConvCtx, a: dict[str, Any]) -> TV:
    """torch.round(x, decimals=d), spelled as eager's kernel computes it, in fp32 for half inputs:
    nearbyint(x * p) / p for d >= 0 and nearbyint(x / p) * p for d < 0, p = (float)10^|d|."""
    x, d = a["self"], int(a.get("decimals", 0))
    if d == 0:
        return _unary(ctx, "round", x)
    if not x.dtype.is_float:
        raise unsupported(f"round with decimals={d} on {x.dtype.short} (eager does not define it)")
    compute = DType.float32 if x.dtype in (DType.float16, DType.bfloat16) else x.dtype
    p = _float32(10.0 ** abs(d) if abs(d) <= 308 else math.inf)
    scale, unscale = ("div", "mul") if d < 0 else ("mul", "div")
    xc = ctx.cast(x, compute)
    r = ctx.add("round", (ctx.add(scale, (xc, ctx.scalar(p, compute))),))
    return ctx.cast(ctx.add(unscale, (r, ctx.scalar(p, compute))), x.dtype)


def _float32(v: float) -> float:
    """v rounded to float32 (inf when it overflows), as eager's static_cast<float>(std::pow(10, d))."""
    return float(torch.tensor(v, dtype=torch.float64).to(torch.float32))


@converts("silu", "hardsigmoid", "hardswish", "mish")
def _nn_unary(ctx: ConvCtx, a: dict[str, Any]) -> TV:
    op = ctx.overload_packet
    return _unary(ctx, op, a["self"])


@converts("gelu")
def _gelu(ctx: ConvCtx, a: dict[str, Any]) -> TV:
    return _unary(ctx, "gelu", a["self"], approximate=a.get("approximate", "none"))


@converts("leaky_relu")
def _leaky_relu(ctx: ConvCtx, a: dict[str, Any]) -> TV:
    return _unary(ctx, "leaky_relu", a["self"], negative_slope=float(a.get("negative_slope", 0.01)))


@converts("elu")
def _elu(ctx: ConvCtx, a: dict[str, Any]) -> TV:
    return _unary(ctx, "elu", a["self"], alpha=float(a.get("alpha", 1.0)), scale=float(a.get("scale", 1.0)),
                  input_scale=float(a.get("input_scale", 1.0)))  # fmt: skip


@converts("softplus")
def _softplus(ctx: ConvCtx, a: dict[str, Any]) -> TV:
    return _unary(ctx, "softplus", a["self"], beta=float(a.get("beta", 1.0)),
                  threshold=float(a.get("threshold", 20.0)))  # fmt: skip


@converts("relu6")
def _relu6(ctx: ConvCtx, a: dict[str, Any]) -> TV:
    return _clamp_scalars(ctx, a["self"], 0, 6)


@converts("hardtanh")
def _hardtanh(ctx: ConvCtx, a: dict[str, Any]) -> TV:
    return _clamp_scalars(ctx, a["self"], a.get("min_val", -1.0), a.get("max_val", 1.0))


def _clamp_scalars(ctx: ConvCtx, x: TV, lo: Any, hi: Any) -> TV:
    out = ctx.out_dtype
    conv = float if out.is_float else int
    return ctx.add("clamp", (ctx.cast(x, out),), {"min": None if lo is None else conv(lo),
                                                  "max": None if hi is None else conv(hi)})  # fmt: skip


@converts("clamp", "clip")
def _clamp(ctx: ConvCtx, a: dict[str, Any]) -> TV:
    x, lo, hi = a["self"], a.get("min"), a.get("max")
    if isinstance(lo, TV) or isinstance(hi, TV):
        out = ctx.cast(x, ctx.out_dtype)
        if lo is not None:
            out = ctx.add("maximum", (out, ctx.value(lo, ctx.out_dtype)))
        if hi is not None:
            out = ctx.add("minimum", (out, ctx.value(hi, ctx.out_dtype)))
        return out
    if lo is None and hi is None:
        raise unsupported("clamp needs at least one bound")
    return _clamp_scalars(ctx, x, lo, hi)


@converts("clamp_min")
def _clamp_min(ctx: ConvCtx, a: dict[str, Any]) -> TV:
    return _clamp(ctx, {"self": a["self"], "min": a["min"]})


@converts("clamp_max")
def _clamp_max(ctx: ConvCtx, a: dict[str, Any]) -> TV:
    return _clamp(ctx, {"self": a["self"], "max": a["max"]})


# ---- binary ------------------------------------------------------------------------------------


_HALF = (DType.float16, DType.bfloat16)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _unrounded(ctx: ConvCtx, v: float, dtype: DType) -> TV:
    return ctx.add("full", (), {"value": float(v), "dtype": dtype})


def binary(ctx: ConvCtx, op: str, x: Any, y: Any, **attrs: Any) -> TV:
    """Most eager kernels convert a Python scalar to the tensor's type first (so the literal of a half
    type holds the rounded value: x16 + 0.7 adds 0.7002), but mul and div by a scalar compute in fp32 with
    the scalar as it is (x16 * 0.7 is round16(float(x) * 0.7f)), and floor/trunc division by a scalar
    computes in fp32 too, where a tensor divisor makes it compute in the half type."""
    out = ctx.out_dtype
    # Comparisons and logical ops output bool but compare in the promoted type; arithmetic computes
    # in its output type (which also covers true division of ints into float).
    compute = result_type(x, y) if out.is_bool else out
    if compute in _HALF and (_is_number(x) or _is_number(y)):
        if op == "div" and attrs.get("rounding_mode"):
            f32 = DType.float32
            return ctx.cast(ctx.add(op, (ctx.value(x, f32), ctx.value(y, f32)), attrs), compute)
        if op in ("mul", "div"):
            # the literal keeps the fp32 value eager multiplies by (kernels compute halves in fp32)
            x, y = (_unrounded(ctx, v, compute) if _is_number(v) else v for v in (x, y))
    return ctx.add(op, (ctx.value(x, compute), ctx.value(y, compute)), attrs)


def _scaled(ctx: ConvCtx, y: Any, alpha: Any) -> Any:
    if alpha is None or alpha == 1:
        return y
    if isinstance(y, TV):
        return ctx.add("mul", (ctx.cast(y, ctx.out_dtype), ctx.scalar(alpha, ctx.out_dtype)))
    return y * alpha


@converts("add")
def _add(ctx: ConvCtx, a: dict[str, Any]) -> TV:
    return binary(ctx, "add", a["self"], _scaled(ctx, a["other"], a.get("alpha")))


@converts("sub")
def _sub(ctx: ConvCtx, a: dict[str, Any]) -> TV:
    return binary(ctx, "sub", a["self"], _scaled(ctx, a["other"], a.get("alpha")))


@converts("rsub")
def _rsub(ctx: ConvCtx, a: dict[str, Any]) -> TV:
    return binary(ctx, "sub", a["other"], _scaled(ctx, a["self"], a.get("alpha")))


@converts("div")
def _div(ctx: ConvCtx, a: dict[str, Any]) -> TV:
    mode = a.get("rounding_mode")
    return binary(ctx, "div", a["self"], a["other"], **({"rounding_mode": mode} if mode else {}))


@converts("floor_divide")
def _floor_divide(ctx: ConvCtx, a: dict[str, Any]) -> TV:
    return binary(ctx, "div", a["self"], a["other"], rounding_mode="floor")


@converts("true_divide")
def _true_divide(ctx: ConvCtx, a: dict[str, Any]) -> TV:
    return binary(ctx, "div", a["self"], a["other"])


@converts("pow")
def _pow(ctx: ConvCtx, a: dict[str, Any]) -> TV:
    base = a["self"]
    exp = a.get("exponent")
    out = ctx.out_dtype
    if isinstance(base, TV) and isinstance(exp, (int, float)) and not isinstance(exp, bool) and out.is_float:
        special = _pow_special(ctx, ctx.cast(base, out), float(exp))
        if special is not None:
            return special
    return binary(ctx, "pow", base, exp)


def _pow_special(ctx: ConvCtx, x: TV, e: float) -> TV | None:
    """pow(x, scalar) where eager does not call pow: sqrt, rsqrt, reciprocal for fp32/fp64/bf16 and
    x*x, x*x*x, 1/(x*x) for fp32/fp64/bf16 (never fp16, which always takes std::pow). These differ from pow
    on special values (pow(-0, 0.5) = +0 but sqrt(-0) = -0; pow(-inf, 0.5) = inf but sqrt(-inf) = NaN)."""
    if x.dtype is DType.float16:
        return None
    unary = {0.5: "sqrt", -0.5: "rsqrt", -1.0: "reciprocal"}.get(e)
    if unary is not None:
        return ctx.add(unary, (x,))
    if e in (2.0, 3.0, -2.0):
        sq = ctx.add("mul", (x, x))
        if e == 3.0:
            return ctx.add("mul", (sq, x))
        return sq if e == 2.0 else ctx.add("div", (ctx.scalar(1.0, x.dtype), sq))
    return None


_SAME_NAME_BINARY = set(
    catalog.ARITH_BINARY + catalog.COMPARE_BINARY + catalog.LOGICAL_BINARY + catalog.BITWISE
)
for _n in sorted(_SAME_NAME_BINARY - {"add", "sub", "div", "pow"}):
    converts(_n)((lambda op: lambda ctx, a: binary(ctx, op, a["self"], a["other"]))(_n))
for _aten, _op in {"mul": "mul", "greater": "gt", "less": "lt", "greater_equal": "ge", "less_equal": "le",
                   "not_equal": "ne"}.items():  # fmt: skip
    if _aten not in _SAME_NAME_BINARY:
        converts(_aten)((lambda op: lambda ctx, a: binary(ctx, op, a["self"], a["other"]))(_op))


@converts("fmax", "fmin")
def _fmax_fmin(ctx: ConvCtx, a: dict[str, Any]) -> TV:
    """fmax/fmin ignore a NaN operand (NaN only when both are), unlike maximum/minimum. As eager's std::fmax:
    the first operand when it compares >= (<= for fmin) or the second is NaN, else the second."""
    out = ctx.out_dtype
    x, y = ctx.value(a["self"], out), ctx.value(a["other"], out)
    if not out.is_float:
        return ctx.add("maximum" if ctx.overload_packet == "fmax" else "minimum", (x, y))
    keep = ctx.add("ge" if ctx.overload_packet == "fmax" else "le", (x, y))
    keep = ctx.add("logical_or", (keep, ctx.add("isnan", (y,))))
    return ctx.add("where", (keep, x, y))


@converts("max", "min")
def _max_min(ctx: ConvCtx, a: dict[str, Any]) -> Any:
    from autofusion.frontend.torch.converters.reduction import max_min_reduce

    if "other" in a:  # max.other is elementwise maximum
        return binary(ctx, "maximum" if ctx.overload_packet == "max" else "minimum", a["self"], a["other"])
    return max_min_reduce(ctx, a)


@converts("where")
def _where(ctx: ConvCtx, a: dict[str, Any]) -> TV:
    cond = a["condition"]
    if "self" not in a:
        raise unsupported("where(cond) with one argument is nonzero(), whose shape depends on data")
    out = ctx.out_dtype
    return ctx.add(
        "where", (ctx.cast(cond, DType.bool), ctx.value(a["self"], out), ctx.value(a["other"], out))
    )


@converts("masked_fill")
def _masked_fill(ctx: ConvCtx, a: dict[str, Any]) -> TV:
    out = ctx.out_dtype
    return ctx.add(
        "where", (ctx.cast(a["mask"], DType.bool), ctx.value(a["value"], out), ctx.cast(a["self"], out))
    )


@converts("lerp")
def _lerp(ctx: ConvCtx, a: dict[str, Any]) -> TV:
    """One IR lerp (eager's two-sided formula with a fused multiply-add; see af_lerp in af_math.h)."""
    out = ctx.out_dtype
    if not out.is_float:
        raise unsupported(f"lerp on {out.short}")
    w = a["weight"]
    if out in _HALF and _is_number(w):  # eager: fp32 math with the weight unrounded
        f32 = DType.float32
        ins = (ctx.cast(a["self"], f32), ctx.cast(a["end"], f32), ctx.scalar(w, f32))
        return ctx.cast(ctx.add("lerp", ins), out)
    return ctx.add("lerp", (ctx.cast(a["self"], out), ctx.cast(a["end"], out), ctx.value(w, out)))


# ---- casts and identities ----------------------------------------------------------------------


@converts("_to_copy", "to", "type_as", "_to_dtype")
def _to_copy(ctx: ConvCtx, a: dict[str, Any]) -> TV:
    x = a.get("self")
    if not isinstance(x, TV):
        raise unsupported("conversion of a non-tensor")
    device = a.get("device")
    if device is not None and str(device) != "cpu":
        raise unsupported(f"moves the tensor to device {device}")
    return ctx.cast(x, ctx.out_dtype)


@converts("clone", "alias", "contiguous", "detach", "lift_fresh_copy", "lift_fresh", "positive",
          "_assert_tensor_metadata_passthrough")  # fmt: skip
def _identity(ctx: ConvCtx, a: dict[str, Any]) -> TV:
    # IR values are logical tensors: copies and layout changes are the planner's business, not the graph's.
    return ctx.cast(a["self"], ctx.out_dtype)


@converts("dropout", "feature_dropout", "alpha_dropout")
def _dropout(ctx: ConvCtx, a: dict[str, Any]) -> TV:
    if a.get("train", False) and a.get("p", 0.0) > 0:
        raise unsupported("dropout in training mode is random; run the model in eval mode for inference")
    return a["input"]
