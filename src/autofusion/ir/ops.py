"""The op registry: one `OpDef` per IR op, with its fusion class, arity, attributes and type inference.

In: nothing (the catalogue registers itself on import, see `autofusion.ir.catalog`).
Out: `FusionClass`, `OpDef`, `register`, `get_op`, `all_ops` and the named op groups passes test against.

Invariants: an op name is registered exactly once (a second registration raises); every OpDef's
`infer` is a pure function of input types and attributes, so the verifier can recompute any node's
output types and compare them with what the node declares.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from autofusion.errors import ShapeInferenceError
from autofusion.ir.types import TensorType

Attrs = Mapping[str, Any]
InferFn = Callable[[tuple[TensorType, ...], Attrs], tuple[TensorType, ...]]


class FusionClass(enum.Enum):
    """What an op may fuse with (the meanings follow TVM's OpPatternKind)."""

    ELEMWISE = "elemwise"  # out[i] = f(in[i]) with identical shapes: fuses with anything around it
    BROADCAST = "broadcast"  # elementwise after broadcasting inputs to the output shape
    INJECTIVE = "injective"  # each output element reads one input element (views, concat, gather)
    REDUCE = "reduce"  # reduces axes (or contains a reduction: softmax, layer_norm); takes prologue/epilogue
    ANCHOR = "anchor"  # library compute (matmul, conv, attention) that can take an elementwise epilogue
    OPAQUE = "opaque"  # never fused: extern ATen calls, constants, random ops


@dataclass(frozen=True, slots=True)
class OpDef:
    name: str
    fusion: FusionClass
    infer: InferFn
    # Inputs accepted: exactly min_inputs when max_inputs == min_inputs; None means unbounded.
    min_inputs: int
    max_inputs: int | None
    required_attrs: tuple[str, ...] = ()
    optional_attrs: Mapping[str, Any] = field(default_factory=dict)
    doc: str = ""

    def check_arity(self, n: int) -> str | None:
        """Return why `n` inputs are wrong for this op, or None when they are fine."""
        if n < self.min_inputs or (self.max_inputs is not None and n > self.max_inputs):
            want = (
                str(self.min_inputs)
                if self.max_inputs == self.min_inputs
                else f"{self.min_inputs}..{self.max_inputs if self.max_inputs is not None else 'n'}"
            )
            return f"{self.name} takes {want} inputs, got {n}"
        return None

    def check_attrs(self, attrs: Attrs) -> str | None:
        missing = [a for a in self.required_attrs if a not in attrs]
        if missing:
            return f"{self.name} is missing attribute(s) {', '.join(missing)}"
        known = set(self.required_attrs) | set(self.optional_attrs)
        unknown = sorted(set(attrs) - known)
        if unknown:
            return f"{self.name} does not take attribute(s) {', '.join(unknown)}"
        return None

    def with_defaults(self, attrs: Attrs) -> dict[str, Any]:
        out = dict(self.optional_attrs)
        out.update(attrs)
        return out


_REGISTRY: dict[str, OpDef] = {}


def register(opdef: OpDef) -> OpDef:
    if opdef.name in _REGISTRY:
        raise ValueError(f"op {opdef.name!r} is registered twice")
    _REGISTRY[opdef.name] = opdef
    return opdef


def get_op(name: str) -> OpDef:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise KeyError(f"unknown IR op {name!r}") from None


def all_ops() -> Mapping[str, OpDef]:
    return dict(_REGISTRY)


def infer_types(op: str, inputs: tuple[TensorType, ...], attrs: Attrs) -> tuple[TensorType, ...]:
    """Check arity and attributes, then run the op's type inference."""
    opdef = get_op(op)
    problem = opdef.check_arity(len(inputs)) or opdef.check_attrs(attrs)
    if problem:
        raise ShapeInferenceError(problem)
    return opdef.infer(inputs, opdef.with_defaults(attrs))
