"""Tiling: how a kernel's iteration space is cut into parallel blocks within the on-chip budget.

In: a lowered kernel and a hardware profile. Out: a `Tile`. Reductions keep whole rows per block
(persistent when a row of every input fits the budget, so it is read from memory once and re-read
from cache by later stages; otherwise each stage streams the row again). Pointwise kernels take inner
blocks of as many elements as the budget holds across all their buffers, rounded to the vector width.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from autofusion.hw.profile import HardwareProfile
from autofusion.plan.lower import LoopKernel


@dataclass(frozen=True)
class Tile:
    rows_per_block: int = 1
    inner_block: int = 4096
    persistent: bool = True  # a reduction row fits the budget: the input is read from memory once
    live_bytes: int = 0  # on-chip bytes a block keeps live
    budget_bytes: int = 0


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
        # Enough rows per block to amortise the parallel split, few enough to keep every core busy.
        per_block = max(1, min(budget // max(row, 1), rows // max(profile.cores * 4, 1)))
        return Tile(per_block, _numel(k.space[k.n_outer :]), row <= budget, row, budget)
    itemsizes = sum(b.type.dtype.itemsize for b in k.buffers)
    block = max(profile.vector_bytes, (budget // max(itemsizes, 1)) // profile.vector_bytes * profile.vector_bytes)
    return Tile(1, block, True, block * itemsizes, budget)


