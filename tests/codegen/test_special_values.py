"""Every elementwise op we generate code for, on special values, through a generated kernel, against eager.

Inputs hold inf, -inf, nan, +-0.0, subnormals (of float32 and of the half type), values near overflow
(float32 max, 3e38, fp16's 65504, bfloat16's max) and ties for rounding, in fp32, fp16 and bf16; binary
ops see every pair of them. Tensors have 2 * 32768 + 13 elements, so the kernels run their parallel
loop and a vector tail, and each op also runs on a non-contiguous (transposed) view of the same data.
Each op is wrapped as `-op(-x)` (or `~op(-x)` for bool results): negation is exact for every value and
no simplification removes it, so the op runs inside a fused kernel with its neighbours. Failures print
the operands as the op saw them and the wrapped results.

Results must match eager under OpInfo-like tolerances with NaN where eager has NaN, infinities exactly,
and the sign of every zero where eager's result is a zero; EAGER_UNDEFINED lists the few elements where
eager itself has no single answer (its vector and scalar loops disagree). Ops are compiled in groups
(one graph, several outputs) to keep the number of g++ runs small; a failure lists every op of the
group that differs, with the first inputs where it does.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F

import autofusion

N = 2 * 32768 + 13  # above the parallel threshold, odd tail
FLT_MAX = float(torch.finfo(torch.float32).max)
BF16_MAX = float(torch.finfo(torch.bfloat16).max)
SPECIALS = [
    0.0, -0.0, math.inf, -math.inf, math.nan, 1e-40, -1e-40, 1e-45, FLT_MAX, -FLT_MAX, 3e38, -3e38, BF16_MAX,
    65504.0, -65504.0, 65520.0, 6e-8, -6e-8, 1e-5, -1e-5, 1.0, -1.0, 0.5, -0.5, 1.5, -1.5, 2.5, -2.5, 3.0,
    -3.0, 6.0, 0.1, -0.7, 20.0, -20.0, 88.7, -88.7, 104.0, -104.0, 1e10, -1e10, 8388609.0, 16777217.0,
    2.0**31,
    -(2.0**31), 2.0**63, 1e20,
]  # fmt: skip
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
# OpInfo's default tolerances per dtype (torch.testing), looser where our fp32 math differs from libm/Sleef
TOL = {torch.float32: (1.3e-6, 1e-5), torch.float16: (1e-3, 1e-5), torch.bfloat16: (1.6e-2, 1e-5)}


def _filled(head: torch.Tensor, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """`head` followed by random values (normal, some scaled up) up to N elements."""
    g = torch.Generator().manual_seed(seed)
    tail = torch.randn(N - head.numel(), generator=g, dtype=torch.float64)
    tail[::7] *= 1e4
    return torch.cat([head.to(dtype), tail.to(dtype)])


def unary_input(dtype: torch.dtype) -> torch.Tensor:
    return _filled(torch.tensor(SPECIALS, dtype=torch.float64), dtype, 0)


def binary_inputs(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    s = torch.tensor(SPECIALS, dtype=torch.float64)
    a, b = torch.cartesian_prod(s, s).unbind(1)
    return _filled(a, dtype, 1), _filled(b, dtype, 2)


def _transposed(x: torch.Tensor) -> torch.Tensor:
    """The same values in a non-contiguous layout: the transpose of a [cols, rows] copy."""
    rows = 13
    x = x[: (x.numel() // rows) * rows]
    return x.reshape(rows, -1).t().contiguous().t()


# ---- ops: name -> fn(x) or fn(a, b) ---------------------------------------------------------------

UNARY: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "neg": torch.neg, "abs": torch.abs, "exp": torch.exp, "exp2": torch.exp2, "expm1": torch.expm1,
    "log": torch.log, "log2": torch.log2, "log10": torch.log10, "log1p": torch.log1p, "sqrt": torch.sqrt,
    "rsqrt": torch.rsqrt, "reciprocal": torch.reciprocal, "sin": torch.sin, "cos": torch.cos,
    "tan": torch.tan,
    "asin": torch.asin, "acos": torch.acos, "atan": torch.atan, "sinh": torch.sinh, "cosh": torch.cosh,
    "tanh": torch.tanh, "asinh": torch.asinh, "acosh": torch.acosh, "atanh": torch.atanh,
    "sigmoid": torch.sigmoid, "silu": F.silu, "erf": torch.erf, "erfc": torch.erfc, "floor": torch.floor,
    "ceil": torch.ceil, "round": torch.round, "round-decimals-2": lambda x: torch.round(x, decimals=2),
    "round-decimals--2": lambda x: torch.round(x, decimals=-2), "trunc": torch.trunc, "sign": torch.sign,
    "sgn": torch.sgn, "relu": torch.relu, "square": torch.square, "gelu": F.gelu,
    "gelu-tanh": lambda x: F.gelu(x, approximate="tanh"), "leaky_relu": lambda x: F.leaky_relu(x, 0.2),
    "elu": lambda x: F.elu(x, alpha=0.5), "softplus": F.softplus,
    "softplus-beta": lambda x: F.softplus(x, beta=2.0, threshold=3.0), "hardsigmoid": F.hardsigmoid,
    "hardswish": F.hardswish, "mish": F.mish, "relu6": F.relu6, "hardtanh": F.hardtanh,
    "clamp": lambda x: torch.clamp(x, -1.5, 2.5), "clamp-min": lambda x: torch.clamp(x, min=0.5),
    "isnan": torch.isnan, "isinf": torch.isinf, "isfinite": torch.isfinite, "logical_not": torch.logical_not,
    "to-fp16": lambda x: x.half().float(), "to-bf16": lambda x: x.bfloat16().float(),
    "to-int32": lambda x: x.to(torch.int32), "to-int64": lambda x: x.to(torch.int64),
    "to-bool": lambda x: x.to(torch.bool), "to-fp32": lambda x: x.float(),
    "add-scalar": lambda x: x + 2.5, "mul-scalar": lambda x: x * 3.0, "div-scalar": lambda x: x / 3.0,
    "div-pow2": lambda x: x / 4.0, "rdiv-scalar": lambda x: 2.0 / x, "pow-2": lambda x: x**2,
    "pow-3": lambda x: x**3, "pow-0.5": lambda x: x**0.5, "pow--1": lambda x: x**-1, "pow-0": lambda x: x**0,
    "pow-2.5": lambda x: x**2.5, "rpow-2": lambda x: 2.0**x, "remainder-scalar": lambda x: x % 1.5,
    "fmod-scalar": lambda x: torch.fmod(x, 1.5), "floor_divide-scalar": lambda x: x // 0.7,
}  # fmt: skip
BINARY: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div,
    "div-floor": lambda a, b: torch.div(a, b, rounding_mode="floor"),
    "div-trunc": lambda a, b: torch.div(a, b, rounding_mode="trunc"), "floor_divide": torch.floor_divide,
    "remainder": torch.remainder, "fmod": torch.fmod, "pow": torch.pow, "maximum": torch.maximum,
    "minimum": torch.minimum, "fmax": torch.fmax, "fmin": torch.fmin, "atan2": torch.atan2,
    "eq": torch.eq, "ne": torch.ne, "lt": torch.lt, "le": torch.le, "gt": torch.gt, "ge": torch.ge,
    "logical_and": torch.logical_and, "logical_or": torch.logical_or, "logical_xor": torch.logical_xor,
    "where": lambda a, b: torch.where(a > b, a, b), "clamp-tensor": lambda a, b: torch.clamp(a, min=b),
    "lerp": lambda a, b: torch.lerp(a, b, 0.3), "masked_fill": lambda a, b: a.masked_fill(b > 0, 2.0),
    "max-other": lambda a, b: torch.max(a, b),
}  # fmt: skip


def _fmod_overflow(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Where eager's vectorised fmod (Sleef) gives NaN although fmod is exact: a / b overflows. Its scalar
    loop (the tail of the same tensor) gives std::fmod's exact value, as the kernels do everywhere."""
    with torch.no_grad():
        q = a.float() / b.float()
    return q.isinf() & a.isfinite() & (b != 0)


def _zero_tie(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """fmax/fmin of +0 and -0: IEEE leaves the sign open and eager's vector and scalar loops differ."""
    return (a == 0) & (b == 0)


def _gelu_overflow(x: torch.Tensor) -> torch.Tensor:
    """gelu(+inf) and gelu(x > FLT_MAX / 2): eager's vectorised loop gives NaN and inf, its strided loop
    inf and x (as the kernels do: gelu(x) = x there). Half types too where eager's vector loop computes
    them in fp32 (on an AVX-512 machine with AVX512-FP16 its fp16 loop does). Compared in fp32: the bound
    rounds to inf as a half scalar, and inf > inf is false."""
    return x.float() > 1.7014117e38


# (op, inputs as the op sees them) -> elements where eager's own answer is not defined (see each function)
EAGER_UNDEFINED: dict[str, Callable[..., torch.Tensor]] = {
    "fmod": _fmod_overflow, "remainder": _fmod_overflow, "fmax": _zero_tie, "fmin": _zero_tie,
    "gelu": _gelu_overflow,
}  # fmt: skip


def _wrap(fn: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    def wrapped(*xs: torch.Tensor) -> torch.Tensor:
        y = fn(-xs[0], *xs[1:])
        return ~y if y.dtype == torch.bool else -y

    return wrapped


def _groups(table: dict[str, Callable], size: int) -> list[list[str]]:
    names = list(table)
    return [names[i : i + size] for i in range(0, len(names), size)]


def _mismatch(
    got: torch.Tensor, ref: torch.Tensor, inputs: tuple[torch.Tensor, ...], skip: torch.Tensor | None
) -> str | None:
    """Why `got` is not eager's `ref` (None when it is): values under tolerance, NaN, inf, signed zeros.
    `inputs` are the op's operands; `skip` marks elements where eager's answer is undefined."""
    if got.dtype != ref.dtype or got.shape != ref.shape:
        return f"{got.dtype}{list(got.shape)} != eager {ref.dtype}{list(ref.shape)}"
    if not ref.dtype.is_floating_point:
        bad = got != ref
    else:
        rtol, atol = TOL[ref.dtype]
        g, r = got.double(), ref.double()
        close = (g - r).abs() <= atol + rtol * r.abs()
        same = (g == r) | (g.isnan() & r.isnan()) | (close & r.isfinite() & g.isfinite())
        zero_sign = (r == 0) & (g == 0) & (torch.signbit(g) != torch.signbit(r))
        bad = ~same | zero_sign
    if skip is not None:
        bad = bad & ~skip
    if not bool(bad.any()):
        return None
    idx = bad.reshape(-1).nonzero().reshape(-1)[:4]
    flat = [x.reshape(-1) for x in inputs]
    rows = [
        f"({', '.join(repr(x[i].item()) for x in flat)}) -> {got.reshape(-1)[i].item()!r}, "
        f"eager {ref.reshape(-1)[i].item()!r}"
        for i in idx.tolist()
    ]
    return f"{int(bad.sum())} of {bad.numel()} differ: " + "; ".join(rows)


def _run_group(table: dict[str, Callable], names: list[str], inputs: tuple[torch.Tensor, ...]) -> list[str]:
    fns = [_wrap(table[n]) for n in names]

    def graph(*xs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        k = len(xs) // 2
        return tuple(f(*xs[:k]) for f in fns) + tuple(f(*xs[k:]) for f in fns)

    layouts = inputs + tuple(_transposed(x) for x in inputs)
    with torch.no_grad():
        cm = autofusion.compile(graph, layouts)
        got = cm(*layouts)
        ref = graph(*layouts)
    assert "build_error" not in cm.stats, cm.stats["build_error"]
    assert cm.stats["fused_kernels"] >= 1, cm.stats
    problems = []
    k = len(inputs)
    for j, (g, r) in enumerate(zip(got, ref, strict=True)):
        name, layout = names[j % len(names)], "contiguous" if j < len(names) else "transposed"
        xs = layouts[:k] if j < len(names) else layouts[k:]
        seen = (-xs[0], *xs[1:])  # what the op itself was given
        skip = EAGER_UNDEFINED[name](*seen) if name in EAGER_UNDEFINED else None
        why = _mismatch(g, r, seen, skip)
        if why:
            problems.append(f"{name} ({layout}): {why}")
    return problems


@pytest.mark.parametrize("dtype", DTYPES.values(), ids=list(DTYPES))
@pytest.mark.parametrize("names", _groups(UNARY, 12), ids=lambda ns: f"{ns[0]}..{ns[-1]}")
def test_unary_special_values(names: list[str], dtype: torch.dtype) -> None:
    problems = _run_group(UNARY, names, (unary_input(dtype),))
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("dtype", DTYPES.values(), ids=list(DTYPES))
@pytest.mark.parametrize("names", _groups(BINARY, 10), ids=lambda ns: f"{ns[0]}..{ns[-1]}")
def test_binary_special_values(names: list[str], dtype: torch.dtype) -> None:
    problems = _run_group(BINARY, names, binary_inputs(dtype))
    assert not problems, "\n".join(problems)


# ---- integers ------------------------------------------------------------------------------------

INT_DTYPES = {"int32": torch.int32, "int64": torch.int64}


def int_inputs(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Every pair of extreme and small values; the divisor side never 0 (torch raises on it)."""
    info = torch.iinfo(dtype)
    s = torch.tensor([info.min, info.min + 1, info.max, info.max - 1, -1, 0, 1, 2, -2, 7, -7, 3, 2**20 + 1,
                      -(2**24) - 3, 65519, 65521, 255, -256], dtype=torch.int64).to(dtype)  # fmt: skip
    a, b = torch.cartesian_prod(s, s).unbind(1)
    g = torch.Generator().manual_seed(3)
    ta = torch.randint(-1000, 1000, (N - a.numel(),), generator=g, dtype=dtype)
    tb = torch.randint(1, 1000, (N - b.numel(),), generator=g, dtype=dtype)
    b = torch.where(b == 0, torch.ones_like(b), b)
    return torch.cat([a, ta]), torch.cat([b, tb])


INT_OPS: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "neg": lambda a, b: -a, "abs": lambda a, b: a.abs(), "sign": lambda a, b: a.sign(),
    "add": torch.add, "sub": torch.sub, "mul": torch.mul, "floor_divide": torch.floor_divide,
    # eager's trunc division traps (SIGFPE) on MIN / -1, so that pair is left out here (see below)
    "div-trunc": lambda a, b: torch.div(a, torch.where(b == -1, 1, b), rounding_mode="trunc"),
    "remainder": torch.remainder,
    "fmod": torch.fmod, "maximum": torch.maximum, "minimum": torch.minimum, "bitwise_and": torch.bitwise_and,
    "bitwise_xor": torch.bitwise_xor, "bitwise_not": lambda a, b: ~a, "lt": torch.lt, "eq": torch.eq,
    "where": lambda a, b: torch.where(a > b, a, b), "clamp": lambda a, b: a.clamp(-300, 300),
    "to-int32": lambda a, b: a.to(torch.int32), "to-int64": lambda a, b: a.to(torch.int64),
    "to-fp32": lambda a, b: a.float(), "to-fp16": lambda a, b: a.half(), "to-bf16": lambda a, b: a.bfloat16(),
    "to-bool": lambda a, b: a.bool(), "true-div": lambda a, b: a / b,
}  # fmt: skip


@pytest.mark.parametrize("dtype", INT_DTYPES.values(), ids=list(INT_DTYPES))
@pytest.mark.parametrize("names", _groups(INT_OPS, 14), ids=lambda ns: f"{ns[0]}..{ns[-1]}")
def test_integer_special_values(names: list[str], dtype: torch.dtype) -> None:
    fns = [INT_OPS[n] for n in names]

    def graph(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, ...]:
        a = a ^ 0  # a cheap op in front, so each op runs in a kernel with a neighbour
        return tuple(f(a, b) for f in fns)

    a, b = int_inputs(dtype)
    with torch.no_grad():
        cm = autofusion.compile(graph, (a, b))
        got = cm(a, b)
        ref = graph(a, b)
    assert "build_error" not in cm.stats, cm.stats["build_error"]
    assert cm.stats["fused_kernels"] >= 1, cm.stats
    pairs = zip(names, got, ref, strict=True)
    problems = [f"{n}: {why}" for n, g, r in pairs if (why := _mismatch(g, r, (a, b), None))]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("dtype", INT_DTYPES.values(), ids=list(INT_DTYPES))
def test_integer_division_never_traps(dtype: torch.dtype) -> None:
    """MIN / -1 overflows: eager's trunc division dies of SIGFPE on it; a kernel must not. Its result wraps
    (MIN), which is what eager's floor division returns."""
    lo = torch.iinfo(dtype).min
    a = torch.full((N,), lo, dtype=dtype)
    b = torch.full((N,), -1, dtype=dtype)

    def f(x, y):
        x = x ^ 0
        return x // y, torch.div(x, y, rounding_mode="trunc"), x * y, -x

    cm = autofusion.compile(f, (a, b))
    for got in cm(a, b):
        assert torch.equal(got, a), got[:4]
    assert "build_error" not in cm.stats and cm.stats["fused_kernels"] >= 1
    assert torch.equal((a ^ 0) // b, a)  # eager's floor division agrees (its trunc division traps)
