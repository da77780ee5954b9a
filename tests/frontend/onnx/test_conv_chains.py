"""An ONNX CNN reaches the torch route's convolution path: Conv (+ Add) (+ Relu / Clip / x*Sigmoid(x))
becomes the conv_bn_act library call (no BN: exporters fold it into the conv), so the layout pass
finds chains and runs them on oneDNN with prepacked weights and post-ops; an all-zero bias is left out
(a `full` made each call would defeat the fold cache); initializers are bound once per executor.
Every result is compared with onnxruntime."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from onnx import helper

import autofusion
from autofusion.passes import layout
from autofusion.passes.layout_timing import ChainTiming
from autofusion.runtime import library
from autofusion.runtime.executor import PlanExecutor

N = helper.make_node
f32, f16 = np.float32, np.float16
CONV = "autofusion_rules.conv_bn_act.default"


def _w(rng: np.random.Generator, *shape: int, dtype=f32) -> np.ndarray:
    return (rng.standard_normal(shape) * 0.3).astype(dtype)


def _block(onnx_model, rng: np.random.Generator, dtype=f32, zero_bias: bool = False) -> onnx.ModelProto:
    """A ResNet basic block, a MobileNet depthwise conv + Clip(0, 6) and an EfficientNet conv + SiLU
    (as Sigmoid and Mul), each conv reading the previous one's result directly."""
    c = 8
    b = (lambda n: np.zeros(n, dtype)) if zero_bias else (lambda n: _w(rng, n, dtype=dtype))
    inits = {
        "w1": _w(rng, c, c, 3, 3, dtype=dtype), "b1": b(c),
        "w2": _w(rng, c, c, 3, 3, dtype=dtype), "b2": b(c),
        "wd": _w(rng, c, 1, 3, 3, dtype=dtype), "bd": b(c),
        "w3": _w(rng, c, c, 1, 1, dtype=dtype), "b3": b(c),
        "lo": np.asarray(0, dtype), "hi": np.asarray(6, dtype),
    }  # fmt: skip
    nodes = [
        N("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        N("Relu", ["c1"], ["r1"]),
        N("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1]),
        N("Add", ["c2", "x"], ["a2"]),
        N("Relu", ["a2"], ["r2"]),
        N("Conv", ["r2", "wd", "bd"], ["cd"], pads=[1, 1, 1, 1], strides=[2, 2], group=c),
        N("Clip", ["cd", "lo", "hi"], ["rd"]),
        N("Conv", ["rd", "w3", "b3"], ["c3"]),
        N("Sigmoid", ["c3"], ["s3"]),
        N("Mul", ["c3", "s3"], ["y"]),
    ]
    return onnx_model(nodes, [("x", dtype, [2, c, 11, 9])], [("y", dtype, [2, c, 6, 5])], inits)


RULES = {"conv_relu": 1, "conv_add_relu": 1, "conv_relu6": 1, "conv_sigmoid_mul": 1}
NO_BN_RULES = frozenset({*RULES, "conv_add", "conv_silu"})


@pytest.fixture
def onednn_chains(monkeypatch: pytest.MonkeyPatch) -> None:
    """The layout pass's measurement replaced by timings in which oneDNN wins every convolution (the
    real one measures only on a quiet machine), so the chain takes the route the torch route takes."""
    timing = ChainTiming({"aten": 3e-3, "aten_cl": 2e-3, "onednn": 1e-3})
    monkeypatch.setattr(layout, "timer_for", lambda cache: lambda spec: timing)
    library.ROUTE_CALLS.clear()


@pytest.fixture
def nchw_chains(monkeypatch: pytest.MonkeyPatch) -> None:
    """Timings in which NCHW wins every convolution: where a channels-last route measures faster (a quiet
    machine), the layout pass routes even a plain conv through conv_bn_act, and a plan's calls would then
    depend on the machine and its load."""
    timing = ChainTiming({"aten": 1e-3, "aten_cl": 2e-3, "onednn": 3e-3, "dnnl": 3e-3})
    monkeypatch.setattr(layout, "timer_for", lambda cache: lambda spec: timing)


def _calls(cm) -> list:
    return [n for n in cm.last.program.plan.graph.nodes if n.op == "extern" and n.attr("target") == CONV]


def test_block_becomes_conv_bn_act_calls(onnx_model, onnx_equal, rng, nchw_chains) -> None:
    model = _block(onnx_model, rng)
    x = rng.standard_normal((2, 8, 11, 9)).astype(f32)
    cm = onnx_equal(model, x)
    assert cm.stats["rules"] == RULES
    assert [n.attr("args")[13] for n in _calls(cm)] == ["relu", "relu", "relu6", "silu"]
    assert not any(n.op == "conv" for n in cm.last.program.plan.graph.nodes)
    off = onnx_equal(model, x, disabled=NO_BN_RULES)  # the rules are what made the calls
    assert not off.stats.get("rules") and not _calls(off)


def test_block_runs_as_one_onednn_chain(onnx_model, ort_run, rng, onednn_chains) -> None:
    model = _block(onnx_model, rng)
    x = rng.standard_normal((2, 8, 11, 9)).astype(f32)
    cm = autofusion.compile(model)
    (ref,) = ort_run(model, [x])
    for _ in range(2):  # the second call runs on the weights prepacked by the first
        torch.testing.assert_close(cm(x), torch.from_numpy(ref), rtol=1e-4, atol=1e-5)
    calls = _calls(cm)
    assert [n.attr("args")[14] for n in calls] == ["onednn"] * 4
    # Channels-last inside the chain, NCHW handed back at its end (the graph output).
    assert [n.attr("args")[15] for n in calls] == [True, True, True, False]
    assert library.ROUTE_CALLS["onednn"] == 8 and library.ROUTE_CALLS["aten"] == 0
    misses = library.FOLDS.misses
    cm(x)
    assert library.FOLDS.misses == misses  # weights packed once: the initializers are the same tensors


def test_block_fp16_against_onnxruntime(onnx_model, ort_run, rng) -> None:
    model = _block(onnx_model, rng, dtype=f16)
    x = rng.standard_normal((2, 8, 11, 9)).astype(f16)
    cm = autofusion.compile(model)
    (ref,) = ort_run(model, [x])
    got = cm(x)
    assert got.dtype == torch.float16 and cm.stats["rules"] == RULES
    torch.testing.assert_close(got.float(), torch.from_numpy(ref).float(), rtol=1e-2, atol=1e-2)


def test_zero_bias_is_left_out_and_the_fold_cache_hits(onnx_model, ort_run, rng, onednn_chains) -> None:
    model = _block(onnx_model, rng, zero_bias=True)
    x = rng.standard_normal((2, 8, 11, 9)).astype(f32)
    cm = autofusion.compile(model)
    (ref,) = ort_run(model, [x])
    torch.testing.assert_close(cm(x), torch.from_numpy(ref), rtol=1e-4, atol=1e-5)
    assert [n.attr("args")[2] for n in _calls(cm)] == [None] * 4  # no bias tensor
    assert not any(n.op == "full" for n in cm.last.program.plan.graph.nodes)
    misses = library.FOLDS.misses
    torch.testing.assert_close(cm(x), torch.from_numpy(ref), rtol=1e-4, atol=1e-5)
    assert library.FOLDS.misses == misses


def test_a_nonzero_uniform_bias_stays(onnx_model, onnx_equal, rng) -> None:
    model = onnx_model(
        [N("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]), N("Relu", ["c"], ["y"])],
        [("x", f32, [1, 3, 5, 5])],
        [("y", f32, [1, 4, 5, 5])],
        {"w": _w(rng, 4, 3, 3, 3), "b": np.full(4, -0.25, f32)},
    )
    cm = onnx_equal(model, rng.standard_normal((1, 3, 5, 5)).astype(f32))
    (call,) = _calls(cm)
    assert call.attr("args")[2] is not None


def test_initializers_are_bound_once(onnx_model, rng) -> None:
    model = _block(onnx_model, rng)
    x = rng.standard_normal((2, 8, 11, 9)).astype(f32)
    # Plain convs reading const weights, run step by step (SuperKernel entries bind constants already).
    cm = autofusion.compile(model, disabled=NO_BN_RULES, super_kernel="off")
    y = cm(x)
    ex = cm.last.program.executor
    ex = getattr(ex, "inner", ex)
    assert isinstance(ex, PlanExecutor)
    assert any(n.op == "const" for n in cm.last.program.plan.graph.nodes)
    assert not any(i[0] == "node" and i[1].op == "const" for i in ex._program)
    assert len(ex._consts) >= 8
    torch.testing.assert_close(cm(x), y)
