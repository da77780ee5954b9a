"""The structural op catalogue (reductions, normalisations, views, matmul and conv, indexing,
factories, attention), one op per case, each compiled both ways and compared with eager; and how an
op with no converter falls back (an extern call, logged once per op with a count in the summary).

See test_op_catalog_elementwise.py for the conventions (the `compile_both_ways` fixture lives in
tests/conftest.py).
"""

from __future__ import annotations

import logging

import pytest
import torch
import torch.nn.functional as F

import autofusion

_GEN = torch.Generator().manual_seed(1)


def rand(*shape: int, lo: float = -2.0, hi: float = 2.0, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return (torch.rand(shape, generator=_GEN) * (hi - lo) + lo).to(dtype)


def randint(*shape: int, lo: int = -5, hi: int = 6, dtype: torch.dtype = torch.int64) -> torch.Tensor:
    return torch.randint(lo, hi, shape, generator=_GEN).to(dtype)


# Cases whose graphs legitimately have no generated kernel, and why (compile_both_ways checks they
# have none; every other case must run a generated kernel).
_LIBRARY = "runs as a library call (ATen), by design of the C++ backend"
_VIEWS = "views of the input only: no data is computed"
NO_KERNEL = {
    **dict.fromkeys(["argmax", "argmin", "any", "all"], f"the reduction {_LIBRARY}"),
    **dict.fromkeys(
        ["index_select", "gather", "embedding", "embedding-functional"],
        "gathers are bounds-checked by torch: a library call",
    ),
    **dict.fromkeys(
        [
            "mm",
            "bmm",
            "addmm",
            "matmul-2d-2d",
            "matmul-3d-2d",
            "matmul-4d-3d-broadcast",
            "matmul-1d",
            "linear-bias",
            "linear-no-bias",
            "conv1d",
            "conv2d-stride-padding",
            "conv2d-dilation-groups",
            "conv_transpose2d",
            "sdpa",
            "sdpa-bool-mask",
            "sdpa-float-mask",
            "sdpa-causal",
            "matmul",
            "conv2d",
            "matmul-empty-and-size1",
            "matmul-transposed-input",
        ],
        f"matmul / conv / attention {_LIBRARY}",
    ),
    **dict.fromkeys(
        [
            "view",
            "reshape",
            "flatten",
            "expand",
            "expand_as",
            "squeeze",
            "unsqueeze",
            "slice-steps",
            "select",
            "narrow",
            "split",
            "chunk",
            "unbind",
            "view-of-sliced-input",
        ],
        _VIEWS,
    ),
    "ones": "every output folds to a constant or to the input",
}


def case(name: str, fn, *inputs: torch.Tensor):
    marks = [pytest.mark.no_kernel(NO_KERNEL[name])] if name in NO_KERNEL else []
    return pytest.param(fn, inputs, id=name, marks=marks)


def module_case(name: str, module: torch.nn.Module, *inputs: torch.Tensor):
    """A module with seeded, non-trivial parameters and buffers, in eval mode."""
    with torch.no_grad():
        for t in list(module.parameters()) + [b for b in module.buffers() if b.is_floating_point()]:
            t.copy_(torch.rand(t.shape, generator=_GEN) + 0.5)
    return case(name, module.eval(), *inputs)


def run_cases(cases):
    return pytest.mark.parametrize("fn,inputs", cases)


X3 = rand(2, 3, 4)
ROWS = rand(3, 5)

# ---- reductions ----------------------------------------------------------------------------------
REDUCE = [
    case("sum", lambda x: (x.sum(1), x.sum((0, 2), keepdim=True), x.sum(-1), x.sum()), X3),
    case(
        "sum-int-and-bool",
        lambda i, k, m: (i.sum(1), k.sum(), k.sum(0, keepdim=True), m.sum(1), i.sum(dtype=torch.float32)),
        randint(3, 5),
        randint(3, 5, dtype=torch.int32),
        ROWS > 0,
    ),
    case("mean", lambda x: (x.mean(1), x.mean((0, 2), keepdim=True), x.mean()), X3),
    case(
        "amax", lambda x, i: (x.amax(1), x.amax((0, 2), keepdim=True), x.amax(), i.amax(0)), X3, randint(3, 5)
    ),
    case(
        "amin", lambda x, i: (x.amin(1), x.amin((0, 2), keepdim=True), x.amin(), i.amin(0)), X3, randint(3, 5)
    ),
    case(
        "prod",
        lambda x, i: (x.prod(1), x.prod(2, keepdim=True), x.prod(), i.prod(0)),
        rand(2, 3, 4, lo=0.5, hi=1.5),
        randint(3, 5),
    ),
    case(
        "var",
        lambda x: (
            x.var(1),
            x.var((0, 2), keepdim=True),
            x.var(),
            x.var(1, unbiased=False),
            torch.var(x, 2, correction=0),
        ),
        X3,
    ),
    case("std", lambda x: (x.std(1), x.std((0, 2), keepdim=True), x.std(), x.std(1, unbiased=False)), X3),
    case("max-global", lambda x, i: (x.max(), i.max()), X3, randint(3, 5)),
    case("min-global", lambda x, i: (x.min(), i.min()), X3, randint(3, 5)),
    # Ties (ints in a small range) must return the first index, as eager does.
    case(
        "max-dim",
        lambda x, i: (*x.max(1), *x.max(-1, keepdim=True), *i.max(1)),
        X3,
        randint(3, 8, lo=0, hi=3),
    ),
    case(
        "min-dim",
        lambda x, i: (*x.min(1), *x.min(-1, keepdim=True), *i.min(1)),
        X3,
        randint(3, 8, lo=0, hi=3),
    ),
    case(
        "argmax",
        lambda x, i: (x.argmax(), x.argmax(1), x.argmax(-1, keepdim=True), i.argmax(1)),
        X3,
        randint(3, 8, lo=0, hi=3),
    ),
    case(
        "argmin",
        lambda x, i: (x.argmin(), x.argmin(1), x.argmin(-1, keepdim=True), i.argmin(1)),
        X3,
        randint(3, 8, lo=0, hi=3),
    ),
    case(
        "any",
        lambda m, x: (m.any(), m.any(1), m.any(0, keepdim=True), x.any(1)),
        ROWS > 1.0,
        randint(3, 5, lo=0, hi=2),
    ),
    case(
        "all",
        lambda m, x: (m.all(), m.all(1), m.all(0, keepdim=True), x.all(1)),
        ROWS > -1.5,
        randint(3, 5, lo=0, hi=2),
    ),
]


@run_cases(REDUCE)
def test_reduction(fn, inputs, compile_both_ways) -> None:
    compile_both_ways(fn, inputs)


# ---- normalisations --------------------------------------------------------------------------------
NORM = [
    case("softmax", lambda x: (torch.softmax(x, -1), F.softmax(x, dim=1)), X3),
    case("log_softmax", lambda x: (torch.log_softmax(x, -1), F.log_softmax(x, dim=0)), X3),
    module_case("layer_norm-affine", torch.nn.LayerNorm(4), X3),
    module_case("layer_norm-no-affine", torch.nn.LayerNorm([3, 4], elementwise_affine=False), X3),
    module_case("rms_norm-weight", torch.nn.RMSNorm(4, eps=1e-6), X3),
    case("rms_norm-no-weight", lambda x: (F.rms_norm(x, (4,)), F.rms_norm(x, (3, 4), eps=1e-3)), X3),
    module_case("batch_norm-eval", torch.nn.BatchNorm2d(3), rand(2, 3, 4, 4)),
    module_case("group_norm-affine", torch.nn.GroupNorm(2, 6), rand(2, 6, 5, 3)),
    module_case("group_norm-per-channel-odd-length", torch.nn.GroupNorm(4, 4), rand(3, 4, 37)),
    module_case("group_norm-no-affine-batch1", torch.nn.GroupNorm(3, 3, affine=False), rand(1, 3, 1, 2)),
    case("group_norm-functional-2d", lambda x: F.group_norm(x, 1, eps=1e-3), rand(4, 6)),
]


@run_cases(NORM)
def test_normalisation(fn, inputs, compile_both_ways) -> None:
    compile_both_ways(fn, inputs)


# ---- views and data movement -----------------------------------------------------------------------
X4 = rand(2, 3, 4, 5)
VIEWS = [
    case("view", lambda x: (x.view(6, 4), x.view(-1), x.view(2, -1, 2)), X3),
    case("reshape", lambda x: (x.reshape(4, 6), x.reshape(-1, 3), x.t().reshape(-1)), rand(4, 6)),
    case("flatten", lambda x: (x.flatten(), x.flatten(1), x.flatten(1, 2)), X4),
    case("permute", lambda x: (x.permute(2, 0, 1), x.permute(0, 2, 1) + 1.0), X3),
    case("transpose", lambda x: (x.transpose(0, 2), x.transpose(-1, -2) * 2.0), X3),
    case("t", lambda x: (x.t(), x.t() + 1.0), ROWS),
    case("expand", lambda c, r: (c.expand(3, 5), r.expand(2, 3, 5), c.expand(-1, 4)), rand(3, 1), rand(5)),
    case("expand_as", lambda c, x: c.expand_as(x), rand(3, 1), ROWS),
    case("squeeze", lambda x: (x.squeeze(), x.squeeze(1), x.squeeze(-1)), rand(3, 1, 4, 1)),
    case("unsqueeze", lambda x: (x.unsqueeze(0), x.unsqueeze(-1), x.unsqueeze(1)), ROWS),
    case("slice-steps", lambda x: (x[1:-1:2], x[:, ::2], x[:, -3:], x[..., 1:4:2], x[:, -4:-1]), rand(7, 6)),
    case("select", lambda x: (x[:, 2], x[-1], x[0, :, -1]), X3),
    case("narrow", lambda x: (x.narrow(1, 1, 2), x.narrow(-1, 0, 3), x.narrow(0, -1, 1)), X3),
    case(
        "cat",
        lambda a, b, i: (torch.cat([a, b]), torch.cat([a, b, a], dim=1), torch.cat([a, i], dim=-1)),
        ROWS,
        rand(3, 5),
        randint(3, 2),
    ),
    case(
        "stack",
        lambda a, b: (torch.stack([a, b]), torch.stack([a, b, a], dim=-1), torch.stack([a], 1)),
        ROWS,
        rand(3, 5),
    ),
    case("split", lambda x: (x.split(2, dim=1), x.split([1, 3, 1], dim=-1), x.split(3)), ROWS),
    case("chunk", lambda x: (x.chunk(3, dim=1), x.chunk(2), x.chunk(4, dim=-1)), ROWS),
    case("unbind", lambda x: (x.unbind(), x.unbind(1)), ROWS),
    case(
        "pad-constant",
        lambda x: (F.pad(x, (1, 2)), F.pad(x, (0, 1, 2, 0), value=-1.5), F.pad(x, (1, 1, 1, 1, 1, 0))),
        X3,
    ),
    case("flip", lambda x: (x.flip(0), x.flip((1, 2)), x.flip(-1)), X3),
    case(
        "index_select",
        lambda x, idx: (x.index_select(0, idx), x.index_select(1, idx), x.index_select(-1, idx)),
        X3,
        torch.tensor([1, 0, 1]),
    ),
    case(
        "gather",
        lambda x, idx: (x.gather(1, idx), x.gather(0, idx[:, :2]), x.gather(-1, idx)),
        ROWS,
        randint(3, 5, lo=0, hi=3),
    ),
    module_case("embedding", torch.nn.Embedding(10, 4), randint(2, 3, lo=0, hi=10)),
    case("embedding-functional", lambda idx, w: F.embedding(idx, w), randint(5, lo=0, hi=6), rand(6, 3)),
]


@run_cases(VIEWS)
def test_view_and_indexing(fn, inputs, compile_both_ways) -> None:
    compile_both_ways(fn, inputs)


# ---- matmul, linear, convolution ---------------------------------------------------------------------
MATMUL = [
    case("mm", torch.mm, rand(3, 4), rand(4, 5)),
    case("bmm", torch.bmm, rand(2, 3, 4), rand(2, 4, 5)),
    case(
        "addmm",
        lambda c, a, b, r: (torch.addmm(c, a, b), torch.addmm(r, a, b, beta=0.5, alpha=2.0)),
        rand(3, 5),
        rand(3, 4),
        rand(4, 5),
        rand(5),
    ),
    case("matmul-2d-2d", torch.matmul, rand(3, 4), rand(4, 5)),
    case("matmul-3d-2d", lambda a, b: a @ b, rand(2, 3, 4), rand(4, 5)),
    case("matmul-4d-3d-broadcast", lambda a, b: a @ b, rand(2, 1, 3, 4), rand(3, 4, 5)),
    case(
        "matmul-1d",
        lambda v, w, m, b: (v @ v, v @ m, m.t() @ w[:4], b @ w[:4], v @ b.transpose(1, 2)),
        rand(4),
        rand(5),
        rand(4, 5),
        rand(2, 3, 4),
    ),
    module_case("linear-bias", torch.nn.Linear(4, 3), X3),
    module_case("linear-no-bias", torch.nn.Linear(4, 3, bias=False), rand(5, 4)),
    module_case("conv1d", torch.nn.Conv1d(2, 4, 3, stride=2, padding=1), rand(2, 2, 9)),
    module_case("conv2d-stride-padding", torch.nn.Conv2d(3, 4, 3, stride=2, padding=1), rand(2, 3, 7, 7)),
    module_case(
        "conv2d-dilation-groups",
        torch.nn.Conv2d(4, 6, 3, padding=2, dilation=2, groups=2, bias=False),
        rand(1, 4, 6, 6),
    ),
    module_case(
        "conv_transpose2d",
        torch.nn.ConvTranspose2d(3, 2, 3, stride=2, padding=1, output_padding=1),
        rand(1, 3, 4, 4),
    ),
]


@run_cases(MATMUL)
def test_matmul_and_conv(fn, inputs, compile_both_ways) -> None:
    compile_both_ways(fn, inputs)


# ---- factories, attention, dropout ---------------------------------------------------------------
Q, K, V = rand(2, 2, 4, 8), rand(2, 2, 6, 8), rand(2, 2, 6, 8)
OTHER = [
    case(
        "arange",
        lambda x, i: (
            x + torch.arange(5),
            i * torch.arange(2, 11, 2),
            torch.arange(0.0, 1.0, 0.25) + x[:, :4],
        ),
        ROWS,
        randint(3, 5),
    ),
    case(
        "zeros",
        lambda x: (torch.zeros(3, 5) + x, torch.zeros_like(x, dtype=torch.int64), x.new_zeros(2)),
        ROWS,
    ),
    case("ones", lambda x: (torch.ones(3, 5) * x, torch.ones_like(x), torch.ones(2, dtype=torch.bool)), ROWS),
    case(
        "full",
        lambda x: (
            torch.full((3, 5), 2.5) * x,
            torch.full_like(x, 7, dtype=torch.int32),
            x.new_full((2,), -1.0),
        ),
        ROWS,
    ),
    case("sdpa", F.scaled_dot_product_attention, Q, K, V),
    case(
        "sdpa-bool-mask",
        lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m),
        Q,
        K,
        V,
        torch.tensor([[True, True, False, True, True, False]]).expand(4, 6),
    ),
    case(
        "sdpa-float-mask",
        lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m),
        Q,
        K,
        V,
        rand(4, 6),
    ),
    case(
        "sdpa-causal",
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.5),
        Q,
        Q,
        Q,
    ),
]


@run_cases(OTHER)
def test_factory_and_attention(fn, inputs, compile_both_ways) -> None:
    compile_both_ways(fn, inputs)


def test_group_norm_fuses_with_gelu(compile_both_ways) -> None:
    # wav2vec2's first feature-extractor layer: GroupNorm with one group per channel, then GELU. ATen's
    # group norm and a separate GELU pass were two library calls; converted, they are one kernel.
    gn = torch.nn.GroupNorm(6, 6)
    with torch.no_grad():
        gn.weight.uniform_(0.5, 1.5, generator=_GEN)
        gn.bias.uniform_(-1.0, 1.0, generator=_GEN)
    cm = compile_both_ways(lambda x: F.gelu(gn(x)), (rand(2, 6, 33, lo=-3.0, hi=5.0),))
    assert cm.stats["kernels"] == 1, cm.stats
    assert not cm.stats.get("fallbacks"), cm.stats["fallbacks"]


def test_group_norm_with_symbolic_sizes() -> None:
    # Captured with symbolic batch and length, the group's element count is a product of symbols.
    gn = torch.nn.GroupNorm(2, 4)
    fn = torch.compile(lambda x: F.gelu(gn(x)), backend="autofusion", dynamic=True)
    torch._dynamo.reset()
    with torch.no_grad():
        for n, length in ((2, 7), (3, 9), (1, 13)):
            x = rand(n, 4, length)
            torch.testing.assert_close(fn(x), F.gelu(gn(x)), rtol=1e-5, atol=1e-6)


def test_dropout_in_eval_vanishes(compile_both_ways) -> None:
    model = torch.nn.Sequential(torch.nn.Dropout(0.5), torch.nn.ReLU(), torch.nn.Dropout(0.2)).eval()
    cm = compile_both_ways(lambda x: model(x) + F.dropout(x, 0.3, training=False), (ROWS,))
    assert cm.stats["op_counts"] == {"add": 1, "relu": 1}, cm.graph


# ---- half precision and edge shapes --------------------------------------------------------------
_LN_W, _LN_B = rand(4), rand(4)
_GN_W, _GN_B = rand(4), rand(4)
HALF = [
    case("sum-mean", lambda h, b: (h.sum(1), h.mean(), b.sum(1), b.mean()), X3.half(), X3.bfloat16()),
    case("softmax", lambda h, b: (h.softmax(-1), b.softmax(-1)), X3.half(), X3.bfloat16()),
    case(
        "layer_norm",
        lambda h, b: (
            F.layer_norm(h, (4,), _LN_W.half(), _LN_B.half()),
            F.layer_norm(b, (4,), _LN_W.bfloat16(), _LN_B.bfloat16()),
        ),
        X3.half(),
        X3.bfloat16(),
    ),
    case(
        "group_norm",
        lambda h, b: (
            F.group_norm(h, 2, _GN_W.half(), _GN_B.half()),
            F.group_norm(b, 2, _GN_W.bfloat16(), _GN_B.bfloat16()),
        ),
        rand(2, 4, 7).half(),
        rand(2, 4, 7).bfloat16(),
    ),
    case(
        "matmul",
        lambda h, g, b, c: (h @ g, b @ c),
        X3.half(),
        rand(4, 3).half(),
        X3.bfloat16(),
        rand(4, 3).bfloat16(),
    ),
    case(
        "conv2d",
        lambda x, w, y, v: (F.conv2d(x, w, padding=1), F.conv2d(y, v, padding=1)),
        rand(1, 2, 5, 5).half(),
        rand(3, 2, 3, 3).half(),
        rand(1, 2, 5, 5).bfloat16(),
        rand(3, 2, 3, 3).bfloat16(),
    ),
]


@run_cases(HALF)
def test_half_precision(fn, inputs, compile_both_ways) -> None:
    compile_both_ways(fn, inputs, rtol=1e-2, atol=1e-2)


EMPTY = rand(0, 5)
EDGE = [
    case(
        "sum-size1-and-empty",
        lambda o, e: (o.sum(1), o.amax(0), e.sum(0), e.sum(1), e.mean(1), e.prod(0)),
        rand(3, 1),
        EMPTY,
    ),
    case("softmax-size1-dim", lambda o: (o.softmax(1), o.log_softmax(1)), rand(3, 1)),
    case(
        "cat-empty",
        lambda e, x, v: (torch.cat([e, x]), torch.cat([x, torch.zeros(0)], 0), torch.cat([v, v[:0]])),
        EMPTY,
        ROWS,
        rand(4),
    ),
    case(
        "matmul-empty-and-size1", lambda e, w, c, r: (e @ w, c @ r), EMPTY, rand(5, 2), rand(3, 1), rand(1, 4)
    ),
    case("sum-0d", lambda s: (s.sum(), s.amax(), s.reshape(1), s.unsqueeze(0).expand(3)), torch.tensor(2.5)),
    case("softmax-transposed-input", lambda t: (t.softmax(-1), t.sum(0)), rand(5, 3).t()),
    case("matmul-transposed-input", lambda t, w: (t @ w, torch.mm(t, w)), rand(5, 3).t(), rand(5, 4)),
    case("view-of-sliced-input", lambda s: (s.reshape(-1), s.permute(1, 0), s[:, 1:3]), rand(3, 10)[:, ::2]),
]


@run_cases(EDGE)
def test_edge_shapes(fn, inputs, compile_both_ways) -> None:
    compile_both_ways(fn, inputs)


# ---- fallback ------------------------------------------------------------------------------------


def test_unconverted_op_runs_as_extern_and_is_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    # aten.cumsum has no converter (nor a decomposition), so it must run as an extern ATen call.
    def fn(x: torch.Tensor) -> torch.Tensor:
        return torch.cumsum(x, 0) + torch.cumsum(x * 2.0, 0)

    x = rand(3, 4)
    with caplog.at_level(logging.INFO, logger="autofusion"):
        cm = autofusion.compile(fn, (x,))
        out = cm(x)
    torch.testing.assert_close(out, fn(x), rtol=1e-5, atol=1e-6)
    assert cm.stats["extern_calls"] == 2
    assert cm.stats["fallbacks"] == {"aten.cumsum.default # reason: no converter": 2}
    lines = caplog.messages
    per_call = [m for m in lines if m.startswith("Fallback aten.cumsum.default(")]
    assert len(per_call) == 1, lines
    assert per_call[0].endswith("# reason: no converter"), per_call
    assert lines.count("Fallback 2x aten.cumsum.default # reason: no converter") == 1, lines
