"""ONNX MatMul of an N-d activation by an initializer becomes one `linear` on the activation as it is
(frontend/onnx/converters/matmul_weight.py): no flattening reshape, so no copy kernel before the GEMM
(ConvNeXt's MLP had one per GEMM). Every result is compared with onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from autofusion.ir.catalog import VIEWS
from autofusion.plan.schedule import KernelStep

N = helper.make_node
f32, f16 = np.float32, np.float16


def _mlp(onnx_model, rng, shape, hidden, dtype):
    """LayerNorm over the last dim, MatMul + bias, erf-GELU (as exported), MatMul: a ConvNeXt block's MLP."""
    c = shape[-1]
    inits = {
        "g": (1 + 0.1 * rng.standard_normal(c)).astype(dtype),
        "be": (0.1 * rng.standard_normal(c)).astype(dtype),
        "w1": (rng.standard_normal((c, hidden)) / np.sqrt(c)).astype(dtype),
        "b1": (0.1 * rng.standard_normal(hidden)).astype(dtype),
        "w2": (rng.standard_normal((hidden, c)) / np.sqrt(hidden)).astype(dtype),
        "sq2": np.asarray(np.sqrt(2.0), dtype), "one": np.asarray(1.0, dtype), "half": np.asarray(0.5, dtype),
    }  # fmt: skip
    nodes = [
        N("LayerNormalization", ["x", "g", "be"], ["n"], axis=-1, epsilon=1e-6),
        N("MatMul", ["n", "w1"], ["m1"]),
        N("Add", ["m1", "b1"], ["h"]),
        N("Div", ["h", "sq2"], ["hd"]),
        N("Erf", ["hd"], ["he"]),
        N("Add", ["he", "one"], ["h1"]),
        N("Mul", ["h", "h1"], ["hm"]),
        N("Mul", ["hm", "half"], ["a"]),
        N("MatMul", ["a", "w2"], ["y"]),
    ]
    return onnx_model(nodes, [("x", dtype, shape)], [("y", dtype, shape)], inits)


def _views_alone(cm) -> int:
    """Kernel steps that only copy through views (what a flattening reshape after a kernel became)."""
    plan = cm.last.program.plan
    return sum(
        1
        for s in plan.steps
        if isinstance(s, KernelStep) and all(n.op in VIEWS or n.op == "full" for n in s.kernel.nodes)
    )


@pytest.mark.parametrize("shape", [(1, 7, 5, 12), (2, 9, 20)], ids=["nhwc", "tokens"])
def test_mlp_runs_linears_without_copies(onnx_model, onnx_equal, rng, shape) -> None:
    model = _mlp(onnx_model, rng, shape, 37, f32)
    cm = onnx_equal(model, rng.standard_normal(shape).astype(f32))
    nodes = cm.last.program.plan.graph.nodes
    linears = [n for n in nodes if n.op == "linear"]
    assert len(linears) == 2 and not any(n.op in ("mm", "bmm") for n in nodes)
    assert all(len(n.inputs) == 2 and n.outputs[0].type.rank == len(shape) for n in linears)
    assert _views_alone(cm) == 0


def test_mlp_fp16(onnx_model, onnx_equal, rng) -> None:
    shape = (1, 6, 5, 16)
    model = _mlp(onnx_model, rng, shape, 24, f16)
    cm = onnx_equal(model, rng.standard_normal(shape).astype(f16))
    assert sum(n.op == "linear" for n in cm.last.program.plan.graph.nodes) == 2


def test_other_matmuls_keep_the_general_lowering(onnx_model, onnx_equal, rng) -> None:
    # A rank-2 activation (already a plain mm) and an activation by an activation.
    w = {"w": rng.standard_normal((8, 3)).astype(f32)}
    m2 = onnx_model([N("MatMul", ["x", "w"], ["y"])], [("x", f32, (5, 8))], [("y", f32, (5, 3))], w)
    cm = onnx_equal(m2, rng.standard_normal((5, 8)).astype(f32))
    assert [n.op for n in cm.last.program.plan.graph.nodes if n.op in ("mm", "linear")] == ["mm"]
    mb = onnx_model(
        [N("MatMul", ["x", "z"], ["y"])], [("x", f32, (2, 5, 8)), ("z", f32, (8, 3))], [("y", f32, (2, 5, 3))]
    )
    cm = onnx_equal(mb, rng.standard_normal((2, 5, 8)).astype(f32), rng.standard_normal((8, 3)).astype(f32))
    assert not any(n.op == "linear" for n in cm.last.program.plan.graph.nodes)
