"""Torch implementations of ONNX ops the converters do not lower: how each runs as an `extern` ATen call.

Each entry maps an ONNX op type to a function `(ctx, arg) -> (target, args, kwargs)`: `target` is an
ATen overload ("aten.max_pool2d.default"), `args`/`kwargs` a literal template in which `arg(i)` marks
ONNX input i (the runtime passes the tensor there). Attributes and inputs known at import become
literals. An entry raises `UnsupportedOpError` for a variant it cannot express; the driver then names
the node in a `FrontendError`. Pooling lives here because the IR has no pooling op: it is library work.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from autofusion.frontend.onnx import topk
from autofusion.frontend.onnx.context import OnnxCtx, norm_axis, unsupported
from autofusion.frontend.onnx.converters.nn import conv_padding
from autofusion.frontend.onnx.externs_math import MATH_FALLBACKS
from autofusion.ir.graph import Arg

ArgFn = Callable[[int], Arg]
Fallback = Callable[[OnnxCtx, ArgFn], tuple[str, tuple[Any, ...], dict[str, Any]]]
FALLBACKS: dict[str, Fallback] = {}


def fallback(*names: str) -> Callable[[Fallback], Fallback]:
    def deco(fn: Fallback) -> Fallback:
        for n in names:
            FALLBACKS[n] = fn
        return fn

    return deco


def _pool_geometry(ctx: OnnxCtx) -> tuple[int, list[int], list[int], list[int], list[int]]:
    x = ctx.type(0)
    n = x.rank - 2
    if n not in (1, 2, 3):
        raise unsupported(f"pooling over {n} spatial dims")
    kernel = [int(k) for k in ctx.attr("kernel_shape")]
    strides = [int(s) for s in ctx.attr("strides", [1] * n)]
    dilations = [int(d) for d in ctx.attr("dilations", [1] * n)]
    lo, hi = conv_padding(ctx, x.shape[2:], tuple(kernel), strides, dilations)
    if lo != hi:
        raise unsupported(f"asymmetric pooling pads {lo + hi}")
    return n, kernel, strides, lo, dilations


@fallback("MaxPool")
def _max_pool(ctx: OnnxCtx, arg: ArgFn) -> tuple[str, tuple[Any, ...], dict[str, Any]]:
    if len(ctx.node.output) > 1 and ctx.node.output[1]:
        raise unsupported("MaxPool's Indices output is read")
    if int(ctx.attr("storage_order", 0)):
        raise unsupported("MaxPool storage_order=1")
    n, kernel, strides, pads, dil = _pool_geometry(ctx)
    return (
        f"aten.max_pool{n}d.default",
        (arg(0), tuple(kernel), tuple(strides), tuple(pads), tuple(dil), bool(ctx.attr("ceil_mode", 0))),
        {},
    )


@fallback("AveragePool")
def _avg_pool(ctx: OnnxCtx, arg: ArgFn) -> tuple[str, tuple[Any, ...], dict[str, Any]]:
    n, kernel, strides, pads, dil = _pool_geometry(ctx)
    if any(d != 1 for d in dil):
        raise unsupported("AveragePool with dilations")
    include = bool(ctx.attr("count_include_pad", 0))
    return (
        f"aten.avg_pool{n}d.default",
        (arg(0), tuple(kernel), tuple(strides), tuple(pads), bool(ctx.attr("ceil_mode", 0)), include),
        {},
    )


@fallback("TopK")
def _topk(ctx: OnnxCtx, arg: ArgFn) -> tuple[str, tuple[Any, ...], dict[str, Any]]:
    k = ctx.ints(1, "K")
    assert k is not None
    dim = norm_axis(int(ctx.attr("axis", -1)), ctx.type(0).rank)
    # Sorted either way: ONNX leaves the order free when sorted=0, and ties keep their index order.
    return topk.TARGET, (arg(0), k[0], dim, bool(ctx.attr("largest", 1))), {}


@fallback("Einsum")
def _einsum(ctx: OnnxCtx, arg: ArgFn) -> tuple[str, tuple[Any, ...], dict[str, Any]]:
    return "aten.einsum.default", (ctx.attr("equation"), tuple(arg(i) for i in range(ctx.n_inputs))), {}


@fallback("Tile")
def _tile(ctx: OnnxCtx, arg: ArgFn) -> tuple[str, tuple[Any, ...], dict[str, Any]]:
    repeats = ctx.ints(1, "repeats")
    assert repeats is not None
    return "aten.repeat.default", (arg(0), tuple(repeats)), {}


@fallback("InstanceNormalization")
def _instance_norm(ctx: OnnxCtx, arg: ArgFn) -> tuple[str, tuple[Any, ...], dict[str, Any]]:
    eps = float(ctx.attr("epsilon", 1e-5))
    return "aten.instance_norm.default", (arg(0), arg(1), arg(2), None, None, True, 0.0, eps, False), {}


@fallback("Pad")
def _pad(ctx: OnnxCtx, arg: ArgFn) -> tuple[str, tuple[Any, ...], dict[str, Any]]:
    mode = {"constant": "constant", "reflect": "reflect", "edge": "replicate", "wrap": "circular"}.get(
        ctx.attr("mode", "constant")
    )
    if mode is None:
        raise unsupported(f"Pad mode {ctx.attr('mode')!r}")
    rank = ctx.type(0).rank
    pads = ctx.ints(1, "pads")
    assert pads is not None
    axes = [norm_axis(a, rank) for a in (ctx.ints(3, "axes") or range(rank))]
    lo, hi = [0] * rank, [0] * rank
    for k, d in enumerate(axes):
        lo[d], hi[d] = pads[k], pads[k + len(axes)]
    aten: list[int] = []
    for d in reversed(range(rank)):
        aten += [lo[d], hi[d]]
    # torch pads only the trailing dims it is told about: drop untouched leading ones.
    while len(aten) > 2 and aten[-2:] == [0, 0]:
        aten = aten[:-2]
    return "aten.pad.default", (arg(0), tuple(aten), mode), {}


@fallback("DepthToSpace")
def _depth_to_space(ctx: OnnxCtx, arg: ArgFn) -> tuple[str, tuple[Any, ...], dict[str, Any]]:
    if ctx.attr("mode", "DCR") != "CRD":
        raise unsupported("DepthToSpace mode DCR (torch's pixel_shuffle is CRD)")
    return "aten.pixel_shuffle.default", (arg(0), int(ctx.attr("blocksize"))), {}


@fallback("Resize")
def _resize(ctx: OnnxCtx, arg: ArgFn) -> tuple[str, tuple[Any, ...], dict[str, Any]]:
    """Spatial Resize in the two forms torch's interpolate writes: nearest (asymmetric, floor) and
    (bi/tri)linear (half_pixel = align_corners False, align_corners = True)."""
    x = ctx.type(0)
    n = x.rank - 2
    if n not in (1, 2, 3):
        raise unsupported(f"Resize of a rank-{x.rank} tensor")
    if (
        ctx.has_attr("axes")
        or int(ctx.attr("antialias", 0))
        or ctx.attr("keep_aspect_ratio_policy", "stretch") != "stretch"
    ):
        raise unsupported("Resize with axes, antialias or keep_aspect_ratio_policy")
    sizes = ctx.ints(3, "sizes")
    factors: tuple[float, ...] | None = None  # the spatial scales, when given: they map coordinates
    if sizes is None:
        scales = ctx.const(2)
        if scales is None or scales.size != x.rank:
            raise unsupported("Resize needs sizes or per-dim scales known at import")
        sizes = [int(d * float(s)) for d, s in zip(x.shape, scales.reshape(-1), strict=True)]
        factors = tuple(float(s) for s in scales.reshape(-1)[2:])
    if list(sizes[:2]) != list(x.shape[:2]):
        raise unsupported("Resize of the batch or channel dim")
    out = tuple(int(s) for s in sizes[2:])
    mode = ctx.attr("mode", "nearest")
    coord = ctx.attr("coordinate_transformation_mode", "half_pixel")
    if mode == "nearest":
        if coord != "asymmetric" or ctx.attr("nearest_mode", "round_prefer_floor") != "floor":
            raise unsupported(
                f"nearest Resize with {coord} coordinates (torch's nearest is asymmetric/floor)"
            )
        return f"aten.upsample_nearest{n}d.vec", (arg(0), out, None), {}
    if mode == "linear":
        if coord not in ("half_pixel", "pytorch_half_pixel", "align_corners"):
            raise unsupported(f"linear Resize with {coord} coordinates")
        if coord == "pytorch_half_pixel" and any(s == 1 for s in out):
            raise unsupported("pytorch_half_pixel with an output size of 1")
        name = {1: "linear1d", 2: "bilinear2d", 3: "trilinear3d"}[n]
        if factors is not None and coord != "align_corners":
            # ONNX maps x_out to (x_out + 0.5) / scale - 0.5 with the given scale, not out/in (which
            # differ when in * scale is not whole); torch does so when given the scales.
            return f"aten.upsample_{name}.vec", (arg(0), None, False, factors), {}
        return f"aten.upsample_{name}.vec", (arg(0), out, coord == "align_corners", None), {}
    raise unsupported(f"Resize mode {mode!r}")


# Externs of math and bit ops (BitShift, BitCast, CumSum/CumProd, Det) live in their own module.
FALLBACKS.update(MATH_FALLBACKS)
