"""ONNX shape, view and data-movement ops -> IR (reshape, permute, expand, slice, select, concat, pad...).

Shape arguments (Reshape's shape, Slice's starts/ends, Squeeze's axes...) must be known at import; they
are when they come from initializers, Constant nodes or folded Shape computations. Constant and Shape
themselves return known values (numpy arrays), not IR nodes.
"""

from __future__ import annotations

import math

import numpy as np
from onnx import numpy_helper

from autofusion.frontend.onnx.context import OnnxCtx, array_dtype, norm_axis, onnx_op, unsupported
from autofusion.frontend.torch.context import TV
from autofusion.ir.catalog import broadcast_shapes
from autofusion.ir.dtypes import DType
from autofusion.ir.symbolic import SymInt


@onnx_op("Constant")
def _constant(ctx: OnnxCtx) -> np.ndarray:
    for key in ("value", "value_float", "value_int", "value_floats", "value_ints"):
        if ctx.has_attr(key):
            v = ctx.attr(key)
            if key == "value":
                return numpy_helper.to_array(v)
            return np.asarray(v, dtype=np.float32 if "float" in key else np.int64)
    raise unsupported("Constant with a sparse or string value")


@onnx_op("ConstantOfShape")
def _constant_of_shape(ctx: OnnxCtx) -> TV:
    shape = tuple(ctx.ints(0, "shape") or ())
    value = numpy_helper.to_array(ctx.attr("value")) if ctx.has_attr("value") else np.zeros(1, np.float32)
    expected = ctx.out_type(0)
    dt = expected.dtype if expected is not None else array_dtype(value)
    v = value.reshape(-1)[0].item()
    return ctx.add(
        "full",
        (),
        {"value": bool(v) if dt.is_bool else int(v) if dt.is_int else float(v), "dtype": dt, "shape": shape},
    )


@onnx_op("Shape")
def _shape(ctx: OnnxCtx) -> np.ndarray:
    shape = ctx.type(0).shape
    start, end = int(ctx.attr("start", 0)), ctx.attr("end")
    dims = shape[slice(start, None if end is None else int(end))]
    if any(isinstance(d, SymInt) for d in dims):  # symbolic dims: an object array keeps them
        return np.array(list(dims) or [], dtype=object)
    return np.asarray(dims, dtype=np.int64)


@onnx_op("Size")
def _size(ctx: OnnxCtx) -> np.ndarray:
    n = math.prod(ctx.type(0).shape)
    if isinstance(n, SymInt):
        out = np.empty((), dtype=object)
        out[()] = n
        return out
    return np.asarray(n, dtype=np.int64)


def reshape_target(src: tuple[int, ...], spec: list[int], allowzero: bool) -> tuple[int, ...]:
    out = [src[i] if s == 0 and not allowzero else s for i, s in enumerate(spec)]
    if out.count(-1) > 1:
        raise unsupported(f"Reshape shape {spec} has more than one -1")
    if -1 in out:
        known = math.prod(s for s in out if s != -1)
        out[out.index(-1)] = math.prod(src) // known if known else 0
    return tuple(out)


@onnx_op("Reshape")
def _reshape(ctx: OnnxCtx) -> TV:
    x = ctx.tensor(0)
    spec = ctx.ints(1, "shape")
    assert spec is not None
    return ctx.reshape(x, reshape_target(x.shape, spec, bool(ctx.attr("allowzero", 0))))


@onnx_op("Flatten")
def _flatten(ctx: OnnxCtx) -> TV:
    x = ctx.tensor(0)
    # axis is in [-r, r]: a negative one counts from the end (-1 is r - 1, not r).
    axis = int(ctx.attr("axis", 1))
    if not -x.rank <= axis <= x.rank:
        raise unsupported(f"Flatten axis {axis} out of range for rank {x.rank}")
    axis = axis + x.rank if axis < 0 else axis
    return ctx.reshape(x, (math.prod(x.shape[:axis]), math.prod(x.shape[axis:])))


@onnx_op("Transpose")
def _transpose(ctx: OnnxCtx) -> TV:
    x = ctx.tensor(0)
    perm = ctx.attr("perm")
    dims = (
        tuple(int(p) % max(x.rank, 1) for p in perm) if perm is not None else tuple(reversed(range(x.rank)))
    )
    return ctx.permute(x, dims)


@onnx_op("Concat")
def _concat(ctx: OnnxCtx) -> TV:
    ts = [t for t in ctx.tensors()]
    axis = norm_axis(int(ctx.attr("axis")), ts[0].rank)
    ts = [t for t in ts if t.shape[axis] != 0] or ts[:1]
    return ts[0] if len(ts) == 1 else ctx.add("concat", ts, {"dim": axis})


def slice_axis(ctx: OnnxCtx, x: TV, dim: int, start: int, end: int, step: int) -> TV:
    size = x.shape[dim]
    if step > 0:
        s, e, st = slice(start, end, step).indices(size)
        e = max(e, s)
        if (s, e, st) == (0, size, 1):
            return x
        return ctx.add("slice", (x,), {"dim": dim, "start": s, "end": e, "step": st})
    # Negative step: the same elements, read from the flipped tensor with a positive step.
    idx = list(range(size))[slice(start, end, step)]
    flipped = ctx.add("flip", (x,), {"dims": (dim,)})
    if not idx:
        return ctx.add("slice", (flipped,), {"dim": dim, "start": 0, "end": 0, "step": 1})
    first = size - 1 - idx[0]
    return slice_axis(ctx, flipped, dim, first, first + (len(idx) - 1) * (-step) + 1, -step)


@onnx_op("Slice")
def _slice(ctx: OnnxCtx) -> TV:
    x = ctx.tensor(0)
    starts, ends = ctx.ints(1, "starts"), ctx.ints(2, "ends")
    assert starts is not None and ends is not None
    axes = ctx.ints(3, "axes") or list(range(len(starts)))
    steps = ctx.ints(4, "steps") or [1] * len(starts)
    out = x
    for s, e, a, st in zip(starts, ends, axes, steps, strict=False):
        if st == 0:
            raise unsupported("Slice step 0")
        dim = norm_axis(a, x.rank)
        # ONNX clamps like Python slicing; INT64_MAX / INT64_MIN ends mean "to the end".
        big = 1 << 62
        e = max(min(e, big), -big)
        s = max(min(s, big), -big)
        out = slice_axis(ctx, out, dim, s, e, st)
    return out


def _split_sizes(ctx: OnnxCtx, size: int, n_out: int) -> list[int]:
    sizes = ctx.ints(1, "split") if ctx.has(1) else None
    if sizes is None and ctx.has_attr("split"):
        sizes = [int(s) for s in ctx.attr("split")]
    if sizes is None:
        n = int(ctx.attr("num_outputs", n_out))
        chunk = -(-size // n)
        sizes = [min(chunk, size - i * chunk) for i in range(n)]
    return sizes


@onnx_op("Split")
def _split(ctx: OnnxCtx) -> list[TV]:
    x = ctx.tensor(0)
    dim = norm_axis(int(ctx.attr("axis", 0)), x.rank)
    sizes = _split_sizes(ctx, x.shape[dim], len(ctx.node.output))
    outs, start = [], 0
    for s in sizes:
        outs.append(slice_axis(ctx, x, dim, start, start + s, 1))
        start += s
    return outs


def _gather_indices(ctx: OnnxCtx, idx: TV, size: int) -> TV:
    # ONNX allows negative indices; torch's index ops do not, so wrap them (a constant folds away).
    c = ctx.const(1)
    if c is not None:
        return idx if bool(np.all(c >= 0)) else ctx.add("remainder", (idx, ctx.scalar(size, idx.dtype)))
    neg = ctx.add("lt", (idx, ctx.scalar(0, idx.dtype)))
    return ctx.add("where", (neg, ctx.add("add", (idx, ctx.scalar(size, idx.dtype))), idx))


@onnx_op("Gather")
def _gather(ctx: OnnxCtx) -> TV:
    x = ctx.tensor(0)
    dim = norm_axis(int(ctx.attr("axis", 0)), x.rank)
    c = ctx.const(1)
    if c is not None and c.ndim == 0:
        i = int(c)
        if not -x.shape[dim] <= i < x.shape[dim]:
            raise unsupported(f"Gather index {i} out of range for size {x.shape[dim]}")
        return ctx.add("select", (x,), {"dim": dim, "index": i % x.shape[dim]})
    idx = ctx.tensor(1)
    if idx.dtype not in (DType.int64, DType.int32):
        raise unsupported(f"Gather indices of type {idx.dtype.short}")
    idx = _gather_indices(ctx, ctx.cast(idx, DType.int64), x.shape[dim])
    flat = ctx.reshape(idx, (idx.type.numel,))
    out = ctx.add("index_select", (x, flat), {"dim": dim})
    return ctx.reshape(out, x.shape[:dim] + idx.shape + x.shape[dim + 1 :])


@onnx_op("GatherElements")
def _gather_elements(ctx: OnnxCtx) -> TV:
    x = ctx.tensor(0)
    dim = norm_axis(int(ctx.attr("axis", 0)), x.rank)
    idx = _gather_indices(ctx, ctx.cast(ctx.tensor(1), DType.int64), x.shape[dim])
    return ctx.add("gather", (x, idx), {"dim": dim})


def _axes(ctx: OnnxCtx) -> list[int] | None:
    if ctx.has(1):
        return ctx.ints(1, "axes")
    a = ctx.attr("axes")
    return None if a is None else [int(v) for v in a]


@onnx_op("Squeeze")
def _squeeze(ctx: OnnxCtx) -> TV:
    x = ctx.tensor(0)
    axes = _axes(ctx)
    drop = {norm_axis(a, x.rank) for a in axes} if axes else {i for i, s in enumerate(x.shape) if s == 1}
    if any(x.shape[d] != 1 for d in drop):
        raise unsupported(f"Squeeze of a dim whose size is not 1 (shape {x.shape}, axes {sorted(drop)})")
    return ctx.reshape(x, [s for i, s in enumerate(x.shape) if i not in drop])


@onnx_op("Unsqueeze")
def _unsqueeze(ctx: OnnxCtx) -> TV:
    x = ctx.tensor(0)
    axes = _axes(ctx) or []
    rank = x.rank + len(axes)
    new = sorted(norm_axis(a, rank) for a in axes)
    shape, it = [], iter(x.shape)
    for i in range(rank):
        shape.append(1 if i in new else next(it))
    return ctx.reshape(x, shape)


@onnx_op("Expand")
def _expand(ctx: OnnxCtx) -> TV:
    x = ctx.tensor(0)
    spec = ctx.ints(1, "shape")
    assert spec is not None
    shape = broadcast_shapes(x.shape, tuple(spec))  # ONNX Expand broadcasts both ways
    if len(shape) > x.rank:
        x = ctx.reshape(x, (1,) * (len(shape) - x.rank) + x.shape)
    return x if x.shape == shape else ctx.add("expand", (x,), {"shape": shape})


@onnx_op("Pad")
def _pad(ctx: OnnxCtx) -> TV:
    x = ctx.tensor(0)
    if ctx.attr("mode", "constant") != "constant":
        raise unsupported(f"Pad mode {ctx.attr('mode')!r} (only constant padding has an IR op)")
    pads = ctx.ints(1, "pads") if ctx.has(1) else [int(p) for p in ctx.attr("pads", [])]
    assert pads is not None
    value = 0.0
    if ctx.has(2):
        c = ctx.const(2)
        if c is None:
            raise unsupported("Pad value computed at run time")
        value = c.reshape(-1)[0].item() if c.size else 0.0
    axes = ctx.ints(3, "axes") or list(range(x.rank))
    n = len(axes)
    lo, hi = [0] * x.rank, [0] * x.rank
    for k, a in enumerate(axes):
        d = norm_axis(a, x.rank)
        lo[d], hi[d] = pads[k], pads[k + n]
    if any(p < 0 for p in lo + hi):
        raise unsupported("negative padding (cropping)")
    aten: list[int] = []
    for d in reversed(range(x.rank)):
        aten += [lo[d], hi[d]]
    while aten and aten[-2:] == [0, 0]:
        aten = aten[:-2]
    if not aten:
        return x
    return ctx.add(
        "pad", (x,), {"pads": tuple(aten), "value": float(value) if x.dtype.is_float else int(value)}
    )
