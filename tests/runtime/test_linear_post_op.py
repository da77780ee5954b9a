"""Linear + GELU as one oneDNN call with the GELU post-op (passes/linear_post_op.py,
runtime/linear_post_op.py): results equal eager's (fp32, bf16; erf and tanh; one row and many, 3-d
inputs, odd sizes), the fused call really ran, a weight changed in place is seen, and the measured
choice declines a shape where the fused call loses."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import autofusion
from autofusion.ir.dtypes import DType
from autofusion.ir.graph import GraphBuilder, InputRole
from autofusion.ir.types import TensorType
from autofusion.passes.linear_post_op import TARGET, fuse_linear_post_ops
from autofusion.runtime import linear_post_op

pytestmark = pytest.mark.skipif(
    not linear_post_op.available(torch.float32), reason="a torch build without oneDNN's fused linear"
)


class Mlp(torch.nn.Module):
    def __init__(self, k: int, hidden: int, approximate: str, bias: bool = True) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(k, hidden, bias=bias)
        self.fc2 = torch.nn.Linear(hidden, k)
        self.approximate = approximate

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x), approximate=self.approximate))


def _fused_nodes(cm) -> list:
    return [n for n in cm.last.program.plan.graph.nodes if n.op == "extern" and n.attr("target") == TARGET]


@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize("shape", [(1, 37), (7, 37), (3, 5, 37), (2, 3, 4, 37)], ids=str)
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
def test_fused_matches_eager_fp32(approximate: str, shape: tuple[int, ...], bias: bool) -> None:
    torch.manual_seed(0)
    model = Mlp(37, 53, approximate, bias).eval()
    x = torch.randn(shape) * 3.0
    cm = autofusion.compile(model, [x], linear_route="onednn")
    act = "gelu_tanh" if approximate == "tanh" else "gelu"
    before = linear_post_op.CALLS[act]
    with torch.no_grad():
        got = cm(x)
        torch.testing.assert_close(got, model(x), rtol=1e-5, atol=1e-5)
    assert len(_fused_nodes(cm)) == 1
    assert not any(n.op == "gelu" for n in cm.last.program.plan.graph.nodes)
    assert linear_post_op.CALLS[act] == before + 1  # the fused oneDNN call ran, not a fallback


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_fused_matches_eager_bf16(approximate: str) -> None:
    if not linear_post_op.available(torch.bfloat16):
        pytest.skip("no bf16 oneDNN linear")
    torch.manual_seed(0)
    model = Mlp(48, 96, approximate).eval().to(torch.bfloat16)
    x = torch.randn(2, 9, 48).to(torch.bfloat16)
    cm = autofusion.compile(model, [x], linear_route="onednn")
    with torch.no_grad():
        torch.testing.assert_close(cm(x), model(x), rtol=2e-2, atol=2e-2)
    assert len(_fused_nodes(cm)) == 1


def test_fp16_stays_unfused() -> None:
    torch.manual_seed(0)
    model = Mlp(16, 32, "none").eval().half()
    x = torch.randn(4, 16).half()
    cm = autofusion.compile(model, [x], linear_route="onednn")
    with torch.no_grad():
        torch.testing.assert_close(cm(x), model(x), rtol=2e-3, atol=2e-3)
    assert not _fused_nodes(cm)


def test_special_values_and_non_contiguous_input() -> None:
    torch.manual_seed(0)
    model = Mlp(24, 40, "none").eval()
    x = torch.randn(24, 6).t()  # [6, 24], not contiguous
    x[0, :3] = torch.tensor([1e4, -1e4, 0.0])
    cm = autofusion.compile(model, [x], linear_route="onednn")
    with torch.no_grad():
        torch.testing.assert_close(cm(x), model(x), rtol=1e-5, atol=1e-4)


def test_a_weight_changed_in_place_is_seen() -> None:
    torch.manual_seed(0)
    model = Mlp(20, 36, "none").eval()
    x = torch.randn(5, 20)
    cm = autofusion.compile(model, [x], linear_route="onednn")
    with torch.no_grad():
        torch.testing.assert_close(cm(x), model(x), rtol=1e-5, atol=1e-5)
        model.fc1.weight.mul_(-2.0)
        model.fc1.bias.add_(0.5)
        torch.testing.assert_close(cm(x), model(x), rtol=1e-5, atol=1e-5)
    assert len(_fused_nodes(cm)) == 1


def test_a_gelu_input_read_elsewhere_is_not_fused() -> None:
    torch.manual_seed(0)
    fc = torch.nn.Linear(12, 16).eval()

    def both(x: torch.Tensor) -> torch.Tensor:
        h = fc(x)
        return F.gelu(h) + h

    x = torch.randn(3, 12)
    cm = autofusion.compile(both, [x], linear_route="onednn")
    with torch.no_grad():
        torch.testing.assert_close(cm(x), both(x), rtol=1e-5, atol=1e-5)
    assert not _fused_nodes(cm)


def _graph(act: str = "none"):
    b = GraphBuilder("g")
    x = b.add_input(TensorType(DType.float32, (4, 8), (8, 1)), "x", InputRole.USER)
    w = b.add_input(TensorType(DType.float32, (6, 8), (8, 1)), "w", InputRole.PARAM)
    (y,) = b.add_node("linear", [x, w], {"has_bias": False})
    (z,) = b.add_node("gelu", [y], {"approximate": act})
    return b.build([z])


def test_the_decider_sees_the_shape_and_its_no_keeps_the_graph() -> None:
    asked: list[tuple] = []

    def no(m, k, n, dtype, act):
        asked.append((m, k, n, dtype, act))
        return "measured slower"

    g = _graph("tanh")
    assert fuse_linear_post_ops(g, no) is g
    assert asked == [(4, 8, 6, DType.float32, "gelu_tanh")]
    assert fuse_linear_post_ops(g, None) is g
    fused = fuse_linear_post_ops(g, lambda *a: None)
    assert [n.op for n in fused.nodes] == ["extern"] and fused.nodes[0].attr("target") == TARGET


def test_chooser_measures_caches_and_declines_where_fused_loses(tmp_path, monkeypatch) -> None:
    calls: list[tuple] = []
    times = {"fused": 1e-3, "packed_then_gelu": 2e-3, "plain_then_gelu": 3e-3, "plain_alone": 1.5e-3}

    def fake(m, k, n, dtype, act):
        calls.append((m, k, n))
        return dict(times)

    monkeypatch.setattr(linear_post_op, "measure", fake)
    monkeypatch.setattr(linear_post_op, "machine_busy", lambda: (False, "quiet"))
    assert linear_post_op.PostOpChooser(tmp_path)(64, 96, 384, torch.float32, "gelu") is None
    # A second compile (a new chooser) reads the cached record: not measured again.
    assert linear_post_op.PostOpChooser(tmp_path)(64, 96, 384, torch.float32, "gelu") is None
    assert calls == [(64, 96, 384)]
    # The plain GEMM alone bounds the GEMM-epilogue plan: a fused call not 5 % under it loses.
    times["plain_alone"] = 1.02e-3
    why = linear_post_op.PostOpChooser(tmp_path)(8, 96, 384, torch.float32, "gelu")
    assert why is not None and "plain_alone" in why
    # A disturbed measurement declines and is not cached.
    monkeypatch.setattr(linear_post_op, "measure", lambda *a: None)
    assert linear_post_op.PostOpChooser(tmp_path)(9, 96, 384, torch.float32, "gelu") is not None
    # Forced routes do not measure.
    assert linear_post_op.PostOpChooser(tmp_path, "onednn")(9, 96, 384, torch.float32, "gelu") is None
    assert linear_post_op.PostOpChooser(tmp_path, "plain")(9, 96, 384, torch.float32, "gelu") is not None
    assert linear_post_op.PostOpChooser(tmp_path)(9, 96, 384, torch.float16, "gelu") is not None


def test_a_measured_win_fuses_under_auto(monkeypatch) -> None:
    wins = {"fused": 1e-4, "packed_then_gelu": 1e-3, "plain_then_gelu": 1e-3, "plain_alone": 1e-3}
    monkeypatch.setattr(linear_post_op, "measure", lambda *a: dict(wins))
    torch.manual_seed(0)
    model = Mlp(24, 40, "none").eval()
    x = torch.randn(3, 24)
    cm = autofusion.compile(model, [x])
    with torch.no_grad():
        torch.testing.assert_close(cm(x), model(x), rtol=1e-5, atol=1e-5)
    assert len(_fused_nodes(cm)) == 1
    cm = autofusion.compile(model, [x], disabled=frozenset({"linear_post_op"}))
    with torch.no_grad():
        torch.testing.assert_close(cm(x), model(x), rtol=1e-5, atol=1e-5)
    assert not _fused_nodes(cm)


@pytest.mark.measured_hardware
def test_real_measurement_is_sane() -> None:
    best = linear_post_op.measure(64, 96, 384, torch.float32, "gelu")
    if best is None:
        pytest.skip("the machine was too busy to time")
    assert set(best) == {"fused", "packed_then_gelu", "plain_then_gelu", "plain_alone"}
    assert all(t > 0 for t in best.values())
