"""ONNX Attention, RotaryEmbedding, CausalConvWithState and LinearAttention as fusing IR decompositions
(converters/attention.py), against onnxruntime: every input and output, mask kinds, causal with a cache,
GQA, softcap, qk_matmul_output modes, nonpad_kv_seqlen, fully masked rows, fp32 and fp16."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from onnx import TensorProto, helper

N = helper.make_node
f32, f16 = np.float32, np.float16


def r(rng: np.random.Generator, *shape: int, dtype=f32) -> np.ndarray:
    return rng.standard_normal(shape).astype(dtype)


@pytest.fixture
def model(onnx_model):
    def make(nodes, inputs, outputs, inits=None, opset=24):
        m = onnx_model(nodes, inputs, outputs, inits, opset=opset)
        m.ir_version = helper.find_min_ir_version_for(list(m.opset_import))
        return m

    return make


def lowered(cm) -> None:
    assert not cm.stats["fallbacks"], cm.stats["fallbacks"]


def attention(model, dtype, q, k, v, extra: dict[str, tuple[Any, tuple[int, ...]]], outputs, **attrs):
    """An Attention node over inputs Q, K, V plus `extra` (name -> (dtype, shape)) in the spec's order."""
    order = ["attn_mask", "past_key", "past_value", "nonpad_kv_seqlen"]
    names = ["Q", "K", "V"] + [n if n in extra else "" for n in order]
    while names[-1] == "":
        names.pop()
    ins = [("Q", dtype, q), ("K", dtype, k), ("V", dtype, v)] + [(n, *extra[n]) for n in order if n in extra]
    outs = [o for o in outputs]
    return model([N("Attention", names, outs, **attrs)], ins, [(o, dtype, None) for o in outs if o])


CASES = [
    # name, q, k, v, extra inputs, attrs
    ("4d", (2, 3, 4, 8), (2, 3, 6, 8), (2, 3, 6, 5), {}, {}),
    ("4d_causal", (2, 3, 4, 8), (2, 3, 6, 8), (2, 3, 6, 8), {}, {"is_causal": 1}),
    ("4d_scale_softcap", (1, 2, 5, 8), (1, 2, 5, 8), (1, 2, 5, 8), {}, {"scale": 0.7, "softcap": 2.0}),
    ("gqa", (2, 6, 3, 4), (2, 2, 5, 4), (2, 2, 5, 4), {}, {"is_causal": 1}),
    ("mqa_3d", (2, 3, 24), (2, 5, 4), (2, 5, 6), {}, {"q_num_heads": 6, "kv_num_heads": 1}),
    (
        "3d_causal",
        (2, 4, 16),
        (2, 4, 16),
        (2, 4, 16),
        {},
        {"q_num_heads": 2, "kv_num_heads": 2, "is_causal": 1},
    ),
    ("float_mask_3d", (2, 3, 4, 8), (2, 3, 6, 8), (2, 3, 6, 8), {"attn_mask": (None, (3, 4, 6))}, {}),
    ("bool_mask_2d", (2, 3, 4, 8), (2, 3, 6, 8), (2, 3, 6, 8), {"attn_mask": (np.bool_, (4, 6))}, {}),
    (
        "bool_mask_causal",
        (1, 2, 4, 8),
        (1, 2, 4, 8),
        (1, 2, 4, 8),
        {"attn_mask": (np.bool_, (1, 1, 4, 4))},
        {"is_causal": 1},
    ),
    (
        "past_causal",
        (2, 2, 3, 4),
        (2, 2, 3, 4),
        (2, 2, 3, 4),
        {"past_key": (None, (2, 2, 5, 4)), "past_value": (None, (2, 2, 5, 4))},
        {"is_causal": 1},
    ),
    (
        "nonpad",
        (2, 2, 3, 4),
        (2, 2, 7, 4),
        (2, 2, 7, 4),
        {"nonpad_kv_seqlen": (np.int64, (2,))},
        {"is_causal": 1},
    ),
]


@pytest.mark.parametrize("dtype", [f32, f16])
@pytest.mark.parametrize(("name", "q", "k", "v", "extra", "attrs"), CASES, ids=[c[0] for c in CASES])
def test_attention(model, onnx_equal, rng, dtype, name, q, k, v, extra, attrs) -> None:
    extra = {n: (dtype if dt is None else dt, s) for n, (dt, s) in extra.items()}
    has_past = "past_key" in extra
    outputs = ["Y", "present_key", "present_value"] if has_past else ["Y"]
    m = attention(model, dtype, q, k, v, extra, outputs, **attrs)
    arrays = [r(rng, *q, dtype=dtype), r(rng, *k, dtype=dtype), r(rng, *v, dtype=dtype)]
    for n, (dt, s) in extra.items():
        if dt is np.bool_:
            arrays.append(rng.random(s) > 0.3)
        elif n == "nonpad_kv_seqlen":
            arrays.append(np.asarray([7, 4], np.int64))  # the second batch has padded keys
        else:
            arrays.append(r(rng, *s, dtype=dtype))
    lowered(onnx_equal(m, *arrays))


@pytest.mark.parametrize("mode", [0, 1, 2, 3])
def test_attention_qk_matmul_output_modes(model, onnx_equal, rng, mode) -> None:
    q, kv = (1, 2, 4, 8), (1, 2, 6, 8)
    m = attention(
        model,
        f32,
        q,
        kv,
        kv,
        {"attn_mask": (f32, (4, 6))},
        ["Y", "", "", "qk"],
        qk_matmul_output_mode=mode,
        softcap=3.0,
    )
    lowered(onnx_equal(m, r(rng, *q), 2 * r(rng, *kv), r(rng, *kv), r(rng, 4, 6)))


def test_attention_fully_masked_rows_are_zero(model, onnx_equal, rng) -> None:
    q, kv = (1, 2, 4, 8), (1, 2, 6, 8)
    mask = rng.random((4, 6)) > 0.5
    mask[1, :] = False  # row 1 sees no key: Y's row and the probabilities are 0, not NaN
    m = attention(
        model, f32, q, kv, kv, {"attn_mask": (np.bool_, (4, 6))}, ["Y", "", "", "p"], qk_matmul_output_mode=3
    )
    cm = onnx_equal(m, r(rng, *q), r(rng, *kv), r(rng, *kv), mask)
    lowered(cm)
    y, p = cm(r(rng, *q), r(rng, *kv), r(rng, *kv), mask)
    assert bool((y[:, :, 1] == 0).all()) and bool((p[:, :, 1] == 0).all())


def test_attention_softmax_precision(model, onnx_equal, rng) -> None:
    q = (1, 2, 4, 8)
    m = attention(model, f16, q, q, q, {}, ["Y"], softmax_precision=TensorProto.FLOAT)
    lowered(onnx_equal(m, *(r(rng, *q, dtype=f16) for _ in range(3))))


@pytest.mark.parametrize("dtype", [f32, f16])
@pytest.mark.parametrize("interleaved", [0, 1])
@pytest.mark.parametrize("rotary_dim", [0, 4])
@pytest.mark.parametrize("with_positions", [True, False])
def test_rotary_embedding(model, onnx_equal, rng, dtype, interleaved, rotary_dim, with_positions) -> None:
    b, h, s, d = 2, 3, 5, 8
    half = (rotary_dim or d) // 2
    cache = (11, half) if with_positions else (b, s, half)
    names = ["x", "cos", "sin"] + (["pos"] if with_positions else [])
    ins = [("x", dtype, (b, h, s, d)), ("cos", dtype, cache), ("sin", dtype, cache)]
    ins += [("pos", np.int64, (b, s))] if with_positions else []
    m = model(
        [N("RotaryEmbedding", names, ["y"], interleaved=interleaved, rotary_embedding_dim=rotary_dim)],
        ins,
        [("y", dtype, (b, h, s, d))],
        opset=23,
    )
    angles = r(rng, *cache)
    arrays = [r(rng, b, h, s, d, dtype=dtype), np.cos(angles).astype(dtype), np.sin(angles).astype(dtype)]
    if with_positions:
        arrays.append(rng.integers(0, 11, (b, s)).astype(np.int64))
    lowered(onnx_equal(m, *arrays))


def test_rotary_embedding_3d(model, onnx_equal, rng) -> None:
    b, s, heads, d = 2, 4, 3, 6
    m = model(
        [N("RotaryEmbedding", ["x", "cos", "sin"], ["y"], num_heads=heads)],
        [("x", f32, (b, s, heads * d)), ("cos", f32, (b, s, d // 2)), ("sin", f32, (b, s, d // 2))],
        [("y", f32, (b, s, heads * d))],
        opset=23,
    )
    a = r(rng, b, s, d // 2)
    lowered(onnx_equal(m, r(rng, b, s, heads * d), np.cos(a), np.sin(a)))


@pytest.mark.parametrize("dtype", [f32, f16])
@pytest.mark.parametrize(
    ("k", "past", "bias", "activation"),
    [(3, False, False, "none"), (4, True, True, "silu"), (1, False, True, "swish")],
)
def test_causal_conv_with_state(model, onnx_equal, rng, dtype, k, past, bias, activation) -> None:
    b, c, n = 2, 5, 7
    names = ["x", "w", "b" if bias else "", "state" if past else ""]
    while names[-1] == "":
        names.pop()
    ins = [("x", dtype, (b, c, n)), ("w", dtype, (c, 1, k))]
    ins += [("b", dtype, (c,))] if bias else []
    ins += [("state", dtype, (b, c, k - 1))] if past else []
    m = model(
        [N("CausalConvWithState", names, ["y", "present"], activation=activation)],
        ins,
        [("y", dtype, (b, c, n)), ("present", dtype, (b, c, k - 1))],
        opset=27,
    )
    arrays = [r(rng, b, c, n, dtype=dtype), r(rng, c, 1, k, dtype=dtype)]
    arrays += [r(rng, c, dtype=dtype)] if bias else []
    arrays += [r(rng, b, c, k - 1, dtype=dtype)] if past else []
    lowered(onnx_equal(m, *arrays))


@pytest.mark.parametrize("dtype", [f32, f16])
@pytest.mark.parametrize(
    ("rule", "hq", "hk", "decay_last", "beta_last", "past"),
    [
        ("linear", 2, 2, None, None, False),
        ("gated", 4, 2, "dk", None, True),
        ("delta", 2, 2, None, "h", False),
        ("gated_delta", 4, 1, "h", 1, True),
    ],
)
def test_linear_attention(model, onnx_equal, rng, dtype, rule, hq, hk, decay_last, beta_last, past) -> None:
    b, t, dk, dv = 2, 5, 4, 3
    names = ["q", "k", "v", "s" if past else "", "g" if decay_last else "", "beta" if beta_last else ""]
    while names[-1] == "":
        names.pop()
    ins = [("q", dtype, (b, t, hq * dk)), ("k", dtype, (b, t, hk * dk)), ("v", dtype, (b, t, hk * dv))]
    arrays = [
        r(rng, b, t, hq * dk, dtype=dtype),
        r(rng, b, t, hk * dk, dtype=dtype),
        r(rng, b, t, hk * dv, dtype=dtype),
    ]
    if past:
        ins.append(("s", dtype, (b, hk, dk, dv)))
        arrays.append(r(rng, b, hk, dk, dv, dtype=dtype))
    if decay_last:
        g = hk * dk if decay_last == "dk" else hk
        ins.append(("g", dtype, (b, t, g)))
        arrays.append((-0.5 * rng.random((b, t, g))).astype(dtype))
    if beta_last:
        bl = hk if beta_last == "h" else 1
        ins.append(("beta", dtype, (b, t, bl)))
        arrays.append(rng.random((b, t, bl)).astype(dtype))
    m = model(
        [N("LinearAttention", names, ["y", "state"], update_rule=rule, q_num_heads=hq, kv_num_heads=hk)],
        ins,
        [("y", dtype, (b, t, hq * dv)), ("state", dtype, (b, hk, dk, dv))],
        opset=27,
    )
    lowered(onnx_equal(m, *arrays))


@pytest.mark.parametrize("mask_dtype", [np.bool_, f32])
def test_attention_mask_shorter_than_the_keys(model, rng, mask_dtype) -> None:
    """A mask shorter than the keys leaves the rest masked (the spec pads it with -inf / False). onnxruntime
    refuses such a mask, so this one is checked against onnx's reference evaluator."""
    import torch
    from onnx.reference import ReferenceEvaluator

    import autofusion

    q, kv = (2, 3, 4, 8), (2, 3, 6, 8)
    m = attention(model, f32, q, kv, kv, {"attn_mask": (mask_dtype, (4, 4))}, ["Y"])
    mask = rng.random((4, 4)) > 0.3 if mask_dtype is np.bool_ else r(rng, 4, 4)
    arrays = [r(rng, *q), r(rng, *kv), r(rng, *kv), mask]
    (want,) = ReferenceEvaluator(m).run(None, dict(zip(["Q", "K", "V", "attn_mask"], arrays, strict=True)))
    cm = autofusion.compile(m)
    torch.testing.assert_close(cm(*arrays), torch.from_numpy(want), rtol=1e-5, atol=1e-5)
    lowered(cm)
