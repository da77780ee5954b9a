"""Long-run stress: thousands of random programs through autofusion, each checked against eager.

    .venv/bin/python benchmarks/stress.py --n 3000 --seed 1 --hog 2 --out stress_out
    .venv/bin/python benchmarks/stress.py --n 200 --budget-s 600 --max-numel 1000000

Each program is a few lines of torch code (elementwise with broadcasting, views: permute, transpose,
slice, expand, reshape, diagonal; reductions, softmax/layer_norm, matmul, casts through half types,
cat), drawn from `random.Random(seed * 1000003 + index)` as Python source, so a failing program is
saved as a script that reproduces it on its own. All run in one process, in the order drawn, with
poison mode on (AUTOFUSION_POISON=1, set before autofusion is imported; a build without the option
ignores it, and the report says which), optionally beside CPU hog processes (`--hog N`). Per program: compile
(`autofusion.compile`, or `torch.compile(backend="autofusion")` for `--dynamo-share` of them), run,
compare with eager, run again on new inputs and check that the first call's outputs were not
overwritten. benchmarks/README.md explains the counts.

The generator is our own rather than the hypothesis strategies of the test suite: hypothesis draws
only inside a test (`.example()` is for interactive use and gives no reproducible stream), and a
program rendered as source is its own repro.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

POISON = os.environ.setdefault("AUTOFUSION_POISON", "1")  # before autofusion is imported: config reads it

import torch  # noqa: E402

DTYPES = ("float32", "float16", "bfloat16")
MAX_VALUE_NUMEL = 64 * 1024 * 1024  # no intermediate past this (views like expand can grow a value)

# ---- programs ------------------------------------------------------------------------------------


@dataclass
class Program:
    index: int
    seed: int
    dtype: str
    inputs: list[tuple[str, tuple[int, ...]]]  # name, shape
    lines: list[str]
    outputs: list[str]
    specials: bool  # inputs hold inf, -inf, nan, -0.0 and subnormals at a few places
    route: str = "direct"

    @property
    def source(self) -> str:
        args = ", ".join(n for n, _ in self.inputs)
        body = "\n".join(f"    {ln}" for ln in self.lines)
        ret = self.outputs[0] if len(self.outputs) == 1 else "(" + ", ".join(self.outputs) + ",)"
        return f"def f({args}):\n{body}\n    return {ret}\n"

    @property
    def numel(self) -> int:
        return max(math.prod(s) for _, s in self.inputs)


def _numel_target(rng: random.Random, max_numel: int) -> int:
    """Log-uniform in bands, biased to small sizes so thousands of programs finish: 60 % up to 4k
    elements (odd sizes, below the parallel threshold), 25 % up to 256k, 12 % up to 4M, 3 % up to
    `max_numel` (32M by default)."""
    r = rng.random()
    lo, hi = (1, 4096) if r < 0.6 else (4096, 1 << 18) if r < 0.85 else (1 << 18, 1 << 22) if r < 0.97 else (
        1 << 22, max_numel)  # fmt: skip
    hi = max(lo, min(hi, max_numel))
    return max(1, int(math.exp(rng.uniform(math.log(lo), math.log(hi)))))


def _shape_for(rng: random.Random, numel: int) -> tuple[int, ...]:
    rank = rng.choice([1, 2, 2, 3, 3, 4])
    dims = []
    left = numel
    for k in range(rank - 1):
        d = max(1, int(round(left ** (1.0 / (rank - k)) * rng.uniform(0.3, 2.0))))
        if rng.random() < 0.1:
            d = 1
        dims.append(d)
        left = max(1, left // d)
    dims.append(max(1, left))
    rng.shuffle(dims)
    return tuple(dims)


def _broadcast(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...] | None:
    out = []
    pa, pb = (1,) * (len(b) - len(a)) + a, (1,) * (len(a) - len(b)) + b
    for x, y in zip(reversed(pa), reversed(pb), strict=True):
        if x != y and 1 not in (x, y):
            return None
        out.append(max(x, y))
    return tuple(reversed(out))


UNARY = ("torch.tanh({a})", "torch.sigmoid({a})", "torch.relu({a})", "torch.neg({a})", "{a}.abs().sqrt()",
         "torch.exp({a})", "torch.sin({a})", "{a}.clamp(-0.5, 0.5)", "torch.nn.functional.gelu({a})",
         "torch.nn.functional.silu({a})", "torch.log1p({a}.abs())", "{a} * 0.5 + 1.0", "torch.erf({a})",
         "torch.rsqrt({a}.abs() + 1e-3)")  # fmt: skip
# Steps, not continuous: applied to inputs only (exact values), since on a computed value one ulp of
# legitimate rounding difference moves the result by a whole step. A round trip through a half type
# is such a step too (at fp32 resolution: exp(x) one ulp off can round to the other fp16 neighbour).
STEPS = ("torch.round({a})", "torch.floor({a} * 4.0)")
HALF_CASTS = ("{a}.to(torch.float16).to({a}.dtype)", "{a}.to(torch.bfloat16).to({a}.dtype)")
BINARY = ("{a} + {b}", "{a} - {b}", "{a} * {b}", "torch.maximum({a}, {b})", "torch.minimum({a}, {b})",
          "torch.where({a} > {b}, {a}, {b} * 0.5)", "{a} / ({b}.abs() + 1.0)", "{a} / {b}")  # fmt: skip


class Gen:
    """One random program: inputs of one dtype, then 1-8 steps, each on values already made."""

    def __init__(self, rng: random.Random, max_numel: int, half_casts: bool = True) -> None:
        self.rng = rng
        self.unary_ops = UNARY
        self.steps = STEPS + HALF_CASTS if half_casts else STEPS
        self.max_numel = max_numel
        self.lines: list[str] = []
        self.vals: list[tuple[str, tuple[int, ...]]] = []
        self.inputs: list[tuple[str, tuple[int, ...]]] = []

    def new_input(self, shape: tuple[int, ...]) -> str:
        name = f"x{len(self.inputs)}"
        self.inputs.append((name, shape))
        self.vals.append((name, shape))
        return name

    def emit(self, expr: str, shape: tuple[int, ...]) -> str:
        name = f"v{len(self.lines)}"
        self.lines.append(f"{name} = {expr}")
        self.vals.append((name, shape))
        return name

    def pick(self, pred: Any = None) -> tuple[str, tuple[int, ...]] | None:
        pool = [v for v in self.vals if pred is None or pred(v[1])]
        if not pool:
            return None
        # Mostly the newest value, so programs chain (dead branches would just be dropped).
        if self.rng.random() < 0.6:
            return pool[-1]
        return pool[min(len(pool) - 1, int(len(pool) * (1 - self.rng.random() ** 2)))]

    def program(self, index: int, seed: int) -> Program:
        rng = self.rng
        dtype = rng.choices(DTYPES, [0.7, 0.15, 0.15])[0]
        base = _shape_for(rng, _numel_target(rng, self.max_numel))
        self.new_input(base)
        for _ in range(rng.randint(0, 2)):  # broadcast partners: some dims 1, maybe fewer leading dims
            drop = rng.randint(0, len(base) - 1) if rng.random() < 0.3 else 0
            self.new_input(tuple(1 if rng.random() < 0.4 else d for d in base[drop:]))
        for _ in range(rng.randint(1, 8)):
            step = rng.choices(["unary", "binary", "reduce", "view", "matmul", "cat"], [4, 4, 3, 3, 1, 1])[0]
            getattr(self, step)()
        outs = [self.vals[-1][0]]
        if len(self.vals) > 2 and rng.random() < 0.3:
            extra = self.pick(lambda s: True)
            if extra and extra[0] not in outs and not extra[0].startswith("x"):
                outs.append(extra[0])
        return Program(index, seed, dtype, list(self.inputs), list(self.lines), outs, rng.random() < 0.1)

    def unary(self) -> None:
        if self.rng.random() < 0.15:
            a, s = self.rng.choice(self.inputs)
            self.emit(self.rng.choice(self.steps).format(a=a), s)
            return
        a, s = self.pick()  # type: ignore[misc]
        self.emit(self.rng.choice(self.unary_ops).format(a=a), s)

    def binary(self) -> None:
        a, sa = self.pick()  # type: ignore[misc]
        def fits(s: tuple[int, ...]) -> bool:
            out = _broadcast(sa, s)
            return out is not None and math.prod(out) <= MAX_VALUE_NUMEL

        b = self.pick(fits)
        b_name, sb = b if b is not None else (a, sa)
        self.emit(self.rng.choice(BINARY).format(a=a, b=b_name), _broadcast(sa, sb))  # type: ignore[arg-type]

    def reduce(self) -> None:
        got = self.pick(lambda s: len(s) >= 1)
        if got is None:
            return self.unary()
        a, s = got
        rng = self.rng
        d = rng.randrange(len(s))
        keep = rng.random() < 0.5
        kind = rng.choice(["sum", "mean", "amax", "amin", "var", "softmax", "log_softmax", "layer_norm",
                           "sum_all"])
        if kind in ("softmax", "log_softmax"):
            self.emit(f"torch.{kind}({a}, {d})", s)
        elif kind == "layer_norm":
            self.emit(f"torch.nn.functional.layer_norm({a}, {s[-1:]!r})", s)
        elif kind == "sum_all":
            self.emit(f"{a}.sum()", ())
        else:
            out = tuple(1 if i == d else n for i, n in enumerate(s)) if keep else s[:d] + s[d + 1:]
            self.emit(f"{a}.{kind}({d}, keepdim={keep})", out)

    def view(self) -> None:
        got = self.pick(lambda s: len(s) >= 1)
        if got is None:
            return self.unary()
        a, s = got
        rng = self.rng
        kind = rng.choice(["permute", "transpose", "slice", "expand", "reshape", "unsqueeze", "diagonal",
                           "flip_back"])
        if kind == "permute" and len(s) >= 2:
            p = list(range(len(s)))
            rng.shuffle(p)
            self.emit(f"{a}.permute({', '.join(map(str, p))})", tuple(s[i] for i in p))
        elif kind == "transpose" and len(s) >= 2:
            i, j = rng.sample(range(len(s)), 2)
            t = list(s)
            t[i], t[j] = t[j], t[i]
            self.emit(f"{a}.transpose({i}, {j})", tuple(t))
        elif kind == "slice":
            d = rng.randrange(len(s))
            start, step = rng.randint(0, max(0, s[d] // 3)), rng.choice([1, 1, 2, 3])
            n = len(range(start, s[d], step))
            if n == 0:
                return self.unary()
            idx = ", ".join([":"] * d + [f"{start}::{step}"])
            self.emit(f"{a}[{idx}]", s[:d] + (n,) + s[d + 1:])
        elif kind == "expand" and 1 in s:
            d = s.index(1)
            grow = rng.randint(2, 7)
            t = s[:d] + (grow,) + s[d + 1:]
            if math.prod(t) > MAX_VALUE_NUMEL:
                return self.unary()
            self.emit(f"{a}.expand({', '.join(map(str, t))})", t)
        elif kind == "reshape":
            if len(s) >= 2 and rng.random() < 0.5:
                t = s[:-2] + (s[-2] * s[-1],)
            else:
                t = (math.prod(s),)
            self.emit(f"{a}.reshape({', '.join(map(str, t))}{',' if len(t) == 1 else ''})", t)
        elif kind == "diagonal" and len(s) >= 2:
            i, j = sorted(rng.sample(range(len(s)), 2))
            rest = tuple(n for k, n in enumerate(s) if k not in (i, j))
            self.emit(f"torch.diagonal({a}, 0, {i}, {j})", rest + (min(s[i], s[j]),))
        elif kind == "unsqueeze":
            d = rng.randint(0, len(s))
            self.emit(f"{a}.unsqueeze({d})", s[:d] + (1,) + s[d:])
        else:  # a view that changes nothing on paper: non-contiguous data in, contiguous-shaped out
            if len(s) >= 2:
                self.emit(f"{a}.transpose(0, 1).contiguous().transpose(0, 1) + 1.0", s)
            else:
                self.emit(f"{a}.flip(0)", s)

    def matmul(self) -> None:
        got = self.pick(lambda s: len(s) >= 2 and s[-1] <= 4096)
        if got is None:
            return self.binary()
        a, s = got
        k = s[-1]
        n = self.rng.choice([1, 3, 16, 64, 127])
        while n > 1 and math.prod(s) * n > 2e8:  # keep one matmul under ~0.2 GFLOP
            n //= 2
        w = self.new_input((k, n))
        self.emit(f"{a} @ {w}", s[:-1] + (n,))

    def cat(self) -> None:
        a, s = self.pick()  # type: ignore[misc]
        if not s:
            return self.unary()
        d = self.rng.randrange(len(s))

        def fits(t: tuple[int, ...]) -> bool:
            return len(t) == len(s) and all(
                x == y for i, (x, y) in enumerate(zip(t, s, strict=True)) if i != d
            )

        b = self.pick(fits)
        b_name, sb = b if b is not None else (a, s)
        out = s[:d] + (s[d] + sb[d],) + s[d + 1:]
        if math.prod(out) > MAX_VALUE_NUMEL:
            return self.unary()
        self.emit(f"torch.cat([{a}, {b_name}], {d})", out)


def make_program(seed: int, index: int, max_numel: int, dynamo_share: float,
                 half_casts: bool = True) -> Program:
    rng = random.Random(seed * 1_000_003 + index)
    prog = Gen(rng, max_numel, half_casts).program(index, seed)
    prog.route = "dynamo" if rng.random() < dynamo_share else "direct"
    return prog


def make_inputs(prog: Program, call: int) -> list[torch.Tensor]:
    """The program's inputs for its `call`-th call (0, 1): seeded, so a repro script rebuilds them."""
    gen = torch.Generator().manual_seed(prog.seed * 7919 + prog.index * 2 + call)
    out = []
    dt = getattr(torch, prog.dtype)
    for name, shape in prog.inputs:
        x = torch.randn(shape, generator=gen)
        if name.startswith("x") and prog.specials and x.numel() >= 6:
            x.view(-1)[:6] = torch.tensor([math.inf, -math.inf, math.nan, -0.0, 1e-40, 6e4])
        out.append(x.to(dt))
    return out


# ---- checking one program ------------------------------------------------------------------------


def _leaves(out: Any) -> list[torch.Tensor]:
    return list(out) if isinstance(out, (tuple, list)) else [out]


def _err(a: torch.Tensor, ref: torch.Tensor) -> float:
    a, ref = a.double(), ref.double()
    an, rn = torch.isnan(a), torch.isnan(ref)
    if not torch.equal(an, rn):
        return math.inf
    fin = torch.isfinite(a) & torch.isfinite(ref)
    if not torch.equal(a[~fin & ~an], ref[~fin & ~rn]):
        return math.inf
    return float((a[fin] - ref[fin]).abs().max()) if bool(fin.any()) else 0.0


def mismatch(got: Any, ref: Any, ref64: Any) -> str | None:
    """None when `got` matches eager's `ref`: within assert_close's default tolerance for the dtype
    (nan == nan), or, failing that, with a largest error against the float64 run at most 3x eager's
    plus the dtype's atol. Else what differs."""
    gl, rl = _leaves(got), _leaves(ref)
    if len(gl) != len(rl):
        return f"{len(gl)} outputs, eager has {len(rl)}"
    r64 = _leaves(ref64() if callable(ref64) else ref64)
    for k, (g, r) in enumerate(zip(gl, rl, strict=True)):
        if not isinstance(g, torch.Tensor) or g.shape != r.shape or g.dtype != r.dtype:
            return f"output {k}: {getattr(g, 'dtype', type(g))}{list(getattr(g, 'shape', []))} != eager " \
                   f"{r.dtype}{list(r.shape)}"  # fmt: skip
        try:
            torch.testing.assert_close(g, r, equal_nan=True, check_stride=False)
            continue
        except AssertionError as e:
            msg = " ".join(str(e).split())[:300]
        e_af, e_eager = _err(g, r64[k]), _err(r, r64[k])
        atol = torch.testing._comparison.default_tolerances(r)[1]
        if e_af <= 3 * e_eager + atol:
            continue
        return f"output {k}: {msg} | vs float64: autofusion err {e_af:.3g}, eager err {e_eager:.3g}"
    return None


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    # A fresh dense copy: contiguous() keeps the odd stride of a size-1 dim, which view(uint8) rejects.
    def raw(t: torch.Tensor) -> torch.Tensor:
        return torch.empty(t.shape, dtype=t.dtype).copy_(t).reshape(-1).view(torch.uint8)

    return torch.equal(raw(a), raw(b))


@dataclass
class Outcome:
    status: str  # pass, mismatch, overwritten, crash, fallback
    message: str = ""
    generated: bool = False
    seconds: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)


def _compile(prog: Program, fn: Any,
             inputs: list[torch.Tensor]) -> tuple[Any, list[dict[str, Any]], str | None]:  # fmt: skip
    """The compiled callable, the stats of each graph it holds, and why it (partly) runs eagerly."""
    import autofusion

    if prog.route == "direct":
        cm = autofusion.compile(fn, inputs)
        st = cm.stats
        return cm, ([] if "eager_fallback" in st else [st]), st.get("eager_fallback")
    from autofusion.backend import autofusion_backend

    graphs: list[Any] = []

    def backend(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        run = autofusion_backend(gm, example_inputs)
        graphs.append(getattr(run, "autofusion_graph", None))
        return run

    torch._dynamo.reset()
    cf = torch.compile(fn, backend=backend, fullgraph=False, dynamic=False)
    cf(*inputs)  # compiles; the checked calls follow
    why = None if graphs and all(g is not None for g in graphs) else "the backend ran a graph eagerly"
    return cf, [g.stats() for g in graphs if g is not None], why


def check(prog: Program) -> Outcome:
    t0 = time.perf_counter()
    scope: dict[str, Any] = {"torch": torch}
    exec(compile(prog.source, f"<program {prog.index}>", "exec"), scope)  # noqa: S102 - our own source
    fn = scope["f"]
    x1, x2 = make_inputs(prog, 0), make_inputs(prog, 1)
    with torch.inference_mode():
        try:
            ref1 = fn(*x1)
        except Exception as e:  # the generator made something eager rejects: not a finding
            return Outcome("invalid", f"eager raises {type(e).__name__}: {e}"[:300])
        ref2 = fn(*x2)
        ref64 = lambda xs: (lambda: fn(*[x.double() for x in xs]))  # noqa: E731 - only on a mismatch
        try:
            run, stats, why = _compile(prog, fn, x1)
            out1 = run(*x1)
            kept = [t.clone() for t in _leaves(out1)]
            bad = mismatch(out1, ref1, ref64(x1))
            out2 = run(*x2)
            bad2 = mismatch(out2, ref2, ref64(x2))
        except Exception as e:
            tb = traceback.format_exc(limit=-6)
            return Outcome("crash", f"{type(e).__name__}: {' '.join(str(e).split())[:400]}\n{tb}",
                           seconds=time.perf_counter() - t0)  # fmt: skip
        finally:
            if prog.route == "dynamo":
                torch._dynamo.reset()
    generated = any(s.get("fused_kernels", 0) >= 1 and not s.get("build_error") for s in stats)
    build_errors = [s["build_error"].splitlines()[0] for s in stats if s.get("build_error")]
    dt = time.perf_counter() - t0
    if bad or bad2:
        return Outcome("mismatch", f"first call: {bad}" if bad else f"second call: {bad2}", generated, dt)
    pairs = zip(_leaves(out1), kept, strict=True)
    overwritten = [k for k, (a, b) in enumerate(pairs) if not _same_bits(a, b)]
    if overwritten:
        return Outcome("overwritten", f"outputs {overwritten} of the first call changed during the second",
                       generated, dt)  # fmt: skip
    if build_errors:
        return Outcome("build_error", build_errors[0][:300], generated, dt)
    if why:
        return Outcome("fallback", str(why).splitlines()[0][:300], generated, dt)
    return Outcome("pass", "", generated, dt)


# ---- the run -------------------------------------------------------------------------------------

HOG_SOURCE = """
import os, sys, time
parent, kind = int(sys.argv[1]), sys.argv[2]
buf = bytearray(32 << 20)
while os.getppid() == parent:  # ends when the stress process does
    t = time.monotonic()
    while time.monotonic() - t < 0.5:
        if kind == "mem":
            bytes(buf)
        else:
            sum(i * i for i in range(10000))
"""


def start_hogs(n: int) -> list[subprocess.Popen[bytes]]:
    """n processes beside the run: compute loops and memory-copy loops, alternating."""
    return [subprocess.Popen([sys.executable, "-c", HOG_SOURCE, str(os.getpid()), "mem" if k % 2 else "cpu"])
            for k in range(n)]  # fmt: skip


REPRO = '''"""Repro: stress program {index} (seed {seed}, route {route}): {status}.
{message_comment}
"""
import math

import torch

import autofusion

{source}
INPUTS = {inputs!r}
DTYPE = torch.{dtype}
SPECIALS = {specials!r}


def make_inputs(call):
    gen = torch.Generator().manual_seed({seed} * 7919 + {index} * 2 + call)
    out = []
    for name, shape in INPUTS:
        x = torch.randn(shape, generator=gen)
        if name.startswith("x") and SPECIALS and x.numel() >= 6:
            x.view(-1)[:6] = torch.tensor([math.inf, -math.inf, math.nan, -0.0, 1e-40, 6e4])
        out.append(x.to(DTYPE))
    return out


with torch.inference_mode():
    x1, x2 = make_inputs(0), make_inputs(1)
    ref1, ref2 = f(*x1), f(*x2)
    run = {runner}
    out1 = run(*x1)
    keep = [t.clone() for t in (out1 if isinstance(out1, tuple) else (out1,))]
    out2 = run(*x2)
    for name, got, ref in (("first call", out1, ref1), ("second call", out2, ref2)):
        for g, r in zip(got if isinstance(got, tuple) else (got,), ref if isinstance(ref, tuple) else (ref,)):
            torch.testing.assert_close(g, r, equal_nan=True, check_stride=False,
                                       msg=lambda m: name + ": " + m)
    for a, b in zip(out1 if isinstance(out1, tuple) else (out1,), keep):
        assert torch.equal(a.nan_to_num(), b.nan_to_num()), "the first call's output was overwritten"
print("ok")
'''


def save_repro(out_dir: Path, prog: Program, res: Outcome) -> Path:
    runner = ("autofusion.compile(f, x1)" if prog.route == "direct"
              else 'torch.compile(f, backend="autofusion", fullgraph=False, dynamic=False)')  # fmt: skip
    msg = "\n".join(res.message.splitlines()[:3])
    path = out_dir / f"{res.status}_{prog.index:05d}.py"
    path.write_text(REPRO.format(index=prog.index, seed=prog.seed, route=prog.route, status=res.status,
                                 message_comment=msg.replace('"""', "'''"), source=prog.source,
                                 inputs=prog.inputs,
                                 dtype=prog.dtype, specials=prog.specials, runner=runner))  # fmt: skip
    return path


COUNTED = ("pass", "mismatch", "overwritten", "crash", "build_error", "fallback", "invalid")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=3000, help="programs to run")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--start", type=int, default=0, help="first program index (to rerun part of a seed)")
    ap.add_argument("--budget-s", type=float, default=0.0, help="stop after this many seconds (0: no cap)")
    ap.add_argument("--hog", type=int, default=0, help="CPU/memory hog processes beside the run")
    ap.add_argument("--max-numel", type=int, default=32 * 1024 * 1024, help="largest input, in elements")
    ap.add_argument("--dynamo-share", type=float, default=0.2,
                    help="share of programs run through torch.compile")
    ap.add_argument("--out", default="", help="directory for repro scripts of failures and summary.json")
    ap.add_argument("--no-poison", action="store_true", help="run with AUTOFUSION_POISON=0")
    ap.add_argument("--no-half-casts", action="store_true",
                    help="draw no casts through float16/bfloat16 (to look past a known cast bug)")
    ap.add_argument("--show", type=int, default=-1, help="print program N's source and exit")
    args = ap.parse_args(argv)
    if args.show >= 0:
        prog = make_program(args.seed, args.show, args.max_numel, args.dynamo_share, not args.no_half_casts)
        print(prog.source)
        return 0
    if args.no_poison:
        os.environ["AUTOFUSION_POISON"] = "0"  # autofusion is imported below: its Options see this
    import logging
    import warnings

    import autofusion
    from autofusion.config import Options

    warnings.filterwarnings("ignore")  # var() with one element and the like: eager's warnings, not findings
    logging.getLogger("autofusion").setLevel(logging.ERROR)
    logging.getLogger("torch._dynamo").setLevel(logging.ERROR)
    opts = Options.from_env()
    poison = getattr(opts, "poison", None)
    print(f"autofusion {autofusion.__file__}; AUTOFUSION_POISON={os.environ.get('AUTOFUSION_POISON')} "
          f"({'Options.poison=' + repr(poison) if poison is not None else 'not an option of this build'}); "
          f"hog {args.hog}; seed {args.seed}", flush=True)  # fmt: skip
    out_dir = Path(args.out) if args.out else None
    if out_dir:
        out_dir.mkdir(parents=True, exist_ok=True)
    hogs = start_hogs(args.hog)
    counts = dict.fromkeys(COUNTED, 0)
    generated = 0
    records: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    try:
        for i in range(args.start, args.start + args.n):
            if args.budget_s and time.perf_counter() - t0 > args.budget_s:
                print(f"budget of {args.budget_s:g} s reached after {i - args.start} programs", flush=True)
                break
            prog = make_program(args.seed, i, args.max_numel, args.dynamo_share, not args.no_half_casts)
            if out_dir:  # a crash of the process itself leaves the program it was on
                (out_dir / "current.py").write_text(prog.source)
            res = check(prog)
            counts[res.status] += 1
            generated += res.generated
            rec = {"index": i, "route": prog.route, "dtype": prog.dtype, "numel": prog.numel,
                   "status": res.status, "generated": res.generated,
                   "seconds": round(res.seconds, 3)}  # fmt: skip
            if res.status not in ("pass", "invalid"):
                rec["message"] = res.message.splitlines()[0] if res.message else ""
                rec["source"] = prog.source
                where = save_repro(out_dir, prog, res) if out_dir else None
                print(f"[{i}] {res.status.upper()} {prog.route} {prog.dtype} numel={prog.numel}: "
                      f"{rec['message'][:300]}" + (f" -> {where}" if where else "") + "\n" + prog.source,
                      flush=True)  # fmt: skip
            records.append(rec)
            done = i - args.start + 1
            if done % 50 == 0:
                print(f"... {done} programs, {time.perf_counter() - t0:.0f} s: "
                      + ", ".join(f"{k} {v}" for k, v in counts.items() if v), flush=True)  # fmt: skip
    finally:
        for h in hogs:
            h.terminate()
            h.wait()
    wall = time.perf_counter() - t0
    ran = sum(counts[k] for k in COUNTED if k != "invalid")
    line = (f"{ran} programs in {wall:.0f} s: {counts['pass']} passed, {counts['mismatch']} mismatches, "
            f"{counts['overwritten']} overwritten outputs, {counts['crash']} crashes, "
            f"{counts['build_error']} "
            f"build errors, {counts['fallback']} eager fallbacks; {generated} ran generated code; "
            f"{counts['invalid']} drawn programs eager rejects (not counted)")  # fmt: skip
    print(line)
    if out_dir:
        (out_dir / "current.py").unlink(missing_ok=True)
        (out_dir / "summary.json").write_text(json.dumps(
            {"argv": sys.argv[1:], "poison": os.environ.get("AUTOFUSION_POISON"), "poison_option": poison,
             "counts": counts, "generated": generated, "wall_s": round(wall, 1), "summary": line,
             "records": records}, indent=1))  # fmt: skip
    return 0 if counts["mismatch"] + counts["overwritten"] + counts["crash"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
