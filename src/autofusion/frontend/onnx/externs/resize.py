"""ONNX Resize (opset 10 to 19), every mode, as one composite extern.

Resize is separable: each resized axis is interpolated on its own, one after the other. Per axis the
source coordinate of every output index is computed once (at import, from the sizes and attributes:
`_axis_table`), and with it the input indices each output reads and their weights: 1 tap for nearest,
2 for linear, 4 for cubic, more for an antialiased downscale (the filter stretched by 1/scale). The
runtime gathers those taps with `index_select` and sums them weighted. Indices outside the input are
clamped (ONNX pads with the edge value); `exclude_outside` gives their weight 0 and renormalises;
tf_crop_and_resize writes `extrapolation_value` where the coordinate falls outside the input.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np
import torch

from autofusion.errors import UnsupportedOpError
from autofusion.frontend.onnx.context import OnnxCtx, norm_axis, onnx_op, unsupported
from autofusion.frontend.onnx.converters.classic import resize_asymmetric
from autofusion.frontend.onnx.externs.composite import composite, compute_dtype, target
from autofusion.frontend.onnx.fallback import ArgFn, fallback
from autofusion.frontend.torch.context import TV

_COORD_MODES = (
    "half_pixel",
    "half_pixel_symmetric",
    "pytorch_half_pixel",
    "align_corners",
    "asymmetric",
    "tf_crop_and_resize",
    "tf_half_pixel_for_nn",
)
_NEAREST_MODES = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")

# (axis, input length, output length, scale, roi start, roi end) for one resized axis.
AxisSpec = tuple[int, int, int, float, float, float]


def _source_coords(coord: str, n_in: int, n_out: int, scale: float, lo: float, hi: float) -> np.ndarray:
    """x_original for every output index (the spec's formula for `coord`), in float64."""
    x = np.arange(n_out, dtype=np.float64)
    if coord == "half_pixel":
        return (x + 0.5) / scale - 0.5
    if coord == "half_pixel_symmetric":
        adjustment = n_out / (scale * n_in)
        offset = n_in / 2 * (1 - adjustment)
        return offset + (x + 0.5) / scale - 0.5
    if coord == "pytorch_half_pixel":
        return (x + 0.5) / scale - 0.5 if n_out > 1 else np.zeros(n_out)
    if coord == "align_corners":
        return x * (n_in - 1) / (n_out - 1) if n_out > 1 else np.zeros(n_out)
    if coord == "asymmetric":
        return x / scale
    if coord == "tf_half_pixel_for_nn":  # opset 11 only
        return (x + 0.5) / scale
    assert coord == "tf_crop_and_resize"
    if n_out > 1:
        return lo * (n_in - 1) + x * (hi - lo) * (n_in - 1) / (n_out - 1)
    return np.full(n_out, 0.5 * (lo + hi) * (n_in - 1))


def _cubic(d: np.ndarray, a: float) -> np.ndarray:
    """The cubic convolution kernel at distance d (Keys, with coefficient a)."""
    d = np.abs(d)
    near = ((a + 2) * d - (a + 3)) * d * d + 1
    far = ((a * d - 5 * a) * d + 8 * a) * d - 4 * a
    return np.where(d <= 1, near, np.where(d < 2, far, 0.0))


@functools.lru_cache(maxsize=256)
def _axis_table(
    n_in: int,
    n_out: int,
    scale: float,
    lo: float,
    hi: float,
    mode: str,
    nearest_mode: str,
    coord: str,
    cubic_a: float,
    exclude_outside: bool,
    antialias: bool,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """(indices [n_out, taps] int64, weights [n_out, taps] float64 or None for nearest, outside mask
    [n_out] bool or None) of one resized axis."""
    x = _source_coords(coord, n_in, n_out, scale, lo, hi)
    outside = (x < 0) | (x > n_in - 1) if coord == "tf_crop_and_resize" else None
    mask = None if outside is None or not outside.any() else torch.from_numpy(outside)
    if mode == "nearest":
        fl = np.floor(x)
        frac = x - fl
        if nearest_mode == "round_prefer_floor":
            up = frac > 0.5
        elif nearest_mode == "round_prefer_ceil":
            up = frac >= 0.5
        elif nearest_mode == "floor" or (nearest_mode == "simple" and scale >= 1):
            up = np.zeros_like(frac, dtype=bool)
        else:
            up = frac > 0
        idx = np.clip(fl + up, 0, n_in - 1).astype(np.int64)[:, None]
        return torch.from_numpy(idx), None, mask
    # The taps sit around `base`, the input index left of x (x itself less one where x is whole, so
    # that the fraction `ratio` lies in (0, 1]): taps base+start .. base+start+taps-1.
    fl = np.floor(x)
    whole = x == fl
    base = np.where(whole, fl - 1, fl)
    ratio = x - base
    s = min(scale, 1.0) if antialias else 1.0
    reach = 1.0 if mode == "linear" else 2.0  # the kernel's support radius, before stretching
    start = int(math.floor(-reach / s) + 1)
    taps = 2 - 2 * start
    offs = np.arange(start, start + taps, dtype=np.float64)
    dist = (offs[None, :] - ratio[:, None]) * s
    w = np.clip(1 - np.abs(dist), 0, 1) if mode == "linear" else _cubic(dist, cubic_a)
    if antialias:
        w = w / w.sum(axis=1, keepdims=True)
    idx = base[:, None].astype(np.int64) + offs[None, :].astype(np.int64)
    if exclude_outside:
        w = np.where((idx < 0) | (idx >= n_in), 0.0, w)
        total = w.sum(axis=1, keepdims=True)
        w = w / np.where(total == 0, 1.0, total)
    idx = np.clip(idx, 0, n_in - 1)
    return torch.from_numpy(idx), torch.from_numpy(w), mask


@composite("resize")
def resize(
    x: torch.Tensor,
    axes: tuple[AxisSpec, ...],
    mode: str,
    nearest_mode: str,
    coord: str,
    cubic_a: float,
    exclude_outside: bool,
    extrapolation_value: float,
    antialias: bool,
) -> torch.Tensor:
    """ONNX Resize of `x` along each axis in `axes` (see the module docstring)."""
    out_dtype = x.dtype
    # Weighted sums in fp32 for half types (as onnxruntime computes them), in the input's type otherwise.
    compute = compute_dtype(out_dtype)
    y = x if mode == "nearest" else x.to(compute)
    fast = _aten_resize(y, axes, mode, coord, cubic_a, exclude_outside, antialias)
    if fast is not None:
        return fast.to(out_dtype)
    for axis, n_in, n_out, scale, lo, hi in axes:
        idx, w, mask = _axis_table(
            n_in, n_out, scale, lo, hi, mode, nearest_mode, coord, cubic_a, exclude_outside, antialias
        )
        idx = idx.to(y.device)
        lead: tuple[Any, ...] = (slice(None),) * axis  # indexing along `axis`: faster than index_select
        if w is None:
            y = y[(*lead, idx[:, 0])]
        else:
            shape = [1] * y.dim()
            shape[axis] = n_out
            wt = w.to(device=y.device, dtype=compute)
            acc = y[(*lead, idx[:, 0])] * wt[:, 0].reshape(shape)
            for t in range(1, idx.shape[1]):
                acc.add_(y[(*lead, idx[:, t])] * wt[:, t].reshape(shape))
            y = acc
        if mask is not None:
            shape = [1] * y.dim()
            shape[axis] = n_out
            fill = torch.tensor(extrapolation_value, dtype=y.dtype, device=y.device)
            y = torch.where(mask.to(y.device).reshape(shape), fill, y)
    return y.to(out_dtype)


def _aten_resize(
    y: torch.Tensor,
    axes: tuple[AxisSpec, ...],
    mode: str,
    coord: str,
    cubic_a: float,
    exclude_outside: bool,
    antialias: bool,
) -> torch.Tensor | None:
    """ATen's upsample kernel where its formula is ONNX's (one pass instead of one per axis and tap),
    else None. Linear: half_pixel (ATen clamps a negative source coordinate to 0, which reads the same
    edge element ONNX's clamped taps do), pytorch_half_pixel with no output length 1, align_corners;
    exclude_outside changes nothing there (both taps clamp to the same element). Cubic (2-d): the
    same coordinates, a = -0.75, exclude_outside=0 (ATen clamps taps to the edge, as ONNX pads)."""
    n = y.dim() - 2
    spatial = set(range(2, y.dim()))
    if antialias or not axes or any(a not in spatial for a, *_ in axes) or n not in (1, 2, 3):
        return None
    if coord not in ("half_pixel", "pytorch_half_pixel", "align_corners"):
        return None
    if coord == "pytorch_half_pixel" and any(o == 1 for _, _, o, *_ in axes):
        return None
    if mode == "cubic" and (n != 2 or cubic_a != -0.75 or exclude_outside):
        return None
    if mode not in ("linear", "cubic"):
        return None
    sizes = list(y.shape[2:])
    scales = [1.0] * n
    for axis, _, n_out, scale, _, _ in axes:
        sizes[axis - 2], scales[axis - 2] = n_out, scale
    corners = coord == "align_corners"
    aten = torch.ops.aten
    if mode == "cubic":
        return aten.upsample_bicubic2d.default(y, sizes, corners, *scales)
    fn = (aten.upsample_linear1d, aten.upsample_bilinear2d, aten.upsample_trilinear3d)[n - 1]
    return fn.default(y, sizes, corners, *scales)


def _float_input(ctx: OnnxCtx, i: int, what: str) -> list[float] | None:
    """An optional float input known at import; None when absent or empty."""
    if not ctx.has(i):
        return None
    c = ctx.const(i)
    if c is None:
        raise unsupported(f"{what} (input {i}) is computed at run time; autofusion needs it known at import")
    flat = np.asarray(c, dtype=np.float64).reshape(-1)
    return None if flat.size == 0 else [float(v) for v in flat]


def _round_half_up(v: float) -> int:
    return math.floor(v + 0.5)


def _plan(ctx: OnnxCtx) -> tuple[Any, ...]:
    """The composite's arguments after the tensor: (axes, mode, nearest_mode, coord, cubic_a,
    exclude_outside, extrapolation_value, antialias), from the node's attributes and known inputs."""
    x = ctx.type(0)
    r = x.rank
    old = ctx.node.op_type == "Upsample" or ctx.opset < 11  # inputs (X, scales), asymmetric coordinates
    mode = ctx.attr("mode", "nearest")
    if old:
        mode = {"bilinear": "linear", "trilinear": "linear"}.get(mode, mode)
        if mode not in ("nearest", "linear"):
            raise unsupported(f"{ctx.node.op_type} mode {mode!r}")
        # onnxruntime's rounding for these: floor when upscaling, ceil when downscaling ("simple").
        coord, nearest_mode = "asymmetric", "simple"
        roi, sizes = None, None
        scales = _float_input(ctx, 1, "scales") if ctx.n_inputs > 1 else ctx.attr("scales")
        if scales is None:
            raise unsupported(f"{ctx.node.op_type} without scales")
        scales = [float(s) for s in scales]
    else:
        coord = ctx.attr("coordinate_transformation_mode", "half_pixel")
        nearest_mode = ctx.attr("nearest_mode", "round_prefer_floor")
        # roi only matters to tf_crop_and_resize (elsewhere it may even be computed at run time).
        roi = _float_input(ctx, 1, "roi") if coord == "tf_crop_and_resize" else None
        scales = _float_input(ctx, 2, "scales")
        sizes = ctx.ints(3, "sizes") if ctx.has(3) and np.asarray(ctx.const(3)).size != 0 else None
        if ctx.has(3) and ctx.const(3) is None:
            raise unsupported("sizes (input 3) is computed at run time; autofusion needs it known at import")
    if mode not in ("nearest", "linear", "cubic"):
        raise unsupported(f"Resize mode {mode!r}")
    if coord not in _COORD_MODES:
        raise unsupported(f"coordinate_transformation_mode {coord!r}")
    if mode == "nearest" and nearest_mode not in _NEAREST_MODES and not old:
        raise unsupported(f"nearest_mode {nearest_mode!r}")
    antialias = bool(int(ctx.attr("antialias", 0)))
    if antialias and mode == "nearest":
        raise unsupported("antialias with mode nearest")
    if mode != "nearest" and not x.dtype.is_float:
        raise unsupported(f"{mode} Resize of {x.dtype.name} (only nearest takes integer tensors)")
    axes = [norm_axis(int(a), r) for a in ctx.attr("axes", list(range(r)))]
    if len(set(axes)) != len(axes):
        raise unsupported(f"repeated axes {axes}")
    policy = ctx.attr("keep_aspect_ratio_policy", "stretch")
    if policy not in ("stretch", "not_larger", "not_smaller"):
        raise unsupported(f"keep_aspect_ratio_policy {policy!r}")
    if coord == "tf_crop_and_resize":
        if roi is None or len(roi) != 2 * len(axes):
            raise unsupported("tf_crop_and_resize needs an roi of 2 values per axis known at import")
        lo, hi = roi[: len(axes)], roi[len(axes) :]
    else:
        lo, hi = [0.0] * len(axes), [1.0] * len(axes)
    n_in = [x.shape[a] for a in axes]
    if sizes is not None:
        if len(sizes) != len(axes):
            raise unsupported(f"sizes {sizes} for {len(axes)} axes")
        ratios = [s / d for s, d in zip(sizes, n_in, strict=True)]
        if policy == "stretch":
            outs, scale = list(sizes), ratios
        else:
            k = min(ratios) if policy == "not_larger" else max(ratios)
            outs, scale = [_round_half_up(k * d) for d in n_in], [k] * len(axes)
    elif scales is not None:
        if len(scales) != len(axes):
            raise unsupported(f"scales {scales} for {len(axes)} axes")
        if any(s <= 0 for s in scales):
            raise unsupported(f"non-positive scales {scales}")
        scale = scales
        # floor(d * scale): the spec's text multiplies by the roi's extent as well, but ONNX shape
        # inference, its reference implementation and onnxruntime do not, and the file's types agree.
        outs = [math.floor(d * s) for d, s in zip(n_in, scales, strict=True)]
    else:
        raise unsupported("Resize with neither scales nor sizes")
    specs: list[AxisSpec] = []
    for a, d, o, s, lo_, h in zip(axes, n_in, outs, scale, lo, hi, strict=True):
        # An axis kept as it is (as onnx's reference skips it): no taps, no rounding.
        if o == d and math.isclose(s, 1.0) and math.isclose(lo_, 0.0) and math.isclose(h, 1.0):
            continue
        if o == 0 or d == 0:
            raise unsupported(f"Resize of axis {a} from {d} to {o}")
        specs.append((a, d, o, float(s), float(lo_), float(h)))
    return (
        tuple(specs),
        mode,
        nearest_mode,
        coord,
        float(ctx.attr("cubic_coeff_a", -0.75)),
        bool(int(ctx.attr("exclude_outside", 0))),
        float(ctx.attr("extrapolation_value", 0.0)),
        antialias,
    )


@fallback("Resize", "Upsample")
def _resize(ctx: OnnxCtx, arg: ArgFn) -> tuple[str, tuple[Any, ...], dict[str, Any]]:
    return target("resize"), (arg(0), *_plan(ctx)), {}


@onnx_op("Resize")
def _resize_converter(ctx: OnnxCtx) -> TV:
    """A Resize that fuses: a whole-factor nearest repeat (views), else one with asymmetric coordinates
    (index selects and weights: `converters/classic.py`); every other one runs as the extern."""
    try:
        return _resize_by_repeats(ctx)
    except UnsupportedOpError as first:
        try:
            return resize_asymmetric(ctx)
        except UnsupportedOpError:
            raise first from None


def _resize_by_repeats(ctx: OnnxCtx) -> TV:
    """Nearest Resize by whole factors (each input element repeated k times along an axis, as
    upsampling by 2 in detection and segmentation models is) -> reshape, expand, reshape: views that
    fuse with their neighbours. Every other Resize runs as the composite extern."""
    specs, mode, nearest_mode, coord, _, _, _, _ = _plan(ctx)
    if mode != "nearest" or coord == "tf_crop_and_resize":
        raise unsupported(f"{mode} Resize ({coord}) runs as a torch extern")
    x = ctx.tensor(0)
    factors = [1] * x.rank
    for axis, n_in, n_out, scale, lo, hi in specs:
        idx, _, _ = _axis_table(n_in, n_out, scale, lo, hi, mode, nearest_mode, coord, -0.75, False, False)
        k = n_out // n_in
        if n_out % n_in or not torch.equal(idx[:, 0], torch.arange(n_out) // k):
            raise unsupported("nearest Resize that is not a whole-factor repeat runs as a torch extern")
        factors[axis] = k
    if all(k == 1 for k in factors):
        return x
    split = [d for n, k in zip(x.shape, factors, strict=True) for d in ((n, 1) if k > 1 else (n,))]
    wide = [d for n, k in zip(x.shape, factors, strict=True) for d in ((n, k) if k > 1 else (n,))]
    y = ctx.add("expand", (ctx.reshape(x, split),), {"shape": tuple(wide)})
    return ctx.reshape(y, [n * k for n, k in zip(x.shape, factors, strict=True)])
