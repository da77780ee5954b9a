"""Time to the first result at a new size: plan reuse (`autofusion.reuse`) against planning every size.

A zoo model (default BERT, 2 layers, hidden 768) compiled with `dynamic=` (batch and sequence) twice in
one process: with plan reuse (the default) and with `plan_reuse=False`. Both are compiled for the
first shape; then each new shape is called on both, the order alternating per shape, and the first
call's wall time (capture or instantiation, planning or reuse, build, the run) is reported with the
ratio, and the results compared (bit-identical where both took the same library routes; with
`--linear-route auto` each plan of its own measures routes for its own shapes, so they may differ
in rounding). An ONNX export of the model with symbolic axes is timed the same way (`--onnx`).

Caveat: a loaded machine moves wall times a lot; the ratio is what to read.

    .venv/bin/python benchmarks/bench_reuse.py [--model bert] [--onnx] [--linear-route auto|mkl|plain]
        [--json out.json]
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).parent))
import zoo  # noqa: E402

import autofusion  # noqa: E402

SHAPES = [(3, 128), (5, 77), (8, 128), (2, 64), (7, 200), (4, 33)]


def _onnx(model: torch.nn.Module, x: torch.Tensor) -> Any:
    import onnx

    buf = io.BytesIO()
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (x,), buf, dynamo=False, opset_version=17, input_names=["ids"],
                          output_names=["out"], dynamic_axes={"ids": {0: "batch", 1: "seq"}})  # fmt: skip
    return onnx.load_from_string(buf.getvalue())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="bert")
    ap.add_argument("--onnx", action="store_true", help="the model's ONNX export with symbolic axes")
    ap.add_argument("--linear-route", default="auto")
    ap.add_argument("--json")
    args = ap.parse_args()
    module, (ids,) = zoo.build(args.model, batch=2)
    first = ids[:, :128] if ids.shape[1] >= 128 else ids
    source: Any = _onnx(module, first) if args.onnx else module
    dyn = None if args.onnx else {0: {0: "batch", 1: "seq"}}
    models = {}
    with torch.no_grad():
        for mode in ("reuse", "plan each"):
            t0 = time.perf_counter()
            cm = autofusion.compile(source, dynamic=dyn, linear_route=args.linear_route,
                                    plan_reuse=mode == "reuse")  # fmt: skip
            cm(first)
            models[mode] = cm
            print(f"{mode}: first shape {tuple(first.shape)} {time.perf_counter() - t0:.2f} s", flush=True)
        rows = []
        for k, (b, s) in enumerate(SHAPES):
            x = torch.randint(0, 100, (b, s))
            order = ["reuse", "plan each"] if k % 2 == 0 else ["plan each", "reuse"]
            times, outs = {}, {}
            for mode in order:
                t0 = time.perf_counter()
                y = models[mode](x)
                times[mode] = time.perf_counter() - t0
                outs[mode] = y[0] if isinstance(y, (tuple, list)) else getattr(y, "last_hidden_state", y)
            eager = module(x)
            eager = eager[0] if isinstance(eager, (tuple, list)) else getattr(eager, "last_hidden_state", eager)
            want = eager if not args.onnx else None
            same = torch.equal(outs["reuse"], outs["plan each"])
            err = None if want is None else float((outs["reuse"] - want).abs().max())
            row = {"shape": [b, s], **{f"{m}_s": t for m, t in times.items()},
                   "ratio": times["plan each"] / times["reuse"], "bit_identical": same, "max_err_vs_eager": err}  # fmt: skip
            rows.append(row)
            print(f"{(b, s)}: reuse {times['reuse']:.3f} s, plan each {times['plan each']:.3f} s "
                  f"({row['ratio']:.1f}x), bit-identical {same}, max |err| vs eager {err}", flush=True)  # fmt: skip
        stats = models["reuse"].stats
        print("plan_reuse:", json.dumps(stats.get("plan_reuse"), default=str))
        print("symbolic:", json.dumps(stats.get("torch_symbolic", stats.get("onnx_symbolic")), default=str))
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "plan_reuse": stats.get("plan_reuse")}, indent=1,
                                              default=str))  # fmt: skip


if __name__ == "__main__":
    main()
