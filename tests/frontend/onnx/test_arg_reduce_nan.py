"""ONNX ArgMax / ArgMin where the input holds NaN (converters/arg_reduce.py): onnxruntime's answer (a NaN
is skipped unless it is first in its slice), which is not torch's or onnx.reference's (the first NaN)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from onnx import helper

nan, inf = np.nan, np.inf
f16, f32, f64, i64 = np.float16, np.float32, np.float64, np.int64
ROWS = [
    [nan, 1, 3, 2],  # first: it stays the answer
    [1, nan, 3, 2],
    [1, 3, 2, nan],
    [1, nan, 3, nan],
    [nan, nan, nan, nan],
    [3, nan, 3, 1],  # ties around a NaN
    [inf, nan, -inf, 1],
    [-inf, nan, -inf, nan],  # only -inf besides NaN: NaN must not tie with it
    [nan, -inf, inf, nan],
    [2, 2, 2, 2],
]


def _arg(op: str, axis: int, keep: int, last: int, dtype: type, shape: tuple[int, ...], model):  # type: ignore[no-untyped-def]
    node = helper.make_node(op, ["x"], ["y"], axis=axis, keepdims=keep, select_last_index=last)
    return model([node], [("x", dtype, shape)], [("y", i64, None)], opset=13)


@pytest.mark.parametrize(("op", "last", "keep"), itertools.product(["ArgMax", "ArgMin"], [0, 1], [0, 1]))
@pytest.mark.parametrize("dtype", [f32, f16, f64])
def test_nan_at_every_position_matches_onnxruntime(onnx_model, onnx_equal, op, last, keep, dtype) -> None:
    rows = np.array(ROWS + [r[::-1] for r in ROWS], dtype)  # [20, 4]
    onnx_equal(_arg(op, 1, keep, last, dtype, rows.shape, onnx_model), rows)
    onnx_equal(_arg(op, 0, keep, last, dtype, rows.T.shape, onnx_model), np.ascontiguousarray(rows.T))


@pytest.mark.parametrize(("op", "last"), itertools.product(["ArgMax", "ArgMin"], [0, 1]))
@pytest.mark.parametrize(("shape", "axis"), [((3, 37, 5), 1), ((4, 3, 129), 2), ((6, 7), 0), ((2, 5, 1), 2)])
def test_random_nans_on_inner_and_outer_axes(onnx_model, onnx_equal, rng, op, last, shape, axis) -> None:
    x = rng.integers(0, 4, size=shape).astype(f32)  # many ties
    x[rng.random(shape) < 0.25] = nan
    x[0] = nan  # whole slices of NaN
    onnx_equal(_arg(op, axis, 1, last, f32, shape, onnx_model), x)


def _scan(row: np.ndarray, op: str, last: int) -> int:
    best, at = row[0], 0
    for i, v in enumerate(row[1:], 1):
        if (v > best or (last and v == best)) if op == "ArgMax" else (v < best or (last and v == best)):
            best, at = v, i
    return at


@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
def test_whole_tensor_reduction_gives_the_scans_answer(onnx_model, ort_run, rng, op) -> None:
    """onnxruntime's vectorised whole-tensor kernel (16+ elements, select_last_index=0) answers with NaNs
    by its vector lanes (not compared); ours is the scan its other kernels do, and without NaN both agree."""
    import autofusion

    x = rng.integers(0, 4, size=64).astype(f32)
    x[[1, 9, 40]] = nan
    m = _arg(op, 0, 1, 0, f32, x.shape, onnx_model)
    got = autofusion.compile(m)(x).numpy()
    assert got.tolist() == [_scan(x, op, 0)]
    clean = np.nan_to_num(x, nan=1.0)
    assert autofusion.compile(m)(clean).numpy().tolist() == ort_run(m, [clean])[0].tolist()
