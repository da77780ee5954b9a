"""Every IR op the exporter writes, checked end to end: a small torch function is captured (torch
frontend), its graph as imported and its rewritten plan graph are exported as plain ONNX, the fused
plan as ONNX functions; onnxruntime runs each and must match eager PyTorch."""

from __future__ import annotations

import onnx
import pytest
import torch
import torch.nn.functional as F

import autofusion
from autofusion.export.onnx import export_graph, export_plan

_GEN = torch.Generator().manual_seed(7)


def rand(*shape: int) -> torch.Tensor:
    return torch.randn(shape, generator=_GEN)


X, W8, B8 = rand(4, 8), rand(8) + 1.5, rand(8)
Q, K, V = rand(2, 3, 5, 8), rand(2, 3, 6, 8), rand(2, 3, 6, 8)
IDX = torch.tensor([3, 0, 7, 7])


def sdpa_causal(q, k, v):
    return F.scaled_dot_product_attention(q, k[:, :, :5], v[:, :, :5], is_causal=True)


def sdpa_bool_mask(q, k, v, m):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=m)


def sdpa_float_mask(q, k, v, m):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=m, scale=0.3)


def var_argmax(x):
    return x.var(1, keepdim=True) + x.argmax(1, keepdim=True).float() + x.argmin().float()


def pad_flip_slice(x):
    return F.pad(x, (1, 2, 0, 1), value=0.5).flip(0, 1)[:, ::2]


def arange_select(x):
    return x + torch.arange(8, dtype=torch.float32) + x[:, 1:2]


def any_all(x):
    return (x > 0).any(1).float() + (x > -3).all().float()


def norms(x, w, b):
    bn = F.batch_norm(x.reshape(4, 8, 1), b, w, training=False).reshape(4, 8)
    return F.rms_norm(x, (8,), w) + F.layer_norm(x, (8,)) + bn


def linear_addmm(x, w):
    lin = F.linear(x.reshape(2, 2, 8), w, w[0]).reshape(4, 8)[:, :2]
    return lin + torch.addmm(x[:, :2], x, w[:, :2], beta=0.5, alpha=2.0)


def div_modes(x):
    floor, trunc = torch.div(x, 0.3, rounding_mode="floor"), torch.div(x, 0.3, rounding_mode="trunc")
    return floor + trunc + torch.remainder(x, 0.7) + torch.fmod(x, 0.7)


def unary_zoo(x):
    a = torch.rsqrt(x.abs() + 1) + torch.expm1(x) + torch.log1p(x.abs()) + torch.log2(x.abs() + 1)
    b = F.silu(x) + F.hardsigmoid(x) + torch.erfc(x) + torch.trunc(3 * x) + torch.isfinite(x).float()
    c = torch.exp2(x) + F.leaky_relu(x, 0.2) + F.elu(x) + F.softplus(x) + F.hardswish(x) + F.mish(x)
    return a + b + c + torch.clamp(x, -0.5, 0.5) + torch.square(x)


def gather_cat_expand(x, i):
    parts = [x.index_select(1, i), torch.gather(x, 1, i.expand(4, 4)), x[:1].expand(4, 8).permute(1, 0)[:4]]
    return torch.cat(parts, 1)


def softmax_gelu_where(x):
    picked = torch.where(x != 0.5, F.log_softmax(x, 1), F.gelu(x, approximate="tanh"))
    reds = (
        x.amax(1, keepdim=True) + x.amin(1, keepdim=True) + x.prod(1, keepdim=True) + x.mean(1, keepdim=True)
    )
    return picked + reds


def conv_transpose(x, w):
    return F.conv_transpose2d(x, w, stride=2, padding=1)


CASES = {
    "sdpa_causal": (sdpa_causal, (Q, K, V)),
    "sdpa_bool_mask": (sdpa_bool_mask, (Q, K, V, rand(5, 6) > -0.5)),
    "sdpa_float_mask": (sdpa_float_mask, (Q, K, V, rand(5, 6))),
    "var_argmax": (var_argmax, (X,)),
    "pad_flip_slice": (pad_flip_slice, (X,)),
    "arange_select": (arange_select, (X,)),
    "any_all": (any_all, (X,)),
    "norms": (norms, (X, W8, B8)),
    "linear_addmm": (linear_addmm, (X, rand(8, 8))),
    "div_modes": (div_modes, (X,)),
    "unary_zoo": (unary_zoo, (X,)),
    "gather_cat_expand": (gather_cat_expand, (X, IDX)),
    "softmax_gelu_where": (softmax_gelu_where, (X,)),
    "conv_transpose": (conv_transpose, (rand(1, 4, 3, 5), rand(4, 2, 3, 3))),
}


def _ort(model: onnx.ModelProto, inputs: tuple[torch.Tensor, ...]) -> torch.Tensor:
    ort = pytest.importorskip("onnxruntime")
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    feeds = {i.name: t.numpy() for i, t in zip(sess.get_inputs(), inputs, strict=True)}
    return torch.from_numpy(sess.run(None, feeds)[0])


@pytest.mark.parametrize("name", list(CASES))
def test_exported_ops_run_in_onnxruntime(name: str) -> None:
    fn, inputs = CASES[name]
    with torch.no_grad():
        ref = fn(*inputs)
        raw = autofusion.compile(fn, inputs, fusion=False)
        fused = autofusion.compile(fn, inputs)
    assert raw.stats["extern_calls"] == 0, raw.stats["fallbacks"]
    plan = fused.last.program.plan
    exported = {"imported graph": export_graph(raw.graph), "rewritten graph": export_graph(plan.graph),
                "fused plan": export_plan(plan)}  # fmt: skip
    for what, model in exported.items():
        onnx.checker.check_model(model, full_check=True)
        torch.testing.assert_close(
            _ort(model, inputs), ref, rtol=1e-5, atol=1e-5, msg=lambda m, w=what: f"{w}: {m}"
        )
