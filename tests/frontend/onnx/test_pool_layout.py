"""ONNX MaxPool of many-channel NCHW data runs ATen's pool on a channels-last copy (externs/pool.py: the
NCHW kernel took 13-17 ms for ResNet's stem pool), with the same values and indices as onnxruntime;
few channels keep the NCHW kernel."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from autofusion.frontend.onnx.externs import pool

N = helper.make_node
f32, f16, i64 = np.float32, np.float16, np.int64

_ATTRS = [
    {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]},  # ResNet's stem
    {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1},  # padded with -inf first
    {"kernel_shape": [3, 3], "pads": [2, 1, 2, 1], "dilations": [2, 1]},
]


def _model(onnx_model, attrs, dtype, shape, indices: int | None = None):
    outs = ["y"] if indices is None else ["y", "i"]
    extra = {} if indices is None else {"storage_order": indices}
    node = N("MaxPool", ["x"], outs, **attrs, **extra)
    types = [("y", dtype, None)] + ([] if indices is None else [("i", i64, None)])
    return onnx_model([node], [("x", dtype, shape)], types, opset=22)


@pytest.mark.parametrize("dtype", [f32, f16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("attrs", _ATTRS, ids=[str(k) for k in range(len(_ATTRS))])
def test_many_channels_pool_channels_last(onnx_model, onnx_equal, rng, attrs, dtype) -> None:
    shape = (2, 17, 13, 11)  # odd sizes; 17 channels: at least CL_MIN_CHANNELS
    before = pool.CL_POOLS[0]
    cm = onnx_equal(_model(onnx_model, attrs, dtype, shape), rng.standard_normal(shape).astype(dtype))
    assert pool.CL_POOLS[0] > before
    assert cm(rng.standard_normal(shape).astype(dtype)).is_contiguous()  # handed back NCHW


@pytest.mark.parametrize("order", [0, 1])
def test_indices_through_channels_last(onnx_model, onnx_equal, rng, order) -> None:
    shape = (2, 19, 9, 10)
    x = rng.standard_normal(shape).astype(f32)
    x[0, 3, 2:5, 2:5] = 7.0  # ties: the first index in the window, as onnxruntime's
    before = pool.CL_POOLS[0]
    onnx_equal(_model(onnx_model, _ATTRS[0], f32, shape, indices=order), x)
    assert pool.CL_POOLS[0] > before


def test_few_channels_keep_the_nchw_kernel(onnx_model, onnx_equal, rng) -> None:
    shape = (1, 3, 12, 12)
    before = pool.CL_POOLS[0]
    onnx_equal(_model(onnx_model, _ATTRS[0], f32, shape), rng.standard_normal(shape).astype(f32))
    assert pool.CL_POOLS[0] == before
