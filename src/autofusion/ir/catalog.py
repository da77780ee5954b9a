"""The IR op catalogue: every op the IR knows, registered once with its fusion class and inference.

Semantics follow the ATen op of the same name unless a docstring says otherwise. Elementwise and
broadcast ops take inputs of one dtype: the frontend inserts explicit `cast` nodes (torch's type
promotion is resolved at capture time, as StableHLO and XLA do), which keeps inference trivial and
makes every conversion visible in the IR. Float math ops take float inputs only.
"""

from __future__ import annotations

import math

from autofusion.errors import ShapeInferenceError
from autofusion.ir.dtypes import DType
from autofusion.ir.ops import Attrs, FusionClass, InferFn, OpDef, all_ops, check_complete, register
from autofusion.ir.types import Shape, TensorType

E, B, I, R, A, O = (  # noqa: E741 - one-letter fusion classes keep the op table to one line per op
    FusionClass.ELEMWISE,
    FusionClass.BROADCAST,
    FusionClass.INJECTIVE,
    FusionClass.REDUCE,
    FusionClass.ANCHOR,
    FusionClass.OPAQUE,
)


def _fail(msg: str) -> ShapeInferenceError:
    return ShapeInferenceError(msg)


def broadcast_shapes(*shapes: Shape) -> Shape:
    rank = max((len(s) for s in shapes), default=0)
    out: list[int] = []
    for axis in range(rank):
        size = 1
        for s in shapes:
            d = s[axis - rank + len(s)] if axis - rank + len(s) >= 0 else 1
            if d == 1:
                continue
            if size not in (1, d):
                raise _fail(f"shapes {', '.join(map(str, shapes))} do not broadcast")
            size = d
        # A zero-size dim broadcasts with 1 only, which the loop above already enforces.
        out.append(size)
    return tuple(out)


def norm_dim(dim: int, rank: int) -> int:
    r = max(rank, 1)
    if not -r <= dim < r:
        raise _fail(f"dim {dim} out of range for rank {rank}")
    return dim % r


def _same_dtype(op: str, ts: tuple[TensorType, ...]) -> DType:
    dtypes = {t.dtype for t in ts}
    if len(dtypes) != 1:
        raise _fail(f"{op} needs inputs of one dtype, got {', '.join(sorted(d.short for d in dtypes))}")
    return ts[0].dtype


# ---- elementwise -------------------------------------------------------------------------------

FLOAT_UNARY = (
    "exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sqrt", "rsqrt", "reciprocal",
    "sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "tanh", "asinh", "acosh", "atanh",
    "sigmoid", "silu", "erf", "erfc", "erfinv", "hardsigmoid", "hardswish", "mish", "lgamma", "digamma",
)  # fmt: skip
ANY_UNARY = ("neg", "abs", "relu", "sign", "floor", "ceil", "round", "trunc", "square")
PREDICATE_UNARY = ("isnan", "isinf", "isfinite", "logical_not")
ARITH_BINARY = ("add", "sub", "mul", "div", "remainder", "fmod", "pow", "maximum", "minimum", "atan2")
COMPARE_BINARY = ("eq", "ne", "lt", "le", "gt", "ge")
LOGICAL_BINARY = ("logical_and", "logical_or", "logical_xor")
BITWISE = ("bitwise_and", "bitwise_or", "bitwise_xor")


def _unary_float(name: str) -> InferFn:
    def infer(ts: tuple[TensorType, ...], attrs: Attrs) -> tuple[TensorType, ...]:
        if not ts[0].dtype.is_float:
            raise _fail(f"{name} takes a float input, got {ts[0].dtype.short} (cast first)")
        return (ts[0].contiguous(),)

    return infer


def _unary_same(ts: tuple[TensorType, ...], attrs: Attrs) -> tuple[TensorType, ...]:
    return (ts[0].contiguous(),)


def _unary_pred(ts: tuple[TensorType, ...], attrs: Attrs) -> tuple[TensorType, ...]:
    return (TensorType(DType.bool, ts[0].shape),)


def _binary(out_bool: bool, name: str) -> InferFn:
    def infer(ts: tuple[TensorType, ...], attrs: Attrs) -> tuple[TensorType, ...]:
        dtype = _same_dtype(name, ts)
        shape = broadcast_shapes(*(t.shape for t in ts))
        return (TensorType(DType.bool if out_bool else dtype, shape),)

    return infer


for _n in FLOAT_UNARY:
    register(OpDef(_n, E, _unary_float(_n), 1, 1, doc=f"torch.{_n}, float inputs only"))
for _n in ANY_UNARY:
    register(OpDef(_n, E, _unary_same, 1, 1, doc=f"torch.{_n}"))
for _n in PREDICATE_UNARY:
    register(OpDef(_n, E, _unary_pred, 1, 1, doc=f"torch.{_n}; bool output"))
register(OpDef("bitwise_not", E, _unary_same, 1, 1, doc="~x on ints and bools"))
register(OpDef("gelu", E, _unary_float("gelu"), 1, 1, optional_attrs={"approximate": "none"}))
register(OpDef("leaky_relu", E, _unary_float("leaky_relu"), 1, 1, optional_attrs={"negative_slope": 0.01}))
register(
    OpDef("elu", E, _unary_float("elu"), 1, 1,
          optional_attrs={"alpha": 1.0, "scale": 1.0, "input_scale": 1.0})
)  # fmt: skip
register(
    OpDef("softplus", E, _unary_float("softplus"), 1, 1, optional_attrs={"beta": 1.0, "threshold": 20.0})
)
register(
    OpDef("clamp", E, _unary_same, 1, 1, optional_attrs={"min": None, "max": None},
          doc="clamp to scalar bounds; tensor bounds are lowered to maximum/minimum")
)  # fmt: skip


def _cast(ts: tuple[TensorType, ...], attrs: Attrs) -> tuple[TensorType, ...]:
    if not isinstance(attrs["dtype"], DType):
        raise _fail(f"cast dtype must be a DType, got {attrs['dtype']!r}")
    return (TensorType(attrs["dtype"], ts[0].shape),)


register(OpDef("cast", E, _cast, 1, 1, required_attrs=("dtype",), doc="convert, as Tensor.to(dtype)"))

# Commutative bit for bit. Not maximum/minimum: NaN propagates from either side, but
# torch.maximum(-0.0, 0.0) is -0.0 and torch.maximum(0.0, -0.0) is 0.0, so the order shows in the sign.
_COMMUTATIVE = ("add", "mul", "eq", "ne", *LOGICAL_BINARY, *BITWISE)

for _n in ARITH_BINARY:
    register(OpDef(_n, B, _binary(False, _n), 2, 2,
                   optional_attrs={"rounding_mode": None} if _n == "div" else {},
                   doc=f"torch.{_n} with numpy broadcasting; inputs of one dtype",
                   commutative=_n in _COMMUTATIVE))  # fmt: skip
for _n in COMPARE_BINARY + LOGICAL_BINARY:
    register(OpDef(_n, B, _binary(True, _n), 2, 2, doc=f"torch.{_n}; bool output",
                   commutative=_n in _COMMUTATIVE))  # fmt: skip
for _n in BITWISE:
    register(OpDef(_n, B, _binary(False, _n), 2, 2, doc=f"torch.{_n}; int or bool inputs", commutative=True))


def _where(ts: tuple[TensorType, ...], attrs: Attrs) -> tuple[TensorType, ...]:
    if ts[0].dtype is not DType.bool:
        raise _fail(f"where condition must be bool, got {ts[0].dtype.short}")
    dtype = _same_dtype("where", ts[1:])
    return (TensorType(dtype, broadcast_shapes(*(t.shape for t in ts))),)


register(OpDef("where", B, _where, 3, 3, doc="torch.where(cond, a, b)"))


def _lerp(ts: tuple[TensorType, ...], attrs: Attrs) -> tuple[TensorType, ...]:
    dtype = _same_dtype("lerp", ts)
    if not dtype.is_float:
        raise _fail(f"lerp takes float inputs, got {dtype.short}")
    return (TensorType(dtype, broadcast_shapes(*(t.shape for t in ts))),)


register(
    OpDef(
        "lerp",
        B,
        _lerp,
        3,
        3,
        doc="torch.lerp(start, end, weight); inputs of one "
        "float dtype (eager's two-sided formula, one fused multiply-add)",
    )
)


# ---- sources ----------------------------------------------------------------------------------


def _full(ts: tuple[TensorType, ...], attrs: Attrs) -> tuple[TensorType, ...]:
    return (TensorType(attrs["dtype"], tuple(attrs["shape"])),)


register(
    OpDef("full", B, _full, 0, 0, required_attrs=("value", "dtype"), optional_attrs={"shape": ()},
          doc="a literal broadcast to `shape`; scalars in expressions are full with shape ()")
)  # fmt: skip


def _arange(ts: tuple[TensorType, ...], attrs: Attrs) -> tuple[TensorType, ...]:
    start, end, step = attrs["start"], attrs["end"], attrs["step"]
    if step == 0:
        raise _fail("arange step must not be 0")
    if all(isinstance(v, int) and not isinstance(v, bool) for v in (start, end, step)):
        # Integer ceil division: exact for any size, and a symbolic end (`ir.symbolic`) stays symbolic.
        n = max(0, -((start - end) // step))
    else:
        n = max(0, math.ceil((end - start) / step))
    return (TensorType(attrs["dtype"], (n,)),)


register(OpDef("arange", I, _arange, 0, 0, required_attrs=("start", "end", "step", "dtype")))


def _const(ts: tuple[TensorType, ...], attrs: Attrs) -> tuple[TensorType, ...]:
    return (attrs["type"],)


register(
    OpDef("const", O, _const, 0, 0, required_attrs=("name", "type"),
          doc="a tensor constant held in Graph.constants under `name`")
)  # fmt: skip


# ---- views and other injective ops --------------------------------------------------------------


def _reshape(ts: tuple[TensorType, ...], attrs: Attrs) -> tuple[TensorType, ...]:
    shape = tuple(attrs["shape"])
    if math.prod(shape) != ts[0].numel or any(d < 0 for d in shape):
        raise _fail(f"cannot reshape {ts[0].shape} to {shape}")
    return (TensorType(ts[0].dtype, shape),)


def _permute(ts: tuple[TensorType, ...], attrs: Attrs) -> tuple[TensorType, ...]:
    dims = tuple(attrs["dims"])
    if sorted(dims) != list(range(ts[0].rank)):
        raise _fail(f"permute dims {dims} is not a permutation of rank {ts[0].rank}")
    return (TensorType(ts[0].dtype, tuple(ts[0].shape[d] for d in dims)),)


def _expand(ts: tuple[TensorType, ...], attrs: Attrs) -> tuple[TensorType, ...]:
    shape = tuple(attrs["shape"])
    src = ts[0].shape
    if len(shape) < len(src):
        raise _fail(f"cannot expand {src} to fewer dims {shape}")
    for s, d in zip(reversed(src), reversed(shape), strict=False):  # the target may have more dims
        if s != d and s != 1:
            raise _fail(f"cannot expand {src} to {shape}")
    return (TensorType(ts[0].dtype, shape),)


def _slice(ts: tuple[TensorType, ...], attrs: Attrs) -> tuple[TensorType, ...]:
    shape = list(ts[0].shape)
    dim = norm_dim(attrs["dim"], len(shape))
    start, end, step = attrs["start"], attrs["end"], attrs["step"]
    if not (0 <= start <= end <= shape[dim]) or step < 1:
        raise _fail(f"slice [{start}:{end}:{step}] is not normalised for size {shape[dim]}")
    shape[dim] = (end - start + step - 1) // step
    return (TensorType(ts[0].dtype, tuple(shape)),)


def _select(ts: tuple[TensorType, ...], attrs: Attrs) -> tuple[TensorType, ...]:
    shape = list(ts[0].shape)
    dim = norm_dim(attrs["dim"], len(shape))
    if not 0 <= attrs["index"] < shape[dim]:
        raise _fail(f"select index {attrs['index']} out of range for size {shape[dim]}")
    del shape[dim]
    return (TensorType(ts[0].dtype, tuple(shape)),)


def _concat(ts: tuple[TensorType, ...], attrs: Attrs) -> tuple[TensorType, ...]:
    dtype = _same_dtype("concat", ts)
    rank = ts[0].rank
    dim = norm_dim(attrs["dim"], rank)
    total = 0
    for t in ts:
        if t.rank != rank or any(
            a != b for i, (a, b) in enumerate(zip(t.shape, ts[0].shape, strict=True)) if i != dim
        ):
            raise _fail(f"concat inputs {[x.shape for x in ts]} differ outside dim {dim}")
        total += t.shape[dim]
    shape = list(ts[0].shape)
    shape[dim] = total
    return (TensorType(dtype, tuple(shape)),)


def _pad(ts: tuple[TensorType, ...], attrs: Attrs) -> tuple[TensorType, ...]:
    pads = tuple(attrs["pads"])  # ATen order: (last_lo, last_hi, prev_lo, prev_hi, ...)
    shape = list(ts[0].shape)
    if len(pads) % 2 or len(pads) // 2 > len(shape):
        raise _fail(f"bad pads {pads} for rank {len(shape)}")
    for i in range(len(pads) // 2):
        d = len(shape) - 1 - i
        shape[d] += pads[2 * i] + pads[2 * i + 1]
        if shape[d] < 0:
            raise _fail(f"pads {pads} make dim {d} negative")
    return (TensorType(ts[0].dtype, tuple(shape)),)


def _index_select(ts: tuple[TensorType, ...], attrs: Attrs) -> tuple[TensorType, ...]:
    x, idx = ts
    if not idx.dtype.is_int or idx.rank != 1:
        raise _fail(f"index_select index must be a 1-d int tensor, got {idx}")
    shape = list(x.shape)
    shape[norm_dim(attrs["dim"], x.rank)] = idx.shape[0]
    return (TensorType(x.dtype, tuple(shape)),)


def _gather(ts: tuple[TensorType, ...], attrs: Attrs) -> tuple[TensorType, ...]:
    x, idx = ts
    if not idx.dtype.is_int or idx.rank != x.rank:
        raise _fail(f"gather index must be an int tensor of rank {x.rank}, got {idx}")
    return (TensorType(x.dtype, idx.shape),)


def _flip(ts: tuple[TensorType, ...], attrs: Attrs) -> tuple[TensorType, ...]:
    for d in attrs["dims"]:
        norm_dim(d, ts[0].rank)
    return (ts[0].contiguous(),)


register(OpDef("reshape", I, _reshape, 1, 1, required_attrs=("shape",),
               doc="view/reshape/flatten/squeeze/unsqueeze all become reshape"))  # fmt: skip
register(OpDef("permute", I, _permute, 1, 1, required_attrs=("dims",)))
register(OpDef("expand", B, _expand, 1, 1, required_attrs=("shape",)))
register(OpDef("slice", I, _slice, 1, 1, required_attrs=("dim", "start", "end", "step"),
               doc="start/end are clamped to [0, size] and step >= 1 by the frontend"))  # fmt: skip
register(OpDef("select", I, _select, 1, 1, required_attrs=("dim", "index")))
register(OpDef("concat", I, _concat, 1, None, required_attrs=("dim",)))
register(OpDef("pad", I, _pad, 1, 1, required_attrs=("pads",), optional_attrs={"value": 0.0},
               doc="constant padding, pads in ATen order (last dim first)"))  # fmt: skip
register(OpDef("index_select", I, _index_select, 2, 2, required_attrs=("dim",)))
register(OpDef("gather", I, _gather, 2, 2, required_attrs=("dim",)))
register(OpDef("flip", I, _flip, 1, 1, required_attrs=("dims",)))


# ---- reductions -------------------------------------------------------------------------------


def _reduced_shape(t: TensorType, dims: tuple[int, ...], keepdim: bool) -> Shape:
    rank = t.rank
    norm = {norm_dim(d, rank) for d in dims} if dims else set(range(rank))
    return tuple(
        (1 if keepdim else -1) if i in norm else s
        for i, s in enumerate(t.shape)
        if not (i in norm and not keepdim)
    )


def _reduce(kind: str) -> InferFn:
    def infer(ts: tuple[TensorType, ...], attrs: Attrs) -> tuple[TensorType, ...]:
        t = ts[0]
        if kind in ("mean", "var") and not t.dtype.is_float:
            raise _fail(f"{kind} takes a float input, got {t.dtype.short}")
        shape = _reduced_shape(t, tuple(attrs["dims"]), attrs["keepdim"])
        dtype = DType.bool if kind in ("any", "all") else t.dtype
        return (TensorType(dtype, shape),)

    return infer


REDUCE_OPS = ("sum", "mean", "amax", "amin", "prod", "any", "all", "var")
# Reductions whose result the kernel language cannot form (bool results; argmax/argmin below: indices).
_NO_KERNEL = ("any", "all", "argmax", "argmin")
for _n in REDUCE_OPS:
    register(
        OpDef(_n, R, _reduce(_n), 1, 1, required_attrs=("dims",),
              optional_attrs={"keepdim": False, **({"correction": 1.0} if _n == "var" else {})},
              doc=f"torch.{_n} over `dims` (empty = all dims); output dtype = input dtype",
              kernel=_n not in _NO_KERNEL)
    )  # fmt: skip


def _argreduce(ts: tuple[TensorType, ...], attrs: Attrs) -> tuple[TensorType, ...]:
    dim = attrs["dim"]
    dims = () if dim is None else (dim,)
    return (TensorType(DType.int64, _reduced_shape(ts[0], dims, attrs["keepdim"] and dim is not None)),)


for _n in ("argmax", "argmin"):
    register(OpDef(_n, R, _argreduce, 1, 1, optional_attrs={"dim": None, "keepdim": False}, kernel=False))


def _same_as_first_float(name: str) -> InferFn:
    def infer(ts: tuple[TensorType, ...], attrs: Attrs) -> tuple[TensorType, ...]:
        if not ts[0].dtype.is_float:
            raise _fail(f"{name} takes a float input, got {ts[0].dtype.short}")
        if "dim" in attrs:
            norm_dim(attrs["dim"], ts[0].rank)
        return (ts[0].contiguous(),)

    return infer


register(OpDef("softmax", R, _same_as_first_float("softmax"), 1, 1, required_attrs=("dim",)))
register(OpDef("log_softmax", R, _same_as_first_float("log_softmax"), 1, 1, required_attrs=("dim",)))


def _norm(name: str, max_params: int) -> InferFn:
    def infer(ts: tuple[TensorType, ...], attrs: Attrs) -> tuple[TensorType, ...]:
        x = ts[0]
        nd = attrs["normalized_ndim"]
        if not x.dtype.is_float or not 1 <= nd <= x.rank:
            raise _fail(f"{name} needs a float input of rank >= {nd}, got {x}")
        expected = 1 + bool(attrs["has_weight"]) + (bool(attrs.get("has_bias")) if max_params > 1 else 0)
        if len(ts) != expected:
            raise _fail(
                f"{name} with its has_weight/has_bias attributes takes {expected} inputs, got {len(ts)}"
            )
        for p in ts[1:]:
            if p.shape != x.shape[x.rank - nd :]:
                raise _fail(f"{name} parameter shape {p.shape} != normalized shape {x.shape[x.rank - nd :]}")
        return (x.contiguous(),)

    return infer


register(
    OpDef("layer_norm", R, _norm("layer_norm", 2), 1, 3,
          required_attrs=("normalized_ndim", "eps", "has_weight", "has_bias"),
          doc="inputs (x, weight?, bias?) over the last normalized_ndim dims")
)  # fmt: skip
register(
    OpDef("rms_norm", R, _norm("rms_norm", 1), 1, 2,
          required_attrs=("normalized_ndim", "eps", "has_weight"), doc="inputs (x, weight?)")
)  # fmt: skip


def _batch_norm(ts: tuple[TensorType, ...], attrs: Attrs) -> tuple[TensorType, ...]:
    x = ts[0]
    if x.rank < 2 or not x.dtype.is_float:
        raise _fail(f"batch_norm needs a float input of rank >= 2, got {x}")
    expected = 3 + bool(attrs["has_weight"]) + bool(attrs["has_bias"])
    if len(ts) != expected:
        raise _fail(f"batch_norm takes {expected} inputs here, got {len(ts)}")
    for p in ts[1:]:
        if p.shape != (x.shape[1],):
            raise _fail(f"batch_norm parameter shape {p.shape} != ({x.shape[1]},)")
    return (x.contiguous(),)


register(
    OpDef("batch_norm", B, _batch_norm, 3, 5, required_attrs=("eps", "has_weight", "has_bias"),
          doc="inference batch norm: inputs (x, running_mean, running_var, weight?, bias?), channel dim 1")
)  # fmt: skip


# ---- anchors: library compute -----------------------------------------------------------------


def _mm(ts: tuple[TensorType, ...], attrs: Attrs) -> tuple[TensorType, ...]:
    a, b = ts
    if a.rank != 2 or b.rank != 2 or a.shape[1] != b.shape[0]:
        raise _fail(f"mm needs [m,k] x [k,n], got {a.shape} x {b.shape}")
    return (TensorType(_same_dtype("mm", ts), (a.shape[0], b.shape[1])),)


def _bmm(ts: tuple[TensorType, ...], attrs: Attrs) -> tuple[TensorType, ...]:
    a, b = ts
    if a.rank != 3 or b.rank != 3 or a.shape[0] != b.shape[0] or a.shape[2] != b.shape[1]:
        raise _fail(f"bmm needs [b,m,k] x [b,k,n], got {a.shape} x {b.shape}")
    return (TensorType(_same_dtype("bmm", ts), (a.shape[0], a.shape[1], b.shape[2])),)


def _addmm(ts: tuple[TensorType, ...], attrs: Attrs) -> tuple[TensorType, ...]:
    (out,) = _mm(ts[1:], attrs)
    broadcast_shapes(ts[0].shape, out.shape)
    _same_dtype("addmm", ts)
    return (out,)


def _linear(ts: tuple[TensorType, ...], attrs: Attrs) -> tuple[TensorType, ...]:
    x, w = ts[0], ts[1]
    if w.rank != 2 or x.rank < 1 or x.shape[-1] != w.shape[1]:
        raise _fail(f"linear needs x[..., k] and weight [n, k], got {x.shape} and {w.shape}")
    if len(ts) != 2 + bool(attrs["has_bias"]):
        raise _fail("linear input count does not match has_bias")
    _same_dtype("linear", ts)
    return (TensorType(x.dtype, (*x.shape[:-1], w.shape[0])),)


def _conv_out(size: int, k: int, s: int, p: int, d: int) -> int:
    return (size + 2 * p - d * (k - 1) - 1) // s + 1


def _conv(ts: tuple[TensorType, ...], attrs: Attrs) -> tuple[TensorType, ...]:
    x, w = ts[0], ts[1]
    nsp = x.rank - 2
    if nsp < 1 or w.rank != x.rank:
        raise _fail(f"conv needs x [N,C,...] and weight of the same rank, got {x.shape} and {w.shape}")
    stride, padding, dilation = attrs["stride"], attrs["padding"], attrs["dilation"]
    groups = attrs["groups"]
    if attrs["transposed"]:
        opad = attrs["output_padding"]
        cout = w.shape[1] * groups
        spatial = tuple(
            (x.shape[2 + i] - 1) * stride[i]
            - 2 * padding[i]
            + dilation[i] * (w.shape[2 + i] - 1)
            + opad[i]
            + 1
            for i in range(nsp)
        )
        if x.shape[1] != w.shape[0]:
            raise _fail(f"conv_transpose channels {x.shape[1]} != weight dim0 {w.shape[0]}")
    else:
        cout = w.shape[0]
        if x.shape[1] != w.shape[1] * groups:
            raise _fail(f"conv input channels {x.shape[1]} != {w.shape[1]} x groups {groups}")
        spatial = tuple(
            _conv_out(x.shape[2 + i], w.shape[2 + i], stride[i], padding[i], dilation[i]) for i in range(nsp)
        )
    if any(s < 0 for s in spatial):
        raise _fail(f"conv output would be empty/negative: {spatial}")
    if len(ts) != 2 + bool(attrs["has_bias"]):
        raise _fail("conv input count does not match has_bias")
    return (TensorType(_same_dtype("conv", ts), (x.shape[0], cout, *spatial)),)


def _sdpa(ts: tuple[TensorType, ...], attrs: Attrs) -> tuple[TensorType, ...]:
    q, k, v = ts[:3]
    if q.rank < 2 or k.shape[-1] != q.shape[-1] or k.shape[-2] != v.shape[-2]:
        raise _fail(f"sdpa shapes q{q.shape} k{k.shape} v{v.shape} do not match")
    if len(ts) != 3 + bool(attrs["has_mask"]):
        raise _fail("sdpa input count does not match has_mask")
    _same_dtype("sdpa", ts[:3])
    return (TensorType(q.dtype, (*q.shape[:-1], v.shape[-1])),)


register(OpDef("mm", A, _mm, 2, 2))
register(OpDef("bmm", A, _bmm, 2, 2))
register(OpDef("addmm", A, _addmm, 3, 3, optional_attrs={"beta": 1.0, "alpha": 1.0}))
register(OpDef("linear", A, _linear, 2, 3, required_attrs=("has_bias",), doc="x @ weight.T + bias"))
register(
    OpDef("conv", A, _conv, 2, 3,
          required_attrs=("stride", "padding", "dilation", "transposed", "output_padding", "groups",
                          "has_bias"),
          optional_attrs={"channels_last": False},
          doc="aten.convolution: inputs (x, weight, bias?); channels_last runs it on NHWC data (same values)")
)  # fmt: skip
register(
    OpDef("sdpa", A, _sdpa, 3, 4, required_attrs=("is_causal", "has_mask"), optional_attrs={"scale": None},
          doc="scaled_dot_product_attention in inference (dropout 0): inputs (q, k, v, mask?)")
)  # fmt: skip


# ---- opaque -----------------------------------------------------------------------------------


def _extern(ts: tuple[TensorType, ...], attrs: Attrs) -> tuple[TensorType, ...]:
    return tuple(attrs["out_types"])


register(
    OpDef("extern", O, _extern, 0, None, required_attrs=("target", "args", "kwargs", "out_types"),
          optional_attrs={"reason": "", "onnx": None},
          doc="an ATen op run as is; `args`/`kwargs` hold literals with Arg(i) marking tensor input i; "
              "`onnx` is the ONNX node it came from (onnx.printer text, inputs in0.., outputs out0..)")
)  # fmt: skip


check_complete()

# Named groups that passes and backends test membership against (as tinygrad's GroupOp).
UNARY = frozenset(FLOAT_UNARY + ANY_UNARY + PREDICATE_UNARY
                  + ("bitwise_not", "gelu", "leaky_relu", "elu", "softplus", "clamp", "cast"))  # fmt: skip
BINARY = frozenset(ARITH_BINARY + COMPARE_BINARY + LOGICAL_BINARY + BITWISE)
REDUCTIONS = frozenset((*REDUCE_OPS, "argmax", "argmin"))
NORMALIZATIONS = frozenset({"softmax", "log_softmax", "layer_norm", "rms_norm"})
VIEWS = frozenset({"reshape", "permute", "expand", "slice", "select"})
# From each OpDef's flags: the one source for CSE's input sorting and the rule matcher's input orders.
COMMUTATIVE = frozenset(name for name, d in all_ops().items() if d.commutative)
# Ops that never join a generated kernel: library compute (ANCHOR), OPAQUE ops, and ops without a kernel form.
KERNEL_EXCLUDED = frozenset(
    name
    for name, d in all_ops().items()
    if d.fusion in (FusionClass.ANCHOR, FusionClass.OPAQUE) or not d.kernel
)
