"""Float max/min accumulators whose NaN flag no output can observe.

In: a lowered reduction kernel. Out: the names of its float amax/amin accumulators that may ignore NaN.

A float max or min keeps a flag beside its value, set by any NaN it sees, because eager's max of a row
with a NaN is NaN and a compare-and-select drops it. The flag costs the max loop three of its four
vector operations per vector (a compare, a masked move and an or, against one vmaxps), and its fold.
Softmax's max never reaches an output on its own: each output is exp(x - max) over the row's sum, and
a NaN anywhere in the row makes that sum NaN, hence every output, whatever the max was. So the flag
may go where this holds: a value is *tainted* where it is NaN at the positions the max's input is NaN
(the max's input itself, recomputed in any stage as the same expression, and what NaN-propagating
arithmetic makes of it); a float sum of a tainted value over the row is NaN for the whole row, and so
is NaN-propagating arithmetic on it (*row-NaN*). If every value the kernel stores is row-NaN, a row
with a NaN gives all-NaN outputs without the flag, and a row without one never sets it: the results
are the same bits. Compare-and-select ops (max, where, relu ...) and anything else are not counted as
propagating, so any doubt keeps the flag.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from autofusion.kernel.lower import LoopKernel, Stmt, StmtKind

# ops whose result is NaN when any argument is NaN (IEEE arithmetic, no compare or select)
_PROPAGATING = frozenset({"add", "sub", "mul", "div", "neg", "exp", "log"})


def _propagates(s: Stmt) -> bool:
    """Whether the float result of compute statement `s` is NaN when an argument is (a cast between
    float types keeps NaN: a half softmax's result is cast back to its type)."""
    if not s.dtype.is_float:
        return False
    src = s.attrs.get("in_dtype")
    return s.op in _PROPAGATING or (s.op == "cast" and src is not None and src.is_float)


def _keys(k: LoopKernel) -> dict[str, Any]:
    """A structural key per variable: equal keys compute the same value at the same position."""
    keys: dict[str, Any] = {}
    for s in k.all_stmts():
        if s.kind is StmtKind.LOAD and s.offset is not None:
            keys[s.var] = ("load", s.buf, s.offset.key())
        elif s.kind is StmtKind.LITERAL:
            keys[s.var] = ("lit", repr(s.value), s.dtype)
        elif s.kind is StmtKind.COMPUTE and all(a in keys for a in s.args):
            attrs = tuple(sorted((n, repr(v)) for n, v in s.attrs.items()))
            keys[s.var] = ("op", s.op, s.dtype, attrs, tuple(keys[a] for a in s.args))
    return keys


def nan_blind_accumulators(k: LoopKernel) -> frozenset[str]:
    """The float amax/amin accumulators of `k` that need no NaN flag (module docstring)."""
    stmts = k.all_stmts()
    stores = [s.var for s in stmts if s.kind is StmtKind.STORE]
    if not stores:
        return frozenset()
    keys = _keys(k)
    blind = set()
    for acc in k.accumulators:
        if acc.op not in ("amax", "amin") or not acc.dtype.is_float:
            continue
        arg = next(s.args[0] for s in stmts if s.kind is StmtKind.ACC and s.var == acc.var)
        key = keys.get(arg)
        if key is None:
            continue
        tainted = {v for v, kk in keys.items() if kk == key}
        row_nan: set[str] = set()
        carried: dict[str, str] = {}  # row buffer -> the variable stored in it
        for s in stmts:  # statements are in dependency order: stages, then post
            if s.kind is StmtKind.ROWSTORE:
                carried[str(s.value)] = s.var
            elif s.kind is StmtKind.ROWLOAD:
                src = carried.get(str(s.value), "")
                if src in tainted:
                    tainted.add(s.var)
                if src in row_nan:
                    row_nan.add(s.var)
            elif s.kind is StmtKind.ACC and s.op == "sum" and s.dtype.is_float and s.args[0] in tainted:
                row_nan.add(s.var)
            elif s.kind is StmtKind.COMPUTE and _propagates(s):
                if any(a in row_nan for a in s.args):
                    row_nan.add(s.var)
                elif any(a in tainted for a in s.args):
                    tainted.add(s.var)
        if all(v in row_nan for v in stores):
            blind.add(acc.var)
    return frozenset(blind)


def drop_nan_flags(k: LoopKernel) -> LoopKernel:
    """`k` with the NaN flags of `nan_blind_accumulators` switched off."""
    blind = nan_blind_accumulators(k)
    if not blind:
        return k
    accs = tuple(dataclasses.replace(a, nan_flag=False) if a.var in blind else a for a in k.accumulators)
    return dataclasses.replace(k, accumulators=accs)
