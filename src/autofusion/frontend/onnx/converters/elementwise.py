"""ONNX elementwise ops -> IR: unary math, activations, binary arithmetic and comparisons, Where, Cast, Clip.

ONNX binary ops take inputs of one type already (Pow excepted), so no promotion is needed; the IR's
one-dtype rule holds as is. Integer Div truncates toward zero (C semantics, as onnxruntime does).
"""

from __future__ import annotations

import math

from autofusion.errors import FrontendError, ModelFileError
from autofusion.frontend.onnx.context import OnnxCtx, dtype_of, onnx_op, unsupported
from autofusion.frontend.torch.context import TV
from autofusion.ir.dtypes import DType

_UNARY = {
    "Relu": "relu",
    "Sigmoid": "sigmoid",
    "Tanh": "tanh",
    "Erf": "erf",
    "Sqrt": "sqrt",
    "Exp": "exp",
    "Log": "log",
    "Neg": "neg",
    "Abs": "abs",
    "Reciprocal": "reciprocal",
    "Floor": "floor",
    "Ceil": "ceil",
    "Round": "round",
    "Sin": "sin",
    "Cos": "cos",
    "Tan": "tan",
    "Asin": "asin",
    "Acos": "acos",
    "Atan": "atan",
    "Sinh": "sinh",
    "Cosh": "cosh",
    "Asinh": "asinh",
    "Acosh": "acosh",
    "Atanh": "atanh",
    "Not": "logical_not",
    "IsNaN": "isnan",
    "Softplus": "softplus",
    "HardSwish": "hardswish",
    "Mish": "mish",
}
_BINARY = {
    "Add": "add",
    "Sub": "sub",
    "Mul": "mul",
    "Equal": "eq",
    "Less": "lt",
    "LessOrEqual": "le",
    "Greater": "gt",
    "GreaterOrEqual": "ge",
    "And": "logical_and",
    "Or": "logical_or",
    "Xor": "logical_xor",
    "BitwiseAnd": "bitwise_and",
    "BitwiseOr": "bitwise_or",
    "BitwiseXor": "bitwise_xor",
}


def _register_unary(onnx_name: str, op: str) -> None:
    onnx_op(onnx_name)(lambda ctx: ctx.add(op, (ctx.tensor(0),)))


def _register_binary(onnx_name: str, op: str) -> None:
    onnx_op(onnx_name)(lambda ctx: ctx.add(op, (ctx.tensor(0), ctx.tensor(1))))


for _k, _v in _UNARY.items():
    _register_unary(_k, _v)
for _k, _v in _BINARY.items():
    _register_binary(_k, _v)


@onnx_op("Identity")
def _identity(ctx: OnnxCtx) -> TV:
    return ctx.tensor(0)  # Dropout, the identity at inference, is in classic.py with its mask


@onnx_op("Div")
def _div(ctx: OnnxCtx) -> TV:
    a, b = ctx.tensor(0), ctx.tensor(1)
    return ctx.add("div", (a, b), {} if a.dtype.is_float else {"rounding_mode": "trunc"})


@onnx_op("Pow")
def _pow(ctx: OnnxCtx) -> TV:
    base, exp = ctx.tensor(0), ctx.tensor(1)
    c = ctx.const(1)
    if c is not None and c.size == 1 and base.dtype.is_float:
        # x^2 is the common case: exact as a multiply (x^0.5 is not sqrt: pow(-0, 0.5) = +0 and
        # pow(-inf, 0.5) = inf, where sqrt gives -0 and NaN, as onnxruntime's Pow does not)
        v = float(c.reshape(-1)[0])
        if v == 2.0 and exp.rank <= base.rank:
            return ctx.add("mul", (base, base))
    return ctx.add("pow", (base, ctx.cast(exp, base.dtype)))


@onnx_op("Sign")
def _sign(ctx: OnnxCtx) -> TV:
    # ONNX (and onnxruntime) keep NaN: Sign(NaN) = NaN, where torch.sign gives 0
    x = ctx.tensor(0)
    if not x.dtype.is_float:
        return ctx.add("sign", (x,))
    return ctx.add("where", (ctx.add("isnan", (x,)), x, ctx.add("sign", (x,))))


@onnx_op("Mod")
def _mod(ctx: OnnxCtx) -> TV:
    a, b = ctx.tensor(0), ctx.tensor(1)
    # fmod=1: C's fmod (the sign of a); fmod=0: Python's % (the sign of b), on floats from opset 28,
    # which defines it as a - floor(a / b) * b (earlier opsets reject it, as onnxruntime does)
    fmod = int(ctx.attr("fmod", 0))
    if not fmod and a.dtype.is_float and ctx.opset < 28:
        # An invalid model, not an op we lack: refused outright (no fallback computes something for it).
        raise FrontendError(
            f"{ctx.loc}: Mod with fmod=0 on floats is defined from opset 28 (this model: {ctx.opset})"
        )
    return ctx.add("fmod" if fmod else "remainder", (a, b))


def _variadic(ctx: OnnxCtx, op: str) -> TV:
    ts = ctx.tensors()
    out = ts[0]
    for t in ts[1:]:
        out = ctx.add(op, (out, t))
    if len(ts) == 1:
        out = ctx.add("add", (out, ctx.scalar(0, out.dtype))) if op == "add" else out
    return out


@onnx_op("Sum")
def _sum(ctx: OnnxCtx) -> TV:
    return _variadic(ctx, "add")


@onnx_op("Max")
def _max(ctx: OnnxCtx) -> TV:
    return _variadic(ctx, "maximum")


@onnx_op("Min")
def _min(ctx: OnnxCtx) -> TV:
    return _variadic(ctx, "minimum")


@onnx_op("Mean")
def _mean(ctx: OnnxCtx) -> TV:
    ts = ctx.tensors()
    total = _variadic(ctx, "add")
    return ctx.add("div", (total, ctx.scalar(len(ts), total.dtype)))


@onnx_op("IsInf")
def _isinf(ctx: OnnxCtx) -> TV:
    x = ctx.tensor(0)
    neg, pos = int(ctx.attr("detect_negative", 1)), int(ctx.attr("detect_positive", 1))
    if neg and pos:
        return ctx.add("isinf", (x,))
    if not neg and not pos:
        return ctx.add("full", (), {"value": False, "dtype": DType.bool, "shape": x.shape})
    return ctx.add("eq", (x, ctx.scalar(math.inf if pos else -math.inf, x.dtype)))


@onnx_op("Gelu")
def _gelu(ctx: OnnxCtx) -> TV:
    return ctx.add("gelu", (ctx.tensor(0),), {"approximate": ctx.attr("approximate", "none")})


@onnx_op("LeakyRelu")
def _leaky_relu(ctx: OnnxCtx) -> TV:
    return ctx.add("leaky_relu", (ctx.tensor(0),), {"negative_slope": float(ctx.attr("alpha", 0.01))})


@onnx_op("Elu")
def _elu(ctx: OnnxCtx) -> TV:
    return ctx.add("elu", (ctx.tensor(0),), {"alpha": float(ctx.attr("alpha", 1.0))})


@onnx_op("HardSigmoid")
def _hard_sigmoid(ctx: OnnxCtx) -> TV:
    # ONNX defaults (alpha 0.2) differ from torch's hardsigmoid (1/6): spell it out.
    x = ctx.tensor(0)
    alpha, beta = float(ctx.attr("alpha", 0.2)), float(ctx.attr("beta", 0.5))
    y = ctx.add("add", (ctx.add("mul", (x, ctx.scalar(alpha, x.dtype))), ctx.scalar(beta, x.dtype)))
    return ctx.add("clamp", (y,), {"min": 0.0, "max": 1.0})


@onnx_op("Softsign")
def _softsign(ctx: OnnxCtx) -> TV:
    x = ctx.tensor(0)
    return ctx.add("div", (x, ctx.add("add", (ctx.add("abs", (x,)), ctx.scalar(1, x.dtype)))))


@onnx_op("PRelu")
def _prelu(ctx: OnnxCtx) -> TV:
    x, slope = ctx.tensor(0), ctx.tensor(1)
    neg = ctx.add("lt", (x, ctx.scalar(0, x.dtype)))
    return ctx.add("where", (neg, ctx.add("mul", (x, slope)), x))


@onnx_op("Clip")
def _clip(ctx: OnnxCtx) -> TV:
    x = ctx.tensor(0)
    bounds: list[float | int | TV | None] = []
    for i in (1, 2):
        c = ctx.const(i)
        if not ctx.has(i):
            bounds.append(None)
        elif c is not None and c.size == 1:
            v = c.reshape(-1)[0].item()
            bounds.append(float(v) if x.dtype.is_float else int(v))
        else:
            bounds.append(ctx.tensor(i))
    lo, hi = bounds
    if isinstance(lo, TV) or isinstance(hi, TV):
        out = x
        if lo is not None:
            out = ctx.add("maximum", (out, lo if isinstance(lo, TV) else ctx.scalar(lo, x.dtype)))
        if hi is not None:
            out = ctx.add("minimum", (out, hi if isinstance(hi, TV) else ctx.scalar(hi, x.dtype)))
        return out
    if lo is None and hi is None:
        return x
    return ctx.add("clamp", (x,), {"min": lo, "max": hi})


@onnx_op("Where")
def _where(ctx: OnnxCtx) -> TV:
    return ctx.add("where", (ctx.tensor(0), ctx.tensor(1), ctx.tensor(2)))


@onnx_op("Cast")
def _cast(ctx: OnnxCtx) -> TV:
    try:
        to = dtype_of(int(ctx.attr("to")), "the target type")
    except ModelFileError as e:  # an unsupported variant of this node: the refusal names node, op, opset
        raise unsupported(str(e)) from None
    return ctx.cast(ctx.tensor(0), to)


@onnx_op("CastLike")
def _cast_like(ctx: OnnxCtx) -> TV:
    return ctx.cast(ctx.tensor(0), ctx.type(1).dtype)
