"""Compile once, instantiate per size (`autofusion.reuse`): a model with symbolic sizes is planned once
and the plan's decisions reused for other sizes. Each reused program is the one a fresh compile of
its sizes makes (same graph, source, size parameters, SuperKernel entries and arena; bit-identical
results), generated code runs, a size that flips a recorded guard or cost verdict is planned again,
an instantiation a fresh compile disagrees with turns reuse off, and the counters say what happened."""

from __future__ import annotations

import io
import logging
import sys
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import onnx
import pytest
import torch

import autofusion
from autofusion import reuse
from autofusion.config import Options
from autofusion.frontend.onnx.symbolic import make_template
from autofusion.ir.symbolic import Guards, SymInt, substitute, verdict

sys.path.insert(0, str(Path(__file__).parent / "frontend" / "onnx"))
from test_symbolic_dims import _reshape_softmax_model

f32 = np.float32


class _Block(torch.nn.Module):
    """LayerNorm -> Linear -> GELU -> Linear + residual -> softmax: linears on weights (library routes,
    freezing), reductions and elementwise kernels."""

    def __init__(self, d: int = 24) -> None:
        super().__init__()
        self.ln = torch.nn.LayerNorm(d)
        self.fc1, self.fc2 = torch.nn.Linear(d, 2 * d), torch.nn.Linear(2 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x + self.fc2(torch.nn.functional.gelu(self.fc1(self.ln(x))))).softmax(-1)


def _block_model() -> onnx.ModelProto:
    torch.manual_seed(0)
    m = _Block().eval()
    buf = io.BytesIO()
    with torch.no_grad():
        axes = {"x": {0: "batch", 1: "seq"}, "y": {0: "batch", 1: "seq"}}
        torch.onnx.export(m, (torch.randn(2, 5, 24),), buf, dynamo=False, opset_version=17,
                          input_names=["x"], output_names=["y"], dynamic_axes=axes)  # fmt: skip
    return onnx.load_from_string(buf.getvalue())


def _pair(model: onnx.ModelProto, **options: object) -> tuple[object, object]:
    """The model compiled with plan reuse, and without it (every size planned for itself)."""
    return autofusion.compile(model, **options), autofusion.compile(model, plan_reuse=False, **options)


@pytest.mark.parametrize("make", [_reshape_softmax_model, _block_model], ids=["reshape_softmax", "block"])
def test_reused_plans_are_bit_identical_to_fresh_compiles(make, caplog) -> None:
    model = make()
    cm, fresh = _pair(model, linear_route="mkl")
    d = 8 if make is _reshape_softmax_model else 24
    rng = np.random.default_rng(0)
    # odd sizes, 1 (converted for itself), and past the kernels' parallel threshold (planned again)
    sizes = [(4, 16), (3, 17), (5, 33), (1, 20), (7, 31), (48, 33), (4, 16)]
    with caplog.at_level(logging.INFO, logger="autofusion.reuse"):
        for b, s in sizes:
            x = rng.standard_normal((b, s, d)).astype(f32)
            y, want = cm(x), fresh(x)
            assert torch.equal(y, want), (b, s)
            assert cm.stats["generated_calls"] > 0
    st = cm.stats["plan_reuse"]
    assert st["reused"] >= 2 and st["trusted"] and not st["off"], st
    assert "reused the plan for" in caplog.text
    assert "plan_reuse" not in fresh.stats


def test_instantiated_program_equals_a_fresh_compile() -> None:
    """Straight through the template: for each size the instantiation and a compile of that size run
    the same graph, source, parameters, entries, arena and routes."""
    model = _block_model()
    t = make_template(model, "block", {"x": (4, 16, 24)})
    options = Options.from_env(linear_route="mkl")
    from autofusion.passes.rewrite import settle_options

    options = settle_options(options)
    plan = reuse.PlanTemplate.make(t.graph, t.hints, options)
    assert len(plan.guards.recorded) > 0 and len(plan.guards.verdicts) > 0 and plan.routes
    for env in ({"batch": 3, "seq": 17}, {"batch": 5, "seq": 33}, {"batch": 6, "seq": 31}):
        program = plan.instantiate(env)
        graph = t.instantiate(env).graph
        diff = reuse.same_program(program, plan.fresh(graph, env))
        assert diff is None, (env, diff)
        assert program.stats["plan_reused"] is True
        assert program.library is plan.program.library  # one loop structure: the loaded library reused


def test_a_size_past_the_parallel_threshold_reuses_the_plan() -> None:
    # (64, 129): 66k elements per kernel, past the parallel threshold the plan for (2, 3) was made under.
    # Whether a kernel forks its threads is decided when it runs (its size parameter), and the reports
    # that estimate kernel times take no guards: one plan holds for both sides.
    model = _reshape_softmax_model()
    cm, fresh = _pair(model)
    rng = np.random.default_rng(1)
    for b, s in [(2, 3), (3, 5), (64, 129), (65, 127), (3, 5)]:
        x = rng.standard_normal((b, s, 8)).astype(f32)
        assert torch.equal(cm(x), fresh(x))
    st = cm.stats["plan_reuse"]
    assert st["templates"] == 1 and st["reused"] == 3 and not st["planned_again"], st


class _Gelu(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.gelu(x)


def test_a_size_that_flips_a_guard_is_planned_again() -> None:
    # A GELU alone runs as our kernel below 32k elements and as ATen's from there (a step the plan
    # holds, not a tiling): (64, 129) fails the guard the plan for (2, 3) took and is planned again.
    m = _Gelu()
    cm = autofusion.compile(m, [torch.randn(2, 3, 64)], dynamic={"x": {0: "batch", 1: "seq"}})
    with torch.no_grad():
        for b, s in [(2, 3), (3, 5), (64, 129), (65, 127), (3, 5)]:
            x = torch.randn(b, s, 64)
            torch.testing.assert_close(cm(x), m(x))
    st = cm.stats["plan_reuse"]
    assert st["templates"] == 2, st  # the second plan was made for (64, 129) ...
    assert any("guard" in why and "32768" in why for why in st["planned_again"]), st
    assert st["reused"] == 2, st  # ... and (65, 127) reused it, as (3, 5) reused the first


def test_an_instantiation_a_fresh_compile_disagrees_with_turns_reuse_off(monkeypatch) -> None:
    # The results check fails and the fresh compile it then asks for is another program: reuse off.
    model = _reshape_softmax_model()
    monkeypatch.setattr(reuse, "check_results", lambda program, graph: "output 0 differs (the test)")
    monkeypatch.setattr(reuse, "same_program", lambda a, b: "the generated sources differ")
    cm, fresh = _pair(model)
    rng = np.random.default_rng(2)
    for b, s in [(2, 3), (3, 5), (4, 6)]:
        x = rng.standard_normal((b, s, 8)).astype(f32)
        assert torch.equal(cm(x), fresh(x))
    st = cm.stats["plan_reuse"]
    assert st["reused"] == 0 and st["off"] and "sources differ" in st["off"][0], st
    assert "the test" in st["off"][0] and st["checked"] == 1, st


def test_a_results_check_is_no_plan_and_a_failed_one_asks_a_fresh_compile(monkeypatch) -> None:
    model = _reshape_softmax_model()
    rng = np.random.default_rng(3)
    sizes = [(2, 3), (3, 5), (4, 6)]
    cm, fresh = _pair(model)
    for b, s in sizes:
        x = rng.standard_normal((b, s, 8)).astype(f32)
        assert torch.equal(cm(x), fresh(x))
    st = cm.stats["plan_reuse"]
    # One planner run (the template); (3, 5) is checked against the reference, (4, 6) just reused.
    assert st["planned"] == 1 and st["checked"] == 1 and st["reused"] == 2 and st["trusted"], st
    # A check that fails: the fresh compile is the same program, so the plan holds (one more plan).
    monkeypatch.setattr(reuse, "check_results", lambda program, graph: "output 0 differs (the test)")
    cm = autofusion.compile(model)
    for b, s in sizes:
        x = rng.standard_normal((b, s, 8)).astype(f32)
        assert torch.equal(cm(x), fresh(x))
    st = cm.stats["plan_reuse"]
    assert st["planned"] == 2 and st["checked"] == 1 and st["reused"] == 2 and not st["off"], st


def test_the_results_check_sees_wrong_values() -> None:
    # An instantiation agrees with the reference; values off as an element read at the hint's extent
    # would be do not.
    model = _block_model()
    t = make_template(model, "block", {"x": (4, 16, 24)})
    from autofusion.passes.rewrite import settle_options

    plan = reuse.PlanTemplate.make(t.graph, t.hints, settle_options(Options.from_env()))
    env = {"batch": 3, "seq": 17}
    assert reuse.check_results(plan.instantiate(env), t.instantiate(env).graph) is None
    # Values off by 1 % of the largest: far past the float32 tolerance (0.1 %).
    good = plan.instantiate(env)

    def off(xs: list) -> list:
        return [y + 1e-2 * float(y.abs().max()) for y in good.executor.run(xs)]

    bad = SimpleNamespace(executor=SimpleNamespace(run=off))
    wrong = reuse.check_results(bad, t.instantiate(env).graph)  # type: ignore[arg-type]
    assert wrong is not None and "differs from the reference" in wrong, wrong


def test_off_plans_every_size_for_itself() -> None:
    cm = autofusion.compile(_reshape_softmax_model(), plan_reuse=False)
    cm(np.ones((2, 3, 8), f32))
    cm(np.ones((3, 4, 8), f32))
    assert "plan_reuse" not in cm.stats


def test_the_hot_path_of_a_repeated_shape_is_unchanged() -> None:
    model = _reshape_softmax_model()
    cm = autofusion.compile(model)
    x = torch.ones(3, 5, 8)
    cm(torch.ones(2, 3, 8))
    cm(x)
    hot = cm._hot
    assert hot is not None
    before = dict(cm.stats)
    for _ in range(3):
        cm(x)
    assert cm._hot is hot  # the same compiled call, taken without a signature lookup
    after = cm.stats
    assert after["signature_hits"] == before["signature_hits"]  # no lookup at all
    assert after["plan_reuse"]["reused"] == before["plan_reuse"]["reused"] == 1
    assert after["generated_calls"] == before["generated_calls"] + 3


@dataclass(frozen=True, slots=True)
class _Leaf:
    n: int
    tag: str


@dataclass(frozen=True)
class _Tree:
    leaves: tuple[_Leaf, ...]
    shared: _Leaf
    sizes: dict[str, int]


def test_substitute_keeps_sharing_and_returns_what_holds_no_size() -> None:
    b = SymInt.symbol("b", 3)
    fixed = _Leaf(4, "fixed")
    leaf = _Leaf(b * 2, "x")
    tree = _Tree((leaf, fixed, leaf), leaf, {"k": b + 1})
    out = substitute(tree, {"b": 5})
    assert out.leaves[0] is out.leaves[2] is out.shared  # one copy of a shared object
    assert out.leaves[1] is fixed  # nothing to change: the object itself
    assert out.shared.n == 10 and type(out.shared.n) is int and out.sizes == {"k": 6}
    again = substitute(tree, {"b": 7}, rehint=True)
    assert (
        isinstance(again.shared.n, SymInt) and again.shared.n == 14 and again.shared.n.describe() == "(b*2)"
    )
    assert substitute(fixed, {"b": 5}) is fixed


def _over(x: int, least: float) -> bool:
    return x * 1.5 > least  # a verdict on floats computed from a size


def test_a_cost_verdict_is_taken_again_for_other_sizes() -> None:
    b = SymInt.symbol("b", 4)
    guards = Guards()
    with guards.recording():
        assert verdict(_over, b * 2, 10.0)  # 12 > 10
        # comparisons inside a verdict record no guard
        assert verdict(lambda xs: tuple(sorted(range(2), key=xs.__getitem__)), [b, 3]) == (1, 0)
    assert not guards.recorded and len(guards.verdicts) == 2
    assert guards.failing_verdict({"b": 5}) is None
    assert "_over" in (guards.failing_verdict({"b": 3}) or "")  # 9 > 10 is False
    assert not guards.hold({"b": 3})


class _Reshaping(_Block):
    """The block, its result flattened per batch row (a view whose size is computed from x's)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x).reshape(x.shape[0], -1)


def test_torch_dynamic_dims_capture_once_and_reuse_the_plan() -> None:
    """The direct API with `dynamic=`: one symbolic capture (torch.export Dims) and one plan serve the
    other sizes; each result equals a compile that plans every size for itself, bit for bit, and eager
    PyTorch's within rounding; batch 1 is captured and planned for itself."""
    torch.manual_seed(0)
    m = _Reshaping().eval()
    dyn = {"x": {0: "batch", 1: "seq"}}
    with torch.no_grad():
        first = torch.randn(4, 16, 24)
        cm = autofusion.compile(m, [first], dynamic=dyn, linear_route="mkl")
        fresh = autofusion.compile(m, [first], dynamic=dyn, linear_route="mkl", plan_reuse=False)
        for b, s in [(3, 17), (5, 33), (1, 20), (7, 31), (4, 16)]:
            x = torch.randn(b, s, 24)
            y = cm(x)
            assert torch.equal(y, fresh(x)), (b, s)
            torch.testing.assert_close(y, m(x), rtol=1e-4, atol=1e-5)
            assert cm.stats["generated_calls"] > 0
    sym, st = cm.stats["torch_symbolic"], cm.stats["plan_reuse"]
    assert sym["on"] and sym["trusted"] and sym["instantiations"] >= 4, sym
    # the template, the trust check's real capture, and batch 1 captured for itself
    assert sym["captures"] == 3 and any("sizes 0 and 1" in k for k in sym["captured_for_themselves"]), sym
    assert st["reused"] == 3 and st["trusted"], st
    assert "torch_symbolic" not in fresh.stats and "plan_reuse" not in fresh.stats


def test_torch_dims_that_must_stay_equal_are_captured_for_themselves() -> None:
    torch.manual_seed(0)

    def add(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return (a + b).relu()

    with torch.no_grad():
        cm = autofusion.compile(add, [torch.randn(4, 8), torch.randn(4, 8)],
                                dynamic={"a": {0: "n"}, "b": {0: "n"}})  # fmt: skip
        for n in (5, 9):
            a, b = torch.randn(n, 8), torch.randn(n, 8)
            assert torch.equal(cm(a, b), (a + b).relu())
    assert cm.stats["torch_symbolic"]["on"], cm.stats["torch_symbolic"]
    assert cm.stats["plan_reuse"]["reused"] == 2


class _Positions(torch.nn.Module):
    """Values made from the sizes alone (an arange over the sequence, a causal mask), which constant
    folding must not fix to the hint's sizes."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[1]
        pos = (torch.arange(n) + 1).to(x.dtype)  # folded at the hint's size unless kept symbolic
        keep = (torch.arange(n) + 0)[None, :, None] >= 0
        mask = torch.ones(n, n).tril().bool()
        scores = (x @ x.transpose(1, 2)).masked_fill(~mask, float("-inf"))
        return (scores.softmax(-1) @ x.masked_fill(~keep, 0.0)) * pos[None, :, None]


def test_values_made_from_sizes_follow_the_sizes() -> None:
    torch.manual_seed(0)
    m = _Positions().eval()
    with torch.no_grad():
        cm = autofusion.compile(m, [torch.randn(2, 8, 16)], dynamic={"x": {0: "batch", 1: "seq"}})
        fresh = autofusion.compile(m, [torch.randn(2, 8, 16)], dynamic={"x": {0: "batch", 1: "seq"}},
                                   plan_reuse=False)  # fmt: skip
        for b, s in [(3, 8), (2, 13), (4, 29), (3, 11)]:
            x = torch.randn(b, s, 16)
            y = cm(x)
            torch.testing.assert_close(y, m(x), rtol=1e-4, atol=1e-5)
            assert torch.equal(y, fresh(x)), (b, s)
    assert cm.stats["torch_symbolic"]["on"], cm.stats["torch_symbolic"]
    assert cm.stats["plan_reuse"]["reused"] >= 1, cm.stats["plan_reuse"]


class _TokenTypes(torch.nn.Module):
    """BERT's token-type embedding: a buffer of ids sliced to the sequence, expanded to the batch and
    looked up: a [batch, seq, d] value computed from the buffer and a weight alone."""

    def __init__(self, d: int = 256) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(2, d)
        self.register_buffer("ids", torch.zeros(1, 512, dtype=torch.long))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tt = self.ids[:, : x.shape[1]].expand(x.shape[0], -1)
        return (x + self.emb(tt)).relu()


def test_a_weight_fold_of_the_call_sizes_does_not_flip_the_plan() -> None:
    # (2, 16): 32 KiB from the weights alone, under the fold budget; (8, 200): 1.6 MiB, over it. A
    # plan for many sizes computes it per call at every size, so one plan holds for both.
    torch.manual_seed(0)
    m = _TokenTypes().eval()
    cm = autofusion.compile(m, [torch.randn(2, 16, 256)], dynamic={"x": {0: "batch", 1: "seq"}})
    with torch.no_grad():
        for b, s in [(2, 16), (3, 17), (8, 200), (2, 16)]:
            x = torch.randn(b, s, 256)
            torch.testing.assert_close(cm(x), m(x))
    st = cm.stats["plan_reuse"]
    assert st["templates"] == 1 and st["reused"] == 2 and not st["planned_again"], st
    # A compile of fixed sizes keeps the budget: the small lookup is folded there.
    fixed = autofusion.compile(m, [torch.randn(2, 16, 256)], plan_reuse=False)
    fixed(torch.randn(2, 16, 256))
    assert fixed.stats["freeze"]["folded_nodes"] > 0, fixed.stats["freeze"]
    assert cm.stats["freeze"]["folded_nodes"] < fixed.stats["freeze"]["folded_nodes"], cm.stats["freeze"]
