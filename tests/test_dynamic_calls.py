"""torch.compile with shapes that change, as Dynamo hands them over: how many graphs reach the backend
with its defaults and with dynamic=True (batch 1 included: Dynamo specialises sizes 0 and 1), that none
runs eagerly and every result is right; the symbolic graph's hot path (the last call's facts, compared
in place) never runs a plan made for other sizes, strides, dtypes or scalar types; results that are the
graph's values themselves keep their type on the short rebuild path."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch._dynamo.utils import counters

import autofusion
from autofusion.api import CompiledGraph
from autofusion.backend import Specialized
from autofusion.frontend.torch.pytree import plain_result


class Block(torch.nn.Module):
    def __init__(self, d: int = 16) -> None:
        super().__init__()
        self.ln = torch.nn.LayerNorm(d)
        self.fc1, self.fc2 = torch.nn.Linear(d, 2 * d), torch.nn.Linear(2 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(torch.nn.functional.gelu(self.fc1(self.ln(x)))).softmax(-1)


# (batch, seq): batch 1 first and again later, as a user's first requests often are
SHAPES = [(1, 5), (1, 9), (3, 5), (2, 9), (1, 7), (4, 6), (3, 5)]


def _run(call_recorder: Callable[..., Any], dynamic: bool | None) -> tuple[list[Any], int]:
    torch.manual_seed(0)
    m = Block().eval()
    torch._dynamo.reset()
    counters.clear()
    seen: list[Any] = []
    fn = torch.compile(m, backend=call_recorder(seen), dynamic=dynamic)
    with torch.no_grad():
        for b, t in SHAPES:
            x = torch.randn(b, t, 16)
            torch.testing.assert_close(fn(x), m(x), rtol=1e-4, atol=1e-5)
    return seen, counters["stats"]["unique_graphs"]


def _check_compiled(seen: list[Any]) -> None:
    assert all(f.autofusion_graph is not None for f in seen), [f.autofusion_stats() for f in seen]
    for f in seen:
        assert "eager_fallback" not in f.autofusion_stats()
        assert f.autofusion_stats()["generated_calls"] >= 1


def test_defaults_hand_over_three_graphs_and_none_runs_eagerly(call_recorder: Callable[..., Any]) -> None:
    # Dynamo's automatic dynamic shapes, before any backend is asked: the first call is traced static;
    # the seq change (batch still 1) makes seq symbolic and keeps batch 1 (sizes 0 and 1 specialise);
    # the batch change makes both symbolic. The later batch-1 call finds the second graph.
    seen, unique = _run(call_recorder, None)
    assert len(seen) == unique == 3
    assert all(isinstance(f, Specialized) for f in seen)
    assert seen[0].traced_static and not any(f.traced_static for f in seen[1:])
    _check_compiled(seen)
    # Every shape planned once, wherever Dynamo sent it: the static graph (1, 5); the batch-1 graph
    # (1, 9) and (1, 7); the symbolic one (3, 5), (2, 9), (4, 6) (the second (3, 5) found its plan).
    assert [f.autofusion_stats().get("signatures_planned", 1) for f in seen] == [1, 2, 3]


def test_dynamic_true_hands_over_two_graphs(call_recorder: Callable[..., Any]) -> None:
    # Symbolic from the first trace: only batch 1 is a graph of its own (the 0/1 specialisation).
    seen, unique = _run(call_recorder, True)
    assert len(seen) == unique == 2
    assert all(isinstance(f, Specialized) for f in seen)
    _check_compiled(seen)
    assert sorted(f.autofusion_stats()["signatures_planned"] for f in seen) == [3, 3]


class _Scaled(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # The batch size as a value: Dynamo passes it as an int input of the symbolic graph.
        return (x * 2).sum(-1, keepdim=True) / x.shape[0] + x


def _specialized(call_recorder: Callable[..., Any]) -> tuple[Specialized, list[Any]]:
    """The symbolic graph of `_Scaled` and the arguments Dynamo passes it for one call."""
    torch._dynamo.reset()
    seen: list[Any] = []
    calls: list[tuple[Any, ...]] = []
    fn = torch.compile(_Scaled(), backend=call_recorder(seen, calls), dynamic=True)
    with torch.no_grad():
        fn(torch.randn(3, 6))
    (spec,) = seen
    assert isinstance(spec, Specialized) and spec.scalar_pos, "the batch size must be a scalar input"
    return spec, list(calls[-1])


def test_hot_path_runs_the_last_plan_and_misses_on_any_other_fact(call_recorder: Callable[..., Any]) -> None:
    spec, args = _specialized(call_recorder)
    ref = _Scaled()
    (xpos,) = spec.tensor_pos  # a Dynamo graph returns a tuple: [0] below
    planned = lambda: spec.autofusion_stats()["signatures_planned"]  # noqa: E731
    with torch.no_grad():
        base = planned()
        graph = spec.autofusion_graph
        assert graph is not None
        before = graph.generated_calls
        torch.testing.assert_close(spec(*args)[0], ref(args[xpos]))
        assert graph.generated_calls == before + 1 and planned() == base  # the hot path: generated code

        # Same shape, other strides: a new plan, the right result.
        xt = torch.randn(6, 3).t()
        other = list(args)
        other[xpos] = xt
        torch.testing.assert_close(spec(*other)[0], ref(xt))
        assert planned() == base + 1
        # Same shape and strides, other dtype.
        other[xpos] = args[xpos].double()
        torch.testing.assert_close(spec(*other)[0], ref(args[xpos].double()))
        assert planned() == base + 2
        # The size scalar equal in value but of another type (3.0 == 3) is another signature.
        spos = spec.scalar_pos[0]
        other = list(args)
        other[spos] = float(args[spos])
        spec(*other)
        assert planned() == base + 3
        # Back to the first call's facts: its plan, without planning again.
        torch.testing.assert_close(spec(*args)[0], ref(args[xpos]))
        assert planned() == base + 3


class _Returns(torch.nn.Module):
    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind

    def forward(self, x: torch.Tensor) -> Any:
        a, b = x.relu() * 2, x.sigmoid() + 1
        if self.kind == "tensor":
            return a
        if self.kind == "tuple":
            return a, b
        if self.kind == "list":
            return [a, b]
        if self.kind == "swapped":
            return b, a
        return {"a": a, "b": b}


@pytest.mark.parametrize("kind", ["tensor", "tuple", "list", "swapped", "dict"])
def test_results_keep_their_type_and_values(kind: str) -> None:
    m = _Returns(kind)
    x = torch.randn(4, 5)
    cm = autofusion.compile(m, [x])
    with torch.no_grad():
        out, ref = cm(x), m(x)
    assert type(out) is type(ref)
    torch.testing.assert_close(out, ref)
    cg = cm.compiled
    assert isinstance(cg, CompiledGraph) and cg.generated_calls >= 1
    n = len(cg.captured.conversion.output_leaves)
    short = plain_result(cg.captured.rebuild, n)
    # The short path where the result is the graph's values in order (leaves are numbered in the
    # result's order, so a swapped pair is that too); the tree for a dict.
    assert short is {"tensor": torch.Tensor, "tuple": tuple, "list": list, "swapped": tuple}.get(kind)


# batch >= 2 (Dynamo keeps a dim traced at 1 static) over several sequence lengths
REUSE_SHAPES = [(2, 5), (3, 5), (3, 9), (2, 9), (4, 6), (5, 11), (3, 5)]


@pytest.mark.parametrize("dynamic", [None, True])
def test_a_symbolic_graph_is_planned_once_and_instantiated_per_signature(
    call_recorder: Callable[..., Any], dynamic: bool | None
) -> None:
    from autofusion import compiler

    torch.manual_seed(0)
    m = Block().eval()
    torch._dynamo.reset()
    seen: list[Any] = []
    fn = torch.compile(m, backend=call_recorder(seen), dynamic=dynamic)
    plans = compiler.COUNTS["plans"]
    with torch.no_grad():
        for b, t in REUSE_SHAPES:
            x = torch.randn(b, t, 16)
            torch.testing.assert_close(fn(x), m(x), rtol=1e-4, atol=1e-5)
    plans = compiler.COUNTS["plans"] - plans
    _check_compiled(seen)
    spec = seen[-1]
    assert isinstance(spec, Specialized)
    st = spec.autofusion_stats()
    entries = [e for e in spec.cache.values() if isinstance(e, CompiledGraph)]
    sigs = st["signatures_planned"]
    # dynamic=True: every call reaches one graph; None: the third shape makes both dims symbolic.
    assert sigs == len(entries) == (6 if dynamic else 5), st
    sym, reuse = st["dynamo_symbolic"], st["plan_reuse"]
    assert sym["on"] and sym["templates"] == 1 and sym["instantiations"] == sigs, st
    assert reuse["trusted"] and not reuse["off"] and not reuse["planned_again"], st
    if dynamic:
        # One planner run in all: the template; its first other size is a results check, not a plan.
        assert plans == 1, plans
        assert sym["captures"] == 2, st  # the symbolic capture and one real one, for the trust check
        assert reuse["templates"] == 1 and reuse["planned"] == 1 and reuse["reused"] == sigs - 1, st
        assert reuse["checked"] == 1 and reuse["from_other_graphs"] == 0, st
    else:
        # The static first graph (2, 5) is planned with batch and seq symbolic; the batch-only graph
        # (seq 5 fixed) prints otherwise and plans for itself; the last graph (both symbolic) prints as
        # the first and instantiates its plan: two planner runs for three Dynamo graphs.
        assert plans == 2, plans
        assert sym["captures"] == 1, st  # printing as the first capture (other hints) trusts it
        assert reuse["templates"] == 0 and reuse["planned"] == 0 and reuse["reused"] == sigs, st
        assert reuse["from_other_graphs"] == sigs, st
    # Every program is the template's, evaluated for its sizes (the hints' one too).
    assert all(e.program is not None and e.program.stats.get("plan_reused") for e in entries)
    assert all(e.generated_calls >= 1 for e in entries)  # each signature ran generated code
    assert len({e.program.source for e in entries}) == 1  # one loop structure: one library


class _Gelu(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.gelu(x)


def test_a_failing_guard_plans_again_and_stays_correct(call_recorder: Callable[..., Any]) -> None:
    # A GELU alone is our kernel below 32k elements and ATen's from there: (64, 129) fails the guard
    # the plan for (2, 3) took, is planned for itself as a template, and (65, 127) reuses that one.
    m = _Gelu()
    torch._dynamo.reset()
    seen: list[Any] = []
    fn = torch.compile(m, backend=call_recorder(seen), dynamic=True)
    with torch.no_grad():
        for b, t in [(2, 3), (3, 5), (64, 129), (65, 127), (3, 5)]:
            x = torch.randn(b, t, 64)
            torch.testing.assert_close(fn(x), m(x))
    (spec,) = seen
    reuse = spec.autofusion_stats()["plan_reuse"]
    assert reuse["templates"] == 2 and reuse["reused"] == 2, reuse
    assert any("guard" in why and "32768" in why for why in reuse["planned_again"]), reuse


def test_an_instantiation_a_capture_disagrees_with_turns_the_family_off(
    call_recorder: Callable[..., Any], monkeypatch: Any
) -> None:
    from autofusion.frontend.torch import symbolic

    monkeypatch.setattr(symbolic, "trust_check", lambda *a: ("output 0 differs", False))
    torch.manual_seed(0)
    m = Block().eval()
    torch._dynamo.reset()
    seen: list[Any] = []
    fn = torch.compile(m, backend=call_recorder(seen), dynamic=True)
    with torch.no_grad():
        for b, t in [(2, 5), (3, 7), (4, 6)]:
            x = torch.randn(b, t, 16)
            torch.testing.assert_close(fn(x), m(x), rtol=1e-4, atol=1e-5)
    st = seen[-1].autofusion_stats()
    sym = st["dynamo_symbolic"]
    assert sym["families_off"] and "differs" in sym["families_off"][0], sym
    assert sym["instantiations"] == 1 and sym["captured_for_themselves"], sym  # (2, 5) only
    assert st["signatures_planned"] == 3


def test_non_contiguous_inputs_and_other_dtypes_are_captured_for_themselves(
    call_recorder: Callable[..., Any],
) -> None:
    spec, args = _specialized(call_recorder)
    ref = _Scaled()
    (xpos,) = spec.tensor_pos
    with torch.no_grad():
        other = list(args)
        other[xpos] = torch.randn(6, 4).t()
        other[spec.scalar_pos[0]] = 4
        torch.testing.assert_close(spec(*other)[0], ref(other[xpos]))
        other[xpos] = torch.randn(5, 6).double()
        other[spec.scalar_pos[0]] = 5
        out = spec(*other)[0]
        assert out.dtype is torch.float64
        torch.testing.assert_close(out, ref(other[xpos]))
    sym = spec.autofusion_stats()["dynamo_symbolic"]
    assert any("not contiguous" in why for why in sym["captured_for_themselves"]), sym
    assert sym["families"] == 2, sym  # float64 calls have a symbolic capture of their own
