"""The IR's element types as ONNX element types (`TensorProto.DataType`), and back: the one table.

In: a `DType` or an ONNX elem type. Out: the other. The ONNX frontend reads models with it (computable
types only: it builds IR ops), the exporter and the debug dumps write models with it.

It lives in the IR, next to the torch conversions in `dtypes`, because it is a fact about `DType` that
every layer reading or writing ONNX needs, and the lowest of them (the ONNX frontend) sits directly on
the IR; a table inside the frontend package would make the writers load the whole converter registry.
A module of its own keeps `import autofusion.ir` free of onnx.
"""

from __future__ import annotations

from onnx import TensorProto

from autofusion.ir.dtypes import DType

# Every DType with an ONNX counterpart. The rest (complex32, quantized, bit-packed, sub-byte ints, the
# float8 e8m0 and float4 kinds) have none in the ONNX releases we target: see `onnx_elem_type`.
DTYPE_TO_ONNX: dict[DType, int] = {
    DType.float32: TensorProto.FLOAT,
    DType.float16: TensorProto.FLOAT16,
    DType.bfloat16: TensorProto.BFLOAT16,
    DType.float64: TensorProto.DOUBLE,
    DType.int64: TensorProto.INT64,
    DType.int32: TensorProto.INT32,
    DType.int16: TensorProto.INT16,
    DType.int8: TensorProto.INT8,
    DType.uint8: TensorProto.UINT8,
    DType.bool: TensorProto.BOOL,
    DType.complex64: TensorProto.COMPLEX64,
    DType.complex128: TensorProto.COMPLEX128,
    DType.uint16: TensorProto.UINT16,
    DType.uint32: TensorProto.UINT32,
    DType.uint64: TensorProto.UINT64,
    DType.float8_e4m3fn: TensorProto.FLOAT8E4M3FN,
    DType.float8_e4m3fnuz: TensorProto.FLOAT8E4M3FNUZ,
    DType.float8_e5m2: TensorProto.FLOAT8E5M2,
    DType.float8_e5m2fnuz: TensorProto.FLOAT8E5M2FNUZ,
}
ONNX_TO_DTYPE: dict[int, DType] = {v: k for k, v in DTYPE_TO_ONNX.items()}


def onnx_elem_type(dtype: DType) -> int | None:
    """The ONNX element type of `dtype`, or None when ONNX has none (each caller decides what that means)."""
    return DTYPE_TO_ONNX.get(dtype)


def elem_type_name(elem_type: int) -> str:
    """ "FLOAT16" for 10; the number itself for a code this onnx release does not know (for messages)."""
    return (
        TensorProto.DataType.Name(elem_type) if elem_type in TensorProto.DataType.values() else str(elem_type)
    )
