"""TORCH_COMPILE_DEBUG=1: a run directory with one subdirectory per kernel.

In: a compiled `Program` and the root (`Options.torch_compile_debug_dir`, by default
./torch_compile_debug). Out, under `<root>/run_<date-time>-pid_<pid>/autofusion/` (one run directory
per process, as torch's own):

    autofused_<ops>_<hash>/   one per fused kernel; <ops> are its compute ops, <hash> hashes its source
        kernel.cpp            the kernel alone, a complete translation unit (math header inline)
        graph.svg             its subgraph: input buffers, IR nodes, outputs
        subgraph.ir.txt       the IR nodes it computes
        compile.sh            builds kernel.so from kernel.cpp with the flags autofusion used
        benchmark.py          rebuilds if needed, runs the kernel on random inputs of its compiled
                              shapes and strides, prints the median time and bandwidth (needs torch only)
        meta.json             buffers, size/stride parameters, tile, estimate
    <graph>_<NNN>_<op>_<node>/ one per step that is not a fused kernel (library ops, views read outside
        node.txt              kernels): the IR line, why it is not fused, the source line

The hash is of the kernel's source, so one kernel compiled by two graphs shares its directory.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import re
import shlex
from pathlib import Path
from typing import Any

from autofusion.codegen.cpp.build import DEFAULT_FLAGS
from autofusion.codegen.cpp.render import render_unit
from autofusion.dfx.pictures import kernel_svg
from autofusion.fusion.cost import estimate
from autofusion.ir.printer import _Names, format_node
from autofusion.plan.schedule import NO_TRAFFIC, KernelStep

_RUN_DIRS: dict[str, Path] = {}


def run_dir(root: str) -> Path:
    """This process's run directory under `root` (created on first use)."""
    if root not in _RUN_DIRS:
        stamp = datetime.datetime.now().strftime("%Y_%m_%d_%H_%M_%S_%f")
        _RUN_DIRS[root] = Path(root) / f"run_{stamp}-pid_{os.getpid()}" / "autofusion"
    return _RUN_DIRS[root]


def _safe(text: str, limit: int = 60) -> str:
    return re.sub(r"[^A-Za-z0-9_]+", "_", text)[:limit].strip("_") or "x"


def kernel_dir_name(step: KernelStep, source: str) -> str:
    ops = list(dict.fromkeys(str(n.op) for n in step.kernel.nodes if n.op not in NO_TRAFFIC)) or ["copy"]
    digest = hashlib.sha256(source.split('extern "C"', 1)[-1].encode()).hexdigest()[:10]
    return f"autofused_{_safe('_'.join(ops))}_{digest}"


def write_debug_dirs(program: Any, root: str, cxx: str = "g++") -> list[Path]:
    plan = program.plan
    base = run_dir(root)
    types = plan.graph.value_types()
    written: list[Path] = []
    for i, step in enumerate(plan.steps):
        if isinstance(step, KernelStep):
            source, params = render_unit([(step.kernel, step.tile)])
            d = base / kernel_dir_name(step, source)
            d.mkdir(parents=True, exist_ok=True)
            (d / "kernel.cpp").write_text(source)
            (d / "graph.svg").write_text(kernel_svg(step, plan.graph))
            names = _Names()
            for v in step.inputs:
                names.define(v)
            (d / "subgraph.ir.txt").write_text(
                "\n".join(format_node(n, names, True) for n in step.kernel.nodes) + "\n"
            )
            cmd = shlex.join([cxx, "kernel.cpp", *DEFAULT_FLAGS, "-o", "kernel.so"])
            (d / "compile.sh").write_text(f'#!/bin/sh\ncd "$(dirname "$0")" || exit 1\nexec {cmd}\n')
            buffers = [
                {
                    "shape": list(b.type.shape),
                    "strides": list(b.type.strides),
                    "dtype": str(b.type.dtype.to_torch()).removeprefix("torch."),
                    "output": b.is_output,
                }
                for b in step.kernel.buffers
            ]
            e = estimate(step.kernel, plan.profile, step.tile)
            meta = {
                "kernel": step.name,
                "graph": plan.graph.name,
                "buffers": buffers,
                "params": params[step.kernel.name],
                "nodes": [n.name for n in step.kernel.nodes],
                "tile": vars(step.tile),
                "estimated_us": e.seconds * 1e6,
                "bytes": e.bytes,
                "flops": e.flops,
            }
            (d / "meta.json").write_text(json.dumps(meta, indent=1))
            (d / "benchmark.py").write_text(
                BENCHMARK.replace("@META@", repr(json.dumps(meta))).replace("@CXX@", repr(cxx))
            )
            written.append(d)
        else:
            n = step.node
            if n.op == "const":
                continue
            d = base / f"{_safe(plan.graph.name, 30)}_{i:03d}_{_safe(n.op, 20)}_{_safe(n.name, 40)}"
            d.mkdir(parents=True, exist_ok=True)
            names = _Names()
            for v in n.inputs:
                names.define(v)
            ins = ", ".join(str(types[v]) for v in n.inputs)
            (d / "node.txt").write_text(
                f"{format_node(n, names)}\ninputs: {ins}\nnot fused: {step.reason}\n"
                f"from: {n.loc or 'unknown'}\ngraph: {plan.graph.name}\n"
            )
            written.append(d)
    return written


BENCHMARK = '''"""Standalone benchmark of one autofusion kernel (written under TORCH_COMPILE_DEBUG=1).

Builds kernel.so from kernel.cpp (compile.sh) when it is missing, runs the kernel on random inputs
with the shapes, strides and dtypes it was compiled for, and prints the median time and bandwidth.
Needs torch and a C++ compiler, not autofusion.  Usage: python benchmark.py [--runs N]
"""

import argparse
import ctypes
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
META = json.loads(@META@)
CXX = @CXX@


def build() -> Path:
    lib = HERE / "kernel.so"
    if not lib.exists():
        subprocess.run(["sh", str(HERE / "compile.sh")], check=True)
    return lib


def make(buf: dict) -> torch.Tensor:
    dtype = getattr(torch, buf["dtype"])
    t = torch.empty_strided(buf["shape"], buf["strides"], dtype=dtype)
    if buf["output"] or not (dtype.is_floating_point):
        return t.zero_() if not buf["output"] else t
    return t.copy_(torch.randn(buf["shape"]).to(dtype))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=100)
    args = ap.parse_args()
    fn = getattr(ctypes.CDLL(str(build())), META["kernel"])
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    fn.restype = None
    tensors = [make(b) for b in META["buffers"]]
    ptrs = (ctypes.c_void_p * len(tensors))(*[t.data_ptr() for t in tensors])
    params = (ctypes.c_int64 * max(1, len(META["params"])))(*META["params"])
    for _ in range(3):
        fn(ptrs, params)
    times = []
    for _ in range(args.runs):
        start = time.perf_counter()
        fn(ptrs, params)
        times.append(time.perf_counter() - start)
    med = statistics.median(times)
    print(f"{META['kernel']}: median {med * 1e6:.2f} us over {args.runs} runs, "
          f"{META['bytes'] / med / 1e9:.2f} GB/s; the cost model estimated {META['estimated_us']:.2f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
'''
