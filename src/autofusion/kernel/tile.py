"""Tiling: how a kernel's iteration space is cut into parallel blocks within the on-chip budget.

In: a lowered kernel and a hardware profile. Out: a `Tile`. Reductions keep whole rows per block
(persistent when a row of every input fits the budget, so it is read from memory once and re-read
from cache by later stages; otherwise each stage streams the row again). Pointwise kernels take inner
blocks of as many elements as the budget holds across all their buffers, rounded to the vector width.

Long reduction rows. Each row is reduced in blocks of `reduce_block` elements: a block accumulates in
vector lanes, and the block results are added in order into a wider total (double for float sums), so
the rounding error stays that of one block instead of growing with the row (the role of torch's
cascade sum). When there are too few rows to keep every core busy (`split_rows`), every row's blocks
are split across the threads instead of giving each thread whole rows; the block results are then
combined in block order, so the result does not depend on the thread count. Splitting costs a team
barrier per reduction stage and row, so it is chosen when its estimated time beats whole rows':
rows * (t_row / cores + barriers * BARRIER_S) < ceil(rows / cores) * t_row, t_row being one row's
bytes over one core's share of the memory bandwidth, per stage.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from autofusion.hw.profile import HardwareProfile
from autofusion.kernel.lower import LoopKernel

REDUCE_BLOCK = 4096  # elements per accumulation block: 16 KiB of fp32, 256 adds per AVX-512 lane
SPLIT_MIN_ROW = 16384  # shorter rows are never worth a barrier per stage
BARRIER_S = 2e-6  # one OpenMP team barrier on an idle CPU (~0.5-2 us); a busy machine pays more


@dataclass(frozen=True)
class Tile:
    rows_per_block: int = 1
    inner_block: int = 4096
    persistent: bool = True  # a reduction row fits the budget: the input is read from memory once
    live_bytes: int = 0  # on-chip bytes a block keeps live
    budget_bytes: int = 0
    reduce_block: int = REDUCE_BLOCK  # reductions: elements per accumulation block (module docstring)
    split_rows: bool = False  # reductions: threads share each row instead of taking whole rows


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


def choose_tile(k: LoopKernel, profile: HardwareProfile) -> Tile:
    """Rows per block and the inner vector block, within the profile's on-chip budget."""
    budget = profile.budget_bytes
    if k.is_reduction:
        row = row_bytes(k)
        rows = max(1, _numel(k.space[: k.n_outer]))
        inner = _numel(k.space[k.n_outer :])
        # Enough rows per block to amortise the parallel split, few enough to keep every core busy.
        per_block = max(1, min(budget // max(row, 1), rows // max(profile.cores * 4, 1)))
        return Tile(
            per_block, inner, row <= budget, row, budget, REDUCE_BLOCK, _split_rows(k, profile, rows, row)
        )
    itemsizes = sum(b.type.dtype.itemsize for b in k.buffers)
    block = max(
        profile.vector_bytes, (budget // max(itemsizes, 1)) // profile.vector_bytes * profile.vector_bytes
    )
    return Tile(1, block, True, block * itemsizes, budget)
