"""The last-resort extern: ONNX ops with neither a converter nor a torch implementation run on onnx's
reference implementation, next to fused kernels, checked against onnxruntime; an output whose size
differs from the declared one is a clear error, never a wrong answer."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

import autofusion
from autofusion.errors import FrontendError

N = helper.make_node
f32, i64 = np.float32, np.int64


def test_tfidf_vectorizer_runs_on_the_reference_between_fused_kernels(onnx_model, onnx_equal) -> None:
    tfidf = N("TfIdfVectorizer", ["x"], ["t"], mode="TF", min_gram_length=2, max_gram_length=2,
              max_skip_count=0, ngram_counts=[0, 0], ngram_indexes=[0, 1, 2, 3, 4, 5, 6],
              pool_int64s=[2, 3, 5, 4, 5, 6, 7, 8, 6, 7])  # fmt: skip
    nodes = [tfidf, N("Relu", ["t"], ["r"]), N("Mul", ["r", "two"], ["y"])]
    model = onnx_model(nodes, [("x", i64, (2, 6))], [("y", f32, (2, 7))], {"two": np.array(2.0, f32)})
    x = np.array([[1, 1, 3, 3, 3, 7], [8, 6, 7, 5, 6, 8]], i64)
    cm = onnx_equal(model, x)
    externs = [n for n in cm.graph.nodes if n.op == "extern"]
    assert len(externs) == 1 and "reference implementation" in externs[0].attr("reason")
    assert cm.stats["fallbacks"] == {"onnx.TfIdfVectorizer # reason: no converter": 1}


def test_batch_normalization_in_training_mode_gives_every_output(onnx_model, onnx_equal, rng) -> None:
    node = N(
        "BatchNormalization", ["x", "s", "b", "m", "v"], ["y", "rm", "rv"], training_mode=1, epsilon=1e-3
    )
    inits = {"s": rng.random(3).astype(f32), "b": rng.random(3).astype(f32),
             "m": rng.random(3).astype(f32), "v": rng.random(3).astype(f32) + 0.5}  # fmt: skip
    declared = [("y", f32, (2, 3, 4, 5)), ("rm", f32, (3,)), ("rv", f32, (3,))]
    model = onnx_model([node], [("x", f32, (2, 3, 4, 5))], declared, inits, opset=15)
    onnx_equal(model, rng.standard_normal((2, 3, 4, 5)).astype(f32))


def _nms(onnx_model, declared: int):
    node = N("NonMaxSuppression", ["boxes", "scores", "k", "iou"], ["sel"])
    inits = {"k": np.array([3], i64), "iou": np.array([0.5], f32)}
    return onnx_model([node], [("boxes", f32, (1, 6, 4)), ("scores", f32, (1, 1, 6))],
                      [("sel", i64, (declared, 3))], inits, opset=13)  # fmt: skip


_BOXES = np.array([[[0, 0, 1, 1], [0, 0.1, 1, 1.1], [0, -0.1, 1, 0.9], [0, 10, 1, 11], [0, 10.1, 1, 11.1],
                    [0, 100, 1, 101]]], f32)  # fmt: skip
_SCORES = np.array([[[0.9, 0.75, 0.6, 0.95, 0.5, 0.3]]], f32)


def test_an_op_of_value_dependent_size_runs_at_its_declared_size(onnx_model, onnx_equal) -> None:
    onnx_equal(_nms(onnx_model, 3), _BOXES, _SCORES)


def test_an_op_of_value_dependent_size_other_than_declared_is_a_clear_error(onnx_model) -> None:
    cm = autofusion.compile(_nms(onnx_model, 2))
    with pytest.raises(
        RuntimeError, match=r"NonMaxSuppression gave an output of shape \[3, 3\].*declares \[2, 3\]"
    ):
        cm(_BOXES, _SCORES)


def test_no_declared_shape_stays_a_clear_refusal(onnx_model) -> None:
    node = N("NonMaxSuppression", ["boxes", "scores"], ["sel"])
    model = onnx_model([node], [("boxes", f32, (1, 6, 4)), ("scores", f32, (1, 1, 6))], [("sel", i64, None)],
                       opset=13)  # fmt: skip
    with pytest.raises(FrontendError, match=r"NonMaxSuppression.*not known before it runs"):
        autofusion.compile(model)(_BOXES, _SCORES)
