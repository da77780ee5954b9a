"""What ONNX converters see: values (IR tensors and/or known at import), the node's context, the registry.

A converter turns one ONNX node into IR nodes. It reads its inputs through `OnnxCtx` (`ctx.tensor(i)`
for an IR value, `ctx.ints(i)` for an input that must be known at import, such as a Reshape shape:
one computed from graph inputs is bound to their values at call time, see `shape_inputs.py`)
and returns one result per ONNX output: a `TV`, a numpy array (a value known at import: shape
computations are folded, not run), or None for an output nobody reads. When it cannot handle a node it
raises `UnsupportedOpError` with a reason; the driver rolls back and runs the node as an extern.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import helper

from autofusion.errors import ModelFileError, UnsupportedOpError
from autofusion.frontend.torch.context import TV, NodeBuilder, registrar, unsupported
from autofusion.ir.dtypes import DType
from autofusion.ir.graph import GraphBuilder
from autofusion.ir.onnx_dtypes import ONNX_TO_DTYPE, elem_type_name
from autofusion.ir.symbolic import SymInt
from autofusion.ir.types import TensorType

# Computable types only: converters build IR ops, which take no opaque type (complex, uint32...).
_READABLE: dict[int, DType] = {e: d for e, d in ONNX_TO_DTYPE.items() if not d.is_opaque}


def dtype_of(elem_type: int, what: str) -> DType:
    try:
        return _READABLE[elem_type]
    except KeyError:
        raise ModelFileError(
            f"{what} has element type {elem_type_name(elem_type)}, which autofusion does not support"
        ) from None


def numpy_dtype(dtype: DType) -> np.dtype:
    if dtype is DType.bfloat16:
        raise UnsupportedOpError("bfloat16 values cannot be folded at import")
    return np.dtype({DType.bool: "bool"}.get(dtype, dtype.name))


# Computable types only: ONNX converters build IR ops, which take no opaque type (complex, uint32...).
_NUMPY_TO_DTYPE = {
    np.dtype(d.name if d is not DType.bool else "bool"): d
    for d in DType
    if d is not DType.bfloat16 and not d.is_opaque
}


def array_dtype(a: np.ndarray) -> DType:
    try:
        return _NUMPY_TO_DTYPE[np.asarray(a).dtype]
    except KeyError:
        raise UnsupportedOpError(f"numpy dtype {np.asarray(a).dtype} has no IR equivalent") from None


def array_type(a: np.ndarray) -> TensorType:
    a = np.asarray(a)
    return TensorType(array_dtype(a), tuple(int(s) for s in a.shape))


@dataclass
class Val:
    """An ONNX value: its IR value once materialised, and its contents when known at import."""

    type: TensorType
    tv: TV | None = None
    const: np.ndarray | None = None
    # With symbolic input dims (`frontend/onnx/symbolic.py`): `const` as an object array whose entries
    # computed from those dims are `ir.symbolic.SymInt`s (None: no entry is).
    sym: np.ndarray | None = None


Result = TV | np.ndarray | None
OnnxConverter = Callable[["OnnxCtx"], Sequence[Result] | Result]
ONNX_CONVERTERS: dict[str, OnnxConverter] = {}


onnx_op = registrar(ONNX_CONVERTERS, "ONNX converter for ")


class OnnxCtx(NodeBuilder):
    """One ONNX node being converted."""

    def __init__(
        self,
        builder: GraphBuilder,
        node: onnx.NodeProto,
        ins: list[Val | None],
        expected: tuple[TensorType | None, ...],
        opset: int,
        name: str,
        materialise: Callable[[Val, str], TV],
        loc: str | None = None,
        runtime: Callable[[str], str] | None = None,
        scope: Mapping[str, Val] | None = None,
    ) -> None:
        self.b = builder
        self.node = node
        self.ins = ins
        self.expected = expected
        self.opset = opset
        self.name = name
        self._materialise = materialise
        self.loc = loc  # "model.onnx node 'conv_3' (Conv)": where runtime errors point
        # An ONNX value name -> what its value is computed from, for the message of `ints`; it raises
        # `shape_inputs.NeedsInputValues` when graph inputs the source can bind determine it.
        self._runtime = runtime
        # Every value defined so far, by name: what a subgraph (If branch, Loop body) reads from outside.
        self.scope: Mapping[str, Val] = scope or {}
        self._attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}

    # -- attributes ------------------------------------------------------------------------------
    def attr(self, key: str, default: Any = None) -> Any:
        v = self._attrs.get(key, default)
        return v.decode() if isinstance(v, bytes) else v

    def has_attr(self, key: str) -> bool:
        return key in self._attrs

    # -- inputs ---------------------------------------------------------------------------------
    @property
    def n_inputs(self) -> int:
        return len(self.ins)

    def has(self, i: int) -> bool:
        return i < len(self.ins) and self.ins[i] is not None

    def type(self, i: int) -> TensorType:
        v = self.ins[i]
        assert v is not None
        return v.type

    def tensor(self, i: int) -> TV:
        v = self.ins[i] if i < len(self.ins) else None
        if v is None:
            raise unsupported(f"input {i} is missing")
        return self._materialise(v, self.node.input[i])

    def materialise(self, val: Val, name: str) -> TV:
        """`val` (named `name`) as an IR value: a value of the scope that is not one of the node's inputs."""
        return self._materialise(val, name)

    def tensors(self) -> list[TV]:
        return [self.tensor(i) for i in range(len(self.ins)) if self.ins[i] is not None]

    def const(self, i: int) -> np.ndarray | None:
        v = self.ins[i] if i < len(self.ins) else None
        return None if v is None else v.const

    def ints(self, i: int, what: str) -> list[int] | None:
        """An int tensor input that must be known at import (None when the optional input is absent).
        One computed only from graph inputs is bound to their values at call time (`shape_inputs`)."""
        if not self.has(i):
            return None
        c = self.const(i)
        if c is None:
            why = self._runtime(self.node.input[i]) if self._runtime is not None else ""
            raise unsupported(
                f"{what} (input {i}) is computed at run time{why}; autofusion needs it known at import"
            )
        v = self.ins[i]
        if v is not None and v.sym is not None:  # sizes computed from symbolic dims stay symbolic
            return [x if isinstance(x, SymInt) else int(x) for x in v.sym.reshape(-1)]
        return [int(x) for x in np.asarray(c).reshape(-1)]

    def all_const(self) -> bool:
        return all(v is None or v.const is not None for v in self.ins)

    # -- building -------------------------------------------------------------------------------
    def reshape(self, t: TV, shape: Sequence[int]) -> TV:
        shape = tuple(s if isinstance(s, SymInt) else int(s) for s in shape)
        return t if t.shape == shape else self.add("reshape", (t,), {"shape": shape})

    def permute(self, t: TV, dims: Sequence[int]) -> TV:
        dims = tuple(dims)
        return t if dims == tuple(range(t.rank)) else self.add("permute", (t,), {"dims": dims})

    def out_type(self, k: int = 0) -> TensorType | None:
        return self.expected[k] if k < len(self.expected) else None


def norm_axis(axis: int, rank: int) -> int:
    r = max(rank, 1)
    if not -r <= axis < r:
        raise unsupported(f"axis {axis} out of range for rank {rank}")
    return axis % r
