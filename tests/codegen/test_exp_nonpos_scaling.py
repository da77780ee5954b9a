"""af_exp_nonpos's one-multiplication scaling (af__exp_poly_s64 * 2^(n+64)) gives the same bits as the
two-multiplication form it replaced ((af__exp_poly * 2^(n+64)) * 2^-64), for x <= 0 and NaN. The loop runs
in C (a shared library built with the kernel flags, both forms vectorised as the kernels vectorise them)
over every 61st float bit pattern from -0 to -inf and every float near the subnormal and zero edges."""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from pathlib import Path

import pytest

from autofusion.codegen.cpp.build import DEFAULT_FLAGS

HEADER_DIR = Path(__file__).resolve().parents[2] / "src" / "autofusion" / "codegen" / "cpp"
CXX = shutil.which("g++")

SOURCE = r"""
#include <cstdint>
#include <cstring>
#include <cmath>
#include "af_math.h"
static inline float two_multiplications(float x) {
    float t = AF__FMA(x, AF__LOG2E, AF__MAGIC_S64);
    float nf = t - AF__MAGIC_S64;
    uint32_t scale = af__f2u(t) << 23;
    float r = AF__FMA(-nf, AF__LN2_HI, x);
    r = AF__FMA(-nf, AF__LN2_LO, r);
    float res = (af__exp_poly(r) * af__u2f(scale)) * 0x1p-64f;
    return x < -104.0f ? 0.0f : res;
}
/* mismatching bit patterns among lo, lo + step, ... < hi (uint32 patterns) */
extern "C" int64_t af_test_mismatches(uint32_t lo, uint32_t hi, uint32_t step) {
    enum { N = 4096 };
    float xs[N], a[N], b[N];
    int64_t bad = 0;
    uint64_t u = lo;
    while (u < hi) {
        int n = 0;
        for (; n < N && u < hi; ++n, u += step) { uint32_t v = (uint32_t)u; std::memcpy(&xs[n], &v, 4); }
        #pragma omp simd
        for (int i = 0; i < n; ++i) a[i] = af_exp_nonpos(xs[i]);
        #pragma omp simd
        for (int i = 0; i < n; ++i) b[i] = two_multiplications(xs[i]);
        for (int i = 0; i < n; ++i) bad += std::memcmp(&a[i], &b[i], 4) != 0;
    }
    return bad;
}
"""


@pytest.fixture(scope="module")
def lib(tmp_path_factory) -> ctypes.CDLL:
    if CXX is None:
        pytest.skip("g++ not found")
    tmp = tmp_path_factory.mktemp("exp_nonpos")
    src, out = tmp / "exp_nonpos_test.cpp", tmp / "exp_nonpos_test.so"
    src.write_text(SOURCE)
    cmd = [CXX, *DEFAULT_FLAGS, "-I", str(HEADER_DIR), str(src), "-o", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    so = ctypes.CDLL(str(out))
    so.af_test_mismatches.restype = ctypes.c_int64
    so.af_test_mismatches.argtypes = [ctypes.c_uint32] * 3
    return so


@pytest.mark.parametrize(
    "lo, hi, step",
    [
        (0x80000000, 0xFF800001, 61),  # -0 .. -inf, every 61st pattern
        (0xC2CF0000, 0xC2D10000, 1),  # around -104: results subnormal and the cut to 0
        (0xC2AE0000, 0xC2B00000, 1),  # around -87.3: results leave the normal range
        (0x80000000, 0x80100000, 1),  # -0 and the tiny x whose exp rounds to 1
        (0xFF800000, 0xFFFFFFFF, 4093),  # -inf and negative NaNs
        (0x7FC00000, 0x7FC00001, 1),  # a positive quiet NaN
    ],
)
def test_one_multiplication_gives_the_same_bits(lib: ctypes.CDLL, lo: int, hi: int, step: int) -> None:
    assert lib.af_test_mismatches(lo, hi, step) == 0
