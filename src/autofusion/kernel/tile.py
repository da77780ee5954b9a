"""Tiling: how a kernel's iteration space is cut into parallel blocks within the on-chip budget.

In: a lowered kernel and a hardware profile. Out: a `Tile`. Reductions keep whole rows per block
(persistent when a row of every input fits the budget, so it is read from memory once and re-read
from cache by later stages; otherwise each stage streams the row again). Pointwise kernels take inner
blocks of as many elements as the budget holds across all their buffers, rounded to the vector width.

Long reduction rows. Each row is reduced in blocks of `reduce_block` elements, and the block results
are added in order into a wider total (double for float sums), so the rounding error stays that of one
block instead of growing with the row. Inside a block, a stage with a float sum keeps `reduce_lanes`
accumulators, each taking every `reduce_lanes`-th element (reduce_block / reduce_lanes = 16 additions
each), added pairwise at the end: a block's error is that of 16 sequential additions and a 6-level
tree, no more than torch's cascade sum (whose levels also add 16 terms each, into 4 vectors of
accumulators). One vector accumulator per block of 4096 (256 additions per lane, then the 16 lanes
one after another) lost 1.3-2.9x eager's error on sums of 10^3..10^6 terms. The order of additions is
fixed by the source, not by the vector width. The lanes stay in vector registers and do not wait on
one another's adds, so rows in cache reduce faster than with one accumulator; rows streamed from
memory about as fast (up to ~10% slower for two-pass rows of 1024, e.g. layer_norm). A row shorter
than a block takes fewer lanes: the fewest (a power of two, at least 16) that leave each no more
than those 16 additions (96..256 elements: 16 lanes, one vector), since every row folds its lanes once
per stage; and a row of one block keeps its total in float, which is exact (the double total adds one
value to 0). A float max or min takes the lanes too in rows longer than 4 groups of lanes, for
speed alone (it is exact in any order, but one vector accumulator is a chain of dependent max
instructions; in shorter rows the fold costs more). Stages with neither (prod, integer sums: exact
or not a cascade in eager either) and innermost loops of at most `reduce_lanes` elements keep one
simd loop.
When there are too few rows to keep every core busy (`split_rows`), every row's blocks
are split across the threads instead of giving each thread whole rows; the block results are then
combined in block order, so the result does not depend on the thread count. Splitting costs a team
barrier per reduction stage and row, so it is chosen when its estimated time beats whole rows':
rows * (t_row / cores + barriers * BARRIER_S) < ceil(rows / cores) * t_row, t_row being one row's
bytes over one core's share of the memory bandwidth, per stage.

Columns. A reduction over non-trailing dims whose input is contiguous along a kept dim (a sum over
dim 0 of a row-major matrix, softmax over the channels of NCHW) would walk each row with a stride: one
cache line per element. It runs as columns instead (`columns`): a block of `inner_block` adjacent
output elements keeps its accumulators in arrays, and the reduced dims are walked outside a simd loop
over the block, so every load is a unit-stride vector. The accuracy is the rows': reduced elements in
blocks of `reduce_block`, block results added in order in double; within a block, float sums are
added in `reduce_lanes` groups of reduce_block / reduce_lanes consecutive elements, each in turn,
and the group sums pairwise (a binary counter keeps the tree's partial sums, 7 per output element
instead of 64 lanes): the same 16 sequential additions and 6-level tree per block as the rows' lanes.
Blocks of columns run in parallel; when there are fewer of them than cores (a small
output over a long reduction), the threads split each column block's reduced blocks instead and the
block results are combined in block order, so the result does not depend on the thread count.

Forced tiles (`TileKnobs`, from `Options.tile_rows_per_block` / `tile_inner_block`, which
`autofusion tune` searches): a nonzero value replaces the tiler's choice where that parameter exists -
rows per block for reductions run as rows (the threads' static chunk of rows), the inner block for
pointwise kernels (elements per parallel block) and for reductions run as columns (outputs per column
block, at most MAX_COLUMN_BLOCK). Rows per block and the pointwise block reach the kernel as entries of
its parameter array (codegen), so the source and the built library are shared and the plan's
parameters differ; the column block is a literal of the source (stack arrays), so a library is built
per column block (the build cache keys on the source). The accumulation order does not
depend on them (reduce_block and reduce_lanes stay fixed), so neither do the results.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from autofusion.hw.profile import HardwareProfile
from autofusion.kernel.lower import LoopKernel

REDUCE_BLOCK = 1024  # elements per accumulation block (module docstring)
REDUCE_LANES = 64  # independent accumulators within a block: a power of two (their tree is pairwise)
# Output elements per column block: 1 kB of each reduced row per step, so a reduced dim strided by a
# page or more costs a TLB miss per 256 elements, not per 64; halved down to MIN_COLUMN_BLOCK while
# there are fewer than two blocks per core.
COLUMN_BLOCK = 256
MIN_COLUMN_BLOCK = 64
# A forced column block (TileKnobs) is cut to this: its per-column accumulator arrays live on the stack
# (cb + 7 * cb values per accumulator, render.py), and OpenMP's worker threads have small stacks.
MAX_COLUMN_BLOCK = 1024
SPLIT_MIN_ROW = 16384  # shorter rows are never worth a barrier per stage
BARRIER_S = 2e-6  # one OpenMP team barrier on an idle CPU (~0.5-2 us); a busy machine pays more
# Below this many elements a kernel runs on the calling thread: waking the OpenMP team costs more
# than the work, and on a busy machine a parallel region waits for a descheduled thread. (The renderer
# emits the test; the cost model counts such a kernel's work on one core.)
PARALLEL_MIN = 32768


@dataclass(frozen=True)
class Tile:
    """How a kernel's iteration space is split into blocks, and the on-chip bytes a block keeps live."""

    rows_per_block: int = 1
    inner_block: int = 4096
    persistent: bool = True  # a reduction row fits the budget: the input is read from memory once
    live_bytes: int = 0  # on-chip bytes a block keeps live
    budget_bytes: int = 0
    reduce_block: int = REDUCE_BLOCK  # reductions: elements per accumulation block (module docstring)
    reduce_lanes: int = REDUCE_LANES  # reductions: accumulators within a block (module docstring)
    split_rows: bool = False  # reductions: threads share each row instead of taking whole rows
    columns: bool = False  # reductions: blocks of inner_block kept elements walk the reduced dims (docstring)


@dataclass(frozen=True)
class TileKnobs:
    """Forced tile parameters (module docstring); 0 = the tiler's choice."""

    rows_per_block: int = 0
    inner_block: int = 0

    def __post_init__(self) -> None:
        if self.rows_per_block < 0 or self.inner_block < 0:
            raise ValueError(f"tile knobs must be >= 0 (0 = chosen), got {self}")


def _numel(shape: tuple[int, ...]) -> int:
    return math.prod(shape)


def row_bytes(k: LoopKernel) -> int:
    """Bytes of one reduction row of every input that varies along the reduced dims."""
    inner = _numel(k.space[k.n_outer :])
    return sum(inner * b.type.dtype.itemsize for b in k.buffers if not b.is_output and b.type.numel >= inner)


def _split_rows(k: LoopKernel, profile: HardwareProfile, rows: int, row: int) -> bool:
    """Whether sharing each row between the threads beats giving each thread whole rows (docstring)."""
    cores = profile.cores
    if cores <= 1 or _numel(k.space[k.n_outer :]) < SPLIT_MIN_ROW:
        return False
    t_row = len(k.stages) * row / (profile.memory_bandwidth / cores)
    barriers = len({a.stage for a in k.accumulators}) + 1
    return rows * (t_row / cores + barriers * BARRIER_S) < -(-rows // cores) * t_row


def _last_dim(k: LoopKernel, lo: int, hi: int) -> int | None:
    return next((d for d in range(hi - 1, lo - 1, -1) if k.space[d] != 1), None)


def column_run(k: LoopKernel) -> int:
    """The number of adjacent output elements a reduction runs as columns over (docstring), 0 when it
    runs as rows: its largest input that varies along the reduced dims must be contiguous along the
    innermost kept dim and not along the innermost reduced one. The run is that kept dim and the kept
    dims before it that the input steps through contiguously (the renderer's merged loop)."""
    if not k.is_reduction or not k.accumulators:
        return 0
    kept, red = _last_dim(k, 0, k.n_outer), _last_dim(k, k.n_outer, len(k.space))
    if kept is None or red is None:
        return 0
    loads = [s.offset for st in k.stages for s in st if s.kind == "load" and s.offset is not None]
    if any(not ix.is_affine for ix in loads):
        return 0  # gathers and clamped indices: the row loops handle their index variables
    stmts = [s for st in k.stages for s in st]
    varying = [(k.buffers[s.buf].type.numel, -n, s.offset) for n, s in enumerate(stmts)
               if s.kind == "load" and s.offset is not None and s.offset.coeff(red)]  # fmt: skip
    if not varying:
        return 0
    main = max(varying, key=lambda t: t[:2])[2]
    if main.coeff(kept) != 1 or main.coeff(red) == 1:
        return 0
    run, d = k.space[kept], kept
    while d > 0 and k.space[d - 1] == 1:
        d -= 1
    while d > 0 and main.coeff(d - 1) == run and all(o.coeff(d - 1) == o.coeff(kept) * run for o in loads):
        run *= k.space[d - 1]
        d -= 1
    return run


def strided_walk(k: LoopKernel) -> str | None:
    """Why a reduction over non-trailing dims would walk memory with a stride in both loop orders (its
    largest input contiguous along neither the innermost kept dim nor the innermost reduced one), or
    None. Such a kernel reads a cache line per element; the planner leaves the reduction to torch."""
    if not k.perm or column_run(k):
        return None
    red = _last_dim(k, k.n_outer, len(k.space))
    if red is None:
        return None
    loads = [(k.buffers[s.buf].type.numel, s.offset) for st in k.stages for s in st if s.kind == "load"]
    varying = [(n, ix) for n, ix in loads if ix is not None and ix.is_affine and ix.coeff(red)]
    if not varying or max(varying, key=lambda t: t[0])[1].coeff(red) == 1:
        return None
    dims = tuple(k.perm[k.n_outer :])
    return f"reduces dims {dims} of an input contiguous along neither its innermost kept nor reduced dim"


def _split_columns(k: LoopKernel, profile: HardwareProfile, blocks: int) -> bool:
    """Columns: whether the threads share each column block's reduced blocks (fewer blocks than cores)."""
    reduced = _numel(k.space[k.n_outer :])
    return profile.cores > 1 and blocks < profile.cores and reduced >= 2 * REDUCE_BLOCK


def choose_tile(k: LoopKernel, profile: HardwareProfile, knobs: TileKnobs | None = None) -> Tile:
    """Rows per block and the inner vector block, within the profile's on-chip budget; `knobs` forces
    either (module docstring)."""
    tile = _chosen_tile(k, profile)
    if knobs is None or not (knobs.rows_per_block or knobs.inner_block):
        return tile
    if k.is_reduction and tile.columns:
        if not knobs.inner_block:
            return tile
        cb = max(1, min(knobs.inner_block, column_run(k), MAX_COLUMN_BLOCK))
        row = tile.live_bytes // max(tile.inner_block, 1)
        return dataclasses.replace(tile, inner_block=cb, live_bytes=row * cb,
                                   persistent=row * cb <= tile.budget_bytes)  # fmt: skip
    if k.is_reduction:
        if not knobs.rows_per_block:
            return tile
        rows = max(1, _numel(k.space[: k.n_outer]))
        return dataclasses.replace(tile, rows_per_block=min(knobs.rows_per_block, rows))
    if not knobs.inner_block:
        return tile
    itemsizes = sum(b.type.dtype.itemsize for b in k.buffers)
    return dataclasses.replace(tile, inner_block=knobs.inner_block, live_bytes=knobs.inner_block * itemsizes)


def _chosen_tile(k: LoopKernel, profile: HardwareProfile) -> Tile:
    budget = profile.budget_bytes
    if k.is_reduction:
        row = row_bytes(k)
        rows = max(1, _numel(k.space[: k.n_outer]))
        inner = _numel(k.space[k.n_outer :])
        # Enough rows per block to amortise the parallel split, few enough to keep every core busy.
        per_block = max(1, min(budget // max(row, 1), rows // max(profile.cores * 4, 1)))
        run = column_run(k)
        if run:
            cb = min(COLUMN_BLOCK, run)
            while cb > MIN_COLUMN_BLOCK and rows // run * -(-run // cb) < 2 * profile.cores:
                cb //= 2
            blocks = rows // run * -(-run // cb)
            return Tile(1, cb, row * cb <= budget, row * cb, budget,
                        split_rows=_split_columns(k, profile, blocks), columns=True)  # fmt: skip
        return Tile(per_block, inner, row <= budget, row, budget,
                    split_rows=_split_rows(k, profile, rows, row))  # fmt: skip
    itemsizes = sum(b.type.dtype.itemsize for b in k.buffers)
    block = max(
        profile.vector_bytes, (budget // max(itemsizes, 1)) // profile.vector_bytes * profile.vector_bytes
    )
    return Tile(1, block, True, block * itemsizes, budget)
