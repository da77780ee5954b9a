"""The built-in rules on the transformer and ResNet blocks: ATen ops -> kernels, and time against eager
and Inductor, with autofusion both without and with the built-in rules.

    .venv/bin/python benchmarks/bench_rules.py [--rounds 15] [--batch N ...]

Method (as bench_fusion.py, simplified): one process, fp32, torch.no_grad(); each contender warms up 5
calls; then in each round every contender, in an order that rotates per round, runs `calls` times and
the mean per call is kept; the figure is the median over rounds. Results are checked against eager
first. "ATen ops" counts the calls torch.export recorded (`stats["lowered"]` plus fallbacks);
"kernels" is the plan's launches (fused kernels, library calls and views run on their own), and
"compute" leaves the views out.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

import autofusion
from autofusion.plan.schedule import NO_TRAFFIC, OpStep
from autofusion.passes.rewrite import all_rules



RULES_ON = frozenset(r.name for r in all_rules((), True) if r.name != "linear_gelu")

def _time(fns: dict[str, Callable[[], Any]], rounds: int, calls: int) -> dict[str, float]:
    for f in fns.values():
        for _ in range(5):
            f()
    samples: dict[str, list[float]] = {k: [] for k in fns}
    names = list(fns)
    for r in range(rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        for k in order:
            f = fns[k]
            f()  # lead-in: wake the thread pool
            t = time.perf_counter()
            for _ in range(calls):
                f()
            samples[k].append((time.perf_counter() - t) / calls * 1e3)
    return {k: statistics.median(v) for k, v in samples.items()}


def _counts(cm: autofusion.CompiledModel) -> tuple[int, int, int]:
    st = cm.stats
    aten = sum(st["lowered"].values()) + sum(st["fallbacks"].values())
    plan = cm.last.program.plan  # type: ignore[union-attr]
    compute = len(plan.kernels) + sum(
        1
        for s in plan.steps
        if isinstance(s, OpStep) and s.node.op not in NO_TRAFFIC and s.node.op != "const"
    )
    return aten, st["kernels"], compute


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--batch", type=int, nargs="+", default=[2, 32])
    args = ap.parse_args()
    print(
        "| model | batch | ATen ops | kernels no rules (compute) | kernels rules (compute) | eager ms "
        "| inductor ms | af no rules ms | af rules ms | rules vs eager | rules vs inductor | rules applied |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for name in ("transformer-block", "resnet-block"):
        for batch in args.batch:
            model, inputs = autofusion.builtin(name, batch=batch)
            with torch.no_grad():
                ref = model(*inputs)
                plain = autofusion.compile(model, inputs, builtin_rules=False)
                # The built-in rules ship off on the CPU profile (classify_rule.yaml); this column
                # switches every one on but linear_gelu, as they shipped when the table was first made.
                ruled = autofusion.compile(model, inputs, enabled_rules=RULES_ON)
                torch._dynamo.reset()
                ind = torch.compile(model)
                for f in (plain, ruled, ind):
                    torch.testing.assert_close(f(*inputs), ref, rtol=1e-4, atol=1e-5)
                aten, k0, c0 = _counts(plain)
                _, k1, c1 = _counts(ruled)
                calls = 20 if name == "resnet-block" and batch > 8 else 50
                t = _time(
                    {
                        "eager": lambda m=model, i=inputs: m(*i),
                        "inductor": lambda m=ind, i=inputs: m(*i),
                        "plain": lambda m=plain, i=inputs: m(*i),
                        "rules": lambda m=ruled, i=inputs: m(*i),
                    },
                    args.rounds,
                    calls,
                )
            print(
                f"| {name} | {batch} | {aten} | {k0} ({c0}) | {k1} ({c1}) | {t['eager']:.3f} "
                f"| {t['inductor']:.3f} | {t['plain']:.3f} | {t['rules']:.3f} "
                f"| {t['eager'] / t['rules']:.2f}x "
                f"| {t['inductor'] / t['rules']:.2f}x "
                f"| {', '.join(f'{k} x{v}' for k, v in ruled.stats['rules'].items())} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
