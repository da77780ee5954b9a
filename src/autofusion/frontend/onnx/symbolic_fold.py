"""Shape arithmetic on values that hold symbolic sizes (`ir.symbolic.SymInt`), folded at import.

An exported model computes the shapes it reshapes to from its inputs' dims: Shape -> Gather ->
Unsqueeze -> Concat -> Reshape, with Mul/Div/Sub/Where on the way. With symbolic input dims the Shape
converter returns an object array of SymInts; these ops are evaluated again here, on object arrays,
so their results keep saying how they follow from the dims (`Val.sym`). The numeric result (the
hints') comes from onnx's reference evaluator as for any folded node; this one must agree with it,
entry by entry, or it is dropped (the value is then fixed to the hint, which the template's checks
catch: `frontend/onnx/symbolic.py`). An op not listed here gives no symbolic result either.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
from onnx import helper

from autofusion.frontend.onnx.context import Val
from autofusion.ir.symbolic import SymInt


def _sym(v: Val | None) -> np.ndarray | None:
    """The value as an object array (plain ints where it holds no symbol)."""
    if v is None or v.const is None:
        return None
    if v.sym is not None:
        return v.sym
    arr = np.asarray(v.const)
    if arr.dtype.kind not in "iub":
        return None
    out = np.empty(arr.shape, dtype=object)
    out.reshape(-1)[:] = [int(x) for x in arr.reshape(-1)]
    return out


def _ints(v: Val | None) -> list[int] | None:
    return None if v is None or v.const is None else [int(x) for x in np.asarray(v.const).reshape(-1)]


def _norm(axes: Sequence[int], rank: int) -> list[int]:
    return [a % rank if rank else 0 for a in axes]


def fold_symbolic(node: onnx.NodeProto, ins: list[Val | None], numeric: list[np.ndarray]) -> list[np.ndarray]:
    """`numeric` (the folded outputs) with the first one as a SymInt object array where the op keeps
    symbols; unchanged otherwise."""
    try:
        sym = _evaluate(node, ins)
    except (ValueError, IndexError, TypeError, ZeroDivisionError):
        return numeric
    if sym is None or not numeric:
        return numeric
    want = np.asarray(numeric[0])
    sym = np.asarray(sym, dtype=object)
    if sym.shape != want.shape or want.dtype.kind not in "iu":
        return numeric
    if [int(x) for x in sym.reshape(-1)] != [int(x) for x in want.reshape(-1)]:
        return numeric
    if not any(isinstance(x, SymInt) for x in sym.reshape(-1)):
        return numeric
    return [sym, *numeric[1:]]


def _evaluate(node: onnx.NodeProto, ins: list[Val | None]) -> np.ndarray | None:
    attrs: dict[str, Any] = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    op = node.op_type
    x = _sym(ins[0]) if ins else None
    if op in ("Identity",):
        return x
    if op == "Cast":
        to = attrs.get("to")
        return x if to in (onnx.TensorProto.INT64, onnx.TensorProto.INT32) else None
    if x is None:
        return None
    if op == "Gather":
        idx = np.asarray(ins[1].const) if len(ins) > 1 and ins[1] is not None else None
        if idx is None:
            return None
        return np.take(x, idx.astype(np.int64), axis=int(attrs.get("axis", 0)))
    if op in ("Unsqueeze", "Squeeze"):
        axes = _ints(ins[1]) if len(ins) > 1 and ins[1] is not None else attrs.get("axes")
        if op == "Unsqueeze":
            assert axes is not None
            out = x
            for a in sorted(_norm(axes, x.ndim + len(axes))):
                out = np.expand_dims(out, a)
            return out
        return np.squeeze(x, axis=None if axes is None else tuple(_norm(axes, x.ndim)))
    if op == "Concat":
        parts = [_sym(v) for v in ins if v is not None]
        if any(p is None for p in parts):
            return None
        return np.concatenate(parts, axis=int(attrs["axis"]))  # type: ignore[arg-type]
    if op == "Reshape":
        shape = np.asarray(ins[1].const).reshape(-1) if ins[1] is not None else None
        if shape is None or any(int(s) == 0 for s in shape):
            return None
        return x.reshape([int(s) for s in shape])
    if op == "Slice":
        starts, ends = _ints(ins[1]), _ints(ins[2])
        axes = _ints(ins[3]) if len(ins) > 3 and ins[3] is not None else list(range(len(starts or [])))
        steps = _ints(ins[4]) if len(ins) > 4 and ins[4] is not None else [1] * len(starts or [])
        if starts is None or ends is None or axes is None or steps is None:
            return None
        index: list[slice] = [slice(None)] * x.ndim
        for s, e, a, st in zip(starts, ends, _norm(axes, x.ndim), steps, strict=True):
            index[a] = slice(s, e, st)
        return x[tuple(index)]
    if op in ("Add", "Sub", "Mul", "Div", "Mod", "Max", "Min"):
        ys = [_sym(v) for v in ins[1:] if v is not None]
        if any(y is None for y in ys):
            return None
        out = x
        for y in ys:
            assert y is not None
            if op == "Add":
                out = out + y
            elif op == "Sub":
                out = out - y
            elif op == "Mul":
                out = out * y
            elif op == "Div":  # sizes are non-negative: integer Div truncates as floor division does
                out = out // y
            elif op == "Mod":
                out = out % y
            elif op == "Max":
                out = np.where(out >= y, out, y)
            else:
                out = np.where(out <= y, out, y)
        return out
    if op in ("Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual"):
        # Bool results carry no sizes; comparing the SymInts records the guards the decision takes.
        y = _sym(ins[1]) if len(ins) > 1 else None
        if y is not None:
            cmp = {"Equal": np.equal, "Less": np.less, "Greater": np.greater, "LessOrEqual": np.less_equal,
                   "GreaterOrEqual": np.greater_equal}[op]  # fmt: skip
            cmp(x, y)
        return None
    if op == "Where":
        cond = np.asarray(ins[0].const) if ins[0] is not None else None
        left, right = (_sym(ins[1]), _sym(ins[2])) if len(ins) > 2 else (None, None)
        if cond is None or left is None or right is None:
            return None
        return np.where(cond.astype(bool), left, right)
    if op == "Expand":
        target = _ints(ins[1]) if len(ins) > 1 else None
        return None if target is None else x * np.ones(target, dtype=np.int64).astype(object)
    return None
