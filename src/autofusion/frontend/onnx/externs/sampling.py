"""ONNX GridSample (opset 16 and 20 mode names; 4-d and 5-d) and AffineGrid as torch externs.

torch's grid_sample has ONNX's semantics for every mode and padding mode it implements: the grid's
last dim is (x, y[, z]), align_corners maps -1/1 to the corner pixels' centres (else to their outer
edges), nearest rounds half to even. 5-d input takes nearest and linear only (torch has no tricubic).
Half-precision inputs are sampled in fp32 and rounded back.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from autofusion.frontend.onnx.context import OnnxCtx, unsupported
from autofusion.frontend.onnx.externs.composite import composite, compute_dtype, target
from autofusion.frontend.onnx.fallback import ArgFn, fallback

_MODES = {"bilinear": "bilinear", "linear": "bilinear", "nearest": "nearest", "bicubic": "bicubic",
          "cubic": "bicubic"}  # fmt: skip


@composite("grid_sample")
def grid_sample(
    x: torch.Tensor, grid: torch.Tensor, mode: str, padding: str, align_corners: bool
) -> torch.Tensor:
    compute = compute_dtype(x.dtype)
    y = F.grid_sample(
        x.to(compute), grid.to(compute), mode=mode, padding_mode=padding, align_corners=align_corners
    )
    return y.to(x.dtype)


@fallback("GridSample")
def _grid_sample(ctx: OnnxCtx, arg: ArgFn) -> tuple[str, tuple[Any, ...], dict[str, Any]]:
    x = ctx.type(0)
    mode = _MODES.get(ctx.attr("mode", "linear" if ctx.opset >= 20 else "bilinear"))
    if mode is None:
        raise unsupported(f"GridSample mode {ctx.attr('mode')!r}")
    if x.rank not in (4, 5):
        raise unsupported(f"GridSample of a rank-{x.rank} input (torch samples 4-d and 5-d)")
    if x.rank == 5 and mode == "bicubic":
        raise unsupported("cubic GridSample of a 5-d input (torch has no tricubic sampling)")
    if not x.dtype.is_float:
        raise unsupported(f"GridSample of {x.dtype.name}")
    padding = ctx.attr("padding_mode", "zeros")
    if padding not in ("zeros", "border", "reflection"):
        raise unsupported(f"GridSample padding_mode {padding!r}")
    args = (arg(0), arg(1), mode, padding, bool(int(ctx.attr("align_corners", 0))))
    return target("grid_sample"), args, {}


@composite("affine_grid")
def affine_grid(theta: torch.Tensor, size: tuple[int, ...], align_corners: bool) -> torch.Tensor:
    compute = compute_dtype(theta.dtype)
    return F.affine_grid(theta.to(compute), list(size), align_corners=align_corners).to(theta.dtype)


@fallback("AffineGrid")
def _affine_grid(ctx: OnnxCtx, arg: ArgFn) -> tuple[str, tuple[Any, ...], dict[str, Any]]:
    size = ctx.ints(1, "size")
    assert size is not None
    if len(size) not in (4, 5) or not ctx.type(0).dtype.is_float:
        raise unsupported(f"AffineGrid of {ctx.type(0)} to size {size}")
    return target("affine_grid"), (arg(0), tuple(size), bool(int(ctx.attr("align_corners", 0)))), {}
