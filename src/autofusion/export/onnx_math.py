"""ONNX spellings that both the op table (`onnx_ops`) and the library expansions (`onnx_library`) write."""

from __future__ import annotations

import math

import numpy as np

from autofusion.export.writer import Sink
from autofusion.ir.dtypes import DType


def scalar(s: Sink, value: float, dtype: DType) -> str:
    """A 0-d Constant of `dtype`."""
    return s.const(np.asarray(value), dtype)


def gelu(s: Sink, x: str, dt: DType, tanh: bool, out: list[str] | None = None) -> str:
    """GELU of `x` as opset-18 nodes (Gelu itself is opset 20): the erf form, or the tanh form."""
    half = s.node("Mul", [x, scalar(s, 0.5, dt)])
    if tanh:
        cube = s.node("Mul", [s.node("Mul", [x, x]), x])
        inner = s.node("Add", [x, s.node("Mul", [cube, scalar(s, 0.044715, dt)])])
        t = s.node("Tanh", [s.node("Mul", [inner, scalar(s, math.sqrt(2.0 / math.pi), dt)])])
    else:
        t = s.node("Erf", [s.node("Mul", [x, scalar(s, 1.0 / math.sqrt(2.0), dt)])])
    return s.node("Mul", [half, s.node("Add", [t, scalar(s, 1.0, dt)])], out)
