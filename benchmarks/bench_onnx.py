"""ONNX benchmark: onnxruntime vs autofusion (from the ONNX file and from the torch model) vs eager PyTorch.

The built-in `resnet-block` and `transformer-block` models, at their default size and at a larger one,
are exported with torch.onnx.export (TorchScript exporter, opset 17). Each contender runs in this one
process; in every round each takes one turn, in an order that rotates from round to round, so machine
noise hits all alike; figures are medians. As in bench_fusion.py, each turn first waits for the process
to go idle (`settle`: ONNX Runtime's pool spins ~40 ms after a call and slowed the next contender by
up to 100x on 2 cores) and then runs the contender untimed for 50 ms (`lead_in`). Every result is
checked against eager first.

    .venv/bin/python benchmarks/bench_onnx.py [--rounds N] [--json out.json] [--only NAME ...]

The machine this runs on may be shared: read the numbers as noisy, and compare within one run.
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from bench_fusion import lead_in, settle  # same directory: run as a script
from rich.console import Console
from rich.table import Table

import autofusion

try:
    import onnxruntime as ort

    ORT_ERROR = ""
except ImportError as e:  # optional: pip install -e '.[bench]'
    ORT_ERROR = f"onnxruntime not importable ({e})"

WARMUP = 5
THREADS = 0  # 0: each library's default; --threads sets torch's and onnxruntime's intra-op threads
RTOL = 1e-4


@dataclass
class Case:
    name: str
    builtin: str
    sizes: dict[str, int]
    times_ms: dict[str, float] = field(default_factory=dict)
    checks: dict[str, str] = field(default_factory=dict)
    stats: dict[str, Any] = field(default_factory=dict)
    compile_s: dict[str, float] = field(default_factory=dict)


CASES = [
    Case("resnet-block b2", "resnet-block", {"batch": 2}),
    Case("resnet-block b32", "resnet-block", {"batch": 32}),
    Case("transformer-block b2 s16", "transformer-block", {"batch": 2, "seq": 16}),
    Case("transformer-block b8 s128", "transformer-block", {"batch": 8, "seq": 128}),
]


def export(model: torch.nn.Module, inputs: tuple[torch.Tensor, ...]) -> bytes:
    buf = io.BytesIO()
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, inputs, buf, dynamo=False, opset_version=17)
    return buf.getvalue()


def rel_error(out: Any, ref: torch.Tensor) -> float:
    out = torch.as_tensor(out[0] if isinstance(out, list) else out)
    return float((out.double() - ref.double()).abs().max() / ref.double().abs().max().clamp_min(1e-30))


def contenders(case: Case) -> dict[str, Callable[[], Any]]:
    model, inputs = autofusion.builtin(case.builtin, **case.sizes)
    data = export(model, inputs)
    fns: dict[str, Callable[[], Any]] = {}

    def eager() -> Any:
        with torch.no_grad():
            return model(*inputs)

    fns["eager"] = eager
    if not ORT_ERROR:
        opts = ort.SessionOptions()
        opts.log_severity_level = 3
        if THREADS:
            opts.intra_op_num_threads = THREADS
        t = time.perf_counter()
        sess = ort.InferenceSession(data, opts, providers=["CPUExecutionProvider"])
        case.compile_s["onnxruntime"] = time.perf_counter() - t
        feeds = {i.name: x.numpy() for i, x in zip(sess.get_inputs(), inputs, strict=False)}
        fns["onnxruntime"] = lambda: sess.run(None, feeds)
    t = time.perf_counter()
    af_onnx = autofusion.compile(data)
    case.compile_s["autofusion (onnx)"] = time.perf_counter() - t
    fns["autofusion (onnx)"] = lambda: af_onnx(*inputs)
    t = time.perf_counter()
    with torch.no_grad():
        af_torch = autofusion.compile(model, inputs)
    case.compile_s["autofusion (torch)"] = time.perf_counter() - t
    fns["autofusion (torch)"] = lambda: af_torch(*inputs)
    case.stats = {
        k: af_onnx.stats.get(k) for k in ("ops", "kernels", "fused_kernels", "bytes_before", "bytes_after")
    }
    case.stats["torch kernels"] = af_torch.stats.get("kernels")
    ref = eager()
    for name, fn in fns.items():
        err = rel_error(fn(), ref)
        case.checks[name] = "ok" if err <= RTOL else f"rel err {err:.2g}"
    return fns


def time_case(case: Case, rounds: int) -> None:
    fns = contenders(case)
    names = list(fns)
    samples: dict[str, list[float]] = {n: [] for n in names}
    for n in names:
        for _ in range(WARMUP):
            fns[n]()
    for r in range(rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        for n in order:
            settle()
            lead_in(fns[n])
            t = time.perf_counter()
            fns[n]()
            samples[n].append((time.perf_counter() - t) * 1e3)
    case.times_ms = {n: statistics.median(s) for n, s in samples.items()}


def report(console: Console, cases: list[Case], rounds: int) -> None:
    names = list(cases[0].times_ms)
    table = Table(
        title=f"ONNX models: median ms of {rounds} rounds ({torch.get_num_threads()} torch threads)"
    )
    table.add_column("model", no_wrap=True)
    for n in names:
        table.add_column(n, justify="right")
    for col in ("af(onnx) vs ort", "af(onnx) vs eager", "kernels onnx/torch", "fused", "check"):
        table.add_column(col, justify="right")
    for c in cases:
        t = c.times_ms
        af = t["autofusion (onnx)"]
        vs_ort = f"{t['onnxruntime'] / af:.2f}x" if "onnxruntime" in t else "-"
        bad = [f"{k}: {v}" for k, v in c.checks.items() if v != "ok"]
        table.add_row(
            c.name,
            *(f"{t[n]:.3f}" for n in names),
            vs_ort,
            f"{t['eager'] / af:.2f}x",
            f"{c.stats['kernels']}/{c.stats['torch kernels']}",
            str(c.stats["fused_kernels"]),
            "ok" if not bad else "; ".join(bad),
        )
    console.print(table)
    if ORT_ERROR:
        console.print(f"[yellow]{ORT_ERROR}[/yellow]")
    console.print('"vs" above 1.00x means autofusion (from ONNX) is faster.')


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=50)
    p.add_argument("--json", metavar="PATH")
    p.add_argument("--only", nargs="+", metavar="NAME", help="cases whose name contains NAME")
    p.add_argument(
        "--threads",
        type=int,
        default=0,
        help="intra-op threads for torch (and so autofusion's "
        "OpenMP kernels) and onnxruntime; 0 keeps the defaults. On a loaded shared machine, 1 avoids "
        "OpenMP barriers waiting for a descheduled thread",
    )
    args = p.parse_args(argv)
    global THREADS
    THREADS = args.threads
    if args.threads:
        torch.set_num_threads(args.threads)
    cases = [c for c in CASES if not args.only or any(o in c.name for o in args.only)]
    console = Console(width=160)
    for c in cases:
        with console.status(f"{c.name} ..."):
            time_case(c, args.rounds)
    report(console, cases, args.rounds)
    if args.json:
        with open(args.json, "w") as f:
            json.dump([c.__dict__ for c in cases], f, indent=2)
    return 0 if all(v == "ok" for c in cases for v in c.checks.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
