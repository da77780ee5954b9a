"""Fused kernels against eager PyTorch: every fusion kind x dtype x awkward shape and layout."""

from __future__ import annotations

import subprocess

import pytest
import torch
import torch.nn.functional as F

import autofusion

KINDS = {
    "elementwise chain": (lambda x, y: ((x * 1.5 + y).sigmoid() * x - 0.5).relu(), 2),
    "broadcast bias gelu": (lambda x, y: F.gelu(x + y[..., :1]), 2),
    "softmax": (lambda x, y: torch.softmax(x, -1), 1),
    "log_softmax": (lambda x, y: torch.log_softmax(x * 2, -1), 1),
    "layer_norm": (lambda x, y: F.layer_norm(x, x.shape[-1:]), 1),
    "rms_norm": (lambda x, y: F.rms_norm(x, x.shape[-1:]), 1),
    "x - mean": (lambda x, y: x - x.mean(-1, keepdim=True), 1),
    "two reductions": (lambda x, y: x.amax(-1) + x.sum(-1), 1),
    "transpose + add": (lambda x, y: x.transpose(-1, -2).exp() + 1, 1),
    "slice + concat": (lambda x, y: torch.cat([x[..., ::2], y[..., 1::2]], -1).tanh(), 2),
}
SHAPES = {
    "17x33": (17, 33),
    "size-1 dims": (1, 5, 1, 7),
    "vector tail 1x1031": (1, 1031),
    "0-d-like 1x1": (1, 1),
    # above the 32,768-element parallel threshold: rows shared by threads, rows taken whole
    "parallel 3x100003": (3, 100003),
    "parallel 37x1031": (37, 1031),
}
DTYPES = {
    "fp32": (torch.float32, 1e-5, 1e-5),
    "fp16": (torch.float16, 1e-2, 1e-2),
    "bf16": (torch.bfloat16, 2e-2, 2e-2),
}


def _check(fn, inputs, rtol: float, atol: float) -> autofusion.CompiledModel:
    cm = autofusion.compile(fn, inputs)
    with torch.no_grad():
        fn(*inputs)
        ref = fn(*inputs)
        out = cm(*inputs)
    torch.testing.assert_close(out, ref, rtol=rtol, atol=atol, equal_nan=True)
    assert "build_error" not in cm.stats
    assert cm.stats["fused_kernels"] >= 1  # a generated kernel was planned, not only torch
    assert cm.stats["generated_calls"] >= 1, "no generated kernel ran"
    return cm


@pytest.mark.parametrize("dtype", DTYPES, ids=list(DTYPES))
@pytest.mark.parametrize("shape", SHAPES, ids=list(SHAPES))
@pytest.mark.parametrize("kind", KINDS, ids=list(KINDS))
def test_fused_kind_matches_eager(kind: str, shape: str, dtype: str) -> None:
    fn, _ = KINDS[kind]
    dt, rtol, atol = DTYPES[dtype]
    g = torch.Generator().manual_seed(0)
    inputs = tuple(torch.randn(SHAPES[shape], generator=g).to(dt) for _ in range(2))
    cm = _check(fn, inputs, rtol, atol)
    assert cm.stats["fused_kernels"] >= 1


@pytest.mark.parametrize("kind", ["elementwise chain", "softmax", "layer_norm", "x - mean"])
def test_non_contiguous_inputs(kind: str) -> None:
    fn, _ = KINDS[kind]
    base = torch.randn(40, 30)
    x = base.t()  # transposed: strides (1, 30)
    y = torch.randn(30, 80)[:, ::2]  # sliced: strides (80, 2)
    assert not x.is_contiguous() and not y.is_contiguous()
    _check(fn, (x, y), 1e-5, 1e-5)


def test_empty_and_zero_dim_tensors() -> None:
    _check(lambda x, y: (x * 2 + y).exp(), (torch.randn(0, 5), torch.randn(0, 5)), 1e-5, 1e-6)
    _check(lambda x, y: (x * 2 + y).exp(), (torch.randn(()), torch.randn(())), 1e-5, 1e-6)
    _check(lambda x, y: torch.softmax(x, -1) + y, (torch.randn(0, 7), torch.randn(0, 7)), 1e-5, 1e-6)


def test_nan_and_inf_propagate_like_torch() -> None:
    x = torch.tensor([[1.0, float("nan"), 3.0], [float("-inf"), 0.0, float("inf")], [1.0, 2.0, 3.0]])
    _check(
        lambda a: (a.amax(-1), a.amin(-1), a.relu(), a.clamp(0, 1), torch.maximum(a, a * 0)), (x,), 1e-6, 1e-6
    )


def test_integer_and_bool_kernels() -> None:
    a = torch.randint(-50, 50, (9, 13), dtype=torch.int64)
    b = torch.randint(1, 7, (9, 13), dtype=torch.int32)
    _check(
        lambda x, y: ((x * 3 + y) // 2, (x > y) & (x < 10), torch.where(x > 0, x, -x).sum(-1)), (a, b), 0, 0
    )


def test_generated_loops_vectorise(tmp_path) -> None:
    cm = autofusion.compile(
        lambda x, y: torch.softmax(x * y, -1), (torch.randn(64, 1000), torch.randn(64, 1000))
    )
    src = tmp_path / "k.cpp"
    src.write_text(cm.last.program.source)
    flags = [
        "-O3",
        "-march=native",
        "-fopenmp",
        "-std=c++17",
        "-fno-math-errno",
        "-fno-trapping-math",
        "-ffp-contract=off",
    ]
    cmd = ["g++", *flags, "-c", str(src), "-o", str(tmp_path / "k.o"), "-fopt-info-vec-optimized"]
    res = subprocess.run(cmd, capture_output=True, text=True, check=True)
    kernel_start = (
        cm.last.program.source[: cm.last.program.source.index("static void autofused")].count("\n") + 1
    )
    lines = {
        int(line.split(":")[1])
        for line in res.stderr.splitlines()
        if "loop vectorized" in line and "k.cpp:" in line
    }
    heads = ("for (int64_t g1 = lo", "for (int64_t af_j = 0; af_j < 64;", "for (int64_t af_j = 0; af_j < 16;")
    loops = [i + 1 for i, line in enumerate(src.read_text().splitlines()) if any(h in line for h in heads)]
    # the max pass and the sum pass (each in groups of 64 lanes, then of 16: rows of 1000 are longer
    # than MAX_LANES_FROM groups), the output pass
    assert len(loops) == 5
    # GCC reports an omp simd loop at its pragma line or its first body line.
    vectorised = [ln for ln in loops if {ln - 1, ln, ln + 1} & lines]
    assert len(vectorised) == 5, (loops, sorted(x for x in lines if x >= kernel_start))


def test_short_reduction_rows_keep_one_simd_loop() -> None:
    """Rows of at most one group of accumulator lanes gain no precision from lanes: their source is the
    single simd reduction loop per pass (no lane arrays, no tree)."""

    def source(n: int) -> str:
        return autofusion.compile(lambda x: torch.softmax(x, -1), (torch.randn(512, n),))._last.program.source

    short = source(64)
    assert "af_j" not in short and short.count("for (int64_t g1 = lo") == 3
    assert "af_j" in source(65)


# ---- casts and divisions inside kernels ------------------------------------------------------------
BIG = 2 * 32768 + 13  # above the parallel threshold, with a vector tail


def _fused(fn, inputs) -> tuple[autofusion.CompiledModel, object]:
    cm = autofusion.compile(fn, inputs)
    with torch.no_grad():
        out = cm(*inputs)
    assert "build_error" not in cm.stats and cm.stats["fused_kernels"] >= 1, cm.stats
    return cm, out


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_cast_to_half_rounds_inside_a_kernel(dtype) -> None:
    """x.half().float() - x is the rounding error, also when the half value never leaves a register; a cast
    to a half type overflows to inf where eager's does."""
    x = torch.randn(BIG, generator=torch.Generator().manual_seed(0))
    f = lambda x: x.to(dtype).float() - x  # noqa: E731
    _, out = _fused(f, (x,))
    assert torch.equal(out, f(x)) and out.abs().max() > 0
    g = lambda x: (x * 1e5).to(dtype).float().isinf().sum()  # noqa: E731
    _, out = _fused(g, (x,))
    assert torch.equal(out, g(x))
    # a half value computed in fp32 inside the kernel is rounded before it is widened
    h = lambda x: (x.to(dtype) * 3).float() - x.to(dtype).float() * 3  # noqa: E731
    _, out = _fused(h, (x,))
    assert torch.equal(out, h(x))


def test_casts_to_int_and_bool_match_eager() -> None:
    """float -> int truncates; NaN, inf and out-of-range values give eager's (x86's) INT_MIN, no crash."""
    vals = [float("nan"), float("inf"), -float("inf"), 3e9, -3e9, 1e19, -1e19, 2.7, -2.7, -0.0, 0.5]
    x = torch.tensor(vals * (BIG // len(vals) + 1))[:BIG]

    def f(x):
        return (x * 1.0).to(torch.int32), (x * 1.0).to(torch.int64), (x * 1.0).to(torch.bool)

    _, out = _fused(f, (x,))
    for got, ref in zip(out, f(x), strict=True):
        assert torch.equal(got, ref)


def test_division_by_a_subnormal_row_sum() -> None:
    """x / x.sum(-1) stays a division: the reciprocal of a subnormal sum overflows to inf."""
    f = lambda x: x / x.sum(-1, keepdim=True)  # noqa: E731
    for x in (torch.full((4, 4), 1e-40), torch.full((64, 1031), 1e-43)):
        cm, out = _fused(f, (x,))
        assert torch.equal(out, f(x)), out
        assert "(1.0f /" not in cm.last.program.source


def test_division_by_a_constant_is_exact() -> None:
    """x / c equals eager bitwise: a multiply only for powers of two whose reciprocal is normal"""
    x = torch.randn(BIG, generator=torch.Generator().manual_seed(1)) * 1e30
    x[:4] = torch.tensor([1e-40, -3e38, float("inf"), 0.0])
    for c in (3.0, 0.1, 4.0, 0.25, 2.0**-130, 2.0**127):
        f = lambda x, c=c: (x * 1.5) / c  # noqa: E731
        _, out = _fused(f, (x,))
        ref = f(x)
        assert torch.equal(out.nan_to_num(7.0), ref.nan_to_num(7.0)), c


def test_softmax_multiplies_by_the_reciprocal_of_its_sum() -> None:
    """softmax's row sum is >= 1 (or NaN), so the planner may hoist 1/s: proven, not assumed"""
    x = torch.randn(64, 1000)
    cm, out = _fused(lambda x: torch.softmax(x, -1), (x,))
    assert "(1.0f / acc" in cm.last.program.source
    torch.testing.assert_close(out, torch.softmax(x, -1), rtol=1e-6, atol=1e-7)


def test_sin_cos_of_huge_arguments() -> None:
    """sin/cos stay accurate up to FLT_MAX (kernels rerun a block with the wide reduction when needed)"""
    x = torch.randn(BIG, generator=torch.Generator().manual_seed(2))
    x[::997] = torch.logspace(4.9, 38.5, x[::997].numel())
    f = lambda x: (torch.sin(x * 1.0), torch.cos(x * 1.0))  # noqa: E731
    _, (s, c) = _fused(f, (x,))
    torch.testing.assert_close(s.double(), x.double().sin(), rtol=0, atol=3e-7)
    torch.testing.assert_close(c.double(), x.double().cos(), rtol=0, atol=3e-7)
