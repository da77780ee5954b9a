"""Staged fp16 loads and stores (af_f16_load / af_f16_store in af_math.h, rendered by codegen/cpp/render.py
for pointwise kernels) and the half conversions of fused kernels, bit-exact.

Two levels. The header's staging functions, compiled for this machine (F16C, and AVX-512 where it has
it), for an AVX2 + F16C target without AVX-512 and for plain x86-64 (no F16C: the per-element bit
manipulation), give the same bits as each other and as the scalar af_f16_to_f32 / af_f32_to_f16 for every
fp16 value and a sweep of floats, for every run length up to AF_STAGE (the tails). Fused kernels built
by autofusion.compile run all 65,536 fp16 bit patterns (and all bf16 ones) through chains eager rounds
the same way (every op rounds to the half type, as ATen does), and fp32 -> fp16 casts of tricky floats,
at odd sizes, and compare bits with eager; the tests check that the staged form was rendered and that
generated code ran.
"""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

import autofusion
from autofusion.codegen.cpp import staging
from autofusion.hw import isa

HEADER_DIR = Path(__file__).resolve().parents[2] / "src" / "autofusion" / "codegen" / "cpp"
CXX = shutil.which("g++")
FLAGS = ["-O3", "-fopenmp", "-std=c++17", "-fno-math-errno", "-fno-trapping-math", "-ffp-contract=off"]
STAGE = 256  # AF_STAGE

SOURCE = """
#define AF_F16_STAGED 1
#include "af_math.h"
extern "C" void load(const uint16_t* x, float* y, long n, long run) {
    for (long i = 0; i < n; i += run) af_f16_load(x + i, y + i, n - i < run ? n - i : run);
}
extern "C" void store(const float* x, uint16_t* y, long n, long run) {
    for (long i = 0; i < n; i += run) af_f16_store(x + i, y + i, n - i < run ? n - i : run);
}
extern "C" void scalar_load(const uint16_t* x, float* y, long n) {
    for (long i = 0; i < n; ++i) y[i] = af_f16_to_f32(x[i]);
}
extern "C" void scalar_store(const float* x, uint16_t* y, long n) {
    for (long i = 0; i < n; ++i) y[i] = af_f32_to_f16(x[i]);
}
extern "C" int hardware(void) {
#ifdef AF__F16_HW
    return 1;
#else
    return 0;
#endif
}
"""

TARGETS = {"native": "-march=native", "avx2+f16c": "-march=haswell", "x86-64 (no F16C)": "-march=x86-64"}

pytestmark = pytest.mark.skipif(CXX is None, reason="g++ not found")


def _build(tmp: Path, march: str) -> ctypes.CDLL:
    src = tmp / "staging.cpp"
    src.write_text(SOURCE)
    so = tmp / f"staging{march.replace('=', '_')}.so"
    cmd = [CXX, *FLAGS, march, "-shared", "-fPIC", "-I", str(HEADER_DIR), str(src), "-o", str(so)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    lib = ctypes.CDLL(str(so))
    for name in ("load", "store"):
        getattr(lib, name).argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_long, ctypes.c_long]
    for name in ("scalar_load", "scalar_store"):
        getattr(lib, name).argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_long]
    return lib


@pytest.fixture(scope="module")
def libs(tmp_path_factory) -> dict[str, ctypes.CDLL]:
    tmp = tmp_path_factory.mktemp("staging")
    flags = isa.host_features()
    out = {}
    for name, march in TARGETS.items():
        if name == "avx2+f16c" and not {"avx2", "f16c", "fma"} <= flags:
            continue  # cannot run it here
        out[name] = _build(tmp, march)
    return out


def _run(lib: ctypes.CDLL, fn: str, x: np.ndarray, out_dtype: type, *extra: int) -> np.ndarray:
    y = np.empty(x.shape, dtype=out_dtype)
    getattr(lib, fn)(x.ctypes.data, y.ctypes.data, x.size, *extra)
    return y


def _float_inputs() -> np.ndarray:
    rng = np.random.default_rng(7)
    h = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32)
    fin = np.unique(h[np.isfinite(h)].astype(np.float64))
    mids = ((fin[:-1] + fin[1:]) / 2).astype(np.float32)  # every fp16 halfway case, exact in float32
    near = np.concatenate([np.nextafter(mids, np.float32(np.inf)), np.nextafter(mids, np.float32(-np.inf))])
    k = np.arange(2**20, dtype=np.uint64)
    sweep = ((k << 12) | (k * 2654435761 & 0xFFF)).astype(np.uint32).view(np.float32)  # all of 2^32
    payloads = rng.integers(1, 2**23, 1000, dtype=np.uint64).astype(np.uint32)
    nan_payloads = (payloads | 0x7F800000).view(np.float32)
    special = np.array([0.0, -0.0, np.inf, -np.inf, 65504.0, 65519.996, 65520.0, -65520.0, 2.0**-24, 2.0**-25,
                        2.0**-14, 2.0**-14 - 2.0**-25, 1e-45, -1e-45, 3e38], dtype=np.float32)  # fmt: skip
    return np.concatenate([h, mids, near, sweep, nan_payloads, -nan_payloads, special])


def test_the_native_build_uses_f16c_where_the_machine_has_it(libs) -> None:
    assert libs["native"].hardware() == int("f16c" in isa.host_features())
    assert libs["x86-64 (no F16C)"].hardware() == 0
    if "avx2+f16c" in libs:
        assert libs["avx2+f16c"].hardware() == 1


@pytest.mark.parametrize("target", TARGETS)
def test_staged_load_is_the_scalar_decoding_for_every_fp16_value(libs, target: str) -> None:
    if target not in libs:
        pytest.skip(f"this machine cannot run {target} code")
    lib = libs[target]
    bits = np.arange(65536, dtype=np.uint32).astype(np.uint16)
    ref = _run(libs["native"], "scalar_load", bits, np.float32)
    for run in (STAGE, 1, 7, 8, 9, 15, 16, 17, 31, 100, 255):
        got = _run(lib, "load", bits, np.float32, run)
        assert np.array_equal(got.view(np.uint32), ref.view(np.uint32)), (target, run)
    # and it is the exact value (NaNs: quiet, with sign and payload)
    val = bits.view(np.float16).astype(np.float32)
    fin = ~np.isnan(val)
    assert np.array_equal(ref[fin].view(np.uint32), val[fin].view(np.uint32))
    nan_bits = ref[~fin].view(np.uint32)
    assert np.array_equal(nan_bits, (bits[~fin].astype(np.uint32) & 0x3FF) << 13 | 0x7FC00000 | (
        (bits[~fin].astype(np.uint32) & 0x8000) << 16))  # fmt: skip


@pytest.mark.parametrize("target", TARGETS)
def test_staged_store_is_the_scalar_rounding(libs, target: str) -> None:
    if target not in libs:
        pytest.skip(f"this machine cannot run {target} code")
    x = _float_inputs()
    ref = _run(libs["native"], "scalar_store", x, np.uint16)
    for run in (STAGE, 1, 7, 9, 16, 17, 255):
        got = _run(libs[target], "store", x, np.uint16, run)
        bad = np.nonzero(got != ref)[0]
        assert bad.size == 0, (target, run, [(float(x[i]), hex(got[i]), hex(ref[i])) for i in bad[:5]])
    # and the scalar rounding is torch's (NaN: the quiet NaN of its sign)
    nan = np.isnan(x)
    t = torch.from_numpy(x).to(torch.float16).view(torch.int16).numpy().view(np.uint16)
    assert np.array_equal(ref[~nan], t[~nan])
    assert np.array_equal(ref[nan], ((x[nan].view(np.uint32) >> 16) & 0x8000).astype(np.uint16) | 0x7E00)


# ---------------------------------------------------------------------------- fused kernels


@pytest.fixture
def staged(monkeypatch) -> list[staging.Staging]:
    """The stagings the renderer produced while the test ran."""
    seen: list[staging.Staging] = []
    real = staging.plan

    def spy(*args, **kwargs):
        out = real(*args, **kwargs)
        if out is not None:
            seen.append(out)
        return out

    monkeypatch.setattr(staging, "plan", spy)
    return seen


def _compiled(fn, inputs: list[torch.Tensor]) -> tuple[autofusion.CompiledModel, object]:
    cm = autofusion.compile(fn, inputs)
    with torch.no_grad():
        out = cm(*inputs)
    assert "build_error" not in cm.stats and cm.stats["fused_kernels"] >= 1, cm.stats
    assert cm.stats["generated_calls"] >= 1, "no generated kernel ran"
    return cm, out


def _same_bits(got: torch.Tensor, ref: torch.Tensor) -> None:
    assert got.dtype == ref.dtype and got.shape == ref.shape
    g = got.view(torch.int16 if got.element_size() == 2 else torch.int32)
    r = ref.view(torch.int16 if ref.element_size() == 2 else torch.int32)
    nan = torch.isnan(ref)
    assert torch.equal(torch.isnan(got), nan)
    bad = (g != r) & ~nan
    assert not bad.any(), [(float(got[i]), float(ref[i])) for i in bad.nonzero()[:5, 0]]


def _all_bits(dtype: torch.dtype, pad: int) -> torch.Tensor:
    """Every bit pattern of the 16-bit type, then `pad` more from the start (an odd length, a tail)."""
    b = torch.arange(65536, dtype=torch.int32).to(torch.int16)
    return torch.cat([b, b[:pad]]).view(dtype)


CHAINS = {
    # eager rounds each op's result to the half type; the kernel does the same (the last one in the store)
    "x*2*0.5": lambda x, y: x * 2.0 * 0.5,
    "x+y": lambda x, y: x + y,
    "(x*1.5+y)*0.25-x": lambda x, y: (x * 1.5 + y) * 0.25 - x,
    "relu(x)+0": lambda x, y: torch.relu(x) + 0.0,
}


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("chain", CHAINS, ids=list(CHAINS))
def test_every_half_bit_pattern_through_a_fused_chain(staged, chain: str, dtype: torch.dtype) -> None:
    fn = CHAINS[chain]
    x = _all_bits(dtype, 4099)
    # y: small, tiny (fp16 subnormal), large and negative values: sums land on halfway cases and overflow
    ys = torch.tensor([2.0**-25, 2.0**-11, -3.0, 6e-8, 30000.0, -0.0], dtype=torch.float32).to(dtype)
    y = ys.repeat(x.numel() // ys.numel() + 1)[: x.numel()].roll(17)
    _, out = _compiled(fn, [x, y])
    _same_bits(out, fn(x, y))
    if dtype == torch.float16:
        assert staged and staged[-1].loads and staged[-1].stores  # the staged conversions were rendered


@pytest.mark.parametrize("n", [7, 17, 255, 257, 40_001, 65_537])
def test_fp32_to_fp16_rounding_in_a_kernel(staged, n: int) -> None:
    """fp32 inputs cast to fp16 in the kernel and stored: halfway cases, the overflow edge, subnormal
    boundaries, NaN; odd sizes below and above the staging threshold and the parallel threshold"""
    x = torch.from_numpy(_float_inputs())
    x = x[torch.randperm(x.numel(), generator=torch.Generator().manual_seed(n))][:n]
    y = torch.randn(n, generator=torch.Generator().manual_seed(1)).to(torch.float16)

    def fn(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # the first result is only a cast (rounded once), the second an fp16 op on it (rounded again)
        h = (x * 1.0).to(torch.float16)
        return h, h * y

    _, out = _compiled(fn, [x, y])
    for got, ref in zip(out, fn(x, y), strict=True):
        _same_bits(got, ref)
    if n >= 17:
        assert staged


def test_fp16_to_fp32_decoding_in_a_kernel(staged) -> None:
    """every fp16 value widened in a kernel: the exact fp32 value (NaN stays NaN)"""
    x = _all_bits(torch.float16, 1001)
    fn = lambda x: x.float() * 1.0  # noqa: E731
    _, out = _compiled(fn, [x])
    _same_bits(out, fn(x))
    assert staged and staged[-1].loads


def test_strided_and_broadcast_fp16_accesses_are_not_staged(staged) -> None:
    """a transposed input and a broadcast row keep their per-element conversions; results stay exact"""
    g = torch.Generator().manual_seed(3)
    x = (torch.randn(67, 129, generator=g) * 100).to(torch.float16)
    b = torch.randn(129, generator=g).to(torch.float16)
    fn = lambda x, b: x.t().contiguous().t() * 1.0 + b  # noqa: E731
    _, out = _compiled(fn, [x, b])
    _same_bits(out, fn(x, b))
    fn2 = lambda x, b: x.t() * 2.0 + b[:67]  # noqa: E731
    _, out = _compiled(fn2, [x, b])
    _same_bits(out, fn2(x, b))
    for s in staged:  # whatever was staged is contiguous along the inner loop
        assert all(st.offset is not None and st.offset.is_affine for st in (*s.loads.values(), *s.stores))


@pytest.fixture
def lane_loads(monkeypatch) -> list[dict]:
    """The fp16 loads staged in reductions' lane loops while the test ran."""
    seen: list[dict] = []
    real = staging.contiguous_loads

    def spy(*args, **kwargs):
        out = real(*args, **kwargs)
        if out:
            seen.append(out)
        return out

    monkeypatch.setattr(staging, "contiguous_loads", spy)
    return seen


@pytest.mark.parametrize("shape", [(1001, 1003), (3, 100_003), (37, 17)], ids=str)
def test_staged_reductions_are_exact_where_eager_is(staged, lane_loads, shape) -> None:
    """Row sums of small integers (exact in any order), a row max and x - max (exact) over fp16 rows
    whose loads and stores are staged: the same bits as eager"""
    g = torch.Generator().manual_seed(11)
    x = torch.randint(-8, 9, shape, generator=g).to(torch.float16)
    x[0, : min(5, shape[1])] = torch.tensor([65504.0, -0.0, 2.0**-24, -(2.0**-14), 0.5])[: min(5, shape[1])]

    def fn(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return (x.float() * 4.0).sum(-1), x - x.amax(-1, keepdim=True)

    _, out = _compiled(fn, [x])
    for got, ref in zip(out, fn(x), strict=True):
        _same_bits(got, ref)
    if shape[1] >= 256:
        assert lane_loads  # the float sum's lane loops convert whole groups
        assert staged  # the x - max stage converts its runs


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_staged_layer_norm_and_softmax_match_eager(dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(5)
    x = (torch.randn(65, 1031, generator=g) * 3).to(dtype)
    ln = torch.nn.LayerNorm(1031, dtype=dtype).eval()
    with torch.no_grad():
        ln.weight.copy_(torch.randn(1031, generator=g).to(dtype))
        ln.bias.copy_(torch.randn(1031, generator=g).to(dtype))
    for model in (ln, torch.nn.Softmax(-1)):
        _, out = _compiled(model, [x])
        with torch.no_grad():
            ref = model(x)
        torch.testing.assert_close(out, ref, rtol=1e-2, atol=1e-2)


def test_only_units_that_stage_include_the_vector_intrinsics() -> None:
    """<immintrin.h> costs g++ ~0.45 s per build: an fp32 kernel's unit leaves it out (AF_F16_STAGED not
    defined), an fp16 kernel that stages its loads defines it, and both compute the right result."""
    x32 = torch.randn(1000, 257)
    cm32, out32 = _compiled(lambda a: a * 2.0 + 1.0, [x32])
    torch.testing.assert_close(out32, x32 * 2.0 + 1.0)
    assert "#define AF_F16_STAGED" not in cm32.last.program.source
    x16 = x32.to(torch.float16)
    cm16, out16 = _compiled(lambda a: a * 2.0 + 1.0, [x16])
    _same_bits(out16, x16 * 2.0 + 1.0)
    src = cm16.last.program.source
    assert "af_f16_load(" in src and "#define AF_F16_STAGED 1" in src
