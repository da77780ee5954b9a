"""ONNX normalisations beyond nn.py's: RMSNormalization, LayerNormalization with its Mean/InvStdDev
outputs read, GroupNormalization, MeanVarianceNormalization and LpNormalization.

Where the IR has the op (rms_norm, layer_norm) it is used; otherwise the normalisation is spelled as
reductions and elementwise ops (mean, sub, mul, rsqrt), which the planner fuses into reduce kernels.
Statistics are computed in float32 (the spec's stash_type=1) for half inputs.
"""

from __future__ import annotations

import math

from autofusion.frontend.onnx.context import OnnxCtx, dtype_of, norm_axis, onnx_op, unsupported
from autofusion.frontend.torch.context import TV
from autofusion.ir.dtypes import DType


def _stash(ctx: OnnxCtx, x: TV) -> DType:
    """The dtype statistics are computed in: stash_type (float32 by default), never narrower than x."""
    st = int(ctx.attr("stash_type", 1))
    dt = dtype_of(st, f"stash_type of node {ctx.name!r}")
    if not dt.is_float:
        raise unsupported(f"stash_type {dt.short}")
    return dt if dt.itemsize >= x.dtype.itemsize else x.dtype


def _apply_affine(ctx: OnnxCtx, y: TV, scale: TV | None, bias: TV | None) -> TV:
    if scale is not None:
        y = ctx.add("mul", (y, ctx.cast(scale, y.dtype)))
    if bias is not None:
        y = ctx.add("add", (y, ctx.cast(bias, y.dtype)))
    return y


@onnx_op("RMSNormalization")
def _rms_norm(ctx: OnnxCtx) -> TV:
    x = ctx.tensor(0)
    if not x.dtype.is_float:
        raise unsupported(f"RMSNormalization of {x.dtype.short}")
    axis = norm_axis(int(ctx.attr("axis", -1)), x.rank)
    eps = float(ctx.attr("epsilon", 1e-5))
    scale = ctx.tensor(1)
    st = _stash(ctx, x)
    nd = x.rank - axis
    if st is x.dtype or x.dtype.is_half:
        # the IR op computes half inputs in fp32 already (the stash type); a full-shape scale goes in
        full = scale.shape == x.shape[axis:] and scale.dtype is x.dtype
        attrs = {"normalized_ndim": nd, "eps": eps, "has_weight": full}
        y = ctx.add("rms_norm", (x, scale) if full else (x,), attrs)
        return y if full else _apply_affine(ctx, y, scale, None)
    xs = ctx.cast(x, st)
    ms = ctx.add("mean", (ctx.add("mul", (xs, xs)),), {"dims": tuple(range(axis, x.rank)), "keepdim": True})
    inv = ctx.add("rsqrt", (ctx.add("add", (ms, ctx.scalar(eps, st))),))
    y = ctx.cast(ctx.add("mul", (xs, inv)), x.dtype)
    return _apply_affine(ctx, y, scale, None)


def layer_norm_with_stats(ctx: OnnxCtx) -> tuple[TV, TV | None, TV | None]:
    """LayerNormalization when Mean or InvStdDev is read: the statistics as reductions over the
    normalised dims (kept as size 1), in the stash type; Y = (x - mean) * inv_std * scale + bias."""
    x = ctx.tensor(0)
    if not x.dtype.is_float:
        raise unsupported(f"LayerNormalization of {x.dtype.short}")
    axis = norm_axis(int(ctx.attr("axis", -1)), x.rank)
    eps = float(ctx.attr("epsilon", 1e-5))
    st = _stash(ctx, x)
    dims = tuple(range(axis, x.rank))
    xs = ctx.cast(x, st)
    mean = ctx.add("mean", (xs,), {"dims": dims, "keepdim": True})
    d = ctx.add("sub", (xs, mean))
    var = ctx.add("mean", (ctx.add("mul", (d, d)),), {"dims": dims, "keepdim": True})
    inv = ctx.add("rsqrt", (ctx.add("add", (var, ctx.scalar(eps, st))),))
    y = ctx.cast(ctx.add("mul", (d, inv)), x.dtype)
    y = _apply_affine(ctx, y, ctx.tensor(1), ctx.tensor(2) if ctx.has(2) else None)
    outs: list[TV | None] = [y]
    for k, t in ((1, mean), (2, inv)):
        want = ctx.out_type(k)
        read = len(ctx.node.output) > k and bool(ctx.node.output[k])
        outs.append(ctx.cast(t, want.dtype if want is not None else st) if read else None)
    return outs[0], outs[1], outs[2]  # type: ignore[return-value]


@onnx_op("GroupNormalization")
def _group_norm(ctx: OnnxCtx) -> TV:
    x = ctx.tensor(0)
    if not x.dtype.is_float or x.rank < 2:
        raise unsupported(f"GroupNormalization of {x}")
    groups = int(ctx.attr("num_groups"))
    eps = float(ctx.attr("epsilon", 1e-5))
    n, c = x.shape[0], x.shape[1]
    if groups <= 0 or c % groups:
        raise unsupported(f"GroupNormalization of {c} channels in {groups} groups")
    scale, bias = ctx.tensor(1), ctx.tensor(2)
    # Opset 18 took scale and bias per group; 21 per channel. Per group: repeat each over its channels.
    if ctx.opset < 21 and scale.shape == (groups,) and groups != c:
        scale, bias = (
            ctx.reshape(
                ctx.add("expand", (ctx.reshape(p, (groups, 1)),), {"shape": (groups, c // groups)}), (c,)
            )
            for p in (scale, bias)
        )
    st = _stash(ctx, x)
    rest = math.prod(x.shape[2:])
    grouped = ctx.reshape(ctx.cast(x, st), (n, groups, (c // groups) * rest))
    normed = ctx.add(
        "layer_norm", (grouped,), {"normalized_ndim": 1, "eps": eps, "has_weight": False, "has_bias": False}
    )
    y = ctx.cast(ctx.reshape(normed, x.shape), x.dtype)
    per_channel = (1, c) + (1,) * (x.rank - 2)
    return _apply_affine(ctx, y, ctx.reshape(scale, per_channel), ctx.reshape(bias, per_channel))


@onnx_op("MeanVarianceNormalization")
def _mvn(ctx: OnnxCtx) -> TV:
    # (x - mean) / sqrt(var + 1e-9) over `axes` (default N, H, W), as the spec's function body does
    x = ctx.tensor(0)
    if not x.dtype.is_float:
        raise unsupported(f"MeanVarianceNormalization of {x.dtype.short}")
    axes = tuple(sorted({norm_axis(int(a), x.rank) for a in ctx.attr("axes", [0, 2, 3])}))
    mean = ctx.add("mean", (x,), {"dims": axes, "keepdim": True})
    d = ctx.add("sub", (x, mean))
    var = ctx.add("mean", (ctx.add("mul", (d, d)),), {"dims": axes, "keepdim": True})
    std = ctx.add("sqrt", (ctx.add("add", (var, ctx.scalar(1e-9, x.dtype))),))
    return ctx.add("div", (d, std))


@onnx_op("LpNormalization")
def _lp_norm(ctx: OnnxCtx) -> TV:
    x = ctx.tensor(0)
    if not x.dtype.is_float:
        raise unsupported(f"LpNormalization of {x.dtype.short}")
    axis = norm_axis(int(ctx.attr("axis", -1)), x.rank)
    p = int(ctx.attr("p", 2))
    if p not in (1, 2):
        raise unsupported(f"LpNormalization with p={p} (the spec allows 1 and 2)")
    mag = ctx.add("abs", (x,)) if p == 1 else ctx.add("mul", (x, x))
    norm = ctx.add("sum", (mag,), {"dims": (axis,), "keepdim": True})
    if p == 2:
        norm = ctx.add("sqrt", (norm,))
    zero = ctx.scalar(0, x.dtype)
    # a zero norm gives 0, not NaN (the reference's where(norm == 0, 0, x / norm))
    return ctx.add("where", (ctx.add("eq", (norm, zero)), zero, ctx.add("div", (x, norm))))


def softmax(ctx: OnnxCtx, x: TV, dim: int) -> TV:
    """ONNX Softmax over `dim`. Half inputs follow the spec's function body op by op (ReduceMax, Sub,
    Exp, ReduceSum, Div, each result rounded to the half type, as onnxruntime and the reference do):
    the fused fp32 softmax differs from that by an ulp in places, more than fp16 cases' tolerance."""
    if not x.dtype.is_half:
        return ctx.add("softmax", (x,), {"dim": dim})
    m = ctx.add("amax", (x,), {"dims": (dim,), "keepdim": True})
    e = ctx.add("exp", (ctx.add("sub", (x, m)),))
    return ctx.add("div", (e, ctx.add("sum", (e,), {"dims": (dim,), "keepdim": True})))
