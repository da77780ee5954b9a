"""IR op -> ONNX nodes: the table `autofusion.export.onnx` writes graphs and fused-kernel functions with.

`emit(sink, node, ins, outs)` appends the ONNX nodes that compute one IR node, reading ONNX value names
`ins` and defining `outs`. Ops ONNX has directly map one to one; the rest are spelled out with ONNX
ops (rsqrt = Reciprocal(Sqrt), gelu through Erf, sdpa as MatMul-Softmax-MatMul...). An IR node that
came from an ONNX extern is written back as the original ONNX node; a fusion rule's library call
(`autofusion_rules.*`) is expanded by `autofusion.export.onnx_library`. Target opset: 18.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import onnx
import onnx.parser
from onnx import TensorProto

from autofusion.errors import ExportError
from autofusion.export.onnx_library import EXPANSIONS
from autofusion.export.onnx_math import gelu
from autofusion.export.onnx_math import scalar as _scalar
from autofusion.export.writer import Sink, tensor_proto
from autofusion.export.writer import elem_type as onnx_type
from autofusion.ir.dtypes import DType
from autofusion.ir.graph import Node
from autofusion.ir.types import TensorType

OPSET = 18
ATEN_DOMAIN = "org.pytorch.aten"
INT64_MIN = -(2**63)


Emit = Callable[[Sink, Node, list[str], list[str]], None]
_UNARY = {
    "exp": "Exp",
    "log": "Log",
    "sqrt": "Sqrt",
    "reciprocal": "Reciprocal",
    "sin": "Sin",
    "cos": "Cos",
    "tan": "Tan",
    "asin": "Asin",
    "acos": "Acos",
    "atan": "Atan",
    "sinh": "Sinh",
    "cosh": "Cosh",
    "tanh": "Tanh",
    "asinh": "Asinh",
    "acosh": "Acosh",
    "atanh": "Atanh",
    "sigmoid": "Sigmoid",
    "erf": "Erf",
    "neg": "Neg",
    "abs": "Abs",
    "relu": "Relu",
    "sign": "Sign",
    "floor": "Floor",
    "ceil": "Ceil",
    "round": "Round",
    "isnan": "IsNaN",
    "isinf": "IsInf",
    "logical_not": "Not",
    "bitwise_not": "BitwiseNot",
    "hardswish": "HardSwish",
    "mish": "Mish",
    "softplus": "Softplus",
}
_BINARY = {
    "add": "Add",
    "sub": "Sub",
    "mul": "Mul",
    "pow": "Pow",
    "maximum": "Max",
    "minimum": "Min",
    "eq": "Equal",
    "lt": "Less",
    "le": "LessOrEqual",
    "gt": "Greater",
    "ge": "GreaterOrEqual",
    "logical_and": "And",
    "logical_or": "Or",
    "logical_xor": "Xor",
    "bitwise_and": "BitwiseAnd",
    "bitwise_or": "BitwiseOr",
    "bitwise_xor": "BitwiseXor",
}
_REDUCE = {
    "sum": "ReduceSum",
    "mean": "ReduceMean",
    "amax": "ReduceMax",
    "amin": "ReduceMin",
    "prod": "ReduceProd",
}
EMITTERS: dict[str, Emit] = {}


def emits(*names: str) -> Callable[[Emit], Emit]:
    def deco(fn: Emit) -> Emit:
        for n in names:
            EMITTERS[n] = fn
        return fn

    return deco


def _in_type(s: Sink, node: Node, i: int) -> TensorType:
    return s.types[node.inputs[i]]


for _op, _onnx in _UNARY.items():
    EMITTERS[_op] = (lambda o: lambda s, n, i, out: s.node(o, i, out))(_onnx)
for _op, _onnx in _BINARY.items():
    EMITTERS[_op] = (lambda o: lambda s, n, i, out: s.node(o, i, out))(_onnx)


@emits(
    "rsqrt",
    "square",
    "exp2",
    "expm1",
    "log2",
    "log10",
    "log1p",
    "silu",
    "erfc",
    "hardsigmoid",
    "trunc",
    "isfinite",
)
def _composite_unary(s: Sink, n: Node, i: list[str], o: list[str]) -> None:
    x, dt = i[0], _in_type(s, n, 0).dtype
    op = n.op
    if op == "rsqrt":
        s.node("Reciprocal", [s.node("Sqrt", [x])], o)
    elif op == "square":
        s.node("Mul", [x, x], o)
    elif op == "exp2":
        s.node("Pow", [_scalar(s, 2.0, dt), x], o)
    elif op == "expm1":
        s.node("Sub", [s.node("Exp", [x]), _scalar(s, 1.0, dt)], o)
    elif op in ("log2", "log10"):
        s.node("Div", [s.node("Log", [x]), _scalar(s, math.log(2.0 if op == "log2" else 10.0), dt)], o)
    elif op == "log1p":
        s.node("Log", [s.node("Add", [x, _scalar(s, 1.0, dt)])], o)
    elif op == "silu":
        s.node("Mul", [x, s.node("Sigmoid", [x])], o)
    elif op == "erfc":
        s.node("Sub", [_scalar(s, 1.0, dt), s.node("Erf", [x])], o)
    elif op == "hardsigmoid":
        s.node("HardSigmoid", [x], o, alpha=1.0 / 6.0, beta=0.5)
    elif op == "trunc":
        s.node(
            "Mul", [s.node("Sign", [x]), s.node("Floor", [s.node("Abs", [x])])], o
        ) if dt.is_float else s.node("Identity", [x], o)
    else:  # isfinite
        s.node("Not", [s.node("Or", [s.node("IsNaN", [x]), s.node("IsInf", [x])])], o)


@emits("gelu")
def _gelu(s: Sink, n: Node, i: list[str], o: list[str]) -> None:
    gelu(s, i[0], _in_type(s, n, 0).dtype, n.attr("approximate") == "tanh", o)


@emits("leaky_relu")
def _leaky_relu(s: Sink, n: Node, i: list[str], o: list[str]) -> None:
    s.node("LeakyRelu", i, o, alpha=float(n.attr("negative_slope")))


@emits("elu")
def _elu(s: Sink, n: Node, i: list[str], o: list[str]) -> None:
    if n.attr("scale") != 1.0 or n.attr("input_scale") != 1.0:
        raise ExportError(f"node {n.name!r}: elu with scale/input_scale has no ONNX form")
    s.node("Elu", i, o, alpha=float(n.attr("alpha")))


@emits("clamp")
def _clamp(s: Sink, n: Node, i: list[str], o: list[str]) -> None:
    dt = _in_type(s, n, 0).dtype
    lo, hi = n.attr("min"), n.attr("max")
    s.node(
        "Clip", [i[0], "" if lo is None else _scalar(s, lo, dt), "" if hi is None else _scalar(s, hi, dt)], o
    )


@emits("cast")
def _cast(s: Sink, n: Node, i: list[str], o: list[str]) -> None:
    s.node("Cast", i, o, to=onnx_type(n.attr("dtype")))


@emits("div")
def _div(s: Sink, n: Node, i: list[str], o: list[str]) -> None:
    mode, dt = n.attr("rounding_mode"), _in_type(s, n, 0).dtype
    if mode is None or (mode == "trunc" and not dt.is_float):
        s.node("Div", i, o)
    elif mode == "floor" and dt.is_float:
        s.node("Floor", [s.node("Div", i)], o)
    elif mode == "trunc":
        q = s.node("Div", i)
        s.node("Mul", [s.node("Sign", [q]), s.node("Floor", [s.node("Abs", [q])])], o)
    else:
        raise ExportError(f"node {n.name!r}: integer floor division has no ONNX op")


@emits("remainder", "fmod")
def _mod(s: Sink, n: Node, i: list[str], o: list[str]) -> None:
    dt = _in_type(s, n, 0).dtype
    if n.op == "fmod":
        s.node("Mod", i, o, fmod=1)
    elif dt.is_float:  # ONNX Mod(fmod=0) is integer-only: a - floor(a / b) * b
        s.node("Sub", [i[0], s.node("Mul", [s.node("Floor", [s.node("Div", i)]), i[1]])], o)
    else:
        s.node("Mod", i, o, fmod=0)


@emits("ne")
def _ne(s: Sink, n: Node, i: list[str], o: list[str]) -> None:
    s.node("Not", [s.node("Equal", i)], o)


@emits("where")
def _where(s: Sink, n: Node, i: list[str], o: list[str]) -> None:
    s.node("Where", i, o)


@emits("lerp")
def _lerp(s: Sink, n: Node, i: list[str], o: list[str]) -> None:
    # where(|w| < 0.5, start + w * (end - start), end - (end - start) * (1 - w))
    dt = _in_type(s, n, 0).dtype
    start, end, w = i
    diff = s.node("Sub", [end, start])
    near_start = s.node("Add", [start, s.node("Mul", [w, diff])])
    near_end = s.node("Sub", [end, s.node("Mul", [diff, s.node("Sub", [_scalar(s, 1.0, dt), w])])])
    small = s.node("Less", [s.node("Abs", [w]), _scalar(s, 0.5, dt)])
    s.node("Where", [small, near_start, near_end], o)


@emits("full")
def _full(s: Sink, n: Node, i: list[str], o: list[str]) -> None:
    dt, shape = n.attr("dtype"), tuple(n.attr("shape"))
    if not shape:
        s.const(np.asarray(n.attr("value")), dt, o[0])
    else:
        s.node("ConstantOfShape", [s.ints(shape)], o, value=tensor_proto(np.asarray([n.attr("value")]), dt))


@emits("arange")
def _arange(s: Sink, n: Node, i: list[str], o: list[str]) -> None:
    dt = n.attr("dtype")
    s.node(
        "Range",
        [_scalar(s, n.attr("start"), dt), _scalar(s, n.attr("end"), dt), _scalar(s, n.attr("step"), dt)],
        o,
    )


@emits("reshape")
def _reshape(s: Sink, n: Node, i: list[str], o: list[str]) -> None:
    s.node("Reshape", [i[0], s.ints(n.attr("shape"))], o)


@emits("permute")
def _permute(s: Sink, n: Node, i: list[str], o: list[str]) -> None:
    s.node("Transpose", i, o, perm=list(n.attr("dims")))


@emits("expand")
def _expand(s: Sink, n: Node, i: list[str], o: list[str]) -> None:
    s.node("Expand", [i[0], s.ints(n.attr("shape"))], o)


@emits("slice")
def _slice(s: Sink, n: Node, i: list[str], o: list[str]) -> None:
    a = n.attr_dict
    s.node(
        "Slice", [i[0], s.ints([a["start"]]), s.ints([a["end"]]), s.ints([a["dim"]]), s.ints([a["step"]])], o
    )


@emits("select")
def _select(s: Sink, n: Node, i: list[str], o: list[str]) -> None:
    s.node("Gather", [i[0], s.const(np.asarray(n.attr("index")), DType.int64)], o, axis=int(n.attr("dim")))


@emits("concat")
def _concat(s: Sink, n: Node, i: list[str], o: list[str]) -> None:
    s.node("Concat", i, o, axis=int(n.attr("dim")))


@emits("pad")
def _pad(s: Sink, n: Node, i: list[str], o: list[str]) -> None:
    t = _in_type(s, n, 0)
    aten = list(n.attr("pads"))
    lo, hi = [0] * t.rank, [0] * t.rank
    for k in range(len(aten) // 2):
        d = t.rank - 1 - k
        lo[d], hi[d] = aten[2 * k], aten[2 * k + 1]
    s.node("Pad", [i[0], s.ints(lo + hi), _scalar(s, n.attr("value"), t.dtype)], o, mode="constant")


@emits("index_select")
def _index_select(s: Sink, n: Node, i: list[str], o: list[str]) -> None:
    s.node("Gather", i, o, axis=int(n.attr("dim")))


@emits("gather")
def _gather(s: Sink, n: Node, i: list[str], o: list[str]) -> None:
    s.node("GatherElements", i, o, axis=int(n.attr("dim")))


@emits("flip")
def _flip(s: Sink, n: Node, i: list[str], o: list[str]) -> None:
    dims = list(n.attr("dims"))
    k = len(dims)
    s.node("Slice", [i[0], s.ints([-1] * k), s.ints([INT64_MIN] * k), s.ints(dims), s.ints([-1] * k)], o)


def _axes(t: TensorType, dims: Any) -> list[int]:
    return list(dims) if dims else list(range(t.rank))


@emits(*_REDUCE, "any", "all")
def _reduce(s: Sink, n: Node, i: list[str], o: list[str]) -> None:
    t = _in_type(s, n, 0)
    keep = int(bool(n.attr("keepdim")))
    if t.rank == 0:
        s.node("Identity", i, o)
        return
    axes = s.ints(_axes(t, n.attr("dims")))
    if n.op in ("any", "all"):
        as_int = s.node("Cast", i, to=TensorProto.INT32)
        red = s.node("ReduceMax" if n.op == "any" else "ReduceMin", [as_int, axes], keepdims=keep)
        s.node("Cast", [red], o, to=TensorProto.BOOL)
    else:
        s.node(_REDUCE[n.op], [i[0], axes], o, keepdims=keep)


@emits("var")
def _var(s: Sink, n: Node, i: list[str], o: list[str]) -> None:
    t = _in_type(s, n, 0)
    dims = _axes(t, n.attr("dims"))
    count = math.prod(t.shape[d] for d in dims)
    axes = s.ints(dims)
    d = s.node("Sub", [i[0], s.node("ReduceMean", [i[0], axes], keepdims=1)])
    ss = s.node("ReduceSum", [s.node("Mul", [d, d]), axes], keepdims=int(bool(n.attr("keepdim"))))
    denom = count - n.attr("correction")
    s.node("Div", [ss, _scalar(s, denom if denom > 0 else math.nan, t.dtype)], o)


@emits("argmax", "argmin")
def _argreduce(s: Sink, n: Node, i: list[str], o: list[str]) -> None:
    op = "ArgMax" if n.op == "argmax" else "ArgMin"
    dim = n.attr("dim")
    if dim is None:
        s.node(op, [s.node("Reshape", [i[0], s.ints([-1])])], o, axis=0, keepdims=0)
    else:
        s.node(op, i, o, axis=int(dim), keepdims=int(bool(n.attr("keepdim"))))


@emits("softmax", "log_softmax")
def _softmax(s: Sink, n: Node, i: list[str], o: list[str]) -> None:
    s.node("Softmax" if n.op == "softmax" else "LogSoftmax", i, o, axis=int(n.attr("dim")))


def _param_or(
    s: Sink, ins: list[str], flags: list[bool], fill: list[float], shape: tuple[int, ...], dt: DType
) -> list[str]:
    it = iter(ins)
    return [next(it) if f else s.const(np.full(shape, v), dt) for f, v in zip(flags, fill, strict=False)]


@emits("layer_norm")
def _layer_norm(s: Sink, n: Node, i: list[str], o: list[str]) -> None:
    t = _in_type(s, n, 0)
    nd = n.attr("normalized_ndim")
    w, b = _param_or(
        s, i[1:], [n.attr("has_weight"), n.attr("has_bias")], [1.0, 0.0], t.shape[t.rank - nd :], t.dtype
    )
    s.node("LayerNormalization", [i[0], w, b], o, axis=-nd, epsilon=float(n.attr("eps")))


@emits("rms_norm")
def _rms_norm(s: Sink, n: Node, i: list[str], o: list[str]) -> None:
    t = _in_type(s, n, 0)
    axes = s.ints(range(t.rank - n.attr("normalized_ndim"), t.rank))
    ms = s.node("ReduceMean", [s.node("Mul", [i[0], i[0]]), axes], keepdims=1)
    inv = s.node("Reciprocal", [s.node("Sqrt", [s.node("Add", [ms, _scalar(s, n.attr("eps"), t.dtype)])])])
    if n.attr("has_weight"):
        s.node("Mul", [s.node("Mul", [i[0], inv]), i[1]], o)
    else:
        s.node("Mul", [i[0], inv], o)


@emits("batch_norm")
def _batch_norm(s: Sink, n: Node, i: list[str], o: list[str]) -> None:
    t = _in_type(s, n, 0)
    w, b = _param_or(s, i[3:], [n.attr("has_weight"), n.attr("has_bias")], [1.0, 0.0], (t.shape[1],), t.dtype)
    s.node("BatchNormalization", [i[0], w, b, i[1], i[2]], o, epsilon=float(n.attr("eps")))


@emits("mm", "bmm")
def _mm(s: Sink, n: Node, i: list[str], o: list[str]) -> None:
    s.node("MatMul", i, o)


@emits("addmm")
def _addmm(s: Sink, n: Node, i: list[str], o: list[str]) -> None:
    s.node("Gemm", [i[1], i[2], i[0]], o, alpha=float(n.attr("alpha")), beta=float(n.attr("beta")))


@emits("linear")
def _linear(s: Sink, n: Node, i: list[str], o: list[str]) -> None:
    if _in_type(s, n, 0).rank == 2:
        s.node("Gemm", i, o, transB=1)
        return
    y = s.node("MatMul", [i[0], s.node("Transpose", [i[1]], perm=[1, 0])], None if n.attr("has_bias") else o)
    if n.attr("has_bias"):
        s.node("Add", [y, i[2]], o)


@emits("conv")
def _conv(s: Sink, n: Node, i: list[str], o: list[str]) -> None:
    a = n.attr_dict
    attrs: dict[str, Any] = {
        "strides": list(a["stride"]),
        "pads": list(a["padding"]) * 2,
        "dilations": list(a["dilation"]),
        "group": int(a["groups"]),
    }
    if a["transposed"]:
        s.node("ConvTranspose", i, o, output_padding=list(a["output_padding"]), **attrs)
    else:
        s.node("Conv", i, o, **attrs)


@emits("sdpa")
def _sdpa(s: Sink, n: Node, i: list[str], o: list[str]) -> None:
    q, k = _in_type(s, n, 0), _in_type(s, n, 1)
    dt = q.dtype
    scale = n.attr("scale")
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    perm = [*range(k.rank - 2), k.rank - 1, k.rank - 2]
    scores = s.node(
        "Mul", [s.node("MatMul", [i[0], s.node("Transpose", [i[1]], perm=perm)]), _scalar(s, scale, dt)]
    )
    if n.attr("is_causal"):
        L, S = q.shape[-2], k.shape[-2]
        allowed = np.tril(np.ones((L, S), dtype=bool))
        scores = s.node("Where", [s.const(allowed, DType.bool), scores, _scalar(s, -math.inf, dt)])
    if n.attr("has_mask"):
        mask_t = _in_type(s, n, 3)
        if mask_t.dtype is DType.bool:
            scores = s.node("Where", [i[3], scores, _scalar(s, -math.inf, dt)])
        else:
            scores = s.node("Add", [scores, i[3]])
    s.node("MatMul", [s.node("Softmax", [scores], axis=-1), i[2]], o)


@emits("const")
def _const(s: Sink, n: Node, i: list[str], o: list[str]) -> None:
    raise AssertionError("const nodes are written by the exporter, which holds the graph's constants")


@emits("extern")
def _extern(s: Sink, n: Node, i: list[str], o: list[str]) -> None:
    text = n.attr("onnx")
    if text:
        proto = onnx.parser.parse_node(text)
        renamed_in = [i[int(x[2:])] if x else "" for x in proto.input]
        renamed_out = [o[int(x[3:])] if x else "" for x in proto.output]
        del proto.input[:]
        proto.input.extend(renamed_in)
        del proto.output[:]
        proto.output.extend(renamed_out)
        proto.name = n.name
        s.append(proto)
        return
    target = n.attr("target")
    # A fusion rule's library call: spelled out in standard ONNX ops.
    expand = EXPANSIONS.get(target)
    if expand is not None:
        expand(s, n, i, o)
        return
    # Any other ATen call from the torch frontend: ONNX has no schema for it; it is written in the ATen
    # domain (as torch.onnx's ATen fallback does) so viewers show it and the checker accepts the file.
    s.node(target.split(".")[1], i, o, domain=ATEN_DOMAIN, overload=target, reason=n.attr("reason") or "")


def emit(sink: Sink, node: Node, ins: list[str], outs: list[str]) -> None:
    fn = EMITTERS.get(node.op)
    if fn is None:
        raise ExportError(f"node {node.name!r} ({node.op}) has no ONNX form")
    fn(sink, node, ins, outs)
