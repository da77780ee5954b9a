"""The elementwise op catalogue, one op per case, each compiled both ways and compared with eager.

Every case runs through `autofusion.compile` and `torch.compile(backend=autofusion)` (the
`compile_both_ways` fixture in tests/conftest.py) and must lower to IR with no extern call. A case
may return several variants of its op (tensor or scalar operands, broadcasting, int inputs) so that
one capture covers them: capture costs far more than these small tensors do to run.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

_GEN = torch.Generator().manual_seed(0)


def rand(*shape: int, lo: float = -2.0, hi: float = 2.0, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return (torch.rand(shape, generator=_GEN) * (hi - lo) + lo).to(dtype)


def randint(*shape: int, lo: int = -5, hi: int = 6, dtype: torch.dtype = torch.int64) -> torch.Tensor:
    return torch.randint(lo, hi, shape, generator=_GEN).to(dtype)


def nonzero_int(*shape: int, dtype: torch.dtype = torch.int64) -> torch.Tensor:
    t = randint(*shape, dtype=dtype)
    return torch.where(t == 0, torch.ones_like(t), t)


def mask(*shape: int) -> torch.Tensor:
    return torch.rand(shape, generator=_GEN) > 0.5


# Cases whose graphs legitimately have no generated kernel, and why (compile_both_ways checks they
# have none; every other case must run a generated kernel).
NO_KERNEL = {"erfinv": "the C++ backend has no erfinv: a library call"}


def case(name: str, fn, *inputs: torch.Tensor):
    marks = [pytest.mark.no_kernel(NO_KERNEL[name])] if name in NO_KERNEL else []
    return pytest.param(fn, inputs, id=name, marks=marks)


def run_cases(cases):
    return pytest.mark.parametrize("fn,inputs", cases)


# ---- unary math ----------------------------------------------------------------------------------


def unary(name: str, fn, lo: float = -2.0, hi: float = 2.0, ints: tuple[int, int] | None = None):
    """fn on a float tensor in [lo, hi); with `ints`, also on an int64 tensor in that range (torch's
    promotion of ints to float for math ops, or int arithmetic for the rest)."""
    if ints is None:
        return case(name, fn, rand(3, 5, lo=lo, hi=hi))
    return case(
        name, lambda x, i: (fn(x), fn(i)), rand(3, 5, lo=lo, hi=hi), randint(3, 5, lo=ints[0], hi=ints[1])
    )


SIGNED, POSITIVE = (-5, 6), (1, 6)
UNARY = [
    unary("neg", torch.neg, ints=SIGNED),
    unary("abs", torch.abs, ints=SIGNED),
    unary("exp", torch.exp, ints=SIGNED),
    unary("exp2", torch.exp2),
    unary("expm1", torch.expm1),
    unary("log", torch.log, 0.05, 5.0, ints=POSITIVE),
    unary("log2", torch.log2, 0.05, 5.0),
    unary("log10", torch.log10, 0.05, 5.0),
    unary("log1p", torch.log1p, -0.9, 5.0),
    unary("sqrt", torch.sqrt, 0.0, 5.0, ints=POSITIVE),
    unary("rsqrt", torch.rsqrt, 0.05, 5.0),
    unary("reciprocal", torch.reciprocal, 0.2, 3.0),
    unary("sin", torch.sin, -4.0, 4.0, ints=SIGNED),
    unary("cos", torch.cos, -4.0, 4.0),
    unary("tan", torch.tan, -1.2, 1.2),
    unary("asin", torch.asin, -0.99, 0.99),
    unary("acos", torch.acos, -0.99, 0.99),
    unary("atan", torch.atan, -4.0, 4.0),
    unary("sinh", torch.sinh),
    unary("cosh", torch.cosh),
    unary("tanh", torch.tanh, ints=SIGNED),
    unary("asinh", torch.asinh, -4.0, 4.0),
    unary("acosh", torch.acosh, 1.0, 5.0),
    unary("atanh", torch.atanh, -0.95, 0.95),
    unary("sigmoid", torch.sigmoid, -6.0, 6.0, ints=SIGNED),
    unary("silu", F.silu, -6.0, 6.0),
    unary("erf", torch.erf),
    unary("erfc", torch.erfc),
    unary("erfinv", torch.erfinv, -0.95, 0.95),
    unary("floor", torch.floor, -4.0, 4.0, ints=SIGNED),
    unary("ceil", torch.ceil, -4.0, 4.0, ints=SIGNED),
    unary("round", torch.round, -4.0, 4.0, ints=SIGNED),
    # decimals: eager's nearbyint(x * 10^d) / 10^d (d >= 0) and nearbyint(x / 10^-d) * 10^-d (d < 0)
    unary(
        "round-decimals",
        lambda x: (
            torch.round(x, decimals=3),
            torch.round(x * 1e3, decimals=-3),
            torch.round(x, decimals=1),
            torch.round(x * 0, decimals=-3),
        ),
        -4.0,
        4.0,
    ),
    unary("trunc", torch.trunc, -4.0, 4.0, ints=SIGNED),
    unary("sign", torch.sign, ints=SIGNED),
    unary("relu", torch.relu, ints=SIGNED),
    unary("gelu", F.gelu, -4.0, 4.0),
    unary("gelu-tanh", lambda x: F.gelu(x, approximate="tanh"), -4.0, 4.0),
    unary("leaky_relu", lambda x: F.leaky_relu(x, 0.2)),
    unary("elu", lambda x: F.elu(x, alpha=0.5)),
    unary("softplus", lambda x: (F.softplus(x), F.softplus(x, beta=2.0, threshold=3.0)), -4.0, 4.0),
    unary("hardsigmoid", F.hardsigmoid, -4.0, 4.0),
    unary("hardswish", F.hardswish, -4.0, 4.0),
    unary("mish", F.mish, -4.0, 4.0),
    unary("relu6", F.relu6, -3.0, 9.0),
    unary("hardtanh", lambda x: (F.hardtanh(x), F.hardtanh(x, -0.5, 0.25))),
    unary("square", torch.square, ints=SIGNED),
    case(
        "logical_not",
        lambda x, m: (torch.logical_not(x), torch.logical_not(m)),
        randint(3, 5, lo=-1, hi=2).float(),
        mask(3, 5),
    ),
    case("bitwise_not", lambda i, m: (torch.bitwise_not(i), ~m), randint(3, 5), mask(3, 5)),
    case("isnan", torch.isnan, torch.tensor([1.0, float("nan"), float("inf"), -float("inf"), 0.0])),
    case("isinf", torch.isinf, torch.tensor([1.0, float("nan"), float("inf"), -float("inf"), 0.0])),
    case("isfinite", torch.isfinite, torch.tensor([1.0, float("nan"), float("inf"), -float("inf"), 0.0])),
]


@run_cases(UNARY)
def test_unary(fn, inputs, compile_both_ways) -> None:
    compile_both_ways(fn, inputs)


# ---- binary arithmetic ---------------------------------------------------------------------------
SPECIAL = torch.tensor([[0.0, -0.0, float("inf"), -float("inf"), float("nan")],
                        [1e-40, -1e-40, 3e38, -2.5, 4.0]])  # fmt: skip
WITH_NAN = torch.where(torch.rand(3, 5, generator=_GEN) > 0.6, float("nan"), rand(3, 5))
# Operands: A, B float [3,5]; ROW float [5] (broadcasts); IA, IB int64 [3,5], IB never 0.
A, B, ROW, IA, IB = rand(3, 5), rand(3, 5), rand(5), randint(3, 5), nonzero_int(3, 5)
I32 = randint(3, 5, dtype=torch.int32)
POS = rand(3, 5, lo=0.5, hi=2.0)

BINARY = [
    case(
        "add", lambda a, b, r, i, j: (a + b, a + 2.5, a + r, a + i, i + j, i + 3, i + 2.5), A, B, ROW, IA, IB
    ),
    case(
        "add-alpha",
        lambda a, b, i, j: (torch.add(a, b, alpha=2.0), torch.add(i, j, alpha=3), a.add(1.5, alpha=2)),
        A,
        B,
        IA,
        IB,
    ),
    case(
        "sub",
        lambda a, b, r, i, j: (a - b, a - 2.5, r - a, a - i, i - j, torch.sub(a, b, alpha=0.5)),
        A,
        B,
        ROW,
        IA,
        IB,
    ),
    case("rsub", lambda a, i: (2.5 - a, 3 - i, 2.5 - i, torch.rsub(a, 1.0, alpha=2.0)), A, IA),
    case(
        "mul", lambda a, b, r, i, j: (a * b, a * 2.5, 2.5 * a, a * r, a * i, i * j, i * 3), A, B, ROW, IA, IB
    ),
    case(
        "div", lambda a, b, r, i, j: (a / b, a / 2.5, 2.5 / b, a / r, i / j, i / 2, a / j), A, B, ROW, IA, IB
    ),
    case(
        "div-trunc",
        lambda a, b, i, j: (
            torch.div(a, b, rounding_mode="trunc"),
            torch.div(i, j, rounding_mode="trunc"),
            torch.div(a, 0.7, rounding_mode="trunc"),
        ),
        A,
        B,
        IA,
        IB,
    ),
    case(
        "div-floor",
        lambda a, b, i, j: (
            torch.div(a, b, rounding_mode="floor"),
            torch.div(i, j, rounding_mode="floor"),
            i // 2,
            a // 0.7,
        ),
        A,
        B,
        IA,
        IB,
    ),
    case(
        "remainder",
        lambda a, b, i, j: (torch.remainder(a, b), a % 1.5, i % j, i % 3, torch.remainder(-7, j)),
        A,
        B,
        IA,
        IB,
    ),
    case(
        "fmod",
        lambda a, b, i, j: (torch.fmod(a, b), torch.fmod(a, 1.5), torch.fmod(i, j), torch.fmod(i, 3)),
        A,
        B,
        IA,
        IB,
    ),
    case(
        "pow-tensor-scalar",
        lambda p, a, i: (p**2.5, a**2, a**3, p**-0.5, i**2, i**0.5),
        POS,
        A,
        randint(3, 5, lo=0),
    ),
    case("pow-scalar-tensor", lambda a, i: (2.0**a, 3**i, 2.0**i), A, randint(3, 5, lo=0)),
    case(
        "pow-tensor-tensor",
        lambda p, a, r, i, k: (p**a, p**r, i**k, p**i),
        POS,
        A,
        ROW,
        IA,
        randint(3, 5, lo=0, hi=4),
    ),
    case(
        "maximum",
        lambda a, b, r, i: (
            torch.maximum(a, b),
            torch.maximum(a, r),
            torch.maximum(i, I32),
            torch.maximum(a, i),
        ),
        A,
        B,
        ROW,
        IA,
    ),
    case(
        "minimum",
        lambda a, b, r, i: (
            torch.minimum(a, b),
            torch.minimum(a, r),
            torch.minimum(i, I32),
            torch.minimum(a, i),
        ),
        A,
        B,
        ROW,
        IA,
    ),
    case(
        "atan2", lambda a, b, r, i: (torch.atan2(a, b), torch.atan2(a, r), torch.atan2(i, IB)), A, B, ROW, IA
    ),
    # fmax/fmin ignore a NaN operand (maximum/minimum propagate it)
    case("fmax-fmin-nan", lambda a, b: (torch.fmax(a, b), torch.fmin(a, b), torch.fmax(b, a)), WITH_NAN, A),
    # lerp's two sides (|w| < 0.5 and >= 0.5), a scalar and a tensor weight
    case(
        "lerp",
        lambda a, b, w: (torch.lerp(a, b, 0.3), torch.lerp(a, b, 0.75), torch.lerp(a, b, w)),
        A,
        B,
        rand(3, 5, lo=-1.0, hi=2.0),
    ),
    # pow with the exponents eager computes without pow: sqrt(-0) = -0, sqrt(-inf) = nan, 1/(x*x)
    case("pow-specialised", lambda x: (x**0.5, x**-0.5, x**-1, x**2, x**3, x**-2), SPECIAL),
]


@run_cases(BINARY)
def test_binary(fn, inputs, compile_both_ways) -> None:
    compile_both_ways(fn, inputs)


# ---- comparisons, logical and bitwise ------------------------------------------------------------
# Ints compared with floats promote to float, as torch does: 2 < 2.5 must be True, not 2 < 2.
IC = randint(3, 5, lo=0, hi=4)
FC = IC.float() + rand(3, 5, lo=-1, hi=1).round()  # many exact ties with IC


def compare(name: str, fn):
    return case(
        name,
        lambda a, b, r, i, f: (fn(a, b), fn(a, r), fn(a, 0.5), fn(i, f), fn(i, 2), fn(i, 2.5), fn(f, i)),
        A,
        B,
        ROW,
        IC,
        FC,
    )


COMPARE = [compare(n, getattr(torch, n)) for n in ("eq", "ne", "lt", "le", "gt", "ge")]
LOGIC_A, LOGIC_B = mask(3, 5), mask(3, 5)
ZEROS_AND_ONES = randint(3, 5, lo=0, hi=2).float()


def logical(name: str, fn):
    return case(name, lambda m, n, f, i: (fn(m, n), fn(f, m), fn(f, i)), LOGIC_A, LOGIC_B, ZEROS_AND_ONES, IC)


def bitwise(name: str, fn):
    return case(
        name,
        lambda i, j, k, m, n: (fn(i, j), fn(i, 6), fn(k, I32), fn(m, n), fn(m, True)),
        randint(3, 5, lo=-8, hi=8),
        randint(3, 5, lo=0, hi=16),
        I32,
        LOGIC_A,
        LOGIC_B,
    )


LOGICAL = [logical(n, getattr(torch, n)) for n in ("logical_and", "logical_or", "logical_xor")]
LOGICAL += [bitwise(n, getattr(torch, n)) for n in ("bitwise_and", "bitwise_or", "bitwise_xor")]


@run_cases(COMPARE + LOGICAL)
def test_compare_and_logic(fn, inputs, compile_both_ways) -> None:
    compile_both_ways(fn, inputs)


# ---- select, clamp, masked_fill --------------------------------------------------------------------
M = mask(3, 5)
SELECT = [
    case(
        "where-tensors",
        lambda m, a, b, r, i: (
            torch.where(m, a, b),
            torch.where(m, a, r),
            torch.where(m, a, i),
            torch.where(m[0], i, I32),
        ),
        M,
        A,
        B,
        ROW,
        IA,
    ),
    case(
        "where-scalars",
        lambda m, a, i: (
            torch.where(m, a, 0.0),
            torch.where(m, 1.5, a),
            torch.where(m, 2, i),
            torch.where(m, 1.0, -1.0),
            torch.where(m, i, 0.5),
        ),
        M,
        A,
        IA,
    ),
    case(
        "clamp-scalar-bounds",
        lambda a, i: (torch.clamp(a, -0.5, 0.5), torch.clamp(i, -2, 3), torch.clamp(i, 0.5, 2.5)),
        A,
        IA,
    ),
    case(
        "clamp-min-only",
        lambda a, i: (torch.clamp(a, min=0.1), a.clamp_min(-0.3), torch.clamp(i, min=0)),
        A,
        IA,
    ),
    case(
        "clamp-max-only",
        lambda a, i: (torch.clamp(a, max=0.1), a.clamp_max(-0.3), torch.clamp(i, max=1)),
        A,
        IA,
    ),
    case(
        "clamp-tensor-bounds",
        lambda a, lo, hi, r: (torch.clamp(a, lo, hi), torch.clamp(a, min=r), torch.clamp(a, max=r)),
        A,
        rand(3, 5, lo=-1.0, hi=0.0),
        rand(3, 5, lo=0.0, hi=1.0),
        ROW,
    ),
    case(
        "masked_fill",
        lambda a, m, i: (
            a.masked_fill(m, -1.5),
            a.masked_fill(m[0], float("-inf")),
            i.masked_fill(m, 7),
            a.masked_fill(m, torch.tensor(2.0)),
        ),
        A,
        M,
        IA,
    ),
]


@run_cases(SELECT)
def test_select_and_clamp(fn, inputs, compile_both_ways) -> None:
    compile_both_ways(fn, inputs)


# ---- casts -----------------------------------------------------------------------------------------
# Float to int truncates toward zero; float to bool is "!= 0".
CASTS = [
    case("to-float16", lambda a, i: (a.to(torch.float16), i.to(torch.float16)), A, IA),
    case("to-bfloat16", lambda a, i: (a.to(torch.bfloat16), i.to(torch.bfloat16)), A, IA),
    case("to-int32", lambda a, i, m: (a.to(torch.int32), i.to(torch.int32), m.to(torch.int32)), A * 3, IA, M),
    case(
        "to-int64", lambda a, i, m: (a.to(torch.int64), i.to(torch.int64), m.to(torch.int64)), A * 3, I32, M
    ),
    case("to-bool", lambda a, i: (a.to(torch.bool), i.to(torch.bool)), A.round(), IA),
    case("float", lambda i, m, h: (i.float(), m.float(), h.float()), IA, M, A.half()),
    case("type_as", lambda a, i, m: (i.type_as(a), a.type_as(i), a.type_as(m)), A, IA, M),
]


@run_cases(CASTS)
def test_casts(fn, inputs, compile_both_ways) -> None:
    compile_both_ways(fn, inputs)


# ---- half precision: a representative subset ---------------------------------------------------
# Each case takes the same values in float16 and bfloat16 and returns the op on both.


def halves(name: str, fn, *inputs: torch.Tensor):
    n = len(inputs)

    def both(*xs: torch.Tensor):
        return fn(*xs[:n]), fn(*xs[n:])

    return case(name, both, *(t.half() for t in inputs), *(t.bfloat16() for t in inputs))


HALF = [
    halves("add", lambda a, b: (a + b, a + 1.5), A, B),
    halves("mul", lambda a, b: (a * b, a * 0.3), A, B),
    halves("div", lambda a, b: a / b, A, POS),
    halves("exp", torch.exp, A),
    halves("gelu", F.gelu, A),
    halves("silu", F.silu, A),
    halves("where", lambda m, a, b: torch.where(m > 0, a, b), A, A, B),
    halves("cast-to-float32", lambda a: a.float(), A),
]


@run_cases(HALF)
def test_half_precision(fn, inputs, compile_both_ways) -> None:
    compile_both_ways(fn, inputs, rtol=1e-2, atol=1e-2)


# ---- edge shapes and layouts -----------------------------------------------------------------------
T = rand(5, 3).t()  # [3, 5], transposed (non-contiguous)
SLICED = rand(3, 10)[:, ::2]  # [3, 5], every other column
EDGE = [
    case("add-size1-broadcast", lambda c, r: (c + r, c * 2.0), rand(3, 1), rand(1, 5)),
    case("mul-size1-dims", lambda a, b: a * b, rand(1, 5, 1), rand(1, 5, 1)),
    case("exp-empty", lambda e: (torch.exp(e), e + 1.0), rand(0, 5)),
    case("add-empty-broadcast", lambda e, r: (e + r, e > r), rand(0, 5), ROW),
    case("add-0d", lambda s, t: (s + t, s * 3.0, torch.exp(s)), torch.tensor(1.5), torch.tensor(-0.25)),
    # A 0-d tensor does not promote an n-d one of the same kind: f32[3,5] * f64[] stays f32.
    case(
        "mul-0d-promotion",
        lambda a, s, i, si: (a * s, i * si, i * s),
        A,
        torch.tensor(0.3, dtype=torch.float64),
        I32,
        torch.tensor(3),
    ),
    case("exp-transposed-input", lambda t: (torch.exp(t), t + 1.0), T),
    case("add-sliced-and-transposed", lambda s, t: (s + t, s * t.sin()), SLICED, T),
    case("where-noncontiguous", lambda m, s, t: torch.where(m, s, t), mask(5, 3).t(), SLICED, T),
]


@run_cases(EDGE)
def test_edge_shapes(fn, inputs, compile_both_ways) -> None:
    compile_both_ways(fn, inputs)
