"""Shapes that change: one small transformer block called with 20 (batch, sequence) shapes through
`torch.compile(model, backend="autofusion")` with its defaults (dynamic=None; `--dynamic true` for
dynamic=True), against a static compile of each shape by both routes (`autofusion.compile(model, [x])`,
and `torch.compile(..., dynamic=False)` of that one shape) and eager PyTorch.

What it reports: how many graphs Dynamo handed the backend and how many of them run eagerly; the
compiles the dynamic route made, counted by the compiler itself (`compiler.COUNTS`): planner runs
(every `compile_graph` call: a symbolic plan, a fresh compile a failed check asks for, a signature
planned for itself) and kernel libraries built by the C++ compiler, loaded from the disk cache, or
shared with a program of the same source; how many signatures were instantiations of a plan (reused,
and of those how many of a plan another Dynamo graph made), how many were results checks (a plan's
first other size run once against the reference interpreter: a run, not a plan), how long each
instantiation took; how many distinct kernel libraries the programs use (one loop structure renders
one C++ source); the first call of each shape and how it was served ("graph+": a new Dynamo graph,
then "plan": a planner run, "check": an instantiation with its results check, "reuse": an
instantiation), and per shape the per-call median of
the four routes with the ratio of the dynamic route to each static compile: against `torch.compile`
static it is the cost of changing shapes (both pay Dynamo's own per-call overhead: its frame hook,
guards and argument gathering), against `autofusion.compile` it includes Dynamo's overhead too.
Every result is checked against eager first.

Timing: all routes live in one process; in each round every route takes one turn per shape, in an
order that rotates from round to round, so machine noise hits all alike; figures are medians.
`--clock thread` times this thread's CPU time instead of wall time: on a loaded machine, with
OMP_NUM_THREADS=1 (the kernels' work then runs on this thread), it leaves out time spent descheduled.

`--model bert`: the zoo's BERT (benchmarks/zoo.py) on token ids, batch 1..8 at sequence 128 and
batch 2 at sequences 32..96; `--no-static` leaves out the two static routes (a plan per shape each).

    .venv/bin/python benchmarks/bench_dynamic.py [--model block|bert] [--rounds N] [--reps N]
        [--dynamic none|true] [--clock wall|thread] [--no-static] [--no-reuse] [--json out.json]
"""

from __future__ import annotations

import argparse
import copy
import json
import logging
import statistics
import time
import types
from collections.abc import Callable
from typing import Any

import torch

import autofusion
from autofusion import compiler
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


def own_code(model: torch.nn.Module) -> torch.nn.Module:
    """`model` (its parameters shared) as an instance of a subclass whose forward has a code object of
    its own."""
    cls, f = type(model), type(model).forward
    forward = types.FunctionType(
        f.__code__.replace(), f.__globals__, f.__name__, f.__defaults__, f.__closure__
    )
    twin = copy.copy(model)
    twin.__class__ = type(cls.__name__, (cls,), {"forward": forward})
    return twin


def per_call_us(fn: Callable[[], Any], reps: int, clock: Callable[[], float] = time.perf_counter) -> float:
    t0 = clock()
    for _ in range(reps):
        fn()
    return (clock() - t0) / reps * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=15, help="timed rounds (median over them)")
    ap.add_argument("--reps", type=int, default=50, help="calls per timed sample")
    ap.add_argument("--dynamic", choices=("none", "true"), default="none", help="torch.compile's dynamic=")
    ap.add_argument(
        "--clock",
        choices=("wall", "thread"),
        default="wall",
        help="wall time, or this thread's CPU time (with OMP_NUM_THREADS=1 on a loaded machine)",
    )
    ap.add_argument("--model", choices=("block", "bert"), default="block")
    ap.add_argument("--no-static", action="store_true", help="time eager and the dynamic route only")
    ap.add_argument("--no-reuse", action="store_true",
                    help="plan_reuse=False: each signature of the dynamic route planned for itself")
    ap.add_argument("--json", help="write the figures here too")
    args = ap.parse_args()
    clock = time.perf_counter if args.clock == "wall" else time.thread_time
    logging.getLogger("autofusion").setLevel(logging.WARNING)
    torch.manual_seed(0)
    if args.model == "bert":
        import zoo  # benchmarks/zoo.py, beside this file

        model, _ = zoo.build("bert")
        shapes = [(b, zoo.SEQ) for b in range(1, 9)] + [(2, t) for t in (32, 64, 96)]
        vocab = model.model.config.vocab_size
        inputs = {s: torch.randint(0, vocab, s) for s in shapes}
        tol = {"rtol": 1e-3, "atol": 1e-3}
    else:
        model, shapes = Block().eval(), SHAPES
        inputs = {s: torch.randn(*s, D_MODEL) for s in shapes}
        tol = {"rtol": 1e-4, "atol": 1e-5}
    static_routes = not args.no_static

    graphs: list[Any] = []

    def backend(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        fn = autofusion_backend(gm, example_inputs, options={"plan_reuse": not args.no_reuse})
        graphs.append(fn)
        return fn

    static_graphs: list[Any] = []

    def static_backend(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        # plan_reuse off: a plan of this one shape (with it on, the static graph would be planned
        # symbolically and share the dynamic route's plans).
        fn = autofusion_backend(gm, example_inputs, options={"plan_reuse": False})
        static_graphs.append(fn)
        return fn

    torch._dynamo.reset()
    dynamic = torch.compile(model, backend=backend, dynamic={"none": None, "true": True}[args.dynamic])
    first_ms: dict[tuple[int, int], float] = {}
    served: dict[tuple[int, int], str] = {}
    static: dict[tuple[int, int], Any] = {}
    with torch.no_grad():
        compiles = dict.fromkeys(compiler.COUNTS, 0)  # the dynamic route's
        for s, x in inputs.items():
            before = (len(graphs), *_reuse_counts(graphs))
            counts = dict(compiler.COUNTS)
            t0 = time.perf_counter()
            out = dynamic(x)
            first_ms[s] = (time.perf_counter() - t0) * 1e3
            for k in compiles:
                compiles[k] += compiler.COUNTS[k] - counts[k]
            after = (len(graphs), *_reuse_counts(graphs))
            how = (
                "plan" if compiler.COUNTS["plans"] > counts["plans"] else "check" if after[4] > before[4]
                else "reuse" if after[2] > before[2] else "cached"
            )  # fmt: skip
            served[s] = ("graph+" if after[0] > before[0] else "") + how
            torch.testing.assert_close(out, model(x), **tol)
            if static_routes:
                static[s] = autofusion.compile(model, [x])
                torch.testing.assert_close(static[s](x), model(x), **tol)
        # A static torch.compile of each shape, each of a model of its own code object: Dynamo keeps its
        # graphs and its record of the sizes seen per code object, so the static compiles neither share
        # guard lookups with the dynamic route nor teach it which dims change.
        tc_static: dict[tuple[int, int], Any] = {}
        for s, x in inputs.items() if static_routes else ():
            tc_static[s] = torch.compile(own_code(model), backend=static_backend, dynamic=False)
            torch.testing.assert_close(tc_static[s](x), model(x), **tol)
        assert len(static_graphs) == (len(shapes) if static_routes else 0), (
            f"{len(static_graphs)} static graphs"
        )
        assert not any(isinstance(g, Specialized) for g in static_graphs)

        eager_graphs = sum(1 for g in graphs if g.autofusion_graph is None)
        plans: list[CompiledGraph] = []
        for g in graphs:
            if isinstance(g, Specialized):
                plans += [e for e in g.cache.values() if isinstance(e, CompiledGraph)]
            elif g.autofusion_graph is not None:
                plans.append(g.autofusion_graph)
        libraries = len({p.program.source for p in plans if p.program is not None and p.program.source})
        made, reused, others, checked, _ = _reuse_counts(graphs)
        symbolic_sigs = sum(g.cache.planned for g in graphs if isinstance(g, Specialized))
        inst_ms = [t * 1e3 for g in graphs if isinstance(g, Specialized) for t in g.instantiation_s]

        routes: dict[str, Callable[[tuple[int, int]], Callable[[], Any]]] = {
            "eager": lambda s: lambda: model(inputs[s]),
            "static": lambda s: lambda: static[s](inputs[s]),
            "tc_static": lambda s: lambda: tc_static[s](inputs[s]),
            "dynamic": lambda s: lambda: dynamic(inputs[s]),
        }
        if not static_routes:
            del routes["static"], routes["tc_static"]
        samples: dict[tuple[str, tuple[int, int]], list[float]] = {(r, s): [] for r in routes for s in shapes}
        names = list(routes)
        for rnd in range(args.rounds):
            order = names[rnd % len(names) :] + names[: rnd % len(names)]
            for s in shapes:
                for r in order:
                    fn = routes[r](s)
                    fn()  # warm the hot path of this shape
                    samples[(r, s)].append(per_call_us(fn, args.reps, clock))

    med = {k: statistics.median(v) for k, v in samples.items()}
    print(f"{args.model}, torch.compile(dynamic={args.dynamic.capitalize()}): Dynamo graphs (handed to the "
          f"backend): {len(graphs)}; run eagerly: {eager_graphs}")  # fmt: skip
    print(f"compiles of the dynamic route: {compiles['plans']} planner runs; kernel libraries: "
          f"{compiles['builds']} built by the C++ compiler, {compiles['disk_loads']} loaded from the disk "
          f"cache, {compiles['shared_libraries']} shared with a program of the same source")  # fmt: skip
    print(f"programs: {len(plans)} ({symbolic_sigs} signatures planned symbolically); plans made for them: "
          f"{made}; instantiated from a plan: {reused} ({others} of a plan another Dynamo graph made; "
          f"{checked} results checks); distinct kernel libraries: {libraries}")  # fmt: skip
    if inst_ms:
        print(f"instantiation: median {statistics.median(inst_ms):.1f} ms, range {min(inst_ms):.1f}-"
              f"{max(inst_ms):.1f} ({len(inst_ms)} programs)")  # fmt: skip
    nan = float("nan")
    print(f"{'batch':>5} {'seq':>4} {'served':>6} {'first ms':>9} {'eager us':>9} {'static us':>10} "
          f"{'tc static us':>13} {'dynamic us':>11} {'dyn/static':>10} {'dyn/tc':>7}")  # fmt: skip
    rows = []
    for s in shapes:
        e, dy = med[("eager", s)], med[("dynamic", s)]
        st, tc = med.get(("static", s), nan), med.get(("tc_static", s), nan)
        rows.append({"batch": s[0], "seq": s[1], "served": served[s], "first_ms": first_ms[s], "eager_us": e,
                     "static_us": st, "tc_static_us": tc, "dynamic_us": dy, "ratio": dy / st,
                     "ratio_tc": dy / tc})  # fmt: skip
        print(f"{s[0]:>5} {s[1]:>4} {served[s]:>6} {first_ms[s]:>9.1f} {e:>9.1f} {st:>10.1f} {tc:>13.1f} "
              f"{dy:>11.1f} {dy / st:>10.3f} {dy / tc:>7.3f}")  # fmt: skip
    firsts = [r["first_ms"] for r in rows if r["served"] == "reuse"]
    firsts_graph = [r["first_ms"] for r in rows if r["served"] in ("graph+reuse", "graph+check")]
    if firsts_graph:
        listed = ", ".join(f"{t:.1f}" for t in firsts_graph)
        print(f"first call of a new Dynamo graph served by reuse: {listed} ms (Dynamo's trace and the "
              "symbolic capture included)")  # fmt: skip
    if firsts:
        print(f"first call of a shape served by reuse: median {statistics.median(firsts):.1f} ms, "
              f"range {min(firsts):.1f}-{max(firsts):.1f} ({len(firsts)} shapes)")  # fmt: skip
    for label, key in (("autofusion.compile static", "ratio"), ("torch.compile static", "ratio_tc")):
        if not static_routes:
            break
        ratios = [r[key] for r in rows]
        print(f"dynamic / {label} per call: median {statistics.median(ratios):.3f}, "
              f"range {min(ratios):.3f}-{max(ratios):.3f}")  # fmt: skip
    print(f"({args.rounds} rounds x {args.reps} calls; medians; {args.clock} clock)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"model": args.model, "dynamic": args.dynamic, "clock": args.clock,
                       "dynamo_graphs": len(graphs), "eager_graphs": eager_graphs, "compiles": compiles,
                       "programs": len(plans), "plans_made": made, "reused": reused,
                       "reused_across_graphs": others, "checks": checked, "instantiation_ms": inst_ms,
                       "libraries": libraries, "rows": rows},
                      f, indent=1)  # fmt: skip


def _reuse_counts(graphs: list[Any]) -> tuple[int, int, int, int, int]:
    """Over the symbolic graphs so far: planner runs for them (a signature captured for itself where
    reuse was tried counts as one), programs instantiated from a plan, those of a plan another graph
    made, results checks, and signatures."""
    made = reused = others = checked = signatures = 0
    for g in graphs:
        if isinstance(g, Specialized):
            signatures += g.cache.planned
            st = g.autofusion_stats()
            pr = st.get("plan_reuse", {})
            made += pr.get("planned", 0) + sum(st["dynamo_symbolic"]["captured_for_themselves"].values())
            reused += pr.get("reused", 0)
            others += pr.get("from_other_graphs", 0)
            checked += pr.get("checked", 0)
    return made, reused, others, checked, signatures


if __name__ == "__main__":
    main()
