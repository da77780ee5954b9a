"""The compiler pipeline after capture, as a list of phases that reads at a glance.

In: a captured IR graph and Options. Out: a `Program`: the plan, its executor and what happened.

    drop dead nodes -> graph passes (passes/manager.py: folding, simplification, CSE, layout, horizontal
    matmuls; each switched off by name in Options.disabled) -> fusion rules (passes/rewrite/: library
    rewrites, kernel groups; blacklist, skip list, switches) -> drop dead nodes -> decompose composites
    -> verify
    -> solve fusion groups (cost model, NF reasons; rule groups first) -> plan steps
    -> SuperKernel grouping (auto: where dispatch matters; scopes, phases, arena)
    -> render one C++ translation unit -> build (disk cache) -> load -> executor (per kernel or SuperKernel)

The rules run after the graph passes so they see folded constants and merged sibling projections
(`layernorm_qkv_linear` matches the one Linear that horizontal_pattern makes of Q, K and V).

A failed build is not an error: the plan runs through the reference runtime and the reason is
logged once at WARNING and kept in the stats (`build_error`).

Each stage reports to a `dfx.trace.Trace` (structured events, one INFO summary per channel, and the
AUTOFUSE_DFX_FLAGS / TORCH_COMPILE_DEBUG dumps when Options ask for them).
"""

from __future__ import annotations

import contextvars
import logging
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import autofusion.runtime.conv_chain  # registers the layout pass's chain measurement
import autofusion.runtime.library  # noqa: F401  (registers the autofusion_rules operators rules emit)
from autofusion import network_layout, tuning
from autofusion.codegen.cpp.build import BuildError, CompilerConfig, build, load
from autofusion.codegen.cpp.gemm import render_gemm_steps
from autofusion.codegen.cpp.render import render_unit, supports
from autofusion.codegen.cpp.superkernel import render_super
from autofusion.config import Options
from autofusion.dfx.trace import Trace
from autofusion.events import EventRecord
from autofusion.fusion.solver import FusionLimits, solve
from autofusion.hw.busy import observed
from autofusion.hw.profile import HardwareProfile, load_profile
from autofusion.ir import nf
from autofusion.ir.graph import Graph, Node
from autofusion.ir.symbolic import unrecorded
from autofusion.ir.verify import verify
from autofusion.kernel.tile import TileKnobs
from autofusion.passes.freeze import FoldSplit, split_frozen
from autofusion.passes.linear_post_op import Decide
from autofusion.passes.manager import PASS_NAMES, after_rules_passes, graph_passes
from autofusion.passes.rewrite import settle_options
from autofusion.passes.rewrite.stage import Prepared, prepare
from autofusion.passes.simplify.dce import eliminate_dead_nodes
from autofusion.plan.entry_conv import conv_args, is_conv_call
from autofusion.plan.entry_ops import entry_ops, one_row_linear, one_row_node
from autofusion.plan.schedule import OpStep, Plan, build_plan
from autofusion.plan.superkernel import SuperEntry, SuperPlan, build_super_plan
from autofusion.runtime import dnnl_route, library
from autofusion.runtime.blas import sgemm_address, sgemm_status
from autofusion.runtime.executor import PlanExecutor
from autofusion.runtime.frozen import FoldedExecutor
from autofusion.runtime.linear_post_op import PostOpChooser
from autofusion.runtime.prepack import Chooser, RouteChooser, packed_call
from autofusion.runtime.program import Executor, Program, cache_for
from autofusion.runtime.super_executor import SuperExecutor
from autofusion.tuning import tuning_stats

log = logging.getLogger("autofusion.codegen")
pass_log = logging.getLogger("autofusion.passes")


def profile_for(options: Options) -> HardwareProfile:
    cache = cache_for(options) if options.cache_dir else None
    return load_profile(options.target, cache_dir=cache, measure=cache is not None)


# SuperKernel costs nothing where it does not help (the same loops under the same static schedule,
# one call instead of several), so "dispatch dominates" is read generously: on once the calls it saves
# are a tenth of the estimated kernel time.
SUPER_KERNEL_DISPATCH_SHARE = 0.1

# What this process compiled, for reports that count compiles honestly (bench_dynamic): planner runs
# (`compile_graph` calls, a layout search's candidates included) and kernel libraries by how each
# program got its one: built by the C++ compiler, loaded from the disk cache, or shared with a program
# of the same source (plan reuse). Plain counters: a report reads the difference around its work.
COUNTS = {"plans": 0, "builds": 0, "disk_loads": 0, "shared_libraries": 0}
# On, too, where one-row linears (GEMVs) are at least this share of it: a decode step (see below).
SUPER_KERNEL_GEMV_SHARE = 0.5


def _no_fuse(node: Node) -> str | None:
    """Ops the user marked `super_kernel_scope(None)` are never fused (CANN: no-fuse wins)."""
    if node.scope.no_fuse:
        log.info("%s(%s) cannot fuse, the reason is [%s][marked super_kernel_scope(None)]",
                 node.name, node.op, nf.NO_FUSE_SCOPE)  # fmt: skip
        return f"[{nf.NO_FUSE_SCOPE}] marked super_kernel_scope(None)"
    return supports(node)


def super_kernel_decision(plan: Plan, options: Options) -> tuple[bool, str]:
    """Whether to run `plan` as SuperKernels, and why (kept in stats["super_kernel"])."""
    if options.super_kernel != "auto":
        return options.super_kernel == "on", f"super_kernel={options.super_kernel!r}"
    # Each step costs a dispatch from Python in the per-kernel executor; the SuperKernel path pays about
    # one for the whole plan, through a leaner call path (no per-step Python at all).
    saved = len(plan.steps) * plan.profile.dispatch_overhead_s
    work = plan.stats.get("estimated_us", 0.0) * 1e-6
    types = plan.graph.value_types()
    if any(n.scope.name for n in plan.graph.nodes):
        return True, "the model marks super_kernel_scope"
    gemv = [s for s in plan.steps if isinstance(s, OpStep) and one_row_linear(s, types)]
    gemv_s = sum(types[s.node.inputs[1]].nbytes for s in gemv) / plan.profile.memory_bandwidth
    if gemv and gemv_s >= SUPER_KERNEL_GEMV_SHARE * work and sgemm_address() is not None:
        # A decode step: its one-row linears, most of its time, run as GEMVs inside the entries
        # (faster than the library calls), and its many small steps cost far more than one dispatch
        # each from Python.
        return True, (f"{len(gemv)} one-row linears ({gemv_s * 1e6:.0f} us of weight reads) run as GEMVs "
                      f"inside the entries")  # fmt: skip
    convs = _dnnl_convs(plan)
    if convs >= 2 and dnnl_route.status() is None:
        # Inside an entry a oneDNN convolution is the same primitive call without its Python step
        # (argument checks, the primitive's lookup, a fresh result tensor): never slower, and a CNN's
        # plan then runs as a few calls instead of one per convolution.
        return True, f"{convs} convolutions on the dnnl route can run inside the entries"
    if saved >= SUPER_KERNEL_DISPATCH_SHARE * work:
        return (
            True,
            f"dispatch {saved * 1e6:.1f} us >= {SUPER_KERNEL_DISPATCH_SHARE:g} x kernels {work * 1e6:.1f} us",
        )
    return (
        False,
        f"dispatch {saved * 1e6:.1f} us < {SUPER_KERNEL_DISPATCH_SHARE:g} x kernels {work * 1e6:.1f} us",
    )


def plan_graph(graph: Graph, options: Options, profile: HardwareProfile | None = None,
               on_stage: Callable[[str, Graph], None] | None = None) -> Plan:  # fmt: skip
    """The plan of `graph` as it is, taking the graph's own inputs (no freezing: `plan_frozen`)."""
    return plan_frozen(graph, options, profile, on_stage, freeze=False)[0]


def plan_frozen(graph: Graph, options: Options, profile: HardwareProfile | None = None,
                on_stage: Callable[[str, Graph], None] | None = None,
                freeze: bool | None = None,
                events: list[EventRecord] | None = None) -> tuple[Plan, FoldSplit | None]:  # fmt: skip
    """The plan, and with freezing (`Options.freeze` unless `freeze` says) the parameter-only part split
    off after the graph passes (`passes/freeze.py`): the plan then takes the graph's inputs followed by
    the folded values, which `runtime.frozen.FoldedExecutor` supplies. `events` receives the passes'
    decision records (the layout pass's, one per convolution chain)."""
    options = settle_options(options)  # once per content; callers may pass unsettled Options
    freeze = options.freeze if freeze is None else freeze
    profile = profile or profile_for(options)
    stage = on_stage or (lambda name, g: None)
    g = eliminate_dead_nodes(graph)
    stage("AfterDce", g)
    changed: list[str] = []  # switchable passes that rewrote the graph (`autofusion bisect` tries them off)
    passes = graph_passes(profile, cache_for(options) if options.cache_dir else None, frozen=freeze)
    for name, fn in passes:  # named, in the order manager.py documents
        if name in options.disabled:
            pass_log.info("pass %s is disabled", name)
            continue
        before, g = g, fn(g)
        if g is not before and name in PASS_NAMES:
            changed.append(name)
        if options.verify and g is not before:
            verify(g)
    stage("AfterGraphPasses", g)
    split = split_frozen(g) if freeze and options.fusion else None
    if split is not None:
        g = split.graph
        stage("AfterFreeze", g)
        if options.verify:
            verify(g)
            verify(split.fold)
    # Rules whose name is in options.disabled are skipped (passes/rewrite/apply.py); prepare also decomposes.
    prepared = prepare(g, options)
    g = prepared.graph
    stage("AfterRulesAndDecompose", g)
    if options.verify:
        verify(g)
    late = after_rules_passes(cache_for(options) if options.cache_dir else None, options.conv_layout,
                              options.conv_chain_layouts, events, _post_op_decider(options))  # fmt: skip
    for name, fn in late:
        if name in options.disabled:
            pass_log.info("pass %s is disabled", name)
            continue
        origin: list[int] = []
        before, g = g, fn(g, origin=origin)
        if g is not before:
            changed.append(name)
            prepared = _carried_over(prepared, before, g, origin)
            if options.verify:
                verify(g)
    limits = FusionLimits(
        max_fusion_size=options.max_fusion_size,
        max_inputs=options.max_inputs,
        recomputation_threshold=options.recomputation_threshold,
        horizontal="horizontal_kernel" not in options.disabled,
        disabled=frozenset(options.disable_fusion),
        max_merges=None if options.max_merges < 0 else options.max_merges,
        gemm_library=_packed_gemms(g, options) if freeze else None,
        **_gemm_limits(options),
    )
    result, solver = solve(g, profile, limits, prepared.wrap(_no_fuse), forced=prepared.forced)
    tiles = TileKnobs(options.tile_rows_per_block, options.tile_inner_block)
    plan = build_plan(g, result, solver, profile, tiles)
    extra: dict[str, Any] = {} if prepared.rules is None else {"rules": prepared.rules.applied}
    if freeze:
        extra["freeze"] = {
            "on": True,
            "folded_nodes": 0 if split is None else split.folded_nodes,
            "folded_values": 0 if split is None else split.folded_values,
            "fold_sources": 0 if split is None else len(split.fold_inputs),
        }
    return replace(plan, stats={**plan.stats, **extra, "passes": changed}), split


def _frozen(split: FoldSplit | None, executor: PlanExecutor | SuperExecutor) -> Executor:
    return executor if split is None else FoldedExecutor(split, executor)


# Set by a plan made once for many sizes (`autofusion.reuse`): wraps every route chooser a compile
# makes, to record the routes chosen for the hints or to replay them for other sizes.
route_wrapper: contextvars.ContextVar[Callable[[Chooser], Chooser] | None] = contextvars.ContextVar(
    "af_route_wrapper", default=None
)


def _route_chooser(options: Options) -> Chooser:
    """How linears on a parameter weight pick their library route: measured (and cached) or forced."""
    chooser = RouteChooser(cache_for(options) if options.cache_dir else None, options.linear_route)
    wrap = route_wrapper.get()
    return chooser if wrap is None else wrap(chooser)


def _post_op_decider(options: Options) -> Decide:
    """Whether a Linear + GELU of given sizes runs as one oneDNN call (runtime/linear_post_op.py):
    measured and cached per shape, or as Options.linear_route forces."""
    chooser = PostOpChooser(cache_for(options) if options.cache_dir else None, options.linear_route)
    return lambda m, k, n, dtype, act: chooser(m, k, n, dtype.to_torch(), act)


def _prepacked_steps(plan: Plan, route: Chooser | None) -> dict[int, str]:
    """Linear op steps that run on a prepacked weight (a measured win over plain GEMM), kept out of
    SuperKernel entries, whose in-entry GEMM reads the weight as the module holds it."""
    if route is None:
        return {}
    types = plan.graph.value_types()
    out: dict[int, str] = {}
    for i, step in enumerate(plan.steps):
        if isinstance(step, OpStep) and not one_row_linear(step, types):
            packed = packed_call(step.node, plan.graph, types, route)
            if packed is not None:
                out[i] = f"runs on a prepacked weight ({packed[1]}, measured faster than the plain GEMM)"
    return out


def _dnnl_convs(plan: Plan) -> int:
    """The plan's convolutions routed to oneDNN with a channels-last result (what an entry may call)."""
    n = 0
    for s in plan.steps:
        if isinstance(s, OpStep) and is_conv_call(s.node):
            c = conv_args(s.node)
            n += c is not None and c.route == "dnnl" and c.channels_last
    return n


def _dnnl_status(plan: Plan) -> str | None:
    """None when the plan's "dnnl"-routed convolutions may run inside SuperKernel entries, else why not
    (the glue is built and loaded only for a plan that has a routed convolution)."""
    if not any(isinstance(s, OpStep) and is_conv_call(s.node) for s in plan.steps):
        return "the plan has no routed convolution"
    if library.FORCE_ROUTE not in (None, "dnnl"):
        return f"library.FORCE_ROUTE is {library.FORCE_ROUTE!r}"
    return dnnl_route.status()


def _gemms_out(plan: Plan, options: Options) -> dict[int, str]:
    """With `super_kernel_gemm=False`, the linear and bmm steps an entry would call through BLAS, kept
    out of the entries (each splits its scope: it runs through torch between two entries)."""
    if options.super_kernel_gemm:
        return {}
    return {i: "super_kernel_gemm=False: runs through torch between entries" for i, s in enumerate(plan.steps)
            if isinstance(s, OpStep) and s.node.op in ("linear", "bmm")}  # fmt: skip


def _carried_over(prepared: Prepared, old: Graph, new: Graph, origin: list[int]) -> Prepared:
    """`prepared`'s forced groups and exclusions (node-indexed, node-keyed) for `new`, a rebuild of
    `old` whose node k came from old node origin[k]."""
    forced = [[k for k in range(len(new.nodes)) if origin[k] in set(grp)] for grp in prepared.forced]
    inner = prepared.excluded
    if inner is None:
        return replace(prepared, graph=new, forced=[f for f in forced if len(f) > 1])
    was = {id(new.nodes[k]): old.nodes[origin[k]] for k in range(len(new.nodes))}

    def excluded(node: Node) -> str | None:
        return inner(was.get(id(node), node))

    return replace(prepared, graph=new, forced=[f for f in forced if len(f) > 1], excluded=excluded)


def _packed_gemms(graph: Graph, options: Options) -> Callable[[Node], str | None]:
    """Why a GEMM stays a library call rather than joining its epilogue's kernel: its weight, prepacked,
    was measured faster than the plain GEMM the kernel would call per block (on a CPU where the plain
    sgemm is far from the machine's peak, oneDNN's packed GEMM can be twice as fast)."""
    route = _route_chooser(options)
    types = graph.value_types()

    def why(node: Node) -> str | None:
        if one_row_node(node, types):
            # The GEMM kernel would make one sgemm call for the single row; a SuperKernel entry
            # streams the weight through its GEMV faster (codegen/cpp/gemv.py).
            return "one row: a GEMV inside a SuperKernel entry, not a GEMM + epilogue kernel"
        packed = packed_call(node, graph, types, route)
        if packed is None:
            return None
        return f"its weight prepacked ({packed[1]}) measured faster than the plain GEMM: a library call"

    return why


def _gemm_limits(options: Options) -> dict[str, Any]:
    """GEMM epilogue fusion is on unless the pass is disabled or no C-callable sgemm was found."""
    if "gemm_epilogue" in options.disabled:
        return {"gemm_epilogue": False, "gemm_off": "gemm_epilogue is disabled (Options.disabled)"}
    if sgemm_address() is None:
        return {"gemm_epilogue": False, "gemm_off": f"no C-callable sgemm ({sgemm_status()})"}
    return {"gemm_epilogue": True}


def compile_graph(graph: Graph, options: Options) -> Program:
    COUNTS["plans"] += 1
    record = tuning.lookup(graph, options, cache_for(options) if options.cache_dir else None)
    if record is not None:
        options = tuning.apply(record, options)
        log.info("%s: applying the tuning record %s (measured %.3f -> %.3f ms): %s", graph.name,
                 record.key()[:12], record.default_ms, record.tuned_ms, record.overrides)  # fmt: skip
    # Every chain in one layout, timed as the whole program, against each chain's own choice (not for
    # a plan made for many sizes: its route recorder would see the candidates' compiles).
    network = None
    if route_wrapper.get() is None:
        options, network = network_layout.choose(
            graph, options, compile_graph, cache_for(options) if options.cache_dir else None
        )
    trace = Trace(options, graph.name)
    if network is not None:
        trace.events.append(network)
    trace.stage("AfterCapture", graph)
    # Planning's window is a sample of the machine's load (hw/busy.observed): the timings that follow
    # it need no sleeping sample of their own.
    plan, split = observed(lambda: plan_frozen(graph, options, on_stage=trace.stage, events=trace.events))
    trace.plan(plan)
    stats = dict(plan.stats)
    if record is not None:
        stats["tuning"] = tuning_stats(record)
    # Freezing prepacks linear weights where a measurement on this machine says it pays.
    route = _route_chooser(options) if options.freeze else None
    # What follows is derived from the plan by cheap functions: a plan made once for many sizes
    # (`autofusion.reuse`) derives it again for each size, so it records no guards here.
    with unrecorded():
        return finish(graph.name, plan, split, stats, route, options, trace)


def finish(
    name: str, plan: Plan, split: FoldSplit | None, stats: dict[str, Any], route: Chooser | None,
    options: Options, trace: Trace | None, records: tuple[Any, ...] = (),
    library: Callable[[str], Any] | None = None,
) -> Program:  # fmt: skip
    """The `Program` of a plan: SuperKernel grouping (where it pays), the rendered source, its library
    (built, or `library(source)` where that gives one), the executor and the stats. `trace`: where the
    stages report (None: `records` are the program's events)."""
    use_super, why = super_kernel_decision(plan, options)
    splan = None
    if use_super:
        keep_out = {**_gemms_out(plan, options), **_prepacked_steps(plan, route)}
        ops = entry_ops(plan, sgemm_address() is not None, sgemm_status(), keep_out, _dnnl_status(plan))
        if ops.no_super:
            log.info("%s runs kernel by kernel, not as SuperKernels: %s", name, ops.no_super)
            use_super, why = False, ops.no_super
        else:
            splan = build_super_plan(plan, ops.callable, ops.why_not, ops.strides)
    if splan is not None and not splan.super_kernels:
        splan = None

    def events() -> tuple[Any, ...]:
        return records if trace is None else tuple(trace.events)

    if not plan.kernels and splan is None:
        program = assemble(plan, split, None, None, {}, [], why, stats, route, options, events())
        if trace is not None:
            trace.finish(program)
        return program
    stats = dict(stats)
    source, params, entries = render_program(plan, splan, options.kernel_threads)
    entry_dir = None
    dll = library(source) if library is not None else None
    if dll is not None:
        COUNTS["shared_libraries"] += 1
    else:
        try:
            lib = build(source, CompilerConfig(cxx=options.cxx), cache_for(options), "graph")
            dll = load(lib)
            stats["compile_s"] = lib.compile_s
            stats["cache_hit"] = lib.cache_hit
            COUNTS["disk_loads" if lib.cache_hit else "builds"] += 1
            entry_dir = lib.entry_dir
        except BuildError as e:
            log.warning("building the fused kernels failed; running %s with the reference runtime. "
                        "Reason: %s", name, str(e).splitlines()[0])  # fmt: skip
            stats["build_error"] = str(e)
    if trace is not None:
        trace.build(source, stats, entry_dir, stats.get("build_error"))
    program = assemble(plan, split, splan, dll, params, entries, why, stats, route, options, events(), source)
    if trace is not None:
        trace.finish(program)
    return program


def render_program(
    plan: Plan, splan: SuperPlan | None, threads: int
) -> tuple[str, dict[str, list[int]], list[SuperEntry]]:
    """The plan's one translation unit, each kernel's size/stride parameters and the SuperKernel
    entries (with theirs). Sizes are parameters, so plans of one loop structure render one source."""
    source, params = render_unit([(k.kernel, k.tile) for k in plan.kernels if k.gemm is None], threads)
    gemm_source, gemm_params = render_gemm_steps([k for k in plan.kernels if k.gemm is not None], threads)
    source += gemm_source
    params.update(gemm_params)
    entries: list[SuperEntry] = []
    if splan is not None:
        super_source, entries = render_super(splan, params, threads)
        source += super_source
    return source, params, entries


def assemble(
    plan: Plan, split: FoldSplit | None, splan: SuperPlan | None, dll: Any, params: dict[str, list[int]],
    entries: list[SuperEntry], why: str, stats: dict[str, Any], route: Chooser | None, options: Options,
    records: tuple[Any, ...], source: str = "",
) -> Program:  # fmt: skip
    """The `Program` running what was planned: its executor (kernel by kernel, or SuperKernels where
    `splan` and the library `dll` are there; the reference runtime without a library) and its stats
    (`stats`, the plan's, completed here). `route` picks the linears' library routes."""
    stats = dict(stats)
    if not plan.kernels and splan is None:
        reference = PlanExecutor(plan, None, poison=options.poison, linear_route=route)
        stats["prepacked"] = dict(reference.prepacked)
        return Program(plan, _frozen(split, reference), "", stats, records=records)
    executor: PlanExecutor | SuperExecutor
    if splan is not None and dll is not None:
        executor = SuperExecutor(splan, dll, entries, poison=options.poison, linear_route=route)
        stats["prepacked"] = dict(executor.prepacked)
        stats["super_kernel"] = {
            "on": True, "why": why, "entries": len(splan.super_kernels),
            "barriers": sum(sk.barriers for sk in splan.super_kernels),
            "library_calls_inside": sum(1 for k in splan.callable_ops.values() if k != "alias"),
            "views_inside": sum(1 for k in splan.callable_ops.values() if k == "alias"),
            "splits": [str(s) for s in splan.splits],
            "arena_bytes": splan.arena.size,
            "calls_per_run": executor.calls_per_run,
        }  # fmt: skip
    else:
        executor = PlanExecutor(plan, dll, params, poison=options.poison, linear_route=route)
        stats["prepacked"] = dict(executor.prepacked)
        stats["super_kernel"] = {
            "on": False,
            "why": why if splan is None or dll is not None else "build failed",
        }
    return Program(plan, _frozen(split, executor), source, stats, dll, params, records, splan)
