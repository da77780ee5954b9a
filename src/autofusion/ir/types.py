"""Tensor types: an element type, a static shape and strides (in elements).

Values inside a graph are logical tensors whose strides are contiguous; only graph inputs carry the
strides of the tensors the user passes, so generated code can index non-contiguous inputs directly
instead of copying them first.

A dim may be an `ir.symbolic.SymInt` (an int holding the example size, plus how it follows from named
symbols): graphs converted once for ONNX models with symbolic dims hold those
(`frontend/onnx/symbolic.py`). They are instantiated with plain ints before they are compiled; an
export with dynamic axes plans the symbolic graph itself (`export/writer.py` writes the symbols).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from autofusion.ir.dtypes import DType

Shape = tuple[int, ...]


def contiguous_strides(shape: Shape) -> tuple[int, ...]:
    strides: list[int] = []
    acc = 1
    for size in reversed(shape):
        strides.append(acc)
        acc *= max(size, 1)
    return tuple(reversed(strides))


@dataclass(frozen=True, slots=True)
class TensorType:
    """A tensor's dtype, shape and strides (contiguous unless given)."""

    dtype: DType
    shape: Shape
    strides: tuple[int, ...] = field(default=())

    def __post_init__(self) -> None:
        if not self.strides:
            object.__setattr__(self, "strides", contiguous_strides(self.shape))
        if len(self.strides) != len(self.shape):
            raise ValueError(f"strides {self.strides} do not match shape {self.shape}")
        if any((not isinstance(s, int)) or s < 0 for s in self.shape):
            raise ValueError(f"shape {self.shape} must hold non-negative static ints")

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * self.dtype.itemsize

    @property
    def is_contiguous(self) -> bool:
        # Strides of size-1 dims never matter, as torch also decides.
        ref = contiguous_strides(self.shape)
        return all(s == r or n <= 1 for s, r, n in zip(self.strides, ref, self.shape, strict=True))

    def with_dtype(self, dtype: DType) -> TensorType:
        return TensorType(dtype, self.shape)

    def with_shape(self, shape: Shape) -> TensorType:
        return TensorType(self.dtype, tuple(shape))

    def contiguous(self) -> TensorType:
        return self if self.strides == contiguous_strides(self.shape) else TensorType(self.dtype, self.shape)

    def __str__(self) -> str:
        dims = ",".join(str(d) for d in self.shape)
        text = f"{self.dtype.short}[{dims}]"
        if not self.is_contiguous:
            text += "{strides=" + ",".join(str(s) for s in self.strides) + "}"
        return text


def strides_match(shape: Shape, a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    """Do strides `a` and `b` address the same elements of a tensor of `shape`? Strides of size-1
    dims never matter (the index there is 0), nor any stride of an empty tensor: torch itself gives
    such dims arbitrary strides (a permute of a size-1 head dim keeps its old stride)."""
    if a == b:
        return True
    if len(a) != len(shape) or len(b) != len(shape):
        return False
    if 0 in shape:
        return True
    return all(x == y or n == 1 for x, y, n in zip(a, b, shape, strict=True))
