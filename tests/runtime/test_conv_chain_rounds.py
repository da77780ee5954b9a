"""How many rounds the chain measurement (runtime/conv_chain.py) runs, on a fake clock: sized by each
route's second run (the first packs weights and creates primitives), and extended while the rounds
disagree, so a few disturbed rounds neither make a timing unreliable nor set a route's time; a
disturbance that does not go away still leaves the timing unreliable, within a bounded number of
extra rounds. (Sized by the first run, MobileNetV2's 52-conv chain got the minimum of rounds; one
benchmark run had its ONNX export's chain NCHW, 11.7 ms against 4.2 from torch, same chain signature.)"""

from __future__ import annotations

from collections.abc import Callable

import pytest

import autofusion.runtime.conv_chain as conv_chain
from autofusion.ir import DType
from autofusion.passes.layout import _decide
from autofusion.passes.layout_timing import ChainConv, ChainSpec, ChainTiming
from autofusion.runtime import library

MS = 1e-3
# A chain's quiet per-run time in each route (MobileNetV2-like ratios), and its first run's: packing.
QUIET = {"aten": 12 * MS, "aten_cl": 8 * MS, "onednn": 6 * MS, "dnnl": 4 * MS}
FIRST_FACTOR = 10.0


def _spec() -> ChainSpec:
    """One convolution of enough work (75 MFLOP) that 12 ms is a plausible NCHW time for it."""
    n, c, h = 1, 64, 32
    conv = ChainConv("c0", -1, None, (n, c, h, h), (c, c, 3, 3), (n, c, h, h), (1, 1), (1, 1), (1, 1), 1,
                     "relu", (), True, True)  # fmt: skip
    return ChainSpec(DType.float32, (((n, c, h, h), False),), (conv,))


class FakeChain:
    """Stands in for conv_chain._runner: each route's run advances a fake clock by its scripted time.
    `slow(route, k)` is the factor of that route's k-th run after the first (k = 0: the sizing run)."""

    def __init__(self, slow: Callable[[str, int], float]) -> None:
        self.now = 0.0
        self.slow = slow
        self.calls: dict[str, int] = {r: 0 for r in library.ROUTES}

    def clock(self) -> float:
        return self.now

    def runner(self, spec: ChainSpec, route: str, ins: object, params: object) -> Callable[[], None]:
        def run() -> None:
            k = self.calls[route]
            self.calls[route] += 1
            factor = FIRST_FACTOR if k == 0 else self.slow(route, k - 1)
            self.now += QUIET[route] * factor
            library.ROUTE_CALLS[route] += len(spec.convs)  # as the real calls count themselves

        return run


def _measure(
    monkeypatch: pytest.MonkeyPatch, slow: Callable[[str, int], float]
) -> tuple[FakeChain, ChainTiming]:
    fake = FakeChain(slow)
    monkeypatch.setattr(conv_chain, "_clock", fake.clock)
    monkeypatch.setattr(conv_chain, "_runner", fake.runner)
    monkeypatch.setattr(library, "ROUTES", tuple(QUIET))
    return fake, conv_chain.measure(_spec())


def test_rounds_are_sized_by_the_second_run_not_the_packing_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """The first runs (packing) cost 10x: sized by them, this 30 ms-a-round chain got MIN_ROUNDS rounds;
    sized by the second runs it gets as many as BUDGET_S holds (MAX_ROUNDS here), and one disturbed
    round of the NCHW route changes nothing: still reliable, its quiet time, and the channels-last route
    the layout pass then picks."""
    fake, t = _measure(monkeypatch, lambda r, k: 3.0 if (r, k) == ("aten", 2) else 1.0)
    assert t.reliable, t
    timed = {r: c - 2 for r, c in fake.calls.items()}  # less the packing and the sizing runs
    assert set(timed.values()) == {conv_chain.MAX_ROUNDS}, timed
    assert t.route_s == pytest.approx(QUIET)
    route, decision = _decide(_spec(), t, {})
    assert (route, decision[0]) == ("dnnl", "measured")


def test_disagreeing_rounds_get_more_rounds_until_they_agree(monkeypatch: pytest.MonkeyPatch) -> None:
    """The NCHW route disturbed in all but two of the first rounds: its third-best round is 3x its
    second-best, so more rounds run; the next ones are quiet, and the timing becomes reliable with the
    quiet times (the note says rounds were added)."""
    first = conv_chain.MAX_ROUNDS
    fake, t = _measure(monkeypatch, lambda r, k: 3.0 if r == "aten" and 2 < k <= first else 1.0)
    assert t.reliable, t
    assert t.route_s["aten"] == pytest.approx(QUIET["aten"])
    assert "more" in t.note
    assert fake.calls["aten"] - 2 > first


def test_a_disturbance_that_leaves_the_order_clear_still_decides(monkeypatch: pytest.MonkeyPatch) -> None:
    """The NCHW route disturbed in every round after its first two (a machine that got busy): its
    second-best round stays the quiet one and its third-best a disturbed one, whatever the number of
    rounds, so the rounds never agree; the extra rounds stop at EXTRA_ROUNDS (or EXTEND_WITHIN_S). But
    dnnl was faster than NCHW in every round (paired rounds): the timing is reliable, each route's time
    its median round, and the layout pass leaves NCHW (the steadiness rule alone kept it NCHW)."""
    fake, t = _measure(monkeypatch, lambda r, k: 3.0 if r == "aten" and k > 2 else 1.0)
    assert t.reliable, t
    assert "rounds disagree for aten" in t.note and "decided by paired rounds: dnnl" in t.note
    assert fake.calls["aten"] - 2 <= conv_chain.MAX_ROUNDS + conv_chain.EXTRA_ROUNDS
    assert t.route_s["aten"] == pytest.approx(3 * QUIET["aten"])  # the median round, a disturbed one
    assert t.route_s["dnnl"] == pytest.approx(QUIET["dnnl"])
    route, decision = _decide(_spec(), t, {})
    assert (route, decision[0]) == ("dnnl", "measured")


def test_a_disturbance_that_leaves_the_order_in_doubt_leaves_the_timing_unreliable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """NCHW disturbed in every round after its first two, and every channels-last route disturbed 10x in
    every other round: no channels-last route was faster than NCHW in DECISIVE_SHARE of the rounds, so
    the disagreeing rounds decide nothing: unreliable, and the layout pass keeps the chain NCHW."""
    fake, t = _measure(
        monkeypatch,
        lambda r, k: (3.0 if k > 2 else 1.0) if r == "aten" else (10.0 if k > 2 and k % 2 else 1.0),
    )
    assert not t.reliable
    assert "rounds disagree for aten" in t.note and "paired" not in t.note
    assert fake.calls["aten"] - 2 <= conv_chain.MAX_ROUNDS + conv_chain.EXTRA_ROUNDS
    route, decision = _decide(_spec(), t, {})
    assert (route, decision[0]) == ("aten", "unmeasured")


def test_decisive_pairs_the_rounds() -> None:
    """`decisive` on per-round times: the route of least median wins when it beat NCHW in 3 of 4 rounds;
    a route it did not beat so, but which beat NCHW so, is tied with it; NCHW wins only by beating every
    route; too few rounds, or no NCHW, decide nothing."""
    t = {"aten": [10.0, 10.0, 10.0, 10.0], "dnnl": [5.0, 5.0, 5.0, 12.0], "onednn": [6.0, 4.0, 6.0, 4.0]}
    # dnnl's median 5.0, onednn's 5.0: the name breaks the tie (deterministic); dnnl beat onednn in 2 of 4
    assert conv_chain.decisive(t) == ("dnnl", ("onednn",))
    t["onednn"] = [6.0, 6.0, 6.0, 6.0]  # dnnl beat it in 3 of 4: not tied
    assert conv_chain.decisive(t) == ("dnnl", ())
    t["dnnl"] = [5.0, 11.0, 5.0, 12.0]  # the fastest by median (onednn now) beats NCHW in every round
    assert conv_chain.decisive(t) == ("onednn", ())
    t["onednn"] = [6.0, 11.0, 6.0, 11.0]  # the fastest beat NCHW in 2 of 4 rounds only
    assert conv_chain.decisive({"aten": t["aten"], "onednn": t["onednn"]}) is None
    assert conv_chain.decisive({"aten": [1.0, 1.0, 3.0, 1.0], "dnnl": [2.0, 2.0, 2.0, 2.0]}) == ("aten", ())
    assert conv_chain.decisive({"aten": [1.0, 3.0, 3.0, 1.0], "dnnl": [2.0, 2.0, 2.0, 2.0]}) is None
    assert conv_chain.decisive({"aten": [9.0, 9.0], "dnnl": [1.0, 1.0]}) is None  # < MIN_ROUNDS
    assert conv_chain.decisive({"onednn": [9.0] * 4, "dnnl": [1.0] * 4}) is None  # no NCHW to beat
