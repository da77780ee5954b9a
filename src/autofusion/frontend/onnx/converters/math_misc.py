"""ONNX ops lowered to IR: BitwiseNot, EyeLike, Compress, and NonZero (refused: its output shape
depends on the input's values). CumSum/CumProd and Det have no IR form: see externs_math.py.

EyeLike is an arange compare that fuses. Compress needs its condition known at import and becomes a
slice (a contiguous run of kept indices) or an index_select.
"""

from __future__ import annotations

import numpy as np
import torch

from autofusion.frontend.onnx.context import OnnxCtx, dtype_of, norm_axis, onnx_op, unsupported
from autofusion.frontend.torch.context import TV
from autofusion.ir.dtypes import DType
from autofusion.ir.types import TensorType


@onnx_op("BitwiseNot")
def _bitwise_not(ctx: OnnxCtx) -> TV:
    x = ctx.tensor(0)
    if not x.dtype.is_int:
        raise unsupported(f"BitwiseNot of {x.dtype.short}")
    return ctx.add("bitwise_not", (x,))


@onnx_op("EyeLike")
def _eye_like(ctx: OnnxCtx) -> TV:
    t = ctx.type(0)
    if t.rank != 2:
        raise unsupported(f"EyeLike of a rank-{t.rank} tensor")
    dtype = dtype_of(int(ctx.attr("dtype")), "EyeLike dtype") if ctx.has_attr("dtype") else t.dtype
    n, m = t.shape
    k = int(ctx.attr("k", 0))
    rows = ctx.reshape(ctx.add("arange", (), {"start": 0, "end": n, "step": 1, "dtype": DType.int64}), (n, 1))
    cols = ctx.reshape(ctx.add("arange", (), {"start": 0, "end": m, "step": 1, "dtype": DType.int64}), (1, m))
    on = ctx.add("eq", (ctx.add("sub", (cols, rows)), ctx.scalar(k, DType.int64)))
    return ctx.cast(on, dtype)


@onnx_op("Compress")
def _compress(ctx: OnnxCtx) -> TV:
    x = ctx.tensor(0)
    cond = ctx.ints(1, "condition")  # its values set the output shape
    assert cond is not None
    if ctx.has_attr("axis"):
        d = norm_axis(int(ctx.attr("axis")), x.rank)
    else:
        x, d = ctx.reshape(x, (x.type.numel,)), 0
    n = x.shape[d]
    keep = [i for i, c in enumerate(cond) if c]
    if keep and keep[-1] >= n:
        raise unsupported(f"condition selects index {keep[-1]} of an axis of {n}")
    if keep == list(range(keep[0], keep[-1] + 1)) if keep else True:
        start, end = (keep[0], keep[-1] + 1) if keep else (0, 0)
        return ctx.add("slice", (x,), {"dim": d, "start": start, "end": end, "step": 1})
    idx_type = TensorType(DType.int64, (len(keep),))
    vid = ctx.b.add_constant(f"{ctx.name}_indices", torch.from_numpy(np.asarray(keep, np.int64)), idx_type)
    return ctx.add("index_select", (x, TV(vid, idx_type)), {"dim": d})


@onnx_op("NonZero")
def _non_zero(ctx: OnnxCtx) -> TV:
    raise unsupported(
        "its output shape depends on the input's values and autofusion compiles static shapes "
        "(a NonZero of a value known at import is folded)"
    )
