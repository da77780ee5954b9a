"""Row buffers that live in the output row: a carried value stored where the kernel's result goes.

In: a lowered reduction kernel run as rows (not columns). Out: the same kernel with each row buffer
that can do so replaced by the output row it is finally turned into.

A persistent row carries a value from an earlier stage to the last one in a per-thread scratch row
(softmax's exp(x - max) between its sum and the division; `lower.py`, `_carried`). The last stage
then reads the scratch row and writes the output row. Written that way the output row is only ever
stored to in a loop with almost no arithmetic, and every line of it is a fresh cache line to fetch
for ownership: on one Intel Xeon core that store loop took half of softmax's time over 4096 x 1024
rows (0.52 ns per element against 0.38 with the carried value stored into the output row in the exp
loop, where the stores overlap the exp's arithmetic; the last stage then reads and rewrites lines
already in L1). So where the last stage stores exactly one output element per row position, of the
scratch row's type, after reading the scratch row at that same position, the scratch row's stores
and loads address the output instead (the output buffer is the kernel's own, never an input).
Each position is read back before the last stage overwrites it (same iteration, load first), and no
other statement touches that output buffer, so the results are those of the scratch row, bit for bit.
"""

from __future__ import annotations

import dataclasses
import math

from autofusion.ir.dtypes import DType
from autofusion.kernel.lower import LoopKernel, Stmt, StmtKind

# Types whose in-register C type is the buffer's storage type (a half output stores a rounding of the
# float the scratch row holds, so it cannot hold that float).
_SAME_STORAGE = frozenset({DType.float32, DType.float64})


def _target(k: LoopKernel, name: str) -> Stmt | None:
    """The last stage's store that row buffer `name` can live in, or None."""
    final = k.stages[-1]
    rowloads = [n for n, s in enumerate(final) if s.kind is StmtKind.ROWLOAD and s.value == name]
    if not rowloads or any(s.kind is StmtKind.ROWSTORE and s.value == name for s in final):
        return None
    numel = math.prod(k.space)
    for n, s in enumerate(final):
        if s.kind is not StmtKind.STORE or s.offset is None or not s.offset.is_affine:
            continue
        buf = k.buffers[s.buf]
        if not buf.is_output or buf.type.numel != numel or buf.type.dtype not in _SAME_STORAGE:
            continue
        touching = [t for t in k.all_stmts() if t.buf == s.buf and t.kind in (StmtKind.LOAD, StmtKind.STORE)]
        if len(touching) == 1 and max(rowloads) < n:
            return s
    return None


def alias_output_rows(k: LoopKernel) -> LoopKernel:
    """`k` with its row buffers that can live in an output row moved there (module docstring)."""
    if not k.row_buffers or len(k.stages) < 2:
        return k
    moved: dict[str, Stmt] = {}
    for name, dt in k.row_buffers:
        store = _target(k, name)
        if (
            store is not None
            and store.dtype is dt
            and dt in _SAME_STORAGE
            and store.buf not in (t.buf for t in moved.values())
        ):
            moved[name] = store
    if not moved:
        return k

    def rewrite(s: Stmt) -> Stmt:
        store = moved.get(s.value) if s.kind in (StmtKind.ROWSTORE, StmtKind.ROWLOAD) else None
        if store is None:
            return s
        kind = StmtKind.STORE if s.kind is StmtKind.ROWSTORE else StmtKind.LOAD
        return dataclasses.replace(s, kind=kind, buf=store.buf, offset=store.offset, value=None)

    stages = tuple(tuple(rewrite(s) for s in st) for st in k.stages)
    kept = tuple((name, dt) for name, dt in k.row_buffers if name not in moved)
    return dataclasses.replace(k, stages=stages, row_buffers=kept)
