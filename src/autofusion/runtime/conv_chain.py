"""The chain measurement of the layout pass: a chain of convolutions run end to end in each route.

In: a `ChainSpec` (passes/layout_timing.py): the chain's convolutions in plan order with their data
flow. Out: a `ChainTiming`, seconds per run of the whole chain in each of runtime/library.py's ROUTES
(whatever that list holds: a route added there is measured here with nothing else to change).

Each run calls the library's `conv_bn_act` exactly as the routed graph does (its route and
`channels_last` literal, absorbed paddings as `pre_pad`, residuals), on random data of the real
shapes, results fed to the members that read them and dropped after their last reader; a result read
outside the chain in NCHW order is converted as its reader's strided read would cost, and a torch op
reading a result as it is (a pooling: `ChainEdge`) runs on it in the route's layout. So the
conversions at the chain's edges, per-call overheads and the cache state each convolution leaves for
the next are in the time. Rounds alternate the routes (the order rotates each round); each route's
second-best round is its time, and its second- and third-best must agree within REPEAT_TOLERANCE.
The whole measurement takes about BUDGET_S, at most MAX_ROUNDS rounds and at least MIN_ROUNDS (so
a slow chain costs about MIN_ROUNDS + 2 runs in each route). How many rounds fit is judged by each
route's second run, not its first: the first folds and packs the weights and creates oneDNN's
primitives (3-9x a later run on MobileNetV2's chain, seen), and sizing by it left a 10 ms chain
MIN_ROUNDS rounds, where one disturbed round of any route made the whole timing unreliable and the
chain NCHW (the likely reason, not reproduced, for one benchmark run where MobileNetV2's ONNX export,
compiled first in its process, ran 11.7 ms against 4.2 for the same chain from torch). Rounds
that disagree get more rounds, one at a time (at most EXTRA_ROUNDS, while the measurement has taken
less than EXTEND_WITHIN_S): the second- and third-best of more rounds settle on the undisturbed
times where a few rounds were disturbed. Rounds that still disagree can still decide: the rounds
are paired (every route runs once per round, minutes apart at most), so when one route's round was
faster than every other route's in the same round in at least DECISIVE_SHARE of the rounds, the order
is not in doubt (`decisive`): the timing is reliable, each route's time its median round. Repeated 6
times on the loaded 2-core Xeon (ONNX ResNet's 16-conv chain), the steadiness rule alone called 3 of
6 unreliable - the chain then NCHW, 1.4-3x slower than oneDNN in each of those rounds. Only a
disturbance that leaves the order in doubt too leaves the timing unreliable.
The library's call counters
(ROUTE_CALLS, PRE_PAD_CALLS) are left as they were: they count the model's calls, not these.
Importing this module registers the measurement with the layout pass.
"""

from __future__ import annotations

import math
import statistics
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import torch

from autofusion.ir.interpret import fill_template, resolve_target
from autofusion.passes import layout_timing
from autofusion.passes.layout_timing import ChainEdge, ChainSpec, ChainTiming
from autofusion.runtime import library

BUDGET_S = 0.5  # compile time spent timing one chain, all routes (roughly; more for a slow chain)
MIN_ROUNDS = 3  # the second- and third-best of each route must exist
MAX_ROUNDS = 9
MIN_ROUND_S = 1e-3  # a small chain is run several times per round, so one round is not timer noise
MIN_PLAUSIBLE_FLOPS = 1e9  # any CPU convolves faster than this; slower means the timings are disturbed
CALL_OVERHEAD_S = 1e-4  # what one library call may cost beyond its arithmetic, on any CPU
REPEAT_TOLERANCE = 1.3
EXTRA_ROUNDS = 12  # rounds added while the rounds disagree...
EXTEND_WITHIN_S = 2 * BUDGET_S  # ...as long as the measurement has taken less than this
DECISIVE_SHARE = 0.75  # the rounds a route must win against each other route, where rounds disagree
_clock = time.perf_counter  # the tests' fake clock replaces it


def _inputs(spec: ChainSpec, gen: torch.Generator, dt: torch.dtype) -> list[torch.Tensor]:
    out = []
    for shape, channels_last in spec.inputs:
        t = torch.randn(shape, generator=gen).to(dt)
        out.append(t.contiguous(memory_format=torch.channels_last) if channels_last else t)
    return out


def _runner(
    spec: ChainSpec, route: str, ins: list[torch.Tensor], params: list[tuple[torch.Tensor, torch.Tensor]]
) -> Callable[[], None]:
    convs = spec.convs
    last_read: dict[int, int] = {}
    for i, c in enumerate(convs):
        for src in (c.x, c.other):
            if src is not None and src >= 0:
                last_read[src] = i
    drop_after: dict[int, list[int]] = {}
    for j, i in last_read.items():
        drop_after.setdefault(i, []).append(j)
    plain = route == "aten"  # the NCHW baseline; every other route keeps the chain channels-last
    edge_calls: dict[int, list[tuple[Callable[..., Any], ChainEdge]]] = {}
    for e in spec.edges:
        edge_calls.setdefault(e.member, []).append((resolve_target(e.target), e))

    def run() -> None:
        outs: list[torch.Tensor | None] = [None] * len(convs)
        for i, c in enumerate(convs):
            x = outs[c.x] if c.x >= 0 else ins[-1 - c.x]
            other = None if c.other is None else (outs[c.other] if c.other >= 0 else ins[-1 - c.other])
            assert x is not None
            w, b = params[i]
            y = library.conv_bn_act(
                x, w, b, None, None, None, None, other, 0.0, list(c.stride), list(c.padding),
                list(c.dilation), c.groups, c.act, route, not plain and not c.hands_back,
                list(c.pre_pad) or None,
            )  # fmt: skip
            if c.read_outside and not y.is_contiguous():
                y.contiguous()  # what its NCHW reader outside the chain pays
            for fn, e in edge_calls.get(i, ()):
                ys = [y] * 8  # every Arg of an edge's templates stands for this result
                fn(*fill_template(e.args, ys), **{k: fill_template(v, ys) for k, v in e.kwargs})
            outs[i] = y if i in last_read else None
            for j in drop_after.get(i, ()):
                outs[j] = None

    return run


def measure(spec: ChainSpec) -> ChainTiming:
    """Seconds per run of `spec` in each route (module doc)."""
    calls, pads = Counter(library.ROUTE_CALLS), Counter(library.PRE_PAD_CALLS)
    try:
        with torch.no_grad():
            return _measure(spec)
    finally:
        library.ROUTE_CALLS.clear()
        library.ROUTE_CALLS.update(calls)
        library.PRE_PAD_CALLS.clear()
        library.PRE_PAD_CALLS.update(pads)


def _measure(spec: ChainSpec) -> ChainTiming:
    dt = spec.dtype.to_torch()
    gen = torch.Generator().manual_seed(0)
    ins = _inputs(spec, gen, dt)
    params = []
    for c in spec.convs:
        # He-scaled weights keep the activations of a long chain O(1): no overflow, no denormals.
        gain = math.sqrt((2.0 if c.act != "none" else 1.0) / max(1, math.prod(c.w_shape[1:])))
        w = (torch.randn(c.w_shape, generator=gen) * gain).to(dt)
        params.append((w, (torch.randn(c.w_shape[0], generator=gen) * 0.1).to(dt)))
    runs: dict[str, Callable[[], None]] = {}
    notes: list[str] = []
    warm: dict[str, float] = {}
    route_s: dict[str, float] = {}
    n = len(spec.convs)
    start = _clock()
    for route in library.ROUTES:
        run = _runner(spec, route, ins, params)
        before = Counter(library.ROUTE_CALLS)
        try:
            run()  # folds and packs the weights once, as the model's first call does
        except (RuntimeError, ValueError, TypeError) as e:
            notes.append(f"{route} cannot run the chain: {str(e).splitlines()[0]}")
            route_s[route] = math.inf
            continue
        ran = {r: k - before.get(r, 0) for r, k in library.ROUTE_CALLS.items() if k - before.get(r, 0)}
        if ran.get(route, 0) != n:
            others = ", ".join(f"{k} on {r}" for r, k in sorted(ran.items()) if r != route)
            notes.append(f"{route}: {n - ran.get(route, 0)} of {n} convs ran another route ({others})")
        t0 = _clock()
        run()  # what a round costs (module doc)
        warm[route] = _clock() - t0
        runs[route] = run
    if "aten" not in runs:
        return ChainTiming(route_s, reliable=False, note="; ".join(notes) or "the NCHW route did not run")
    reps = {r: max(1, min(32, int(MIN_ROUND_S / max(warm[r], 1e-7)))) for r in runs}
    per_round = sum(reps[r] * warm[r] for r in runs)
    rounds = max(MIN_ROUNDS, min(MAX_ROUNDS, int(BUDGET_S / max(per_round, 1e-9))))
    order = list(runs)
    times: dict[str, list[float]] = {r: [] for r in runs}

    def one_round(i: int) -> None:
        for r in order[i % len(order) :] + order[: i % len(order)]:
            t0 = _clock()
            for _ in range(reps[r]):
                runs[r]()
            times[r].append((_clock() - t0) / reps[r])

    def unsteady() -> list[str]:
        return [r for r, v in times.items() if sorted(v)[2] > REPEAT_TOLERANCE * sorted(v)[1]]

    for i in range(rounds):
        one_round(i)
    extra = 0
    while extra < EXTRA_ROUNDS and unsteady() and _clock() - start < EXTEND_WITHIN_S:
        one_round(rounds + extra)
        extra += 1
    ranked = {r: sorted(v) for r, v in times.items()}
    still = unsteady()
    won = decisive(times) if still else None
    # Steady rounds: each route's second-best (the undisturbed time); decided by paired rounds: the
    # median (a second-best of rounds that disagree is one lucky round).
    route_s.update({r: v[1] if won is None else statistics.median(v) for r, v in ranked.items()})
    # Implausible: slower than MIN_PLAUSIBLE_FLOPS plus CALL_OVERHEAD_S per convolution (a tiny chain's
    # time is mostly per-call overheads).
    plausible = ranked["aten"][0] <= spec.flops() / MIN_PLAUSIBLE_FLOPS + n * CALL_OVERHEAD_S
    if extra:
        notes.append(f"{rounds} rounds disagreed: {extra} more" + (" did not settle them" if still else ""))
    if not plausible:
        notes.append(f"NCHW ran implausibly slowly ({spec.flops() / ranked['aten'][0] / 1e9:.2f} GFLOP/s)")
    if still:
        notes.append(f"rounds disagree for {', '.join(still)} (another process took the cores)")
    if won is not None:
        against = "each other route" if won[0] == "aten" else "NCHW"
        tied = f", tied with {', '.join(won[1])}" if won[1] else ""
        notes.append(f"decided by paired rounds: {won[0]} the fastest in {DECISIVE_SHARE:.0%} of the rounds "
                     f"against {against}{tied} (median times)")  # fmt: skip
    ordered = {r: route_s[r] for r in library.ROUTES if r in route_s}
    reliable = plausible and (not still or won is not None)
    return ChainTiming(ordered, reliable=reliable, note="; ".join(notes), tied=won[1] if won else ())


def decisive(times: dict[str, list[float]]) -> tuple[str, tuple[str, ...]] | None:
    """Where rounds disagree, whether they still decide (the module doc): (the route of least median
    round, the routes it did not beat in DECISIVE_SHARE of the rounds but which did beat NCHW so: tied
    with it), when that route beat NCHW (`aten`) in DECISIVE_SHARE of the rounds, or NCHW beat every
    other route so; None where they do not, or with fewer than MIN_ROUNDS rounds. `times`: each route's
    per-round seconds, in round order (a round runs every route once)."""
    n = min((len(v) for v in times.values()), default=0)
    if n < MIN_ROUNDS or "aten" not in times or len(times) < 2:
        return None
    need = math.ceil(DECISIVE_SHARE * n)

    def beats(a: str, b: str) -> bool:
        return sum(x < y for x, y in zip(times[a][:n], times[b][:n], strict=True)) >= need

    best = min(times, key=lambda r: (statistics.median(times[r][:n]), r))
    if best == "aten":
        return ("aten", ()) if all(beats("aten", r) for r in times if r != "aten") else None
    if not beats(best, "aten"):
        return None
    return best, tuple(
        r for r in times if r not in (best, "aten") and not beats(best, r) and beats(r, "aten")
    )


layout_timing.register_measurement(measure, library.ROUTES)
