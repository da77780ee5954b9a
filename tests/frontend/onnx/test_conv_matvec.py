"""A 1x1 Conv on a 1x1 map (squeeze-and-excitation's) becomes a generated reduction, not a library call
(frontend/onnx/converters/conv_matvec.py); other convolutions stay convolutions. Every result is
compared with onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from autofusion.frontend.onnx.converters import conv_matvec
from autofusion.plan.schedule import KernelStep

N = helper.make_node
f32, f16 = np.float32, np.float16
CONV = "autofusion_rules.conv_bn_act.default"


def _w(rng: np.random.Generator, *shape: int, dtype=f32) -> np.ndarray:
    return (rng.standard_normal(shape) * 0.3).astype(dtype)


def _convs(cm) -> list:
    nodes = cm.last.program.plan.graph.nodes
    return [n for n in nodes if n.op == "conv" or (n.op == "extern" and n.attr("target") == CONV)]


def _generated_reductions(cm) -> int:
    """Kernel steps (generated code) that hold a sum: where the matrix-vector products went."""
    plan = cm.last.program.plan
    return sum(
        1 for s in plan.steps if isinstance(s, KernelStep) and any(n.op == "sum" for n in s.kernel.nodes)
    )


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("n", [1, 3])
def test_pointwise_conv_on_a_pooled_map(onnx_model, onnx_equal, rng, bias: bool, n: int) -> None:
    c, k = 37, 11  # odd sizes: no vector width divides them
    inits = {"w": _w(rng, k, c, 1, 1)} | ({"b": _w(rng, k)} if bias else {})
    model = onnx_model(
        [N("Conv", ["x", "w", "b"] if bias else ["x", "w"], ["y"])],
        [("x", f32, [n, c, 1, 1])],
        [("y", f32, [n, k, 1, 1])],
        inits,
    )
    cm = onnx_equal(model, rng.standard_normal((n, c, 1, 1)).astype(f32))
    assert not _convs(cm) and _generated_reductions(cm) >= 1


def test_squeeze_excite_block_runs_without_library_convolutions(onnx_model, onnx_equal, rng) -> None:
    """EfficientNet's block as torch.onnx.export writes it: pool, conv + SiLU (Sigmoid, Mul), conv +
    Sigmoid, and the channel scale; the big depthwise conv before it stays a library call."""
    c, r = 24, 5
    inits = {
        "wd": _w(rng, c, 1, 3, 3), "bd": _w(rng, c),
        "w1": _w(rng, r, c, 1, 1), "b1": _w(rng, r),
        "w2": _w(rng, c, r, 1, 1), "b2": _w(rng, c),
    }  # fmt: skip
    nodes = [
        N("Conv", ["x", "wd", "bd"], ["d"], pads=[1, 1, 1, 1], group=c),
        N("GlobalAveragePool", ["d"], ["p"]),
        N("Conv", ["p", "w1", "b1"], ["q"]),
        N("Sigmoid", ["q"], ["qs"]),
        N("Mul", ["q", "qs"], ["qa"]),
        N("Conv", ["qa", "w2", "b2"], ["e"]),
        N("Sigmoid", ["e"], ["es"]),
        N("Mul", ["d", "es"], ["y"]),
    ]
    model = onnx_model(nodes, [("x", f32, [2, c, 13, 7])], [("y", f32, [2, c, 13, 7])], inits)
    cm = onnx_equal(model, rng.standard_normal((2, c, 13, 7)).astype(f32))
    convs = _convs(cm)
    assert len(convs) == 1 and convs[0].outputs[0].type.shape == (2, c, 13, 7)
    assert _generated_reductions(cm) >= 2


def _kept(onnx_model, onnx_equal, rng, shape, w_shape, dtype=f32, **attrs) -> None:
    w = {"w": _w(rng, *w_shape, dtype=dtype)}
    conv = N("Conv", ["x", "w"], ["y"], **attrs)
    model = onnx_model([conv], [("x", dtype, shape)], [("y", dtype, None)], w)
    cm = onnx_equal(model, rng.standard_normal(shape).astype(dtype))
    assert len(_convs(cm)) == 1


def test_other_convolutions_stay_convolutions(onnx_model, onnx_equal, rng) -> None:
    _kept(onnx_model, onnx_equal, rng, [1, 8, 2, 1], [4, 8, 1, 1])  # a 2x1 map
    _kept(onnx_model, onnx_equal, rng, [1, 8, 1, 1], [4, 8, 1, 1], pads=[1, 1, 1, 1])  # padded: 3x3 out
    _kept(onnx_model, onnx_equal, rng, [1, 8, 1, 1], [8, 2, 1, 1], group=4)  # grouped
    _kept(onnx_model, onnx_equal, rng, [1, 8, 1, 1], [4, 8, 1, 1], dtype=f16)  # fp16: library route


def test_a_large_product_stays_a_library_gemm(onnx_model, onnx_equal, rng, monkeypatch) -> None:
    monkeypatch.setattr(conv_matvec, "MAX_MACS", 8 * 4 - 1)
    _kept(onnx_model, onnx_equal, rng, [1, 8, 1, 1], [4, 8, 1, 1])
