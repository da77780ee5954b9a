"""Fusion benchmark: autofusion against eager PyTorch, torch.compile (Inductor) and ONNX Runtime.

Everything runs in one process. In each timed round every contender takes one turn, in an order that
rotates from round to round, so machine noise hits all of them alike; each figure is a median. A turn
waits for the process to go idle (`settle`), runs the contender untimed for 50 ms (`lead_in`), then
times it. A copy bandwidth (`dst.copy_(src)` on 64 MiB of float32, read + write bytes) is measured in
the same run, and autofusion's achieved bandwidth is reported as a fraction of it.

    .venv/bin/python benchmarks/bench_fusion.py [--quick] [--json out.json] [--only NAME ...]

See benchmarks/README.md for what each column means.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import resource
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from rich.console import Console
from rich.table import Table

import autofusion

try:
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    ORT_ERROR = ""
except ImportError as e:  # ONNX Runtime is optional: pip install -e '.[bench]'
    ORT_ERROR = f"onnxruntime not importable ({e})"

WARMUP = 3
OPSET = 20  # Gelu needs 20; LayerNormalization 17; ReduceMean with axes as an input 18
RTOL, ATOL = 1e-4, 1e-5
LEAD_S = 0.05  # untimed busy time before each timed sample (see lead_in)
Step = tuple[Any, ...]  # (onnx op name,) or (onnx op name, float constant or input name)

# ---------------------------------------------------------------------------------------------- cases
UNARY: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "Sin": torch.sin, "Cos": torch.cos, "Exp": torch.exp, "Tanh": torch.tanh, "Sigmoid": torch.sigmoid,
    "Relu": torch.relu, "Neg": torch.neg, "Abs": torch.abs, "Sqrt": torch.sqrt,
}  # fmt: skip
Binary = Callable[[torch.Tensor, Any], torch.Tensor]
BINARY: dict[str, Binary] = {"Add": torch.add, "Sub": torch.sub, "Mul": torch.mul}
# ((x*1.5+y).sigmoid()*x - 0.5).relu()
CHAIN6: list[Step] = [("Mul", 1.5), ("Add", "y"), ("Sigmoid",), ("Mul", "x"), ("Sub", 0.5), ("Relu",)]
# 20 elementwise ops on one small tensor: ((x+1)*2).sin().exp() ...
CHAIN20: list[Step] = [
    ("Add", 1.0), ("Mul", 2.0), ("Sin",), ("Exp",), ("Sub", 0.5), ("Tanh",), ("Sigmoid",), ("Mul", 3.0),
    ("Relu",), ("Neg",), ("Add", "x"), ("Cos",), ("Mul", "x"), ("Abs",), ("Add", 0.25), ("Sqrt",),
    ("Sigmoid",), ("Sub", "x"), ("Tanh",), ("Mul", 0.5),
]  # fmt: skip


def apply_chain(steps: list[Step], env: dict[str, torch.Tensor]) -> torch.Tensor:
    h = env["x"]
    for op, *arg in steps:
        h = BINARY[op](h, env[arg[0]] if isinstance(arg[0], str) else arg[0]) if arg else UNARY[op](h)
    return h


def gelu_bias(x: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return F.gelu(x + b)


def ew_chain(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return apply_chain(CHAIN6, {"x": x, "y": y})


def softmax(x: torch.Tensor) -> torch.Tensor:
    return torch.softmax(x, -1)


def layer_norm(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return F.layer_norm(x, (x.shape[-1],), w, b)


def center(x: torch.Tensor) -> torch.Tensor:
    return x - x.mean(-1, keepdim=True)


def chain20(x: torch.Tensor) -> torch.Tensor:
    return apply_chain(CHAIN20, {"x": x})


def chain_nodes(steps: list[Step]) -> tuple[list[Any], dict[str, np.ndarray]]:
    nodes, consts, h = [], {}, "x"
    for i, (op, *arg) in enumerate(steps):
        ins = [h]
        if arg and isinstance(arg[0], str):
            ins.append(arg[0])
        elif arg:
            ins.append(f"c{i}")
            consts[f"c{i}"] = np.array(arg[0], dtype=np.float32)
        h = "out" if i == len(steps) - 1 else f"h{i}"
        nodes.append(helper.make_node(op, ins, [h]))
    return nodes, consts


def onnx_graph(name: str) -> tuple[list[Any], dict[str, np.ndarray]]:
    """The case as ONNX nodes (built by hand) and its constants; graph inputs are named like fn's args."""
    mk = helper.make_node
    if name == "gelu_bias":
        return [mk("Add", ["x", "b"], ["h"]), mk("Gelu", ["h"], ["out"])], {}
    if name == "ew_chain":
        return chain_nodes(CHAIN6)
    if name == "softmax":
        return [mk("Softmax", ["x"], ["out"], axis=-1)], {}
    if name == "layer_norm":
        return [mk("LayerNormalization", ["x", "w", "b"], ["out"], axis=-1, epsilon=1e-5)], {}
    if name == "center":
        axes = {"axes": np.array([-1], dtype=np.int64)}
        return [mk("ReduceMean", ["x", "axes"], ["m"], keepdims=1), mk("Sub", ["x", "m"], ["out"])], axes
    if name == "chain20":
        return chain_nodes(CHAIN20)
    raise KeyError(name)


@dataclass
class Case:
    name: str
    fn: Callable[..., torch.Tensor]
    inputs: list[torch.Tensor]
    arg_names: list[str]
    inner: int = 1  # calls per timed sample (the tiny case times a batch of calls)
    unit: str = "ms"
    results: dict[str, Any] = field(default_factory=dict)

    @property
    def shape(self) -> str:
        return "x".join(map(str, self.inputs[0].shape))

    @property
    def min_bytes(self) -> int:  # unique inputs + output: the least traffic any implementation needs
        out = self.inputs[0]  # every case's output has the shape and dtype of x
        return sum(t.numel() * t.element_size() for t in self.inputs) + out.numel() * out.element_size()


def make_cases() -> list[Case]:
    g = torch.Generator().manual_seed(0)

    def r(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g)

    big, ln_rows = (4096, 16384), (8192, 16384)
    return [
        *(Case("gelu_bias", gelu_bias, [r(n, 1024), r(1024)], ["x", "b"]) for n in big),
        *(Case("ew_chain", ew_chain, [r(n, 1024), r(n, 1024)], ["x", "y"]) for n in big),
        *(Case("softmax", softmax, [r(n, 1024)], ["x"]) for n in big),
        # short rows, 4M elements each: where a kernel's per-row set-up shows against onnxruntime's
        *(Case("softmax", softmax, [r(n, w)], ["x"]) for n, w in ((32768, 128), (16384, 256))),
        *(Case("layer_norm", layer_norm, [r(n, 1024), r(1024), r(1024)], ["x", "w", "b"]) for n in ln_rows),
        *(Case("center", center, [r(n, 1024)], ["x"]) for n in big),
        Case("chain20", chain20, [r(64)], ["x"], inner=200, unit="us"),
    ]


# ------------------------------------------------------------------------------------------ contenders
def ort_runner(case: Case) -> Callable[[], Any]:
    nodes, consts = onnx_graph(case.name)
    named = list(zip(case.arg_names, case.inputs, strict=True))
    vi = helper.make_tensor_value_info
    graph = helper.make_graph(
        nodes, case.name, [vi(n, TensorProto.FLOAT, list(t.shape)) for n, t in named],
        [vi("out", TensorProto.FLOAT, list(case.inputs[0].shape))],
        initializer=[numpy_helper.from_array(v, k) for k, v in consts.items()])  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=9)
    onnx.checker.check_model(model)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    feeds = {n: t.numpy() for n, t in named}  # created once; numpy views of the torch inputs
    return lambda: sess.run(["out"], feeds)[0]


def contenders(case: Case) -> tuple[dict[str, Callable[[], Any]], dict[str, str], dict[str, Any]]:
    """name -> zero-argument callable; name -> why it is n/a; autofusion stats."""
    fns: dict[str, Callable[[], Any]] = {"eager": lambda: case.fn(*case.inputs)}
    na: dict[str, str] = {}
    try:
        torch._dynamo.reset()  # fresh Dynamo state per shape, so no case is compiled with dynamic shapes
        compiled = torch.compile(case.fn)
        compiled(*case.inputs)
        fns["inductor"] = lambda: compiled(*case.inputs)
    except Exception as e:  # noqa: BLE001 - any failure of Inductor is a result to report, not a crash
        na["inductor"] = f"{type(e).__name__}: {str(e).splitlines()[0][:120]}"
    cm = autofusion.compile(case.fn, case.inputs)
    fns["autofusion"] = lambda: cm(*case.inputs)
    # Diagnostic: a second compiled object (disk-cache hit) whose pooled output buffers are all kept
    # alive, so every call allocates its output afresh, as eager and Inductor do.
    fresh = autofusion.compile(case.fn, case.inputs)
    held = [fresh(*case.inputs) for _ in range(WARMUP)]  # more than the pool keeps per output

    def af_fresh() -> Any:
        assert held  # the closure keeps the pooled buffers alive as long as the case runs
        return fresh(*case.inputs)

    fns["af_fresh"] = af_fresh
    if ORT_ERROR:
        na["ort"] = ORT_ERROR
    else:
        try:
            fns["ort"] = ort_runner(case)
        except Exception as e:  # noqa: BLE001
            na["ort"] = f"{type(e).__name__}: {str(e).splitlines()[0][:120]}"
    return fns, na, cm.stats


def settle(max_s: float = 0.25) -> None:
    """Wait until this process's threads are idle. Thread pools spin after a call: ONNX Runtime's for
    ~40 ms (a full core), OpenMP's for a few ms. On 2 cores that spinning slowed whichever contender ran
    next by 2-4x, so each contender's turn starts from a quiet process."""
    c0, t0 = time.process_time(), time.perf_counter()
    deadline = t0 + max_s
    while True:
        time.sleep(0.005)
        c1, t1 = time.process_time(), time.perf_counter()
        if c1 - c0 < 0.1 * (t1 - t0) or t1 > deadline:
            return
        c0, t0 = c1, t1


def lead_in(f: Callable[[], Any], seconds: float = LEAD_S) -> None:
    """Untimed calls for `seconds` (at least one) before a timed sample. After even 5 ms idle this VM
    runs slower for ~50 ms (a copy: 26 GB/s right after idle, 46 GB/s after 50 ms busy); it also wakes
    the contender's own thread pool, so the timed call sees the steady state of a loop."""
    t0 = time.perf_counter()
    f()
    while time.perf_counter() - t0 < seconds:
        f()


def cpu_seconds() -> tuple[float, float]:
    """(CPU seconds all processes have used, including hypervisor steal; CPU seconds this process used)."""
    try:
        with open("/proc/stat") as f:
            user, nice, system, _idle, _iowait, irq, softirq, steal = map(int, f.readline().split()[1:9])
        busy = (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError):
        busy = float("nan")
    t = os.times()
    return busy, t.user + t.system + t.children_user + t.children_system


def check(out: Any, ref: torch.Tensor) -> str:
    got = torch.from_numpy(out) if isinstance(out, np.ndarray) else out
    if got.shape != ref.shape:
        return f"shape {tuple(got.shape)}"
    if torch.allclose(got, ref, rtol=RTOL, atol=ATOL):
        return ""
    err = ((got - ref).abs() / (ref.abs() + ATOL)).max().item()
    return f"max rel err {err:.1e}"


def time_case(case: Case, rounds: int) -> None:
    fns, na, stats = contenders(case)
    ref = case.fn(*case.inputs)
    mismatches = {k: m for k, f in fns.items() if k != "eager" and (m := check(f(), ref))}
    for f in fns.values():
        for _ in range(WARMUP):
            f()
    samples: dict[str, list[float]] = {k: [] for k in fns}
    faults: dict[str, list[float]] = {k: [] for k in fns}  # minor page faults: fresh memory being touched
    names = list(fns)
    (busy0, own0), wall0 = cpu_seconds(), time.perf_counter()
    for r in range(rounds):
        for k in names[r % len(names) :] + names[: r % len(names)]:
            f = fns[k]
            settle()  # no other contender's thread pool still spinning
            lead_in(f)
            f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            t0 = time.perf_counter()
            for _ in range(case.inner):
                out = f()
            samples[k].append((time.perf_counter() - t0) / case.inner)
            faults[k].append((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0) / case.inner)
            del out
    (busy1, own1), wall = cpu_seconds(), time.perf_counter() - wall0
    scale = 1e6 if case.unit == "us" else 1e3
    case.results = {
        "median": {k: statistics.median(v) * scale for k, v in samples.items()},
        "faults_per_call": {k: statistics.median(v) for k, v in faults.items()},
        "others_cpu": max(0.0, (busy1 - busy0) - (own1 - own0)) / (wall * len(os.sched_getaffinity(0))),
        "unit": case.unit, "n/a": na, "mismatch": mismatches, "min_bytes": case.min_bytes,
        "kernels": stats.get("kernels"), "fused_kernels": stats.get("fused_kernels"),
        "bytes_before": stats.get("bytes_before"), "bytes_after": stats.get("bytes_after"),
        "build_error": stats.get("build_error") or stats.get("eager_fallback"),
    }  # fmt: skip
    med = samples["autofusion"]
    case.results["af_gbps"] = case.min_bytes / statistics.median(med) / 1e9


# ------------------------------------------------------------------------------ copy bandwidth, compile
def copy_bandwidth(runs: int) -> float:
    src = torch.randn(16 << 20)
    dst = torch.empty_like(src)
    for _ in range(WARMUP):
        dst.copy_(src)
    times = []
    for _ in range(runs):
        settle()
        lead_in(lambda: dst.copy_(src))
        t0 = time.perf_counter()
        dst.copy_(src)
        times.append(time.perf_counter() - t0)
    return 2 * src.numel() * src.element_size() / statistics.median(times) / 1e9


def inductor_compile_s(fn: Callable[..., torch.Tensor], inputs: Sequence[torch.Tensor], cold: bool) -> float:
    """First call of torch.compile minus a steady-state call, after torch._dynamo.reset()."""
    torch._dynamo.reset()
    with torch._inductor.config.patch(force_disable_caches=cold):
        compiled = torch.compile(fn)
        t0 = time.perf_counter()
        compiled(*inputs)
        first = time.perf_counter() - t0
        steady = []
        for _ in range(5):
            t0 = time.perf_counter()
            compiled(*inputs)
            steady.append(time.perf_counter() - t0)
    return first - statistics.median(steady)


def compile_times() -> dict[str, Any]:
    """Compile of the one-kernel ew_chain graph on a shape no case uses, in a warm process."""
    g = torch.Generator().manual_seed(1)
    inputs = [torch.randn(1000, 1000, generator=g), torch.randn(1000, 1000, generator=g)]
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="af-bench-cache-") as tmp:
        for key in ("af_cold", "af_warm"):  # fresh cache dir (hardware profile measured too), then a hit
            t0 = time.perf_counter()
            cm = autofusion.compile(ew_chain, inputs, cache_dir=tmp)
            wall = time.perf_counter() - t0
            out[key] = {"wall_s": wall, **{k: cm.stats.get(k) for k in ("compile_s", "cache_hit", "kernels")}}
    try:
        out["inductor_cold_s"] = inductor_compile_s(ew_chain, inputs, cold=True)
        inductor_compile_s(ew_chain, inputs, cold=False)  # make sure Inductor's caches hold this graph
        out["inductor_warm_s"] = inductor_compile_s(ew_chain, inputs, cold=False)
    except Exception as e:  # noqa: BLE001
        out["inductor_error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:120]}"
    return out


# ------------------------------------------------------------------------------------------- reporting
def sh(*cmd: str) -> str:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def machine() -> dict[str, Any]:
    cpu = platform.processor() or "?"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    cxx = (sh("g++", "--version").splitlines() or ["g++ not found"])[0]
    git = ("git", "-C", os.path.dirname(os.path.abspath(__file__)))  # the commit; "+dirty" if src/ differs
    rev = sh(*git, "rev-parse", "--short", "HEAD") or "?"
    rev += "+dirty" if sh(*git, "status", "--porcelain", "-uno", "--", "../src") else ""
    return {"cpu": cpu, "cores": len(os.sched_getaffinity(0)), "torch": torch.__version__,
            "torch_threads": torch.get_num_threads(), "onnxruntime": "n/a" if ORT_ERROR else ort.__version__,
            "autofusion": f"{getattr(autofusion, '__version__', '?')} ({rev})", "cxx": cxx,
            "python": platform.python_version(), "loadavg_1m": os.getloadavg()[0],
            "date": datetime.datetime.now().isoformat(timespec="seconds")}  # fmt: skip


def fmt_t(v: float | None, unit: str) -> str:
    return "n/a" if v is None else f"{v:.1f} µs" if unit == "us" else f"{v:.2f}"


CONTENDERS = {"eager": "eager", "inductor": "inductor", "ort": "ort", "autofusion": "autofusion",
              "af_fresh": "af fresh-out"}  # fmt: skip


def report(console: Console, cases: list[Case], copy_gbps: float) -> None:
    t = Table(title=f"fp32, median ms (µs where marked); copy bandwidth {copy_gbps:.1f} GB/s")
    cols = ["case", "shape", "eager", "inductor", "ort", "autofusion", "af fresh-out", "vs eager",
            "vs inductor", "vs ort", "af GB/s", "of copy", "kernels", "others", "check"]  # fmt: skip
    for c in cols:
        t.add_column(c, justify="left" if c in ("case", "shape", "check") else "right")
    for case in cases:
        r = case.results
        med = r["median"]
        af = med["autofusion"]
        ratio = {k: (f"{med[k] / af:.2f}x" if k in med else "n/a") for k in ("eager", "inductor", "ort")}
        bad = ", ".join(f"{k}: {v}" for k, v in r["mismatch"].items())
        t.add_row(case.name, case.shape, *(fmt_t(med.get(k), case.unit) for k in CONTENDERS),
                  ratio["eager"], ratio["inductor"], ratio["ort"], f"{r['af_gbps']:.1f}",
                  f"{r['af_gbps'] / copy_gbps:.0%}", str(r["kernels"]), f"{r['others_cpu']:.0%}",
                  "[red]MISMATCH " + bad + "[/red]" if bad else "ok")  # fmt: skip
    console.print(t)
    pf = Table(title="minor page faults per call (median): first touches of newly mapped output memory")
    for c in ("case", "shape", *CONTENDERS.values()):
        pf.add_column(c, justify="left" if c in ("case", "shape") else "right")
    for case in cases:
        f = case.results["faults_per_call"]
        pf.add_row(case.name, case.shape, *(f"{f[k]:.0f}" if k in f else "n/a" for k in CONTENDERS))
    console.print(pf)
    for case in cases:
        for k, why in case.results["n/a"].items():
            console.print(f"  {case.name} {case.shape}: {k} n/a: {why}")
        if case.results["build_error"]:  # autofusion still ran, through its reference runtime or eagerly
            why = str(case.results["build_error"]).splitlines()[0][:150]
            console.print(
                f"  {case.name} {case.shape}: [red]autofusion did not run fused kernels[/red]: {why}"
            )


def report_compile(console: Console, c: dict[str, Any]) -> None:
    t = Table(title="compile time of the one-kernel ew_chain graph, f32[1000x1000] x2 (warm process)")
    for col in ("what", "wall s", "g++ s (stats compile_s)", "cache_hit", "kernels"):
        t.add_column(col)
    labels = {"af_cold": "autofusion cold (fresh cache dir)", "af_warm": "autofusion warm (new object)"}
    for key, label in labels.items():
        v = c[key]
        hit = str(v["cache_hit"])
        if key == "af_warm" and not v["cache_hit"]:
            hit = f"[red]{hit} (expected a hit)[/red]"
        gxx = "-" if v["compile_s"] is None else f"{v['compile_s']:.2f}"
        t.add_row(label, f"{v['wall_s']:.2f}", gxx, hit, str(v["kernels"]))
    if "inductor_error" in c:
        t.add_row("inductor", "n/a: " + c["inductor_error"], "", "", "")
    else:
        t.add_row("inductor cold (caches disabled)", f"{c['inductor_cold_s']:.2f}", "-", "-", "-")
        t.add_row("inductor warm (its caches hold it)", f"{c['inductor_warm_s']:.2f}", "-", "-", "-")
    console.print(t)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="5 timed rounds instead of 15")
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    known = ["gelu_bias", "ew_chain", "softmax", "layer_norm", "center", "chain20", "compile"]
    p.add_argument(
        "--only", nargs="+", metavar="NAME", help=f"run only these: {' '.join(known)} (compile table)"
    )
    args = p.parse_args(argv)
    if args.only and not set(args.only) <= set(known):
        p.error(f"unknown case(s) {sorted(set(args.only) - set(known))}; known: {' '.join(known)}")
    rounds = 5 if args.quick else 15
    console = Console(width=200)
    info = machine()
    console.print(
        f"[bold]{info['cpu']}[/bold], {info['cores']} cores ({info['torch_threads']} torch threads); "
        f"{info['date']}; load average {info['loadavg_1m']:.2f} before the run\n"
        f"autofusion {info['autofusion']}, torch {info['torch']}, onnxruntime {info['onnxruntime']}, "
        f"{info['cxx']}, python {info['python']}; {rounds} rounds after {WARMUP} warm-up"
    )
    cases = [c for c in make_cases() if not args.only or c.name in args.only]
    (busy0, own0), wall0 = cpu_seconds(), time.perf_counter()
    copy_before = copy_bandwidth(rounds)
    with torch.no_grad():
        for case in cases:
            console.print(f"  timing {case.name} {case.shape} ...")
            time_case(case, rounds)
        copy_after = copy_bandwidth(rounds)
        copy_gbps = statistics.median([copy_before, copy_after])
        if cases:
            report(console, cases, copy_gbps)
        (busy1, own1), wall = cpu_seconds(), time.perf_counter() - wall0
        others = max(0.0, (busy1 - busy0) - (own1 - own0)) / (wall * info["cores"])
        console.print(
            f"copy bandwidth (dst.copy_(src), 64 MiB f32, read+write): {copy_before:.1f} GB/s "
            f"before the cases, {copy_after:.1f} GB/s after; the table uses their mean.\n"
            f"Other processes used {others:.0%} of the CPUs while the cases ran ('others' column: per "
            f"case). Above a few percent, 2-thread kernels stall at barriers and the figures are not clean."
        )
        comp = compile_times() if not args.only or "compile" in args.only else None
    if comp is not None:
        report_compile(console, comp)
    if args.json:
        doc = {"machine": info, "rounds": rounds, "warmup": WARMUP, "copy_gbps": [copy_before, copy_after],
               "others_cpu": others, "compile": comp,
               "cases": [{"name": c.name, "shape": c.shape, **c.results} for c in cases]}  # fmt: skip
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=2)
    failed = any(c.results["mismatch"] for c in cases)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
