"""Each graph pass through the whole pipeline: results equal eager's in fp32 and fp16, and switching
the pass off by name (Options.disabled) changes the plan."""

from __future__ import annotations

import logging

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import autofusion
from autofusion.compiler import plan_graph
from autofusion.config import Options
from autofusion.ir.printer import print_graph
from autofusion.passes import layout
from autofusion.passes.layout_timing import ChainTiming
from autofusion.passes.manager import PASS_NAMES, after_rules_passes, graph_passes
from autofusion.runtime import linear_post_op


class Siblings(nn.Module):
    """Q, K and V projections of one input, as separate Linears."""

    def __init__(self, d: int = 32) -> None:
        super().__init__()
        self.q, self.k, self.v = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d // 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.q(x).relu(), self.k(x).sigmoid(), self.v(x)], -1)


class ConvChain(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.c1, self.c2 = nn.Conv2d(4, 8, 3, padding=1), nn.Conv2d(8, 4, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c2(self.c1(x).relu()).exp()


class ScaleBetweenConvs(nn.Module):
    """Squeeze-excite's per-channel scale between two convolutions."""

    def __init__(self) -> None:
        super().__init__()
        self.c1, self.c2 = nn.Conv2d(4, 8, 3, padding=1), nn.Conv2d(8, 4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.c1(x)  # no activation: without the built-in rules a relu would be a kernel between
        return self.c2(h * torch.sigmoid(h.mean((2, 3), keepdim=True))).exp()


def _folding(x: torch.Tensor) -> torch.Tensor:
    return x * torch.exp(torch.arange(x.shape[-1], dtype=x.dtype) * 0.25)


def _simplify(x: torch.Tensor) -> torch.Tensor:
    return (x.reshape(-1).reshape(x.shape) * 1.0 - 0.0).neg().neg().exp()


def _cse(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.exp(x + y) * torch.exp(y + x)


def _transpose(a: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return (a @ w.t()).relu()


def _gemm_relu(a: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return torch.relu(F.linear(a, w))


class GeluMlp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(24, 40)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(self.fc(x)).exp()


def _siblings_kernel(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return x.exp(), x.sin()


# pass -> (model, input shapes). Each model is one where the pass fires.
CASES = {
    "constant_folding": (_folding, [(5, 7)]),
    "algebraic_simplify": (_simplify, [(5, 7)]),
    "cse": (_cse, [(5, 7), (5, 7)]),
    "layout_transpose_eliminate": (_transpose, [(9, 6), (4, 6)]),
    "channels_last": (ConvChain, [(2, 4, 5, 5)]),
    "channels_last_scale": (ScaleBetweenConvs, [(2, 4, 5, 5)]),
    "linear_post_op": (GeluMlp, [(6, 24)]),
    "horizontal_pattern": (Siblings, [(4096, 32)]),
    "horizontal_kernel": (_siblings_kernel, [(6, 7)]),
    "gemm_epilogue": (_gemm_relu, [(96, 32), (48, 32)]),
}


def test_every_pass_has_a_case_and_a_place_in_the_order() -> None:
    assert sorted(CASES) == sorted(PASS_NAMES)
    names = [n for n, _ in [*graph_passes(), *after_rules_passes()]]
    assert all(n in names for n in PASS_NAMES if n not in ("horizontal_kernel", "gemm_epilogue"))
    assert names.index("horizontal_pattern") > names.index("layout_transpose_eliminate")  # vertical first


def test_pass_names_are_declared_once_in_the_order_they_run() -> None:
    import autofusion.config.flags as flags
    import autofusion.passes.rewrite as rewrite

    assert not hasattr(flags, "PASS_NAMES") and rewrite.PASS_NAMES is PASS_NAMES
    # The switchable passes in run order (dce is not switchable), then the solver's horizontal_kernel
    # and gemm_epilogue. The switchable passes after the rules come next (channels_last routes the
    # rules' convolutions).
    before = (n for n, _ in graph_passes() if n != "dce")
    after = (n for n, _ in after_rules_passes())
    assert (*before, *after, "horizontal_kernel", "gemm_epilogue") == PASS_NAMES


@pytest.fixture
def nhwc_pays(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make channels-last measure as paying, so the plan depends on the switch alone (the real
    measurement is timing-dependent; tests/passes/test_graph_passes.py covers both outcomes)."""
    fake = lambda spec: ChainTiming({"aten": 1e-4, "aten_cl": 2e-5, "onednn": 3e-5})  # noqa: E731
    monkeypatch.setattr(layout, "timer_for", lambda cache_dir: fake)
    # ...and the fused Linear + GELU call as the faster (runtime/linear_post_op.py).
    wins = {"fused": 1e-4, "packed_then_gelu": 1e-3, "plain_then_gelu": 1e-3, "plain_alone": 1e-3}
    monkeypatch.setattr(linear_post_op, "measure", lambda *a: dict(wins))


def _build(name: str, dtype: torch.dtype):
    fn, shapes = CASES[name]
    gen = torch.Generator().manual_seed(0)
    inputs = tuple(torch.randn(s, generator=gen).to(dtype) for s in shapes)
    if isinstance(fn, type):
        torch.manual_seed(0)
        fn = fn().to(dtype).eval()
    return fn, inputs


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_pass_matches_eager_and_its_switch_changes_the_plan(name: str, dtype: torch.dtype, nhwc_pays) -> None:
    fn, inputs = _build(name, dtype)
    # The built-in rules would take some of these linears into library calls; the passes are shown alone.
    with torch.no_grad():
        ref = fn(*inputs)
        on = autofusion.compile(fn, inputs, builtin_rules=False)
        off = autofusion.compile(fn, inputs, builtin_rules=False, disabled=frozenset({name}))
        got_on, got_off = on(*inputs), off(*inputs)
    tol = {"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 2e-3, "atol": 2e-3}
    torch.testing.assert_close(got_on, ref, **tol)
    torch.testing.assert_close(got_off, ref, **tol)
    if name == "gemm_epilogue" and dtype != torch.float32:
        # Half-precision GEMMs stay library calls either way: the switch changes the logged reason only.
        assert [d["reason"] for d in on.decisions] != [d["reason"] for d in off.decisions]
        return
    plan_on = plan_graph(on.graph, Options.from_env(builtin_rules=False))
    plan_off = plan_graph(off.graph, Options.from_env(builtin_rules=False, disabled=frozenset({name})))
    if name == "linear_post_op" and dtype != torch.float32:
        # oneDNN's fused linear takes fp32 and bf16: fp16 stays unfused either way.
        assert print_graph(plan_on.graph) == print_graph(plan_off.graph)
        return
    assert print_graph(plan_on.graph) != print_graph(plan_off.graph) or plan_on.stats != plan_off.stats
    if name == "linear_post_op":
        assert "linear_act" in print_graph(plan_on.graph) and "gelu" in print_graph(plan_off.graph)
    if name in ("horizontal_kernel", "layout_transpose_eliminate", "gemm_epilogue"):
        assert on.stats["kernels"] < off.stats["kernels"], (on.stats, off.stats)
    if name == "horizontal_pattern":
        linears = [n for n in plan_on.graph.nodes if n.op == "linear"]
        assert len(linears) == 1 and len([n for n in plan_off.graph.nodes if n.op == "linear"]) == 3
    if name == "channels_last":
        routed = [n for n in plan_on.graph.nodes if n.op == "extern" and "conv_bn_act" in n.attr("target")]
        assert routed and all(n.attr("args")[-2] == "aten_cl" for n in routed)
    if name == "channels_last_scale":

        def muls(g):  # type: ignore[no-untyped-def]
            return [n for n in g.nodes if n.op == "extern" and n.attr("target") == "aten.mul.Tensor"]

        assert len(muls(plan_on.graph)) == 1 and not muls(plan_off.graph)


def test_unknown_names_in_disabled_are_ignored_by_the_passes() -> None:
    x = torch.randn(3, 4)
    cm = autofusion.compile(lambda t: t.exp(), (x,), disabled=frozenset({"no_such_pass"}))
    torch.testing.assert_close(cm(x), x.exp())


def test_disabled_passes_are_logged(caplog: pytest.LogCaptureFixture) -> None:
    x = torch.randn(3, 4)
    with caplog.at_level(logging.INFO, logger="autofusion.passes"):
        plan_graph(
            autofusion.compile(lambda t: t.exp(), (x,)).graph, Options.from_env(disabled=frozenset({"cse"}))
        )
    assert "pass cse is disabled" in caplog.text


@pytest.mark.parametrize("shape", [(), (1,), (0, 3), (1, 7), (5, 1), (3, 0, 2)], ids=str)
@pytest.mark.parametrize("name", ["algebraic_simplify", "cse", "constant_folding"])
def test_edge_shapes(name: str, shape: tuple[int, ...]) -> None:
    fn, shapes = CASES[name]
    if name == "constant_folding" and not shape:
        pytest.skip("the model reads x.shape[-1]")
    inputs = tuple(torch.randn(shape) for _ in shapes)
    with torch.no_grad():
        cm = autofusion.compile(fn, inputs)
        torch.testing.assert_close(cm(*inputs), fn(*inputs))


def test_non_contiguous_inputs() -> None:
    x, y = torch.randn(7, 5).t(), torch.randn(5, 7)
    with torch.no_grad():
        cm = autofusion.compile(_cse, (x, y))
        torch.testing.assert_close(cm(x, y), _cse(x, y))
        a, w = torch.randn(6, 9).t(), torch.randn(6, 4).t()
        cm = autofusion.compile(_transpose, (a, w))
        torch.testing.assert_close(cm(a, w), _transpose(a, w))


@pytest.mark.parametrize("rows", [(1, 32), (32,), (3, 1, 32)], ids=str)
def test_sibling_linears_edge_shapes(rows: tuple[int, ...]) -> None:
    torch.manual_seed(0)
    model = Siblings().eval()
    x = torch.randn(rows)
    with torch.no_grad():
        cm = autofusion.compile(model, (x,))
        torch.testing.assert_close(cm(x), model(x))
