"""Shapes that change: one small transformer block called with 20 (batch, sequence) shapes through
`torch.compile(model, backend="autofusion")` with its defaults (dynamic=None), against a static
`autofusion.compile(model, [x])` of each shape and eager PyTorch.

What it reports: how many graphs Dynamo handed the backend ("compiles") and how many of them run
eagerly, how many signatures autofusion planned and how many distinct kernel libraries those plans
built (plans of one loop structure render one C++ source), the first call of each shape (capture and
plan; the build is shared), and per shape the per-call median of the three routes with the ratio of
the dynamic route to the static compile. Every result is checked against eager first.

Timing: all routes live in one process; in each round every route takes one turn per shape, in an
order that rotates from round to round, so machine noise hits all alike; figures are medians.

    .venv/bin/python benchmarks/bench_dynamic.py [--rounds N] [--reps N] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

import autofusion
from autofusion.api import CompiledGraph
from autofusion.backend import Specialized, autofusion_backend

D_MODEL, HEADS = 64, 4
SHAPES = [(b, t) for b in (1, 2, 3, 4, 8) for t in (7, 16, 33, 64)]  # 20 (batch, seq) shapes


class Block(torch.nn.Module):
    def __init__(self, d: int = D_MODEL, heads: int = HEADS) -> None:
        super().__init__()
        self.ln1, self.ln2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
        self.att = torch.nn.MultiheadAttention(d, heads, batch_first=True)
        self.ff = torch.nn.Sequential(torch.nn.Linear(d, 4 * d), torch.nn.GELU(), torch.nn.Linear(4 * d, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.ln1(x)
        x = x + self.att(y, y, y, need_weights=False)[0]
        return x + self.ff(self.ln2(x))


def per_call_us(fn: Callable[[], Any], reps: int) -> float:
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t0) / reps * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=15, help="timed rounds (median over them)")
    ap.add_argument("--reps", type=int, default=50, help="calls per timed sample")
    ap.add_argument("--json", help="write the figures here too")
    args = ap.parse_args()
    logging.getLogger("autofusion").setLevel(logging.WARNING)
    torch.manual_seed(0)
    model = Block().eval()
    inputs = {s: torch.randn(*s, D_MODEL) for s in SHAPES}

    graphs: list[Any] = []

    def backend(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        fn = autofusion_backend(gm, example_inputs)
        graphs.append(fn)
        return fn

    torch._dynamo.reset()
    dynamic = torch.compile(model, backend=backend)  # the defaults: dynamic=None
    first_ms: dict[tuple[int, int], float] = {}
    static: dict[tuple[int, int], Any] = {}
    with torch.no_grad():
        for s, x in inputs.items():
            t0 = time.perf_counter()
            out = dynamic(x)
            first_ms[s] = (time.perf_counter() - t0) * 1e3
            torch.testing.assert_close(out, model(x), rtol=1e-4, atol=1e-5)
            static[s] = autofusion.compile(model, [x])
            torch.testing.assert_close(static[s](x), model(x), rtol=1e-4, atol=1e-5)

        eager_graphs = sum(1 for g in graphs if g.autofusion_graph is None)
        plans: list[CompiledGraph] = []
        for g in graphs:
            if isinstance(g, Specialized):
                plans += [e for e in g.cache.values() if isinstance(e, CompiledGraph)]
            elif g.autofusion_graph is not None:
                plans.append(g.autofusion_graph)
        libraries = len({p.program.source for p in plans if p.program is not None and p.program.source})

        routes: dict[str, Callable[[tuple[int, int]], Callable[[], Any]]] = {
            "eager": lambda s: lambda: model(inputs[s]),
            "static": lambda s: lambda: static[s](inputs[s]),
            "dynamic": lambda s: lambda: dynamic(inputs[s]),
        }
        samples: dict[tuple[str, tuple[int, int]], list[float]] = {(r, s): [] for r in routes for s in SHAPES}
        names = list(routes)
        for rnd in range(args.rounds):
            order = names[rnd % len(names) :] + names[: rnd % len(names)]
            for s in SHAPES:
                for r in order:
                    fn = routes[r](s)
                    fn()  # warm the hot path of this shape
                    samples[(r, s)].append(per_call_us(fn, args.reps))

    med = {k: statistics.median(v) for k, v in samples.items()}
    print(f"Dynamo compiles (graphs handed to the backend): {len(graphs)}; run eagerly: {eager_graphs}")
    print(f"signatures planned: {len(plans)}; distinct kernel libraries: {libraries}")
    print(f"{'batch':>5} {'seq':>4} {'first ms':>9} {'eager us':>9} {'static us':>10} {'dynamic us':>11} "
          f"{'dyn/static':>10}")  # fmt: skip
    rows = []
    for s in SHAPES:
        e, st, dy = med[("eager", s)], med[("static", s)], med[("dynamic", s)]
        rows.append({"batch": s[0], "seq": s[1], "first_ms": first_ms[s], "eager_us": e, "static_us": st,
                     "dynamic_us": dy, "ratio": dy / st})  # fmt: skip
        print(f"{s[0]:>5} {s[1]:>4} {first_ms[s]:>9.1f} {e:>9.1f} {st:>10.1f} {dy:>11.1f} {dy / st:>10.3f}")
    ratios = [r["ratio"] for r in rows]
    print(f"dynamic/static per call: median {statistics.median(ratios):.3f}, worst {max(ratios):.3f} "
          f"({args.rounds} rounds x {args.reps} calls; medians)")  # fmt: skip
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"compiles": len(graphs), "eager_graphs": eager_graphs, "plans": len(plans),
                       "libraries": libraries, "rows": rows}, f, indent=1)  # fmt: skip


if __name__ == "__main__":
    main()
