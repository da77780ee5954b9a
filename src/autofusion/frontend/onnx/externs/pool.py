"""ONNX MaxPool (with its Indices output), AveragePool and LpPool, every attribute, as one composite.

The IR has no pooling op: pooling is library work. ATen's pooling takes only symmetric pads of at
most half the kernel, no dilations for averages, and counts ceil-mode windows its own way, so the
composite first pads the input explicitly (the ONNX pads at each end, plus what ceil_mode's last
window reaches past them), then pools without padding:
- max: `max_pool{n}d_with_indices` on the input padded with -inf; Indices are mapped back from the
  padded plane to ONNX's flat index over the whole unpadded tensor (row- or column-major);
- average and Lp: a sum over each window as a depthwise convolution with a ones kernel (which takes
  dilations), divided by the count of the window's elements that count (`count_include_pad` says
  whether the pads do; ceil mode's overflow never does), or raised to 1/p.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F

from autofusion.frontend.onnx.context import OnnxCtx, unsupported
from autofusion.frontend.onnx.converters.nn import conv_padding
from autofusion.frontend.onnx.externs.composite import composite, compute_dtype, target
from autofusion.frontend.onnx.fallback import ArgFn, fallback

Ints = tuple[int, ...]


def _pad_arg(lo: Ints, hi: Ints) -> list[int]:
    """F.pad's argument (last dim first) for pads `lo`/`hi` over the trailing spatial dims."""
    out: list[int] = []
    for a, b in zip(reversed(lo), reversed(hi), strict=True):
        out += [a, b]
    return out


def _conv(x: torch.Tensor, w: torch.Tensor, strides: Ints, dilations: Ints, groups: int) -> torch.Tensor:
    fn = (F.conv1d, F.conv2d, F.conv3d)[len(strides) - 1]
    return fn(x, w, None, list(strides), 0, list(dilations), groups)


@composite("pool")
def pool(
    x: torch.Tensor,
    kind: str,
    kernel: Ints,
    strides: Ints,
    dilations: Ints,
    lo: Ints,
    hi: Ints,
    extra: Ints,
    p: float,
    count_include_pad: bool,
    indices: str,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """ONNX pooling of `x` [N, C, *spatial]: `kind` max, avg or lp; pads `lo`/`hi` per spatial dim,
    `extra` past `hi` for ceil mode; `indices` "", "row" or "col" (storage_order 0 or 1)."""
    n = len(kernel)
    spatial = tuple(x.shape[2:])
    ends = tuple(h + e for h, e in zip(hi, extra, strict=True))
    kernel, ends = _clamped(kernel, strides, dilations, lo, hi, ends, spatial)
    # ATen pads by itself when the pads are the same at both ends, at most half the window,
    # and ceil mode adds none: then no padded copy of the input is made.
    aten_pads = lo == ends and all(2 * a <= k for a, k in zip(lo, kernel, strict=True))
    if kind == "max":
        fn = (F.max_pool1d, F.max_pool2d, F.max_pool3d)[n - 1]
        if aten_pads:
            xp, base, pad = x, (0,) * n, list(lo)
        else:
            low = -math.inf if x.dtype.is_floating_point else torch.iinfo(x.dtype).min
            xp, base, pad = F.pad(x, _pad_arg(lo, ends), value=low), lo, [0] * n
        y, idx = _planes_last(fn, xp, list(kernel), list(strides), pad, list(dilations))
        if not indices:
            return y
        # Flat index in the (padded) plane -> coordinates -> flat index over the unpadded tensor.
        padded = xp.shape[2:]
        coords = []
        rest = idx
        for d in reversed(range(n)):
            coords.append(rest % padded[d] - base[d])
            rest = rest // padded[d]
        coords.reverse()
        flat = torch.zeros_like(idx)
        order = range(n) if indices == "row" else reversed(range(n))
        for d in order:
            flat = flat * spatial[d] + coords[d]
        plane = math.prod(spatial)
        nc = torch.arange(x.shape[0] * x.shape[1], device=x.device, dtype=idx.dtype)
        flat = flat + (nc * plane).reshape(x.shape[0], x.shape[1], *([1] * n))
        return y, flat
    compute = compute_dtype(x.dtype)
    xc = x.to(compute)
    if kind == "avg" and aten_pads and all(d == 1 for d in dilations):
        avg = (F.avg_pool1d, F.avg_pool2d, F.avg_pool3d)[n - 1]
        return avg(xc, list(kernel), list(strides), list(lo), False, count_include_pad).to(x.dtype)
    if kind == "lp":
        xc = xc.abs().pow(p)
    xp = F.pad(xc, _pad_arg(lo, ends), value=0.0)
    c = x.shape[1]
    ones = torch.ones((c, 1, *kernel), dtype=compute, device=x.device)
    total = _conv(xp, ones, strides, dilations, c)
    if kind == "lp":
        return total.pow(1.0 / p).to(x.dtype)
    # The count per window: pool a mask that is 1 where an element counts.
    mask = torch.zeros((1, 1, *xp.shape[2:]), dtype=compute, device=x.device)
    region: tuple[Any, ...] = tuple(
        slice(0, lo[d] + spatial[d] + hi[d]) if count_include_pad else slice(lo[d], lo[d] + spatial[d])
        for d in range(n)
    )
    mask[(0, 0, *region)] = 1.0
    count = _conv(mask, torch.ones((1, 1, *kernel), dtype=compute, device=x.device), strides, dilations, 1)
    return (total / count).to(x.dtype)


# ATen's 2-d max pool on contiguous NCHW data is its slow kernel: [1, 64, 112, 112] (ResNet's, 3x3
# stride 2) took 13-17 ms on one core of the 2-core development VM, against ~0.25 ms for the same pool
# on channels-last data and ~0.85 ms including both copies. With few channels the NCHW kernel is the
# faster one (3 channels: 0.9 ms, against 1.4 ms through channels-last).
CL_MIN_CHANNELS = 16
CL_POOLS = [0]  # max pools run through a channels-last copy (tests prove the path ran)


def _planes_last(
    fn: Any, xp: torch.Tensor, kernel: list[int], strides: list[int], pad: list[int], dilations: list[int]
) -> tuple[torch.Tensor, torch.Tensor]:
    """fn(xp, ...) with indices; a 2-d pool of contiguous NCHW data with many channels runs on a
    channels-last copy, and its results come back contiguous (as the NCHW kernel's would)."""
    cl = torch.channels_last
    if (
        xp.dim() != 4
        or xp.shape[1] < CL_MIN_CHANNELS
        or not xp.is_contiguous()
        or xp.is_contiguous(memory_format=cl)
    ):
        return fn(xp, kernel, strides, pad, dilations, False, True)
    y, idx = fn(xp.contiguous(memory_format=cl), kernel, strides, pad, dilations, False, True)
    CL_POOLS[0] += 1
    return y.contiguous(), idx.contiguous()


def _clamped(kernel: Ints, strides: Ints, dilations: Ints, lo: Ints, hi: Ints, ends: Ints,
             spatial: tuple[int, ...]) -> tuple[Ints, Ints]:  # fmt: skip
    """A window longer than the padded input (a global pool written as `kernel_shape = [1280, 1280]`
    over 7x7, with ceil_mode) covers the same elements when cut to that length L = lo + size + hi:
    every window starts at or after 0, so its part inside [0, L) ends at L either way. Cut, and pad
    the end only as far as the last window then reaches, instead of a copy as large as the window."""
    k_out, e_out = list(kernel), list(ends)
    for d, (k, s, dil) in enumerate(zip(kernel, strides, dilations, strict=True)):
        length = lo[d] + spatial[d] + hi[d]
        if dil != 1 or k <= length:
            continue
        windows = (lo[d] + spatial[d] + ends[d] - k) // s + 1
        if windows < 1:  # no window at all (an empty output): nothing to cut
            continue
        k_out[d] = length
        e_out[d] = (windows - 1) * s + length - lo[d] - spatial[d]
    return tuple(k_out), tuple(e_out)


def _pool_spec(ctx: OnnxCtx, kind: str) -> tuple[Ints, Ints, Ints, Ints, Ints, Ints]:
    """(kernel, strides, dilations, pads at the start, pads at the end, ceil-mode overflow)."""
    x = ctx.type(0)
    n = x.rank - 2
    if n not in (1, 2, 3):
        raise unsupported(f"pooling over {n} spatial dims")
    kernel = tuple(int(k) for k in ctx.attr("kernel_shape"))
    if len(kernel) != n:
        raise unsupported(f"kernel_shape {list(kernel)} for {n} spatial dims")
    strides = tuple(int(s) for s in ctx.attr("strides", [1] * n))
    dilations = tuple(int(d) for d in ctx.attr("dilations", [1] * n))
    spatial = x.shape[2:]
    lo, hi = conv_padding(ctx, spatial, kernel, list(strides), list(dilations))
    ceil = bool(int(ctx.attr("ceil_mode", 0)))
    want = ctx.out_type(0)
    extra = []
    for d in range(n):
        eff = dilations[d] * (kernel[d] - 1) + 1
        total = spatial[d] + lo[d] + hi[d]
        if want is not None and len(want.shape) == n + 2:
            out = want.shape[2 + d]  # ONNX shape inference's count (its rule for ceil mode)
        elif ceil:
            out = -(-(total - eff) // strides[d]) + 1
            if (out - 1) * strides[d] >= spatial[d] + lo[d]:
                out -= 1  # the last window must start inside the input or its start pad
        else:
            out = (total - eff) // strides[d] + 1
        if out < 1:
            raise unsupported(f"pooling gives no output along spatial dim {d}")
        extra.append(max(0, (out - 1) * strides[d] + eff - total))
        if (total + extra[-1] - eff) // strides[d] + 1 != out:
            raise unsupported(f"pooling output {out} along spatial dim {d} cannot be reached")
    return kernel, strides, dilations, tuple(lo), tuple(hi), tuple(extra)


@fallback("MaxPool")
def _max_pool(ctx: OnnxCtx, arg: ArgFn) -> tuple[str, tuple[Any, ...], dict[str, Any]]:
    order = int(ctx.attr("storage_order", 0))
    wants = len(ctx.node.output) > 1 and bool(ctx.node.output[1])
    indices = ("row" if order == 0 else "col") if wants else ""
    kernel, strides, dil, lo, hi, extra = _pool_spec(ctx, "max")
    return target("pool"), (arg(0), "max", kernel, strides, dil, lo, hi, extra, 0.0, False, indices), {}


@fallback("AveragePool")
def _avg_pool(ctx: OnnxCtx, arg: ArgFn) -> tuple[str, tuple[Any, ...], dict[str, Any]]:
    if not ctx.type(0).dtype.is_float:
        raise unsupported(f"AveragePool of {ctx.type(0).dtype.name}")
    kernel, strides, dil, lo, hi, extra = _pool_spec(ctx, "avg")
    include = bool(int(ctx.attr("count_include_pad", 0)))
    return target("pool"), (arg(0), "avg", kernel, strides, dil, lo, hi, extra, 0.0, include, ""), {}


@fallback("LpPool")
def _lp_pool(ctx: OnnxCtx, arg: ArgFn) -> tuple[str, tuple[Any, ...], dict[str, Any]]:
    if not ctx.type(0).dtype.is_float:
        raise unsupported(f"LpPool of {ctx.type(0).dtype.name}")
    kernel, strides, dil, lo, hi, extra = _pool_spec(ctx, "lp")
    p = float(ctx.attr("p", 2))
    return target("pool"), (arg(0), "lp", kernel, strides, dil, lo, hi, extra, p, False, ""), {}
