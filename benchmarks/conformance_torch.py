"""PyTorch's OpInfo database as a conformance suite for autofusion.

Every op in `torch.testing._internal.common_methods_invocations.op_db` comes with sample inputs. Each
sample runs eagerly and through autofusion (`autofusion.compile`: route "direct";
`torch.compile(backend="autofusion")`: route "dynamo"), inside a small graph that makes the op fuse
with neighbours (see `build_case`), and the results are compared under OpInfo's tolerances.

    .venv/bin/python benchmarks/conformance_torch.py --limit-samples 3 --json results/opinfo.json
    .venv/bin/python benchmarks/conformance_torch.py --ops add,softmax --dtypes float16 --table all

The run is split over worker processes (`--jobs`); each writes one JSON line per result, so a worker
that dies (a crash in generated code) or hangs is restarted after the sample it was on, which is
recorded as `crash` or `timeout`. `--resume` keeps the results already in `--json`'s part files.
benchmarks/README.md explains the statuses and columns.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from typing import Any

import torch

DEFAULT_DTYPES = ("float32", "float16", "bfloat16", "int64", "bool")
ROUTES = ("direct", "dynamo")
# Ops whose result is drawn at random or reads uninitialised memory: their outputs cannot be compared.
# Ops that are random under another name are caught by running eager twice with different seeds.
RANDOM_WORDS = ("dropout", "bernoulli", "normal", "rand", "multinomial", "uniform", "cauchy", "exponential",
                "geometric", "log_normal", "rrelu", "fractional_max_pool", "empty", "lowrank")  # fmt: skip


# ---- loading the database -----------------------------------------------------------------------


# Ops whose `training=True` samples apply dropout; eager can agree across seeds by chance on tiny
# samples (a one-hot softmax row), so the seed test above does not always see it.
DROPOUT_WHEN_TRAINING = frozenset({"nn.functional.multi_head_attention_forward"})


def load_op_db() -> list[Any]:
    """op_db, PyTorch's OpInfo database (its module imports `expecttest`, in the test extra)."""
    from torch.testing._internal.common_methods_invocations import op_db

    return list(op_db)


def op_key(op: Any) -> str:
    return op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")


def is_random(op: Any) -> bool:
    key = op_key(op)
    return any(w in key for w in RANDOM_WORDS)


def samples(op: Any, dtype: torch.dtype, limit: int | None) -> list[Any]:
    """The op's first `limit` samples, the same ones on every run (seeded before generation)."""
    torch.manual_seed(0)
    gen = op.sample_inputs("cpu", dtype, requires_grad=False)
    try:
        return list(islice(gen, limit))
    finally:  # a generator left open is closed by the GC later, inside some unrelated trace
        close = getattr(gen, "close", None)
        if close is not None:
            close()


# ---- one sample as a function of tensors --------------------------------------------------------


def _wrappable(t: torch.Tensor) -> bool:
    # uint16/32/64 have neither neg nor bitwise_not on CPU.
    unsigned = t.dtype in (torch.uint16, torch.uint32, torch.uint64)
    return t.layout == torch.strided and not (t.is_complex() or t.is_quantized or unsigned)


def _flip(t: torch.Tensor) -> torch.Tensor:
    """An exact involution that no simplifier removes when applied once: neg for numbers (two's
    complement wraps, so even INT_MIN comes back), logical_not for bool."""
    return torch.logical_not(t) if t.dtype == torch.bool else torch.neg(t)


def _split(obj: Any, tensors: list[torch.Tensor]) -> Callable[[list[Any]], Any]:
    """Collect the tensors in a nested args structure; return how to rebuild it from new tensors."""
    if isinstance(obj, torch.Tensor):
        k = len(tensors)
        tensors.append(obj)
        return lambda xs: xs[k]
    if isinstance(obj, (list, tuple)) and not hasattr(obj, "_fields"):
        parts = [_split(o, tensors) for o in obj]
        kind = type(obj)
        return lambda xs: kind(p(xs) for p in parts)
    if isinstance(obj, dict):
        items = [(k, _split(v, tensors)) for k, v in obj.items()]
        return lambda xs: {k: p(xs) for k, p in items}
    return lambda xs: obj


def _epilogue(t: torch.Tensor) -> torch.Tensor:
    """An exact elementwise op on a result that cannot cancel against the prologue's flip (neg, then
    a view, then neg would simplify to the bare view): x * 2 for floats (exact: a power of two; an
    overflow overflows in eager too), bitwise not for integers (lossless), logical not for bool."""
    if t.dtype == torch.bool:
        return torch.logical_not(t)
    return t * 2 if t.dtype.is_floating_point else torch.bitwise_not(t)


def _post(out: Any) -> Any:
    """Apply the epilogue to every real tensor of the op's result (tuples become tuples)."""
    if isinstance(out, torch.Tensor):
        return _epilogue(out) if _wrappable(out) else out
    if isinstance(out, (list, tuple)):
        parts = [_post(o) for o in out]
        return tuple(parts) if isinstance(out, tuple) else parts
    return out


@dataclass
class Case:
    fn: Callable[..., Any]
    inputs: list[torch.Tensor]
    describe: str  # input shapes/dtypes and the non-tensor arguments, for repro lines


def build_case(op: Any, sample: Any) -> Case:
    """`fn(*inputs)` computes `epilogue(op(flip(inputs)))` on every real tensor: the inputs handed to
    the compiled function are the flipped sample tensors, so the first thing the graph does is an
    exact elementwise op no simplifier removes, which fuses into the op's own kernel, and the op's
    results get another exact one (`_epilogue`). Only the flip outside the graph is eager; the
    reference is the same `fn` run eagerly."""
    tensors: list[torch.Tensor] = []
    rebuild = _split((sample.input, sample.args, sample.kwargs), tensors)
    wrap = [_wrappable(t) for t in tensors]
    inputs = [_flipped_like(t) if w else t for t, w in zip(tensors, wrap, strict=True)]
    call = op.op

    def fn(*xs: torch.Tensor) -> Any:
        vals = [_flip(x) if w else x for x, w in zip(xs, wrap, strict=True)]
        inp, args, kwargs = rebuild(vals)
        return _post(call(inp, *args, **kwargs))

    shapes = ", ".join(f"{str(t.dtype).removeprefix('torch.')}{list(t.shape)}" + _layout(t) for t in tensors)
    consts: list[str] = []
    _consts((sample.args, sample.kwargs), consts)
    return Case(fn, inputs, f"({shapes}) {' '.join(consts)}".strip()[:300])


def _layout(t: torch.Tensor) -> str:
    if t.layout != torch.strided:
        return f"@{str(t.layout).removeprefix('torch.')}"
    return "" if t.is_contiguous() else f"@{t.stride()}"


def _flipped_like(t: torch.Tensor) -> torch.Tensor:
    """flip(t), keeping t's strides where they are dense (non-contiguous samples stay non-contiguous)."""
    return torch.empty_like(t).copy_(_flip(t))  # preserve_format: dense strides kept, others contiguous


def _consts(obj: Any, out: list[str]) -> None:
    if isinstance(obj, torch.Tensor):
        return
    if isinstance(obj, (list, tuple)):
        for o in obj:
            _consts(o, out)
    elif isinstance(obj, dict):
        for k, v in obj.items():
            if not isinstance(v, torch.Tensor):
                out.append(f"{k}={v!r}")
    else:
        out.append(repr(obj))


# ---- comparing ----------------------------------------------------------------------------------


def leaves(out: Any) -> list[Any]:
    """The results as a flat list; complex32 tensors as complex64 (few CPU kernels take complex32,
    not even equality)."""
    if isinstance(out, (list, tuple)):
        return [x for o in out for x in leaves(o)]
    if isinstance(out, torch.Tensor) and out.dtype == torch.complex32:
        return [out.to(torch.complex64)]
    return [out]


def _max_err(a: torch.Tensor, ref: torch.Tensor) -> float:
    """Largest |a - ref| where both are finite; inf where exactly one of them is nan or they differ
    in an infinity."""
    wide = torch.complex128 if a.is_complex() or ref.is_complex() else torch.float64
    a, ref = a.detach().to(wide), ref.to(wide)
    an, rn = torch.isnan(a), torch.isnan(ref)
    if not torch.equal(an, rn):
        return float("inf")
    fin = torch.isfinite(a) & torch.isfinite(ref)
    if not torch.equal(a[~fin & ~an], ref[~fin & ~rn]):
        return float("inf")
    return float((a[fin] - ref[fin]).abs().max()) if bool(fin.any()) else 0.0


def compare(got: Any, ref: Any, ref64: Any | None = None) -> str | None:
    """None when `got` matches eager's `ref`; else what differs. Floating tensors: assert_close's
    default tolerances for their dtype (what OpInfo's tests use), nan == nan, strides ignored; a
    float result outside them still passes when its largest error against a float64 run (`ref64`)
    is at most 3x eager's plus the dtype's atol (Inductor's fp64 check). Others: exactly."""
    gl, rl = leaves(got), leaves(ref)
    if len(gl) != len(rl):
        return f"{len(gl)} outputs, eager has {len(rl)}"
    r64 = leaves(ref64) if ref64 is not None else None
    if r64 is not None and len(r64) != len(rl):
        r64 = None
    for k, (g, r) in enumerate(zip(gl, rl, strict=True)):
        if not isinstance(r, torch.Tensor):
            same = g == r or (isinstance(g, float) and isinstance(r, float) and g != g and r != r)
            if not same:
                return f"output {k}: {g!r} != eager {r!r}"
            continue
        if not isinstance(g, torch.Tensor):
            return f"output {k}: a {type(g).__name__}, eager gives a tensor"
        if g.shape != r.shape or g.dtype != r.dtype:
            return f"output {k}: {g.dtype}{list(g.shape)} != eager {r.dtype}{list(r.shape)}"
        if not (r.dtype.is_floating_point or r.is_complex()):
            if not torch.equal(g, r):
                bad = (g != r).nonzero()[:1].tolist()
                return f"output {k}: not equal (first at {bad}: {g[tuple(bad[0])]!r} != {r[tuple(bad[0])]!r})"
            continue
        try:
            torch.testing.assert_close(g, r, equal_nan=True, check_stride=False)
            continue
        except AssertionError as e:
            msg = " ".join(str(e).split())
        if r64 is not None and isinstance(r64[k], torch.Tensor) and r64[k].shape == r.shape:
            e_af, e_eager = _max_err(g, r64[k]), _max_err(r, r64[k])
            atol = torch.testing._comparison.default_tolerances(r)[1]
            if e_af <= 3 * e_eager + atol:
                continue
            msg += f" | vs float64: autofusion err {e_af:.3g}, eager err {e_eager:.3g}"
        return f"output {k}: {msg[:400]}"
    return None


def float64_reference(case: Case) -> Any | None:
    """The case run eagerly with floating inputs in float64 (complex in complex128); None when the op
    does not take them (ops whose dtype must match an argument, integer-only ops)."""
    xs = [x.to(torch.complex128) if x.is_complex() else x.double() if x.dtype.is_floating_point else x
          for x in case.inputs]  # fmt: skip
    try:
        return case.fn(*xs)
    except Exception:
        return None


# ---- running one sample through one route -------------------------------------------------------


class SampleTimeout(Exception):
    pass


@contextlib.contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """Raise SampleTimeout after `seconds` (Python-level: a hang inside one C call is caught by the
    driver's watchdog instead)."""
    if seconds <= 0 or not hasattr(signal, "SIGALRM"):
        yield
        return

    def fire(signum: int, frame: Any) -> None:
        raise SampleTimeout(f"sample ran past {seconds:g} s")

    old = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


@dataclass
class RouteResult:
    out: Any = None
    fallback: str | None = None  # why (part of) it ran eagerly
    generated: bool = False  # a generated kernel ran (no build error)
    externs: int = 0
    build_error: str | None = None
    graphs: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


def _graph_info(res: RouteResult, stats: dict[str, Any]) -> None:
    res.externs += int(stats.get("extern_calls", 0))
    if stats.get("build_error"):
        res.build_error = str(stats["build_error"]).splitlines()[0][:300]
    elif stats.get("fused_kernels", 0) >= 1:
        res.generated = True


def run_direct(case: Case) -> RouteResult:
    import autofusion

    cm = autofusion.compile(case.fn, case.inputs)
    res = RouteResult(out=cm(*case.inputs))
    stats = cm.stats
    if "eager_fallback" in stats:
        res.fallback = str(stats["eager_fallback"]).splitlines()[0][:300]
        return res
    res.graphs = 1
    _graph_info(res, stats)
    return res


def run_dynamo(case: Case) -> RouteResult:
    from autofusion.backend import autofusion_backend

    compiled: list[Any] = []

    def recording_backend(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        run = autofusion_backend(gm, example_inputs)
        compiled.append(getattr(run, "autofusion_graph", None))
        return run

    torch._dynamo.reset()
    try:
        out = torch.compile(case.fn, backend=recording_backend, fullgraph=False, dynamic=False)(*case.inputs)
    finally:
        torch._dynamo.reset()
    res = RouteResult(out=out, graphs=len(compiled))
    if not compiled:
        res.fallback = "Dynamo handed the backend no graph"
    elif any(g is None for g in compiled):
        res.fallback = f"the backend ran {sum(g is None for g in compiled)} of {len(compiled)} graphs eagerly"
    for g in compiled:
        if g is not None:
            _graph_info(res, g.stats())
    return res


RUNNERS: dict[str, Callable[[Case], RouteResult]] = {"direct": run_direct, "dynamo": run_dynamo}


def error_class(e: BaseException) -> str:
    """A stable name for an exception: the innermost cause's type and its first message line with
    numbers, names in quotes and shapes blurred, so one bug is one class."""
    inner = e
    while True:
        nxt = getattr(inner, "inner_exception", None) or inner.__cause__
        if nxt is None or nxt is inner:
            break
        inner = nxt
    line = (str(inner).strip().splitlines() or [""])[0]
    line = re.sub(r"'[^']*'", "'_'", line)
    line = re.sub(r"\[[0-9, ]*\]|\([0-9, ]*\)", "[..]", line)
    line = re.sub(r"\d+(\.\d+)?(e[-+]?\d+)?", "N", line)
    return f"{type(inner).__name__}: {line[:160]}"


def error_origin(e: BaseException) -> str:
    """'autofusion' when a frame of the autofusion package raised (or wrapped) it, else 'torch'."""
    inner: BaseException | None = e
    while inner is not None:
        tb = traceback.extract_tb(inner.__traceback__)
        if any(f"{os.sep}autofusion{os.sep}" in fr.filename for fr in tb):
            return "autofusion"
        inner = getattr(inner, "inner_exception", None) or inner.__cause__
    return "torch"


def run_sample(case: Case, route: str, ref: Any, ref64: Any | None, timeout_s: float) -> dict[str, Any]:
    """One record: status pass / wrong / error / fallback, and what ran."""
    t0 = time.perf_counter()
    rec: dict[str, Any] = {"route": route}
    try:
        with time_limit(timeout_s):
            res = RUNNERS[route](case)
            diff = compare(res.out, ref, ref64)
    except SampleTimeout as e:
        rec.update(status="timeout", message=str(e))
        return rec
    except Exception as e:  # every failure of the compiled path is a result to report, not a stop
        rec.update(status="error", error_class=error_class(e), origin=error_origin(e),
                   message=f"{type(e).__name__}: {' '.join(str(e).split())[:500]}")  # fmt: skip
        return rec
    rec.update(generated=res.generated, externs=res.externs, graphs=res.graphs)
    if diff is not None:
        rec.update(status="wrong", message=diff)
    elif res.build_error:
        rec.update(status="error", error_class=f"build_error: {res.build_error[:120]}", origin="autofusion",
                   message=res.build_error)  # fmt: skip
    elif res.fallback:
        rec.update(status="fallback", message=res.fallback)
    else:
        rec["status"] = "pass"
    rec["seconds"] = round(time.perf_counter() - t0, 3)
    return rec


def _same_eager(a: Any, b: Any) -> bool:
    la, lb = leaves(a), leaves(b)
    if len(la) != len(lb):
        return False
    for x, y in zip(la, lb, strict=True):
        if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor):
            if x.shape != y.shape or x.dtype != y.dtype:
                return False
            if x.dtype.is_floating_point or x.is_complex():
                if not torch.equal(torch.isnan(x), torch.isnan(y)) or not torch.equal(x[~torch.isnan(x)],
                                                                                      y[~torch.isnan(y)]):
                    return False
            elif not torch.equal(x, y):
                return False
        elif isinstance(x, torch.Tensor) or isinstance(y, torch.Tensor):
            return False
        elif x != y and not (x != x and y != y):
            return False
    return True


def eager_reference(case: Case) -> tuple[Any, str | None]:
    """Eager's result, or why the sample cannot be compared (it is random or uninitialised: two runs
    with different seeds differ, e.g. dropout under another name such as attention's `training=True`;
    or eager itself raises). A compiled model draws from the generator in its own order, so a random
    sample has no single right answer to compare with."""
    try:
        others = []
        for seed in (1, 2, 3):  # a random op can agree on two seeds by chance (a one-hot softmax dropped)
            torch.manual_seed(seed)
            others.append(case.fn(*case.inputs))
        torch.manual_seed(0)
        b = case.fn(*case.inputs)
    except Exception as e:
        return None, f"eager raises {type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
    if not all(_same_eager(a, b) for a in others):
        return None, "random: two eager runs with different seeds differ"
    return b, None


# ---- the worker: ops in, one JSON line per result -----------------------------------------------


QUIET_LOGGERS = ("autofusion", "torch._dynamo", "torch._inductor", "torch.fx", "torch._export",
                 "torch.export")


def quiet_logs() -> None:
    """Fallback warnings are the point of the records, not of the console (a worker process only: this
    changes the process's loggers and warning filters for good)."""
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)
    import warnings

    warnings.filterwarnings("ignore")


def run_op(op: Any, dt_name: str, routes: list[str], limit: int | None, timeout_s: float,
           skip: set[tuple[str, str, int, str]] = frozenset(),  # type: ignore[assignment]
           on_start: Callable[[dict[str, Any]], None] = lambda rec: None,
           ) -> Iterator[dict[str, Any]]:  # fmt: skip
    """Every record of one op in one dtype: its first `limit` samples through each route. `on_start`
    sees each (sample, route) before it runs (the worker logs it, so a crash names its sample)."""
    name = op_key(op)
    base = {"op": name, "dtype": dt_name}
    if is_random(op):
        if (name, dt_name, -1, "*") not in skip:
            yield {**base, "index": -1, "route": "*", "status": "skip", "message": "random op (by name)"}
        return
    try:
        gen = samples(op, getattr(torch, dt_name), limit)
    except Exception as e:
        if (name, dt_name, -1, "*") not in skip:
            yield {**base, "index": -1, "route": "*", "status": "skip",
                   "message": f"sample_inputs raises {type(e).__name__}: {str(e)[:200]}"}  # fmt: skip
        return
    for i, sample in enumerate(gen):
        todo = [r for r in routes if (name, dt_name, i, r) not in skip]
        if not todo:
            continue
        try:
            case = build_case(op, sample)
        except Exception as e:
            for r in todo:
                yield {**base, "index": i, "route": r, "status": "skip",
                       "message": f"cannot wrap: {type(e).__name__}: {e}"[:300]}  # fmt: skip
            continue
        try:
            ref, why = eager_reference(case)
        except Exception as e:  # the harness's own comparison failed: say so, and go on
            ref, why = None, f"harness cannot compare eager runs: {type(e).__name__}: {str(e)[:200]}"
        if why is None and sample.kwargs.get("training") is True and name in DROPOUT_WHEN_TRAINING:
            why = "random: training=True applies dropout (eager's draws are not ours)"
        if why is not None:
            for r in todo:
                yield {**base, "index": i, "route": r, "status": "skip", "message": why,
                       "sample": case.describe}  # fmt: skip
            continue
        ref64 = float64_reference(case) if dt_name in ("float16", "bfloat16", "float32") else None
        for r in todo:
            on_start({**base, "index": i, "route": r, "event": "start"})
            rec = run_sample(case, r, ref, ref64, timeout_s)
            yield {**base, "index": i, "sample": case.describe, **rec}


def supported_dtypes(op: Any, wanted: list[str]) -> list[str]:
    have = {str(d).removeprefix("torch.") for d in op.supported_dtypes("cpu")}
    return [d for d in wanted if d in have]


def worker(op_names: list[str], dtypes: list[str], routes: list[str], limit: int | None, timeout_s: float,
           out_path: Path, skip: set[tuple[str, str, int, str]]) -> None:  # fmt: skip
    quiet_logs()
    ops = {op_key(o): o for o in load_op_db()}
    with open(out_path, "a", buffering=1) as out, torch.inference_mode():
        def write(obj: dict[str, Any]) -> None:
            out.write(json.dumps(obj, default=str) + "\n")

        for name in op_names:
            for dt_name in supported_dtypes(ops[name], dtypes):
                for rec in run_op(ops[name], dt_name, routes, limit, timeout_s, skip, on_start=write):
                    write(rec)
        write({"event": "worker_done"})


# ---- the driver: workers, restarts, the table ---------------------------------------------------


def read_records(paths: list[Path]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(results, dangling starts): a start with no result after it means the worker died on it."""
    results: list[dict[str, Any]] = []
    dangling: list[dict[str, Any]] = []
    for p in paths:
        if not p.exists():
            continue
        pending: dict[tuple[Any, ...], dict[str, Any]] = {}
        for line in p.read_text().splitlines():
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line cut short by a crash
            if "op" not in rec:
                continue
            key = (rec["op"], rec["dtype"], rec["index"], rec["route"])
            if rec.get("event") == "start":
                pending[key] = rec
            else:
                pending.pop(key, None)
                results.append(rec)
        dangling.extend(pending.values())
    return results, dangling


def _key(rec: dict[str, Any]) -> tuple[str, str, int, str]:
    return (rec["op"], rec["dtype"], rec["index"], rec["route"])


def drive(args: argparse.Namespace, op_names: list[str]) -> list[dict[str, Any]]:
    """Run the ops over `args.jobs` workers; restart a worker that dies or hangs after recording the
    sample it was on as a crash or timeout."""
    base = Path(args.json) if args.json else Path(tempfile.mkdtemp(prefix="conformance_")) / "opinfo.json"
    base.parent.mkdir(parents=True, exist_ok=True)
    parts = [base.with_name(f"{base.name}.part{k}.jsonl") for k in range(args.jobs)]
    if not args.resume:
        for p in base.parent.glob(f"{base.name}.part*.jsonl"):
            p.unlink()
    shards = [op_names[k::args.jobs] for k in range(args.jobs)]
    procs: dict[int, subprocess.Popen[bytes]] = {}
    last_size: dict[int, tuple[int, float]] = {}
    finished: set[int] = set()
    hang_s = max(60.0, 3 * args.timeout)

    def start(k: int) -> None:
        done, _ = read_records(list(base.parent.glob(f"{base.name}.part*.jsonl")))
        skip_file = base.with_name(f"{base.name}.skip{k}.json")
        skip_file.write_text(json.dumps([_key(r) for r in done]))
        cmd = [sys.executable, __file__, "--worker", "--ops", ",".join(shards[k]),
               "--dtypes", ",".join(args.dtypes),
               "--routes", ",".join(args.routes), "--timeout", str(args.timeout), "--part", str(parts[k]),
               "--skip-file", str(skip_file)]  # fmt: skip
        if args.limit_samples is not None:
            cmd += ["--limit-samples", str(args.limit_samples)]
        procs[k] = subprocess.Popen(cmd)
        last_size[k] = (parts[k].stat().st_size if parts[k].exists() else 0, time.monotonic())

    for k in range(args.jobs):
        if shards[k]:
            start(k)
        else:
            finished.add(k)
    while len(finished) < args.jobs:
        time.sleep(1.0)
        for k, p in list(procs.items()):
            if k in finished:
                continue
            rc = p.poll()
            size = parts[k].stat().st_size if parts[k].exists() else 0
            if rc is None:
                if size != last_size[k][0]:
                    last_size[k] = (size, time.monotonic())
                elif time.monotonic() - last_size[k][1] > hang_s:
                    p.kill()  # our own worker, by its handle
                    p.wait()
                    _record_dangling(parts[k], "timeout", f"worker made no progress for {hang_s:g} s; killed")
                    start(k)
                continue
            text = parts[k].read_text() if parts[k].exists() else ""
            if text.rstrip().endswith('{"event": "worker_done"}'):
                finished.add(k)
                continue
            how = f"signal {-rc}" if rc < 0 else f"exit status {rc}"
            if not _record_dangling(parts[k], "crash", f"worker died ({how})"):
                print(f"worker {k} died ({how}) outside a sample; not restarting", file=sys.stderr)
                finished.add(k)
                continue
            start(k)
    results, _ = read_records(parts)
    return results


def _record_dangling(part: Path, status: str, message: str) -> bool:
    """Record the run the worker was on when it died (its start line is the file's last line)."""
    lines = [ln for ln in part.read_text().splitlines() if ln.strip()] if part.exists() else []
    try:
        last = json.loads(lines[-1]) if lines else {}
    except json.JSONDecodeError:  # cut short mid-write: the start line before it is the culprit
        last = json.loads(lines[-2]) if len(lines) > 1 else {}
    if last.get("event") != "start":
        return False
    rec = {k: v for k, v in last.items() if k != "event"}
    with open(part, "a") as out:
        out.write("\n" + json.dumps({**rec, "status": status, "message": message}) + "\n")
    return True


STATUSES = ("pass", "wrong", "error", "fallback", "crash", "timeout")


def table(records: list[dict[str, Any]], which: str) -> str:
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    for r in records:
        fresh = {s: 0 for s in (*STATUSES, "skip", "gen")} | {"samples": set()}
        row = rows.setdefault((r["op"], r["dtype"]), fresh)
        row[r["status"]] += 1
        if r["status"] != "skip":
            row["samples"].add(r["index"])
            row["gen"] += bool(r.get("generated"))
    cols = ["op", "dtype", "samples", "runs", *STATUSES, "gen", "skip"]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for (op, dt), row in sorted(rows.items()):
        runs = sum(row[s] for s in STATUSES)
        bad = row["wrong"] + row["error"] + row["crash"] + row["timeout"]
        if which == "failing" and not bad:
            continue
        cells = [op, dt, len(row["samples"]), runs, *(row[s] for s in STATUSES), row["gen"], row["skip"]]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return "\n".join(lines)


def summary(records: list[dict[str, Any]], wall_s: float) -> dict[str, Any]:
    runs = [r for r in records if r["status"] != "skip"]
    out: dict[str, Any] = {s: sum(r["status"] == s for r in runs) for s in STATUSES}
    out["ops"] = len({r["op"] for r in runs})
    out["samples"] = len({(r["op"], r["dtype"], r["index"]) for r in runs})
    out["runs"] = len(runs)
    out["skipped"] = len(records) - len(runs)
    compiled = [r for r in runs if r["status"] in ("pass", "wrong")]
    out["generated_runs"] = sum(bool(r.get("generated")) for r in compiled)
    out["extern_or_view_only_runs"] = len(compiled) - out["generated_runs"]
    out["direct_eager_fallback"] = sum(r["status"] == "fallback" and r["route"] == "direct" for r in runs)
    out["error_classes"] = len({r.get("error_class") for r in runs if r["status"] == "error"})
    out["wall_s"] = round(wall_s, 1)
    return out


def report(records: list[dict[str, Any]], wall_s: float, which: str) -> str:
    s = summary(records, wall_s)
    lines = [table(records, which), "",
             f"{s['ops']} ops, {s['samples']} samples, {s['runs']} runs (sample x route): {s['pass']} pass, "
             f"{s['wrong']} wrong, {s['error']} error ({s['error_classes']} classes), "
             f"{s['fallback']} fallback, {s['crash']} crash, {s['timeout']} timeout; "
             f"{s['skipped']} skipped. Of the passing and wrong runs, "
             f"{s['generated_runs']} ran generated code, {s['extern_or_view_only_runs']} only externs/views. "
             f"Direct-route eager fallbacks: {s['direct_eager_fallback']}. "
             f"Wall {s['wall_s']} s."]  # fmt: skip
    errors: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        if r["status"] == "error":
            errors.setdefault(r["error_class"], []).append(r)
    if errors:
        lines += ["", "Error classes (count, first example):"]
        for cls, rs in sorted(errors.items(), key=lambda kv: -len(kv[1])):
            ex = rs[0]
            lines.append(f"  {len(rs):4d}  {cls}\n"
                         f"        e.g. {ex['op']} {ex['dtype']} #{ex['index']} {ex['route']} "
                         f"{ex.get('sample', '')[:160]}")  # fmt: skip
    skips: dict[str, int] = {}
    for r in records:
        if r["status"] == "skip":
            why = re.sub(r"\d+", "N", r.get("message", ""))[:100]
            skips[why] = skips.get(why, 0) + 1
    if skips:
        lines += ["", "Skipped (count, reason):"]
        lines += [f"  {n:4d}  {why}" for why, n in sorted(skips.items(), key=lambda kv: -kv[1])[:30]]
    wrong = [r for r in records if r["status"] in ("wrong", "crash", "timeout")]
    if wrong:
        lines += ["", "Wrong / crash / timeout:"]
        for r in wrong:
            lines.append(f"  {r['status']:7s} {r['op']} {r['dtype']} #{r['index']} {r['route']} "
                         f"{r.get('sample', '')[:160]}\n          {r.get('message', '')[:300]}")  # fmt: skip
    return "\n".join(lines)


def select_ops(all_ops: list[Any], wanted: list[str] | None) -> list[str]:
    keys = [op_key(o) for o in all_ops]
    if not wanted:
        return keys
    chosen = [k for k, o in zip(keys, all_ops, strict=True) if k in wanted or o.name in wanted]
    names = set(keys) | {o.name for o in all_ops}
    missing = [w for w in wanted if w not in names]
    if missing:
        raise SystemExit(f"unknown op(s): {', '.join(missing)}")
    return chosen


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawTextHelpFormatter)
    csv = lambda s: [x for x in s.split(",") if x]  # noqa: E731
    ap.add_argument("--ops", type=csv, default=None,
                    help="op names (all their variants) or name.variant, comma-separated")
    ap.add_argument("--dtypes", type=csv, default=list(DEFAULT_DTYPES))
    ap.add_argument("--routes", type=csv, default=list(ROUTES))
    ap.add_argument("--limit-samples", type=int, default=None, help="first N samples per op and dtype")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds per sample and route")
    ap.add_argument("--jobs", type=int, default=1, help="worker processes")
    ap.add_argument("--json", default="", help="write every record here (part files beside it while running)")
    ap.add_argument("--resume", action="store_true", help="keep the results already in --json's part files")
    ap.add_argument("--table", choices=("all", "failing"), default="all", help="rows to print")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--part", default="", help=argparse.SUPPRESS)
    ap.add_argument("--skip-file", default="", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    bad = [d for d in args.dtypes if not isinstance(getattr(torch, d, None), torch.dtype)]
    if bad:
        ap.error(f"unknown dtype(s): {', '.join(bad)}")
    bad = [r for r in args.routes if r not in ROUTES]
    if bad:
        ap.error(f"unknown route(s): {', '.join(bad)} (choose from {', '.join(ROUTES)})")
    if args.jobs < 1:
        ap.error("--jobs must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.worker:
        skip = {tuple(k) for k in json.loads(Path(args.skip_file).read_text())} if args.skip_file else set()
        worker(args.ops or [], args.dtypes, args.routes, args.limit_samples, args.timeout, Path(args.part),
               skip)
        return 0
    t0 = time.perf_counter()
    op_names = select_ops(load_op_db(), args.ops)
    records = drive(args, op_names)
    wall = time.perf_counter() - t0
    print(report(records, wall, args.table))
    if args.json:
        meta = {"argv": sys.argv[1:], "torch": torch.__version__, "wall_s": round(wall, 1),
                "summary": summary(records, wall)}  # fmt: skip
        Path(args.json).write_text(json.dumps({"meta": meta, "records": records}, indent=0, default=str))
    s = summary(records, wall)
    return 1 if s["wrong"] or s["crash"] else 0


if __name__ == "__main__":
    sys.exit(main())
