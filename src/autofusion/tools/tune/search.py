"""`autofusion tune`: search the plan's switches for one model on this machine, by measurement.

In: a model and its example inputs (as `autofusion.compile` takes them), a time budget. Out: a
`TuneResult` and a `TuningRecord` stored where `compile` finds it (`autofusion.tuning`).

The search is coordinate descent from the default options (the cost model's plan), in passes:
1. The knobs (`knobs`): each fusion rule on or off, each graph pass off, SuperKernel on/off/auto,
   freezing, the largest fused kernel, the recomputation threshold, forced tile parameters (inner
   block, rows per block), the generated kernels' thread count, the linears' library route, GEMMs
   inside or outside SuperKernels, the convolutions' layout (all chains, and each of the first
   chains on its own). Each is one option and a value. Knobs that cannot change the incumbent's plan
   (`PlanFacts`: a rule that matched nothing switched off, tiles without kernels, ...) are not tried.
2. Each knob is evaluated alone against the incumbent (`evaluate`, a pure function of its arguments,
   so it runs here or as a Ray task on another node: `distributed`): the model is compiled with the
   incumbent's options plus the knob. A candidate whose plan is the incumbent's (same rewritten graph,
   steps, SuperKernel decision) is not timed: the knob does nothing for this model. A candidate whose
   result differs from the reference (eager PyTorch or onnxruntime, `model_tolerance`) or that fails
   to compile is dropped and logged. A timed candidate races the incumbent in alternating rounds
   (`race`); its gain is the ratio of medians, taken only when it beats both `MIN_GAIN` and twice the
   noise of the per-round ratios, so noise never reads as a gain.
3. The pass's winners are combined (rules and passes switched together, the best value per option)
   and the combination races the incumbent too; it is taken when it beats the best single winner,
   else that winner is. Passes repeat while one takes something and the budget lasts.
4. At the end the default and the tuned options race once more, with more rounds: those two figures
   are the record's and the result's `default_ms` / `tuned_ms`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import statistics
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from autofusion import api, tuning
from autofusion.config import Options
from autofusion.ir.printer import print_graph
from autofusion.passes.layout import conv_chains
from autofusion.passes.manager import PASS_NAMES
from autofusion.passes.rewrite import all_rules
from autofusion.tools.diagnose.compare import baseline, model_tolerance, relative_error

log = logging.getLogger("autofusion.tune")

MIN_GAIN = 0.03  # a smaller win is not worth a record even when it is real
ROUNDS = 9
FINAL_ROUNDS = 21
ROUND_MS = 20.0  # each timed sample is at least this long (several calls of a fast model)
# ...and at most about this long: when other work slows the calls down 100x after the sample was sized
# (seen on a 2-core machine shared by several builds), the sample ends early, so a race keeps to its
# share of the budget instead of running for minutes.
SAMPLE_CAP_MS = 10 * ROUND_MS
FUSION_SIZES = (16, 32, 128)
RECOMPUTE_FACTORS = (0.25, 4.0)
# Forced tile parameters (kernel/tile.py): a small and a large pointwise / column block (the tiler's
# own pointwise block fills the on-chip budget, so a kernel under ~100k elements runs as one block on
# one thread), and rows per block for reductions (one row at a time, or 16: fewer, larger chunks).
TILE_INNER_BLOCKS = (1024, 16384)
TILE_ROWS = (1, 16)
CONV_LAYOUTS = ("nchw", "channels_last", "blocked", "dnnl")
LINEAR_ROUTES = ("plain", "mkl", "onednn")
MAX_CHAIN_KNOBS = 6  # conv chains that get a layout knob of their own (the first ones, in graph order)


@dataclass(frozen=True)
class Knob:
    """One option set to one value, relative to the incumbent."""

    option: str
    value: Any
    label: str

    def apply(self, overrides: dict[str, Any]) -> dict[str, Any]:
        return {**overrides, self.option: self.value}


def thread_counts() -> tuple[int, ...]:
    """Team sizes to try for generated kernels: one thread, and half of this process's threads (the
    default, all of them, is the incumbent's)."""
    n = torch.get_num_threads()
    return tuple(sorted({1, n // 2} - {0, n}))


@dataclass(frozen=True)
class PlanFacts:
    """What the incumbent's plan holds, so knobs that cannot change it are not compiled at all: a rule
    that matched nothing or a graph pass that changed nothing switched off, tile and thread knobs
    without generated kernels, library routes without GEMMs, layouts without convolutions."""

    chains: tuple[tuple[str, ...], ...] = ()  # chains of convolutions (`layout.conv_chains`)
    kernels: bool = True  # the plan runs generated kernels
    gemms: bool = True  # the plan has matrix products (library or fused)
    rules: frozenset[str] = frozenset()  # rules that rewrote something
    passes: frozenset[str] = frozenset()  # graph passes that changed the graph

    @staticmethod
    def of(compiled: Any) -> PlanFacts:
        program = compiled.compiled.program
        plan = program.plan
        gemm_ops = {"linear", "mm", "addmm", "matmul", "bmm"}
        return PlanFacts(
            chains=tuple(conv_chains(plan.graph)),
            kernels=bool(plan.kernels),
            gemms=any(n.op in gemm_ops for n in plan.graph.nodes) or any(k.gemm for k in plan.kernels),
            rules=frozenset(program.stats.get("rules") or ()),
            passes=frozenset(program.stats.get("passes") or ()),
        )


# Passes whose switch is the solver's: they change no graph, so `PlanFacts.passes` never lists them.
SOLVER_SWITCHES = ("horizontal_kernel", "gemm_epilogue")


def knobs(base: Options, overrides: dict[str, Any], facts: PlanFacts | None = None) -> list[Knob]:
    """Every single change to try from the incumbent `overrides` (over `base`, the defaults); with
    `facts` (the incumbent's plan), only those that can change it. The knobs that reach library calls,
    tiles and threads come first: on real models the time is in GEMMs and convolutions, and the
    budget may end before the last knobs are tried. With more than one chain of convolutions, each of
    the first MAX_CHAIN_KNOBS chains gets layout knobs of its own."""
    current = dataclasses.replace(base, **overrides)
    chains = None if facts is None else facts.chains
    out: list[Knob] = []
    if chains is None or chains:
        out += [Knob("conv_layout", lay, f"conv_layout={lay}") for lay in CONV_LAYOUTS
                if lay != current.conv_layout]  # fmt: skip
    if chains is not None and len(chains) > 1:
        forced = dict(str(e).split("=", 1) for e in current.conv_chain_layouts)
        for chain in chains[:MAX_CHAIN_KNOBS]:
            head = chain[0]
            for lay in CONV_LAYOUTS:
                if forced.get(head) != lay:
                    entries = tuple(sorted(f"{k}={v}" for k, v in {**forced, head: lay}.items()))
                    label = f"chain {head} ({len(chain)} convs) {lay}"
                    out.append(Knob("conv_chain_layouts", entries, label))
    if facts is None or facts.gemms:
        out += [
            Knob("linear_route", r, f"linear_route={r}") for r in LINEAR_ROUTES if r != current.linear_route
        ]
        if current.super_kernel != "off":
            flip = not current.super_kernel_gemm
            out.append(Knob("super_kernel_gemm", flip, f"super_kernel_gemm={flip}"))
    if facts is None or facts.kernels:
        out += [Knob("kernel_threads", n, f"kernel_threads={n}") for n in thread_counts()
                if n != current.kernel_threads]  # fmt: skip
        out += [Knob("tile_inner_block", n, f"tile_inner_block={n}") for n in TILE_INNER_BLOCKS
                if n != current.tile_inner_block]  # fmt: skip
        out += [Knob("tile_rows_per_block", n, f"tile_rows_per_block={n}") for n in TILE_ROWS
                if n != current.tile_rows_per_block]  # fmt: skip
    for rule in all_rules(current.rules_files, current.builtin_rules):
        on = rule.name in current.enabled_rules or (rule.enabled and rule.name not in current.disabled)
        if on and (facts is None or rule.name in facts.rules):
            out.append(Knob("disabled", current.disabled | {rule.name}, f"rule {rule.name} off"))
        elif not on:
            enabled = current.enabled_rules | {rule.name}
            out.append(Knob("enabled_rules", enabled, f"rule {rule.name} on"))
    for name in PASS_NAMES:
        idle = facts is not None and name not in SOLVER_SWITCHES and name not in facts.passes
        if name not in current.disabled and not idle:
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


@dataclass(frozen=True)
class Evaluation:
    """One knob measured against the incumbent (what `evaluate` returns, also across processes)."""

    label: str
    option: str  # what the knob changed, and to what
    value: Any
    overrides: dict[str, Any]  # the candidate's overrides (the incumbent's plus the knob)
    status: str  # "timed", "same plan" or "dropped"
    why: str = ""
    incumbent_ms: float = 0.0
    candidate_ms: float = 0.0
    noise: float = 0.0

    @property
    def gain(self) -> float:
        return (
            self.incumbent_ms / self.candidate_ms if self.status == "timed" and self.candidate_ms > 0 else 1.0
        )

    @property
    def wins(self) -> bool:
        return self.status == "timed" and self.gain - 1.0 > max(MIN_GAIN, 2.0 * self.noise)


@dataclass(frozen=True)
class Job:
    """What a worker needs to evaluate one knob: everything else comes from its `Problem`."""

    label: str
    option: str
    value: Any
    incumbent: dict[str, Any]
    candidate: dict[str, Any]


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
    """What makes two compiled models run the same code: the rewritten graph, the steps, SuperKernels,
    prepacked routes, the generated source (thread counts and column blocks are in it) and the kernels'
    parameter arrays (rows per block and inner blocks are there, not in the source)."""
    graph = compiled.compiled
    if graph is None or graph.program is None:
        return "eager"
    program = graph.program
    steps = "\n".join(type(s).__name__ + ":" + getattr(s, "name", "") for s in program.plan.steps)
    extra = (program.stats.get("super_kernel"), program.stats.get("prepacked"), program.stats.get("folded"))
    code = hashlib.sha256(program.source.encode()).hexdigest()
    params = json.dumps(program.params, sort_keys=True)
    return print_graph(program.plan.graph) + "\n" + steps + "\n" + repr(extra) + "\n" + code + params


def _once_ms(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return max((time.perf_counter() - start) * 1e3, 1e-3)


def race(a: Callable[[], Any], b: Callable[[], Any], rounds: int) -> tuple[float, float, float]:
    """(median ms of a, median ms of b, noise): alternating rounds, the order flipped each round; noise
    is the relative median absolute deviation of the per-round ratios over sqrt(rounds)."""
    with torch.no_grad():
        for _ in range(2):
            a()
            b()
        # Calls per sample: enough for the slower of the two to take ROUND_MS.
        n = max(1, math.ceil(ROUND_MS / max(_once_ms(a), _once_ms(b))))
        ta: list[float] = []
        tb: list[float] = []
        for r in range(rounds):
            for fn, out in ((a, ta), (b, tb)) if r % 2 == 0 else ((b, tb), (a, ta)):
                start = time.perf_counter()
                calls, cap = 0, start + SAMPLE_CAP_MS * 1e-3
                while calls < n:
                    fn()
                    calls += 1
                    if time.perf_counter() > cap:
                        break  # a loaded machine: the calls got far slower than sized for
                out.append((time.perf_counter() - start) * 1e3 / calls)
    ratios = [x / y for x, y in zip(ta, tb, strict=True)]
    mid = statistics.median(ratios)
    mad = statistics.median(abs(r - mid) for r in ratios) * 1.4826
    return statistics.median(ta), statistics.median(tb), mad / math.sqrt(rounds)


class Problem:
    """A model, its inputs and the reference answer: what every evaluation of one tuning run shares.
    Compiled candidates are kept per overrides, so the incumbent is built once per process."""

    def __init__(self, model: Any, inputs: Sequence[Any], base: dict[str, Any] | None, rounds: int,
                 rtol: float | None = None) -> None:  # fmt: skip
        self.model, self.inputs, self.rounds = model, list(inputs), rounds
        self.base_overrides = {**(base or {}), "tuning": "off"}
        self.base = Options.from_env(**self.base_overrides)
        with torch.no_grad():
            self.expected = baseline(model).run(*self.inputs)
        self.tolerance = rtol if rtol is not None else model_tolerance(self.inputs)
        self._built: dict[str, tuple[Any, str]] = {}

    def build(self, overrides: dict[str, Any]) -> tuple[Any, str]:
        """(the compiled model, its plan key); raises when it cannot compile or answers wrongly."""
        key = json.dumps(tuning.overrides_json(overrides), sort_keys=True)
        if key in self._built:
            return self._built[key]
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
        self._built[key] = (compiled, plan_key(compiled))
        return self._built[key]

    def timer(self, compiled: Any) -> Callable[[], Any]:
        xs = self.inputs
        return lambda: compiled(*xs)


def evaluate(problem: Problem, job: Job) -> Evaluation:
    """The knob of `job` against its incumbent; see the module docstring, step 2."""
    try:
        incumbent, inc_key = problem.build(job.incumbent)
        cand, cand_key = problem.build(job.candidate)
    except Exception as e:  # noqa: BLE001 - a candidate that fails is dropped with its reason
        why = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        log.warning("tune: dropped %s: %s", job.label, why)
        return Evaluation(job.label, job.option, job.value, job.candidate, "dropped", why)
    if cand_key == inc_key:
        return Evaluation(job.label, job.option, job.value, job.candidate, "same plan")
    inc_ms, cand_ms, noise = race(problem.timer(incumbent), problem.timer(cand), problem.rounds)
    log.info("tune: %s: %.3f -> %.3f ms (noise %.3f)", job.label, inc_ms, cand_ms, noise)
    return Evaluation(job.label, job.option, job.value, job.candidate, "timed", "", inc_ms, cand_ms, noise)


Mapper = Callable[[list[Job]], Iterable[Evaluation]]


def combine(incumbent: dict[str, Any], winners: Sequence[Evaluation]) -> dict[str, Any]:
    """The incumbent with every winner's change: set options take the union of the winners' sets, other
    options the value of the best winner that set them (`winners` is best first)."""
    out = dict(incumbent)
    for ev in reversed(winners):  # best last, so its scalar values stay
        for name, value in ev.overrides.items():
            if isinstance(value, frozenset) and isinstance(out.get(name), frozenset):
                out[name] = out[name] | value
            elif name == "conv_chain_layouts" and name in out:  # per chain: each winner's chains
                merged = dict(str(e).split("=", 1) for e in out[name])
                merged.update(dict(str(e).split("=", 1) for e in value))
                out[name] = tuple(sorted(f"{k}={v}" for k, v in merged.items()))
            else:
                out[name] = value
    return out


class DefaultPlanWrong(ValueError):
    """The default plan's result is outside the tolerance: there is no correct incumbent."""


class Tuner:
    """One model's search; see the module docstring. `mapper` evaluates a pass's jobs: here, one after
    the other (the default), or as Ray tasks (`distributed.ray_mapper`)."""

    def __init__(self, model: Any, inputs: Sequence[Any], base: dict[str, Any] | None = None,
                 budget_s: float = 60.0, rounds: int = ROUNDS,
                 rtol: float | None = None) -> None:  # fmt: skip
        self.problem = Problem(model, inputs, base, rounds, rtol)
        self.budget_s = budget_s
        self.start = time.perf_counter()
        self.record: tuning.TuningRecord | None = None

    def left(self) -> float:
        return self.budget_s - (time.perf_counter() - self.start)

    def local_mapper(self, progress: Callable[[str, int, int], None] | None) -> Mapper:
        def run(jobs: list[Job]) -> Iterator[Evaluation]:
            for k, job in enumerate(jobs):
                if self.left() <= 0:
                    return
                if progress is not None:
                    progress(job.label, k, len(jobs))
                yield evaluate(self.problem, job)

        return run

    def run(
        self, progress: Callable[[str, int, int], None] | None = None, mapper: Mapper | None = None
    ) -> TuneResult:
        mapper = mapper or self.local_mapper(progress)
        problem = self.problem
        try:  # the default must compile and be right, or there is nothing to tune
            problem.build({})
        except ValueError as e:
            raise DefaultPlanWrong(
                f"the default plan is not within tolerance, so nothing can be tuned against it ({e}); "
                "judge at a looser tolerance with --rtol if this is rounding"
            ) from None
        result = TuneResult(api.model_name(problem.model), 0.0, 0.0, {}, [])
        incumbent: dict[str, Any] = {}
        while self.left() > 0:
            facts = PlanFacts.of(problem.build(incumbent)[0])
            jobs = [Job(k.label, k.option, k.value, incumbent, k.apply(incumbent))
                    for k in knobs(problem.base, incumbent, facts)]  # fmt: skip
            evaluations = list(mapper(jobs))
            result.candidates += len(evaluations)
            result.timed += sum(ev.status == "timed" for ev in evaluations)
            result.rejected += [(ev.label, ev.why) for ev in evaluations if ev.status == "dropped"]
            winners = sorted((ev for ev in evaluations if ev.wins), key=lambda ev: -ev.gain)
            if not winners:
                break
            taken = [winners[0]]
            if len(winners) > 1 and self.left() > 0:
                merged = combine(incumbent, winners)
                both = next(iter(mapper([Job("combined winners", "", None, incumbent, merged)])), None)
                if both is not None and both.wins and both.gain > winners[0].gain:
                    taken = winners
            incumbent = combine(incumbent, taken)
            result.decisions += [
                tuning.Decision(ev.option, _json(ev.value), round(ev.gain, 4)) for ev in taken
            ]
        default, _ = problem.build({})
        tuned, _ = problem.build(incumbent)
        if not incumbent:  # nothing taken: the default plan is the tuned one, timed once
            default_ms, _, noise = race(problem.timer(default), problem.timer(default), FINAL_ROUNDS)
            tuned_ms = default_ms
        else:
            default_ms, tuned_ms, noise = race(problem.timer(default), problem.timer(tuned), FINAL_ROUNDS)
            if tuned_ms >= default_ms:
                # The final race is the verdict: wins found knob by knob that do not hold against the
                # default in it were noise, and a record must never make a model slower.
                lost = f"lost the final race ({tuned_ms:.4g} ms against the default's {default_ms:.4g})"
                result.rejected.append(("tuned plan", lost + ": the default is kept"))
                incumbent, result.decisions, tuned_ms = {}, [], default_ms
        result.default_ms, result.tuned_ms, result.noise = default_ms, tuned_ms, noise
        result.overrides = incumbent
        result.seconds = time.perf_counter() - self.start
        self.record = tuning.TuningRecord(
            graph=tuning.graph_hash(default.graph), machine=tuning.machine_fingerprint(),
            overrides=tuning.overrides_json(incumbent), default_ms=round(default_ms, 4),
            tuned_ms=round(tuned_ms, 4), decisions=tuple(result.decisions), model=result.model,
        )  # fmt: skip
        return result


def _json(value: Any) -> Any:
    return sorted(value) if isinstance(value, (set, frozenset)) else value
