"""runtime/route_timing.best_times: a clear loser leaves the race after SETTLE samples, close calls are
timed every round, and the choosers built on it decide as before (prepack, linear_post_op)."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable

import pytest
import torch

from autofusion.runtime import linear_post_op, prepack, route_timing
from autofusion.runtime.route_timing import MIN_ROUNDS, SETTLE, best_times


class FakeClock:
    """A clock that only the timed calls move: each call costs its route's seconds."""

    def __init__(self) -> None:
        self.now = 0.0
        self.calls: Counter[str] = Counter()

    def __call__(self) -> float:
        return self.now

    def route(self, name: str, costs: list[float]) -> Callable[[], None]:
        """A call whose k-th run costs costs[min(k, len - 1)] seconds."""

        def run() -> None:
            self.now += costs[min(self.calls[name], len(costs) - 1)]
            self.calls[name] += 1

        return run


def test_clear_losers_leave_the_race_and_the_leader_stops() -> None:
    clock = FakeClock()
    fns = {r: clock.route(r, [c]) for r, c in (("plain", 0.04), ("mkl", 0.041), ("onednn", 0.018))}
    best = best_times(fns, clock, budget_s=0.15)
    assert best == pytest.approx({"plain": 0.04, "mkl": 0.041, "onednn": 0.018})
    # One untimed run and SETTLE samples each, then only the leader is left: the rounds end.
    assert clock.calls == {"plain": 1 + SETTLE, "mkl": 1 + SETTLE, "onednn": 1 + SETTLE}


def test_close_calls_are_timed_every_round() -> None:
    clock = FakeClock()
    fns = {r: clock.route(r, [c]) for r, c in (("plain", 0.040), ("mkl", 0.034), ("onednn", 0.036))}
    best_times(fns, clock, budget_s=0.15)
    # 0.11 s per round against a budget of 0.15: MIN_ROUNDS rounds after the first timed pass.
    assert clock.calls == dict.fromkeys(fns, 2 + MIN_ROUNDS)


def test_only_the_clear_loser_leaves() -> None:
    clock = FakeClock()
    fns = {r: clock.route(r, [c]) for r, c in (("plain", 0.050), ("mkl", 0.034), ("onednn", 0.036))}
    best_times(fns, clock, budget_s=0.15)
    assert clock.calls == {"plain": 1 + SETTLE, "mkl": 2 + MIN_ROUNDS, "onednn": 2 + MIN_ROUNDS}


def test_a_disturbed_first_sample_does_not_decide() -> None:
    """The leader's first timed run was disturbed (3x slower): the others stay in the race until it has
    SETTLE samples, and its best time is the undisturbed one."""
    clock = FakeClock()
    fns = {"plain": clock.route("plain", [0.04]), "onednn": clock.route("onednn", [0.018, 0.054, 0.018])}
    best = best_times(fns, clock, budget_s=0.15)
    assert best["onednn"] == pytest.approx(0.018) and prepack.pick(best) == "onednn"
    assert clock.calls["plain"] == 1 + SETTLE


def test_warmed_calls_are_not_run_untimed_again() -> None:
    clock = FakeClock()
    fns = {r: clock.route(r, [c]) for r, c in (("plain", 0.04), ("onednn", 0.01))}
    best_times(fns, clock, budget_s=0.15, warmed={"onednn"})
    assert clock.calls == {"plain": 1 + SETTLE, "onednn": SETTLE}


def test_short_calls_fill_the_budget() -> None:
    """Calls under a millisecond in all: MAX_ROUNDS rounds of CALLS_WHEN_SHORT calls for close ones."""
    clock = FakeClock()
    fns = {r: clock.route(r, [c]) for r, c in (("plain", 1e-4), ("mkl", 1.1e-4))}
    best_times(fns, clock, budget_s=0.15)
    per = 2 + route_timing.MAX_ROUNDS * route_timing.CALLS_WHEN_SHORT
    assert clock.calls == dict.fromkeys(fns, per)


def test_prepack_measures_through_the_race(monkeypatch: pytest.MonkeyPatch) -> None:
    """prepack.measure hands every available route to best_times, the packed ones as warmed (they ran
    once when packed), and returns its times."""
    seen: list[tuple[list[str], set[str]]] = []
    real = route_timing.best_times

    def spy(fns, clock, budget_s, warmed=()):  # type: ignore[no-untyped-def]
        seen.append((list(fns), set(warmed)))
        return real(fns, clock, budget_s, warmed)

    monkeypatch.setattr(prepack, "best_times", spy)
    monkeypatch.setattr(prepack, "machine_busy", lambda: (False, "quiet"))
    best = prepack.measure(64, 96, 80, torch.float32)
    routes = [r for r in prepack.ROUTES if prepack.available(r, torch.float32)]
    assert seen and seen[0][0][0] == "plain" and set(seen[0][0]) <= set(routes)
    assert seen[0][1] == set(seen[0][0]) - {"plain"}
    assert best is not None and set(best) == set(seen[0][0]) and all(0 < t < 1 for t in best.values())


@pytest.mark.measured_hardware  # the autouse fixture replaces linear_post_op.measure otherwise
def test_post_op_measures_through_the_race(monkeypatch: pytest.MonkeyPatch) -> None:
    if not linear_post_op.available(torch.float32):
        pytest.skip("no oneDNN fused linear in this torch build")
    seen: list[list[str]] = []
    real = route_timing.best_times

    def spy(fns, *args, **kwargs):  # type: ignore[no-untyped-def]
        seen.append(list(fns))
        return real(fns, *args, **kwargs)

    monkeypatch.setattr(linear_post_op, "best_times", spy)
    best = linear_post_op.measure(32, 48, 64, torch.float32, "gelu")
    assert seen == [["fused", "packed_then_gelu", "plain_then_gelu", "plain_alone"]]
    assert best is None or all(t > 0 for t in best.values())


def test_real_clock_times_are_positive() -> None:
    a = torch.randn(64, 64)
    best = best_times({"mm": lambda: a @ a, "add": lambda: a + a}, time.perf_counter, 0.01)
    assert set(best) == {"mm", "add"} and all(0 < t < 1 for t in best.values())
