"""ONNX library compute and normalisations -> IR: Conv, Gemm, MatMul, BatchNormalization, LayerNormalization,
Softmax/LogSoftmax and GlobalAverage/MaxPool. MaxPool, AveragePool and LpPool have no IR op and run as
torch externs (see externs/pool.py)."""

from __future__ import annotations

import math

import numpy as np

from autofusion.frontend.onnx.context import OnnxCtx, norm_axis, onnx_op, unsupported
from autofusion.frontend.onnx.converters.conv_matvec import pointwise_matvec
from autofusion.frontend.onnx.converters.matmul_weight import weight_linear
from autofusion.frontend.onnx.converters.norms import layer_norm_with_stats, softmax
from autofusion.frontend.torch.context import TV
from autofusion.ir.catalog import broadcast_shapes


def conv_padding(
    ctx: OnnxCtx, spatial: tuple[int, ...], kernel: tuple[int, ...], strides: list[int], dilations: list[int]
) -> tuple[list[int], list[int]]:
    """(pads at the start, pads at the end) per spatial dim, from `pads` or `auto_pad`."""
    n = len(spatial)
    auto = ctx.attr("auto_pad", "NOTSET")
    if auto in ("NOTSET", "VALID"):
        pads = [int(p) for p in ctx.attr("pads", [0] * (2 * n))] if auto == "NOTSET" else [0] * (2 * n)
        return pads[:n], pads[n:]
    if auto not in ("SAME_UPPER", "SAME_LOWER"):
        raise unsupported(f"auto_pad={auto!r}")
    lo, hi = [], []
    for size, k, s, d in zip(spatial, kernel, strides, dilations, strict=False):
        out = -(-size // s)
        total = max(0, (out - 1) * s + (k - 1) * d + 1 - size)
        small, big = total // 2, total - total // 2
        lo.append(big if auto == "SAME_LOWER" else small)
        hi.append(small if auto == "SAME_LOWER" else big)
    return lo, hi


@onnx_op("Conv")
def _conv(ctx: OnnxCtx) -> TV:
    x, w = ctx.tensor(0), ctx.tensor(1)
    # An all-zero bias (a freshly initialised model's) is left out: as a uniform value it would be a
    # `full` made anew each call, so the library's fold cache, keyed by its tensors' identity, would
    # miss and re-pack the weight on every call.
    bias = ctx.const(2) if ctx.has(2) else None
    zero_bias = bias is not None and not np.any(bias)
    b = ctx.tensor(2) if ctx.has(2) and not zero_bias else None
    n = w.rank - 2
    if n < 1 or x.rank != w.rank:
        raise unsupported(f"Conv of input {x.shape} with weight {w.shape}")
    strides = [int(s) for s in ctx.attr("strides", [1] * n)]
    dilations = [int(d) for d in ctx.attr("dilations", [1] * n)]
    lo, hi = conv_padding(ctx, x.shape[2:], w.shape[2:], strides, dilations)
    groups = int(ctx.attr("group", 1))
    small = pointwise_matvec(ctx, x, w, b, lo, hi, groups)  # squeeze-excite's 1x1 convs (conv_matvec.py)
    if small is not None:
        return small
    if lo != hi:
        # Asymmetric padding (SAME with an even kernel): pad first, then a convolution without padding.
        aten: list[int] = []
        for d in reversed(range(n)):
            aten += [lo[d], hi[d]]
        x = ctx.add("pad", (x,), {"pads": tuple(aten), "value": 0.0})
        lo = [0] * n
    attrs = {
        "stride": tuple(strides),
        "padding": tuple(lo),
        "dilation": tuple(dilations),
        "transposed": False,
        "output_padding": (0,) * n,
        "groups": groups,
        "has_bias": b is not None,
    }
    return ctx.add("conv", (x, w) if b is None else (x, w, b), attrs)


@onnx_op("ConvTranspose")
def _conv_transpose(ctx: OnnxCtx) -> TV:
    x, w = ctx.tensor(0), ctx.tensor(1)
    b = ctx.tensor(2) if ctx.has(2) else None
    n = w.rank - 2
    if ctx.has_attr("output_shape") or ctx.attr("auto_pad", "NOTSET") != "NOTSET":
        raise unsupported("ConvTranspose with output_shape or auto_pad")
    pads = [int(p) for p in ctx.attr("pads", [0] * (2 * n))]
    if pads[:n] != pads[n:]:
        raise unsupported("ConvTranspose with asymmetric pads")
    attrs = {
        "stride": tuple(int(s) for s in ctx.attr("strides", [1] * n)),
        "padding": tuple(pads[:n]),
        "dilation": tuple(int(d) for d in ctx.attr("dilations", [1] * n)),
        "transposed": True,
        "output_padding": tuple(int(p) for p in ctx.attr("output_padding", [0] * n)),
        "groups": int(ctx.attr("group", 1)),
        "has_bias": b is not None,
    }
    return ctx.add("conv", (x, w) if b is None else (x, w, b), attrs)


@onnx_op("BatchNormalization")
def _batch_norm(ctx: OnnxCtx) -> TV:
    if int(ctx.attr("training_mode", 0)):
        raise unsupported(
            "BatchNormalization with training_mode=1 updates statistics; export the model in eval mode"
        )
    if any(o for o in ctx.node.output[1:]):
        raise unsupported("BatchNormalization's running-statistics outputs are read")
    x, scale, bias, mean, var = (ctx.tensor(i) for i in range(5))
    stats = [ctx.cast(t, x.dtype) for t in (mean, var, scale, bias)]
    return ctx.add(
        "batch_norm",
        (x, *stats),
        {"eps": float(ctx.attr("epsilon", 1e-5)), "has_weight": True, "has_bias": True},
    )


@onnx_op("LayerNormalization")
def _layer_norm(ctx: OnnxCtx) -> TV | tuple[TV, TV | None, TV | None]:
    if any(o for o in ctx.node.output[1:]):
        return layer_norm_with_stats(ctx)
    x = ctx.tensor(0)
    axis = norm_axis(int(ctx.attr("axis", -1)), x.rank)
    nd = x.rank - axis
    norm_shape = x.shape[axis:]
    params = [ctx.tensor(1)] + ([ctx.tensor(2)] if ctx.has(2) else [])
    if all(p.shape == norm_shape and p.dtype is x.dtype for p in params):
        return ctx.add(
            "layer_norm",
            (x, *params),
            {
                "normalized_ndim": nd,
                "eps": float(ctx.attr("epsilon", 1e-5)),
                "has_weight": True,
                "has_bias": len(params) == 2,
            },
        )
    # Broadcastable (not full-shape) scale or bias: normalise, then apply them with broadcasting.
    out = ctx.add(
        "layer_norm",
        (x,),
        {
            "normalized_ndim": nd,
            "eps": float(ctx.attr("epsilon", 1e-5)),
            "has_weight": False,
            "has_bias": False,
        },
    )
    out = ctx.add("mul", (out, ctx.cast(params[0], x.dtype)))
    if len(params) == 2:
        out = ctx.add("add", (out, ctx.cast(params[1], x.dtype)))
    return out


@onnx_op("Softmax", "LogSoftmax")
def _softmax(ctx: OnnxCtx) -> TV:
    x = ctx.tensor(0)
    dim = norm_axis(int(ctx.attr("axis", -1)), x.rank)
    if ctx.node.op_type == "Softmax":
        return softmax(ctx, x, dim)
    return ctx.add("log_softmax", (x,), {"dim": dim})


@onnx_op("GlobalAveragePool", "GlobalMaxPool")
def _global_pool(ctx: OnnxCtx) -> TV:
    x = ctx.tensor(0)
    op = "mean" if ctx.node.op_type == "GlobalAveragePool" else "amax"
    return ctx.add(op, (x,), {"dims": tuple(range(2, x.rank)), "keepdim": True})


def matmul(ctx: OnnxCtx, x: TV, y: TV) -> TV:
    """numpy.matmul semantics (ONNX MatMul), as mm or bmm plus views."""
    if x.rank == 0 or y.rank == 0:
        raise unsupported("MatMul of a 0-d tensor")
    xs = x if x.rank > 1 else ctx.reshape(x, (1, x.shape[0]))
    ys = y if y.rank > 1 else ctx.reshape(y, (y.shape[0], 1))
    (m, k), (k2, n) = xs.shape[-2:], ys.shape[-2:]
    if k != k2:
        raise unsupported(f"MatMul of {x.shape} and {y.shape}")
    batch = broadcast_shapes(xs.shape[:-2], ys.shape[:-2])
    out_shape = batch + ((m,) if x.rank > 1 else ()) + ((n,) if y.rank > 1 else ())
    if ys.rank == 2:
        rows = math.prod(xs.shape[:-1])
        out = ctx.add("mm", (ctx.reshape(xs, (rows, k)), ys))
        return ctx.reshape(out, out_shape)
    nb = math.prod(batch)
    xe = (
        xs
        if xs.shape[:-2] == batch
        else ctx.add(
            "expand",
            (ctx.reshape(xs, (1,) * (len(batch) + 2 - xs.rank) + xs.shape),),
            {"shape": (*batch, m, k)},
        )
    )
    ye = (
        ys
        if ys.shape[:-2] == batch
        else ctx.add(
            "expand",
            (ctx.reshape(ys, (1,) * (len(batch) + 2 - ys.rank) + ys.shape),),
            {"shape": (*batch, k, n)},
        )
    )
    out = ctx.add("bmm", (ctx.reshape(xe, (nb, m, k)), ctx.reshape(ye, (nb, k, n))))
    return ctx.reshape(out, out_shape)


@onnx_op("MatMul")
def _matmul(ctx: OnnxCtx) -> TV:
    x, y = ctx.tensor(0), ctx.tensor(1)
    by_weight = weight_linear(ctx, x, y)  # an N-d activation by an initializer (matmul_weight.py)
    return by_weight if by_weight is not None else matmul(ctx, x, y)


@onnx_op("Gemm")
def _gemm(ctx: OnnxCtx) -> TV:
    a, b = ctx.tensor(0), ctx.tensor(1)
    c = ctx.tensor(2) if ctx.has(2) else None
    alpha, beta = float(ctx.attr("alpha", 1.0)), float(ctx.attr("beta", 1.0))
    ta, tb = int(ctx.attr("transA", 0)), int(ctx.attr("transB", 0))
    if a.rank != 2 or b.rank != 2:
        raise unsupported(f"Gemm of {a.shape} and {b.shape}")
    if ta:
        a = ctx.permute(a, (1, 0))
    if tb and alpha == 1.0 and (c is None or (beta == 1.0 and c.rank == 1 and c.shape[0] == b.shape[0])):
        # x @ W.T + bias with W as stored: a linear layer, the form library GEMMs take directly.
        return ctx.add("linear", (a, b) if c is None else (a, b, c), {"has_bias": c is not None})
    if tb:
        b = ctx.permute(b, (1, 0))
    if c is not None and c.dtype is a.dtype:
        return ctx.add("addmm", (c, a, b), {"alpha": alpha, "beta": beta})
    out = ctx.add("mm", (a, b))
    if alpha != 1.0:
        out = ctx.add("mul", (out, ctx.scalar(alpha, out.dtype)))
    if c is not None:
        cc = ctx.cast(c, out.dtype)
        if beta != 1.0:
            cc = ctx.add("mul", (cc, ctx.scalar(beta, out.dtype)))
        out = ctx.add("add", (out, cc))
    return out
