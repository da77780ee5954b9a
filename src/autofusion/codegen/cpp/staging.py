"""Staged fp16 loads and stores for pointwise kernels: F16C conversions outside the simd loop.

In: a pointwise `LoopKernel` (its one stage), the loop group that is innermost and the dim that steps
along it, the inner block length. Out: a `Staging` (what to stage) whose `lines` render the kernel's
inner loop in the staged form; `render._body` uses it in place of its plain simd loop.

Why: GCC 12 does not vectorise `_Float16` conversions without AVX512-FP16, so the per-element fp16
decoding and rounding of af_math.h (bit manipulation the vectoriser handles) cost ~10 vector operations
per conversion where F16C's vcvtph2ps / vcvtps2ph take one. The staged form converts a run of up to
AF_STAGE elements of each contiguous fp16 input into a float stack array (af_f16_load), runs the simd
loop on floats, collects each contiguous fp16 output in a float array and converts it after the loop
(af_f16_store). The two functions use F16C where the build may (af_math.h), the bit manipulation
otherwise, and give identical bits either way. A result that eager rounds to fp16 and that only staged
stores read is not rounded in the loop: the store's round-to-nearest-even is that rounding.

Reductions stage their loads the same way in the constant-width lane loops (render._lane_loops).

bf16 is not staged: its decoding is a shift and its rounding three integer operations, which the
vectoriser already handles well (and AVX512-BF16's vcvtneps2bf16 flushes subnormals, unlike eager).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from autofusion.ir.dtypes import DType
from autofusion.kernel.lower import LoopKernel, Stmt, StmtKind

STAGE_MIN = 16  # inner blocks shorter than this keep the per-element conversions (no staging overhead)


@dataclass
class Staging:
    """What a pointwise kernel's inner loop stages."""

    gid: int  # the inner loop group (its loop variable is g<gid>)
    loads: dict[str, Stmt]  # var -> its load
    stores: list[Stmt]
    unrounded: set[str]  # round_output results that only staged stores read: the store rounds them

    def lines(
        self,
        stmts: Sequence[Stmt],
        offset: Callable[..., str],
        stmt: Callable[[Stmt], str],
        defs: list[str],
        clause: str = "",
    ) -> list[str]:
        """The inner loop over [lo, hi) of `stmts` in runs of AF_STAGE; `offset` renders an index,
        `stmt` a statement, `defs` are the index definitions the loop body starts with, `clause` the
        simd loop's reduction clause."""
        g = f"g{self.gid}"
        out = [
            "    for (int64_t af_c = lo; af_c < hi; af_c += AF_STAGE) {",
            "      const int64_t af_n = std::min<int64_t>(hi - af_c, AF_STAGE);",
        ]
        for var, s in self.loads.items():
            out.append(f"      alignas(64) float af_s{var}[AF_STAGE];")
            ref = f"&b{s.buf}[{offset(s.offset)}]"  # the run's first element: the offset at g = af_c
            out.append(f"      {{ const int64_t {g} = af_c; af_f16_load({ref}, af_s{var}, af_n); }}")
        out += [f"      alignas(64) float af_o{i}[AF_STAGE];" for i in range(len(self.stores))]
        out += [f"      #pragma omp simd {clause}".rstrip()]
        out += [f"      for (int64_t {g} = af_c; {g} < af_c + af_n; ++{g}) {{"]
        body = defs[:]
        for s in stmts:
            store = next((i for i, t in enumerate(self.stores) if t is s), None)
            if s.kind == StmtKind.LOAD and s.var in self.loads:
                body.append(f"const float {s.var} = af_s{s.var}[{g} - af_c];")
            elif store is not None:
                body.append(f"af_o{store}[{g} - af_c] = {s.var};")
            elif s.kind == StmtKind.COMPUTE and s.var in self.unrounded:
                body.append(stmt(replace(s, attrs={**s.attrs, "round_output": False})))
            else:
                body.append(stmt(s))
        out += ["        " + line for line in body]
        out.append("      }")
        for i, s in enumerate(self.stores):
            ref = f"&b{s.buf}[{offset(s.offset)}]"
            out.append(f"      {{ const int64_t {g} = af_c; af_f16_store(af_o{i}, {ref}, af_n); }}")
        out.append("    }")
        return out


def _contiguous(k: LoopKernel, s: Stmt, inner: int) -> bool:
    """`s` reads or writes an fp16 buffer at an offset that steps by 1 along dim `inner`, and the
    kernel does not both read and write that buffer (staged loads run before the loop's stores)."""
    stmts = k.all_stmts()
    read = {t.buf for t in stmts if t.kind == StmtKind.LOAD}
    written = {t.buf for t in stmts if t.kind == StmtKind.STORE}
    return (
        k.buffers[s.buf].type.dtype is DType.float16
        and s.offset is not None
        and s.offset.is_affine
        and s.offset.coeff(inner) == 1
        and not (s.buf in read and s.buf in written)
    )


def contiguous_loads(k: LoopKernel, stmts: Sequence[Stmt], inner: int) -> dict[str, Stmt]:
    """The loads among `stmts` that can be staged along dim `inner`, by variable."""
    return {s.var: s for s in stmts if s.kind == StmtKind.LOAD and _contiguous(k, s, inner)}


def plan(k: LoopKernel, stmts: Sequence[Stmt], gid: int, inner: int, block: int) -> Staging | None:
    """What the inner loop (group `gid`, stepping dim `inner`) over `stmts` (a pointwise kernel's body,
    or a reduction stage's) stages; None: nothing, or a block too short to pay for it. A load or store
    is staged when its buffer is fp16, its offset steps by 1 along the inner loop (a run of the loop is
    a run of memory) and the kernel does not both read and write that buffer (the staged loads run
    before the loop's stores)."""
    if block < STAGE_MIN:
        return None
    loads = contiguous_loads(k, stmts, inner)
    stores = [s for s in stmts if s.kind == StmtKind.STORE and _contiguous(k, s, inner)]
    if not loads and not stores:
        return None
    uses: dict[str, int] = {}
    for s in k.all_stmts():
        read_vars = (*s.args, *((s.var,) if s.kind in (StmtKind.STORE, StmtKind.ROWSTORE) else ()))
        for a in read_vars:
            uses[a] = uses.get(a, 0) + 1
    staged_uses: dict[str, int] = {}
    for s in stores:
        staged_uses[s.var] = staged_uses.get(s.var, 0) + 1
    unrounded = {
        s.var
        for s in stmts
        if s.kind == StmtKind.COMPUTE
        and s.dtype is DType.float16
        and s.attrs.get("round_output")
        and staged_uses.get(s.var, 0) == uses.get(s.var, 0)
    }
    return Staging(gid, loads, stores, unrounded)
