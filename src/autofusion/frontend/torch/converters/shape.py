"""Converters for views, other injective ops and factories.

All view ops become `reshape`, `permute`, `expand`, `slice` or `select` on logical tensors: aliasing is
gone after export's functionalisation, so a view is just index arithmetic for the planner to fold.
Factories with static arguments become `full`/`arange`, never materialised constants.
"""

from __future__ import annotations

import math
from typing import Any

from autofusion.frontend.torch.context import TV, ConvCtx, converts, unsupported
from autofusion.ir.dtypes import DType
from autofusion.ir.symbolic import is_symbolic


def _infer_shape(shape: Any, numel: int) -> tuple[int, ...]:
    shape = [s if is_symbolic(s) else int(s) for s in shape]  # a symbolic size stays an expression
    if shape.count(-1) > 1:
        raise unsupported(f"shape {shape} has more than one -1")
    if -1 in shape:
        known = math.prod(s for s in shape if s != -1)
        shape[shape.index(-1)] = numel // known if known else 0
    return tuple(shape)


@converts("view", "_unsafe_view", "reshape", "view_copy", "_reshape_alias")
def _view(ctx: ConvCtx, a: dict[str, Any]) -> TV:
    x = a["self"]
    shape = a.get("size", a.get("shape"))
    return ctx.reshape(x, _infer_shape(shape, x.type.numel))


@converts("flatten")
def _flatten(ctx: ConvCtx, a: dict[str, Any]) -> TV:
    return ctx.reshape(a["self"], ctx.out_type.shape)


@converts("squeeze", "unsqueeze", "squeeze_copy", "unsqueeze_copy", "unflatten")
def _squeeze_unsqueeze(ctx: ConvCtx, a: dict[str, Any]) -> TV:
    # The output shape is fully determined by torch's meta; a reshape to it is exact.
    return ctx.reshape(a["self"], ctx.out_type.shape)


@converts("permute", "permute_copy")
def _permute(ctx: ConvCtx, a: dict[str, Any]) -> TV:
    x = a["self"]
    dims = tuple(d % max(x.rank, 1) for d in a["dims"])
    if dims == tuple(range(x.rank)):
        return x
    return ctx.add("permute", (x,), {"dims": dims})


@converts("transpose", "transpose_copy", "swapaxes")
def _transpose(ctx: ConvCtx, a: dict[str, Any]) -> TV:
    x = a["self"]
    d0, d1 = (a["dim0"], a["dim1"]) if "dim0" in a else (a["axis0"], a["axis1"])
    dims = list(range(x.rank))
    if x.rank:
        i, j = d0 % x.rank, d1 % x.rank
        dims[i], dims[j] = dims[j], dims[i]
    return _permute(ctx, {"self": x, "dims": dims})


@converts("t", "numpy_T")
def _t(ctx: ConvCtx, a: dict[str, Any]) -> TV:
    x = a["self"]
    return _permute(ctx, {"self": x, "dims": list(reversed(range(x.rank)))})


@converts("expand", "expand_copy", "broadcast_to")
def _expand(ctx: ConvCtx, a: dict[str, Any]) -> TV:
    x = a["self"]
    shape = tuple(ctx.out_type.shape)
    return x if x.shape == shape else ctx.add("expand", (x,), {"shape": shape})


def _indices(start: int | None, end: int | None, step: int, size: int) -> tuple[int, int, int]:
    """`slice(start, end, step).indices(size)` for step >= 1, keeping symbolic sizes expressions
    (`slice.indices` reads them as plain ints; min and max return one of their SymInt operands and
    record the comparison as a guard)."""
    if not any(is_symbolic(v) for v in (start, end, size)):
        return slice(start, end, step).indices(size)

    def clamp(v: int | None, default: int) -> int:
        if v is None:
            return default
        if v < 0:
            v = v + size
        return min(max(v, 0), size)

    return clamp(start, 0), clamp(end, size), step


def slice_value(ctx: ConvCtx, x: TV, dim: int, start: int | None, end: int | None, step: int = 1) -> TV:
    dim = dim % max(x.rank, 1)
    size = x.shape[dim]
    s, e, st = _indices(start, end, step, size)
    e = max(e, s)
    if (s, e, st) == (0, size, 1):
        return x
    return ctx.add("slice", (x,), {"dim": dim, "start": s, "end": e, "step": st})


@converts("slice", "slice_copy")
def _slice(ctx: ConvCtx, a: dict[str, Any]) -> TV:
    step = a.get("step", 1)
    if step is None or step < 1:
        raise unsupported(f"slice step {step}")
    return slice_value(ctx, a["self"], a.get("dim", 0), a.get("start"), a.get("end"), step)


@converts("narrow")
def _narrow(ctx: ConvCtx, a: dict[str, Any]) -> TV:
    x, dim, start = a["self"], a["dim"], a["start"]
    if isinstance(start, TV):
        raise unsupported("narrow with a tensor start")
    if start < 0:
        start += x.shape[dim % x.rank]
    return slice_value(ctx, x, dim, start, start + a["length"])


@converts("select", "select_copy")
def _select(ctx: ConvCtx, a: dict[str, Any]) -> TV:
    x = a["self"]
    dim = a["dim"] % max(x.rank, 1)
    return ctx.add("select", (x,), {"dim": dim, "index": a["index"] % x.shape[dim]})


def _split_at(ctx: ConvCtx, x: TV, sizes: list[int], dim: int) -> tuple[TV, ...]:
    outs, start = [], 0
    for s in sizes:
        outs.append(slice_value(ctx, x, dim, start, start + s))
        start += s
    return tuple(outs)


@converts("split", "split_with_sizes", "split_copy", "split_with_sizes_copy")
def _split(ctx: ConvCtx, a: dict[str, Any]) -> tuple[TV, ...]:
    x = a["self"]
    dim = a.get("dim", 0) % max(x.rank, 1)
    sizes = a.get("split_size", a.get("split_sizes"))
    if sizes is None:
        raise unsupported("split without split_size or split_sizes")
    if isinstance(sizes, int):
        total = x.shape[dim]
        sizes = [min(sizes, total - i) for i in range(0, total, sizes)] if sizes else [total]
    return _split_at(ctx, x, list(sizes), dim)


@converts("chunk")
def _chunk(ctx: ConvCtx, a: dict[str, Any]) -> tuple[TV, ...]:
    x = a["self"]
    dim = a.get("dim", 0) % max(x.rank, 1)
    sizes = [t.shape[dim] for t in ctx.expected if t is not None]
    return _split_at(ctx, x, sizes, dim)


@converts("unbind")
def _unbind(ctx: ConvCtx, a: dict[str, Any]) -> tuple[TV, ...]:
    x = a["self"]
    dim = a.get("dim", 0) % max(x.rank, 1)
    return tuple(ctx.add("select", (x,), {"dim": dim, "index": i}) for i in range(x.shape[dim]))


@converts("cat", "concat", "concatenate")
def _cat(ctx: ConvCtx, a: dict[str, Any]) -> TV:
    out = ctx.out_type
    # torch.cat skips legacy 1-d empty tensors whatever their rank; so do we.
    tensors = [
        ctx.cast(t, out.dtype)
        for t in a["tensors"]
        if not (t.rank == 1 and t.shape[0] == 0 and out.rank != 1)
    ]
    if not tensors:
        return ctx.add("full", (), {"value": 0, "dtype": out.dtype, "shape": out.shape})
    if len(tensors) == 1:
        return tensors[0]
    return ctx.add("concat", tensors, {"dim": a.get("dim", 0) % max(out.rank, 1)})


@converts("stack")
def _stack(ctx: ConvCtx, a: dict[str, Any]) -> TV:
    out = ctx.out_type
    dim = a.get("dim", 0) % out.rank
    parts = []
    for t in a["tensors"]:
        shape = list(t.shape)
        shape.insert(dim, 1)
        parts.append(ctx.reshape(ctx.cast(t, out.dtype), shape))
    return parts[0] if len(parts) == 1 else ctx.add("concat", parts, {"dim": dim})


@converts("constant_pad_nd")
def _pad(ctx: ConvCtx, a: dict[str, Any]) -> TV:
    pads = tuple(int(p) for p in a["pad"])
    if any(p < 0 for p in pads):
        raise unsupported("negative padding (cropping)")
    value = a.get("value", 0)
    x = a["self"]
    return ctx.add("pad", (x,), {"pads": pads, "value": float(value) if x.dtype.is_float else int(value)})


@converts("index_select")
def _index_select(ctx: ConvCtx, a: dict[str, Any]) -> TV:
    x, idx = a["self"], a["index"]
    idx = ctx.reshape(idx, (idx.type.numel,)) if idx.rank == 0 else idx
    # torch treats a 0-d tensor as one of one element here; the IR op wants the dim to exist.
    x = ctx.reshape(x, (1,)) if x.rank == 0 else x
    out = ctx.add("index_select", (x, idx), {"dim": a["dim"] % max(x.rank, 1)})
    return ctx.reshape(out, ctx.out_type.shape)


@converts("embedding")
def _embedding(ctx: ConvCtx, a: dict[str, Any]) -> TV:
    # padding_idx only matters for gradients; the forward is a plain row gather.
    w, idx = a["weight"], a["indices"]
    flat = ctx.reshape(idx, (idx.type.numel,))
    rows = ctx.add("index_select", (w, flat), {"dim": 0})
    return ctx.reshape(rows, (*idx.shape, w.shape[1]))


@converts("gather")
def _gather(ctx: ConvCtx, a: dict[str, Any]) -> TV:
    x = a["self"]
    return ctx.add("gather", (x, a["index"]), {"dim": a["dim"] % max(x.rank, 1)})


@converts("flip")
def _flip(ctx: ConvCtx, a: dict[str, Any]) -> TV:
    x = a["self"]
    return ctx.add("flip", (x,), {"dims": tuple(sorted(d % x.rank for d in a["dims"]))})


# ---- factories ---------------------------------------------------------------------------------


def _check_device(a: dict[str, Any]) -> None:
    device = a.get("device")
    if device is not None and str(device) != "cpu":
        raise unsupported(f"creates a tensor on device {device}")


@converts("full", "zeros", "ones", "empty", "scalar_tensor", "new_full", "new_zeros", "new_ones", "new_empty",
          "full_like", "zeros_like", "ones_like", "empty_like", "empty_strided",
          "empty_permuted")  # fmt: skip
def _full(ctx: ConvCtx, a: dict[str, Any]) -> TV:
    _check_device(a)
    out = ctx.out_type
    name = ctx.overload_packet
    if "zeros" in name or "empty" in name:
        value: Any = (
            0  # empty's contents are unspecified; zeros is a valid choice that keeps runs deterministic
        )
    elif "ones" in name:
        value = 1
    else:
        value = a.get("fill_value", a.get("s"))
    if isinstance(value, TV):
        raise unsupported("fill value is a tensor")
    v = bool(value) if out.dtype is DType.bool else int(value) if out.dtype.is_int else float(value)
    return ctx.add("full", (), {"value": v, "dtype": out.dtype, "shape": out.shape})


@converts("arange")
def _arange(ctx: ConvCtx, a: dict[str, Any]) -> TV:
    _check_device(a)
    out = ctx.out_type
    start = a.get("start", 0)
    end = a["end"]  # every arange overload has it
    step = a.get("step", 1)
    conv: Any = float if out.dtype.is_float else (lambda v: v if is_symbolic(v) else int(v))
    return ctx.add(
        "arange", (), {"start": conv(start), "end": conv(end), "step": conv(step), "dtype": out.dtype}
    )
