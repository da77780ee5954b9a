"""Tiling: how a kernel's iteration space is cut into parallel blocks within the on-chip budget.

In: a lowered kernel and a hardware profile. Out: a `Tile`. Reductions keep whole rows per block
(persistent when a row of every input fits the budget, so it is read from memory once and re-read
from cache by later stages; otherwise each stage streams the row again). Pointwise kernels take inner
blocks of as many elements as the budget holds across all their buffers, rounded to the vector width.

Long reduction rows. Each row is reduced in blocks of `reduce_block` elements: a block accumulates in
vector lanes, and the block results are added in order into a wider total (double for float sums), so
the rounding error stays that of one block instead of growing with the row (the role of torch's
cascade sum). When there are fewer rows than threads can share (`split_rows`), every row's blocks are
split across the threads instead of giving each thread whole rows; the block results are then
combined in block order, so the result does not depend on the thread count.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from autofusion.hw.profile import HardwareProfile
from autofusion.plan.lower import LoopKernel

REDUCE_BLOCK = 4096  # elements per accumulation block: 16 KiB of fp32, 256 adds per AVX-512 lane
SPLIT_MIN_ROW = 16384  # shorter rows are not worth a barrier per stage


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


def choose_tile(k: LoopKernel, profile: HardwareProfile) -> Tile:
    """Rows per block and the inner vector block, within the on-chip budget (seed 001: 80 %)."""
    budget = profile.budget_bytes
    if k.is_reduction:
        row = row_bytes(k)
        rows = max(1, _numel(k.space[: k.n_outer]))
        inner = _numel(k.space[k.n_outer :])
        # Enough rows per block to amortise the parallel split, few enough to keep every core busy.
        per_block = max(1, min(budget // max(row, 1), rows // max(profile.cores * 4, 1)))
        # Fewer rows than twice the cores leaves cores idle or unevenly loaded: share each row.
        split = profile.cores > 1 and rows < 2 * profile.cores and inner >= SPLIT_MIN_ROW
        return Tile(per_block, inner, row <= budget, row, budget, REDUCE_BLOCK, split)
    itemsizes = sum(b.type.dtype.itemsize for b in k.buffers)
    block = max(profile.vector_bytes, (budget // max(itemsizes, 1)) // profile.vector_bytes * profile.vector_bytes)
    return Tile(1, block, True, block * itemsizes, budget)
