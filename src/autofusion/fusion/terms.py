"""The cost model's terms for one kernel: weighted compute, memory time by cache level, register
liveness and spills, and the parallel efficiency of its tile.

In: a lowered kernel (kernel/lower.py), its tile (kernel/tile.py) and a hardware profile. Out: `Terms`,
the seconds of each part of the kernel's estimated time (`cost.estimate` adds them up):

    seconds = launch + (memory + excess_compute + spill + reread) / efficiency

- launch: the call (profile.dispatch_overhead_s: calibrated, a generated kernel's call), plus on a cpu
  the OpenMP team's fork and join for a kernel that runs in parallel (tile.BARRIER_S), so merging two
  parallel kernels saves more than merging a small one into a large one.
- memory: bytes of every buffer over the bandwidth of the level the kernel's footprint fits in
  (profile.cache_bandwidth, aggregate over the cores, when calibrated; the memory bandwidth otherwise).
- compute: each compute statement weighted by its op class and dtype (`op_weight`: a sine costs more
  than an add), times the elements it runs over, over `compute_rate`. Only the part beyond the memory
  time costs extra (a roofline: loads and arithmetic overlap): `excess_compute`.
- spill: values alive at once in a stage's loop body (`live_values`, a liveness count over its
  statements) beyond the profile's vector registers are stored and reloaded once per element.
  Ascend's vector unit computes from its UB, not from registers: no spill term on an "npu" profile.
- reread: a reduction whose row does not fit the on-chip budget reads it again per extra stage.
- efficiency: the share of the cores the tile keeps busy: a kernel under PARALLEL_MIN elements runs
  on one core; otherwise its blocks are dealt to the cores in waves, and a last partial wave idles
  the rest.
The parameters come from the profile; `autofusion calibrate` fits them on the host (tools/calibrate/).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from autofusion.hw.profile import HardwareProfile
from autofusion.ir.dtypes import DType
from autofusion.kernel.lower import LoopKernel, Stmt, StmtKind
from autofusion.kernel.tile import BARRIER_S, PARALLEL_MIN, Tile, row_bytes

VECTOR_REGISTERS = 16  # x86-64 ymm registers: a safe floor when the profile does not say
# Uncalibrated cost of one op of each class per element, in fp32 adds: vectorised polynomial
# approximations of exp/log/tanh take ~10-15 multiply-adds, sin/cos add a range reduction, a division
# or square root is a few times an add in throughput.
# exp_nonpos: softmax's exp(x - max), whose argument the lowering proved <= 0 (af_exp_nonpos: no
# overflow path), measured a third of a general exp here.
DEFAULT_OP_WEIGHTS = {"arith": 1.0, "div": 4.0, "transcendental": 12.0, "trig": 16.0, "exp_nonpos": 4.0}
_DIV = frozenset({"div", "reciprocal", "sqrt", "rsqrt", "remainder", "fmod"})
_TRIG = frozenset({"sin", "cos", "tan", "asin", "acos", "atan", "atan2"})
_TRANSCENDENTAL = frozenset({
    "exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sinh", "cosh", "tanh", "asinh", "acosh",
    "atanh", "sigmoid", "silu", "erf", "erfc", "erfinv", "mish", "lgamma", "digamma", "pow", "gelu",
})  # fmt: skip
_DTYPE_NAME = {DType.float32: "fp32", DType.float16: "fp16", DType.bfloat16: "bf16", DType.float64: "fp64"}
CACHE_FILL = 0.75  # a footprint up to this share of a cache level's capacity is served from it


def op_class(op: str, nonpositive: bool = False) -> str:
    """The profile's op class (hw/profile.OP_CLASSES) of a compute statement's op (`nonpositive`: an exp
    the lowering marked as taking an argument <= 0)."""
    if op == "exp" and nonpositive:
        return "exp_nonpos"
    if op in _TRIG:
        return "trig"
    if op in _TRANSCENDENTAL:
        return "transcendental"
    if op in _DIV:
        return "div"
    return "arith"  # add, mul, max, where, casts, comparisons, bit ops...


def op_weight(op: str, dtype: DType, profile: HardwareProfile, nonpositive: bool = False) -> float:
    """Cost of one `op` on one element of `dtype`, in fp32 adds: the profile's "class.dtype" weight, else
    its "class" weight, else the default of the class."""
    cls = op_class(op, nonpositive)
    weights = profile.op_weights or {}
    name = _DTYPE_NAME.get(dtype)
    if name is not None and f"{cls}.{name}" in weights:
        return float(weights[f"{cls}.{name}"])
    return float(weights.get(cls, DEFAULT_OP_WEIGHTS[cls]))


def _stmt_weight(s: Stmt, profile: HardwareProfile) -> float:
    if s.kind == StmtKind.COMPUTE:
        return op_weight(s.op, s.dtype, profile, bool(s.attrs.get("nonpositive")))
    if s.kind == StmtKind.ACC:
        return op_weight("add", s.dtype, profile)
    return 0.0


def weighted_flops(k: LoopKernel, profile: HardwareProfile) -> float:
    """Compute work in fp32 adds: each stage's statements over the whole space, per-row ones per row.
    A statement of a stage whose arguments are all row-invariant (an earlier stage's accumulator, a
    value computed before the stages, a literal, or such a statement) runs once per row: the C++
    compiler hoists it out of the loop over the row (log of a row's sum, fused into the final stage)."""
    full, rows = math.prod(k.space), math.prod(k.space[: k.n_outer])
    per_elem = 0.0
    per_row = sum(_stmt_weight(s, profile) for s in (*k.pre, *k.post))
    before = {s.var for s in k.pre if s.var}
    for i, stage in enumerate(k.stages):
        invariant = before | {a.var for a in k.accumulators if a.stage < i}
        for s in stage:
            if s.kind == StmtKind.LITERAL:
                invariant.add(s.var)
            elif s.kind == StmtKind.COMPUTE and s.args and all(a in invariant for a in s.args):
                invariant.add(s.var)
                per_row += _stmt_weight(s, profile)
            else:
                per_elem += _stmt_weight(s, profile)
    return per_elem * full + per_row * rows


def compute_rate(profile: HardwareProfile) -> float:
    return profile.compute_rate or profile.peak_flops.get("fp32", 1e11)


def _uses(s: Stmt) -> tuple[str, ...]:
    if s.kind == StmtKind.COMPUTE:
        return s.args
    if s.kind in (StmtKind.STORE, StmtKind.ROWSTORE):
        return (s.var,)
    if s.kind == StmtKind.ACC:
        return s.args[:1]
    return ()


_DEFINES = (StmtKind.LOAD, StmtKind.COMPUTE, StmtKind.LITERAL, StmtKind.INDEX, StmtKind.ROWLOAD)


def stage_live_values(stage: tuple[Stmt, ...], carried: frozenset[str] = frozenset()) -> int:
    """The most values alive at once in one loop body: a value lives from the statement defining it to
    its last use; accumulators, and `carried` values defined before the loop and used in it, live
    through the whole body. A literal counts like any value (the compiler keeps it in a register)."""
    last: dict[str, int] = {}
    for i, s in enumerate(stage):
        for v in _uses(s):
            last[v] = i
    accs = {s.var for s in stage if s.kind == StmtKind.ACC}
    always = len(accs) + len({v for v in last if v in carried})
    defined: dict[str, int] = {}
    most = always
    for i, s in enumerate(stage):
        if s.kind in _DEFINES and s.var:
            defined[s.var] = i
        live = sum(1 for v, d in defined.items() if d <= i <= last.get(v, d))
        most = max(most, always + live)
    return most


def live_values(k: LoopKernel) -> int:
    """Values alive at once in the widest stage body (register pressure)."""
    carried = frozenset(s.var for s in k.pre if s.kind in _DEFINES)
    return max((stage_live_values(st, carried) for st in k.stages), default=0)


def registers(profile: HardwareProfile) -> int | None:
    """Vector registers a loop body may fill before it spills; None: the target has no spill term."""
    if profile.kind == "npu":
        return None  # Ascend's AIV computes from UB buffers, which the tile budget already counts
    return profile.vector_registers or VECTOR_REGISTERS


def spill_seconds_per_value(profile: HardwareProfile) -> float:
    """One spilled value per element: a store and a reload of 4 bytes from L1 (calibrated: measured)."""
    if profile.spill_s is not None:
        return profile.spill_s
    l1 = (profile.cache_bandwidth or {}).get("l1", 8 * profile.memory_bandwidth)
    return 2 * 4 / l1


def spilled_values(k: LoopKernel, profile: HardwareProfile) -> list[int]:
    """Per stage, how many of its live values do not fit the registers."""
    regs = registers(profile)
    if regs is None:
        return [0 for _ in k.stages]
    carried = frozenset(s.var for s in k.pre if s.kind in _DEFINES)
    return [max(0, stage_live_values(st, carried) - regs) for st in k.stages]


def bandwidth(footprint: int, profile: HardwareProfile) -> tuple[str, float]:
    """(level, bytes/s) for a kernel touching `footprint` bytes: the smallest calibrated cache level
    that holds it (L1 and L2 are per core, so the cores together hold `cores` of them), else memory."""
    levels = profile.cache_bandwidth or {}
    capacity = {"l1": (profile.l1_bytes or 0) * profile.cores, "l2": (profile.l2_bytes or 0) * profile.cores,
                "l3": profile.l3_bytes or 0}  # fmt: skip
    for level in ("l1", "l2", "l3"):
        if level in levels and footprint <= CACHE_FILL * capacity[level]:
            return level, float(levels[level])
    return "memory", profile.memory_bandwidth


def parallel_blocks(k: LoopKernel, tile: Tile, profile: HardwareProfile) -> int:
    """How many blocks the kernel's parallel loop deals to the cores (as the renderer cuts them)."""
    numel = math.prod(k.space)
    if k.is_reduction:
        rows = max(1, math.prod(k.space[: k.n_outer]))
        if tile.split_rows:
            return profile.cores
        if tile.columns:
            return max(1, -(-rows // max(tile.inner_block, 1)))
        return max(1, -(-rows // max(tile.rows_per_block, 1)))
    inner = k.space[-1] if k.space else 1
    block = max(1, min(tile.inner_block, inner))
    return max(1, (numel // max(inner, 1)) * -(-inner // block))


def efficiency(k: LoopKernel, tile: Tile, profile: HardwareProfile) -> float:
    """Share of the cores' combined rate the kernel gets (module docstring)."""
    cores = max(1, profile.cores)
    if profile.kind == "cpu" and math.prod(k.space) <= PARALLEL_MIN:
        return 1.0 / cores
    blocks = parallel_blocks(k, tile, profile)
    waves = -(-blocks // cores)
    return blocks / (waves * cores)


@dataclass(frozen=True)
class Terms:
    """Seconds of each part of one kernel's time (module docstring); `seconds` is their sum."""

    launch: float
    memory: float
    compute: float
    spill: float
    reread: float
    efficiency: float
    level: str = "memory"
    flops: float = 0.0  # weighted, in fp32 adds
    live: int = 0

    @property
    def excess_compute(self) -> float:
        return max(0.0, self.compute - self.memory)

    @property
    def tile(self) -> float:
        """What the tile adds: re-read rows and idle cores."""
        busy = self.memory + self.excess_compute + self.spill + self.reread
        return self.reread + busy * (1.0 / self.efficiency - 1.0)

    @property
    def seconds(self) -> float:
        return self.launch + self.memory + self.excess_compute + self.spill + self.tile


def launch_seconds(k: LoopKernel, profile: HardwareProfile) -> float:
    """The call, and on a cpu for a kernel over PARALLEL_MIN elements the OpenMP team's fork and join."""
    parallel = profile.kind == "cpu" and profile.cores > 1 and math.prod(k.space) > PARALLEL_MIN
    return profile.dispatch_overhead_s + (BARRIER_S if parallel else 0.0)


def kernel_bytes(k: LoopKernel) -> int:
    return sum(b.type.nbytes for b in k.buffers)


def reread_bytes(k: LoopKernel, tile: Tile) -> int:
    if k.is_reduction and not tile.persistent:
        return (len(k.stages) - 1) * row_bytes(k) * max(1, math.prod(k.space[: k.n_outer]))
    return 0


def kernel_terms(k: LoopKernel, tile: Tile, profile: HardwareProfile) -> Terms:
    moved = kernel_bytes(k)
    level, bw = bandwidth(moved, profile)
    flops = weighted_flops(k, profile)
    spilled = spilled_values(k, profile)
    spill = sum(spilled) * math.prod(k.space) * spill_seconds_per_value(profile)
    return Terms(launch=launch_seconds(k, profile), memory=moved / bw, compute=flops / compute_rate(profile),
                 spill=spill, reread=reread_bytes(k, tile) / bw, efficiency=efficiency(k, tile, profile),
                 level=level, flops=flops, live=live_values(k))  # fmt: skip
