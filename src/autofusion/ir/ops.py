"""The op registry: one `OpDef` per IR op, with its fusion class, arity, attributes and type inference.

In: nothing (the catalogue registers itself on import, see `autofusion.ir.catalog`).
Out: `Op` (the op kinds), `FusionClass`, `OpDef`, `register`, `get_op`, `all_ops`.

Invariants: `Op` has one member per registered OpDef and each is registered exactly once (the
catalogue checks both when it loads; a second registration raises); every OpDef's
`infer` is a pure function of input types and attributes, so the verifier can recompute any node's
output types and compare them with what the node declares.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from autofusion.errors import IRVerifyError, ShapeInferenceError
from autofusion.ir.types import TensorType

Attrs = Mapping[str, Any]
InferFn = Callable[[tuple[TensorType, ...], Attrs], tuple[TensorType, ...]]


class Op(enum.StrEnum):
    """Every IR op kind. A StrEnum, so `Op.ADD == "add"` and printing shows the bare name: graphs,
    golden files and rule files keep their text, and code written against strings keeps working."""

    # elementwise
    EXP = "exp"
    EXP2 = "exp2"
    EXPM1 = "expm1"
    LOG = "log"
    LOG2 = "log2"
    LOG10 = "log10"
    LOG1P = "log1p"
    SQRT = "sqrt"
    RSQRT = "rsqrt"
    RECIPROCAL = "reciprocal"
    SIN = "sin"
    COS = "cos"
    TAN = "tan"
    ASIN = "asin"
    ACOS = "acos"
    ATAN = "atan"
    SINH = "sinh"
    COSH = "cosh"
    TANH = "tanh"
    ASINH = "asinh"
    ACOSH = "acosh"
    ATANH = "atanh"
    SIGMOID = "sigmoid"
    SILU = "silu"
    ERF = "erf"
    ERFC = "erfc"
    ERFINV = "erfinv"
    HARDSIGMOID = "hardsigmoid"
    HARDSWISH = "hardswish"
    MISH = "mish"
    LGAMMA = "lgamma"
    DIGAMMA = "digamma"
    NEG = "neg"
    ABS = "abs"
    RELU = "relu"
    SIGN = "sign"
    FLOOR = "floor"
    CEIL = "ceil"
    ROUND = "round"
    TRUNC = "trunc"
    SQUARE = "square"
    ISNAN = "isnan"
    ISINF = "isinf"
    ISFINITE = "isfinite"
    LOGICAL_NOT = "logical_not"
    BITWISE_NOT = "bitwise_not"
    GELU = "gelu"
    LEAKY_RELU = "leaky_relu"
    ELU = "elu"
    SOFTPLUS = "softplus"
    CLAMP = "clamp"
    CAST = "cast"
    ADD = "add"
    SUB = "sub"
    MUL = "mul"
    DIV = "div"
    REMAINDER = "remainder"
    FMOD = "fmod"
    POW = "pow"
    MAXIMUM = "maximum"
    MINIMUM = "minimum"
    ATAN2 = "atan2"
    EQ = "eq"
    NE = "ne"
    LT = "lt"
    LE = "le"
    GT = "gt"
    GE = "ge"
    LOGICAL_AND = "logical_and"
    LOGICAL_OR = "logical_or"
    LOGICAL_XOR = "logical_xor"
    BITWISE_AND = "bitwise_and"
    BITWISE_OR = "bitwise_or"
    BITWISE_XOR = "bitwise_xor"
    WHERE = "where"
    LERP = "lerp"
    # sources
    FULL = "full"
    ARANGE = "arange"
    CONST = "const"
    # views and other injective ops
    RESHAPE = "reshape"
    PERMUTE = "permute"
    EXPAND = "expand"
    SLICE = "slice"
    SELECT = "select"
    CONCAT = "concat"
    PAD = "pad"
    INDEX_SELECT = "index_select"
    GATHER = "gather"
    FLIP = "flip"
    # reductions and normalizations
    SUM = "sum"
    MEAN = "mean"
    AMAX = "amax"
    AMIN = "amin"
    PROD = "prod"
    ANY = "any"
    ALL = "all"
    VAR = "var"
    ARGMAX = "argmax"
    ARGMIN = "argmin"
    SOFTMAX = "softmax"
    LOG_SOFTMAX = "log_softmax"
    LAYER_NORM = "layer_norm"
    RMS_NORM = "rms_norm"
    BATCH_NORM = "batch_norm"
    # anchors: library compute
    MM = "mm"
    BMM = "bmm"
    ADDMM = "addmm"
    LINEAR = "linear"
    CONV = "conv"
    SDPA = "sdpa"
    # opaque
    EXTERN = "extern"

    @classmethod
    def parse(cls, name: str, where: str = "") -> Op:
        """`name` as an Op; a name the registry does not know raises IRVerifyError naming it (and `where`)."""
        try:
            return cls(name)
        except ValueError:
            at = f" in {where}" if where else ""
            raise IRVerifyError(f"unknown IR op {name!r}{at}") from None


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
    """An op's registry entry: fusion class, shape inference and arity."""

    name: str
    fusion: FusionClass
    infer: InferFn
    # Inputs accepted: exactly min_inputs when max_inputs == min_inputs; None means unbounded.
    min_inputs: int
    max_inputs: int | None
    required_attrs: tuple[str, ...] = ()
    optional_attrs: Mapping[str, Any] = field(default_factory=dict)
    doc: str = ""
    # Swapping the two inputs gives the same result bit for bit (signed zeros included), so CSE may
    # sort them and the rule matcher may try both orders.
    commutative: bool = False
    # A generated loop kernel can compute it. False for ops the fusion class alone would admit but the
    # kernel language has no form for (index and bool reductions); ANCHOR and OPAQUE ops never are.
    kernel: bool = True

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
    try:
        Op(opdef.name)
    except ValueError:
        raise ValueError(f"op {opdef.name!r} has no member in Op: declare it there first") from None
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


def check_complete() -> None:
    """Raise unless every Op member has an OpDef (the catalogue calls this once it has registered all)."""
    missing = [op.value for op in Op if op.value not in _REGISTRY]
    if missing:
        raise ValueError(f"Op members without an OpDef: {', '.join(missing)}")


def infer_types(op: str, inputs: tuple[TensorType, ...], attrs: Attrs) -> tuple[TensorType, ...]:
    """Check arity and attributes, then run the op's type inference."""
    opdef = get_op(op)
    problem = opdef.check_arity(len(inputs)) or opdef.check_attrs(attrs)
    if problem:
        raise ShapeInferenceError(problem)
    return opdef.infer(inputs, opdef.with_defaults(attrs))
