"""The HTML report (`autofusion report MODEL --out report.html`).

In: a model, example inputs and compile options. Out: one self-contained HTML file (Jinja2 template
`templates/report.html.j2`, pictures inline as SVG) that leads with the measured whole-model speedup:
the fused model against the same plan with no merge, and against the baseline (eager PyTorch, or for
an ONNX model onnxruntime), all three timed in the same process, taking turns. Its improvement ratio,
(fused - unfused) / unfused, is over those same whole-model times (negative: fusion saves time), so the
headline and the whole-model line cannot disagree. Then:
- the graph before fusion and the plan after it, as pictures;
- one row per fused kernel: ops, bytes moved, estimated and measured time, achieved bandwidth, tile,
  on-chip budget used;
- unfused against fused: fused kernels and steps per run (tools/diagnose/counts.py), intermediate memory
  traffic, estimated latency, the sum of the steps timed alone (each the best of N rounds), the
  whole-model latency, peak live memory;
- a roofline plot of the kernels (estimated and measured), and every fusion decision.

"Unfused" is the same plan with no merge accepted (Options.max_merges = 0): every op its own
generated kernel or library call, which is CANN's "Autofuse off" comparison.
"""

from __future__ import annotations

import datetime
import os
import platform
from collections.abc import Sequence
from importlib import resources
from typing import Any

import jinja2
import torch

from autofusion.config import Options
from autofusion.dfx.pictures import after_svg, before_svg
from autofusion.dfx.svg import RoofPoint, roofline_svg
from autofusion.events import Event
from autofusion.fusion.cost import estimate
from autofusion.plan.schedule import NO_TRAFFIC, KernelStep, OpStep, Plan
from autofusion.tools.diagnose import measure
from autofusion.tools.diagnose.compare import Baseline, baseline, median_ms
from autofusion.tools.diagnose.counts import FUSED_KERNELS, STEPS_MEANING, STEPS_PER_RUN


def intermediate_traffic(plan: Plan) -> int:
    """Bytes of values passed between steps through memory: written once, read by each consumer step
    (graph inputs and outputs excluded; views excluded, they move no data)."""
    g = plan.graph
    types = g.value_types()
    consumers: dict[int, int] = {}
    for s in plan.steps:
        for v in set(s.inputs if isinstance(s, KernelStep) else s.node.inputs):
            consumers[v] = consumers.get(v, 0) + 1
    total = 0
    outputs = set(g.outputs)
    for s in plan.steps:
        if isinstance(s, OpStep) and s.node.op in NO_TRAFFIC:
            continue
        made = s.outputs if isinstance(s, KernelStep) else [v.id for v in s.node.outputs]
        for v in made:
            if v not in outputs and consumers.get(v):
                total += types[v].nbytes * (1 + consumers[v])
    return total


def collect(
    model: Any,
    inputs: Sequence[Any],
    name: str,
    options: dict[str, Any] | None = None,
    runs: int = 20,
    base: Baseline | None = None,
) -> dict[str, Any]:
    """Everything the template shows, as plain data (also what `--json` prints). `base` is what the
    whole model is also timed against (default: `compare.baseline(model)`: eager PyTorch for a torch
    model; onnxruntime, else the reference runtime, for an ONNX model)."""
    from autofusion import api

    options = dict(options or {})
    with torch.no_grad():
        cm = api.compile(model, inputs, **options)
    cg = cm.compiled
    if cg is None or cg.program is None:
        raise ValueError(f"{name} runs eagerly, there is nothing to report: {cm.stats.get('eager_fallback')}")
    unfused = api.CompiledGraph(cg.captured, Options.from_env(**{**options, "max_merges": 0}))
    assert unfused.program is not None
    prog, prog0 = cg.program, unfused.program
    args = cg.bind(list(inputs))
    t_after = measure.step_times(prog, args, runs)
    t_before = measure.step_times(prog0, args, runs)
    if base is None:
        base = baseline(model, cm.graph)
    eager_ms, fused_ms, unfused_ms = median_ms([base.run, cm, lambda *xs: unfused.run(xs)], inputs, runs)
    plan, plan0 = prog.plan, prog0.plan
    kernels = []
    points = []
    for step, secs in zip(plan.steps, t_after, strict=True):
        if not isinstance(step, KernelStep):
            continue
        e = estimate(step.kernel, plan.profile, step.tile)
        t = step.tile
        kernels.append(
            {
                "name": step.name,
                "ops": list(dict.fromkeys(str(n.op) for n in step.kernel.nodes if n.op not in NO_TRAFFIC))
                or ["copy"],
                "nodes": len(step.kernel.nodes),
                "bytes": e.bytes,
                "flops": e.flops,
                "estimated_us": e.seconds * 1e6,
                "measured_us": secs * 1e6,
                "gbps": e.bytes / secs / 1e9 if secs > 0 else 0.0,
                "tile": f"rows/block {t.rows_per_block}, inner {t.inner_block}"
                + ("" if t.persistent else ", multi-pass"),
                "live_bytes": t.live_bytes,
                "budget_bytes": t.budget_bytes,
                "budget_used": t.live_bytes / t.budget_bytes if t.budget_bytes else 0.0,
            }
        )
        points.append(RoofPoint(step.name, e.flops, e.bytes, e.seconds, False))
        points.append(RoofPoint(step.name, e.flops, e.bytes, secs, True))
    before_total, after_total = sum(t_before), sum(t_after)
    steps_ratio = (after_total - before_total) / before_total if before_total > 0 else 0.0
    ratio = (fused_ms - unfused_ms) / unfused_ms if unfused_ms > 0 else 0.0
    profile = plan.profile
    peak = profile.peak_flops.get("fp32", 1e11)
    metrics = [
        (
            f"{FUSED_KERNELS} (generated; unfused: one per op)",
            plan0.stats["fused_kernels"],
            plan.stats["fused_kernels"],
            "count",
        ),
        (f"{STEPS_PER_RUN} ({STEPS_MEANING})", plan0.stats["kernels"], plan.stats["kernels"], "count"),
        (
            "intermediate memory traffic (between steps)",
            intermediate_traffic(plan0),
            intermediate_traffic(plan),
            "bytes",
        ),
        ("total memory traffic, estimated", plan0.stats["bytes_after"], plan.stats["bytes_after"], "bytes"),
        (
            "estimated latency of the generated kernels",
            plan0.stats["estimated_us"],
            plan.stats["estimated_us"],
            "us",
        ),
        (
            "measured latency, sum of steps timed alone (best of N)",
            before_total * 1e6,
            after_total * 1e6,
            "us",
        ),
        ("measured latency, whole model (median)", unfused_ms * 1e3, fused_ms * 1e3, "us"),
        (
            "peak live intermediate memory (step liveness)",
            measure.peak_live_bytes(plan0),
            measure.peak_live_bytes(plan),
            "bytes",
        ),
        (
            "executor scratch held between calls",
            measure.scratch_bytes(prog0),
            measure.scratch_bytes(prog),
            "bytes",
        ),
    ]
    events: list[Event] = list(prog.events)
    return {
        "title": f"autofusion report: {name}",
        "model": name,
        "created": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "host": f"{platform.machine()}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}, "
        f"{torch.get_num_threads()} torch threads, torch {torch.__version__}",
        "profile": {
            "name": profile.name,
            "bandwidth_gbs": profile.memory_bandwidth / 1e9,
            "peak_gflops": peak / 1e9,
            "budget_bytes": profile.budget_bytes,
        },
        "runs": runs,
        "kernels": kernels,
        "metrics": [{"name": n, "before": b, "after": a, "unit": u} for n, b, a, u in metrics],
        "stats": {k: plan.stats[k] for k in ("fused_kernels", "kernels")},
        "tuning": prog.stats.get("tuning"),  # the tuning record this plan applied, if any
        "speedup": unfused_ms / fused_ms if fused_ms > 0 else 0.0,
        "baseline_speedup": eager_ms / fused_ms if fused_ms > 0 else 0.0,
        "ratio": ratio,
        "steps_ratio": steps_ratio,
        "eager_ms": eager_ms,
        "baseline": base.name,
        "fused_ms": fused_ms,
        "unfused_ms": unfused_ms,
        "decisions": [e for e in events if e["event"] in ("fusion.candidate", "fusion.recompute")],
        "library_ops": [
            f"{s.node.name} ({s.node.op}): {s.reason}"
            for s in plan.steps
            if isinstance(s, OpStep) and s.node.op not in NO_TRAFFIC | {"const"}
        ],
        "svg_before": before_svg(plan),
        "svg_after": after_svg(plan),
        "svg_roofline": roofline_svg(
            points,
            peak,
            profile.memory_bandwidth,
            f"roofline on {profile.name} (hollow: estimated, filled: measured)",
        ),
    }


def _fmt(value: float, unit: str) -> str:
    if unit == "bytes":
        for step, suffix in ((1e9, "GB"), (1e6, "MB"), (1e3, "kB")):
            if abs(value) >= step:
                return f"{value / step:.2f} {suffix}"
        return f"{value:.0f} B"
    if unit == "us":
        return f"{value / 1e3:.3f} ms" if value >= 1e3 else f"{value:.1f} µs"
    return f"{value:g}"


def render_html(data: dict[str, Any]) -> str:
    text = resources.files("autofusion.tools.diagnose").joinpath("templates/report.html.j2").read_text()
    env = jinja2.Environment(
        autoescape=True, undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True
    )
    env.filters["fmt"] = _fmt
    return env.from_string(text).render(**data)
