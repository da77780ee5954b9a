"""Model benchmark: transformers models through eager, Inductor, Inductor with freezing, OpenVINO, ONNX
Runtime and autofusion (from the torch module and from its ONNX export), fp32, each result checked against
eager.

Models come from benchmarks/zoo.py (random init, small configs, no downloads). In-process contenders
take turns in rounds whose order rotates, each turn settled, led in and timed as in bench_fusion.py;
OpenVINO runs in a process of its own (same model, same seed) with the same method, so its spinning
threads never share the cores with OpenMP's. Figures are medians.

    .venv/bin/python benchmarks/bench_models.py [--models gpt2 resnet ...] [--batch 1 8] [--quick]
        [--json out.json] [--no-openvino] [--contenders eager inductor af_torch ...]
    .venv/bin/python benchmarks/bench_models.py --profile gpt2 [--batch 1]

See benchmarks/README.md for the method and the columns.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import gc
import io
import json
import logging
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import zoo  # same directory: run as a script
from bench_fusion import cpu_seconds, lead_in, machine, settle
from rich.console import Console
from rich.table import Table
from torch.utils.flop_counter import FlopCounterMode

import autofusion
from autofusion.config import Options

CONTENDERS = ("eager", "inductor", "inductor_freezing", "openvino", "ort", "af_onnx", "af_torch")
LABELS = {
    "eager": "eager",
    "inductor": "inductor",
    "inductor_freezing": "ind. freezing",
    "openvino": "openvino",
    "ort": "ort",
    "af_onnx": "af onnx",
    "af_torch": "ours",
}
PEERS = ("eager", "inductor", "inductor_freezing", "openvino", "ort")  # the "vs" columns: peer / ours
RTOL = ATOL = 1e-4  # fp32 whole models: GEMM blockings differ between libraries (seen: up to 1e-5)
WARMUP = 3
OPSET = 17
OV_THREADS = 2
GEMM_N = 2048
log = logging.getLogger("bench_models")


@dataclass
class Run:
    """One model at one batch size: everything the tables and the JSON show."""

    model: str
    batch: int
    gflop: float = 0.0
    ms: dict[str, float] = field(default_factory=dict)  # median per contender
    na: dict[str, str] = field(default_factory=dict)  # contender -> why it did not run
    wrong: dict[str, str] = field(default_factory=dict)  # contender -> how its result differs from eager
    max_abs_err: dict[str, float] = field(default_factory=dict)
    compile_s: dict[str, float] = field(default_factory=dict)
    af_stats: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)  # warnings logged, graph breaks, export routes
    others_cpu: float = 0.0


# ---------------------------------------------------------------------------------------------- checks
def flat(out: Any) -> list[torch.Tensor]:
    """A contender's result as a list of tensors (numpy arrays and nested tuples included)."""
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, np.ndarray):
        return [torch.from_numpy(np.ascontiguousarray(out))]
    if isinstance(out, (tuple, list)):
        return [t for o in out for t in flat(o)]
    raise TypeError(f"unexpected result type {type(out).__name__}")


def check(got: Any, ref: list[torch.Tensor]) -> tuple[str, float]:
    """('' or what differs, largest absolute error) of a result against eager's."""
    outs = flat(got)
    if len(outs) != len(ref):
        return f"{len(outs)} outputs, eager has {len(ref)}", math.inf
    worst, msg = 0.0, ""
    for i, (g, r) in enumerate(zip(outs, ref, strict=True)):
        if g.shape != r.shape:
            return f"output {i}: shape {tuple(g.shape)}, eager {tuple(r.shape)}", math.inf
        err = (g.to(r.dtype) - r).abs()
        worst = max(worst, err.max().item() if err.numel() else 0.0)
        if not msg and not torch.allclose(g.to(r.dtype), r, rtol=RTOL, atol=ATOL):
            bad = int((err > ATOL + RTOL * r.abs()).sum())
            msg = f"output {i}: {bad} of {r.numel()} elements off, max abs err {err.max().item():.2e}"
    return msg, worst


def reason(e: BaseException) -> str:
    text = " ".join(str(e).split())
    return f"{type(e).__name__}: {text[:300]}"


@contextlib.contextmanager
def quiet() -> Iterator[io.StringIO]:
    """Python-level stdout/stderr into a buffer: exporters print whole graphs when they fail."""
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
        yield buf


class Collect(logging.Handler):
    """Keeps the WARNING records autofusion logs while one model is set up (eager fallbacks among them)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(f"{record.name}: {record.getMessage()}")


# -------------------------------------------------------------------------------------------- contenders
def _diff_symbolic(g: Any, x: Any, n: Any, dim: Any, prepend: Any, append: Any) -> Any:
    """aten::diff for the TorchScript ONNX exporter, which has none: transformers' causal-mask code calls
    it (`find_packed_sequence_indices`) whenever no attention mask is passed, so without this no decoder
    exports. First order only, prepend and append as Concat, then slice[1:] - slice[:-1]."""
    from torch.onnx import symbolic_helper as sh

    if sh._maybe_get_const(n, "i") != 1:
        return sh._unimplemented("diff", "n != 1")
    axis = sh._maybe_get_const(dim, "i")
    parts = [p for p in (prepend, x, append) if p is x or not sh._is_none(p)]
    full = g.op("Concat", *parts, axis_i=axis) if len(parts) > 1 else x

    def const(v: int) -> Any:
        return g.op("Constant", value_t=torch.tensor([v], dtype=torch.int64))

    hi = g.op("Slice", full, const(1), const(2**62), const(axis))
    lo = g.op("Slice", full, const(0), const(-1), const(axis))
    return g.op("Sub", hi, lo)


def _cumsum_symbolic(g: Any, x: Any, dim: Any, dtype: Any) -> Any:
    """aten::cumsum that sums a bool tensor as int64, as torch does: the exporter's own emits CumSum on
    bool, which ONNX rejects (the same transformers code sums a bool mask)."""
    from torch.onnx import symbolic_helper as sh
    from torch.onnx import symbolic_opset11

    if sh._is_none(dtype) and x.type().scalarType() == "Bool":
        x = g.op("Cast", x, to_i=7)  # TensorProto.INT64
    return symbolic_opset11.cumsum(g, x, dim, dtype)


def export_onnx(module: torch.nn.Module, inputs: Sequence[torch.Tensor], path: Path) -> list[int]:
    """torch.onnx.export with the TorchScript exporter (the dynamo exporter needs onnxscript); returns
    which of `inputs` the exported graph takes (the exporter drops inputs nothing reads). It exports a
    copy: tracing changes some modules (Swin's layers keep their clamped window size as a tensor when
    traced, after which torch.export of the module meets a data-dependent branch and autofusion runs it
    eagerly), and every other contender must see the module as built."""
    torch.onnx.register_custom_op_symbolic("aten::diff", _diff_symbolic, OPSET)
    torch.onnx.register_custom_op_symbolic("aten::cumsum", _cumsum_symbolic, OPSET)
    names = [f"in{i}" for i in range(len(inputs))]
    with quiet(), torch.no_grad():
        torch.onnx.export(
            copy.deepcopy(module),
            tuple(inputs),
            str(path),
            dynamo=False,
            opset_version=OPSET,
            input_names=names,
        )
    import onnx

    kept = {i.name for i in onnx.load(str(path), load_external_data=False).graph.input}
    return [i for i, n in enumerate(names) if n in kept]


def ort_runner(path: Path, inputs: Sequence[torch.Tensor], kept: list[int]) -> Callable[[], Any]:
    import onnxruntime as ort

    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    feeds = {f"in{i}": inputs[i].numpy() for i in kept}  # made once; numpy views of the torch inputs
    return lambda: sess.run(None, feeds)


def inductor_runner(
    module: torch.nn.Module, inputs: Sequence[torch.Tensor], freezing: bool
) -> tuple[Callable[[], Any], float, int]:
    """torch.compile with default settings (`freezing`: torch._inductor.config.freezing=True), its caches
    disabled for the first call, so that call is a cold compile. Returns the callable, the compile seconds
    (first call minus the median of three steady calls) and the number of graphs Dynamo made (graph
    breaks + 1).
    The options go through torch.compile's `options`, so the two variants are different backends and
    Dynamo keeps one compiled graph for each rather than reusing the first for the second."""
    from torch._dynamo.utils import counters

    graphs0 = counters["stats"]["unique_graphs"]
    compiled = torch.compile(module, options={"freezing": True} if freezing else None)
    with torch._inductor.config.patch(force_disable_caches=True):
        t0 = time.perf_counter()
        compiled(*inputs)
        first = time.perf_counter() - t0
    steady = []
    for _ in range(3):
        t0 = time.perf_counter()
        compiled(*inputs)
        steady.append(time.perf_counter() - t0)
    return (
        (lambda: compiled(*inputs)),
        first - statistics.median(steady),
        counters["stats"]["unique_graphs"] - graphs0,
    )


def fresh_cache(root: str | None, into: str) -> str:
    """A new autofusion cache directory holding only the machine's hardware measurement (copied from
    `root`): a compile into it builds every kernel and measures every convolution layout anew."""
    if root and (Path(root) / "hw").is_dir():
        shutil.copytree(Path(root) / "hw", Path(into) / "hw")
    return into


def af_torch_runner(
    module: torch.nn.Module, inputs: Sequence[torch.Tensor], cache: str, run: Run
) -> Callable[[], Any]:
    """autofusion.compile(module, inputs) into the cold cache `cache`, then again (a warm hit)."""
    t0 = time.perf_counter()
    cm = autofusion.compile(module, list(inputs), cache_dir=cache)
    run.compile_s["af_cold"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    warm = autofusion.compile(module, list(inputs), cache_dir=cache)
    run.compile_s["af_warm"] = time.perf_counter() - t0
    stats = cm.stats
    run.compile_s["af_gxx"] = stats.get("compile_s") or 0.0
    run.af_stats = {
        k: stats.get(k)
        for k in ("kernels", "fused_kernels", "extern_calls", "eager_fallback", "fallbacks", "capture")
    }
    run.af_stats["warm_cache_hit"] = warm.stats.get("cache_hit")
    del warm
    return lambda: cm(*inputs)


def af_onnx_runner(
    path: Path, inputs: Sequence[torch.Tensor], kept: list[int], cache: str, run: Run
) -> Callable[[], Any]:
    t0 = time.perf_counter()
    cm = autofusion.compile(str(path), cache_dir=cache)
    args = [inputs[i] for i in kept]
    cm(*args)  # an ONNX model without example inputs compiles on its first call
    run.compile_s["af_onnx"] = time.perf_counter() - t0
    run.af_stats["onnx_kernels"] = cm.stats.get("kernels")
    return lambda: cm(*args)


# ------------------------------------------------------------------------------ OpenVINO, in its process
def openvino_worker(request: dict[str, Any]) -> dict[str, Any]:
    """Runs in the child process: rebuild the model from the zoo, convert, compile, check, time; the
    result's outputs (and eager's, to prove the rebuild is the same model) go to .npy files."""
    import openvino as ov

    out = Path(request["out"])
    module, inputs = zoo.build(request["model"], request["batch"], tiny=request["tiny"], seed=request["seed"])
    res: dict[str, Any] = {}
    with torch.no_grad():
        ref = flat(module(*inputs))
        t0 = time.perf_counter()
        try:
            with quiet():
                model = ov.convert_model(torch.export.export(module, tuple(inputs)))
            res["route"] = "torch.export"
        except Exception as e:  # noqa: BLE001 - fall back to OpenVINO's own tracing of the module
            first = reason(e)
            try:
                with quiet():
                    model = ov.convert_model(module, example_input=tuple(inputs))
            except Exception as e2:
                raise RuntimeError(
                    f"the exported program: {first[:300]}; the module traced: {reason(e2)}"
                ) from e2
            res["route"] = f"TorchScript trace of the module (the exported program failed: {first[:200]})"
        res["convert_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    config = {"INFERENCE_PRECISION_HINT": "f32", "INFERENCE_NUM_THREADS": request["threads"]}
    compiled = ov.Core().compile_model(model, "CPU", config)
    res["compile_s"] = time.perf_counter() - t0
    req = compiled.create_infer_request()
    feeds = [t.numpy() for t in inputs]  # made once, shared with the request (no copy per call)

    def call() -> list[np.ndarray]:
        req.infer(feeds, share_inputs=True, share_outputs=True)
        return [req.get_output_tensor(i).data for i in range(len(compiled.outputs))]

    for i, got in enumerate(call()):
        np.save(out / f"ov_{i}.npy", np.array(got, copy=True))
    for i, want in enumerate(ref):
        np.save(out / f"eager_{i}.npy", want.numpy())
    res["outputs"] = len(compiled.outputs)
    for _ in range(WARMUP):
        call()
    samples = []
    for _ in range(request["rounds"]):
        settle()
        lead_in(call)
        t0 = time.perf_counter()
        call()
        samples.append(time.perf_counter() - t0)
    res["ms"] = statistics.median(samples) * 1e3
    return res


def openvino_run(
    name: str, batch: int, tiny: bool, seed: int, rounds: int, ref: list[torch.Tensor], run: Run
) -> None:
    """The OpenVINO contender, in a child process; fills run.ms / na / wrong / compile_s."""
    with tempfile.TemporaryDirectory(prefix="bench-ov-") as tmp:
        req = {
            "model": name,
            "batch": batch,
            "tiny": tiny,
            "seed": seed,
            "rounds": rounds,
            "out": tmp,
            "threads": OV_THREADS,
        }
        try:
            p = subprocess.run(
                [sys.executable, __file__, "--openvino-worker", json.dumps(req)],
                capture_output=True,
                text=True,
                timeout=1800,
            )
        except subprocess.TimeoutExpired:
            run.na["openvino"] = "the OpenVINO process took over 30 minutes"
            return
        lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
        if p.returncode != 0 or not lines:
            tail = " ".join(p.stderr.strip().splitlines()[-3:])[:300]
            run.na["openvino"] = f"the OpenVINO process failed (exit {p.returncode}): {tail}"
            return
        res = json.loads(lines[-1])
        if "error" in res:
            run.na["openvino"] = res["error"]
            return
        mine = [torch.from_numpy(np.load(Path(tmp) / f"eager_{i}.npy")) for i in range(len(ref))]
        if any(not torch.equal(a, b) for a, b in zip(mine, ref, strict=True)):
            run.na["openvino"] = "the rebuilt model in the OpenVINO process computes another eager result"
            return
        got = [np.load(Path(tmp) / f"ov_{i}.npy") for i in range(res["outputs"])]
    run.compile_s["ov_convert"], run.compile_s["ov_compile"] = res["convert_s"], res["compile_s"]
    if res["route"] != "torch.export":
        run.notes.append(f"openvino: converted by {res['route']}")
    msg, err = check(got, ref)
    run.max_abs_err["openvino"] = err
    if msg:
        run.wrong["openvino"] = msg
    else:
        run.ms["openvino"] = res["ms"]


# ------------------------------------------------------------------------------------------------ timing
def gemm_peak(rounds: int) -> tuple[float, str]:
    """The machine's fp32 GEMM peak: GFLOP/s of the faster of torch.mm (MKL) and oneDNN's GEMM on a
    prepacked weight, f32[2048, 2048] each, median of `rounds` settled turns; and which one it was.
    (MKL's sgemm can be far from the cores' peak on some CPUs: on an AMD EPYC it reached 185-200
    GFLOP/s where oneDNN's packed GEMM reached about 380.)"""
    a, b = torch.randn(GEMM_N, GEMM_N), torch.randn(GEMM_N, GEMM_N)
    c = torch.empty(GEMM_N, GEMM_N)
    fns: dict[str, Callable[[], Any]] = {"torch.mm": lambda: torch.mm(a, b, out=c)}
    if torch.backends.mkldnn.is_available():
        wt = b.t().contiguous()
        packed = torch.ops.mkldnn._reorder_linear_weight(wt, GEMM_N)
        fns["oneDNN packed"] = lambda: torch.ops.mkldnn._linear_pointwise(a, packed, None, "none", [], "")
    best: tuple[float, str] = (0.0, "")
    for name, fn in fns.items():
        for _ in range(WARMUP):
            fn()
        times = []
        for _ in range(rounds):
            settle()
            lead_in(fn)
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        best = max(best, (2 * GEMM_N**3 / statistics.median(times) / 1e9, name))
    return best


def time_rotating(fns: dict[str, Callable[[], Any]], rounds: int) -> tuple[dict[str, float], float]:
    """Median ms per contender over `rounds` rounds, every contender one turn per round in a rotating
    order (bench_fusion.py's method), and the share of the CPUs other processes used meanwhile."""
    for f in fns.values():
        for _ in range(WARMUP):
            f()
    samples: dict[str, list[float]] = {k: [] for k in fns}
    names = list(fns)
    (busy0, own0), wall0 = cpu_seconds(), time.perf_counter()
    for r in range(rounds):
        for k in names[r % len(names) :] + names[: r % len(names)]:
            f = fns[k]
            settle()
            lead_in(f)
            t0 = time.perf_counter()
            out = f()
            samples[k].append(time.perf_counter() - t0)
            del out
    (busy1, own1), wall = cpu_seconds(), time.perf_counter() - wall0
    others = max(0.0, (busy1 - busy0) - (own1 - own0)) / (wall * len(os.sched_getaffinity(0)))
    return {k: statistics.median(v) * 1e3 for k, v in samples.items()}, others


def count_gflop(module: torch.nn.Module, inputs: Sequence[torch.Tensor]) -> float:
    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        module(*inputs)
    return counter.get_total_flops() / 1e9


# ------------------------------------------------------------------------------------------- one model
def bench_model(
    name: str, batch: int, contenders: Sequence[str], rounds: int, tiny: bool, seed: int, console: Console
) -> Run:
    run = Run(name, batch)
    module, inputs = zoo.build(name, batch, tiny=tiny, seed=seed)
    with torch.no_grad():
        ref = flat(module(*inputs))
    run.gflop = count_gflop(module, inputs)
    if "openvino" in contenders:  # first, while this process holds nothing compiled yet
        openvino_run(name, batch, tiny, seed, rounds, ref, run)
    fns: dict[str, Callable[[], Any]] = {}
    if "eager" in contenders:
        fns["eager"] = lambda: module(*inputs)
    collect = Collect()
    logging.getLogger("autofusion").addHandler(collect)
    tmp = tempfile.mkdtemp(prefix=f"bench-models-{name}-")
    try:
        with torch.no_grad():
            setup(name, module, inputs, contenders, run, fns, Path(tmp))
            for k in list(fns):
                if k == "eager":
                    continue
                msg, err = check(fns[k](), ref)
                run.max_abs_err[k] = err
                if msg:  # a wrong result is reported, never timed
                    run.wrong[k] = msg
                    del fns[k]
            if run.af_stats.get("eager_fallback"):
                run.notes.append(f"af_torch ran eagerly: {run.af_stats['eager_fallback']}")
            for what, n in (run.af_stats.get("fallbacks") or {}).items():  # ops our plan calls as externs
                run.notes.append(f"af_torch runs {n}x as an extern: {what}")
            console.print(f"  timing {name} batch {batch}: {', '.join(fns)}")
            ms, run.others_cpu = time_rotating(fns, rounds)
            run.ms.update(ms)
    finally:
        logging.getLogger("autofusion").removeHandler(collect)
        run.notes += [f"logged: {m[:400]}" for m in dict.fromkeys(collect.messages)]
        fns.clear()
        torch._dynamo.reset()
        gc.collect()
        shutil.rmtree(tmp, ignore_errors=True)
    return run


def setup(
    name: str,
    module: torch.nn.Module,
    inputs: Sequence[torch.Tensor],
    contenders: Sequence[str],
    run: Run,
    fns: dict[str, Callable[[], Any]],
    tmp: Path,
) -> None:
    """Builds every in-process contender but eager into `fns`; what fails is n/a with its reason."""
    path, kept = tmp / "model.onnx", None
    if {"ort", "af_onnx"} & set(contenders):
        t0 = time.perf_counter()
        try:
            kept = export_onnx(module, inputs, path)
            run.compile_s["onnx_export"] = time.perf_counter() - t0
        except Exception as e:  # noqa: BLE001 - an exporter refusing the model is a result
            why = f"torch.onnx.export failed: {reason(e)}"
            run.na.update({k: why for k in ("ort", "af_onnx") if k in contenders})
    if "ort" in contenders and kept is not None:
        try:
            fns["ort"] = ort_runner(path, inputs, kept)
        except Exception as e:  # noqa: BLE001
            run.na["ort"] = reason(e)
    cache = fresh_cache(Options.from_env().cache_dir, str(tmp / "afcache"))
    if "af_onnx" in contenders and kept is not None:
        try:
            fns["af_onnx"] = af_onnx_runner(path, inputs, kept, cache, run)
        except Exception as e:  # noqa: BLE001
            run.na["af_onnx"] = reason(e)
    if "af_torch" in contenders:
        try:
            fns["af_torch"] = af_torch_runner(module, inputs, cache, run)
        except Exception as e:  # noqa: BLE001 - the torch route must run every model (eagerly at worst)
            run.wrong["af_torch"] = f"autofusion.compile raised {reason(e)}"
    for key, freezing in (("inductor", False), ("inductor_freezing", True)):
        if key not in contenders:
            continue
        try:
            with quiet():
                fns[key], run.compile_s[key], graphs = inductor_runner(module, inputs, freezing)
            if graphs != 1:
                run.notes.append(f"{key}: Dynamo made {graphs} graphs (graph breaks)")
        except Exception as e:  # noqa: BLE001
            run.na[key] = reason(e)


# --------------------------------------------------------------------------------------------- reports
def fmt_ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.3f}" if v < 1 else f"{v:.2f}"


def ratio(run: Run, peer: str, ours: str = "af_torch") -> float | None:
    a, b = run.ms.get(peer), run.ms.get(ours)
    return a / b if a and b else None


def geomean(values: list[float]) -> float | None:
    return math.exp(sum(map(math.log, values)) / len(values)) if values else None


def report(console: Console, runs: list[Run], batch: int, peak: float) -> None:
    t = Table(
        title=f"batch {batch}, fp32, median ms; ratios = peer / ours (above 1.00x we are faster); "
        f"fp32 GEMM peak {peak:.0f} GFLOP/s"
    )
    cols = [
        "model",
        "GFLOP",
        *(LABELS[c] for c in CONTENDERS),
        *(f"vs {LABELS[p]}" for p in PEERS),
        "onnx vs ort",
        "GFLOP/s",
        "of peak",
        "kernels",
        "others",
        "check",
    ]
    for c in cols:
        t.add_column(c, justify="left" if c in ("model", "check") else "right")
    ratios: dict[str, list[float]] = {k: [] for k in (*PEERS, "onnx")}
    for r in runs:
        rs = {p: ratio(r, p) for p in PEERS}
        rs["onnx"] = ratio(r, "ort", "af_onnx")
        for k, v in rs.items():
            if v is not None:
                ratios[k].append(v)
        ours = r.ms.get("af_torch")
        gflops = r.gflop / ours * 1e3 if ours else None
        cells = [
            ("[red]WRONG[/red]" if c in r.wrong else "n/a" if c in r.na else fmt_ms(r.ms.get(c)))
            for c in CONTENDERS
        ]
        bad = "; ".join(f"{LABELS[k]}: {v}" for k, v in r.wrong.items())
        t.add_row(
            r.model,
            f"{r.gflop:.2f}",
            *cells,
            *(f"{rs[p]:.2f}x" if rs[p] else "-" for p in (*PEERS, "onnx")),
            f"{gflops:.0f}" if gflops else "-",
            f"{gflops / peak:.0%}" if gflops else "-",
            str(r.af_stats.get("kernels", "-")),
            f"{r.others_cpu:.0%}",
            f"[red]{bad}[/red]" if bad else "ok",
        )
    gm = {k: geomean(v) for k, v in ratios.items()}
    t.add_row(
        "geomean",
        "",
        *[""] * len(CONTENDERS),
        *(f"{gm[k]:.2f}x" if gm[k] else "-" for k in (*PEERS, "onnx")),
        "",
        "",
        "",
        "",
        "",
    )
    console.print(t)


def report_compile(console: Console, runs: list[Run]) -> None:
    t = Table(title="compile seconds (cold: nothing cached; warm: a second compile on the same cache)")
    cols = {
        "af_cold": "ours cold",
        "af_gxx": "ours g++",
        "af_warm": "ours warm",
        "af_onnx": "af onnx cold",
        "inductor": "inductor cold",
        "inductor_freezing": "ind. freezing cold",
        "onnx_export": "onnx export",
        "ov_convert": "ov convert",
        "ov_compile": "ov compile",
    }
    for col in ("model", "batch", *cols.values(), "warm hit", "ours / inductor"):
        t.add_column(col, justify="left" if col == "model" else "right")
    for r in runs:
        c = r.compile_s
        share = c["af_cold"] / c["inductor"] if c.get("af_cold") and c.get("inductor") else None
        t.add_row(
            r.model,
            str(r.batch),
            *(f"{c[k]:.2f}" if k in c else "-" for k in cols),
            str(r.af_stats.get("warm_cache_hit", "-")),
            f"{share:.2f}" if share else "-",
        )
    console.print(t)


def report_notes(console: Console, runs: list[Run]) -> None:
    for r in runs:
        head = f"{r.model} batch {r.batch}"
        for k, why in r.na.items():
            console.print(f"  {head}: {LABELS[k]} n/a: {why}", markup=False, highlight=False)
        for k, why in r.wrong.items():
            console.print(f"  {head}: [red]{LABELS[k]} WRONG[/red]: {why}")
        for note in r.notes:
            console.print(f"  {head}: {note}", markup=False, highlight=False)
        errs = ", ".join(f"{LABELS[k]} {v:.1e}" for k, v in r.max_abs_err.items())
        if errs:
            console.print(f"  {head}: max abs error against eager: {errs}", highlight=False)


# ------------------------------------------------------------------------------------------------ profile
def step_label(step: Any) -> tuple[str, str]:
    """(kind, what) of a plan step: a generated kernel and its ops, or one op run through a library."""
    from autofusion.plan.schedule import NO_TRAFFIC, KernelStep

    if isinstance(step, KernelStep):
        ops = list(dict.fromkeys(str(n.op) for n in step.kernel.nodes if n.op not in NO_TRAFFIC)) or ["copy"]
        return "kernel", ",".join(ops)
    node = step.node
    target = node.attr("target") if node.op == "extern" else None  # the ATen op an extern calls
    return ("view" if node.op in NO_TRAFFIC else "op"), str(target or node.op)


def gemm_flops(step: Any, types: dict[int, Any]) -> float:
    """Floating-point operations of a plan step that is one GEMM-like library call (0 for others): 2*m*k*n
    for linear, addmm, mm, matmul and bmm; 4*b*h*l*s*d for attention. Steps inside a SuperKernel entry
    or a generated kernel are not counted."""
    from autofusion.plan.schedule import OpStep

    if not isinstance(step, OpStep):
        return 0.0
    node = step.node
    out = types[node.outputs[0].id].shape
    if node.op in ("linear", "mm", "matmul", "bmm", "addmm"):
        a = types[node.inputs[1 if node.op == "addmm" else 0]].shape
        return 2.0 * math.prod(out) * a[-1]
    if node.op == "sdpa":
        q, k = types[node.inputs[0]].shape, types[node.inputs[1]].shape
        return 4.0 * math.prod(q) * k[-2]
    return 0.0


def profile(name: str, batch: int, tiny: bool, seed: int, runs: int, console: Console) -> None:
    """Per-step times of our plan (tools/diagnose/measure.step_times) beside Inductor's per-kernel profile
    (torch.profiler on the compiled model, top kernels by self CPU time)."""
    from autofusion.tools.diagnose import measure

    module, inputs = zoo.build(name, batch, tiny=tiny, seed=seed)
    with torch.no_grad():
        cm = autofusion.compile(module, list(inputs))
        cg = cm.compiled
        if cg is None or cg.program is None:
            console.print(
                f"{name}: autofusion runs it eagerly, no plan to profile: {cm.stats.get('eager_fallback')}"
            )
            return
        prog = cg.program
        secs = measure.step_times(prog, cg.bind(list(inputs)), runs)
        # Inductor's C++ kernels show in the profiler one by one only with this on (else all of them are
        # one "Call CompiledFxGraph" event); it adds a few microseconds per kernel.
        compiled = torch.compile(module, options={"cpp.enable_kernel_profile": True})
        compiled(*inputs)
        whole, _ = time_rotating({"ours": lambda: cm(*inputs), "inductor": lambda: compiled(*inputs)}, runs)
        total = sum(secs)
        rows = []
        for i, (step, s) in enumerate(zip(prog.plan.steps, secs, strict=True)):
            kind, what = step_label(step)
            rows.append((s, i, kind, what, step.name))
        t = Table(
            title=f"{name} batch {batch}: our plan's steps, each timed alone (best of {runs}); "
            f"{len(rows)} steps, sum {total * 1e3:.2f} ms, whole model {whole['ours']:.2f} ms (median)"
        )
        for c in ("#", "kind", "ops", "step", "ms", "share", "cumulative"):
            t.add_column(c, justify="right" if c in ("#", "ms", "share", "cumulative") else "left")
        acc = 0.0
        for s, i, kind, what, step_name in sorted(rows, reverse=True)[:30]:
            acc += s
            t.add_row(
                str(i),
                kind,
                what[:60],
                step_name[:40],
                f"{s * 1e3:.3f}",
                f"{s / total:.1%}",
                f"{acc / total:.1%}",
            )
        console.print(t)
        groups: dict[tuple[str, str], list[float]] = {}
        for s, _, kind, what, _ in rows:
            groups.setdefault(
                ("kernel", "generated kernels") if kind == "kernel" else (kind, what), []
            ).append(s)
        g = Table(title=f"{name}: our time by kind of step")
        for c in ("kind", "what", "steps", "ms", "share"):
            g.add_column(c, justify="right" if c in ("steps", "ms", "share") else "left")
        for (kind, what), v in sorted(groups.items(), key=lambda kv: -sum(kv[1])):
            g.add_row(kind, what, str(len(v)), f"{sum(v) * 1e3:.3f}", f"{sum(v) / total:.1%}")
        console.print(g)
        gemm_s, gemm_fl, n_gemm = 0.0, 0.0, 0
        types = prog.plan.graph.value_types()
        for step, s in zip(prog.plan.steps, secs, strict=True):
            fl = gemm_flops(step, types)
            if fl:
                gemm_s, gemm_fl, n_gemm = gemm_s + s, gemm_fl + fl, n_gemm + 1
        if n_gemm:
            peak, peak_by = gemm_peak(max(runs, 5))
            rate = gemm_fl / gemm_s / 1e9
            console.print(
                f"{name}: {n_gemm} GEMM steps (linear, addmm, mm, matmul, bmm, attention) take "
                f"{gemm_s * 1e3:.2f} ms of the {total * 1e3:.2f} ms summed: {rate:.0f} GFLOP/s over their "
                f"time, {rate / peak:.0%} of this machine's fp32 GEMM peak ({peak:.0f} GFLOP/s, {peak_by})"
            )
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            for _ in range(runs):
                compiled(*inputs)
    events = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)
    every = sum(e.self_cpu_time_total for e in events)
    p = Table(
        title=f"{name} batch {batch}: Inductor's profile (torch.profiler over {runs} calls, compiled with "
        f"cpp.enable_kernel_profile), top 30 by self CPU time; whole model {whole['inductor']:.2f} ms"
    )
    for c in ("name", "calls per run", "self ms per run", "share"):
        p.add_column(c, justify="left" if c == "name" else "right")
    for e in events[:30]:
        p.add_row(
            e.key[:90],
            f"{e.count / runs:g}",
            f"{e.self_cpu_time_total / runs / 1e3:.3f}",
            f"{e.self_cpu_time_total / every:.1%}" if every else "-",
        )
    console.print(p)


# ------------------------------------------------------------------------------------------------- main
def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument(
        "--models", nargs="+", metavar="NAME", default=zoo.NAMES, help=f"default: {' '.join(zoo.NAMES)}"
    )
    p.add_argument("--batch", nargs="+", type=int, default=[1, 8], help="batch sizes (default: 1 8)")
    p.add_argument("--quick", action="store_true", help="5 timed rounds instead of 15")
    p.add_argument("--rounds", type=int, help="timed rounds (overrides --quick)")
    p.add_argument("--json", metavar="PATH", help="also write every figure as JSON")
    p.add_argument("--no-openvino", action="store_true", help="leave the OpenVINO contender out")
    p.add_argument(
        "--contenders",
        nargs="+",
        metavar="NAME",
        default=list(CONTENDERS),
        help=f"default: {' '.join(CONTENDERS)}; ours (af_torch) is always timed",
    )
    p.add_argument(
        "--tiny", action="store_true", help="the zoo's tiny configs (for tests: seconds, not minutes)"
    )
    p.add_argument("--seed", type=int, default=0, help="weights and inputs (default 0)")
    p.add_argument("--profile", metavar="MODEL", help="per-step profile of ours beside Inductor's, then exit")
    p.add_argument("--openvino-worker", metavar="JSON", help=argparse.SUPPRESS)  # the child process
    args = p.parse_args(argv)
    unknown = sorted(set(args.models) - set(zoo.NAMES)) + (
        [args.profile] if args.profile not in (None, *zoo.NAMES) else []
    )
    if unknown:
        p.error(f"unknown model(s) {unknown}; the zoo has {' '.join(zoo.NAMES)}")
    if set(args.contenders) - set(CONTENDERS):
        bad = sorted(set(args.contenders) - set(CONTENDERS))
        p.error(f"unknown contender(s) {bad}; known: {' '.join(CONTENDERS)}")
    if args.rounds is not None and args.rounds < 1:
        p.error("--rounds must be at least 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    if args.openvino_worker:  # the child process: one JSON line on stdout
        try:
            res = openvino_worker(json.loads(args.openvino_worker))
        except Exception as e:  # noqa: BLE001 - OpenVINO refusing a model is a result
            res = {"error": f"OpenVINO: {type(e).__name__}: {' '.join(str(e).split())[:700]}"}
        print(json.dumps(res))
        return 0
    rounds = args.rounds or (5 if args.quick else 15)
    console = Console(width=260)
    if args.profile:
        profile(args.profile, args.batch[0], args.tiny, args.seed, max(rounds, 10), console)
        return 0
    contenders = [
        c for c in CONTENDERS if c in args.contenders and not (c == "openvino" and args.no_openvino)
    ]
    if "af_torch" not in contenders:
        contenders.append("af_torch")
    info = machine()
    console.print(
        f"[bold]{info['cpu']}[/bold], {info['cores']} cores ({info['torch_threads']} torch threads); "
        f"{info['date']}; load average {info['loadavg_1m']:.2f} before the run\n"
        f"autofusion {info['autofusion']}, torch {info['torch']}, onnxruntime {info['onnxruntime']}, "
        f"{info['cxx']}, python {info['python']}; {rounds} rounds after {WARMUP} warm-up; "
        f"contenders: {' '.join(contenders)}"
    )
    peak, peak_by = gemm_peak(rounds)
    console.print(f"fp32 GEMM peak: {peak:.0f} GFLOP/s ({peak_by}, f32[{GEMM_N}x{GEMM_N}], median)")
    t_start = time.perf_counter()
    runs: list[Run] = []
    for batch in args.batch:
        for name in args.models:
            allowed = zoo.ZOO[name].batches
            if allowed is not None and batch not in allowed:
                console.print(
                    f"  {name}: batch {batch} skipped (it runs at batch {', '.join(map(str, allowed))})"
                )
                continue
            t0 = time.perf_counter()
            runs.append(bench_model(name, batch, contenders, rounds, args.tiny, args.seed, console))
            console.print(f"  {name} batch {batch}: {time.perf_counter() - t0:.0f} s")
    for batch in args.batch:
        report(console, [r for r in runs if r.batch == batch], batch, peak)
    report_compile(console, runs)
    report_notes(console, runs)
    console.print(f"wall time {time.perf_counter() - t_start:.0f} s")
    if args.json:
        doc = {
            "machine": info,
            "rounds": rounds,
            "warmup": WARMUP,
            "gemm_peak_gflops": peak,
            "gemm_peak_by": peak_by,
            "rtol": RTOL,
            "atol": ATOL,
            "contenders": contenders,
            "runs": [asdict(r) for r in runs],
        }
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=2, default=str)
    return 1 if any(r.wrong for r in runs) else 0


if __name__ == "__main__":
    raise SystemExit(main())
