"""Micro-kernels that isolate one cost parameter each, and the fit of the profile's parameters from their
times: the first half of `autofusion calibrate`.

Each micro-kernel is an IR graph built here and lowered by the planner's own lowering (kernel/lower.py),
so it is rendered, built and called like any planned kernel (tools/calibrate/bench.py):
- dispatch: `x + y` on one element: the fixed cost of calling a generated kernel.
- bandwidth per level: `x + y` whose three buffers fill half of the cores' L2, half of the L3, and
  several times the L3 (memory): bytes over (time - dispatch). L1 is not measured: a kernel that fits
  in it runs for less than its call costs.
- compute per op class and dtype: a chain of R ops of the class on x (y where the op is binary) over
  elements that stay in L2, at two lengths R1 < R2, both compute-bound; (t(R2) - t(R1)) / ((R2 - R1) n)
  is one op on one element over all cores, free of memory and call costs. `compute_rate` is the inverse
  for fp32 arith; `op_weights` each class and dtype over that.
- exp_nonpos: softmax's shift x - amax(x) over rows, with and without the exp the lowering marks
  nonpositive (rendered as the cheaper af_exp_nonpos): one op per element apart.
- spill: K values v_i = v_(i-1) + y, summed once and then squared and summed again, so all K stay alive
  (the liveness count of fusion/terms.py says how many); at K below and above the registers, the
  extra time beyond the extra arithmetic, per spilled value and element, is `spill_s`.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from autofusion.cache import Cache
from autofusion.codegen.cpp.render import supports
from autofusion.fusion.terms import VECTOR_REGISTERS, live_values
from autofusion.hw.profile import HardwareProfile
from autofusion.ir.dtypes import DType
from autofusion.ir.graph import GraphBuilder
from autofusion.ir.types import TensorType
from autofusion.kernel.lower import LoopKernel, lower_group
from autofusion.kernel.tile import PARALLEL_MIN, choose_tile
from autofusion.tools.calibrate.bench import Item, time_items

log = logging.getLogger(__name__)

# Op cycles per class: each keeps values in a bounded range whatever the length (no inf, no denormal).
CLASS_OPS: dict[str, tuple[str, ...]] = {
    "arith": ("mul", "add"),  # h = h * y + y with y in [0.25, 0.75]: converges, stays normal
    "div": ("div",),  # h = y / h: alternates between two values
    "transcendental": ("sigmoid", "exp", "log", "tanh", "erf"),
    "trig": ("sin", "cos"),
}
CHAIN = {"arith": (16, 48), "div": (4, 12), "transcendental": (5, 10), "trig": (2, 6)}
# Half types round after every op and run far slower (about 70x per add on the calibration machine):
# shorter chains over fewer elements keep a call near a millisecond, short enough to find a window
# in which no thread of the team was descheduled.
CHAIN_HALF = {"arith": (4, 12), "transcendental": (2, 5)}
HALF_CLASSES = ("arith", "transcendental")
_HALF = {"fp16": DType.float16, "bf16": DType.bfloat16}
_BINARY = frozenset({"mul", "add", "div"})
# Independent timing passes, the fastest call of all kept: on a busy machine a kernel can stall on
# every call of one pass (its OpenMP team waiting for a descheduled thread) and run clean in the next.
PASSES, PASSES_QUICK = 3, 2


@dataclass
class MicroKernel:
    role: str  # "dispatch", "bw.l2", "op.trig.fp32.lo", "spill.hi", ...
    kernel: LoopKernel
    n: int
    nbytes: int
    ops: int = 0  # ops per element of the chain
    extra: dict[str, Any] = field(default_factory=dict)


def _lower(name: str, b: GraphBuilder, inputs: list[int], out: int) -> LoopKernel:
    g = b.build([out])
    used = [i for i in inputs if any(i in n.inputs for n in g.nodes)]
    return lower_group(name, g.nodes, used, [out], g.value_types(), supports)


def _chain(name: str, dtype: DType, n: int, ops: Sequence[str]) -> LoopKernel:
    b = GraphBuilder(name)
    t = TensorType(dtype, (n,))
    x, y = b.add_input(t, "x"), b.add_input(t, "y")
    h = x
    for op in ops:
        if op == "div":
            h = b.add("div", (y, h))
        elif op in _BINARY:
            h = b.add(op, (h, y))
        else:
            h = b.add(op, (h,))
    return _lower(name, b, [x, y], h)


def _spill(name: str, n: int, k: int) -> LoopKernel:
    b = GraphBuilder(name)
    t = TensorType(DType.float32, (n,))
    x, y = b.add_input(t, "x"), b.add_input(t, "y")
    vs = [b.add("add", (x, y))]
    for _ in range(k - 1):
        vs.append(b.add("add", (vs[-1], y)))
    a = vs[0]
    for v in vs[1:]:
        a = b.add("add", (a, v))
    s = b.add("mul", (vs[0], vs[0]))
    for v in vs[1:]:
        s = b.add("add", (s, b.add("mul", (v, v))))
    return _lower(name, b, [x, y], b.add("add", (a, s)))


def _shifted(name: str, rows: int, cols: int, with_exp: bool) -> LoopKernel:
    """x - amax(x, -1), and with `with_exp` exp of it (the lowering marks that exp nonpositive)."""
    b = GraphBuilder(name)
    x = b.add_input(TensorType(DType.float32, (rows, cols)), "x")
    h = b.add("sub", (x, b.add("amax", (x,), {"dims": (-1,), "keepdim": True})))
    if with_exp:
        h = b.add("exp", (h,))
    return _lower(name, b, [x], h)


def micro_kernels(profile: HardwareProfile, quick: bool = False) -> list[MicroKernel]:
    cores = max(1, profile.cores)
    l2 = (profile.l2_bytes or profile.on_chip_bytes) * cores
    l3 = profile.l3_bytes or 8 * l2
    out = [MicroKernel("dispatch", _chain("cal_dispatch", DType.float32, 1, ("add",)), 1, 12)]
    memory = (2 if quick else 4) * l3
    for level, footprint in (("l2", l2 // 2), ("l3", l3 // 2), ("memory", memory)):
        n = max(PARALLEL_MIN * 2, footprint // 12)
        out.append(
            MicroKernel(f"bw.{level}", _chain(f"cal_bw_{level}", DType.float32, n, ("add",)), n, 12 * n)
        )
    n = max(2 * PARALLEL_MIN, min(l2 // 16, 1 << 18))
    cases = [(c, "fp32", DType.float32) for c in CLASS_OPS]
    if not quick:  # --quick keeps the fp32 weights only (the half ones stay as they were)
        cases += [(c, name, dt) for c in HALF_CLASSES for name, dt in _HALF.items()]
    for cls, dname, dtype in cases:
        cycle = CLASS_OPS[cls]
        half = dtype != DType.float32
        count = 2 * PARALLEL_MIN if half else n
        for tag, length in zip(("lo", "hi"), (CHAIN_HALF if half else CHAIN)[cls], strict=True):
            ops = [cycle[i % len(cycle)] for i in range(length)]
            k = _chain(f"cal_{cls}_{dname}_{tag}", dtype, count, ops)
            out.append(MicroKernel(f"op.{cls}.{dname}.{tag}", k, count, 3 * count * dtype.itemsize, length))
    rows = max(2 * PARALLEL_MIN, n) // 1024
    for tag, with_exp in (("lo", False), ("hi", True)):
        k = _shifted(f"cal_expnp_{tag}", rows, 1024, with_exp)
        out.append(MicroKernel(f"op.exp_nonpos.fp32.{tag}", k, rows * 1024, 8 * rows * 1024, int(with_exp)))
    regs = profile.vector_registers or VECTOR_REGISTERS
    for tag, count in (("lo", max(2, regs // 2 - 2)), ("hi", regs + 16)):
        k = _spill(f"cal_spill_{tag}", n, count)
        out.append(
            MicroKernel(f"spill.{tag}", k, n, 12 * n, 4 * count, {"values": count, "live": live_values(k)})
        )
    return out


def _tensors(k: LoopKernel, gen: torch.Generator) -> tuple[torch.Tensor, ...]:
    out = []
    for i, b in enumerate(k.buffers):
        dt = b.type.dtype.to_torch()
        if b.is_output:
            out.append(torch.empty(b.type.shape, dtype=dt))
        else:  # x in [0.5, 1.5], y in [0.25, 0.75] (module docstring: every chain stays bounded)
            lo = 0.5 if i == 0 else 0.25
            out.append((torch.rand(b.type.shape, generator=gen) * (2 * lo) + lo).to(dt))
    return tuple(out)


def measure_micro(profile: HardwareProfile, cache: Cache, quick: bool = False) -> dict[str, float]:
    """Seconds per call of each micro-kernel, by role."""
    gen = torch.Generator().manual_seed(0)
    micro = micro_kernels(profile, quick)
    items = [Item(m.kernel, choose_tile(m.kernel, profile), _tensors(m.kernel, gen)) for m in micro]
    best = [math.inf] * len(items)
    for _ in range(PASSES_QUICK if quick else PASSES):
        times = time_items(items, cache, rounds=4 if quick else 8, total_s=5.0 if quick else 30.0)
        best = [min(a, b) for a, b in zip(best, times, strict=True)]
    return {m.role: t for m, t in zip(micro, best, strict=True)}


def fit(
    times: dict[str, float], profile: HardwareProfile, quick: bool = False
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(profile fields, notes): the calibrated parameters from the micro-kernels' times."""
    micro = {m.role: m for m in micro_kernels(profile, quick)}
    dispatch = times["dispatch"]
    notes: dict[str, Any] = {"dispatch_s": dispatch}

    def rate(role: str) -> float:
        m = micro[role]
        return m.nbytes / max(times[role] - dispatch, 1e-9)

    cache_bw = {"l2": rate("bw.l2"), "l3": rate("bw.l3")}
    memory = rate("bw.memory")

    def per_op(cls: str, dname: str) -> float:
        lo, hi = micro[f"op.{cls}.{dname}.lo"], micro[f"op.{cls}.{dname}.hi"]
        dt = times[hi.role] - times[lo.role]
        value = dt / ((hi.ops - lo.ops) * hi.n)
        if value <= 0:  # noise larger than the longer chain's extra work: fall back to the longer one alone
            value = max(times[hi.role] - dispatch, 1e-9) / (hi.ops * hi.n)
        return value

    arith = per_op("arith", "fp32")
    weights: dict[str, float] = {}
    for cls in CLASS_OPS:
        weights[cls] = per_op(cls, "fp32") / arith if cls != "arith" else 1.0
    # one exp more than the shift alone; a memory-bound pair can hide it, so never below one add
    lo_e, hi_e = micro["op.exp_nonpos.fp32.lo"], micro["op.exp_nonpos.fp32.hi"]
    weights["exp_nonpos"] = max(1.0, (times[hi_e.role] - times[lo_e.role]) / hi_e.n / arith)
    for cls in HALF_CLASSES:
        for dname in _HALF:
            if f"op.{cls}.{dname}.lo" in micro:
                weights[f"{cls}.{dname}"] = per_op(cls, dname) / arith
    notes["op_seconds"] = {cls: per_op(cls, "fp32") for cls in CLASS_OPS}
    lo, hi = micro["spill.lo"], micro["spill.hi"]
    regs = profile.vector_registers or VECTOR_REGISTERS
    spilled = max(0, hi.extra["live"] - regs) - max(0, lo.extra["live"] - regs)
    extra = times[hi.role] - times[lo.role] - (hi.ops - lo.ops) * hi.n * arith
    default_spill = 2 * 4 / (8 * memory)
    spill = extra / (spilled * hi.n) if spilled > 0 else 0.0
    notes["spill"] = {"live_lo": lo.extra["live"], "live_hi": hi.extra["live"], "spilled": spilled,
                      "measurable": spill > 0}  # fmt: skip
    if spill <= 0:  # within the noise, or the compiler rematerialised: keep the cost of an L1 store+load
        spill = default_spill
    values = {
        "dispatch_overhead_s": dispatch,
        "memory_bandwidth": memory,
        "cache_bandwidth": cache_bw,
        "compute_rate": 1.0 / arith,
        "op_weights": weights,
        "spill_s": spill,
    }
    for key, v in values.items():
        if not isinstance(v, dict) and not (math.isfinite(v) and v > 0):
            raise ValueError(f"calibration fitted a non-positive {key}: {v}")
    return values, notes
