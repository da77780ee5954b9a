"""Scalar element types of the IR.

In: nothing. Out: the `DType` enum, conversions to and from torch dtypes (imported lazily so that the IR
itself does not need torch), and the facts codegen needs (byte size, C type, float or not).

The six types the fusion backends compute on are float32, float16, bfloat16, int32, int64 and bool.
float64, int8, uint8 and int16 are representable so that any model can be captured and run by the
reference runtime; backends that cannot compute on them say so with a reason.
"""

from __future__ import annotations

import builtins
import enum
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


class DType(enum.Enum):
    # value = short name used by the printer; it is part of the golden-IR format, so never rename.
    float32 = "f32"
    float16 = "f16"
    bfloat16 = "bf16"
    float64 = "f64"
    int64 = "i64"
    int32 = "i32"
    int16 = "i16"
    int8 = "i8"
    uint8 = "u8"
    bool = "b8"

    @property
    def short(self) -> str:
        return self.value

    @property
    def itemsize(self) -> int:
        return _ITEMSIZE[self]

    @property
    def is_float(self) -> builtins.bool:
        return self in (DType.float32, DType.float16, DType.bfloat16, DType.float64)

    @property
    def is_half(self) -> builtins.bool:
        """Stored in 16 bits, computed in fp32 by generated code (DESIGN.md decision 3)."""
        return self in (DType.float16, DType.bfloat16)

    @property
    def is_int(self) -> builtins.bool:
        return self in (DType.int64, DType.int32, DType.int16, DType.int8, DType.uint8)

    @property
    def is_bool(self) -> builtins.bool:
        return self is DType.bool

    @property
    def is_core(self) -> builtins.bool:
        """One of the six types the fusion backends generate code for."""
        return self in CORE_DTYPES

    def to_torch(self) -> torch.dtype:
        import torch

        return getattr(torch, self.name)

    @staticmethod
    def from_torch(dt: torch.dtype) -> DType:
        name = str(dt).removeprefix("torch.")
        try:
            return DType[name]
        except KeyError:
            raise UnsupportedDTypeError(f"dtype {dt} has no IR equivalent") from None

    @staticmethod
    def parse(short: str) -> DType:
        for d in DType:
            if d.value == short or d.name == short:
                return d
        raise ValueError(f"unknown dtype {short!r}; known: {', '.join(d.value for d in DType)}")


class UnsupportedDTypeError(TypeError):
    """A torch dtype (complex, float8, quantized...) that the IR cannot represent."""


_ITEMSIZE: dict[DType, int] = {
    DType.float32: 4,
    DType.float16: 2,
    DType.bfloat16: 2,
    DType.float64: 8,
    DType.int64: 8,
    DType.int32: 4,
    DType.int16: 2,
    DType.int8: 1,
    DType.uint8: 1,
    DType.bool: 1,
}

CORE_DTYPES = frozenset(
    {DType.float32, DType.float16, DType.bfloat16, DType.int32, DType.int64, DType.bool}
)


def python_scalar_dtype(value: Any) -> DType:
    """The dtype a Python scalar literal gets when it is stored in the IR as a 0-d constant."""
    if isinstance(value, bool):
        return DType.bool
    if isinstance(value, int):
        return DType.int64
    return DType.float32
