"""SuperKernel benchmark: per-call time where dispatch, not arithmetic, is the cost.

Cases: 20 elementwise ops on a [64] tensor (one fused kernel); the same 20 ops with two reductions
in between on [64] (three kernels); the `transformer-block` built-in at batch 1, seq 16 (kernels,
linear layers, bmm and views). Contenders, all in one process under torch.no_grad():

    eager          the model as written
    inductor       torch.compile(model) (Inductor, default mode)
    ort            ONNX Runtime on torch.onnx.export's model (TorchScript exporter), sess.run
    af-kernel      autofusion.compile(..., super_kernel="off"): one ctypes call per kernel from Python
    af-super       autofusion.compile(..., super_kernel="on"): one C++ entry per SuperKernel
    af-dynamo      torch.compile(model, backend="autofusion") with SuperKernel on
    dynamo-floor   torch.compile(model, backend=B) where B computes nothing: it returns the outputs it
                   computed once at compile time. What any torch.compile backend pays per call (guards,
                   frame evaluation, wrappers) before doing any work: the floor under af-dynamo and
                   Inductor alike.

Method: each sample times a batch of calls (`--inner`); in each round every contender takes one
sample, in an order that rotates from round to round, so noise from other processes on this shared
machine hits all alike; before each sample the process settles (idle thread pools) and the
contender runs untimed for 20 ms (bench_fusion.py's `settle` and `lead_in`). Figures are medians over rounds, in microseconds per call; the spread column
is the interquartile range of af-super. "dynamo cost" is af-dynamo minus af-super: what Dynamo's
guards and frame evaluation add in front of the same compiled call.

    .venv/bin/python benchmarks/bench_superkernel.py [--rounds N] [--inner N] [--threads N] [--json out.json]
"""

from __future__ import annotations

import argparse
import datetime
import io
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
from rich.console import Console
from rich.table import Table

import autofusion

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_fusion import CHAIN20, apply_chain, lead_in, machine, settle  # noqa: E402  (shared with bench_fusion)

try:
    import onnxruntime as ort

    ORT_ERROR = ""
except ImportError as e:  # optional: pip install -e '.[bench]'
    ORT_ERROR = f"onnxruntime not importable ({e})"

CONTENDERS = ("eager", "inductor", "ort", "af-kernel", "af-super", "af-dynamo", "dynamo-floor")


def _floor_backend(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Callable[..., Any]:
    """A torch.compile backend that does no work per call (see dynamo-floor above)."""
    with torch.no_grad():
        cached = gm(*example_inputs)
    return lambda *args: cached


class Chain20(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return apply_chain(CHAIN20, {"x": x})


class Chain20Reduce(torch.nn.Module):
    """The same 20 ops with a mean and a row max in between: three fused kernels (the reshape of a
    computed value ends a kernel)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = apply_chain(CHAIN20[:7], {"x": x})
        b = apply_chain(CHAIN20[7:14], {"x": a - a.mean()}).reshape(8, 8)
        c = b / b.amax(-1, keepdim=True)
        return apply_chain(CHAIN20[14:], {"x": c}).reshape(64)


def cases() -> list[tuple[str, torch.nn.Module, list[torch.Tensor]]]:
    g = torch.Generator().manual_seed(0)
    tb, tb_inputs = autofusion.builtin("transformer-block", batch=1, seq=16)
    return [
        ("chain20 [64]", Chain20(), [torch.randn(64, generator=g)]),
        ("chain20+2 reductions [64]", Chain20Reduce(), [torch.randn(64, generator=g)]),
        ("transformer-block b1 s16", tb, list(tb_inputs)),
    ]


def ort_call(model: torch.nn.Module, inputs: list[torch.Tensor]) -> Callable[[], Any] | str:
    if ORT_ERROR:
        return ORT_ERROR
    buf = io.BytesIO()
    try:
        torch.onnx.export(model, tuple(inputs), buf, dynamo=False, opset_version=18)
    except Exception as e:  # noqa: BLE001 - reported in the table instead of the figure
        return f"export failed: {type(e).__name__}: {e}"
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = torch.get_num_threads()
    sess = ort.InferenceSession(buf.getvalue(), opts, providers=["CPUExecutionProvider"])
    names = [i.name for i in sess.get_inputs()]
    feeds = {n: t.numpy() for n, t in zip(names, inputs)}
    return lambda: sess.run(None, feeds)


def contenders(model: torch.nn.Module, inputs: list[torch.Tensor]) -> tuple[dict[str, Callable[[], Any]], dict[str, Any]]:
    calls: dict[str, Callable[[], Any]] = {}
    notes: dict[str, Any] = {}
    calls["eager"] = lambda: model(*inputs)
    inductor = torch.compile(model)
    calls["inductor"] = lambda: inductor(*inputs)
    o = ort_call(model, inputs)
    if isinstance(o, str):
        notes["ort"] = o
    else:
        calls["ort"] = o
    kernel = autofusion.compile(model, inputs, super_kernel="off")
    calls["af-kernel"] = lambda: kernel(*inputs)
    sup = autofusion.compile(model, inputs, super_kernel="on")
    calls["af-super"] = lambda: sup(*inputs)
    dyn = torch.compile(model, backend="autofusion", options={"super_kernel": "on"})
    calls["af-dynamo"] = lambda: dyn(*inputs)
    floor = torch.compile(model, backend=_floor_backend)
    calls["dynamo-floor"] = lambda: floor(*inputs)
    notes["kernels"] = sup.stats.get("fused_kernels")
    notes["super"] = sup.stats.get("super_kernel")
    ref = model(*inputs)
    for name, f in calls.items():
        out = f()
        got = torch.from_numpy(out[0]) if name == "ort" else out
        notes[f"check {name}"] = "ok" if torch.allclose(got.float(), ref.float(), rtol=1e-4, atol=1e-5) else "DIFF"
    return calls, notes


def time_case(calls: dict[str, Callable[[], Any]], rounds: int, inner: int) -> dict[str, list[float]]:
    samples: dict[str, list[float]] = {k: [] for k in calls}
    names = list(calls)
    for f in calls.values():  # warm-up: compiles, caches, first-touch of pools
        for _ in range(max(10, inner // 10)):
            f()
    for r in range(rounds):
        for name in names[r % len(names):] + names[: r % len(names)]:
            f = calls[name]
            settle()  # thread pools (ORT's, OpenMP's) spin after a call and would slow the next contender
            lead_in(f, 0.02)
            t = time.perf_counter()
            for _ in range(inner):
                f()
            samples[name].append((time.perf_counter() - t) / inner * 1e6)
    return samples


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--inner", type=int, default=200)
    ap.add_argument("--json", help="write the raw results here")
    ap.add_argument("--threads", type=int, default=0,
                    help="torch/OpenMP and ORT threads (0: torch's default). On a shared, loaded machine 1 "
                         "keeps spinning thread pools from dominating the figures")  # fmt: skip
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    console = Console(width=200)
    info = machine()
    console.print(f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, torch {info['torch']}, "
                  f"{info.get('cpu', '')}, threads {torch.get_num_threads()}; medians of {args.rounds} rounds "
                  f"x {args.inner} calls, us/call")  # fmt: skip
    table = Table()
    for col in ("case", *CONTENDERS, "af-super IQR", "dynamo cost", "super/kernel", "kernels", "entries", "check"):
        table.add_column(col, justify="left" if col in ("case", "check") else "right")
    results: dict[str, Any] = {"machine": info, "rounds": args.rounds, "inner": args.inner, "cases": {}}
    with torch.no_grad():
        for name, model, inputs in cases():
            calls, notes = contenders(model, inputs)
            samples = time_case(calls, args.rounds, args.inner)
            med = {k: statistics.median(v) for k, v in samples.items()}
            q = statistics.quantiles(samples["af-super"], n=4)
            checks = {k.removeprefix("check "): v for k, v in notes.items() if k.startswith("check ")}
            bad = [k for k, v in checks.items() if v != "ok"]
            sk = notes["super"] or {}
            table.add_row(
                name, *(f"{med[c]:.1f}" if c in med else "n/a" for c in CONTENDERS), f"{q[2] - q[0]:.1f}",
                f"{med['af-dynamo'] - med['af-super']:.1f}", f"{med['af-super'] / med['af-kernel']:.2f}",
                str(notes["kernels"]), str(sk.get("entries", "-")), "ok" if not bad else "DIFF: " + ", ".join(bad),
            )  # fmt: skip
            results["cases"][name] = {"median_us": med, "samples_us": samples, "notes": {k: str(v) for k, v in notes.items()}}
    console.print(table)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
