"""The HTML report (`autofusion report MODEL --out report.html`).

In: a model, example inputs and compile options. Out: one self-contained HTML file (Jinja2 template
`templates/report.html.j2`, pictures inline as SVG) with:
- the graph before fusion and the plan after it, as pictures;
- one row per fused kernel: ops, bytes moved, estimated and measured time, achieved bandwidth, tile,
  on-chip budget used;
- seed 002 §6.1's metrics, unfused against fused: kernel count, intermediate memory traffic,
  launches per run, estimated and measured latency, peak live memory;
- seed 000's improvement ratio, (fused total - unfused total) / unfused total over the measured step
  times (each the best of N rounds), with its sign explained (negative: fusion saves time);
- a roofline plot of the kernels (estimated and measured), and every fusion decision.

"Unfused" is the same plan with no merge accepted (Options.max_merges = 0): every op its own
generated kernel or library call, which is CANN's "Autofuse off" comparison. Eager PyTorch is
measured alongside, in the same process, alternating with the two plans.
"""

from __future__ import annotations

import datetime
import os
import platform
from collections.abc import Callable, Sequence
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


def launches(plan: Plan) -> int:
    return sum(1 for s in plan.steps if isinstance(s, KernelStep) or s.node.op not in NO_TRAFFIC | {"const"})


def _median_ms(fns: Sequence[Any], inputs: Sequence[Any], runs: int) -> list[float]:
    from autofusion.tools.cli.main import median_ms

    return median_ms(fns, inputs, runs)


def _baseline(model: Any) -> tuple[Any, str]:
    """What the fused model is timed against: the torch model run eagerly, or for an ONNX model
    onnxruntime (when installed; else our reference runtime, op by op)."""
    from autofusion.api import is_onnx_source

    if not is_onnx_source(model):
        return model, "eager PyTorch"
    import autofusion

    try:
        import onnxruntime as ort
    except ImportError:
        ref = autofusion.compile(model, fusion=False)
        return ref, "reference runtime (onnxruntime not installed)"
    source = str(model) if not hasattr(model, "SerializeToString") else model.SerializeToString()
    sess = ort.InferenceSession(source, providers=["CPUExecutionProvider"])
    names = [i.name for i in sess.get_inputs()]

    def run(*xs: Any) -> Any:
        return sess.run(None, {n: (x.numpy() if isinstance(x, torch.Tensor) else x) for n, x in zip(names, xs, strict=True)})

    return run, "onnxruntime"


def collect(
    model: Any,
    inputs: Sequence[Any],
    name: str,
    options: dict[str, Any] | None = None,
    runs: int = 20,
    baseline: tuple[str, Callable[..., Any]] | None = None,
) -> dict[str, Any]:
    """Everything the template shows, as plain data (also what `--json` prints). `baseline` is what the
    whole model is also timed against (default: eager PyTorch, `model` itself; for an ONNX path,
    onnxruntime)."""
    import autofusion
    from autofusion.api import CompiledGraph

    options = dict(options or {})
    with torch.no_grad():
        cm = autofusion.compile(model, inputs, **options)
    cg = cm.compiled
    if cg is None or cg.program is None:
        raise ValueError(f"{name} runs eagerly, there is nothing to report: {cm.stats.get('eager_fallback')}")
    unfused = CompiledGraph(cg.captured, Options.from_env(**{**options, "max_merges": 0}))
    assert unfused.program is not None
    prog, prog0 = cg.program, unfused.program
    args = cg.bind(list(inputs))
    t_after = measure.step_times(prog, args, runs)
    t_before = measure.step_times(prog0, args, runs)
    if baseline is None:
        base_fn, base_name = _baseline(model)
    else:
        base_name, base_fn = baseline
    eager_ms, fused_ms, unfused_ms = _median_ms([base_fn, cm, lambda *xs: unfused.run(xs)], inputs, runs)
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
    ratio = (after_total - before_total) / before_total if before_total > 0 else 0.0
    e2e_ratio = (fused_ms - unfused_ms) / unfused_ms if unfused_ms > 0 else 0.0
    profile = plan.profile
    peak = profile.peak_flops.get("fp32", 1e11)
    metrics = [
        (
            "kernel launches per run (generated kernels + library ops)",
            launches(plan0),
            launches(plan),
            "count",
        ),
        ("generated kernels", len(plan0.kernels), len(plan.kernels), "count"),
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
        "ratio": ratio,
        "e2e_ratio": e2e_ratio,
        "eager_ms": eager_ms,
        "baseline": base_name,
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
