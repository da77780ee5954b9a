"""ONNX RNN, GRU and LSTM (frontend/onnx/recurrent.py) against onnxruntime: every direction, sequence_lens,
initial states, clip, activations with alpha/beta, linear_before_reset, peepholes, input_forget, all
outputs; layout=1 (which onnxruntime's CPU kernels refuse) against onnx's reference evaluator."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from onnx import TensorProto as TP
from onnx import helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import autofusion

T, B, IN, H = 5, 3, 4, 6
GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}


def recurrent_model(kind: str, direction: str = "forward", *, bias: bool = True, lens: bool = False,
                    init: bool = False, peep: bool = False, layout: int = 0, elem: int = TP.FLOAT,
                    outputs: tuple[str, ...] = ("Y", "Y_h"),
                    **attrs: Any) -> tuple[Any, list[np.ndarray]]:  # fmt: skip
    """The model (X, W, R, B, sequence_lens, initial_h, initial_c, P as graph inputs) and its inputs."""
    rng = np.random.default_rng(1)
    nd = 2 if direction == "bidirectional" else 1
    g = GATES[kind] * H
    dt = helper.tensor_dtype_to_np_dtype(elem)
    x_shape = [B, T, IN] if layout else [T, B, IN]
    state = [B, nd, H] if layout else [nd, B, H]
    specs: list[tuple[str, Any, list[int], np.ndarray]] = [
        ("X", elem, x_shape, rng.standard_normal(x_shape)),
        ("W", elem, [nd, g, IN], rng.standard_normal((nd, g, IN)) * 0.5),
        ("R", elem, [nd, g, H], rng.standard_normal((nd, g, H)) * 0.5),
    ]
    names = ["X", "W", "R"]
    if bias:
        specs.append(("B", elem, [nd, 2 * g], rng.standard_normal((nd, 2 * g)) * 0.5))
    names.append("B" if bias else "")
    if lens:
        specs.append(("L", TP.INT32, [B], np.array([T, 2, 0][:B] if B == 3 else [T] * B)))
    names.append("L" if lens else "")
    if init:
        specs.append(("h0", elem, state, rng.standard_normal(state)))
        if kind == "LSTM":
            specs.append(("c0", elem, state, rng.standard_normal(state)))
    names.append("h0" if init else "")
    if kind == "LSTM":
        names.append("c0" if init else "")
        if peep:
            specs.append(("P", elem, [nd, 3 * H], rng.standard_normal((nd, 3 * H)) * 0.5))
        names.append("P" if peep else "")
    while names and not names[-1]:
        names.pop()
    y_shape = [B, T, nd, H] if layout else [T, nd, B, H]
    out_shapes = {"Y": y_shape, "Y_h": state, "Y_c": state}
    outs = [o if o in outputs else "" for o in ("Y", "Y_h", "Y_c")[: 3 if kind == "LSTM" else 2]]
    while not outs[-1]:
        outs.pop()
    node = helper.make_node(kind, names, outs, hidden_size=H, direction=direction, layout=layout, **attrs)
    graph = helper.make_graph(
        [node], "rnn", [helper.make_tensor_value_info(n, e, s) for n, e, s, _ in specs],
        [helper.make_tensor_value_info(o, elem, out_shapes[o]) for o in outs if o],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    model.ir_version = 8
    arrays = [a.astype(np.int32) if e == TP.INT32 else a.astype(dt) for _, e, _, a in specs]
    return model, arrays


def compare(model: Any, arrays: list[np.ndarray], ort_run: Any, tol: float = 1e-5) -> Any:
    cm = autofusion.compile(model)
    got = cm(*arrays)
    got = got if isinstance(got, tuple) else (got,)
    ref = ort_run(model, arrays)
    assert len(got) == len(ref)
    for g, r in zip(got, ref, strict=True):
        torch.testing.assert_close(g, torch.from_numpy(np.asarray(r)), rtol=tol, atol=tol)
    return cm


@pytest.mark.parametrize("kind", ["RNN", "GRU", "LSTM"])
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
@pytest.mark.parametrize("lens", [False, True])
def test_directions_and_sequence_lengths(ort_run, kind: str, direction: str, lens: bool) -> None:
    outs = ("Y", "Y_h", "Y_c") if kind == "LSTM" else ("Y", "Y_h")
    model, arrays = recurrent_model(kind, direction, lens=lens, init=True, outputs=outs)
    cm = compare(model, arrays, ort_run)
    assert cm.stats["extern_calls"] == 1


@pytest.mark.parametrize("kind", ["RNN", "GRU", "LSTM"])
def test_defaults_no_bias_no_initial_state_one_output(ort_run, kind: str) -> None:
    model, arrays = recurrent_model(kind, bias=False, outputs=("Y_h",))
    compare(model, arrays, ort_run)


@pytest.mark.parametrize("lbr", [0, 1])
@pytest.mark.parametrize("clip", [None, 0.7])
def test_gru_linear_before_reset_and_clip(ort_run, lbr: int, clip: float | None) -> None:
    attrs: dict[str, Any] = {"linear_before_reset": lbr}
    if clip is not None:
        attrs["clip"] = clip
    model, arrays = recurrent_model("GRU", "bidirectional", init=True, lens=True, **attrs)
    compare(model, arrays, ort_run)


@pytest.mark.parametrize("input_forget", [0, 1])
@pytest.mark.parametrize("clip", [None, 0.5])
def test_lstm_peepholes_input_forget_clip(ort_run, input_forget: int, clip: float | None) -> None:
    attrs: dict[str, Any] = {"input_forget": input_forget}
    if clip is not None:
        attrs["clip"] = clip
    model, arrays = recurrent_model("LSTM", "bidirectional", init=True, peep=True, lens=True,
                                    outputs=("Y", "Y_h", "Y_c"), **attrs)  # fmt: skip
    compare(model, arrays, ort_run)


@pytest.mark.parametrize(
    ("kind", "acts", "alpha", "beta"),
    [
        ("RNN", ["Relu"], [], []),
        ("RNN", ["LeakyRelu", "ScaledTanh"], [0.2, 0.9], [1.3]),
        ("GRU", ["HardSigmoid", "Softsign"], [0.3], [0.4]),
        ("GRU", ["Sigmoid", "Elu"], [], []),
        ("LSTM", ["Sigmoid", "Affine", "Softplus"], [0.5], [0.1]),
        ("LSTM", ["HardSigmoid", "Tanh", "ThresholdedRelu"], [0.25, 0.1], [0.45]),
    ],
)
def test_activations_with_alpha_and_beta(ort_run, kind: str, acts: list[str], alpha: list[float],
                                         beta: list[float]) -> None:  # fmt: skip
    attrs: dict[str, Any] = {"activations": acts}
    direction = "bidirectional" if kind == "RNN" and len(acts) == 2 else "forward"
    if alpha:
        attrs["activation_alpha"] = alpha
    if beta:
        attrs["activation_beta"] = beta
    model, arrays = recurrent_model(kind, direction, init=True, **attrs)
    compare(model, arrays, ort_run)


@pytest.mark.parametrize("kind", ["RNN", "GRU", "LSTM"])
def test_layout_1_matches_the_reference_evaluator(kind: str) -> None:
    outs = ("Y", "Y_h", "Y_c") if kind == "LSTM" else ("Y", "Y_h")
    model, arrays = recurrent_model(kind, "bidirectional" if kind != "GRU" else "forward", init=True,
                                    layout=1, outputs=outs)  # fmt: skip
    got = autofusion.compile(model)(*arrays)
    ref = ReferenceEvaluator(model).run(
        None, dict(zip([i.name for i in model.graph.input], arrays, strict=True))
    )
    for g, r in zip(got, ref, strict=True):
        torch.testing.assert_close(g, torch.from_numpy(np.asarray(r, np.float32)), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", ["RNN", "GRU", "LSTM"])
def test_fp16_computes_in_fp32(ort_run, kind: str) -> None:
    # onnxruntime's CPU kernels take fp32 only: the reference is the fp32 model on the same fp16 values.
    outs = ("Y", "Y_h", "Y_c") if kind == "LSTM" else ("Y", "Y_h")
    half, arrays16 = recurrent_model(
        kind, "bidirectional", init=True, lens=True, elem=TP.FLOAT16, outputs=outs
    )
    full, _ = recurrent_model(kind, "bidirectional", init=True, lens=True, outputs=outs)
    arrays32 = [a.astype(np.float32) if a.dtype == np.float16 else a for a in arrays16]
    got = autofusion.compile(half)(*arrays16)
    for g, r in zip(got, ort_run(full, arrays32), strict=True):
        assert g.dtype == torch.float16
        torch.testing.assert_close(g.float(), torch.from_numpy(r), rtol=2e-3, atol=2e-3)


def test_weights_as_initializers(ort_run) -> None:
    # The usual export: W, R, B are initializers (known at import), X the only input.
    model, arrays = recurrent_model("LSTM", "forward", outputs=("Y", "Y_h", "Y_c"))
    for name, arr in zip(("W", "R", "B"), arrays[1:4], strict=True):
        model.graph.initializer.append(numpy_helper.from_array(arr, name))
    del model.graph.input[1:]
    compare(model, arrays[:1], ort_run)


@pytest.mark.parametrize(("time_axis", "batch_axis"), [(0, 1), (1, 0)])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_reverse_sequence(ort_run, time_axis: int, batch_axis: int, dtype: Any) -> None:
    shape = [6, 4, 3] if time_axis == 0 else [4, 6, 3]
    node = helper.make_node(
        "ReverseSequence", ["x", "lens"], ["y"], time_axis=time_axis, batch_axis=batch_axis
    )
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    graph = helper.make_graph(
        [node], "rev", [helper.make_tensor_value_info("x", elem, shape),
                        helper.make_tensor_value_info("lens", TP.INT64, [4])],
        [helper.make_tensor_value_info("y", elem, shape)],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    x = np.random.default_rng(2).standard_normal(shape).astype(dtype)
    lens = np.array([6, 1, 3, 5], np.int64)
    got = autofusion.compile(model)(x, lens)
    np.testing.assert_array_equal(got.numpy(), ort_run(model, [x, lens])[0])
