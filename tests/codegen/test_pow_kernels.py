"""x ** e inside generated kernels: literal exponents become multiplies (af_powi, af_pow_half), any other
exponent af_pow; all of them vectorise and none calls libm (af_math.h's own tests bound their
error against float64; these check the kernels against eager through the whole compiler)."""

from __future__ import annotations

import math
import re
import shutil
import subprocess

import pytest
import torch

import autofusion

BIG = 2 * 32768 + 13  # above the parallel threshold, with a vector tail
SIZES = {"17x33": (17, 33), "parallel": (BIG,)}
SPECIALS = [0.0, -0.0, math.inf, -math.inf, math.nan, 1.0, -1.0, 0.5, -0.5, 2.0, -2.0, 1e-40, -1e-40,
            1e-20, -1e-20, 3e38, -3e38, 65504.0, 1e-7]  # fmt: skip
TOL = {torch.float32: 3e-7, torch.float16: 1e-3, torch.bfloat16: 8e-3}  # ~2 units in the last place
# exponents the frontend keeps as pow for fp32 (2, 3, -2, +-0.5, -1 are multiplies/sqrt there, as eager)
EXPONENTS = [0.0, 4.0, 5.0, -3.0, 7.0, 1.5, -1.5, 2.5, -7.5, 64.0, 1.7, -0.3, 100.5, math.inf, -math.inf]
FLAGS = ["-O3", "-march=native", "-fopenmp", "-std=c++17", "-fno-math-errno", "-fno-trapping-math",
         "-ffp-contract=off"]  # fmt: skip


def _inputs(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    x = torch.randn(shape, generator=torch.Generator().manual_seed(3)) * 3
    flat = x.view(-1)
    flat[: len(SPECIALS)] = torch.tensor(SPECIALS)
    return x.to(dtype)


def _compiled(fn, inputs) -> tuple[autofusion.CompiledModel, torch.Tensor]:
    cm = autofusion.compile(fn, inputs)
    with torch.no_grad():
        out = cm(*inputs)
    assert "build_error" not in cm.stats, cm.stats
    assert cm.stats["generated_calls"] >= 1, "no generated kernel ran"
    return cm, out


def _assert_pow_close(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype) -> None:
    """within ~2 units in the last place (subnormal results: absolutely); NaN where eager has NaN; zeros and
    infinities exactly, with eager's sign"""
    assert torch.equal(out.isnan(), ref.isnan())
    tiny = torch.finfo(dtype).tiny
    torch.testing.assert_close(out.double(), ref.double(), rtol=TOL[dtype], atol=tiny, equal_nan=True)
    exact = (ref == 0) | ref.isinf()
    assert torch.equal(out[exact], ref[exact])
    assert torch.equal(out[exact].signbit(), ref[exact].signbit())


@pytest.mark.parametrize("size", SIZES, ids=list(SIZES))
@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.float16, torch.bfloat16], ids=["fp32", "fp16", "bf16"]
)
@pytest.mark.parametrize("e", EXPONENTS, ids=[repr(e) for e in EXPONENTS])
def test_literal_exponent_matches_eager(e: float, dtype: torch.dtype, size: str) -> None:
    x = _inputs(SIZES[size], dtype)
    fn = lambda t: (t**e) * 2.0  # noqa: E731 - a second op keeps x ** 0 from folding away
    cm, out = _compiled(fn, (x,))
    src = cm.last.program.source
    assert "std::pow" not in src
    small = math.isfinite(e) and (2 * e).is_integer() and abs(e) <= 64
    want = ("af_powi(" if e.is_integer() else "af_pow_half(") if small else "af_pow("
    assert want in src, src[src.index("static void autofused") :]
    _assert_pow_close(out, fn(x), dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
def test_tensor_exponent_matches_eager(dtype: torch.dtype) -> None:
    """x ** y with y a tensor (broadcast over rows): af_pow, both signs of x, integer and fractional y"""
    x = _inputs((37, 1031), dtype)
    y = (torch.randn(1031, generator=torch.Generator().manual_seed(4)) * 4).to(dtype)
    y[::3] = y[::3].round()  # integer exponents of both parities: negative x gives a signed result there
    y[:6] = torch.tensor([0.0, -0.0, math.inf, -math.inf, math.nan, 1.0], dtype=dtype)
    fn = lambda a, b: (a * 1.0) ** b  # noqa: E731
    cm, out = _compiled(fn, (x, y))
    assert "af_pow(" in cm.last.program.source
    _assert_pow_close(out, fn(x, y), dtype)


def test_negative_exponent_underflow_and_overflow_in_the_power() -> None:
    """x ** -3 where x^3 overflows float (the result is a float subnormal or 0) and x ** 5 where the result
    overflows: multiplies in double, one rounding at the end"""
    x = torch.tensor([1e13, 3e12, 1e20, 1e-13, 2e8, -2e8, 1e-9] * 10)
    _, out = _compiled(lambda t: (t**-3.0) * 1.0, (x,))
    ref = (x.double() ** -3.0).float()
    assert torch.equal(out, ref), (out[:7], ref[:7])
    _, out = _compiled(lambda t: (t**5.0) * 1.0, (x,))
    assert torch.equal(out, (x.double() ** 5.0).float())


# ---- the generated loops vectorise and call no libm ---------------------------------------------------


def _gelu_tanh_formula(x: torch.Tensor) -> torch.Tensor:
    """GPT-2's NewGELUActivation as transformers writes it"""
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


CASES = {
    "gpt2 tanh-gelu": (_gelu_tanh_formula, 1),
    "x ** 4 fp16": (lambda x: (x.half() ** 4.0).float(), 1),
    "x ** 2.5": (lambda x: x**2.5, 1),
    "x ** 1.7": (lambda x: x**1.7, 1),
    "x ** y": (lambda x, y: x**y, 2),
}


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not found")
@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_pow_kernels_vectorise_without_libm(case: str, tmp_path) -> None:
    """GCC reports the kernel's simd loop vectorised (-fopt-info-vec-optimized), and the library it builds
    imports no libm function (nm -D): no scalar call stays in the inner loop."""
    fn, n_in = CASES[case]
    inputs = tuple(torch.randn(128, 3072, generator=torch.Generator().manual_seed(k)) for k in range(n_in))
    cm, out = _compiled(fn, inputs)
    torch.testing.assert_close(out, fn(*inputs), rtol=1e-5, atol=1e-6, equal_nan=True)
    text = cm.last.program.source
    assert "std::pow" not in text
    src = tmp_path / "k.cpp"
    src.write_text(text)
    cmd = [
        "g++",
        *FLAGS,
        "-shared",
        "-fPIC",
        str(src),
        "-o",
        str(tmp_path / "k.so"),
        "-fopt-info-vec-optimized",
    ]
    res = subprocess.run(cmd, capture_output=True, text=True, check=True)
    vectorised = {
        int(m.group(1)) for m in re.finditer(r"k\.cpp:(\d+):\d+: optimized: loop vectorized", res.stderr)
    }
    loops = [
        i + 1 for i, line in enumerate(text.splitlines()) if line.strip().startswith("for (int64_t g0 = lo")
    ]
    assert loops, text
    # GCC reports an omp simd loop at its pragma line or its first body line
    assert all({ln - 1, ln, ln + 1} & vectorised for ln in loops), (loops, sorted(vectorised))
    nm = shutil.which("nm")
    if nm is not None:
        argv = [nm, "-D", "--undefined-only", str(tmp_path / "k.so")]
        undefined = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
        libm = re.findall(r"\b(pow|exp|log|tanh|erf|sqrt|exp2|log2)f?\b", undefined)
        assert not libm, undefined
