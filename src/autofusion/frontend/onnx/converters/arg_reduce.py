"""ONNX ArgMax / ArgMin -> IR, with onnxruntime's answer where a float input holds NaN.

The ONNX spec leaves NaN open. torch and numpy (so also onnx.reference) take NaN for the extreme: the
index of the first NaN. onnxruntime (1.32, CPU) scans each slice with its first element as the best so
far, replaced by each later element that compares greater (ArgMin: less; select_last_index=1: greater
or equal, less or equal). A NaN compares with nothing, so it is skipped, unless it is the slice's first
element, which then stays the answer. We give onnxruntime's answer, the one the tests (and users who
check an export against onnxruntime) compare with. It holds there for every axis, keepdims and both
select_last_index; the one exception is onnxruntime's vectorised kernel for a whole-tensor reduction of
16 or more elements with select_last_index=0, whose answer with NaNs depends on its vector lanes (an
index of a NaN, a multiple of 4): there we give the scan's answer.

How, for a float input: m = the extreme of the slice with NaN read as -inf (ArgMin: +inf); the answer is
the first (select_last_index: last) index where x == m (NaN equals nothing, -inf included: an all-NaN
slice has no such index), and 0 where the slice's first element is NaN. Integer and bool inputs have no
NaN and take the plain argmax.
"""

from __future__ import annotations

import math
from typing import Any

from autofusion.frontend.onnx.context import OnnxCtx, norm_axis, onnx_op
from autofusion.frontend.torch.context import TV
from autofusion.ir.dtypes import DType


@onnx_op("ArgMax", "ArgMin")
def _argreduce(ctx: OnnxCtx) -> TV:
    x = ctx.tensor(0)
    dim = norm_axis(int(ctx.attr("axis", 0)), x.rank)
    op = "argmax" if ctx.node.op_type == "ArgMax" else "argmin"
    attrs = {"dim": dim, "keepdim": bool(int(ctx.attr("keepdims", 1)))}
    last = bool(int(ctx.attr("select_last_index", 0))) and x.rank > 0
    if not x.dtype.is_float or x.rank == 0:
        return _index(ctx, op, x, attrs, last)
    nan = ctx.add("isnan", (x,))
    skipped = ctx.add("where", (nan, ctx.scalar(math.inf if op == "argmin" else -math.inf, x.dtype), x))
    extreme = ctx.add("amin" if op == "argmin" else "amax", (skipped,), {"dims": (dim,), "keepdim": True})
    hit = ctx.add("eq", (x, extreme))
    found = _index(ctx, "argmax", hit, attrs, last)  # the first (last) True
    if attrs["keepdim"]:
        first_nan = ctx.add("slice", (nan,), {"dim": dim, "start": 0, "end": 1, "step": 1})
    else:
        first_nan = ctx.add("select", (nan,), {"dim": dim, "index": 0})
    return ctx.add("where", (first_nan, ctx.scalar(0, DType.int64), found))


def _index(ctx: OnnxCtx, op: str, x: TV, attrs: dict[str, Any], last: bool) -> TV:
    """torch's argmax/argmin (the first index of ties) or, with `last`, the last index of ties: the first
    of the flipped dim, counted back."""
    if not last:
        return ctx.add(op, (x,), attrs)
    first = ctx.add(op, (ctx.add("flip", (x,), {"dims": (attrs["dim"],)}),), attrs)
    return ctx.add("sub", (ctx.scalar(x.shape[attrs["dim"]] - 1, DType.int64), first))
