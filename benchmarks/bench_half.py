"""Half-precision elementwise and row kernels: per-element cost of fp32, fp16 and bf16 against eager
PyTorch and Inductor, and an A/B of the generated kernels against an earlier af_math.h.

Everything runs in one process, rounds alternate between the contenders in a rotating order, and each
figure is a median (ns per element). `--before REV` builds a second autofusion contender with the
af_math.h of git revision REV and the store encoding of that time (every half store rounds), so the
change of the half conversions is measured in the same process against the same inputs. `--threads`
sets torch's and the generated kernels' thread count (1 by default: on a shared machine a second
thread mostly measures the neighbours).

    .venv/bin/python benchmarks/bench_half.py [--before REV] [--inductor] [--rounds N] [--only CASE ...]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

import autofusion
from autofusion.codegen.cpp import render, staging

ROOT = Path(__file__).resolve().parents[1]
N = 1_000_003  # odd, above the parallel threshold
ROWS, COLS = 1001, 1003  # odd row count and row length, about 1M elements


class Add(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x + y


class MulAdd(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return (x * 1.5 + y) * 0.5 + x


class Gelu(torch.nn.Module):
    def __init__(self, approximate: str) -> None:
        super().__init__()
        self.approximate = approximate

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.gelu(x + y, approximate=self.approximate)  # a lone gelu is one op: nothing to fuse


class Softmax(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x, dim=-1)


class LayerNorm(torch.nn.Module):
    def __init__(self, dtype: torch.dtype) -> None:
        super().__init__()
        self.ln = torch.nn.LayerNorm(COLS, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ln(x)


def cases(dtype: torch.dtype) -> dict[str, tuple[torch.nn.Module, list[torch.Tensor]]]:
    g = torch.Generator().manual_seed(0)

    def flat() -> torch.Tensor:
        return torch.randn(N, generator=g).to(dtype)

    def rows() -> torch.Tensor:
        return torch.randn(ROWS, COLS, generator=g).to(dtype)

    return {
        "add": (Add(), [flat(), flat()]),
        "mul_add_chain": (MulAdd(), [flat(), flat()]),
        "gelu_erf": (Gelu("none"), [flat(), flat()]),
        "gelu_tanh": (Gelu("tanh"), [flat(), flat()]),
        "softmax": (Softmax(), [rows()]),
        "layernorm": (LayerNorm(dtype).eval(), [rows()]),
    }


def old_header(rev: str) -> str:
    path = "src/autofusion/codegen/cpp/af_math.h"
    return subprocess.run(["git", "show", f"{rev}:{path}"], cwd=ROOT, capture_output=True, text=True,
                          check=True).stdout  # fmt: skip


def compile_af(model: torch.nn.Module, inputs: list[torch.Tensor], threads: int, header: str | None) -> Any:
    """autofusion.compile; when `header` is given, with it as af_math.h, every half store rounding,
    nothing staged and no row-invariant hoisting (the renderer of that time)."""
    saved = render.math_header, render._half_exact, render._row_invariant, staging.plan, staging.contiguous_loads
    if header is not None:
        render.math_header = lambda: header
        render._half_exact = lambda k, dt: set()
        render._row_invariant = lambda stage, known: []
        staging.plan = lambda *a, **kw: None
        staging.contiguous_loads = lambda *a, **kw: {}
    try:
        cm = autofusion.compile(model, inputs, kernel_threads=threads)
        cm(*inputs)
    finally:
        (render.math_header, render._half_exact, render._row_invariant, staging.plan,
         staging.contiguous_loads) = saved  # fmt: skip
    assert "build_error" not in cm.stats and cm.stats.get("generated_calls", 0) > 0, cm.stats
    return cm


def time_once(f: Callable[[], Any], inner: int) -> float:
    t0 = time.perf_counter()
    for _ in range(inner):
        f()
    return (time.perf_counter() - t0) / inner


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--before", default="", help="git revision whose af_math.h the 'before' contender uses")
    ap.add_argument("--inductor", action="store_true", help="also time torch.compile (Inductor)")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--dtypes", nargs="*", default=["fp32", "fp16", "bf16"])
    ap.add_argument("--only", nargs="*", default=[])
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    header = old_header(args.before) if args.before else None
    dtypes = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
    results: dict[str, dict[str, float]] = {}
    for dname in args.dtypes:
        for name, (model, inputs) in cases(dtypes[dname]).items():
            if args.only and name not in args.only:
                continue
            with torch.no_grad():
                ref = model(*inputs)
                fns: dict[str, Callable[[], Any]] = {"eager": lambda m=model, i=inputs: m(*i)}
                after = compile_af(model, inputs, args.threads, None)
                fns["af"] = lambda c=after, i=inputs: c(*i)
                if header is not None:
                    before = compile_af(model, inputs, args.threads, header)
                    fns["af_before"] = lambda c=before, i=inputs: c(*i)
                if args.inductor:
                    ind = torch.compile(model)
                    ind(*inputs)
                    fns["inductor"] = lambda c=ind, i=inputs: c(*i)
                for k, f in fns.items():  # every contender agrees with eager (half: to its rounding)
                    tol = 1e-5 if dname == "fp32" else 2e-2
                    torch.testing.assert_close(f(), ref, rtol=tol, atol=tol, msg=lambda m, k=k: f"{k}: {m}")
                inner = max(1, int(0.02 / max(time_once(fns["eager"], 1), 1e-6)))
                samples: dict[str, list[float]] = {k: [] for k in fns}
                names = list(fns)
                for r in range(args.rounds):
                    for k in names[r % len(names) :] + names[: r % len(names)]:
                        fns[k]()
                        samples[k].append(time_once(fns[k], inner))
            n = inputs[0].numel()
            med = {k: statistics.median(v) * 1e9 / n for k, v in samples.items()}
            results[f"{dname}/{name}"] = med
            line = "  ".join(f"{k} {v:7.3f}" for k, v in med.items())
            print(f"{dname:5s} {name:14s} ns/elem: {line}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
