"""`autofusion tune`: search the plan's switches for one model on this machine, by measurement.

In: a model and its example inputs (as `autofusion.compile` takes them), a time budget. Out: a
`TuneResult` and a `TuningRecord` stored where `compile` finds it (`autofusion.tuning`).

The search is coordinate descent from the default options (the cost model's plan):
1. The knobs (`knobs`): each fusion rule on or off, each graph pass off, SuperKernel on/off/auto,
   freezing, the largest fused kernel, the recomputation threshold. Each is one option and a value.
2. For each knob value in turn, the model is compiled with the incumbent's options plus that value.
   A candidate whose plan is the incumbent's plan (same rewritten graph, same steps, same SuperKernel
   decision) is not timed: the knob does nothing for this model. A candidate whose result differs
   from the reference (eager PyTorch or onnxruntime, `model_tolerance`) or that fails to compile is
   dropped and logged.
3. A timed candidate races the incumbent in alternating rounds (`race`); the win is the median of the
   per-round ratios, and it is taken only when it beats both `MIN_GAIN` and twice the ratios' noise
   (their median absolute deviation over the square root of the rounds), so noise never reads as a gain.
4. Passes repeat while a pass took something and the budget lasts. At the end the default and the
   tuned options race once more, with more rounds: those two figures are the record's and the
   result's `default_ms` / `tuned_ms`.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from autofusion import api, tuning
from autofusion.config import Options
from autofusion.ir.printer import print_graph
from autofusion.passes.manager import PASS_NAMES
from autofusion.passes.rewrite import all_rules
from autofusion.tools.diagnose.compare import baseline, model_tolerance, relative_error

log = logging.getLogger("autofusion.tune")

MIN_GAIN = 0.03  # a smaller win is not worth a record even when it is real
ROUNDS = 9
FINAL_ROUNDS = 21
ROUND_MS = 20.0  # each timed sample is at least this long (several calls of a fast model)
FUSION_SIZES = (16, 32, 128)
RECOMPUTE_FACTORS = (0.25, 4.0)


@dataclass(frozen=True)
class Knob:
    """One option set to one value, relative to the incumbent."""

    option: str
    value: Any
    label: str

    def apply(self, overrides: dict[str, Any]) -> dict[str, Any]:
        return {**overrides, self.option: self.value}


def knobs(base: Options, overrides: dict[str, Any]) -> list[Knob]:
    """Every single change to try from the incumbent `overrides` (over `base`, the defaults)."""
    current = dataclasses.replace(base, **overrides)
    out: list[Knob] = []
    for rule in all_rules(current.rules_files, current.builtin_rules):
        on = rule.name in current.enabled_rules or (rule.enabled and rule.name not in current.disabled)
        if on:
            out.append(Knob("disabled", current.disabled | {rule.name}, f"rule {rule.name} off"))
        else:
            enabled = current.enabled_rules | {rule.name}
            out.append(Knob("enabled_rules", enabled, f"rule {rule.name} on"))
    for name in PASS_NAMES:
        if name not in current.disabled:
            out.append(Knob("disabled", current.disabled | {name}, f"pass {name} off"))
    out += [
        Knob("super_kernel", m, f"super_kernel={m}")
        for m in ("on", "off", "auto")
        if m != current.super_kernel
    ]
    out.append(Knob("freeze", not current.freeze, f"freeze={not current.freeze}"))
    out += [
        Knob("max_fusion_size", n, f"max_fusion_size={n}")
        for n in FUSION_SIZES
        if n != current.max_fusion_size
    ]
    for f in RECOMPUTE_FACTORS:
        n = max(1, int(current.recomputation_threshold * f))
        out.append(Knob("recomputation_threshold", n, f"recomputation_threshold={n}"))
    return out


@dataclass
class Candidate:
    overrides: dict[str, Any]
    model: Any  # the compiled model
    plan_key: str


@dataclass
class TuneResult:
    model: str
    default_ms: float
    tuned_ms: float
    overrides: dict[str, Any]
    decisions: list[tuning.Decision]
    rejected: list[tuple[str, str]] = field(default_factory=list)  # (knob, why)
    candidates: int = 0
    timed: int = 0
    seconds: float = 0.0
    record: str = ""
    noise: float = 0.0

    @property
    def speedup(self) -> float:
        return self.default_ms / self.tuned_ms if self.tuned_ms > 0 else 1.0


def plan_key(compiled: Any) -> str:
    """What makes two compiled models run the same code: the rewritten graph, the steps, SuperKernels."""
    graph = compiled.compiled
    if graph is None or graph.program is None:
        return "eager"
    program = graph.program
    steps = "\n".join(type(s).__name__ + ":" + getattr(s, "name", "") for s in program.plan.steps)
    extra = (program.stats.get("super_kernel"), program.stats.get("prepacked"), program.stats.get("folded"))
    return print_graph(program.plan.graph) + "\n" + steps + "\n" + repr(extra)


def _calls_per_sample(fn: Callable[[], Any]) -> int:
    start = time.perf_counter()
    fn()
    once_ms = max((time.perf_counter() - start) * 1e3, 1e-3)
    return max(1, math.ceil(ROUND_MS / once_ms))


def race(a: Callable[[], Any], b: Callable[[], Any], rounds: int) -> tuple[float, float, float]:
    """(median ms of a, median ms of b, noise): alternating rounds, the order flipped each round; noise
    is the relative median absolute deviation of the per-round ratios over sqrt(rounds)."""
    with torch.no_grad():
        for _ in range(2):
            a()
            b()
        n = max(_calls_per_sample(a), _calls_per_sample(b))
        ta: list[float] = []
        tb: list[float] = []
        for r in range(rounds):
            for fn, out in ((a, ta), (b, tb)) if r % 2 == 0 else ((b, tb), (a, ta)):
                start = time.perf_counter()
                for _ in range(n):
                    fn()
                out.append((time.perf_counter() - start) * 1e3 / n)
    ratios = [x / y for x, y in zip(ta, tb, strict=True)]
    mid = statistics.median(ratios)
    mad = statistics.median(abs(r - mid) for r in ratios) * 1.4826
    return statistics.median(ta), statistics.median(tb), mad / math.sqrt(rounds)


class Tuner:
    """One model's search; see the module docstring."""

    def __init__(self, model: Any, inputs: Sequence[Any], base: dict[str, Any] | None = None,
                 budget_s: float = 60.0, rounds: int = ROUNDS) -> None:  # fmt: skip
        self.model, self.inputs = model, list(inputs)
        self.base_overrides = {**(base or {}), "tuning": "off"}
        self.base = Options.from_env(**self.base_overrides)
        self.budget_s, self.rounds = budget_s, rounds
        self.reference = baseline(model).run
        with torch.no_grad():
            self.expected = self.reference(*self.inputs)
        self.tolerance = model_tolerance(self.inputs)
        self.start = time.perf_counter()

    def left(self) -> float:
        return self.budget_s - (time.perf_counter() - self.start)

    def build(self, overrides: dict[str, Any]) -> Candidate:
        compiled = api.compile(self.model, self.inputs, **self.base_overrides, **overrides)
        if compiled.compiled is None:
            raise RuntimeError(f"ran eagerly: {compiled.stats.get('eager_fallback', 'no compiled graph')}")
        with torch.no_grad():
            got = compiled(*self.inputs)
        err = relative_error(got, self.expected)
        if not err <= self.tolerance:
            raise ValueError(
                f"result differs from the reference: relative error {err:.3g} > {self.tolerance:.3g}"
            )
        return Candidate(overrides, compiled, plan_key(compiled))

    def timer(self, cand: Candidate) -> Callable[[], Any]:
        fn, xs = cand.model, self.inputs
        return lambda: fn(*xs)

    def run(self, progress: Callable[[str, int, int], None] | None = None) -> TuneResult:
        default = self.build({})
        incumbent = default
        result = TuneResult(api.model_name(self.model), 0.0, 0.0, {}, [])
        seen = {default.plan_key}
        improved = True
        while improved and self.left() > 0:
            improved = False
            todo = knobs(self.base, incumbent.overrides)
            for k, knob in enumerate(todo):
                if self.left() <= 0:
                    break
                if progress is not None:
                    progress(knob.label, k, len(todo))
                result.candidates += 1
                try:
                    cand = self.build(knob.apply(incumbent.overrides))
                except Exception as e:  # noqa: BLE001 - a candidate that fails is dropped with its reason
                    why = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
                    log.warning("tune: dropped %s: %s", knob.label, why)
                    result.rejected.append((knob.label, why))
                    continue
                if cand.plan_key in seen:
                    continue  # the same code as a plan already timed: this knob changes nothing here
                seen.add(cand.plan_key)
                result.timed += 1
                inc_ms, cand_ms, noise = race(self.timer(incumbent), self.timer(cand), self.rounds)
                gain = inc_ms / cand_ms
                log.info(
                    "tune: %s: %.3f -> %.3f ms (x%.3f, noise %.3f)", knob.label, inc_ms, cand_ms, gain, noise
                )
                if gain - 1.0 > max(MIN_GAIN, 2.0 * noise):
                    result.decisions.append(tuning.Decision(knob.option, _json(knob.value), round(gain, 4)))
                    incumbent = cand
                    improved = True
        if incumbent is default:  # nothing taken: the default plan is the tuned one, timed once
            final_default, final_tuned, noise = race(self.timer(default), self.timer(default), FINAL_ROUNDS)
            final_tuned = final_default
        else:
            final_default, final_tuned, noise = race(self.timer(default), self.timer(incumbent), FINAL_ROUNDS)
        result.default_ms, result.tuned_ms, result.noise = final_default, final_tuned, noise
        result.overrides = incumbent.overrides
        result.seconds = time.perf_counter() - self.start
        graph = default.model.graph
        self.record = tuning.TuningRecord(
            graph=tuning.graph_hash(graph), machine=tuning.machine_fingerprint(),
            overrides=tuning.overrides_json(incumbent.overrides), default_ms=round(final_default, 4),
            tuned_ms=round(final_tuned, 4), decisions=tuple(result.decisions), model=result.model,
        )  # fmt: skip
        return result


def _json(value: Any) -> Any:
    return sorted(value) if isinstance(value, (set, frozenset)) else value
