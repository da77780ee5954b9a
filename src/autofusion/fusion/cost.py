"""The fusion cost model and the tile chooser.

In: a hardware profile and lowered kernels (kernel/lower.py). Out: `Estimate`s (bytes moved, flops,
launches, time) per kernel, and for a candidate merge a `Benefit` with the five terms of the seed:

    T_mem_saved + T_sched_saved + T_ilp_gain  vs  T_reg_spill + T_tile_overhead

Each kernel's time is the sum of its terms (fusion/terms.py: launch, memory by cache level, compute
weighted per op class and dtype beyond the memory time, register spills from a liveness count, the
tile's re-reads and idle cores), and a merge's terms are the differences of those of the two kernels
and of the fused one, so `Benefit.net` is exactly the estimated time of the two minus the fused one's.
T_mem_saved: memory time no longer spent (an intermediate written once and read once by each
consuming kernel; a smaller footprint may also move to a faster cache level). T_sched_saved: the
launch of one kernel (calibrated: a generated kernel's call; with its parallel region's fork and
join when it had one). T_ilp_gain: compute that overlapped no
memory traffic in the two kernels, less that of the fused one: negative when the fused kernel becomes
compute-bound (its compute time exceeds its memory time), e.g. when it recomputes a broadcast
producer per element. T_reg_spill: values alive at once in the fused loop body beyond the registers,
spilled and reloaded per element, less those of the two. T_tile_overhead: what the fused kernel's tile
adds over those of the two (a reduction row over the on-chip budget re-read per extra stage, blocks
that leave cores idle).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from autofusion.fusion import terms
from autofusion.fusion.records import Benefit as Benefit  # defined there, re-exported
from autofusion.fusion.terms import Terms, kernel_bytes, kernel_terms
from autofusion.hw.profile import HardwareProfile
from autofusion.kernel.lower import LoopKernel
from autofusion.kernel.tile import Tile, choose_tile

VECTOR_REGISTERS = terms.VECTOR_REGISTERS
live_values = terms.live_values
__all__ = ["Benefit", "Estimate", "estimate", "kernel_bytes", "kernel_flops", "live_values", "merge_benefit",
           "terms_of"]  # fmt: skip


@dataclass(frozen=True)
class Estimate:
    bytes: int
    flops: int  # weighted: fp32 adds (a transcendental counts as several)
    launches: int
    seconds: float


def _numel(shape: tuple[int, ...]) -> int:
    return math.prod(shape)


def kernel_flops(k: LoopKernel, profile: HardwareProfile | None = None) -> int:
    """Compute work per call; with a profile weighted per op class and dtype (fusion/terms.py), else one
    per statement and element."""
    if profile is not None:
        return round(terms.weighted_flops(k, profile))
    per_point = sum(1 for s in k.all_stmts() if s.kind in ("compute", "acc"))
    return per_point * _numel(k.space)


def terms_of(k: LoopKernel, profile: HardwareProfile, tile: Tile | None = None) -> Terms:
    return kernel_terms(k, tile or choose_tile(k, profile), profile)


def estimate(k: LoopKernel, profile: HardwareProfile, tile: Tile | None = None) -> Estimate:
    tile = tile or choose_tile(k, profile)
    t = kernel_terms(k, tile, profile)
    moved = kernel_bytes(k) + terms.reread_bytes(k, tile)
    return Estimate(moved, round(t.flops), 1, t.seconds)


def merge_benefit(a: LoopKernel, b: LoopKernel, fused: LoopKernel, profile: HardwareProfile) -> Benefit:
    ta, tb, tf = terms_of(a, profile), terms_of(b, profile), terms_of(fused, profile)
    return Benefit(
        mem_saved=ta.memory + tb.memory - tf.memory,
        sched_saved=ta.launch + tb.launch - tf.launch,
        ilp_gain=ta.excess_compute + tb.excess_compute - tf.excess_compute,
        reg_spill=tf.spill - ta.spill - tb.spill,
        tile_overhead=tf.tile - ta.tile - tb.tile,
    )


def gemm_seconds(m: int, n: int, k: int, profile: HardwareProfile, cores: int) -> float:
    """A roofline for one fp32 GEMM on `cores` of the profile's cores (weights, inputs, output). One
    core alone reaches neither the peak FLOP/s nor the memory bandwidth: both scale with the cores."""
    share = cores / max(1, profile.cores)
    fp32 = profile.peak_flops.get("fp32", 1e11) * share
    moved = 4 * (m * k + k * n + m * n)
    return max(2 * m * n * k / fp32, moved / (profile.memory_bandwidth * share))


def weight_restream_seconds(k: int, n: int, blocks: int, profile: HardwareProfile) -> float:
    """What the fused kernel's per-block BLAS calls spend on the weight beyond one library call.

    Each call packs the whole [k, n] weight for itself (a BLAS packs the operands of every call), so
    the blocks stream it `blocks` times in all, the busy cores at once, where one threaded library
    call streams it once. A weight that fits one core's cache comes back from there (four times the
    memory bandwidth); a larger one from memory. Measured with MKL's sgemm on the 2-core AVX-512
    Xeon (one thread, CPU time, 2026-12-02, under load): a [768, 3072] weight costs about 1 ms more
    per extra call (9.4 MB at ~10 GB/s, one core's share of memory bandwidth), so 64-row blocks of a
    512-row GEMM took 1.48x one call and 128-row blocks 1.18x. The charge before (re-reads from the
    shared cache, a core's first block free) was 9x lower at 1024 rows and nothing at one block per
    core, and let GPT-2's and BERT's MLP GEMMs fuse where they took 1.04-1.26x the CPU time of one
    plain MKL call and a separate pass (1.09-1.58x that of MKL's packed call)."""
    cores = max(1, profile.cores)
    streams = -(-blocks // cores) * min(blocks, cores)  # busy cores x blocks each
    w_bytes = 4 * k * n
    bw = profile.memory_bandwidth * (4 if w_bytes <= profile.budget_bytes else 1)
    return max(0, streams - 1) * w_bytes / bw


def gemm_epilogue_benefit(m: int, n: int, k: int, blocks: int, y_out: bool, profile: HardwareProfile,
                          whole: bool = False) -> Benefit:  # fmt: skip
    """The GEMM run per block of output rows inside its epilogue kernel, against one library call and
    a separate epilogue pass.

    Saved: the epilogue's read of the GEMM output from memory (and its write too when nothing else
    reads it: each thread then keeps its block in a scratch buffer that stays in cache) and one
    dispatch. Paid (`tile_overhead`): with fewer blocks than cores the GEMM runs on fewer cores (one
    call per block, each on one thread); every BLAS call streams and packs the whole weight, where one
    library call streams it once for all its threads (`weight_restream_seconds`); each BLAS call costs
    about one dispatch."""
    y_bytes = 4 * m * n
    bw = profile.memory_bandwidth
    mem_saved = y_bytes * (1 if y_out else 2) / bw
    cores = max(1, profile.cores)
    used = min(blocks, cores)
    lost = gemm_seconds(m, n, k, profile, used) - gemm_seconds(m, n, k, profile, cores)
    rereads = weight_restream_seconds(k, n, blocks, profile)
    calls = blocks * profile.dispatch_overhead_s * 0.1  # a BLAS call is a C call: ~1/10 of a dispatch
    return Benefit(mem_saved, profile.dispatch_overhead_s, 0.0, 0.0, lost + rereads + calls)
