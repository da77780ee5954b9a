"""Per-call cost of the steady-state call path against the general one, in one process, alternating.

A compiled zoo model (benchmarks/zoo.py) is called two ways on the same inputs, one after the other,
`--reps` times: "general" looks every parameter up on its own (`LiveTensor.get`) and runs the
executor's `run` (the fold check over every folded source, every pointer slot written, the oneDNN
handles' parameter check); "steady" is the compiled model's call (one generated lookup, one
`runtime.stamp.Stamp`, the executor's `steady` run skipping that work while nothing changed). Both
give the same result (checked). Medians of the calling thread's CPU time (`--clock wall` for wall
time): on a shared machine compare only within one run.

    python benchmarks/bench_call_path.py [--models llama_decode mobilenet_v2] [--reps 1000]
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import torch
import zoo

import autofusion

# mobilenet_v2 with its convolutions inside the entry (oneDNN members): the case with ~250 parameters
# behind the handles' check.
OPTIONS: dict[str, dict[str, Any]] = {"mobilenet_v2": {"super_kernel": "on", "conv_layout": "dnnl"}}


def _leaves(x: Any) -> list[torch.Tensor]:
    return list(x) if isinstance(x, (tuple, list)) else [x]


def measure(name: str, reps: int, clock: Any) -> tuple[float, float]:
    module, inputs = zoo.build(name, 1)
    cm = autofusion.compile(module, list(inputs), **OPTIONS.get(name, {}))
    for _ in range(5):
        cm(*inputs)
    cg = cm.compiled
    ex = cg.program.executor
    sources = cg.captured.sources

    def general() -> Any:
        args = [inputs[v] if kind == "user" else (v.get() if kind == "live" else v) for kind, v in sources]
        return ex.run(args)

    for a, b in zip(_leaves(general()), _leaves(cm(*inputs)), strict=True):
        assert torch.equal(a, b), f"{name}: the two paths disagree"
    ga: list[float] = []
    st: list[float] = []
    for _ in range(reps):
        t = clock()
        general()
        ga.append(clock() - t)
        t = clock()
        cm(*inputs)
        st.append(clock() - t)
    return statistics.median(ga) * 1e6, statistics.median(st) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["llama_decode", "mobilenet_v2"])
    ap.add_argument("--reps", type=int, default=1000)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--clock", choices=["cpu", "wall"], default="cpu")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    clock = time.thread_time if a.clock == "cpu" else time.perf_counter
    print(f"{'model':14} {'general us':>11} {'steady us':>10} {'saved us':>9}")
    with torch.no_grad():
        for name in a.models:
            g, s = measure(name, a.reps, clock)
            print(f"{name:14} {g:11.1f} {s:10.1f} {g - s:9.1f}")


if __name__ == "__main__":
    main()
