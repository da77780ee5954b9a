"""ONNX Unique: of a constant it is evaluated at import (all four outputs as onnxruntime gives them, sorted
or in order of first occurrence, flattened or along an axis); of a graph input it is refused, since its
output length depends on the values."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import autofusion
from autofusion.errors import FrontendError

CONSTS = {
    "matrix": np.array([[2, 1, 1], [3, 4, 3], [2, 1, 1]], np.float32),
    "3d": np.array([[[1, 0], [1, 0]], [[2, 2], [1, 0]], [[1, 0], [1, 0]]], np.float32),
    "vector": np.array([5, -1, 5, 0, -0.0, 3, -1], np.float32),
    "ints": np.array([[7, 7, 1], [0, 7, 1]], np.int64),
}


def _model(c: np.ndarray, sorted_: int, axis: int | None):  # type: ignore[no-untyped-def]
    kw = {"sorted": sorted_} | ({} if axis is None else {"axis": axis})
    elem = helper.np_dtype_to_tensor_dtype(c.dtype)
    y_shape: list = ["n"]
    if axis is not None:
        y_shape = [d if k != axis % c.ndim else "n" for k, d in enumerate(c.shape)]
    outs = [("y", elem, y_shape), ("idx", TensorProto.INT64, ["k"]), ("inv", TensorProto.INT64, ["m"]),
            ("cnt", TensorProto.INT64, ["k"]), ("z", TensorProto.FLOAT, [2])]  # fmt: skip
    graph = helper.make_graph(
        [
            helper.make_node("Unique", ["c"], ["y", "idx", "inv", "cnt"], **kw),
            helper.make_node("Add", ["x", "x"], ["z"]),
        ],
        "unique",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info(*o) for o in outs],
        initializer=[numpy_helper.from_array(c, "c")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


CASES = [
    (name, s, a)
    for name, c in CONSTS.items()
    for s, a in itertools.product([0, 1], [None, *range(c.ndim), -1])
]


@pytest.mark.parametrize(("name", "sorted_", "axis"), CASES)
def test_unique_of_a_constant_matches_onnxruntime(ort_run, name: str, sorted_: int, axis: int | None) -> None:
    model = _model(CONSTS[name], sorted_, axis)
    x = np.array([1.5, -2.0], np.float32)
    ref = ort_run(model, [x])
    got = autofusion.compile(model)(x)
    assert len(got) == len(ref) == 5
    for k, (g, r) in enumerate(zip(got, ref, strict=True)):
        g = g.numpy()
        assert g.dtype == r.dtype and g.shape == r.shape and np.array_equal(g, r), (k, g, r)


def test_unique_of_an_input_is_refused(onnx_model) -> None:
    node = helper.make_node("Unique", ["x"], ["y"], sorted=1)
    model = onnx_model([node], [("x", np.float32, (6,))], [("y", np.float32, ("n",))])
    with pytest.raises(FrontendError, match="Unique's output length depends on the input's values"):
        autofusion.compile(model)


def test_nan_is_one_value_as_in_onnx_reference() -> None:
    """onnxruntime's answer with NaN comes from an ordering NaN breaks (it merges NaNs into other values);
    ours is numpy's and onnx.reference's: the NaNs are one value, sorted last."""
    from onnx.reference import ReferenceEvaluator

    c = np.array([2, np.nan, 1, np.nan, 2, -0.0], np.float32)
    model = _model(c, 1, None)
    got = [g.numpy() for g in autofusion.compile(model)(np.zeros(2, np.float32))[:4]]
    ref = ReferenceEvaluator(model.graph.node[0]).run(None, {"c": c})
    assert [np.asarray(r).tolist() for r in ref][1:] == [g.tolist() for g in got][1:]
    np.testing.assert_array_equal(got[0], ref[0])  # NaN equals NaN here
    assert got[3].tolist() == [1, 1, 2, 2] and np.isnan(got[0][-1])
