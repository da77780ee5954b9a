"""The ONNX route's Linear + erf-GELU (MatMul, Add bias, then the exported Div/Erf/Add/Mul/Mul chain) as
one oneDNN call with the GELU post-op (passes/linear_post_op.py): results equal onnxruntime's in each
exported order of the chain, the fused call ran, and a chain that is not exactly GELU stays unfused."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from onnx import helper

from autofusion.passes.linear_post_op import TARGET
from autofusion.runtime import linear_post_op

N = helper.make_node
f32 = np.float32

pytestmark = pytest.mark.skipif(
    not linear_post_op.available(torch.float32), reason="a torch build without oneDNN's fused linear"
)


def _gelu_nodes(order: str, scale: float) -> list:
    """The erf GELU of h into a, in one of the orders exporters write it."""
    first = N("Div", ["h", "sq2"], ["hd"]) if order != "mul_scale" else N("Mul", ["rsq2", "h"], ["hd"])
    tail = {
        "half_last": [N("Mul", ["h", "h1"], ["hm"]), N("Mul", ["hm", "half"], ["a"])],
        "half_first": [N("Mul", ["half", "h"], ["hm"]), N("Mul", ["h1", "hm"], ["a"])],
        "mul_scale": [N("Mul", ["h1", "h"], ["hm"]), N("Mul", ["half", "hm"], ["a"])],
    }[order]
    return [first, N("Erf", ["hd"], ["he"]), N("Add", ["one", "he"], ["h1"]), *tail]


def _model(onnx_model, rng, shape, hidden, order="half_last", half=0.5):
    c = shape[-1]
    inits = {
        "w1": (rng.standard_normal((c, hidden)) / np.sqrt(c)).astype(f32),
        "b1": (0.1 * rng.standard_normal(hidden)).astype(f32),
        "w2": (rng.standard_normal((hidden, c)) / np.sqrt(hidden)).astype(f32),
        "sq2": np.asarray(np.sqrt(2.0), f32), "rsq2": np.asarray(np.sqrt(0.5), f32),
        "one": np.asarray(1.0, f32), "half": np.asarray(half, f32),
    }  # fmt: skip
    nodes = [
        N("MatMul", ["x", "w1"], ["m1"]),
        N("Add", ["m1", "b1"], ["h"]),
        *_gelu_nodes(order, half),
        N("MatMul", ["a", "w2"], ["y"]),
    ]
    return onnx_model(nodes, [("x", f32, shape)], [("y", f32, shape)], inits)


def _fused(cm) -> int:
    nodes = cm.last.program.plan.graph.nodes
    return sum(n.op == "extern" and n.attr("target") == TARGET for n in nodes)


@pytest.mark.parametrize("order", ["half_last", "half_first", "mul_scale"])
@pytest.mark.parametrize("shape", [(1, 1, 19), (1, 7, 5, 12), (2, 9, 20)], ids=str)
def test_erf_gelu_after_matmul_is_one_fused_call(onnx_model, onnx_equal, rng, order, shape) -> None:
    model = _model(onnx_model, rng, shape, 37, order)
    before = linear_post_op.CALLS["gelu"]
    cm = onnx_equal(model, (3 * rng.standard_normal(shape)).astype(f32), linear_route="onednn")
    assert _fused(cm) == 1
    assert not any(n.op == "erf" for n in cm.last.program.plan.graph.nodes)
    assert linear_post_op.CALLS["gelu"] == before + 1


def test_a_chain_that_is_not_gelu_stays_unfused(onnx_model, onnx_equal, rng) -> None:
    shape = (2, 5, 16)
    model = _model(onnx_model, rng, shape, 24, half=0.25)  # 0.25 * h * (1 + erf(h / sqrt2)): not GELU
    cm = onnx_equal(model, rng.standard_normal(shape).astype(f32), linear_route="onednn")
    assert _fused(cm) == 0


def test_measured_loss_keeps_the_plan(onnx_model, onnx_equal, rng) -> None:
    # The pinned measurement (tests/conftest.py) finds the fused call slower: auto keeps two linears.
    shape = (2, 5, 16)
    cm = onnx_equal(_model(onnx_model, rng, shape, 24), rng.standard_normal(shape).astype(f32))
    assert _fused(cm) == 0
    assert sum(n.op == "linear" for n in cm.last.program.plan.graph.nodes) == 2
