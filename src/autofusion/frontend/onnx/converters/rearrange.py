"""ONNX ops that only move elements -> IR views and pads (so they fuse): DepthToSpace (DCR and CRD),
SpaceToDepth and CenterCropPad."""

from __future__ import annotations

from autofusion.frontend.onnx.context import OnnxCtx, norm_axis, onnx_op, unsupported
from autofusion.frontend.torch.context import TV


def _nchw(ctx: OnnxCtx, x: TV, b: int, what: str) -> tuple[int, int, int, int]:
    if x.rank != 4 or b < 1:
        raise unsupported(f"{what} of {x.type} with blocksize {b}")
    n, c, h, w = x.shape
    return n, c, h, w


@onnx_op("DepthToSpace")
def _depth_to_space(ctx: OnnxCtx) -> TV:
    x = ctx.tensor(0)
    b = int(ctx.attr("blocksize"))
    n, c, h, w = _nchw(ctx, x, b, "DepthToSpace")
    if c % (b * b):
        raise unsupported(f"DepthToSpace of {c} channels by blocksize {b}")
    mode = ctx.attr("mode", "DCR")
    if mode == "DCR":  # channel = (row offset, column offset, depth)
        y = ctx.permute(ctx.reshape(x, (n, b, b, c // (b * b), h, w)), (0, 3, 4, 1, 5, 2))
    elif mode == "CRD":  # channel = (depth, row offset, column offset)
        y = ctx.permute(ctx.reshape(x, (n, c // (b * b), b, b, h, w)), (0, 1, 4, 2, 5, 3))
    else:
        raise unsupported(f"DepthToSpace mode {mode!r}")
    return ctx.reshape(y, (n, c // (b * b), h * b, w * b))


@onnx_op("SpaceToDepth")
def _space_to_depth(ctx: OnnxCtx) -> TV:
    x = ctx.tensor(0)
    b = int(ctx.attr("blocksize"))
    n, c, h, w = _nchw(ctx, x, b, "SpaceToDepth")
    if h % b or w % b:
        raise unsupported(f"SpaceToDepth of {h}x{w} by blocksize {b}")
    mode = ctx.attr("mode", "DCR")  # opset 28 names the channel order; before, it is DCR
    if mode not in ("DCR", "CRD"):
        raise unsupported(f"SpaceToDepth mode {mode!r}")
    order = (0, 3, 5, 1, 2, 4) if mode == "DCR" else (0, 1, 3, 5, 2, 4)
    y = ctx.permute(ctx.reshape(x, (n, c, h // b, b, w // b, b)), order)
    return ctx.reshape(y, (n, c * b * b, h // b, w // b))


@onnx_op("CenterCropPad")
def _center_crop_pad(ctx: OnnxCtx) -> TV:
    x = ctx.tensor(0)
    shape = ctx.ints(1, "shape")
    assert shape is not None
    axes = [norm_axis(int(a), x.rank) for a in ctx.attr("axes", list(range(x.rank)))]
    if len(axes) != len(shape):
        raise unsupported(f"CenterCropPad shape {shape} for axes {axes}")
    y = x
    pads = [0] * (2 * x.rank)  # ATen order: last dim first, (before, after) per dim
    for a, want in zip(axes, shape, strict=True):
        have = x.shape[a]
        if want < have:  # crop: the extra element, when odd, comes off the end
            start = (have - want) // 2
            y = ctx.add("slice", (y,), {"dim": a, "start": start, "end": start + want, "step": 1})
        elif want > have:  # pad with zeros: the extra element, when odd, goes at the end
            before = (want - have) // 2
            k = 2 * (x.rank - 1 - a)
            pads[k], pads[k + 1] = before, want - have - before
    if any(pads):
        while pads[-2:] == [0, 0]:
            pads = pads[:-2]
        y = ctx.add("pad", (y,), {"pads": tuple(pads), "value": 0.0 if x.dtype.is_float else 0})
    return y
