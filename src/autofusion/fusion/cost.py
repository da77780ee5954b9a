"""The fusion cost model and the tile chooser.

In: a hardware profile and lowered kernels (kernel/lower.py). Out: `Estimate`s (bytes moved, flops,
launches, time) per kernel, and for a candidate merge a `Benefit` with the five terms of the seed:

    T_mem_saved + T_sched_saved + T_ilp_gain  vs  T_reg_spill + T_tile_overhead

T_mem_saved: bytes that no longer go through memory (an intermediate written once and read once by
each consuming kernel) over the profile's bandwidth. T_sched_saved: one dispatch less. T_ilp_gain:
the shorter of the two kernels' compute times overlaps with the other's memory time. T_reg_spill:
live values in the fused loop body beyond the vector registers, spilled and reloaded per element.
T_tile_overhead: a reduction row that does not fit the on-chip budget is re-read from memory once per
extra stage; a multi-output kernel writes an intermediate it also consumes.
The model is analytic (a roofline); a measured calibration can replace it behind the same functions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from autofusion.fusion.records import Benefit as Benefit  # defined there, re-exported
from autofusion.hw.profile import HardwareProfile
from autofusion.kernel.lower import LoopKernel
from autofusion.kernel.tile import Tile, choose_tile, row_bytes

VECTOR_REGISTERS = 16  # AVX2 ymm registers (and a safe floor for the other profiles)


@dataclass(frozen=True)
class Estimate:
    bytes: int
    flops: int
    launches: int
    seconds: float


def _numel(shape: tuple[int, ...]) -> int:
    return math.prod(shape)


def kernel_bytes(k: LoopKernel) -> int:
    return sum(b.type.nbytes for b in k.buffers)


def kernel_flops(k: LoopKernel) -> int:
    per_point = sum(1 for s in k.all_stmts() if s.kind in ("compute", "acc"))
    return per_point * _numel(k.space)


def estimate(k: LoopKernel, profile: HardwareProfile, tile: Tile | None = None) -> Estimate:
    tile = tile or choose_tile(k, profile)
    moved = kernel_bytes(k)
    if k.is_reduction and not tile.persistent:
        moved += (len(k.stages) - 1) * row_bytes(k) * max(1, _numel(k.space[: k.n_outer]))
    flops = kernel_flops(k)
    fp32 = profile.peak_flops.get("fp32", 1e11)
    seconds = max(moved / profile.memory_bandwidth, flops / fp32) + profile.dispatch_overhead_s
    return Estimate(moved, flops, 1, seconds)


def live_values(k: LoopKernel) -> int:
    """Values alive at once in the widest stage body (a register-pressure proxy)."""
    return max((sum(1 for s in stage if s.kind in ("load", "compute")) for stage in k.stages), default=0)


def merge_benefit(a: LoopKernel, b: LoopKernel, fused: LoopKernel, profile: HardwareProfile) -> Benefit:
    bw = profile.memory_bandwidth
    ea, eb = estimate(a, profile), estimate(b, profile)
    tile = choose_tile(fused, profile)
    ef = estimate(fused, profile, tile)
    mem_saved = max(0, ea.bytes + eb.bytes - kernel_bytes(fused)) / bw
    fp32 = profile.peak_flops.get("fp32", 1e11)
    ilp = min(ea.flops, eb.flops) / fp32
    spill_values = max(0, live_values(fused) - VECTOR_REGISTERS)
    reg_spill = spill_values * 2 * 4 * _numel(fused.space) / (bw * 8)  # spills hit L1, ~8x memory bandwidth
    extra = ef.bytes - kernel_bytes(fused)
    tile_overhead = extra / bw
    return Benefit(mem_saved, profile.dispatch_overhead_s, ilp, reg_spill, tile_overhead)


def gemm_seconds(m: int, n: int, k: int, profile: HardwareProfile, cores: int) -> float:
    """A roofline for one fp32 GEMM on `cores` of the profile's cores (weights, inputs, output). One
    core alone reaches neither the peak FLOP/s nor the memory bandwidth: both scale with the cores."""
    share = cores / max(1, profile.cores)
    fp32 = profile.peak_flops.get("fp32", 1e11) * share
    moved = 4 * (m * k + k * n + m * n)
    return max(2 * m * n * k / fp32, moved / (profile.memory_bandwidth * share))


def gemm_epilogue_benefit(m: int, n: int, k: int, blocks: int, y_out: bool, profile: HardwareProfile,
                          whole: bool = False) -> Benefit:  # fmt: skip
    """The GEMM run per block of output rows inside its epilogue kernel, against one library call and
    a separate epilogue pass.

    Saved: the epilogue's read of the GEMM output from memory (and its write too when nothing else
    reads it: each thread then keeps its block in a scratch buffer that stays in cache) and one
    dispatch. Paid (`tile_overhead`): with fewer blocks than cores the GEMM runs on fewer cores (one
    call per block, each on one thread); every block past a core's first reads the weights again
    (from the shared cache, taken at four times the memory bandwidth); each BLAS call costs about one
    dispatch."""
    y_bytes = 4 * m * n
    bw = profile.memory_bandwidth
    mem_saved = y_bytes * (1 if y_out else 2) / bw
    cores = max(1, profile.cores)
    used = min(blocks, cores)
    lost = gemm_seconds(m, n, k, profile, used) - gemm_seconds(m, n, k, profile, cores)
    rereads = max(0, -(-blocks // cores) - 1) * 4 * k * n / (4 * bw)
    calls = blocks * profile.dispatch_overhead_s * 0.1  # a BLAS call is a C call: ~1/10 of a dispatch
    return Benefit(mem_saved, profile.dispatch_overhead_s, 0.0, 0.0, lost + rereads + calls)
