"""How long fusion planning takes on big synthetic graphs (the cycle check must not be quadratic).

    .venv/bin/python benchmarks/bench_planner.py [--nodes 100000]

Builds an IR graph of N nodes: repeated blocks of elementwise chains, a row reduction with its
broadcast epilogue (softmax-like), a diamond and an extern (library) call that every candidate pair
around it must route its cycle check through. Prints planning time, kernels and decisions.
"""

from __future__ import annotations

import argparse
import time

from autofusion.config import Options
from autofusion.hw.profile import load_profile
from autofusion.ir import DType, GraphBuilder, TensorType
from autofusion.ir.printer import Arg
from autofusion.compiler import plan_graph


def synthetic(n_nodes: int, rows: int = 64, cols: int = 256):
    t = TensorType(DType.float32, (rows, cols))
    b = GraphBuilder("synthetic")
    x = b.add_input(t, "x")
    v = x
    while b.mark()[0] < n_nodes:
        a = b.add("exp", [v])
        c = b.add("mul", [a, v])
        d = b.add("sigmoid", [c])
        m = b.add("amax", [d], {"dims": (1,), "keepdim": True})
        e = b.add("sub", [d, m])
        s = b.add("sum", [e], {"dims": (1,), "keepdim": True})
        f = b.add("div", [e, s])
        g = b.add("tanh", [f])
        h = b.add("add", [g, f])  # diamond
        ext = b.add_node("extern", [h], {"target": "aten.cumsum.default", "args": (Arg(0), 1), "kwargs": (),
                                          "out_types": (t,)})[0]  # fmt: skip
        v = b.add("add", [ext, h])  # h reaches here directly and through the extern: a cycle candidate
    return b.build([v])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=100_000)
    args = ap.parse_args()
    t0 = time.perf_counter()
    graph = synthetic(args.nodes)
    t1 = time.perf_counter()
    plan = plan_graph(graph, Options.from_env(verify=False), load_profile("cpu", measure=False))
    t2 = time.perf_counter()
    rejected = sum(1 for d in plan.decisions if not d.accepted)
    cycles = sum(1 for d in plan.decisions if d.code == "NF1002")
    print(f"{len(graph.nodes)} nodes built in {t1 - t0:.2f} s; planned in {t2 - t1:.2f} s: "
          f"{len(plan.kernels)} kernels, {len(plan.steps)} steps, {len(plan.decisions)} decisions "
          f"({rejected} rejected, {cycles} NF1002 cycles)")  # fmt: skip


if __name__ == "__main__":
    main()
