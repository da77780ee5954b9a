"""Fusion bisection: find the first merge that breaks the tolerance (or makes the model slower).

In: a model, example inputs, compile options and a criterion. Out: a `BisectResult` naming the
culprit merge with its numbers (the decision event: sides, rule, bytes and µs saved, budget), the
error or time just before and with it, and a disable list that was checked to repair the model.

Axis: the solver's accepted merges in solver order. The solver is deterministic and
`Options.max_merges = k` accepts exactly the first k merges of the unlimited run (later candidates
are refused with NF2101), so "the model with the first k merges" is well defined for 0 <= k <= N.
The search assumes k = 0 is good and k = N is bad (both are measured first; if k = 0 is already bad
the fault is not a fusion and the result says so) and finds the smallest bad k in about log2(N)
compiles. The capture runs once; each trial compiles the captured graph again (the disk cache makes
repeated prefixes cheap).

Criteria: `rtol` - the model's output against eager (max |out - ref| / max |ref|) exceeds rtol;
`slower` - the best time of `repeat` runs with k merges exceeds the one with none by more than
`margin`.

Repair: the culprit's nodes (the smaller side first) are tried one at a time as a disable list
(Options.disable_fusion, NF2100) with every other merge on; the first that passes is returned as
verified. When rule and pass names land, they become a second axis (a name list per prefix).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from autofusion.config import Options
from autofusion.dfx.events import Event

Progress = Callable[[str], None]


@dataclass
class Trial:
    merges: int
    value: float  # relative error, or median ms
    bad: bool


@dataclass
class BisectResult:
    mode: str
    threshold: float
    total_merges: int
    trials: list[Trial] = field(default_factory=list)
    culprit: Event | None = None  # the accepted merge's decision event
    index: int | None = None  # 1-based position of the culprit among the accepted merges
    before: float | None = None  # value with index - 1 merges
    after: float | None = None  # value with index merges
    kernel: str | None = None  # the kernel the culprit merge produced (in the prefix run)
    disable: list[str] = field(default_factory=list)
    disable_verified: bool = False
    disable_value: float | None = None
    message: str = ""


def first_bad(n: int, is_bad: Callable[[int], bool]) -> int:
    """Smallest k in 1..n with is_bad(k), given is_bad(0) is False and is_bad(n) is True."""
    lo, hi = 0, n  # invariant: lo good, hi bad
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if is_bad(mid):
            hi = mid
        else:
            lo = mid
    return hi


class _Session:
    """One capture, many compiles: the model with the first k merges, optionally a disable list."""

    def __init__(
        self,
        model: Any,
        inputs: Sequence[torch.Tensor],
        options: dict[str, Any],
        mode: str,
        threshold: float,
        repeat: int,
        progress: Progress | None,
    ) -> None:
        from autofusion.api import _model_name
        from autofusion.frontend.capture import capture

        self.model, self.inputs, self.options = model, list(inputs), dict(options)
        self.mode, self.threshold, self.repeat = mode, threshold, repeat
        self.progress = progress or (lambda msg: None)
        base = Options.from_env(**self.options)
        with torch.no_grad():
            self.captured = capture(model, self.inputs, base.capture, _model_name(model))
            model(*self.inputs)  # eager's first call can differ from later ones (conftest.eager_reference)
            self.reference = model(*self.inputs)
        self._baseline_ms: float | None = None

    def compiled(self, merges: int, disable: Sequence[str] = ()) -> Any:
        from autofusion.api import CompiledGraph

        opts = dict(self.options)
        opts["max_merges"] = merges
        opts["disable_fusion"] = tuple(opts.get("disable_fusion", ())) + tuple(disable)
        return CompiledGraph(self.captured, Options.from_env(**opts))

    def value(self, merges: int, disable: Sequence[str] = ()) -> float:
        from autofusion.cli import relative_error

        cg = self.compiled(merges, disable)
        with torch.no_grad():
            if self.mode == "rtol":
                return relative_error(cg.run(self.inputs), self.reference)
            return self._best_ms(cg)

    def _best_ms(self, cg: Any) -> float:
        """The fastest of `repeat` runs after 3 warm-ups: on a shared machine one lost scheduler slice
        (15-25 ms) would outweigh a model of microseconds, and a median of few runs does not hide it."""
        for _ in range(3):
            cg.run(self.inputs)
        times = []
        for _ in range(self.repeat):
            start = time.perf_counter()
            cg.run(self.inputs)
            times.append((time.perf_counter() - start) * 1e3)
        return min(times)

    def is_bad(self, value: float) -> bool:
        if self.mode == "rtol":
            return not value <= self.threshold  # NaN counts as bad
        assert self._baseline_ms is not None
        return value > self._baseline_ms * (1 + self.threshold)

    def trial(self, result: BisectResult, merges: int) -> Trial:
        v = self.value(merges)
        if self.mode == "slower" and merges == 0:
            self._baseline_ms = v
        t = Trial(merges, v, self.is_bad(v))
        result.trials.append(t)
        unit = "ms" if self.mode == "slower" else "rel. error"
        self.progress(f"{merges:4d} merges: {unit} {v:.3g} -> {'bad' if t.bad else 'good'}")
        return t


def accepted_merges(events: list[Event]) -> list[Event]:
    return [e for e in events if e["event"] == "fusion.candidate" and e["accepted"]]


def bisect_fusion(
    model: Any,
    inputs: Sequence[torch.Tensor],
    *,
    mode: str = "rtol",
    threshold: float = 1e-5,
    options: dict[str, Any] | None = None,
    repeat: int = 20,
    repair: bool = True,
    progress: Progress | None = None,
) -> BisectResult:
    if mode not in ("rtol", "slower"):
        raise ValueError(f"mode must be 'rtol' or 'slower', got {mode!r}")
    s = _Session(model, inputs, options or {}, mode, threshold, repeat, progress)
    full = s.compiled(-1)
    merges = accepted_merges(full.program.events if full.program is not None else [])
    result = BisectResult(mode, threshold, len(merges))
    base = s.trial(result, 0)
    if base.bad:
        result.message = (
            "the model is already over tolerance with no merge at all: the fault is not a fusion "
            "(run `autofusion check` on it, or compare with fusion=False)"
        )
        return result
    if not merges:
        result.message = "the solver accepts no merge for this model: nothing to bisect"
        return result
    if not s.trial(result, len(merges)).bad:
        what = "within tolerance" if mode == "rtol" else "not slower than with no merge"
        result.message = f"with all {len(merges)} merges the model is {what}: nothing to find"
        return result
    values = {t.merges: t.value for t in result.trials}

    def probe(k: int) -> bool:
        t = s.trial(result, k)
        values[k] = t.value
        return t.bad

    k = first_bad(len(merges), probe)
    if k - 1 not in values:
        values[k - 1] = s.trial(result, k - 1).value
    result.index, result.culprit = k, merges[k - 1]
    result.before, result.after = values[k - 1], values[k]
    result.kernel = _kernel_of(s.compiled(k), result.culprit)
    result.message = f"merge {k} of {len(merges)} is the first bad one"
    if repair:
        _repair(s, result)
    return result


def _kernel_of(cg: Any, merge: Event) -> str | None:
    if cg.program is None:
        return None
    want = {merge["first_nodes"][0], merge["second_nodes"][0]}
    for step in cg.program.plan.kernels:
        if want <= {n.name for n in step.kernel.nodes}:
            return str(step.name)
    return None


def _repair(s: _Session, result: BisectResult, max_tries: int = 6) -> None:
    """The first single node of the culprit (smaller side first) whose disabling fixes the model. When
    none does (another merge is also at fault), the one that helps most, unverified: `bisect_all`
    then searches again with it disabled."""
    assert result.culprit is not None
    sides = sorted((result.culprit["first_nodes"], result.culprit["second_nodes"]), key=len)
    names = list(dict.fromkeys(n for side in sides for n in side))
    candidates: list[list[str]] = [[n] for n in names[:max_tries]]
    if len(sides[0]) > 1:
        candidates.append(list(sides[0]))
    best: tuple[float, list[str]] | None = None
    for cand in candidates:
        v = s.value(-1, cand)
        s.progress(f"disable {', '.join(cand)}: {v:.3g} -> {'bad' if s.is_bad(v) else 'good'}")
        if not s.is_bad(v):
            result.disable, result.disable_verified, result.disable_value = cand, True, v
            return
        if best is None or v < best[0]:
            best = (v, cand)
    if best is not None:
        result.disable_value, result.disable = best


def bisect_all(model: Any, inputs: Sequence[torch.Tensor], *, max_culprits: int = 8,
               options: dict[str, Any] | None = None, **kw: Any) -> list[BisectResult]:  # fmt: skip
    """Bisect, disable the culprit, bisect again, until the model passes (or `max_culprits`): for
    models with more than one bad merge. Each result's `disable` adds to the list the next one uses."""
    options = dict(options or {})
    results: list[BisectResult] = []
    for _ in range(max_culprits):
        r = bisect_fusion(model, inputs, options=options, **kw)
        results.append(r)
        if r.culprit is None or r.disable_verified or not r.disable:
            break
        options["disable_fusion"] = tuple(options.get("disable_fusion", ())) + tuple(r.disable)
    return results
