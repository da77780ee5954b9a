"""The ops of classic CNN exports (opsets 7-12, read after conversion to 13) -> IR.

- LRN: elementwise around a windowed sum of squares over channels; the sum is `size` shifted slices of
  the zero-padded squares (they fuse into one kernel), or for a wide window a convolution by ones.
- MaxPool / AveragePool with asymmetric pads, or pads over half the window (the ATen pools pad both
  sides alike, by at most half the window): pad explicitly
  (-inf for max, 0 for average) and pool without padding. AveragePool sums (ATen's divisor_override=1)
  and divides by the ONNX count of each window: the input elements it covers, or with
  count_include_pad=1 the elements of the padded extent. Windows ATen adds past ONNX's output size
  (ceil_mode windows that start in the right padding) are sliced off. Other pads decline: the ATen
  pool extern takes them whole (fallback.py).
- Dropout (inference): the output is the input; the mask, where read, is all true.
- Resize with asymmetric coordinates (x_in = x_out / scale, what Upsample computed; the loader writes
  opset 7-9 Upsample as this Resize): nearest and linear as per-axis index_select of constant indices,
  linear blending the two neighbours with constant weights. Other coordinate modes decline to the
  Resize extern.
"""

from __future__ import annotations

import math

import numpy as np

from autofusion.errors import FrontendError
from autofusion.frontend.onnx.context import OnnxCtx, Val, array_type, onnx_op, unsupported
from autofusion.frontend.onnx.converters.nn import conv_padding
from autofusion.frontend.torch.context import TV
from autofusion.ir.dtypes import DType
from autofusion.ir.graph import Arg
from autofusion.ir.types import TensorType

# LRN windows up to this many channels are summed as shifted slices (one fused kernel); wider ones
# would make a long expression and run as a convolution by ones instead.
_LRN_MAX_SLICES = 16


def _constant(ctx: OnnxCtx, arr: np.ndarray, name: str) -> TV:
    """A value known at import as an IR value (a literal when uniform, else a const node)."""
    return ctx._materialise(Val(array_type(arr), const=arr), f"{ctx.name}_{name}")


def _aten_pads(lo: list[int], hi: list[int]) -> tuple[int, ...]:
    """Per-spatial-dim pads (dims 2..) as ATen's pad list: last dim first."""
    out: list[int] = []
    for d in reversed(range(len(lo))):
        out += [lo[d], hi[d]]
    return tuple(out)


def _compute_dtype(dt: DType) -> DType:
    # Half inputs are computed in fp32 (as ATen's CPU kernels do) and rounded once at the end.
    return DType.float32 if dt.is_half else dt


# -- LRN ------------------------------------------------------------------------------------------
@onnx_op("LRN")
def _lrn(ctx: OnnxCtx) -> TV:
    x = ctx.tensor(0)
    if not x.dtype.is_float:
        raise unsupported(f"LRN of {x.dtype.short}")
    if x.rank < 2:
        raise unsupported(f"LRN of a rank-{x.rank} tensor (it needs N x C x ...)")
    size = int(ctx.attr("size"))
    if size < 1:
        raise unsupported(f"LRN size {size}")
    alpha, beta = float(ctx.attr("alpha", 1e-4)), float(ctx.attr("beta", 0.75))
    bias = float(ctx.attr("bias", 1.0))
    cd = _compute_dtype(x.dtype)
    xc = ctx.cast(x, cd)
    sq = ctx.add("mul", (xc, xc))
    # Channel c sums squares over [c - floor((size-1)/2), c + ceil((size-1)/2)], clipped to [0, C).
    lo = (size - 1) // 2
    hi = size - 1 - lo
    c = x.shape[1]
    padded = ctx.add("pad", (sq,), {"pads": (0, 0) * (x.rank - 2) + (lo, hi), "value": 0.0})
    if size <= _LRN_MAX_SLICES:
        total = None
        for k in range(size):
            part = ctx.add("slice", (padded,), {"dim": 1, "start": k, "end": k + c, "step": 1})
            total = part if total is None else ctx.add("add", (total, part))
        assert total is not None
    else:
        rest = math.prod(x.shape[2:])
        flat = ctx.reshape(padded, (x.shape[0], 1, c + size - 1, rest))
        ones = _constant(ctx, np.ones((1, 1, size, 1), dtype=np.float32), "lrn_window")
        conv = ctx.add(
            "conv",
            (flat, ctx.cast(ones, cd)),
            {
                "stride": (1, 1),
                "padding": (0, 0),
                "dilation": (1, 1),
                "transposed": False,
                "output_padding": (0, 0),
                "groups": 1,
                "has_bias": False,
            },
        )
        total = ctx.reshape(conv, x.shape)
    scaled = ctx.add("mul", (total, ctx.scalar(alpha / size, cd)))
    base = ctx.add("add", (scaled, ctx.scalar(bias, cd)))
    denom = ctx.add("pow", (base, ctx.scalar(beta, cd)))
    return ctx.cast(ctx.add("div", (xc, denom)), x.dtype)


# -- pooling with asymmetric pads ---------------------------------------------------------------------
def _pool_out(size: int, lo: int, hi: int, k: int, s: int, d: int, ceil: bool, onnx: bool) -> int:
    """Output length of one spatial dim. ONNX (and ATen) drop a ceil_mode window that starts past the
    input and its left pad; ATen, pooling an input padded beforehand, only one past the padded end."""
    span = size + lo + hi - ((k - 1) * d + 1)
    out = (-(-span // s) if ceil else span // s) + 1
    limit = size + lo if onnx else size + lo + hi
    if ceil and (out - 1) * s >= limit:
        out -= 1
    return out


def _pool_counts(
    spatial: tuple[int, ...],
    out: list[int],
    kernel: list[int],
    strides: list[int],
    lo: list[int],
    hi: list[int],
    include_pad: bool,
) -> np.ndarray:
    """The divisor of every AveragePool window, shape `out`: input elements it covers, or elements of
    the padded extent [-lo, size + hi) with count_include_pad (windows may run past that in ceil_mode)."""
    counts = np.ones((), dtype=np.float64)
    for size, o, k, s, a, b in zip(spatial, out, kernel, strides, lo, hi, strict=True):
        start = np.arange(o) * s - a
        first, last = (-a, size + b) if include_pad else (0, size)
        n = np.minimum(start + k, last) - np.maximum(start, first)
        counts = np.multiply.outer(counts, np.maximum(n, 0).astype(np.float64))
    return counts


def _extern(
    ctx: OnnxCtx, target: str, inputs: list[TV], args: tuple[object, ...], out: tuple[int, ...]
) -> TV:
    dtype = inputs[0].dtype
    (vid,) = ctx.b.add_node(
        "extern",
        [t.id for t in inputs],
        {
            "target": target,
            "args": args,
            "kwargs": (),
            "out_types": (TensorType(dtype, out),),
            "reason": "pads ATen's pools do not take: padded in IR, pooled by ATen",
        },
        name=ctx.name,
        loc=ctx.loc,
    )
    return TV(vid, ctx.b.type_of(vid))


@onnx_op("MaxPool", "AveragePool")
def _pool_asymmetric(ctx: OnnxCtx) -> TV:
    x = ctx.tensor(0)
    n = x.rank - 2
    if n not in (1, 2, 3):
        raise unsupported(f"pooling over {n} spatial dims")
    is_max = ctx.node.op_type == "MaxPool"
    kernel = [int(k) for k in ctx.attr("kernel_shape")]
    strides = [int(s) for s in ctx.attr("strides", [1] * n)]
    dil = [int(d) for d in ctx.attr("dilations", [1] * n)]
    if is_max and len(ctx.node.output) > 1 and ctx.node.output[1]:
        raise unsupported("MaxPool's Indices output is read")
    if not is_max and any(d != 1 for d in dil):
        raise unsupported("AveragePool with dilations")
    if not x.dtype.is_float and not is_max:
        raise unsupported(f"AveragePool of {x.dtype.short}")
    lo, hi = conv_padding(ctx, x.shape[2:], tuple(kernel), strides, dil)
    if lo == hi and all(p <= ((k - 1) * d + 1) // 2 for p, k, d in zip(lo, kernel, dil, strict=True)):
        raise unsupported("symmetric pads: the ATen pool takes them as they are")
    ceil = bool(int(ctx.attr("ceil_mode", 0)))
    cd = _compute_dtype(x.dtype)
    spatial = x.shape[2:]
    want = [
        _pool_out(sz, a, b, k, s, d, ceil, onnx=True)
        for sz, a, b, k, s, d in zip(spatial, lo, hi, kernel, strides, dil, strict=True)
    ]
    expected = ctx.out_type(0)
    if expected is not None and list(expected.shape[2:]) != want:
        # Final: no fallback may run it either, since every shape downstream would differ from what
        # onnxruntime and onnx.reference compute.
        raise FrontendError(
            f"{ctx.loc}: ONNX shape inference gives {expected.shape}, onnxruntime's window count is {want} "
            "(a ceil_mode window that starts in the right pad, which onnxruntime drops)"
        )
    got = [
        _pool_out(sz, a, b, k, s, d, ceil, onnx=False)
        for sz, a, b, k, s, d in zip(spatial, lo, hi, kernel, strides, dil, strict=True)
    ]
    if is_max:
        fill = float("-inf") if x.dtype.is_float else int(np.iinfo(x.dtype.name).min)
        padded = ctx.add("pad", (x,), {"pads": _aten_pads(lo, hi), "value": fill})
        pooled = _extern(
            ctx,
            f"aten.max_pool{n}d.default",
            [padded],
            (Arg(0), tuple(kernel), tuple(strides), (0,) * n, tuple(dil), ceil),
            x.shape[:2] + tuple(got),
        )
    else:
        padded = ctx.add("pad", (ctx.cast(x, cd),), {"pads": _aten_pads(lo, hi), "value": 0.0})
        k2, s2, o2 = kernel, strides, got
        if n == 1:  # avg_pool1d has no divisor_override: pool (N, C, 1, L) instead
            padded = ctx.reshape(padded, (*x.shape[:2], 1, padded.shape[2]))
            k2, s2, o2 = [1, *kernel], [1, *strides], [1, *got]
        sums = _extern(
            ctx,
            f"aten.avg_pool{max(n, 2)}d.default",
            [padded],
            (Arg(0), tuple(k2), tuple(s2), (0,) * len(k2), ceil, True, 1),
            x.shape[:2] + tuple(o2),
        )
        pooled = ctx.reshape(sums, x.shape[:2] + tuple(got))
    for d, (g, w) in enumerate(zip(got, want, strict=True)):
        if g != w:
            pooled = ctx.add("slice", (pooled,), {"dim": 2 + d, "start": 0, "end": w, "step": 1})
    if is_max:
        return pooled
    counts = _pool_counts(spatial, want, kernel, strides, lo, hi, bool(int(ctx.attr("count_include_pad", 0))))
    divisor = _constant(ctx, counts.astype(np.float32).reshape((1, 1, *want)), "pool_counts")
    out = ctx.add("div", (ctx.cast(pooled, cd), ctx.cast(divisor, cd)))
    return ctx.cast(out, x.dtype)


# -- Dropout ------------------------------------------------------------------------------------------
@onnx_op("Dropout")
def _dropout(ctx: OnnxCtx) -> tuple[TV, TV | None]:
    if ctx.has(2):
        mode = ctx.const(2)
        if mode is None:
            raise unsupported("Dropout's training_mode is computed at run time")
        if bool(np.asarray(mode).reshape(-1)[0]):
            raise unsupported("Dropout with training_mode=true is random")
    x = ctx.tensor(0)
    if len(ctx.node.output) < 2 or not ctx.node.output[1]:
        return x, None
    # Inference keeps every element: the mask is all true (bool since opset 10; the input's type before).
    t = ctx.out_type(1)
    dtype = t.dtype if t is not None else DType.bool
    value: bool | float = True if dtype is DType.bool else 1.0
    return x, ctx.add("full", (), {"value": value, "dtype": dtype, "shape": x.shape})


# -- Resize, asymmetric coordinates ---------------------------------------------------------------------
def _resize_plan(ctx: OnnxCtx, shape: tuple[int, ...]) -> tuple[list[int], list[float]]:
    """Output sizes and per-axis scales, from the sizes or the scales input."""
    sizes = ctx.ints(3, "sizes") if ctx.has(3) else None
    if sizes is not None:
        if len(sizes) != len(shape):
            raise unsupported("Resize sizes of another rank than the input")
        return sizes, [o / i if i else 1.0 for o, i in zip(sizes, shape, strict=True)]
    c = ctx.const(2) if ctx.has(2) else None
    if c is None:
        raise unsupported("Resize needs its scales or sizes known at import")
    scales = [float(s) for s in np.asarray(c).reshape(-1)]
    if len(scales) != len(shape):
        raise unsupported("Resize scales of another rank than the input")
    return [math.floor(i * s) for i, s in zip(shape, scales, strict=True)], scales


def _nearest(x_in: np.ndarray, mode: str) -> np.ndarray:
    if mode == "floor":
        return np.floor(x_in)
    if mode == "ceil":
        return np.ceil(x_in)
    frac = x_in - np.floor(x_in)
    up = frac > 0.5 if mode == "round_prefer_floor" else frac >= 0.5
    return np.where(up, np.floor(x_in) + 1, np.floor(x_in))


def resize_asymmetric(ctx: OnnxCtx) -> TV:
    """Resize with asymmetric coordinates as index selects (and weights, for linear) that fuse; the
    Resize converter (`externs/resize.py`) tries it after the whole-factor repeat."""
    coord = ctx.attr("coordinate_transformation_mode", "half_pixel")
    mode = ctx.attr("mode", "nearest")
    if coord != "asymmetric":
        raise unsupported(f"Resize with {coord} coordinates (this converter reads asymmetric ones)")
    if mode not in ("nearest", "linear"):
        raise unsupported(f"Resize mode {mode!r}")
    if (
        ctx.has_attr("axes")
        or int(ctx.attr("antialias", 0))
        or ctx.attr("keep_aspect_ratio_policy", "stretch") != "stretch"
    ):
        raise unsupported("Resize with axes, antialias or keep_aspect_ratio_policy")
    x = ctx.tensor(0)
    if mode == "linear" and not x.dtype.is_float:
        raise unsupported(f"linear Resize of {x.dtype.short}")
    sizes, scales = _resize_plan(ctx, x.shape)
    nearest_mode = ctx.attr("nearest_mode", "round_prefer_floor")
    if nearest_mode not in ("floor", "ceil", "round_prefer_floor", "round_prefer_ceil"):
        raise unsupported(f"nearest_mode {nearest_mode!r}")
    cd = _compute_dtype(x.dtype) if mode == "linear" else x.dtype
    out = ctx.cast(x, cd)
    for d, (size, o, s) in enumerate(zip(x.shape, sizes, scales, strict=True)):
        if o == size and s == 1.0:
            continue
        if size == 0 or o == 0 or s <= 0:
            raise unsupported(f"Resize of dim {d} from {size} to {o} (scale {s})")
        x_in = np.arange(o, dtype=np.float64) / s
        if mode == "nearest":
            idx = np.clip(_nearest(x_in, nearest_mode), 0, size - 1).astype(np.int64)
            out = ctx.add("index_select", (out, _constant(ctx, idx, f"resize_idx{d}")), {"dim": d})
            continue
        x_in = np.clip(x_in, 0, size - 1)
        i0 = np.floor(x_in).astype(np.int64)
        i1 = np.minimum(i0 + 1, size - 1)
        w = (x_in - i0).astype(np.float32)
        a = ctx.add("index_select", (out, _constant(ctx, i0, f"resize_lo{d}")), {"dim": d})
        if not np.any(w):
            out = a
            continue
        b = ctx.add("index_select", (out, _constant(ctx, i1, f"resize_hi{d}")), {"dim": d})
        wshape = [1] * x.rank
        wshape[d] = o
        wt = ctx.cast(_constant(ctx, w.reshape(wshape), f"resize_w{d}"), cd)
        out = ctx.add("add", (a, ctx.add("mul", (ctx.add("sub", (b, a)), wt))))
    return ctx.cast(out, x.dtype)
