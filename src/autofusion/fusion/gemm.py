"""GEMM + epilogue: may a GEMM (linear, mm, addmm) run inside the pointwise kernel that reads its output?

In: the GEMM node, the value types, and the lowered kernel of the group that reads the GEMM's output.
Out: a `GemmSpec` (operands, sizes, how the epilogue is split into blocks of output rows) or a
`Refusal` saying why not. The solver (fusion/solver.py) asks these questions for each GEMM after its
rounds and logs every answer as a decision; the cost-benefit term is `fusion.cost.gemm_epilogue_benefit`.

How the fused kernel runs (codegen/cpp/gemm.py): the output is cut into blocks of whole GEMM rows;
each block is one BLAS call (from inside the parallel region, so each call runs on one thread)
followed at once by the epilogue over that block, while it is still in the core's cache. The epilogue
is the group's own loop kernel, rendered over one block's iteration space with every buffer pointer
moved to the block's origin. That is only right when every access is affine and moves by one
fixed step per index of the blocked dimension, and the GEMM output is read at the element the
iteration computes (an epilogue reading a neighbour row would read a block not yet computed).
"""

from __future__ import annotations

import math

from autofusion.fusion.legality import Refusal
from autofusion.fusion.records import EpilogueFit, GemmOperands
from autofusion.fusion.records import GemmSpec as GemmSpec  # defined there, re-exported
from autofusion.ir import nf
from autofusion.ir.dtypes import DType
from autofusion.ir.graph import Node
from autofusion.ir.symbolic import sym_max, sym_min
from autofusion.ir.types import TensorType
from autofusion.kernel.lower import LoopKernel, StmtKind

GEMM_OPS = frozenset({"linear", "mm", "addmm"})
_INT32 = 2**31


def gemm_operands(node: Node, types: dict[int, TensorType]) -> GemmOperands | Refusal:
    """The GEMM's operands when one Fortran-ABI sgemm call per block can compute it, else why not."""
    y = node.outputs[0]
    if node.op == "linear":
        x, w = node.inputs[0], node.inputs[1]
        bias = node.inputs[2] if node.attr("has_bias") else None
        n, k = types[w].shape
        w_kn = False
    elif node.op in ("mm", "addmm"):
        if node.op == "addmm":
            c, x, w = node.inputs
            if node.attr("alpha") != 1 or node.attr("beta") != 1:
                return Refusal(nf.NO_KERNEL_LOWERING, "addmm with alpha or beta other than 1")
            bias = c
        else:
            (x, w), bias = node.inputs, None
        k, n = types[w].shape
        w_kn = True
    else:
        return Refusal(nf.NO_KERNEL_LOWERING, f"{node.op} is not a GEMM the fused kernel calls")
    vals = [x, w, y.id] + ([bias] if bias is not None else [])
    tys = [types[v] for v in vals]
    if any(t.dtype is not DType.float32 for t in tys):
        dts = sorted({t.dtype.name for t in tys})
        return Refusal(nf.DTYPE, f"the in-kernel GEMM is fp32 sgemm; operands are {'/'.join(dts)} "
                                 "(no callable half-precision GEMM): the library call stays")  # fmt: skip
    if bias is not None and types[bias].shape not in ((n,), (1, n)):
        return Refusal(nf.NO_KERNEL_LOWERING, f"bias of shape {types[bias].shape} is not one row of {n}")
    if not all(t.is_contiguous for t in tys):
        return Refusal(nf.NO_KERNEL_LOWERING, "an operand is not contiguous")
    if types[x].shape[-1] != k:
        return Refusal(nf.NO_KERNEL_LOWERING, "operand shapes do not match a GEMM")
    m = types[x].numel // k if k else 0
    if any(v >= _INT32 for v in (m * n, m * k, n * k, m, n, k)):  # not max(): it orders the sizes
        return Refusal(nf.NO_KERNEL_LOWERING, "sizes exceed a 32-bit BLAS")
    if m == 0 or n == 0 or k == 0:
        return Refusal(nf.NO_KERNEL_LOWERING, "an empty GEMM")
    return GemmOperands(x, w, bias, y.id, m, n, k, w_kn)


def epilogue_fit(kernel: LoopKernel, ops: GemmOperands) -> EpilogueFit | Refusal:
    """How the epilogue kernel splits into blocks of whole GEMM rows, or else how it runs after all
    of them (whole mode); a refusal only when it does not read the GEMM output as one buffer."""
    ys = [i for i, b in enumerate(kernel.buffers) if b.vid == ops.y and not b.is_output]
    if len(ys) != 1:
        return Refusal(nf.NO_KERNEL_LOWERING, "the epilogue does not read the GEMM output as one buffer")
    fit = _block_fit(kernel, ops, ys[0])
    if isinstance(fit, Refusal):
        return EpilogueFit(ys[0], 0, 1, (0,) * len(kernel.buffers), True, fit.reason)
    return fit


def _block_fit(kernel: LoopKernel, ops: GemmOperands, y_buf: int) -> EpilogueFit | Refusal:
    if kernel.is_reduction or kernel.pre or kernel.post:
        return Refusal(nf.NO_KERNEL_LOWERING, "the epilogue is a reduction: its rows are shared by threads")
    space = kernel.space
    if math.prod(space) != ops.m * ops.n:
        return Refusal(
            nf.SPACES_DIFFER, f"the epilogue's space {space} is not the GEMM output's {ops.m}x{ops.n}"
        )
    ys = [y_buf]
    # The blocked dim: the innermost one with only size-1 dims before it whose steps are whole GEMM
    # rows (a block is then a contiguous range of rows).
    dims = [e for e in range(len(space))
            if all(space[j] == 1 for j in range(e)) and math.prod(space[e + 1 :]) % ops.n == 0]  # fmt: skip
    if not dims:
        return Refusal(
            nf.NO_KERNEL_LOWERING, f"no dim of the epilogue's space {space} steps by whole GEMM rows"
        )
    d = dims[-1]
    unit = math.prod(space[d + 1 :])
    contiguous = [math.prod(space[e + 1 :]) for e in range(len(space))]
    shifts: dict[int, int] = {}
    for s in kernel.all_stmts():
        if s.kind in (StmtKind.INDEX, StmtKind.ROWLOAD, StmtKind.ROWSTORE):
            return Refusal(nf.NO_KERNEL_LOWERING, "the epilogue reads its iteration index or a row buffer")
        if s.offset is None:
            continue
        if not s.offset.is_affine:
            return Refusal(
                nf.NO_KERNEL_LOWERING, "the epilogue has a non-affine access (a block cannot move it)"
            )
        if s.buf == ys[0] and (
            s.offset.const != 0
            or any(s.offset.coeff(e) != contiguous[e] for e in range(len(space)) if space[e] > 1)
        ):
            return Refusal(nf.NO_KERNEL_LOWERING, "the epilogue reads the GEMM output at another element "
                                                  "than the one it computes")  # fmt: skip
        c = s.offset.coeff(d)
        if shifts.setdefault(s.buf, c) != c:
            return Refusal(nf.NO_KERNEL_LOWERING, f"buffer {s.buf} is read at different steps along dim {d}")
    return EpilogueFit(ys[0], d, unit // ops.n, tuple(shifts.get(i, 0) for i in range(len(kernel.buffers))))


def block_units(ops: GemmOperands, fit: EpilogueFit, units_total: int, cores: int, budget_bytes: int) -> int:
    """Indices of the blocked dim per block: an even share of the rows per core, fewer where one
    block's output (fp32) would not fit the per-core cache budget (the epilogue would read it back
    from memory, which is what fusing is for), never less than one. Fewer, larger blocks are better
    otherwise: each block past a thread's first reads the whole weight again."""
    # min/max of sizes taking no guard: the count is derived again for other sizes (an expression of
    # them), so a plan made for many sizes does not hold only where the hint's branch is taken.
    share = -(-units_total // max(1, cores))
    fits = sym_max(1, budget_bytes // sym_max(1, fit.unit_rows * ops.n * 4))
    return sym_max(1, sym_min(share, fits))
