"""Scalar element types of the IR.

In: nothing. Out: the `DType` enum, conversions to and from torch dtypes (imported lazily so that the IR
itself does not need torch), and the facts codegen needs (byte size, C type, float or not).

The six types the fusion backends compute on are float32, float16, bfloat16, int32, int64 and bool
(the C++ backend also takes uint16, uint32 and uint64, which eager torch barely implements: ONNX models
compute on them, so generated code does). float64, int8, uint8 and int16 are representable so that any
model can be captured and run by the reference runtime; backends that cannot compute on them say so
with a reason. The reference runtime runs the wide unsigned types widened (ir/unsigned.py).

The opaque types (complex, float8/float4, quantized, bit-packed and sub-byte) are carried
only: a graph input, a constant or an `extern` node (an ATen op torch runs) may hold one, and no other
IR op reads or writes one (the verifier checks). So a graph with an FFT in the middle is still one
graph: the real-valued work around it fuses, the complex values pass between ATen calls.
"""

from __future__ import annotations

import builtins
import enum
from typing import TYPE_CHECKING, Any

from autofusion.errors import FrontendError

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
    # Opaque: carried between ATen calls, never computed on by an IR op (see `is_opaque`).
    complex32 = "c32"
    complex64 = "c64"
    complex128 = "c128"
    uint16 = "u16"  # computable since the ONNX frontend reads them; the names and order stay
    uint32 = "u32"
    uint64 = "u64"
    float8_e4m3fn = "f8e4m3fn"
    float8_e4m3fnuz = "f8e4m3fnuz"
    float8_e5m2 = "f8e5m2"
    float8_e5m2fnuz = "f8e5m2fnuz"
    float8_e8m0fnu = "f8e8m0fnu"
    float4_e2m1fn_x2 = "f4e2m1fnx2"
    qint8 = "qi8"
    quint8 = "qu8"
    qint32 = "qi32"
    quint4x2 = "qu4x2"
    quint2x4 = "qu2x4"
    bits8 = "bits8"
    bits16 = "bits16"
    bits1x8 = "bits1x8"
    bits2x4 = "bits2x4"
    bits4x2 = "bits4x2"
    int1, int2, int3, int4, int5, int6, int7 = "i1", "i2", "i3", "i4", "i5", "i6", "i7"
    uint1, uint2, uint3, uint4, uint5, uint6, uint7 = "u1", "u2", "u3", "u4", "u5", "u6", "u7"

    @property
    def short(self) -> str:
        return self.value

    @property
    def itemsize(self) -> int:
        return _ITEMSIZE.get(self, 1)

    @property
    def is_float(self) -> builtins.bool:
        return self in (DType.float32, DType.float16, DType.bfloat16, DType.float64)

    @property
    def is_half(self) -> builtins.bool:
        """Stored in 16 bits, computed in fp32 by generated code."""
        return self in (DType.float16, DType.bfloat16)

    @property
    def is_int(self) -> builtins.bool:
        return self in _INTS

    @property
    def is_unsigned(self) -> builtins.bool:
        """An unsigned integer type: wraps modulo 2^bits, compares and divides without a sign."""
        return self in _UNSIGNED

    @property
    def is_bool(self) -> builtins.bool:
        return self is DType.bool

    @property
    def is_opaque(self) -> builtins.bool:
        """Carried by the IR (inputs, constants, extern calls) but computed on by no IR op."""
        return self not in _COMPUTABLE

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
            raise UnsupportedDTypeError(f"dtype {dt} cannot be carried by the IR") from None

    @staticmethod
    def parse(short: str) -> DType:
        for d in DType:
            if d.value == short or d.name == short:
                return d
        raise ValueError(f"unknown dtype {short!r}; known: {', '.join(d.value for d in DType)}")


class UnsupportedDTypeError(FrontendError, TypeError):
    """A torch dtype the IR cannot even carry (one newer than this list): the model runs eagerly."""


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
    DType.complex32: 4,
    DType.complex64: 8,
    DType.complex128: 16,
    DType.uint16: 2,
    DType.uint32: 4,
    DType.uint64: 8,
    DType.float8_e4m3fn: 1,
    DType.float8_e4m3fnuz: 1,
    DType.float8_e5m2: 1,
    DType.float8_e5m2fnuz: 1,
    DType.float8_e8m0fnu: 1,
    DType.float4_e2m1fn_x2: 1,
    DType.qint8: 1,
    DType.quint8: 1,
    DType.qint32: 4,
    DType.quint4x2: 1,
    DType.quint2x4: 1,
    DType.bits16: 2,
    # The rest (bits8, bit-packed and sub-byte integers) take one byte per element in torch.
}

# Types some IR op computes on (the reference runtime at least); every other member is opaque.
_COMPUTABLE = frozenset({DType.float32, DType.float16, DType.bfloat16, DType.float64, DType.int64,
                         DType.int32, DType.int16, DType.int8, DType.uint8, DType.uint16, DType.uint32,
                         DType.uint64, DType.bool})  # fmt: skip
_UNSIGNED = frozenset({DType.uint8, DType.uint16, DType.uint32, DType.uint64})
_INTS = frozenset({DType.int64, DType.int32, DType.int16, DType.int8}) | _UNSIGNED

CORE_DTYPES = frozenset({DType.float32, DType.float16, DType.bfloat16, DType.int32, DType.int64, DType.bool})


def python_scalar_dtype(value: Any) -> DType:
    """The dtype a Python scalar literal gets when it is stored in the IR as a 0-d constant."""
    if isinstance(value, bool):
        return DType.bool
    if isinstance(value, int):
        return DType.int64
    return DType.float32
