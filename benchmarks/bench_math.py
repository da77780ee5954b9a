"""Vector math benchmark: the cost per element of each af_math.h function against ATen's (SLEEF) kernel.

For each function, autofusion compiles `fn(x)` into one generated kernel; the benchmark calls that kernel
directly (through its ctypes entry, with the same input and output buffers every time) and ATen's
`fn(x, out=y)` on the same buffers, so neither side pays Python dispatch, output allocation or page faults.
Everything runs in one process: in each round every contender takes one turn, in an order that rotates,
each turn a few untimed calls and then a timed batch of calls; each figure is the median over the rounds.
It runs with 1 thread and with 2 (`torch.set_num_threads`, which sets the OpenMP team size that ATen and
the generated kernels share). Turns are timed in CPU time (see `cpu_clock`): ns/element/core = CPU
seconds per call / elements with one thread, wall seconds x threads / elements with more.

The kernel cases (GPT-2's tanh-GELU written out, erf-GELU, softmax over rows) are timed as whole calls of
`autofusion.compile(fn)` against eager and, where onnxruntime is installed, ONNX Runtime.

    .venv/bin/python benchmarks/bench_math.py [--rounds N] [--only exp tanh ...] [--threads 1 2]

See benchmarks/README.md ("bench_math.py").
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F

import autofusion

try:
    import onnxruntime as ort
    from onnx import TensorProto, helper

    ORT_ERROR = ""
except ImportError as e:
    ORT_ERROR = f"onnxruntime not importable ({e})"

SHAPE = (128, 3072)  # GPT-2's MLP activation: 1.5 MiB, beyond L2 (in L3) on the 2-core test machine
TURN_S = 0.004  # CPU seconds per timed batch: short, so other processes rarely share one


def _randn(*shape: int, scale: float = 3.0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(0)) * scale


# name -> (our function, ATen call with out=, input maker)
Fn = Callable[[torch.Tensor], torch.Tensor]
Out = Callable[[torch.Tensor, torch.Tensor], Any]
FUNCTIONS: dict[str, tuple[Fn, Out, Callable[[], torch.Tensor]]] = {
    "exp": (torch.exp, lambda x, y: torch.exp(x, out=y), lambda: _randn(*SHAPE)),
    "log": (torch.log, lambda x, y: torch.log(x, out=y), lambda: _randn(*SHAPE).abs() + 1e-3),
    "tanh": (torch.tanh, lambda x, y: torch.tanh(x, out=y), lambda: _randn(*SHAPE)),
    "erf": (torch.erf, lambda x, y: torch.erf(x, out=y), lambda: _randn(*SHAPE, scale=1.5)),
    "sigmoid": (torch.sigmoid, lambda x, y: torch.sigmoid(x, out=y), lambda: _randn(*SHAPE)),
    # + 0.0: a lone erf-GELU this large runs as ATen's kernel (plan/schedule.py); the add keeps it ours
    "gelu": (lambda x: F.gelu(x) + 0.0, lambda x, y: torch._C._nn.gelu(x, out=y), lambda: _randn(*SHAPE)),
    "gelu_tanh": (
        lambda x: F.gelu(x, approximate="tanh"),
        lambda x, y: torch._C._nn.gelu(x, approximate="tanh", out=y),
        lambda: _randn(*SHAPE),
    ),
    "silu": (F.silu, lambda x, y: torch._C._nn.silu(x, out=y), lambda: _randn(*SHAPE)),
    "pow_2.5": (lambda x: x**2.5, lambda x, y: torch.pow(x, 2.5, out=y), lambda: _randn(*SHAPE).abs()),
    "pow_1.7": (lambda x: x**1.7, lambda x, y: torch.pow(x, 1.7, out=y), lambda: _randn(*SHAPE).abs()),
    "sin": (torch.sin, lambda x, y: torch.sin(x, out=y), lambda: _randn(*SHAPE)),
    "cos": (torch.cos, lambda x, y: torch.cos(x, out=y), lambda: _randn(*SHAPE)),
}


# float64 references without the cancellation of 0.5 x (1 + erf or tanh) for x < 0 (torch's float64 GELU
# cancels too, so against it a tail-accurate result would show a large relative error); default fn(x.double())
REFERENCES: dict[str, Fn] = {
    "gelu": lambda t: 0.5 * t * torch.special.erfc(-t * math.sqrt(0.5)),
    "gelu_tanh": lambda t: t * torch.sigmoid(2.0 * math.sqrt(2.0 / math.pi) * (t + 0.044715 * t**3)),
}


def gelu_tanh_formula(x: torch.Tensor) -> torch.Tensor:
    """GPT-2's `NewGELUActivation`, as transformers writes it."""
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


def gelu_erf(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x)


def softmax(x: torch.Tensor) -> torch.Tensor:
    return torch.softmax(x, -1)


KERNELS: dict[str, tuple[Fn, tuple[int, ...], str]] = {
    "gelu_tanh_formula 128x3072": (gelu_tanh_formula, (128, 3072), ""),
    "gelu_erf 128x3072": (gelu_erf, (128, 3072), "Gelu"),
    "softmax 128x3072": (softmax, (128, 3072), "Softmax"),
    "softmax 12288x128": (softmax, (8 * 12 * 128, 128), "Softmax"),
}


def kernel_entry(cm: autofusion.CompiledModel) -> Callable[[torch.Tensor, torch.Tensor], None]:
    """The one generated kernel of a one-kernel plan, as a call on (input, output) buffers."""
    last = cm.last
    if not isinstance(last, autofusion.api.CompiledGraph) or last.program is None:
        raise RuntimeError(f"no generated program: {cm.stats.get('build_error') or last}")
    kernels = [p for p in last.program.executor._program if p[0] == "kernel"]
    if len(kernels) != 1 or len(last.program.executor._program) != 1:
        steps = [getattr(s, "reason", type(s).__name__) for s in last.program.plan.steps]
        raise RuntimeError(f"expected one generated kernel, got {steps}")
    _, fn, _, _, _, arr_type, _, p_addr = kernels[0]

    def call(x: torch.Tensor, y: torch.Tensor) -> None:
        fn(arr_type(x.data_ptr(), y.data_ptr()), p_addr)

    return call


def cpu_clock() -> Callable[[], float]:
    """The clock turns are timed with. One thread: its CPU time, not wall time (on a loaded machine a batch
    is descheduled in proportion to its wall length, so wall time makes the slower contender look slower
    still). More threads: wall time, in short batches; their CPU time would count what a thread spins at
    a barrier while its partner is descheduled, which on a loaded machine is most of it."""
    return time.thread_time if torch.get_num_threads() == 1 else time.perf_counter


def batch_time(f: Callable[[], Any]) -> float:
    """CPU seconds per call: a few untimed calls, then calls for about TURN_S of CPU time."""
    clock = cpu_clock()
    for _ in range(3):
        f()
    n, t0 = 0, clock()
    while True:
        f()
        n += 1
        t = clock() - t0
        if t >= TURN_S:
            return t / n


def alternate(fns: dict[str, Callable[[], Any]], rounds: int) -> dict[str, float]:
    """Median seconds per call of each contender, turns rotating round by round."""
    names = list(fns)
    samples: dict[str, list[float]] = {k: [] for k in names}
    for r in range(rounds):
        for k in names[r % len(names) :] + names[: r % len(names)]:
            samples[k].append(batch_time(fns[k]))
    return {k: statistics.median(v) for k, v in samples.items()}


def check(ours: torch.Tensor, ref: torch.Tensor, name: str) -> str:
    """ok, or MISMATCH with the largest absolute error, against a reference (float64 where there is one)"""
    if torch.allclose(ours.double(), ref.double(), rtol=1e-5, atol=1e-6, equal_nan=True):
        return "ok"
    return f"MISMATCH {(ours.double() - ref.double()).abs().max().item():.2e}"


def max_errors(ours: torch.Tensor, aten: torch.Tensor, ref64: torch.Tensor) -> str:
    """largest absolute and relative error of each side against float64 (relative over normal results)"""
    cells = []
    for name, y in (("ours", ours), ("aten", aten)):
        d = (y.double() - ref64).abs()
        normal = ref64.abs() >= torch.finfo(torch.float32).tiny
        rel = (d[normal] / ref64.abs()[normal]).max().item() if normal.any() else 0.0
        cells.append(f"{name} abs {d.max().item():.1e} rel {rel:.1e}")
    return "; ".join(cells)


def bench_functions(names: Sequence[str], threads: Sequence[int], rounds: int) -> None:
    print(f"per-function cost on a {SHAPE[0]}x{SHAPE[1]} fp32 buffer, ns/element/core (median of {rounds})")
    print(
        f"{'function':<12}"
        + "".join(f"{f'ours@{t}':>10}{f'aten@{t}':>10}{f'ratio@{t}':>10}" for t in threads)
    )
    for name in names:
        fn, aten, make = FUNCTIONS[name]
        x = make()
        cm = autofusion.compile(fn, (x,))
        ours_call = kernel_entry(cm)
        y_ours, y_aten = torch.empty_like(x), torch.empty_like(x)
        ours_call(x, y_ours)
        aten(x, y_aten)
        ref64 = REFERENCES.get(name, fn)(x.double())
        status = check(y_ours, ref64, name)
        row = f"{name:<12}"
        for t in threads:
            torch.set_num_threads(t)
            med = alternate(
                {
                    "ours": lambda c=ours_call, x=x, y=y_ours: c(x, y),
                    "aten": lambda f=aten, x=x, y=y_aten: f(x, y),
                },
                rounds,
            )
            per = {k: v * (1 if t == 1 else t) / x.numel() * 1e9 for k, v in med.items()}
            row += f"{per['ours']:>10.3f}{per['aten']:>10.3f}{med['aten'] / med['ours']:>9.2f}x"
        print(row + f"  {status} ({max_errors(y_ours, y_aten, ref64)})")


def ort_session(op: str, shape: tuple[int, ...]) -> Callable[[Any], Any]:
    vi = helper.make_tensor_value_info
    node = helper.make_node(op, ["x"], ["out"], **({"axis": -1} if op == "Softmax" else {}))
    graph = helper.make_graph([node], op, [vi("x", TensorProto.FLOAT, list(shape))],
                              [vi("out", TensorProto.FLOAT, list(shape))])  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)], ir_version=9)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = torch.get_num_threads()
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return lambda feed: sess.run(["out"], {"x": feed})[0]


def bench_kernels(names: Sequence[str], threads: Sequence[int], rounds: int) -> None:
    print(
        f"\nkernels: median us per call (CPU us at 1 thread, wall at more; median of {rounds}); peer / ours"
    )
    for name in names:
        fn, shape, onnx_op = KERNELS[name]
        x = _randn(*shape)
        cm = autofusion.compile(fn, (x,))
        ref = fn(x)
        status = check(cm(x), ref, name)
        for t in threads:
            torch.set_num_threads(t)
            fns: dict[str, Callable[[], Any]] = {
                "ours": lambda cm=cm, x=x: cm(x),
                "eager": lambda fn=fn, x=x: fn(x),
            }
            if onnx_op and not ORT_ERROR:
                run = ort_session(onnx_op, shape)
                xn = x.numpy()
                fns["ort"] = lambda run=run, xn=xn: run(xn)
            med = alternate(fns, rounds)
            cells = "  ".join(
                f"{k} {v * 1e6:8.1f}" + ("" if k == "ours" else f" ({v / med['ours']:.2f}x)")
                for k, v in med.items()
            )
            print(f"{name:<28} @{t}  {cells}  {status}")


def main(argv: Sequence[str] | None = None) -> int:
    global SHAPE
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=11)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--only", nargs="+", default=None, help="function or kernel names (prefixes)")
    ap.add_argument("--shape", type=int, nargs=2, default=[128, 3072], help="buffer of the function table")
    args = ap.parse_args(argv)
    SHAPE = (args.shape[0], args.shape[1])

    def pick(names: Sequence[str]) -> list[str]:
        return [n for n in names if args.only is None or any(n.startswith(o) for o in args.only)]

    torch.manual_seed(0)
    with torch.no_grad():
        bench_functions(pick(list(FUNCTIONS)), args.threads, args.rounds)
        bench_kernels(pick(list(KERNELS)), args.threads, args.rounds)
    if ORT_ERROR:
        print(f"ort: n/a ({ORT_ERROR})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
