"""The compiler pipeline after capture, as a list of phases that reads at a glance.

In: a captured IR graph and Options. Out: a `Program`: the plan, its executor and what happened.

    drop dead nodes -> graph passes (passes/manager.py: folding, simplification, CSE, layout, horizontal
    matmuls; each switched off by name in Options.disabled) -> fusion rules (rules/: library rewrites,
    kernel groups; blacklist, skip list, switches) -> drop dead nodes -> decompose composites -> verify
    -> solve fusion groups (cost model, NF reasons; rule groups first) -> plan steps -> render one C++
    translation unit -> build (disk cache) -> load -> executor

The rules run after the graph passes so they see folded constants and merged sibling projections
(`layernorm_qkv_linear` matches the one Linear that horizontal_pattern makes of Q, K and V).

A failed build is not an error: the plan runs through the reference runtime and the reason is
logged once at WARNING and kept in the stats (`build_error`).

Each stage reports to a `dfx.trace.Trace` (structured events, one INFO summary per channel, and the
AUTOFUSE_DFX_FLAGS / TORCH_COMPILE_DEBUG dumps when Options ask for them).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autofusion.codegen.cpp.build import BuildError, CompilerConfig, build, load
from autofusion.codegen.cpp.render import render_unit, supports
from autofusion.config import Options
from autofusion.dfx.trace import Trace
from autofusion.hw.profile import HardwareProfile, load_profile
from autofusion.ir.graph import Graph
from autofusion.ir.verify import verify
from autofusion.passes.dce import eliminate_dead_nodes
from autofusion.passes.fusion.solver import FusionLimits, solve
from autofusion.passes.manager import graph_passes
from autofusion.plan.schedule import Plan, build_plan
from autofusion.rules.stage import prepare
from autofusion.runtime.executor import PlanExecutor

log = logging.getLogger("autofusion.codegen")
pass_log = logging.getLogger("autofusion.passes")


@dataclass
class Program:
    plan: Plan
    executor: PlanExecutor
    source: str = ""
    stats: dict[str, Any] = field(default_factory=dict)
    library: Any = None  # the loaded ctypes library (None: no kernels, or the build failed)
    params: dict[str, list[int]] = field(default_factory=dict)  # each kernel's size/stride array
    events: list[dict[str, Any]] = field(default_factory=list)  # dfx.events, in pipeline order


def profile_for(options: Options) -> HardwareProfile:
    cache = Path(options.cache_dir) if options.cache_dir else None
    return load_profile(options.target, cache_dir=cache, measure=cache is not None)


def plan_graph(graph: Graph, options: Options, profile: HardwareProfile | None = None,
               on_stage: Callable[[str, Graph], None] | None = None) -> Plan:  # fmt: skip
    profile = profile or profile_for(options)
    stage = on_stage or (lambda name, g: None)
    g = eliminate_dead_nodes(graph)
    stage("AfterDce", g)
    for name, fn in graph_passes(profile, options.cache_dir or None):  # named, in the order manager.py documents
        if name in options.disabled:
            pass_log.info("pass %s is disabled", name)
            continue
        before, g = g, fn(g)
        if options.verify and g is not before:
            verify(g)
    stage("AfterGraphPasses", g)
    # Rules whose name is in options.disabled are skipped (rules/apply.py); prepare also decomposes.
    prepared = prepare(g, options)
    g = prepared.graph
    stage("AfterRulesAndDecompose", g)
    if options.verify:
        verify(g)
    limits = FusionLimits(max_fusion_size=options.max_fusion_size, max_inputs=options.max_inputs,
                          recomputation_threshold=options.recomputation_threshold,
                          horizontal="horizontal_kernel" not in options.disabled,
                          disabled=frozenset(options.disable_fusion),
                          max_merges=None if options.max_merges < 0 else options.max_merges)
    result, solver = solve(g, profile, limits, prepared.wrap(supports), forced=prepared.forced)
    plan = build_plan(g, result, solver, profile)
    if prepared.rules is not None:
        plan.stats["rules"] = prepared.rules.applied
    return plan


def compile_graph(graph: Graph, options: Options) -> Program:
    trace = Trace(options, graph.name)
    trace.stage("AfterCapture", graph)
    plan = plan_graph(graph, options, on_stage=trace.stage)
    trace.plan(plan)
    stats = dict(plan.stats)
    if not plan.kernels:
        program = Program(plan, PlanExecutor(plan, None), "", stats, events=trace.events)
        trace.finish(program)
        return program
    source, params = render_unit([(k.kernel, k.tile) for k in plan.kernels])
    config = CompilerConfig(cxx=options.cxx)
    entry_dir = None
    try:
        lib = build(source, config, Path(options.cache_dir), "graph")
        dll = load(lib)
        stats["compile_s"] = lib.compile_s
        stats["cache_hit"] = lib.cache_hit
        entry_dir = lib.entry_dir
    except BuildError as e:
        log.warning("building the fused kernels failed; running %s with the reference runtime. Reason: %s",
                    graph.name, str(e).splitlines()[0])  # fmt: skip
        stats["build_error"] = str(e)
        dll = None
    trace.build(source, stats, entry_dir, stats.get("build_error"))
    program = Program(plan, PlanExecutor(plan, dll, params), source, stats, dll, params, trace.events)
    trace.finish(program)
    return program
