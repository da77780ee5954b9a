"""ONNX TopK, ReverseSequence, Col2Im, ConvTranspose with output_shape / auto_pad / asymmetric pads,
DeformConv and MaxUnpool as torch externs; Unique is refused with its reason."""

from __future__ import annotations

import functools
import math
from typing import Any

import torch
import torch.nn.functional as F

from autofusion.frontend.onnx.context import OnnxCtx, norm_axis, unsupported
from autofusion.frontend.onnx.externs.composite import composite, compute_dtype, target
from autofusion.frontend.onnx.fallback import ArgFn, fallback

Ints = tuple[int, ...]

# ---- TopK ------------------------------------------------------------------------------------------


@composite("top_k")
def top_k(x: torch.Tensor, k: int, dim: int, largest: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The k largest (smallest) along `dim`, sorted; equal values in index order, as ONNX says (a
    stable sort: torch.topk does not promise an order among ties)."""
    values, indices = torch.sort(x, dim=dim, descending=largest, stable=True)
    return values.narrow(dim, 0, k).contiguous(), indices.narrow(dim, 0, k).contiguous()


@fallback("TopK")
def _topk(ctx: OnnxCtx, arg: ArgFn) -> tuple[str, tuple[Any, ...], dict[str, Any]]:
    if ctx.opset < 10:
        k = int(ctx.attr("k"))
    else:
        ks = ctx.ints(1, "K")
        assert ks is not None
        k = ks[0]
    x = ctx.type(0)
    dim = norm_axis(int(ctx.attr("axis", -1)), x.rank)
    if not 0 <= k <= x.shape[dim]:
        raise unsupported(f"K={k} for an axis of {x.shape[dim]}")
    # sorted=0 leaves the order to the implementation: the sorted order is one such order.
    return target("top_k"), (arg(0), k, dim, bool(int(ctx.attr("largest", 1)))), {}


# ---- ReverseSequence -------------------------------------------------------------------------------


@composite("reverse_sequence")
def reverse_sequence(x: torch.Tensor, lens: torch.Tensor, time_axis: int, batch_axis: int) -> torch.Tensor:
    """Reverses the first lens[b] steps along `time_axis` of every batch entry b; the rest stay."""
    t, b = x.shape[time_axis], x.shape[batch_axis]
    steps = torch.arange(t, device=x.device).reshape(t, 1)
    n = lens.to(torch.int64).reshape(1, b)
    src = torch.where(steps < n, n - 1 - steps, steps)  # [time, batch]
    if time_axis > batch_axis:
        src = src.t()
    shape = [1] * x.dim()
    shape[time_axis], shape[batch_axis] = t, b
    return torch.gather(x, time_axis, src.reshape(shape).expand(x.shape))


@fallback("ReverseSequence")
def _reverse_sequence(ctx: OnnxCtx, arg: ArgFn) -> tuple[str, tuple[Any, ...], dict[str, Any]]:
    r = ctx.type(0).rank
    time_axis = norm_axis(int(ctx.attr("time_axis", 0)), r)
    batch_axis = norm_axis(int(ctx.attr("batch_axis", 1)), r)
    if time_axis == batch_axis or {time_axis, batch_axis} - {0, 1}:
        raise unsupported(f"time_axis {time_axis} with batch_axis {batch_axis}")
    return target("reverse_sequence"), (arg(0), arg(1), time_axis, batch_axis), {}


# ---- Col2Im ----------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=64)
def _col2im_index(
    image: Ints, block: Ints, dilations: Ints, lo: Ints, hi: Ints, strides: Ints
) -> torch.Tensor:
    """For every (block offset, column) pair, its flat position in the padded image: [K * L]."""
    padded = [i + a + b for i, a, b in zip(image, lo, hi, strict=True)]
    counts = [
        (p - d * (k - 1) - 1) // s + 1 for p, d, k, s in zip(padded, dilations, block, strides, strict=True)
    ]
    n = len(image)
    flat = torch.zeros((1,) * (2 * n), dtype=torch.int64)
    for d in range(n):
        # position along dim d = block offset * dilation + column position * stride
        shape_k = [1] * (2 * n)
        shape_k[d] = block[d]
        shape_l = [1] * (2 * n)
        shape_l[n + d] = counts[d]
        pos = (torch.arange(block[d]) * dilations[d]).reshape(shape_k) + (
            torch.arange(counts[d]) * strides[d]
        ).reshape(shape_l)
        flat = flat * padded[d] + pos
    return flat.reshape(-1)


@composite("col2im")
def col2im(
    x: torch.Tensor, image: Ints, block: Ints, dilations: Ints, lo: Ints, hi: Ints, strides: Ints
) -> torch.Tensor:
    """Sums the columns x [N, C * prod(block), L] into the image [N, C, *image] (ONNX Col2Im)."""
    n, ck, _ = x.shape
    c = ck // math.prod(block)
    padded = [i + a + b for i, a, b in zip(image, lo, hi, strict=True)]
    idx = _col2im_index(image, block, dilations, lo, hi, strides).to(x.device)
    dt = compute_dtype(x.dtype)
    cols = x.reshape(n, c, -1).to(dt)
    out = torch.zeros((n, c, math.prod(padded)), dtype=dt, device=x.device).index_add_(2, idx, cols)
    out = out.reshape(n, c, *padded)
    crop = tuple(slice(a, a + i) for a, i in zip(lo, image, strict=True))
    return out[(slice(None), slice(None), *crop)].to(x.dtype).contiguous()


@fallback("Col2Im")
def _col2im(ctx: OnnxCtx, arg: ArgFn) -> tuple[str, tuple[Any, ...], dict[str, Any]]:
    image, block = ctx.ints(1, "image_shape"), ctx.ints(2, "block_shape")
    assert image is not None and block is not None
    n = len(image)
    if len(block) != n or ctx.type(0).rank != 3:
        raise unsupported(f"Col2Im of {ctx.type(0)} with image_shape {image} and block_shape {block}")
    dil = tuple(int(d) for d in ctx.attr("dilations", [1] * n))
    pads = [int(p) for p in ctx.attr("pads", [0] * (2 * n))]
    strides = tuple(int(s) for s in ctx.attr("strides", [1] * n))
    args = (arg(0), tuple(image), tuple(block), dil, tuple(pads[:n]), tuple(pads[n:]), strides)
    return target("col2im"), args, {}


# ---- ConvTranspose ---------------------------------------------------------------------------------


@composite("conv_transpose")
def conv_transpose(
    x: torch.Tensor,
    w: torch.Tensor,
    b: torch.Tensor | None,
    strides: Ints,
    dilations: Ints,
    groups: int,
    lo: Ints,
    hi: Ints,
) -> torch.Tensor:
    """The full transposed convolution, then the ONNX pads taken off each end (a negative pad, from
    output_padding or a larger output_shape, extends that end with zeros), then the bias."""
    fn = (F.conv_transpose1d, F.conv_transpose2d, F.conv_transpose3d)[len(strides) - 1]
    dt = compute_dtype(x.dtype)
    full = fn(x.to(dt), w.to(dt), None, list(strides), 0, 0, groups, list(dilations))
    pad: list[int] = []
    for a, c in zip(reversed(lo), reversed(hi), strict=True):
        pad += [-a, -c]
    y = F.pad(full, pad)
    if b is not None:
        y = y + b.to(dt).reshape(1, -1, *([1] * len(strides)))
    return y.to(x.dtype)


@fallback("ConvTranspose")
def _conv_transpose(ctx: OnnxCtx, arg: ArgFn) -> tuple[str, tuple[Any, ...], dict[str, Any]]:
    x, w = ctx.type(0), ctx.type(1)
    n = x.rank - 2
    if n not in (1, 2, 3) or w.rank != x.rank:
        raise unsupported(f"ConvTranspose of {x} with weight {w}")
    kernel = [int(k) for k in ctx.attr("kernel_shape", list(w.shape[2:]))]
    strides = [int(s) for s in ctx.attr("strides", [1] * n)]
    dil = [int(d) for d in ctx.attr("dilations", [1] * n)]
    out_pad = [int(p) for p in ctx.attr("output_padding", [0] * n)]
    auto = ctx.attr("auto_pad", "NOTSET")
    full = [s * (i - 1) + op + (k - 1) * d + 1 for s, i, op, k, d in
            zip(strides, x.shape[2:], out_pad, kernel, dil, strict=True)]  # fmt: skip
    out_shape = ctx.attr("output_shape")
    if out_shape is not None or auto in ("SAME_UPPER", "SAME_LOWER"):
        if out_shape is None:
            target_shape = [i * s for i, s in zip(x.shape[2:], strides, strict=True)]
        else:
            target_shape = [int(v) for v in out_shape][-n:]
        lo, hi = [], []
        for f, t in zip(full, target_shape, strict=True):
            # Without output_shape, a kernel smaller than the stride leaves the full output as it is
            # (onnxruntime and ONNX shape inference: the SAME padding is never negative).
            total = f - t if out_shape is not None else max(0, f - t)
            small, big = total // 2, total - total // 2
            # The spec: SAME_UPPER puts the smaller half first; otherwise the larger half.
            lo.append(small if auto == "SAME_UPPER" else big)
            hi.append(big if auto == "SAME_UPPER" else small)
    elif auto in ("NOTSET", "VALID"):
        pads = [int(p) for p in ctx.attr("pads", [0] * (2 * n))] if auto == "NOTSET" else [0] * (2 * n)
        lo, hi = pads[:n], pads[n:]
    else:
        raise unsupported(f"auto_pad={auto!r}")
    # hi counts from the output_padding-extended end: the composite crops the plain full output.
    hi = [h - op for h, op in zip(hi, out_pad, strict=True)]
    bias = arg(2) if ctx.has(2) else None
    args = (arg(0), arg(1), bias, tuple(strides), tuple(dil), int(ctx.attr("group", 1)), tuple(lo), tuple(hi))
    return target("conv_transpose"), args, {}


# ---- DeformConv ------------------------------------------------------------------------------------


def _bilinear_zeros(x: torch.Tensor, py: torch.Tensor, px: torch.Tensor) -> torch.Tensor:
    """x [B, C, H, W] sampled bilinearly at the pixel positions (py, px) [B, P] -> [B, C, P]; the
    corners outside the image count as zero (in pixel units: no normalised round trip)."""
    b, c, h, w = x.shape
    flat = x.reshape(b, c, h * w)
    y0, x0 = torch.floor(py), torch.floor(px)
    out = torch.zeros((b, c, py.shape[1]), dtype=x.dtype, device=x.device)
    for dy in (0, 1):
        wy = (py - y0) if dy else (1 - (py - y0))
        yi = y0 + dy
        for dx in (0, 1):
            wx = (px - x0) if dx else (1 - (px - x0))
            xi = x0 + dx
            inside = (yi >= 0) & (yi < h) & (xi >= 0) & (xi < w)
            pos = (yi.clamp(0, h - 1) * w + xi.clamp(0, w - 1)).to(torch.int64)
            v = torch.gather(flat, 2, pos.unsqueeze(1).expand(b, c, pos.shape[1]))
            out = out + v * (wy * wx * inside).unsqueeze(1)
    return out


@composite("deform_conv2d")
def deform_conv2d(
    x: torch.Tensor,
    w: torch.Tensor,
    offset: torch.Tensor,
    b: torch.Tensor | None,
    mask: torch.Tensor | None,
    strides: Ints,
    dilations: Ints,
    pads: Ints,
    groups: int,
    offset_groups: int,
) -> torch.Tensor:
    """ONNX DeformConv (2-d): each kernel tap samples the input bilinearly at its offset position
    (zero outside the image), is scaled by the mask, and the taps are contracted with the weight."""
    out_dtype = x.dtype
    dt = compute_dtype(x.dtype)
    x, w, offset = x.to(dt), w.to(dt), offset.to(dt)
    n, c, ih, iw = x.shape
    oc, _, kh, kw = w.shape
    oh, ow = offset.shape[2:]
    k = kh * kw
    og = offset_groups
    off = offset.reshape(n, og, kh, kw, 2, oh, ow).to(x.dtype)
    dev = x.device
    # The tap positions without offsets: [kh, kw, oh, ow] for rows and for columns.
    rows = (torch.arange(oh, device=dev) * strides[0] - pads[0]).reshape(1, 1, oh, 1) + (
        torch.arange(kh, device=dev) * dilations[0]
    ).reshape(kh, 1, 1, 1)
    cols = (torch.arange(ow, device=dev) * strides[1] - pads[1]).reshape(1, 1, 1, ow) + (
        torch.arange(kw, device=dev) * dilations[1]
    ).reshape(1, kw, 1, 1)
    py = (rows.to(x.dtype) + off[:, :, :, :, 0]).reshape(n * og, k * oh * ow)
    px = (cols.to(x.dtype) + off[:, :, :, :, 1]).reshape(n * og, k * oh * ow)
    sampled = _bilinear_zeros(x.reshape(n * og, c // og, ih, iw), py, px)
    sampled = sampled.reshape(n, og, c // og, k, oh, ow)
    if mask is not None:
        sampled = sampled * mask.reshape(n, og, 1, k, oh, ow).to(x.dtype)
    cols_ = sampled.reshape(n, groups, (c // groups) * k, oh * ow)
    wg = w.reshape(groups, oc // groups, (c // groups) * k)
    y = torch.einsum("gok,ngkl->ngol", wg, cols_).reshape(n, oc, oh, ow)
    if b is not None:
        y = y + b.to(dt).reshape(1, oc, 1, 1)
    return y.to(out_dtype)


@fallback("DeformConv")
def _deform_conv(ctx: OnnxCtx, arg: ArgFn) -> tuple[str, tuple[Any, ...], dict[str, Any]]:
    x = ctx.type(0)
    if x.rank != 4:
        raise unsupported(f"DeformConv of a rank-{x.rank} input (2-d only)")
    strides = tuple(int(s) for s in ctx.attr("strides", [1, 1]))
    dil = tuple(int(d) for d in ctx.attr("dilations", [1, 1]))
    pads = tuple(int(p) for p in ctx.attr("pads", [0, 0, 0, 0]))
    args = (
        arg(0), arg(1), arg(2),
        arg(3) if ctx.has(3) else None, arg(4) if ctx.has(4) else None,
        strides, dil, pads[:2], int(ctx.attr("group", 1)), int(ctx.attr("offset_group", 1)),
    )  # fmt: skip
    return target("deform_conv2d"), args, {}


# ---- MaxUnpool -------------------------------------------------------------------------------------


@composite("max_unpool")
def max_unpool(x: torch.Tensor, indices: torch.Tensor, out_shape: Ints) -> torch.Tensor:
    """Writes each value of x at its flat index (ONNX MaxPool's Indices, over the whole output)."""
    out = torch.zeros(math.prod(out_shape), dtype=x.dtype, device=x.device)
    out = out.index_put((indices.reshape(-1).to(torch.int64),), x.reshape(-1))
    return out.reshape(out_shape)


@fallback("MaxUnpool")
def _max_unpool(ctx: OnnxCtx, arg: ArgFn) -> tuple[str, tuple[Any, ...], dict[str, Any]]:
    x = ctx.type(0)
    n = x.rank - 2
    shape = ctx.ints(2, "output_shape")
    if shape is None:
        kernel = [int(k) for k in ctx.attr("kernel_shape")]
        strides = [int(s) for s in ctx.attr("strides", [1] * n)]
        pads = [int(p) for p in ctx.attr("pads", [0] * (2 * n))]
        spatial = [(i - 1) * s + k - pads[d] - pads[n + d]
                   for d, (i, s, k) in enumerate(zip(x.shape[2:], strides, kernel, strict=True))]  # fmt: skip
        shape = [x.shape[0], x.shape[1], *spatial]
    return target("max_unpool"), (arg(0), arg(1), tuple(int(s) for s in shape)), {}


# ---- Unique ----------------------------------------------------------------------------------------


@fallback("Unique")
def _unique(ctx: OnnxCtx, arg: ArgFn) -> tuple[str, tuple[Any, ...], dict[str, Any]]:
    raise unsupported(
        "Unique's output length depends on the input's values; autofusion's graphs have static shapes"
    )
