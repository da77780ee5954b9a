"""Each built-in rule: golden IR before/after, the rule applied, numerics equal to eager (fp32, fp16), and
the rewritten graph exported as standard ONNX that onnx.checker accepts and onnxruntime runs like eager."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import onnx
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import autofusion
from autofusion.export.onnx import FUNCTION_DOMAIN, export_graph, export_plan
from autofusion.export.onnx_library import EXPANSIONS
from autofusion.ir import print_graph
from autofusion.ir.interpret import PY_TARGETS
from autofusion.passes.rewrite import all_rules
from autofusion.passes.rewrite.apply import apply_rules
from autofusion.passes.rewrite.library import NAMESPACE
from autofusion.passes.simplify.dce import eliminate_dead_nodes

TOL = {torch.float32: 1e-5, torch.float16: 1e-2}


# The linear-family rules ship off (classify_rule.yaml says why); tests of them switch them on.
LINEAR_RULES = frozenset(
    {
        "linear_relu",
        "linear_gelu",
        "linear_silu",
        "linear_residual",
        "gelu_linear_residual",
        "layernorm_qkv_linear",
        "layernorm_dropout_linear",
    }
)


def _rel(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out.float() - ref.float()).abs().max() / ref.float().abs().max().clamp_min(1e-30))


def _eval(m: nn.Module, dtype: torch.dtype) -> nn.Module:
    m = m.eval().to(dtype)
    for mod in m.modules():
        if isinstance(mod, nn.modules.batchnorm._BatchNorm):
            with torch.no_grad():  # non-trivial statistics so the fold is exercised
                mod.running_mean.uniform_(-0.5, 0.5)
                mod.running_var.uniform_(0.5, 2.0)
                if mod.weight is not None:
                    mod.weight.uniform_(0.5, 1.5)
                    mod.bias.uniform_(-0.5, 0.5)
    return m


class ConvBN(nn.Module):
    def __init__(self, act: nn.Module | None, conv: nn.Module | None = None, bn_affine: bool = True) -> None:
        super().__init__()
        self.conv = conv or nn.Conv2d(4, 6, 3, padding=1, bias=False)
        out_ch = self.conv.out_channels
        bn = nn.BatchNorm1d if isinstance(self.conv, nn.Conv1d) else nn.BatchNorm2d
        self.bn = bn(out_ch, affine=bn_affine)
        self.act = act or nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.bn(self.conv(x)))


class ConvBNAdd(nn.Module):
    def __init__(self, relu: bool) -> None:
        super().__init__()
        self.conv = nn.Conv2d(6, 6, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(6)
        self.relu = relu

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.bn(self.conv(x)) + x
        return torch.relu(y) if self.relu else y


class ConvAct(nn.Module):
    """A convolution with bias and no BN (as an ONNX export has it: BN folded into the conv), then an
    activation; `sigmoid_mul`: SiLU spelled x * sigmoid(x); `residual`: + x before the activation."""

    def __init__(self, act: str, residual: bool = False) -> None:
        super().__init__()
        self.conv = nn.Conv2d(6 if residual else 4, 6, 3, padding=1)
        self.act, self.residual = act, residual

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        if self.residual:
            y = y + x
        if self.act == "sigmoid_mul":
            return y * torch.sigmoid(y)
        return {"relu": torch.relu, "relu6": F.relu6, "silu": F.silu, "none": lambda t: t}[self.act](y)


class Attention(nn.Module):
    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind
        self.register_buffer("mask", torch.tril(torch.ones(7, 7)))

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        s = q @ k.transpose(-2, -1)
        s = s / math.sqrt(q.shape[-1]) if self.kind == "div" else s * (1.0 / math.sqrt(q.shape[-1]))
        if self.kind == "masked":
            s = s.masked_fill(self.mask == 0, float("-inf"))
        elif self.kind == "additive":
            s = s + (1.0 - self.mask) * -1e4
        return torch.softmax(s, dim=-1) @ v


class LinearAct(nn.Module):
    def __init__(self, act: nn.Module, k: int = 24, n: int = 40) -> None:
        super().__init__()
        self.fc = nn.Linear(k, n)
        self.act = act

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.fc(x))


class LNLinear(nn.Module):
    def __init__(self, hidden: int, out: int, dropout: bool) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(hidden)
        self.drop = nn.Dropout(0.1) if dropout else nn.Identity()
        self.fc = nn.Linear(hidden, out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.drop(self.ln(x)))


class GeluLinearResidual(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(48, 16)

    def forward(self, x: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
        return self.fc(F.gelu(x)) + r


class LinearResidual(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc(x)


def _qkv(dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    return tuple(torch.randn(2, 3, 7, 8, dtype=dtype) for _ in range(3))


# rule -> (model factory, input factory)
CASES = {
    "conv_bn_relu": (lambda: ConvBN(nn.ReLU()), lambda d: (torch.randn(2, 4, 9, 7, dtype=d),)),
    "conv_bn_relu6": (lambda: ConvBN(nn.ReLU6()), lambda d: (torch.randn(2, 4, 9, 7, dtype=d) * 4,)),
    "conv_bn_silu": (lambda: ConvBN(nn.SiLU()), lambda d: (torch.randn(2, 4, 9, 7, dtype=d),)),
    "conv_bn": (lambda: ConvBN(None), lambda d: (torch.randn(2, 4, 9, 7, dtype=d),)),
    "conv_bn_add_relu": (lambda: ConvBNAdd(True), lambda d: (torch.randn(2, 6, 9, 7, dtype=d),)),
    "conv_bn_add": (lambda: ConvBNAdd(False), lambda d: (torch.randn(2, 6, 9, 7, dtype=d),)),
    "conv_relu": (lambda: ConvAct("relu"), lambda d: (torch.randn(2, 4, 9, 7, dtype=d),)),
    "conv_relu6": (lambda: ConvAct("relu6"), lambda d: (torch.randn(2, 4, 9, 7, dtype=d) * 4,)),
    "conv_silu": (lambda: ConvAct("silu"), lambda d: (torch.randn(2, 4, 9, 7, dtype=d),)),
    "conv_sigmoid_mul": (lambda: ConvAct("sigmoid_mul"), lambda d: (torch.randn(2, 4, 9, 7, dtype=d),)),
    "conv_add_relu": (lambda: ConvAct("relu", True), lambda d: (torch.randn(2, 6, 9, 7, dtype=d),)),
    "conv_add": (lambda: ConvAct("none", True), lambda d: (torch.randn(2, 6, 9, 7, dtype=d),)),
    "attention_core_masked": (lambda: Attention("masked"), _qkv),
    "attention_core_additive_mask": (lambda: Attention("additive"), _qkv),
    "attention_core": (lambda: Attention("div"), _qkv),
    "layernorm_qkv_linear": (lambda: LNLinear(32, 96, False), lambda d: (torch.randn(2, 5, 32, dtype=d),)),
    "linear_relu": (lambda: LinearAct(nn.ReLU()), lambda d: (torch.randn(3, 5, 24, dtype=d),)),
    "linear_gelu": (lambda: LinearAct(nn.GELU()), lambda d: (torch.randn(3, 5, 24, dtype=d),)),
    "linear_silu": (lambda: LinearAct(nn.SiLU()), lambda d: (torch.randn(3, 5, 24, dtype=d),)),
    "layernorm_dropout_linear": (lambda: LNLinear(32, 20, True), lambda d: (torch.randn(2, 5, 32, dtype=d),)),
    "gelu_linear_residual": (
        lambda: GeluLinearResidual(),
        lambda d: (torch.randn(4, 48, dtype=d), torch.randn(4, 16, dtype=d)),
    ),
    "linear_residual": (lambda: LinearResidual(), lambda d: (torch.randn(3, 16, dtype=d),)),
}


def test_every_builtin_rule_has_a_case() -> None:
    assert sorted(CASES) == sorted(r.name for r in all_rules())


@pytest.mark.parametrize("rule", sorted(CASES))
def test_golden_before_after(rule: str, golden) -> None:
    torch.manual_seed(0)
    make_model, make_inputs = CASES[rule]
    model, inputs = _eval(make_model(), torch.float32), make_inputs(torch.float32)
    cm = autofusion.compile(model, inputs, fusion=False)
    result = apply_rules(cm.graph, all_rules(), switched_on=frozenset({rule}))
    assert result.applied.get(rule) == 1, [r.line() for r in result.reports]
    after = eliminate_dead_nodes(result.graph)
    golden(f"rules/{rule}.txt", f"# before\n{print_graph(cm.graph)}\n# after {rule}\n{print_graph(after)}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("rule", sorted(CASES))
def test_numerics_equal_eager(rule: str, dtype: torch.dtype) -> None:
    torch.manual_seed(1)
    make_model, make_inputs = CASES[rule]
    model, inputs = _eval(make_model(), dtype), make_inputs(dtype)
    with torch.no_grad():
        ref = model(*inputs)
        cm = autofusion.compile(model, inputs, enabled_rules=frozenset({rule}))  # some are off by default
        out = cm(*inputs)
        off = autofusion.compile(model, inputs, disabled=frozenset({rule}))
    assert cm.stats["rules"].get(rule) == 1, cm.stats
    assert rule not in off.stats.get("rules", {})
    assert out.dtype == ref.dtype and out.shape == ref.shape
    assert _rel(out, ref) <= TOL[dtype], _rel(out, ref)
    assert cm.stats["kernels"] < off.stats["kernels"] or cm.stats["ops"] == off.stats["ops"]


@pytest.mark.parametrize(
    "conv",
    [
        nn.Conv2d(4, 6, 3, padding=1, groups=2, bias=False),
        nn.Conv2d(4, 4, 3, padding=2, dilation=2, groups=4),  # depthwise, dilated, with bias
        nn.Conv2d(4, 6, (3, 1), stride=(2, 1), padding=0),
        nn.Conv2d(4, 6, 1),
        nn.Conv1d(4, 6, 5, padding=2, stride=2),
    ],
    ids=["groups2", "depthwise-dilated-bias", "stride-nopad", "pointwise", "conv1d"],
)
@pytest.mark.parametrize("route", ["aten", "aten_cl", "onednn"])
@pytest.mark.parametrize("batch", [1, 2])
def test_conv_bn_attributes(conv: nn.Module, batch: int, route: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from autofusion.runtime import library

    monkeypatch.setattr(library, "FORCE_ROUTE", route)  # every route of conv_bn_act (library.py)
    library.ROUTE_CALLS.clear()
    torch.manual_seed(2)
    model = _eval(ConvBN(nn.ReLU(), conv), torch.float32)
    shape = (batch, 4, 11) if isinstance(conv, nn.Conv1d) else (batch, 4, 9, 7)
    x = torch.randn(shape)
    with torch.no_grad():
        cm = autofusion.compile(model, (x,))
        out, ref = cm(x), model(x)
    assert cm.stats["rules"] == {"conv_bn_relu": 1}
    assert _rel(out, ref) <= 1e-5
    # The route ran (a 1-d convolution has no channels-last form: the plain route)
    ran = "aten" if isinstance(conv, nn.Conv1d) or (route == "onednn" and not library.onednn_ok(x)) else route
    assert library.ROUTE_CALLS[ran] >= 1 and sum(library.ROUTE_CALLS.values()) == library.ROUTE_CALLS[ran]


def test_conv_bn_without_affine_and_noncontiguous_input() -> None:
    model = _eval(ConvBN(nn.ReLU(), bn_affine=False), torch.float32)
    x = torch.randn(2, 7, 9, 4).permute(0, 3, 1, 2)[:, :, :, :]  # channels-last view, non-contiguous
    with torch.no_grad():
        cm = autofusion.compile(model, (x,))
        assert cm.stats["rules"] == {"conv_bn_relu": 1}
        assert _rel(cm(x), model(x)) <= 1e-5


def test_transposed_conv_is_never_taken_for_a_conv() -> None:
    conv = nn.ConvTranspose2d(4, 6, 3, padding=1)
    model = _eval(ConvBN(nn.ReLU(), conv), torch.float32)
    x = torch.randn(2, 4, 5, 5)
    with torch.no_grad():
        cm = autofusion.compile(model, (x,))
        assert not cm.stats.get("rules")
        assert _rel(cm(x), model(x)) <= 1e-5


def test_conv_bn_fold_follows_parameter_updates() -> None:
    model = _eval(ConvBN(nn.ReLU()), torch.float32)
    x = torch.randn(2, 4, 9, 7)
    with torch.no_grad():
        cm = autofusion.compile(model, (x,))
        first = cm(x).clone()
        model.bn.running_mean.add_(0.25)  # in place: a new parameter version, so a new fold
        second = cm(x)
        assert _rel(second, model(x)) <= 1e-5
        assert not torch.equal(first, second)


def test_empty_batch() -> None:
    model = _eval(ConvBN(nn.ReLU()), torch.float32)
    x = torch.randn(0, 4, 9, 7)
    with torch.no_grad():
        cm = autofusion.compile(model, (x,))
        out = cm(x)
    assert out.shape == model(x).shape


def test_transformer_and_resnet_blocks() -> None:
    for name, expect in (
        (
            "transformer-block",
            {
                "attention_core_masked": 1,
                "layernorm_qkv_linear": 1,
                "layernorm_dropout_linear": 1,
                "gelu_linear_residual": 1,
                "linear_residual": 1,
            },
        ),
        ("resnet-block", {"conv_bn_relu": 1, "conv_bn_add_relu": 1}),
    ):
        model, inputs = autofusion.builtin(name)
        with torch.no_grad():
            cm = autofusion.compile(model, inputs, enabled_rules=LINEAR_RULES - {"linear_gelu"})
            assert cm.stats["rules"] == expect
            assert _rel(cm(*inputs), model(*inputs)) <= 1e-5
            plain = autofusion.compile(model, inputs, builtin_rules=False)
        assert cm.stats["kernels"] < plain.stats["kernels"]


@pytest.mark.parametrize("rows", [0, 1, 7])
@pytest.mark.parametrize("act", [nn.ReLU(), nn.GELU(), nn.GELU(approximate="tanh"), nn.SiLU()], ids=str)
def test_linear_act_edge_sizes(rows: int, act: nn.Module) -> None:
    model = _eval(LinearAct(act, 5, 3), torch.float32)
    x = torch.randn(rows, 5)
    with torch.no_grad():
        cm = autofusion.compile(model, (x,), enabled_rules=LINEAR_RULES)
        out, ref = cm(x), model(x)
    assert len(cm.stats["rules"]) == 1
    assert out.shape == ref.shape
    if rows:
        assert _rel(out, ref) <= 1e-5


def test_attention_with_one_query_and_noncontiguous_inputs() -> None:
    model = Attention("div")
    q = torch.randn(2, 3, 8, 1).transpose(-1, -2)  # [2, 3, 1, 8], non-contiguous
    k, v = torch.randn(2, 3, 5, 8), torch.randn(2, 3, 5, 8)
    with torch.no_grad():
        cm = autofusion.compile(model, (q, k, v))
        assert cm.stats["rules"] == {"attention_core": 1}
        assert _rel(cm(q, k, v), model(q, k, v)) <= 1e-5


def test_fold_cache_forgets_freed_parameters() -> None:
    from autofusion.runtime.library import FOLDS

    model = _eval(ConvBN(nn.ReLU()), torch.float32)
    x = torch.randn(1, 4, 5, 5)
    with torch.no_grad():
        cm = autofusion.compile(model, (x,))
        cm(x)
    before = len(FOLDS.items)
    del cm, model
    import gc

    gc.collect()
    assert len(FOLDS.items) < before


def test_model_made_under_inference_mode() -> None:
    with torch.inference_mode():
        model = _eval(ConvBN(nn.ReLU()), torch.float32)
        x = torch.randn(1, 4, 6, 6)
        cm = autofusion.compile(model, (x,))
        assert cm.stats["rules"] == {"conv_bn_relu": 1}
        assert _rel(cm(x), model(x)) <= 1e-5


# ---- ONNX export of the rewritten graphs: every library call as standard opset-18 ops ------------------


def _ort(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> np.ndarray:
    ort = pytest.importorskip("onnxruntime")
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)[0]


def _export_equals_eager(model: nn.Module, inputs: tuple[torch.Tensor, ...], rules: dict[str, int]) -> None:
    """Compile (the given rules fire), export the rewritten graph three ways (weights as initializers,
    weights as graph inputs, fused kernels as functions) and run each in onnxruntime against eager."""
    with torch.no_grad():
        # Freezing off: the export with weights as graph inputs must compute the parameter-only work
        # itself (with freezing it is folded out of the plan and handed in as `*_frozen` inputs).
        cm = autofusion.compile(model, inputs, enabled_rules=frozenset(rules), freeze=False)  # some ship off
        ref = model(*inputs).float().numpy()
    assert cm.stats["rules"] == rules, cm.stats["rules"]
    cg = cm.last
    graph = cg.program.plan.graph
    library_calls = [n for n in graph.nodes if n.op == "extern" and n.attr("target").startswith(NAMESPACE)]
    assert len(library_calls) + sum(n.op == "sdpa" for n in graph.nodes) == sum(rules.values())
    weights: dict[str, Any] = {}
    feeds: dict[str, np.ndarray] = {}
    for gi, (kind, v) in zip(cg.graph.inputs, cg.captured.bindings, strict=True):
        if kind == "bound":
            weights[gi.name] = v
        else:
            feeds[gi.name] = inputs[v].numpy()
    all_inputs = {**feeds, **{k: v.detach().numpy() for k, v in weights.items()}}
    for exported, given in (
        (export_graph(graph, weights=weights), feeds),
        (export_graph(graph), all_inputs),  # the BN / LayerNorm folds computed from runtime inputs
        (export_plan(cg.program.plan, weights=weights), feeds),
    ):
        onnx.checker.check_model(exported, full_check=True)
        nodes = list(exported.graph.node) + [m for f in exported.functions for m in f.node]
        assert {n.domain for n in nodes} <= {"", FUNCTION_DOMAIN}, {n.domain for n in nodes}
        assert [o.domain for o in exported.opset_import if o.domain not in ("", FUNCTION_DOMAIN)] == []
        got = _ort(exported, given)
        assert got.shape == ref.shape and got.dtype == inputs[0].numpy().dtype
        if got.dtype == np.float32:
            np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-5)
        elif got.size:  # fp16: onnxruntime and eager round at other points; the half tolerance used above
            assert _rel(torch.from_numpy(got), torch.from_numpy(ref)) <= TOL[torch.float16]


def test_every_library_call_has_an_onnx_expansion() -> None:
    library_ops = {t for t in PY_TARGETS if t.startswith(NAMESPACE + ".")}
    assert library_ops and library_ops == set(EXPANSIONS)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("rule", sorted(CASES))
def test_export_equals_eager(rule: str, dtype: torch.dtype) -> None:
    torch.manual_seed(3)
    make_model, make_inputs = CASES[rule]
    _export_equals_eager(_eval(make_model(), dtype), make_inputs(dtype), {rule: 1})


def test_export_of_an_empty_batch() -> None:
    _export_equals_eager(
        _eval(ConvBN(nn.ReLU()), torch.float32), (torch.randn(0, 4, 9, 7),), {"conv_bn_relu": 1}
    )
    model = _eval(LinearAct(nn.GELU(), 5, 3), torch.float32)
    _export_equals_eager(model, (torch.randn(0, 5),), {"linear_gelu": 1})


@pytest.mark.parametrize(
    "conv",
    [
        nn.Conv2d(4, 6, 3, padding=1, groups=2, bias=False),
        nn.Conv2d(4, 4, 3, padding=2, dilation=2, groups=4),
        nn.Conv2d(4, 6, (3, 1), stride=(2, 1), padding=(0, 1)),
        nn.Conv1d(4, 6, 5, padding=2, stride=2),
    ],
    ids=["groups2", "depthwise-dilated-bias", "stride-asymmetric-pad", "conv1d"],
)
def test_export_conv_bn_attributes(conv: nn.Module) -> None:
    torch.manual_seed(4)
    x = torch.randn((1, 4, 11) if isinstance(conv, nn.Conv1d) else (1, 4, 9, 7))
    _export_equals_eager(_eval(ConvBN(nn.ReLU6(), conv), torch.float32), (x,), {"conv_bn_relu6": 1})


def test_export_conv_bn_without_affine() -> None:
    torch.manual_seed(5)
    model = _eval(ConvBN(nn.SiLU(), bn_affine=False), torch.float32)
    _export_equals_eager(model, (torch.randn(2, 4, 6, 5),), {"conv_bn_silu": 1})


@pytest.mark.parametrize("rows", [1, 7])
@pytest.mark.parametrize(
    "act,rule",
    [(nn.ReLU(), "linear_relu"), (nn.GELU(), "linear_gelu"), (nn.GELU(approximate="tanh"), "linear_gelu"),
     (nn.SiLU(), "linear_silu")],
    ids=["relu", "gelu", "gelu-tanh", "silu"],
)  # fmt: skip
def test_export_linear_act_rank2(rows: int, act: nn.Module, rule: str) -> None:
    # Rank-2 input: the expansion takes the Gemm path (rank 3 in CASES takes MatMul + Add).
    torch.manual_seed(6)
    _export_equals_eager(_eval(LinearAct(act, 5, 3), torch.float32), (torch.randn(rows, 5),), {rule: 1})


def test_export_layernorm_linear_without_bias() -> None:
    torch.manual_seed(7)
    model = _eval(LNLinear(8, 24, False), torch.float32)  # the rule wants out == 3 * hidden
    model.fc.bias = None
    with torch.no_grad():
        model.ln.weight.uniform_(0.5, 1.5)
        model.ln.bias.uniform_(-0.5, 0.5)
    _export_equals_eager(model, (torch.randn(4, 8),), {"layernorm_qkv_linear": 1})


@pytest.mark.parametrize("name", ["transformer-block", "resnet-block"])
def test_export_of_builtin_blocks(name: str) -> None:
    model, inputs = autofusion.builtin(name)
    expect = {
        "transformer-block": {
            "attention_core_masked": 1, "gelu_linear_residual": 1, "layernorm_dropout_linear": 1,
            "layernorm_qkv_linear": 1, "linear_residual": 1,
        },
        "resnet-block": {"conv_bn_relu": 1, "conv_bn_add_relu": 1},
    }[name]  # fmt: skip
    _export_equals_eager(model.eval(), inputs, expect)


def test_export_of_a_malformed_library_call_names_the_node() -> None:
    from autofusion.errors import ExportError

    model = _eval(LinearAct(nn.ReLU(), 5, 3), torch.float32)
    with torch.no_grad():
        cm = autofusion.compile(model, (torch.randn(2, 5),), enabled_rules=LINEAR_RULES)
    graph = cm.last.program.plan.graph
    (call,) = [n for n in graph.nodes if n.op == "extern"]
    attrs = tuple((k, v[:-1] if k == "args" else v) for k, v in call.attrs)  # the literal `act` dropped
    broken = graph.replace(nodes=tuple(call.replace(attrs=attrs) if n is call else n for n in graph.nodes))
    with pytest.raises(ExportError, match=f"node '{call.name}'.*linear_act"):
        export_graph(broken)


@pytest.mark.parametrize(
    "rule",
    ["conv_bn_add_relu", "conv_bn_add", "conv_bn_silu", "conv_bn_relu6", "conv_add_relu", "conv_sigmoid_mul"],
)
def test_onednn_conv_route_equals_eager(rule: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The oneDNN route of conv_bn_act (binary post-op for the residual add), forced whatever the
    layout pass measured, equals eager and really ran."""
    from autofusion.runtime import library

    monkeypatch.setattr(library, "FORCE_ROUTE", "onednn")
    library.ROUTE_CALLS.clear()
    torch.manual_seed(3)
    make_model, make_inputs = CASES[rule]
    model, inputs = _eval(make_model(), torch.float32), make_inputs(torch.float32)
    with torch.no_grad():
        cm = autofusion.compile(model, inputs)
        out, ref = cm(*inputs), model(*inputs)
    assert cm.stats["rules"] == {rule: 1}
    assert _rel(out, ref) <= 1e-5
    assert library.ROUTE_CALLS["onednn"] >= 1 and library.ROUTE_CALLS["aten"] == 0
