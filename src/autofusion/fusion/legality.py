"""May a node join a generated kernel? Answered from the op registry alone.

In: an op name (or a node). Out: None when the op may join a kernel, otherwise a `Refusal` with the
NF code and the reason, from the op's `FusionClass` and its `kernel` flag (`autofusion.ir.ops`).

Why a module of its own: the solver, the plan and the pictures all ask this question, and each once
kept its own list of op names, which drifted from the catalogue. Whether a group of kernel-able nodes
lowers to *one* kernel is a different question, answered by `kernel/lower.py`.
"""

from __future__ import annotations

from dataclasses import dataclass

from autofusion.ir.catalog import KERNEL_EXCLUDED
from autofusion.ir.nf import NO_KERNEL_LOWERING
from autofusion.ir.ops import FusionClass, get_op

__all__ = ["KERNEL_EXCLUDED", "Refusal", "op_refusal"]


@dataclass(frozen=True)
class Refusal:
    code: str  # an NF code of `autofusion.ir.nf.CODES`
    reason: str

    def __str__(self) -> str:
        return f"[{self.code}] {self.reason}"


def op_refusal(op: str) -> Refusal | None:
    """Why nodes of `op` never join a generated kernel, or None when they may."""
    if op not in KERNEL_EXCLUDED:
        return None
    opdef = get_op(op)
    if opdef.fusion is FusionClass.ANCHOR:
        return Refusal(NO_KERNEL_LOWERING, f"{op} is library compute (ANCHOR): it runs through ATen")
    if opdef.fusion is FusionClass.OPAQUE:
        return Refusal(NO_KERNEL_LOWERING, f"{op} is OPAQUE: it is never fused")
    return Refusal(NO_KERNEL_LOWERING, f"{op} has no loop-kernel form: it runs through ATen")
