"""The fusion decisions and GEMM epilogue specs a plan keeps (`plan.schedule.Plan`, `KernelStep.gemm`).

Plain frozen records, made by the solver (`solver.py`, `cost.py`, `gemm.py`, which re-export them)
and read by the plan, its executors and saved packages. They live apart from the solver so that
running a plan (a loaded package) imports these records and not the solver, its cost model or its
legality checks.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Benefit:
    """The cost model's terms for one fusion, in seconds (`net` > 0: fusing saves time)."""

    mem_saved: float
    sched_saved: float
    ilp_gain: float
    reg_spill: float
    tile_overhead: float

    @property
    def net(self) -> float:
        return self.mem_saved + self.sched_saved + self.ilp_gain - self.reg_spill - self.tile_overhead

    def describe(self) -> str:
        us = 1e6
        return (f"mem_saved={self.mem_saved * us:.2f}us sched_saved={self.sched_saved * us:.2f}us "
                f"ilp_gain={self.ilp_gain * us:.2f}us reg_spill={self.reg_spill * us:.2f}us "
                f"tile_overhead={self.tile_overhead * us:.2f}us net={self.net * us:.2f}us")  # fmt: skip


@dataclass(frozen=True)
class Decision:
    """One fuse / no-fuse verdict of the solver, with its reason code and numbers."""

    first: str
    second: str
    accepted: bool
    code: str = ""
    reason: str = ""
    benefit: Benefit | None = None
    kind: str = "vertical"
    bytes_shared: int = 0
    rule: str = ""  # the check or heuristic that decided (for reports and `autofusion explain`)
    first_nodes: tuple[str, ...] = ()  # node names on each side, so tools can name what to disable
    second_nodes: tuple[str, ...] = ()
    live_bytes: int = 0  # on-chip bytes the merged kernel's tile keeps live, and the profile's budget
    budget_bytes: int = 0

    def line(self) -> str:
        if self.kind == "recompute" and self.accepted:
            return f"node1 {self.first} is recomputed by its {self.second} instead of written out"
        if self.accepted:
            return (
                f"node1 {self.first} and node2 {self.second} fuse "
                f"({self.kind}, {self.bytes_shared} bytes shared)"
            )
        return (
            f"node1 {self.first} and node2 {self.second} cannot fuse, "
            f"the reason is [{self.code}][{self.reason}]"
        )


@dataclass(frozen=True)
class GemmOperands:
    """Which values a GEMM reads and writes, and its sizes."""

    x: int  # value ids
    w: int
    bias: int | None
    y: int
    m: int  # y[m, n] = x[m, k] @ B[k, n] (+ bias[n])
    n: int
    k: int
    w_kn: bool  # w is stored [k, n] (mm, addmm); else [n, k] (linear's weight, read transposed)

    def inputs_of(self) -> tuple[int, ...]:
        return (self.x, self.w) if self.bias is None else (self.x, self.w, self.bias)


@dataclass(frozen=True)
class EpilogueFit:
    """How a fused kernel's epilogue follows a GEMM's output blocks."""

    y_buf: int  # index of the GEMM output among the epilogue kernel's buffers
    block_dim: int  # the dim of the epilogue's space the blocks split
    unit_rows: int  # GEMM rows per index of block_dim
    shifts: tuple[int, ...]  # per buffer: elements its pointer moves per index of block_dim
    # Whole mode: the epilogue cannot run per block (`why_whole` says why): every thread computes
    # its GEMM rows into the full output, a barrier, then the epilogue runs as an ordinary kernel
    # over all of it (the same static row split, so mostly each core reads the rows it computed).
    whole: bool = False
    why_whole: str = ""


@dataclass(frozen=True)
class GemmSpec:
    """A GEMM a fused kernel runs first, block by block, and the epilogue reading each block."""

    node: int  # the GEMM's node index
    op: str
    operands: GemmOperands
    fit: EpilogueFit
    units: int  # indices of block_dim per block
    units_total: int  # the size of block_dim
    y_out: bool  # the GEMM output is read outside the fused kernel too (so it is one of its outputs)

    @property
    def rows_per_block(self) -> int:
        return self.units * self.fit.unit_rows

    @property
    def blocks(self) -> int:
        return -(-self.units_total // self.units) if self.units else 0

    @property
    def inputs(self) -> tuple[int, ...]:
        return self.operands.inputs_of()
