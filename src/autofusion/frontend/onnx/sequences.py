"""ONNX sequences inside a graph: a sequence is a list of values known at import (its length and each
element's type; the elements themselves may be computed at run time), so the ops on it are resolved
while converting and only tensors reach the IR.

SequenceConstruct, SequenceEmpty, SequenceInsert, SequenceErase, SequenceAt, SequenceLength,
SplitToSequence and ConcatFromSequence are taken, with positions and split sizes known at import. A
sequence that leaves the graph (a graph output), comes in (a graph input), or is read by anything else
(an If branch, a Loop body, an op without a converter here) is an error that names it: autofusion's
graphs hold tensors only.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from autofusion.frontend.onnx.context import OnnxCtx, Result, Val, array_type, dtype_of, norm_axis, onnx_op
from autofusion.frontend.torch.context import TV, unsupported
from autofusion.ir.dtypes import DType
from autofusion.ir.types import TensorType

_EMPTY = TensorType(DType.float32, (0,))  # what `Val.type` holds for a sequence: never read as a tensor


@dataclass
class SeqVal(Val):
    """A sequence value: its elements, in order, and their element type."""

    items: list[Val] = field(default_factory=list)
    dtype: DType = DType.float32


def is_sequence(v: object) -> bool:
    return isinstance(v, SeqVal)


def _seq(items: list[Val], dtype: DType) -> SeqVal:
    return SeqVal(_EMPTY, items=items, dtype=dtype)


def _input_seq(ctx: OnnxCtx, i: int) -> SeqVal:
    v = ctx.ins[i] if i < len(ctx.ins) else None
    if not isinstance(v, SeqVal):
        raise unsupported(f"input {i} is not a sequence")
    return v


def _result(ctx: OnnxCtx, v: Val, name: str) -> Result:
    """An element as a converter result: its IR value, or its contents when known at import."""
    if v.tv is not None:
        return v.tv
    if v.const is not None:
        return v.const
    return ctx.materialise(v, name)


def _position(ctx: OnnxCtx, i: int, n: int, default: int, insert: bool) -> int:
    got = ctx.ints(i, "position")
    pos = default if got is None else got[0]
    hi = n if insert else n - 1
    if not -n <= pos <= hi:
        raise unsupported(f"position {pos} out of range for a sequence of {n}")
    return pos + n if pos < 0 else pos


@onnx_op("SequenceConstruct")
def _construct(ctx: OnnxCtx) -> SeqVal:
    items = [v for v in ctx.ins if v is not None]
    dtypes = {v.type.dtype for v in items}
    if len(dtypes) != 1:
        raise unsupported(f"a sequence of elements of types {sorted(d.short for d in dtypes)}")
    return _seq(items, dtypes.pop())


@onnx_op("SequenceEmpty")
def _empty(ctx: OnnxCtx) -> SeqVal:
    return _seq([], dtype_of(int(ctx.attr("dtype", 1)), f"{ctx.node.op_type} dtype"))


@onnx_op("SequenceLength")
def _length(ctx: OnnxCtx) -> np.ndarray:
    return np.array(len(_input_seq(ctx, 0).items), dtype=np.int64)


@onnx_op("SequenceAt")
def _at(ctx: OnnxCtx) -> Result:
    seq = _input_seq(ctx, 0)
    if not seq.items:
        raise unsupported("SequenceAt of an empty sequence")
    return _result(ctx, seq.items[_position(ctx, 1, len(seq.items), 0, False)], ctx.node.output[0])


@onnx_op("SequenceInsert")
def _insert(ctx: OnnxCtx) -> SeqVal:
    seq, v = _input_seq(ctx, 0), ctx.ins[1]
    assert v is not None
    if seq.items and v.type.dtype is not seq.dtype:
        raise unsupported(f"inserting a {v.type.dtype.short} tensor into a sequence of {seq.dtype.short}")
    pos = _position(ctx, 2, len(seq.items), len(seq.items), True)
    return _seq([*seq.items[:pos], v, *seq.items[pos:]], v.type.dtype)


@onnx_op("SequenceErase")
def _erase(ctx: OnnxCtx) -> SeqVal:
    seq = _input_seq(ctx, 0)
    if not seq.items:
        raise unsupported("SequenceErase of an empty sequence")
    pos = _position(ctx, 1, len(seq.items), -1, False)
    return _seq(seq.items[:pos] + seq.items[pos + 1 :], seq.dtype)


@onnx_op("SplitToSequence")
def _split(ctx: OnnxCtx) -> SeqVal:
    t = ctx.type(0)
    axis = norm_axis(int(ctx.attr("axis", 0)), t.rank)
    size = t.shape[axis]
    split = ctx.ints(1, "split")
    keep = bool(ctx.attr("keepdims", 1))
    if split is None:
        sizes, squeeze = [1] * size, not keep
    elif ctx.type(1).rank == 0:  # one size: equal chunks, the last one smaller
        if split[0] <= 0:
            raise unsupported(f"split size {split[0]}")
        sizes, squeeze = [min(split[0], size - s) for s in range(0, size, split[0])], False
    else:
        if sum(split) != size:
            raise unsupported(f"split sizes {split} do not add up to {size}")
        sizes, squeeze = list(split), False
    items: list[Val] = []
    start = 0
    x = ctx.const(0)
    for n in sizes:
        if x is not None:
            part = np.take(x, range(start, start + n), axis=axis)
            arr = np.squeeze(part, axis) if squeeze else part
            items.append(Val(array_type(arr), const=arr))
        else:
            piece = ctx.add(
                "slice", (ctx.tensor(0),), {"dim": axis, "start": start, "end": start + n, "step": 1}
            )
            if squeeze:
                piece = ctx.reshape(piece, piece.shape[:axis] + piece.shape[axis + 1 :])
            items.append(Val(piece.type, tv=piece))
        start += n
    return _seq(items, t.dtype)


@onnx_op("ConcatFromSequence")
def _concat(ctx: OnnxCtx) -> Result:
    seq = _input_seq(ctx, 0)
    if not seq.items:
        raise unsupported("ConcatFromSequence of an empty sequence")
    new_axis = bool(ctx.attr("new_axis", 0))
    rank = seq.items[0].type.rank
    axis = norm_axis(int(ctx.attr("axis")), rank + 1 if new_axis else rank)
    if all(v.const is not None for v in seq.items):
        arrays = [np.asarray(v.const) for v in seq.items]
        return np.stack(arrays, axis) if new_axis else np.concatenate(arrays, axis)
    parts: list[TV] = []
    for k, v in enumerate(seq.items):
        tv = ctx.materialise(v, f"{ctx.node.input[0]}_{k}")
        if new_axis:
            tv = ctx.reshape(tv, (*tv.shape[:axis], 1, *tv.shape[axis:]))
        parts.append(tv)
    return parts[0] if len(parts) == 1 else ctx.add("concat", parts, {"dim": axis})
