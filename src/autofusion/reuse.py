"""Compile once, instantiate per size: one plan of a graph with symbolic sizes, reused for other sizes.

In: a graph whose sizes are `ir.symbolic.SymInt`s (each holds the example size, the hint, and says how
it follows from named symbols: `batch`, `seq`), and later the symbols' sizes of a call. Out: the
`Program` for those sizes, made from the first plan's decisions instead of planning again.

The plan (`PlanTemplate`) is made once, by the ordinary compiler (`compiler.compile_graph`: there is
no second planner), on the symbolic graph with a guard recorder active. Every decision that read a
size through a SymInt is then on record: comparisons of sizes (a dim of 1, a size above the
parallel threshold, a tile choice) as guards on the symbols, and the cost model's verdicts on floats
computed from sizes (merge and GEMM-epilogue benefits against their threshold) as calls to take again
(`ir.symbolic.verdict`). The linears' library routes, measured for a shape, are recorded by the
expression of their row count and replayed: a route measured for the hint holds for every size of
the family (as an autotuner's choice at the hint does), so no size measures again.

A call with other sizes (`instantiate`):
1. every recorded guard and verdict must come out as for the hints; a failing one (a size that flips
   a decision) is a `NotReusable`: the caller plans those sizes for themselves, correct as before;
2. the plan, its SuperKernel plan and its parameter fold are evaluated for the sizes (every SymInt
   replaced: `ir.symbolic.substitute`), and the evaluated graph is verified (types inferred again:
   a size fixed to the hint somewhere a SymInt did not reach shows as a disagreement);
3. what is cheap to derive is derived again by the compiler's own functions, not carried over: the
   plan's stats (`plan_stats`), the SuperKernel verdict (it must agree), the rendered source with
   every kernel's size and stride parameters and the entries' (`render_program`); a source equal to
   the first plan's reuses its loaded library, another one (a new loop structure) is built (the disk
   cache is keyed by the source);
4. the executors are made for the sizes (`compiler.assemble`), with the recorded routes.

Trust: the first instantiation for sizes other than the hints is run once on random inputs and its
results compared with the reference interpreter's for the graph of those sizes (`check_results`): a
size fixed to the hint that no check above could see indexes the wrong extent, which shows as wrong
values. That check is no plan: it costs a run, not a planner run and a build, so a family's second
size is an instantiation like every later one. Where the results disagree, a fresh compile of those
sizes decides (its graph, source, parameters, entries and arena, or bit-identical results): the
same program keeps reuse on (the reference's tolerance was too tight for the graph), a different one
turns reuse off for the family, logged at INFO, and the fresh compile is used. What a results check
cannot see and the fresh compile could is a planner decision that read a size as a plain int and
took no guard while computing the same values (another tiling, another fusion): a program that is
right but planned for the hints, which is what reuse is for. What is not proved either way: such a
decision is checked at that one other size only.

Plans are kept per symbolic graph by a key the caller gives (a structural fingerprint, `fingerprint`):
two captures of one computation (the graphs Dynamo hands over for one model as its sizes change)
share one plan and its trust.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from autofusion import compiler, tuning
from autofusion.config import Options
from autofusion.ir.graph import Graph
from autofusion.ir.interpret import random_inputs, run_graph
from autofusion.ir.symbolic import Guards, SymInt, evaluate_expr, expr_of, guard_text, substitute, unrecorded
from autofusion.ir.verify import verify
from autofusion.kernel.tile import TileKnobs
from autofusion.plan.schedule import KernelStep, Plan, retile
from autofusion.runtime.frozen import FoldedExecutor
from autofusion.runtime.prepack import Chooser
from autofusion.runtime.program import Program, cache_for
from autofusion.runtime.super_executor import SuperExecutor

log = logging.getLogger("autofusion.reuse")

RouteKey = tuple[Any, int, int, torch.dtype]  # (rows as an expression, k, n, dtype)
# Stats the program derives from its plan (`compiler.finish`): made again for each size.
_DERIVED = ("build_error", "super_kernel", "prepacked", "compile_s", "cache_hit")


class NotReusable(Exception):
    """The plan does not hold for these sizes (the reason is the message): plan them for themselves."""


@dataclass
class PlanTemplate:
    """One plan of a symbolic graph, what it was decided on, and how often it was reused."""

    graph: Graph  # with SymInt sizes
    hints: dict[str, int]
    options: Options  # as the compile took them (a tuning record applied)
    program: Program  # the plan for the hints, as `compile_graph` made it
    guards: Guards
    routes: dict[RouteKey, str]  # each linear's route, by its row count's expression
    plan_s: float  # how long planning the hints took
    trusted: bool = False  # an instantiation matched a fresh compile of its sizes
    static: dict[int, Any] = field(default_factory=dict)  # what the plan holds that no size reaches

    @classmethod
    def make(cls, graph: Graph, hints: Mapping[str, int], options: Options) -> PlanTemplate:
        guards = Guards()
        routes: dict[RouteKey, str] = {}
        t0 = time.perf_counter()
        token = compiler.route_wrapper.set(lambda chooser: _recording(chooser, routes))
        try:
            with guards.recording():
                program = compiler.compile_graph(graph, options)
        finally:
            compiler.route_wrapper.reset(token)
        plan_s = time.perf_counter() - t0
        return cls(graph, dict(hints), _effective(graph, options), program, guards, routes, plan_s)

    def check(self, env: Mapping[str, int], memo: dict[int, tuple[Any, Any]] | None = None) -> None:
        """NotReusable unless every recorded guard and verdict holds for `env`."""
        failing = self.guards.failing(env)
        if failing is not None:
            raise NotReusable(f"the guard {guard_text(failing)} (for {self.hints}) fails")
        why = self.guards.failing_verdict(env, memo)
        if why is not None:
            raise NotReusable(f"a cost verdict changes: {why}")

    def at_hints(self) -> Program:
        """The program for the hints, its sizes plain ints (the plan itself holds SymInts, which tools
        reading the plan, an exporter, take for symbolic sizes)."""
        with unrecorded():
            return self._instantiate(self.hints)

    def instantiate(self, env: Mapping[str, int]) -> Program:
        """The program for the sizes `env` from this plan's decisions (NotReusable: plan them anew)."""
        # One substitution memo for the verdicts and the plan: the kernels the solver's last verdicts
        # weighed are the plan's, substituted once.
        memo: dict[int, tuple[Any, Any]] = {}
        self.check(env, memo)
        with unrecorded():
            return self._instantiate(env, memo)

    def _instantiate(self, env: Mapping[str, int], memo: dict[int, tuple[Any, Any]] | None = None) -> Program:
        p = self.program
        memo = {} if memo is None else memo
        plan: Plan = substitute(p.plan, env, memo, static=self.static)
        split = p.executor.split if isinstance(p.executor, FoldedExecutor) else None
        split = substitute(split, env, memo, static=self.static)
        try:
            verify(plan.graph)
            if split is not None:
                verify(split.fold)
        except Exception as e:  # noqa: BLE001 - any disagreement: these sizes are planned for themselves
            raise NotReusable(f"a size was fixed to the hint in the plan ({type(e).__name__}: {e})") from None
        _check_kernels(plan)
        _check_constants(plan.graph)
        if split is not None:
            _check_constants(split.fold)
        options = self.options
        plan = retile(plan, TileKnobs(options.tile_rows_per_block, options.tile_inner_block))
        # What the plan's stats and the program's derive is derived again (`compiler.finish`).
        stats = {k: v for k, v in p.stats.items() if k not in _DERIVED}
        stats.update(plan.stats)
        stats["plan_reused"] = True
        route = _replaying(compiler._route_chooser(options), self.routes, env) if options.freeze else None

        def library(source: str) -> Any:
            return p.library if source == p.source else None  # one loop structure: the same library

        return compiler.finish(self.graph.name, plan, split, stats, route, options, None, p.records, library)

    def fresh(self, graph: Graph, env: Mapping[str, int]) -> Program:
        """A compile of `graph` (these sizes, static) taking the routes this plan recorded: what the
        trust check compares an instantiation with (a route measured anew could differ by noise)."""
        token = compiler.route_wrapper.set(lambda chooser: _replaying(chooser, self.routes, env))
        try:
            return compiler.compile_graph(graph, self.options)
        finally:
            compiler.route_wrapper.reset(token)


def _effective(graph: Graph, options: Options) -> Options:
    """`options` as `compile_graph` applies them to `graph` (with its tuning record, if one is kept)."""
    record = tuning.lookup(graph, options, cache_for(options) if options.cache_dir else None)
    return options if record is None else tuning.apply(record, options)


def _check_kernels(plan: Plan) -> None:
    """Every kernel buffer's type is its value's in the graph (a kernel lowered with a size fixed to the
    hint would index the wrong extent)."""
    types = plan.graph.value_types()
    for step in plan.steps:
        if not isinstance(step, KernelStep):
            continue
        for buf in step.kernel.buffers:
            t = types.get(buf.vid)
            if t is not None and t.shape != buf.type.shape:
                raise NotReusable(f"kernel {step.name} reads %{buf.vid} as {list(buf.type.shape)}, "
                                  f"the graph's type is {list(t.shape)}")  # fmt: skip


def _check_constants(graph: Graph) -> None:
    """Every constant holds values of its type's (substituted) shape: one folded for the hints would
    hand a kernel the hint's extent."""
    for node in graph.nodes:
        if node.op == "const":
            tensor = graph.constants[node.attr("name")]
            if tuple(tensor.shape) != tuple(node.outputs[0].type.shape):
                raise NotReusable(f"constant {node.attr('name')!r} holds values of the hint's sizes")


def _recording(chooser: Chooser, routes: dict[RouteKey, str]) -> Chooser:
    def choose(m: int, k: int, n: int, dtype: torch.dtype) -> str:
        route = chooser(m, k, n, dtype)
        routes[(expr_of(m), int(k), int(n), dtype)] = route
        return route

    return choose


def _replaying(chooser: Chooser, routes: Mapping[RouteKey, str], env: Mapping[str, int]) -> Chooser:
    """The routes recorded for the hints, for the sizes `env`; a linear not recorded asks `chooser`."""
    table: dict[tuple[int, int, int, torch.dtype], str] = {}
    for (m, k, n, dtype), route in routes.items():
        table.setdefault((evaluate_expr(m, env), k, n, dtype), route)

    def choose(m: int, k: int, n: int, dtype: torch.dtype) -> str:
        route = table.get((int(m), int(k), int(n), dtype))
        return route if route is not None else chooser(m, k, n, dtype)

    return choose


def same_program(a: Program, b: Program) -> str | None:
    """Where two programs differ in what they run (None: the same graph, source, parameters, entries
    and arena; results are then bit-identical)."""
    if str(a.plan.graph) != str(b.plan.graph):
        return "the plan graphs differ"
    if [s.name for s in a.plan.steps] != [s.name for s in b.plan.steps]:
        return "the plan steps differ"
    if a.source != b.source:
        return "the generated sources differ"
    if a.params != b.params:
        return "the kernels' size parameters differ"
    ea, eb = _inner(a), _inner(b)
    if type(ea) is not type(eb):
        return f"the executors differ ({type(ea).__name__}, {type(eb).__name__})"
    if isinstance(ea, SuperExecutor) and isinstance(eb, SuperExecutor):
        if [(e.name, e.slots, e.params) for e in ea.entries] != [
            (e.name, e.slots, e.params) for e in eb.entries
        ]:
            return "the SuperKernel entries differ"
        if ea.splan.arena.size != eb.splan.arena.size or ea.splan.arena_values != eb.splan.arena_values:
            return "the SuperKernel arenas differ"
    if a.stats.get("prepacked") != b.stats.get("prepacked"):
        return "the linears' routes differ"
    return None


def different_results(a: Program, b: Program, graph: Graph) -> str | None:
    """Where two programs of `graph` give results that are not bit-identical on one set of random
    inputs (None: identical)."""
    xs = random_inputs(graph)
    try:
        with torch.no_grad():
            ra, rb = a.executor.run(xs), b.executor.run(xs)
    except Exception as e:  # noqa: BLE001 - programs that cannot run here are not shown equal
        return f"running them failed: {e}"
    for k, (x, y) in enumerate(zip(ra, rb, strict=True)):
        nan_same = not x.is_floating_point() or torch.equal(x.isnan(), y.isnan())
        if (
            x.shape != y.shape
            or x.dtype != y.dtype
            or not nan_same
            or not torch.equal(x.nan_to_num(), y.nan_to_num())
        ):
            return f"output {k} differs"
    return None


# The scaled error (max |out - ref| / max |ref|) the results check allows per dtype: well above the
# rounding of the generated math (its polynomial exp, erf and tanh; a reduction in another order) and
# far below what an element read at the hint's extent gives (an error of the values' own size).
_CHECK_RTOL = {torch.float64: 1e-9, torch.float32: 1e-3, torch.float16: 2e-2, torch.bfloat16: 5e-2}


def check_results(program: Program, graph: Graph) -> str | None:
    """Where `program`'s results for one set of random inputs differ from the reference interpreter's
    for `graph` (the graph of the program's sizes), or None when they agree within `_CHECK_RTOL`."""
    xs = random_inputs(graph)
    try:
        with torch.no_grad():
            got, want = program.executor.run(xs), run_graph(graph, xs)
    except Exception as e:  # noqa: BLE001 - a program that cannot run here is not shown right
        return f"running it failed: {e}"
    for k, (x, y) in enumerate(zip(got, want, strict=True)):
        if x.shape != y.shape or x.dtype != y.dtype:
            return f"output {k} is {x.dtype}{list(x.shape)}, the reference's {y.dtype}{list(y.shape)}"
        if not x.is_floating_point():
            if not torch.equal(x, y):
                return f"output {k} differs"
            continue
        if not torch.equal(x.isnan(), y.isnan()):
            return f"output {k} has NaNs elsewhere"
        a, b = x.nan_to_num().double(), y.nan_to_num().double()
        if a.numel() == 0:
            continue
        scale = max(float(b.abs().max()), 1e-30)
        err = float((a - b).abs().max()) / scale
        if err > _CHECK_RTOL.get(x.dtype, 0.0):
            return f"output {k} differs from the reference by {err:.3g} of its largest value"
    return None


def fingerprint(graph: Graph, options: Options) -> str:
    """A key equal for two graphs that compute the same (their printed form: ops, attributes, types with
    their symbols, input roles; and their constants' values) planned with the same options."""
    h = hashlib.sha256(str(graph).encode())
    for name in sorted(graph.constants):
        value = graph.constants[name]
        h.update(name.encode())
        if isinstance(value, torch.Tensor):
            t = value.detach().contiguous()
            h.update(f"{t.dtype}{list(t.shape)}".encode())
            h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
        else:
            h.update(repr(value).encode())
    h.update(repr(options).encode())
    return h.hexdigest()


def _inner(p: Program) -> Any:
    ex = p.executor
    return ex.inner if isinstance(ex, FoldedExecutor) else ex


# Plans one symbolic graph keeps (each for other hints, made when the others' guards fail for a call);
# past it, sizes whose guards all fail are planned for themselves.
MAX_TEMPLATES = 8


@dataclass
class PlanReuse:
    """The plans of symbolic graphs (an ONNX model's template, the graphs Dynamo hands over for one
    model), and counts."""

    # By the caller's key for the symbolic graph (its id, or a structural `fingerprint` shared by
    # captures of one computation): the first graph of the key (kept, so an id stays its own) and its
    # plans, newest last.
    templates: dict[Hashable, tuple[Graph, list[PlanTemplate]]] = field(default_factory=dict)
    off: dict[Hashable, str] = field(default_factory=dict)  # keys whose reuse is off, and why
    planned: int = 0  # planner runs: templates, fresh compiles a failed check asks, sizes planned alone
    reused: int = 0  # programs instantiated from a template
    checked: int = 0  # results checks of a template's first other size (a run, not a plan)
    replanned: dict[str, int] = field(default_factory=dict)  # why a plan was made for a call's sizes
    last_s: float = 0.0  # how long the last program took to make
    last_kind: str = ""  # how: "plan", "hints", "reuse", "checked", "fresh"

    def program(self, symbolic: Graph, env: Mapping[str, int], graph: Graph, options: Options,
                key: Hashable | None = None) -> Program:  # fmt: skip
        """The program for `graph`, the instantiation of `symbolic` (SymInt sizes) for the sizes `env`:
        from a plan of `symbolic` (or of the graph first given under `key`) whose guards hold, else from
        a new plan of it for these sizes."""
        t0 = time.perf_counter()
        try:
            return self._program(symbolic, dict(env), graph, options, id(symbolic) if key is None else key)
        finally:
            self.last_s = time.perf_counter() - t0

    def _program(self, symbolic: Graph, env: dict[str, int], graph: Graph, options: Options,
                 key: Hashable) -> Program:  # fmt: skip
        why_off = self.off.get(key)
        if why_off is not None:
            self.last_kind = "fresh"
            return self._replan(graph, options, why_off)
        _, plans = self.templates.setdefault(key, (symbolic, []))
        why = None  # why the newest plan does not hold
        for template in reversed(plans):
            if env == template.hints:
                self.last_kind = "hints"
                return template.at_hints()
            try:
                program = template.instantiate(env)
            except NotReusable as e:
                why = why or str(e)
                continue
            return self._trusted(template, program, graph, env, key)
        if len(plans) >= MAX_TEMPLATES:
            self.last_kind = "fresh"
            return self._replan(graph, options, f"{len(plans)} plans kept, none holds: {why}")
        why = why or "no plan yet"
        # A plan of the symbolic graph for these sizes as hints (a failed guard plans again).
        hinted = symbolic if not plans else substitute(symbolic, env, rehint=True)
        template = PlanTemplate.make(hinted, env, options)
        plans.append(template)
        self.planned += 1
        self.last_kind = "plan"
        if plans[:-1]:
            self.replanned[why] = self.replanned.get(why, 0) + 1
        log.info("%s: planned for symbolic sizes %s (%d guards, %d cost verdicts, %d routes)%s",
                 symbolic.name, env, len(template.guards.recorded), len(template.guards.verdicts),
                 len(template.routes), f"; {why}" if plans[:-1] else "")  # fmt: skip
        return template.at_hints()

    def _trusted(self, template: PlanTemplate, program: Program, graph: Graph, env: dict[str, int],
                 key: Hashable) -> Program:  # fmt: skip
        self.last_kind = "reuse"
        if not template.trusted:
            self.checked += 1
            self.last_kind = "checked"
            wrong = check_results(program, graph)
            if wrong is not None:
                # The fresh compile decides: the same program (or bit-identical results) keeps reuse.
                fresh = template.fresh(graph, env)
                self.planned += 1
                self.last_kind = "fresh"
                diff = same_program(program, fresh)
                if diff is not None and diff.startswith("the plan graphs differ"):
                    # A compile of fixed sizes may fold what a symbolic size keeps (a mask made from the
                    # sequence length): the same results, bit for bit, on one set of inputs will do.
                    differs = different_results(program, fresh, graph)
                    diff = None if differs is None else f"{diff}, and {differs}"
                if diff is not None:
                    self.off[key] = (f"an instantiation for {env} differs from the reference ({wrong}) and "
                                     f"from a compile of its sizes: {diff}")  # fmt: skip
                    log.info("%s: plan reuse off: %s", graph.name, self.off[key])
                    return fresh
                log.info("%s: the plan for %s differs from the reference (%s) as a compile of its sizes "
                         "does", graph.name, env, wrong)  # fmt: skip
            template.trusted = True
        self.reused += 1
        log.info("%s: reused the plan for %s (planned for %s)", graph.name, env, template.hints)
        return program

    def _replan(self, graph: Graph, options: Options, why: str) -> Program:
        self.replanned[why] = self.replanned.get(why, 0) + 1
        self.planned += 1
        log.info("%s: planned for its own sizes: %s", graph.name, why)
        return compiler.compile_graph(graph, options)

    def stats(self) -> dict[str, Any]:
        plans = [t for _, ts in self.templates.values() for t in ts]
        return {
            "plan_reuse": {
                "templates": len(plans),
                "planned": self.planned,
                "reused": self.reused,
                "checked": self.checked,
                "trusted": any(t.trusted for t in plans),
                "guards": sum(len(t.guards.recorded) for t in plans),
                "cost_verdicts": sum(len(t.guards.verdicts) for t in plans),
                "off": sorted(self.off.values()),
                "planned_again": dict(self.replanned),
                "last_s": self.last_s,
            }
        }


def _hints(graph: Graph) -> dict[str, int]:
    """The symbols of `graph`'s input sizes and their hints."""
    out: dict[str, int] = {}
    for gi in graph.inputs:
        for d in gi.value.type.shape:
            if isinstance(d, SymInt) and d.expr[0] == "s":
                out[d.expr[1]] = int(d)
    return out
