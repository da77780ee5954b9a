"""Best time of each of a few alternative calls (library routes of one GEMM), timed interleaved.

In: the calls by name, the clock to read (the wall clock, or one thread's CPU time on a busy machine),
a budget in seconds. Out: each call's best time by that clock (the choosers pick from these, with their
margins: prepack.pick, linear_post_op.verdict).

Each call runs once untimed (unless the caller already ran it), once timed; the per-round cost of those
timed calls sets how many rounds fit in the budget (MIN_ROUNDS..MAX_ROUNDS; calls under a millisecond
in all are repeated CALLS_WHEN_SHORT times per sample). A call whose best time stays OUT_OF_RACE times
the leader's after SETTLE samples leaves the race: it is not timed again, and the rounds end once one
call is left. The choosers' margins (0.95, 0.99) sit far inside that ratio, so a call out of the race
cannot win or set the bar the winner must clear: its next samples would have to beat its first SETTLE
by over 20 % each, where a disturbed sample is slower, never faster. Close calls keep every round.
Why: a clear winner was timed for all rounds at every shape, which at BERT/ALBERT batch 8 sizes (a
24-48 ms GEMM per call on one thread) made the routes' 16 calls per shape most of the compile.
Measured on the 2-core AVX-512 VM under load (2026-12-03, the ten ALBERT shapes of batch 1 and 8, four
interleaved repeats of each way): oneDNN's packed GEMM 1.9-2.3x faster than both other routes at all
ten; timing them took 1.68 s with the race against 3.17 s without, the same route chosen in all 40
decisions, best times within 4 %.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any

MIN_ROUNDS = 3
MAX_ROUNDS = 9
CALLS_WHEN_SHORT = 3  # per sample, where one timed pass over every call took under a millisecond
OUT_OF_RACE = 1.25  # best time over the leader's at which a call leaves the race
SETTLE = 2  # samples a call has before it may leave the race


def best_times(
    fns: dict[str, Callable[[], Any]], clock: Callable[[], float], budget_s: float,
    warmed: Collection[str] = (),
) -> dict[str, float]:  # fmt: skip
    """Each call's best time by `clock` over interleaved rounds (the module doc); `warmed`: calls the
    caller has already run once (not run untimed again)."""
    best = dict.fromkeys(fns, float("inf"))
    samples = dict.fromkeys(fns, 0)

    def sample(name: str, calls: int) -> float:
        t0 = clock()
        for _ in range(calls):
            fns[name]()
        took = clock() - t0
        best[name] = min(best[name], took / calls)
        samples[name] += 1
        return took

    steady = 0.0
    for name, f in fns.items():
        if name not in warmed:
            f()
        steady += sample(name, 1)
    rounds = max(MIN_ROUNDS, min(MAX_ROUNDS, int(budget_s / max(steady, 1e-9))))
    calls = CALLS_WHEN_SHORT if steady < 1e-3 else 1
    order = list(fns)
    for i in range(rounds):
        leader = min(best.values())
        racing = [n for n in order if samples[n] < SETTLE or best[n] < OUT_OF_RACE * leader]
        if len(racing) == 1:
            break
        for name in racing[i % len(racing) :] + racing[: i % len(racing)]:
            sample(name, calls)
    return best
