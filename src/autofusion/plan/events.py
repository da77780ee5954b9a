"""Events from a plan: one record per fusion decision (solver order), per kernel, and a plan summary.

In: a `Plan` (its decisions, kernels and steps) and its hardware profile. Out: `Event`s (see
`autofusion/events.py` for their fields) and the one-line INFO summary of the fusion channel.
"""

from __future__ import annotations

from collections import Counter

from autofusion.events import Event
from autofusion.fusion.cost import estimate
from autofusion.fusion.solver import Decision
from autofusion.hw.profile import HardwareProfile
from autofusion.plan.schedule import KernelStep, OpStep, Plan


def candidate_event(d: Decision, seq: int, graph: str, profile: HardwareProfile) -> Event:
    """One fusion decision as an event. `us_saved` > 0: the merge saves time; < 0: it costs."""
    if d.kind == "recompute":
        return {
            "event": "fusion.recompute",
            "graph": graph,
            "seq": seq,
            "node": d.first,
            "consumers": d.second,
            "accepted": True,
            "rule": d.rule,
            "nodes": list(d.first_nodes),
        }
    b = d.benefit
    terms = None
    if b is not None:
        terms = {
            "mem_saved": b.mem_saved * 1e6,
            "sched_saved": b.sched_saved * 1e6,
            "ilp_gain": b.ilp_gain * 1e6,
            "reg_spill": -b.reg_spill * 1e6,
            "tile_overhead": -b.tile_overhead * 1e6,
        }
    return {
        "event": "fusion.candidate",
        "graph": graph,
        "seq": seq,
        "kind": d.kind,
        "first": d.first,
        "second": d.second,
        "first_nodes": list(d.first_nodes),
        "second_nodes": list(d.second_nodes),
        "accepted": d.accepted,
        "code": d.code,
        "reason": d.reason,
        "rule": d.rule,
        "bytes_shared": d.bytes_shared,
        "bytes_saved": None if b is None else round(b.mem_saved * profile.memory_bandwidth),
        "us_saved": None if b is None else b.net * 1e6,
        "terms_us": terms,
        "live_bytes": d.live_bytes,
        "budget_bytes": d.budget_bytes,
        "budget_used": (d.live_bytes / d.budget_bytes) if d.budget_bytes else None,
        "line": d.line(),
    }


def kernel_ops(step: KernelStep) -> list[str]:
    return [n.op for n in step.kernel.nodes]


def kernel_event(step: KernelStep, graph: str, profile: HardwareProfile) -> Event:
    e = estimate(step.kernel, profile, step.tile)
    t = step.tile
    return {
        "event": "codegen.kernel",
        "graph": graph,
        "kernel": step.name,
        "ops": kernel_ops(step),
        "nodes": [n.name for n in step.kernel.nodes],
        "bytes": e.bytes,
        "flops": e.flops,
        "estimated_us": e.seconds * 1e6,
        "tile": {
            "rows_per_block": t.rows_per_block,
            "inner_block": t.inner_block,
            "persistent": t.persistent,
            "split_rows": t.split_rows,
        },
        "live_bytes": t.live_bytes,
        "budget_bytes": t.budget_bytes,
        "budget_used": (t.live_bytes / t.budget_bytes) if t.budget_bytes else None,
    }


def plan_events(plan: Plan) -> list[Event]:
    """The fusion decisions in solver order, then one event per kernel and a plan summary."""
    name = plan.graph.name
    out = [candidate_event(d, i, name, plan.profile) for i, d in enumerate(plan.decisions)]
    out += [kernel_event(s, name, plan.profile) for s in plan.kernels]
    ops = [s for s in plan.steps if isinstance(s, OpStep)]
    out.append(
        {
            "event": "runtime.plan",
            "graph": name,
            "steps": len(plan.steps),
            "kernels": len(plan.kernels),
            "library_ops": [f"{s.node.name}({s.node.op}): {s.reason}" for s in ops if s.node.op != "const"],
            **{k: v for k, v in plan.stats.items() if isinstance(v, (int, float))},
        }
    )
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


