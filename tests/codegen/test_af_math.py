"""af_math.h: the vectorisable fp32 math used by generated C++ kernels (DESIGN.md, decision 3).

One test library is compiled straight with g++ (the kernel flags plus -shared -fPIC) from a generated .cpp
that includes the header and exports one `#pragma omp simd` loop per function, `af_apply_<fn>`. It is
loaded with ctypes and compared with float64 references (torch, numpy) over a dense sweep of about 1M
inputs per function plus special values, against the bounds documented in the header. The same compile
runs with -fopt-info-vec-optimized, so the test can also check that GCC vectorised every loop.
"""

from __future__ import annotations

import ctypes
import math
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch

from autofusion.codegen.cpp.build import DEFAULT_FLAGS

HEADER_DIR = Path(__file__).resolve().parents[2] / "src" / "autofusion" / "codegen" / "cpp"
CXX = shutil.which("g++")
KERNEL_FLAGS = [
    "-O3",
    "-march=native",
    "-fopenmp",
    "-std=c++17",
    "-fno-math-errno",
    "-fno-trapping-math",
    "-ffp-contract=off",
    "-mprefer-vector-width=512",
]

pytestmark = pytest.mark.skipif(CXX is None, reason="g++ not found")

# float -> float functions, and the half conversions with their (input, output) C types
UNARY = [
    "exp", "exp_nonpos", "expm1", "log", "log1p", "log2", "exp2", "tanh", "sigmoid", "erf", "erfc",
    "gelu", "gelu_tanh", "silu", "rsqrt", "sin", "cos", "sin_small", "cos_small",
]  # fmt: skip
# x ** e for literal exponents, as kernels call them (kernel lowering passes e; codegen picks the function):
# name -> (C expression of x, e)
POWERS = {
    "powi_0": ("af_powi(x[i], 0)", 0.0), "powi_2": ("af_powi(x[i], 2)", 2.0),
    "powi_3": ("af_powi(x[i], 3)", 3.0), "powi_4": ("af_powi(x[i], 4)", 4.0),
    "powi_7": ("af_powi(x[i], 7)", 7.0), "powi_64": ("af_powi(x[i], 64)", 64.0),
    "powi_m1": ("af_powi(x[i], -1)", -1.0), "powi_m2": ("af_powi(x[i], -2)", -2.0),
    "powi_m3": ("af_powi(x[i], -3)", -3.0), "powi_m64": ("af_powi(x[i], -64)", -64.0),
    "pow_half_1": ("af_pow_half(x[i], 1)", 0.5), "pow_half_3": ("af_pow_half(x[i], 3)", 1.5),
    "pow_half_m1": ("af_pow_half(x[i], -1)", -0.5), "pow_half_m5": ("af_pow_half(x[i], -5)", -2.5),
    "pow_half_15": ("af_pow_half(x[i], 15)", 7.5),
    "pow_d_1.7": ("af_pow_d(x[i], 1.7)", 1.7), "pow_d_m0.3": ("af_pow_d(x[i], -0.3)", -0.3),
    "pow_d_pi": ("af_pow_d(x[i], 3.141592653589793)", math.pi),
    "pow_d_m7.25": ("af_pow_d(x[i], -7.25)", -7.25),
    "pow_d_1e-3": ("af_pow_d(x[i], 1e-3)", 1e-3), "pow_d_100.5": ("af_pow_d(x[i], 100.5)", 100.5),
    "pow_d_inf": ("af_pow_d(x[i], __builtin_inf())", math.inf),
    "pow_d_minf": ("af_pow_d(x[i], -__builtin_inf())", -math.inf),
    "pow_d_nan": ('af_pow_d(x[i], __builtin_nan(""))', math.nan), "pow_d_3": ("af_pow_d(x[i], 3.0)", 3.0),
    "pow_d_m4": ("af_pow_d(x[i], -4.0)", -4.0),
}  # fmt: skip
# float -> float roundings (bit-exact, against torch's .to(half).float()) and float -> int conversions
ROUNDINGS = {"round_f16": torch.float16, "round_bf16": torch.bfloat16}
INT_CONVERSIONS = {"f32_to_i32": torch.int32, "f32_to_i64": torch.int64}
CONVERSIONS = {
    "f16_to_f32": ("uint16_t", "float"),
    "f32_to_f16": ("float", "uint16_t"),
    "bf16_to_f32": ("uint16_t", "float"),
    "f32_to_bf16": ("float", "uint16_t"),
    "round_f16": ("float", "float"),
    "round_bf16": ("float", "float"),
    "f16_bits": ("float", "uint16_t"),
    "bf16_bits": ("float", "uint16_t"),
    "f32_to_i32": ("float", "int32_t"),
    "f32_to_i64": ("float", "int64_t"),
}
LIBM_NAMES = re.compile(
    r"^(exp|exp2|expm1|log|log2|log1p|tanh|erf|erfc|sin|cos|sincos|sqrt|pow|ldexp|frexp|rint|nearbyint|floor|trunc)"
    r"f?(@.*)?$"
)

FLT_MIN = float(np.finfo(np.float32).tiny)  # smallest normal
SUBNORMAL_UNIT = 2.0**-149


# --------------------------------------------------------------------------- building the test library


def _source() -> tuple[str, dict[str, range]]:
    """The test .cpp and, for each function, the lines of its loop (GCC reports the loop at one of them)."""
    lines = ['#include "af_math.h"', ""]
    loop_lines: dict[str, range] = {}
    kinds = {fn: ("float", "float") for fn in [*UNARY, *POWERS]} | CONVERSIONS
    for fn, (tin, tout) in kinds.items():
        head = f'extern "C" void af_apply_{_c_name(fn)}'
        lines.append(f"{head}(const {tin}* __restrict x, {tout}* __restrict y, long n) {{")
        lines.append("#pragma omp simd")
        lines.append("    for (long i = 0; i < n; ++i)")
        lines.append(f"        y[i] = {POWERS[fn][0] if fn in POWERS else f'af_{fn}(x[i])'};")
        loop_lines[fn] = range(len(lines) - 1, len(lines) + 1)
        lines.append("}")
        lines.append("")
    lines.append('extern "C" void af_apply_pow(const float* __restrict x, const float* __restrict e,')
    lines.append("                             float* __restrict y, long n) {")
    lines.append("#pragma omp simd")
    lines.append("    for (long i = 0; i < n; ++i)")
    lines.append("        y[i] = af_pow(x[i], e[i]);")
    loop_lines["pow"] = range(len(lines) - 1, len(lines) + 1)
    lines.append("}")
    return "\n".join(lines), loop_lines


def _c_name(fn: str) -> str:
    return fn.replace(".", "p").replace("-", "m")


@dataclass
class Built:
    lib: ctypes.CDLL
    path: Path
    src: Path
    loop_lines: dict[str, range]
    opt_info: str


def _compile(tmp: Path, extra: list[str], out: Path) -> subprocess.CompletedProcess:
    text, _ = _source()
    src = tmp / "af_math_test.cpp"
    src.write_text(text)
    cmd = [CXX, *KERNEL_FLAGS, *extra, "-I", str(HEADER_DIR), str(src), "-o", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"{' '.join(cmd)}\n{proc.stderr}"
    return proc


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Built:
    tmp = tmp_path_factory.mktemp("af_math")
    so = tmp / "libaf_math_test.so"
    proc = _compile(tmp, ["-shared", "-fPIC", "-fopt-info-vec-optimized"], so)
    lib = ctypes.CDLL(str(so))
    _, loop_lines = _source()
    for fn in [*UNARY, *POWERS]:
        getattr(lib, f"af_apply_{_c_name(fn)}").argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_long]
    lib.af_apply_pow.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_long]
    for fn in CONVERSIONS:
        getattr(lib, f"af_apply_{fn}").argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_long]
    return Built(lib, so, tmp / "af_math_test.cpp", loop_lines, proc.stderr)


def _apply(built: Built, fn: str, x: np.ndarray) -> np.ndarray:
    tin, tout = CONVERSIONS.get(fn, ("float", "float"))
    np_types = {"uint16_t": np.uint16, "float": np.float32, "int32_t": np.int32, "int64_t": np.int64}
    x = np.ascontiguousarray(x, dtype=np_types[tin])
    y = np.empty(x.shape, dtype=np_types[tout])
    getattr(built.lib, f"af_apply_{_c_name(fn)}")(x.ctypes.data, y.ctypes.data, x.size)
    return y


# --------------------------------------------------------------------------- references and metrics


def _t(x: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(x.astype(np.float64))


def _gelu_ref(x: np.ndarray) -> np.ndarray:
    # 0.5 x (1 + erf(x/sqrt2)) = 0.5 x erfc(-x/sqrt2): the erfc form keeps float64 accurate in the tail
    t = _t(x)
    return (0.5 * t * torch.special.erfc(-t * math.sqrt(0.5))).numpy()


def _gelu_tanh_ref(x: np.ndarray) -> np.ndarray:
    # 0.5 x (1 + tanh(u)) = x * sigmoid(2u), u = sqrt(2/pi) (x + 0.044715 x^3); no cancellation for x < 0
    t = _t(x)
    u = math.sqrt(2.0 / math.pi) * (t + 0.044715 * t**3)
    return (t * torch.sigmoid(2.0 * u)).numpy()


REFERENCE = {
    "exp": lambda x: torch.exp(_t(x)).numpy(),
    "exp_nonpos": lambda x: torch.exp(_t(x)).numpy(),
    "expm1": lambda x: torch.expm1(_t(x)).numpy(),
    "log": lambda x: torch.log(_t(x)).numpy(),
    "log1p": lambda x: torch.log1p(_t(x)).numpy(),
    "log2": lambda x: torch.log2(_t(x)).numpy(),
    "exp2": lambda x: torch.exp2(_t(x)).numpy(),
    "tanh": lambda x: torch.tanh(_t(x)).numpy(),
    "sigmoid": lambda x: torch.sigmoid(_t(x)).numpy(),
    "erf": lambda x: torch.erf(_t(x)).numpy(),
    "erfc": lambda x: torch.special.erfc(_t(x)).numpy(),
    "gelu": _gelu_ref,
    "gelu_tanh": _gelu_tanh_ref,
    "silu": lambda x: torch.nn.functional.silu(_t(x)).numpy(),
    "rsqrt": lambda x: torch.rsqrt(_t(x)).numpy(),
    "sin": lambda x: torch.sin(_t(x)).numpy(),
    "cos": lambda x: torch.cos(_t(x)).numpy(),
    "sin_small": lambda x: torch.sin(_t(x)).numpy(),
    "cos_small": lambda x: torch.cos(_t(x)).numpy(),
}


def _ordered(a: np.ndarray) -> np.ndarray:
    """float32 -> int64 that is monotonic in the float value (+0 and -0 both map to 0)."""
    i = a.astype(np.float32).view(np.int32).astype(np.int64)
    return np.where(i < 0, -(i & 0x7FFFFFFF), i)


def ulp_error(y: np.ndarray, ref64: np.ndarray) -> np.ndarray:
    """distance in float32 steps from the correctly rounded result (0 where both are NaN)"""
    with np.errstate(over="ignore", invalid="ignore"):
        ref32 = ref64.astype(np.float32)
    d = np.abs(_ordered(y) - _ordered(ref32)).astype(np.float64)
    both_nan = np.isnan(y) & np.isnan(ref32)
    one_nan = np.isnan(y) ^ np.isnan(ref32)
    return np.where(both_nan, 0.0, np.where(one_nan, np.inf, d))


def rel_error(y: np.ndarray, ref64: np.ndarray, floor: float = FLT_MIN) -> np.ndarray:
    """|y - ref| / |ref|, but |y - ref| / floor where |ref| < floor; 0 where both are NaN or equal infs"""
    y64 = y.astype(np.float64)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        ref32 = ref64.astype(np.float32)  # beyond the float32 range the right answer is inf
        same = (y64 == ref64) | (np.isinf(ref32) & (y == ref32)) | (np.isnan(y64) & np.isnan(ref64))
        err = np.abs(y64 - ref64) / np.maximum(np.abs(ref64), floor)
    return np.where(same, 0.0, np.where(np.isnan(err), np.inf, err))


@dataclass(frozen=True)
class Bound:
    """ "ulp": float32 steps from the correctly rounded result; "abs": |y - ref|; "rel": |y - ref| / |ref| for
    normal results, while subnormal results (which cannot carry relative accuracy) must be within one
    subnormal step, 2^-149, of the reference."""

    kind: str
    limit: float


# The bounds documented next to each function in af_math.h (the header also gives the measured values).
BOUNDS = {
    "exp": Bound("ulp", 2),
    "exp_nonpos": Bound("ulp", 2),
    "exp2": Bound("ulp", 2),
    "log": Bound("ulp", 2),
    "log2": Bound("ulp", 2),
    "rsqrt": Bound("ulp", 1),
    "expm1": Bound("rel", 3e-7),
    "log1p": Bound("rel", 4e-7),
    "tanh": Bound("rel", 4e-7),
    "sigmoid": Bound("rel", 4e-7),
    "silu": Bound("rel", 5e-7),
    "erf": Bound("rel", 2.5e-7),
    "erfc": Bound("rel", 5e-7),
    "gelu": Bound("rel", 6e-7),
    "gelu_tanh": Bound("rel", 5e-7),
    "sin": Bound("abs", 2e-7),
    "cos": Bound("abs", 2e-7),
    "sin_small": Bound("abs", 2e-7),
    "cos_small": Bound("abs", 2e-7),
}


def _errors(fn: str, y: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """error in units of the bound's limit: <= 1 passes"""
    b = BOUNDS[fn]
    if b.kind == "ulp":
        return ulp_error(y, ref) / b.limit
    if b.kind == "abs":
        with np.errstate(invalid="ignore"):
            e = np.abs(y.astype(np.float64) - ref)
        same_nan = np.isnan(y) & np.isnan(ref)
        return np.where(same_nan, 0.0, np.where(np.isnan(e), np.inf, e)) / b.limit
    e = rel_error(y, ref) / b.limit
    with np.errstate(invalid="ignore"):
        sub_ok = (np.abs(ref) < FLT_MIN) & (np.abs(y.astype(np.float64) - ref) <= SUBNORMAL_UNIT)
    return np.where(sub_ok, 0.0, e)


def _f32(values) -> np.ndarray:
    return np.asarray(values, dtype=np.float64).astype(np.float32)


def _bits_sweep(lo_bits: int, hi_bits: int, n: int, negative: bool = False) -> np.ndarray:
    """n float32 values evenly spaced in bit pattern between two bit patterns: every binade alike"""
    b = np.linspace(lo_bits, hi_bits, n).astype(np.uint32)
    x = b.view(np.float32)
    return -x if negative else x


def _lin(lo: float, hi: float, n: int = 1_000_000) -> np.ndarray:
    return _f32(np.linspace(lo, hi, n))


ALL_POSITIVE = (0x00000001, 0x7F7FFFFF)  # smallest subnormal .. largest finite


def _small(n: int = 100_000) -> np.ndarray:
    """tiny to moderate magnitudes, both signs (zero crossings)"""
    x = _bits_sweep(0x00000001, 0x3F800000, n)
    return np.concatenate([x, -x])


SWEEPS = {
    "exp": lambda: _lin(-104.0, 89.0),
    # its domain is x <= 0: every float of the subnormal-result range and a dense sweep above it
    "exp_nonpos": lambda: np.concatenate([_lin(-104.0, 0.0), _bits_sweep(0x80000000, 0xC2D00000, 500_000)]),
    "exp2": lambda: _lin(-151.0, 129.0),
    "expm1": lambda: np.concatenate([_lin(-20.0, 89.0), _small()]),
    "log": lambda: np.concatenate([_bits_sweep(*ALL_POSITIVE, 1_000_000), _lin(0.5, 2.0, 200_000)]),
    "log2": lambda: np.concatenate([_bits_sweep(*ALL_POSITIVE, 1_000_000), _lin(0.5, 2.0, 200_000)]),
    "log1p": lambda: np.concatenate(
        [_bits_sweep(*ALL_POSITIVE, 500_000), _bits_sweep(0x00000001, 0x3F800000, 500_000, negative=True)]
    ),
    "tanh": lambda: np.concatenate([_lin(-12.0, 12.0), _small()]),
    "sigmoid": lambda: np.concatenate([_lin(-110.0, 30.0), _small()]),
    "silu": lambda: np.concatenate([_lin(-110.0, 30.0), _small()]),
    "erf": lambda: np.concatenate([_lin(-6.0, 6.0), _small()]),
    "erfc": lambda: np.concatenate([_lin(-5.0, 10.5), _small()]),
    "gelu": lambda: np.concatenate([_lin(-16.0, 12.0), _small()]),
    "gelu_tanh": lambda: np.concatenate([_lin(-12.0, 12.0), _small()]),
    "rsqrt": lambda: _bits_sweep(*ALL_POSITIVE, 1_000_000),
    "sin": lambda: np.concatenate(
        [_lin(-1e4, 1e4), _lin(-1e5, 1e5, 200_000), _lin(-4, 4, 200_000), _small(50_000)]
    ),
    "cos": lambda: np.concatenate(
        [_lin(-1e4, 1e4), _lin(-1e5, 1e5, 200_000), _lin(-4, 4, 200_000), _small(50_000)]
    ),
    "sin_small": lambda: np.concatenate([_lin(-65535.0, 65535.0), _lin(-4, 4, 200_000), _small(50_000)]),
    "cos_small": lambda: np.concatenate([_lin(-65535.0, 65535.0), _lin(-4, 4, 200_000), _small(50_000)]),
}

_COMMON_SPECIALS = [
    0.0, -0.0, math.inf, -math.inf, math.nan, -math.nan,
    FLT_MIN, -FLT_MIN, SUBNORMAL_UNIT, -SUBNORMAL_UNIT, 1e-40, -1e-40, 1e-30, -1e-30, 1e-8, -1e-8,
    float(np.finfo(np.float32).max), -float(np.finfo(np.float32).max), 1e30, -1e30, 1e10, -1e10,
    1.0, -1.0, 0.5, -0.5, 2.0, -2.0, 0.7071067, -0.7071067, 0.7071068, -0.7071068,
    88.72283, 88.72284, 88.7228394, 89.0, 100.0, -87.3365, -87.3366, -103.0, -103.972, -103.973, -104.0,
    -105.0, -150.0, 127.99, 128.0, 128.01, -126.0, -149.0, -149.5, -150.0, -151.0,
    3.92, -3.92, 4.0, -4.0, 9.0, 9.1, -9.1, 9.5, 14.0, -14.0, -14.3, -14.5, -15.0, -20.0, 16.6, -16.6,
    0.3465, -0.3465, 0.3466, -0.3466, 0.6931472, -0.6931472,
    3.1415927, -3.1415927, 1.5707964, -1.5707964, 0.7853982, -0.7853982, 1e4, -1e4, 8192.0, 6433.5,
]  # fmt: skip


def _specials() -> np.ndarray:
    x = _f32(_COMMON_SPECIALS)
    # neighbours of each special value
    with np.errstate(over="ignore"):
        up = np.nextafter(x, np.float32(np.inf))
        down = np.nextafter(x, np.float32(-np.inf))
    return np.concatenate([x, up, down])


# --------------------------------------------------------------------------- accuracy


def test_flags_are_the_kernel_flags():
    """The bounds hold for what kernels are built with: the same flags (vector width included), less the
    two that make a shared library."""
    assert sorted(KERNEL_FLAGS) == sorted(f for f in DEFAULT_FLAGS if f not in ("-shared", "-fPIC"))


@pytest.mark.parametrize("fn", UNARY)
def test_accuracy_sweep(built, fn):
    x = SWEEPS[fn]()
    y = _apply(built, fn, x)
    ref = REFERENCE[fn](x)
    e = _errors(fn, y, ref)
    worst = int(np.argmax(e))
    assert e[worst] <= 1.0, (
        f"af_{fn}({x[worst]!r} = {float(x[worst]).hex()}) = {y[worst]!r}, reference {ref[worst]!r}: "
        f"{e[worst] * BOUNDS[fn].limit:.3g} > {BOUNDS[fn].kind} bound {BOUNDS[fn].limit}"
    )


@pytest.mark.parametrize("fn", UNARY)
def test_special_values(built, fn):
    x = _specials()
    if fn in ("sin_small", "cos_small"):  # the bound holds for |x| < 2^16; inf and NaN must still give NaN
        x = x[~np.isfinite(x) | (np.abs(x) < 2.0**16)]
    if fn == "exp_nonpos":  # defined for x <= 0 and NaN only
        x = x[np.isnan(x) | (x <= 0)]
    y = _apply(built, fn, x)
    with np.errstate(all="ignore"):
        ref = REFERENCE[fn](x)
    assert np.array_equal(np.isnan(y), np.isnan(ref)), [
        (float(a), float(b), float(c))
        for a, b, c in zip(x, y, ref, strict=True)
        if np.isnan(b) != np.isnan(c)
    ]
    e = _errors(fn, y, ref)
    bad = np.nonzero(e > 1.0)[0]
    assert bad.size == 0, [(float(x[i]), float(y[i]), float(ref[i])) for i in bad[:10]]
    # exact zeros and infinities exactly, and zeros with the reference's sign
    exact = (ref == 0) | np.isinf(ref)
    assert np.array_equal(y[exact], ref[exact].astype(np.float32)), list(
        zip(x[exact], y[exact], ref[exact], strict=True)
    )
    with np.errstate(over="ignore"):
        zero = (y == 0) & (ref.astype(np.float32) == 0)
    assert np.array_equal(np.signbit(y[zero]), np.signbit(ref[zero])), list(
        zip(x[zero], y[zero], ref[zero], strict=True)
    )


def test_saturation_and_limits(built):
    def f(fn, v):
        return float(_apply(built, fn, _f32([v]))[0])

    assert f("exp", 88.72284) == math.inf and f("exp", -104.0) == 0.0 and f("exp", -math.inf) == 0.0
    assert (
        f("exp_nonpos", -104.0) == 0.0 and f("exp_nonpos", -math.inf) == 0.0 and f("exp_nonpos", -0.0) == 1.0
    )
    assert f("exp_nonpos", -103.0) == float(np.float32(math.exp(-103.0))) and math.isnan(
        f("exp_nonpos", math.nan)
    )
    assert f("exp", 0.0) == 1.0 and f("exp2", 10.0) == 1024.0 and f("exp2", -149.0) == SUBNORMAL_UNIT
    assert f("log", 0.0) == -math.inf and f("log", -0.0) == -math.inf and math.isnan(f("log", -1e-30))
    assert f("log", math.inf) == math.inf and f("log", 1.0) == 0.0 and f("log2", 0.125) == -3.0
    assert f("log2", SUBNORMAL_UNIT) == -149.0 and f("log1p", -1.0) == -math.inf
    for big in (17.0, 100.0, 1e30, math.inf):
        assert f("tanh", big) == 1.0 and f("tanh", -big) == -1.0
        assert f("erf", big) == 1.0 and f("erf", -big) == -1.0
        assert f("erfc", big) == 0.0 and f("erfc", -big) == 2.0
        assert f("sigmoid", big) == 1.0 and f("expm1", -big) == -1.0
    assert f("tanh", 9.02) == 1.0 and f("erf", 3.92) == 1.0 and f("sigmoid", 16.7) == 1.0
    assert f("sigmoid", -math.inf) == 0.0 and f("sigmoid", -200.0) == 0.0 and f("sigmoid", 0.0) == 0.5
    assert f("gelu", math.inf) == math.inf and f("gelu_tanh", math.inf) == math.inf
    assert f("silu", math.inf) == math.inf
    for fn in ("gelu", "gelu_tanh", "silu"):  # -inf * 0, as PyTorch
        assert math.isnan(f(fn, -math.inf))
    assert f("rsqrt", 0.0) == math.inf and f("rsqrt", -0.0) == -math.inf and f("rsqrt", math.inf) == 0.0
    assert f("rsqrt", 4.0) == 0.5 and math.isnan(f("rsqrt", -1.0))
    for fn in ("sin", "cos", "sin_small", "cos_small"):
        assert math.isnan(f(fn, math.inf)) and math.isnan(f(fn, -math.inf)) and math.isnan(f(fn, math.nan))


@pytest.mark.parametrize("fn", ["sin", "cos"])
def test_trig_of_huge_arguments(built, fn):
    """sin/cos keep their bound up to FLT_MAX (the table reduction), and the cheap small-argument versions
    the kernels run first are bitwise the same below their limit."""
    rng = np.random.default_rng(7)
    rand_bits = rng.integers(0x47800000, 0x7F800000, 200_000, dtype=np.uint64).astype(np.uint32)
    edges = _f32([2.0**16, 3e38, 3.4028235e38, 1e10, 8388609.0, 16777217.0, 6.5e6, 1e6])
    far = np.concatenate([_bits_sweep(0x47800000, 0x7F7FFFFF, 1_000_000), rand_bits.view(np.float32), edges])
    far = np.concatenate([far, -far])
    e = _errors(fn, _apply(built, fn, far), REFERENCE[fn](far))
    worst = int(np.argmax(e))
    assert e[worst] <= 1.0, (far[worst], e[worst] * BOUNDS[fn].limit)
    near = np.concatenate([_lin(-65535.99, 65535.99), _specials()])
    near = near[~(np.abs(near) >= 2.0**16)]
    assert _same_bits_or_both_nan(_apply(built, f"{fn}_small", near), _apply(built, fn, near)).all()


def test_nan_propagates_everywhere(built):
    x = _f32([math.nan, -math.nan]).view(np.uint32)
    x = np.concatenate([x, np.array([0x7F800001, 0x7FBFFFFF, 0xFFC00001], dtype=np.uint32)]).view(np.float32)
    for fn in UNARY:
        assert np.isnan(_apply(built, fn, x)).all(), fn


# --------------------------------------------------------------------------- powers


def _pow_ref(x: np.ndarray, e) -> np.ndarray:
    """float64 pow (C99 Annex F special values), rounded once to float32 by the metric.  The exponent is
    an array: numpy takes sqrt for a scalar 0.5, which differs from pow at -0 and -inf."""
    x64 = x.astype(np.float64)
    with np.errstate(all="ignore"):
        return np.power(x64, np.broadcast_to(np.asarray(e, dtype=np.float64), x64.shape).copy())


def _check_pow(x: np.ndarray, y: np.ndarray, ref: np.ndarray, what: str) -> None:
    """<= 1 ulp (subnormal results: one subnormal step); NaN exactly where C's pow gives NaN; zeros and
    infinities exactly, zeros with C's sign"""
    assert np.array_equal(np.isnan(y), np.isnan(ref)), [
        (float(a), float(b), float(c))
        for a, b, c in zip(x, y, ref, strict=True)
        if np.isnan(b) != np.isnan(c)
    ][:10]
    e = ulp_error(y, ref)
    worst = int(np.argmax(e))
    assert e[worst] <= 1.0, f"{what}: x = {float(x[worst])!r}: {float(y[worst])!r} vs {ref[worst]!r}"
    with np.errstate(over="ignore"):
        ref32 = ref.astype(np.float32)
    exact = (ref32 == 0) | np.isinf(ref32)
    assert np.array_equal(y[exact], ref32[exact]), what
    assert np.array_equal(np.signbit(y[exact]), np.signbit(ref32[exact])), what


@pytest.mark.parametrize("fn", POWERS)
def test_power_of_a_literal_exponent(built, fn):
    """x ** e with e fixed in the kernel: every binade of both signs, subnormals, the special values"""
    x = np.concatenate(
        [_bits_sweep(*ALL_POSITIVE, 600_000), _bits_sweep(*ALL_POSITIVE, 200_000, negative=True),
         _lin(-4.0, 4.0, 200_000), _specials()]
    )  # fmt: skip
    _check_pow(x, _apply(built, fn, x), _pow_ref(x, POWERS[fn][1]), fn)


def test_power_of_two_tensors(built):
    """af_pow(x, y) on random pairs (both signs, integer and fractional exponents of both parities) and on
    every pair of special values"""
    rng = np.random.default_rng(11)
    n = 400_000
    x = _f32(rng.choice([-1.0, 1.0], n) * np.exp(rng.uniform(-30.0, 30.0, n)))
    y = _f32(np.where(rng.random(n) < 0.3, np.round(rng.uniform(-40, 40, n)), rng.uniform(-40, 40, n)))
    sx = _specials()
    sy = np.concatenate([sx, _f32([3.0, -3.0, 0.5, -0.5, 1.5, 2.0**24, 2.0**24 + 2, 2.0**25, 16777215.0])])
    gx, gy = (a.ravel() for a in np.meshgrid(sx, sy))
    x, y = np.concatenate([x, gx]), np.concatenate([y, gy])
    out = np.empty_like(x)
    built.lib.af_apply_pow(x.ctypes.data, y.ctypes.data, out.ctypes.data, x.size)
    _check_pow(x, out, _pow_ref(x, y.astype(np.float64)), "af_pow")


# --------------------------------------------------------------------------- half conversions


def _all_half_bits() -> np.ndarray:
    return np.arange(65536, dtype=np.uint32).astype(np.uint16)


def _same_bits_or_both_nan(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a.view(np.uint32) == b.view(np.uint32)) | (np.isnan(a) & np.isnan(b))


@pytest.mark.parametrize("fn, dtype", [("f16_to_f32", torch.float16), ("bf16_to_f32", torch.bfloat16)])
def test_half_decode_exhaustive(built, fn, dtype):
    bits = _all_half_bits()
    y = _apply(built, fn, bits)
    ref = torch.from_numpy(bits.view(np.int16)).view(dtype).to(torch.float32).numpy()
    ok = _same_bits_or_both_nan(y, ref)
    assert ok.all(), [
        (hex(int(b)), float(a), float(r)) for b, a, r in zip(bits[~ok], y[~ok], ref[~ok], strict=True)
    ][:10]
    # NaN payloads and signs survive decoding (torch's scalar and vectorised conversions differ on NaNs, so
    # check against the input); fp16 signalling NaNs come out quiet, as F16C's vcvtph2ps makes them (the
    # staged loads use it), bf16's decoding is a shift and keeps every bit
    nan = np.isnan(y)
    shift = 13 if fn == "f16_to_f32" else 16
    mant_mask = 0x3FF if fn == "f16_to_f32" else 0x7F
    quiet = 0x200 if fn == "f16_to_f32" else 0
    assert np.array_equal((y[nan].view(np.uint32) >> 31), bits[nan].astype(np.uint32) >> 15)
    assert np.array_equal(
        (y[nan].view(np.uint32) >> shift) & mant_mask, (bits[nan].astype(np.uint32) & mant_mask) | quiet
    )


def _encode_inputs(rng: np.random.Generator) -> np.ndarray:
    rand_bits = rng.integers(0, 2**32, size=1_000_000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    # values within the fp16 range, with f16 ties: every f16 value and the midpoints to its neighbours
    h = _all_half_bits().view(np.float16).astype(np.float32)
    h = h[np.isfinite(h)]
    hs = np.sort(np.unique(h.astype(np.float64)))
    mids = ((hs[:-1] + hs[1:]) / 2).astype(np.float32)  # exact in float32
    ties = np.concatenate(
        [mids, np.nextafter(mids, np.float32(np.inf)), np.nextafter(mids, np.float32(-np.inf))]
    )
    # bf16 ties: low 16 bits exactly 0x8000, and one either side
    hi = rng.integers(0, 2**16, size=100_000, dtype=np.uint64).astype(np.uint32) << 16
    bf_ties = np.concatenate([hi | 0x8000, hi | 0x7FFF, hi | 0x8001]).view(np.float32)
    special = _f32(
        [0.0, -0.0, math.inf, -math.inf, math.nan, 65504.0, 65519.99, 65520.0, 65536.0, -65520.0, 1e5,
         2.0**-14, 2.0**-24, 2.0**-25, 2.0**-25 * 1.0000001, 2.0**-26, 6e-8, 3e-8, 1e-45, FLT_MIN,
         float(np.finfo(np.float32).max), 3.3895314e38, 3.3961776e38]
    )  # fmt: skip
    return np.concatenate([rand_bits, h, ties, bf_ties, special, _specials()])


@pytest.mark.parametrize("fn, dtype", [("f32_to_f16", torch.float16), ("f32_to_bf16", torch.bfloat16)])
def test_half_encode_bit_exact(built, fn, dtype):
    x = _encode_inputs(np.random.default_rng(1234))
    y = _apply(built, fn, x)
    ref = torch.from_numpy(x).to(dtype).view(torch.int16).numpy().view(np.uint16)
    y_nan = (y & 0x7FFF) > (0x7C00 if dtype == torch.float16 else 0x7F80)
    ref_nan = (ref & 0x7FFF) > (0x7C00 if dtype == torch.float16 else 0x7F80)
    ok = (y == ref) | (y_nan & ref_nan)
    assert ok.all(), [
        (float(v), hex(int(a)), hex(int(b))) for v, a, b in zip(x[~ok], y[~ok], ref[~ok], strict=True)
    ][:10]
    assert np.array_equal(y_nan, np.isnan(x))  # NaN stays NaN, and only NaN becomes NaN


@pytest.mark.parametrize("fn", ROUNDINGS)
def test_round_to_half_bit_exact(built, fn):
    """af_round_f16/bf16 (casts that stay in registers) give exactly torch's x.to(half).float()"""
    x = _encode_inputs(np.random.default_rng(99))
    y = _apply(built, fn, x)
    ref = torch.from_numpy(x).to(ROUNDINGS[fn]).float().numpy()
    ok = _same_bits_or_both_nan(y, ref)
    bad = zip(x[~ok], y[~ok], ref[~ok], strict=True)
    assert ok.all(), [(float(v), float(a), float(b)) for v, a, b in bad][:10]


@pytest.mark.parametrize("fn, dtype", [("f16_bits", torch.float16), ("bf16_bits", torch.bfloat16)])
def test_half_bits_of_every_half_value(built, fn, dtype):
    """af_f16_bits/af_bf16_bits (the store of a value already of the half type) give back every one of the
    65,536 bit patterns from its float value; a NaN comes back quiet with its sign, as af_f32_to_* make it"""
    bits = _all_half_bits()
    v = torch.from_numpy(bits.view(np.int16)).view(dtype).to(torch.float32).numpy()
    y = _apply(built, fn, v)
    nan = np.isnan(v)
    assert np.array_equal(y[~nan], bits[~nan])
    quiet = (bits[nan] & 0x8000) | 0x7E00 if fn == "f16_bits" else bits[nan] | 0x40
    assert np.array_equal(y[nan], quiet)
    enc = _apply(built, "f32_to_f16" if fn == "f16_bits" else "f32_to_bf16", v)
    assert np.array_equal(y, enc)  # the same bits as the rounding encoder on these values


def _float_sweep() -> np.ndarray:
    """2^24 float32 bit patterns spread over all 2^32: every 256th, with the low byte varied so the
    sticky and rounding bits take every value."""
    k = np.arange(2**24, dtype=np.uint64)
    return ((k << 8) | ((k * 37 + (k >> 8)) & 0xFF)).astype(np.uint32).view(np.float32)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_half_rounding_over_a_float_sweep(built, dtype):
    """encode and in-register rounding against torch over 2^24 float bit patterns from the whole range
    (every binade: float subnormals, fp16 subnormals, overflow, NaN)"""
    x = _float_sweep()
    enc, rnd = ("f32_to_f16", "round_f16") if dtype == torch.float16 else ("f32_to_bf16", "round_bf16")
    ref = torch.from_numpy(x).to(dtype)
    ref_bits = ref.view(torch.int16).numpy().view(np.uint16)
    nan = np.isnan(x)
    y = _apply(built, enc, x)
    assert np.array_equal(y[~nan], ref_bits[~nan])
    assert np.isnan(torch.from_numpy(y.view(np.int16)).view(dtype).float().numpy()[nan]).all()
    r = _apply(built, rnd, x)
    assert _same_bits_or_both_nan(r, ref.float().numpy()).all()
    assert np.isnan(r[nan]).all()


@pytest.mark.parametrize("fn", INT_CONVERSIONS)
def test_float_to_int_matches_torch(built, fn):
    """truncation toward zero; NaN, inf and out-of-range values give torch's (x86's) INT_MIN"""
    rng = np.random.default_rng(5)
    edges = _f32([2.0**31, -(2.0**31), 2.0**31 - 128, 2.0**63, -(2.0**63), 9.3e18, -9.3e18, 1e19])
    rand_bits = rng.integers(0, 2**32, 200_000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    x = np.concatenate([_specials(), _f32(rng.standard_normal(100_000) * 1e3), edges, rand_bits])
    y = _apply(built, fn, x)
    ref = torch.from_numpy(x).to(INT_CONVERSIONS[fn]).numpy()
    ok = y == ref
    bad = zip(x[~ok], y[~ok], ref[~ok], strict=True)
    assert ok.all(), [(float(v), int(a), int(b)) for v, a, b in bad][:10]


# --------------------------------------------------------------------------- vectorisation


def _vectorised_lines(opt_info: str, src_name: str) -> set[int]:
    out = set()
    for line in opt_info.splitlines():
        m = re.match(rf".*{re.escape(src_name)}:(\d+):\d+: optimized: loop vectorized", line)
        if m:
            out.add(int(m.group(1)))
    return out


def test_every_loop_is_vectorised(built):
    vectorised = _vectorised_lines(built.opt_info, built.src.name)
    missing = sorted(fn for fn, lines in built.loop_lines.items() if not vectorised.intersection(lines))
    assert not missing, f"GCC did not vectorise the loops of: {missing}\n{built.opt_info}"


def test_no_libm_calls(built):
    nm = shutil.which("nm")
    if nm is None:
        pytest.skip("nm not found")
    proc = subprocess.run([nm, "-D", "--undefined-only", str(built.path)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    undefined = [line.split()[-1] for line in proc.stdout.splitlines() if line.strip()]
    libm = [s for s in undefined if LIBM_NAMES.match(s)]
    assert not libm, f"calls into libm: {libm}"


def test_vectorised_for_plain_avx2(tmp_path):
    """the same loops vectorise for an AVX2-only target (-march=haswell), not just this machine"""
    flags = ["-march=haswell", "-c", "-fopt-info-vec-optimized"]
    proc = _compile(tmp_path, flags, tmp_path / "af_math_test.o")
    _, loop_lines = _source()
    vectorised = _vectorised_lines(proc.stderr, "af_math_test.cpp")
    # AVX2 has no float -> int64 conversion instruction (AVX-512DQ's vcvttps2qq), so that loop stays scalar
    missing = sorted(
        fn for fn, ls in loop_lines.items() if not vectorised.intersection(ls) and fn != "f32_to_i64"
    )
    assert not missing, f"not vectorised with -march=haswell: {missing}\n{proc.stderr}"
