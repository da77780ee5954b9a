"""Events from a plan: one record per fusion decision (solver order), per kernel, and a plan summary.

In: a `Plan` (its decisions, kernels and steps) and its hardware profile. Out: event records (see
`autofusion/events.py` for their fields) and the one-line INFO summary of the fusion channel.
"""

from __future__ import annotations

from collections import Counter

from autofusion.events import (
    CandidateEvent,
    CostTerms,
    EventRecord,
    KernelEvent,
    KernelTile,
    PlanEvent,
    RecomputeEvent,
)
from autofusion.fusion.cost import estimate
from autofusion.fusion.records import Decision
from autofusion.hw.profile import HardwareProfile
from autofusion.plan.schedule import KernelStep, Plan


def candidate_event(d: Decision, seq: int, graph: str, profile: HardwareProfile) -> EventRecord:
    """One fusion decision as an event. `us_saved` > 0: the merge saves time; < 0: it costs."""
    if d.kind == "recompute":
        return RecomputeEvent(graph, seq, d.first, d.second, True, d.rule, d.first_nodes)
    b = d.benefit
    terms = None
    if b is not None:
        terms = CostTerms(b.mem_saved * 1e6, b.sched_saved * 1e6, b.ilp_gain * 1e6, -b.reg_spill * 1e6,
                          -b.tile_overhead * 1e6)  # fmt: skip
    return CandidateEvent(
        graph,
        seq,
        d.kind,
        d.first,
        d.second,
        d.first_nodes,
        d.second_nodes,
        d.accepted,
        d.code,
        d.reason,
        d.rule,
        d.bytes_shared,
        bytes_saved=None if b is None else round(b.mem_saved * profile.memory_bandwidth),
        us_saved=None if b is None else b.net * 1e6,
        terms_us=terms,
        live_bytes=d.live_bytes,
        budget_bytes=d.budget_bytes,
        budget_used=(d.live_bytes / d.budget_bytes) if d.budget_bytes else None,
        line=d.line(),
    )


def kernel_ops(step: KernelStep) -> list[str]:
    gemm = [step.gemm.op] if step.gemm is not None else []  # the GEMM a GEMM + epilogue kernel runs first
    return gemm + [n.op for n in step.kernel.nodes]


def kernel_event(step: KernelStep, graph: str, profile: HardwareProfile) -> KernelEvent:
    e = estimate(step.kernel, profile, step.tile)
    t = step.tile
    return KernelEvent(
        graph,
        step.name,
        tuple(kernel_ops(step)),
        tuple(n.name for n in step.kernel.nodes),
        e.bytes,
        e.flops,
        e.seconds * 1e6,
        KernelTile(t.rows_per_block, t.inner_block, t.persistent, t.split_rows),
        t.live_bytes,
        t.budget_bytes,
        (t.live_bytes / t.budget_bytes) if t.budget_bytes else None,
    )


def plan_event(plan: Plan) -> PlanEvent:
    """The plan summary. Its numbers are `plan.stats`' (`build_plan` fills them): `kernels` counts the
    kernel calls a run makes (generated kernels and library ops, literals excepted)."""
    st = plan.stats
    return PlanEvent(
        plan.graph.name,
        len(plan.steps),
        st["kernels"],
        tuple(f"{s.node.name}({s.node.op}): {s.reason}" for s in plan.op_steps if s.node.op != "const"),
        st["fused_kernels"],
        st["bytes_before"],
        st["bytes_after"],
        st["estimated_us"],
        st["decisions"],
        st["rejected"],
    )


def plan_events(plan: Plan) -> list[EventRecord]:
    """The fusion decisions in solver order, then one event per kernel and a plan summary."""
    name = plan.graph.name
    out = [candidate_event(d, i, name, plan.profile) for i, d in enumerate(plan.decisions)]
    out += [kernel_event(s, name, plan.profile) for s in plan.kernels]
    out.append(plan_event(plan))
    return out


def fusion_summary(plan: Plan) -> str:
    """One line: candidates, merges, rejections by code, kernels, estimated traffic before and after."""
    cands = [d for d in plan.decisions if d.kind != "recompute"]
    merged = sum(1 for d in cands if d.accepted)
    codes = Counter(d.code for d in cands if not d.accepted)
    why = ", ".join(f"{c} x{n}" for c, n in sorted(codes.items()))
    st = plan.stats
    return (
        f"fusion {plan.graph.name}: {len(cands)} candidates, {merged} merged, {len(cands) - merged} rejected"
        + (f" ({why})" if why else "")
        + f"; {st.get('fused_kernels', 0)} fused kernels; est. traffic {_mb(st.get('bytes_before', 0))} -> "
        f"{_mb(st.get('bytes_after', 0))}"
    )


def _mb(n: int) -> str:
    return f"{n / 1e6:.2f} MB" if n >= 1e5 else f"{n / 1e3:.1f} kB"
