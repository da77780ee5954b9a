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
    "two reductions": (lambda x, y: (x.amax(-1) + x.sum(-1)), 1),
    "transpose + add": (lambda x, y: x.transpose(-1, -2).exp() + 1, 1),
    "slice + concat": (lambda x, y: torch.cat([x[..., ::2], y[..., 1::2]], -1).tanh(), 2),
}
SHAPES = {"17x33": (17, 33), "size-1 dims": (1, 5, 1, 7), "vector tail 1x1031": (1, 1031), "0-d-like 1x1": (1, 1)}
DTYPES = {"fp32": (torch.float32, 1e-5, 1e-5), "fp16": (torch.float16, 1e-2, 1e-2), "bf16": (torch.bfloat16, 2e-2, 2e-2)}


def _check(fn, inputs, rtol: float, atol: float) -> autofusion.CompiledModel:
    cm = autofusion.compile(fn, inputs)
    with torch.no_grad():
        fn(*inputs)
        ref = fn(*inputs)
        out = cm(*inputs)
    torch.testing.assert_close(out, ref, rtol=rtol, atol=atol, equal_nan=True)
    assert "build_error" not in cm.stats
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
    _check(lambda a: (a.amax(-1), a.amin(-1), a.relu(), a.clamp(0, 1), torch.maximum(a, a * 0)), (x,), 1e-6, 1e-6)


def test_integer_and_bool_kernels() -> None:
    a = torch.randint(-50, 50, (9, 13), dtype=torch.int64)
    b = torch.randint(1, 7, (9, 13), dtype=torch.int32)
    _check(lambda x, y: ((x * 3 + y) // 2, (x > y) & (x < 10), torch.where(x > 0, x, -x).sum(-1)), (a, b), 0, 0)


def test_generated_loops_vectorise(tmp_path) -> None:
    cm = autofusion.compile(lambda x, y: torch.softmax(x * y, -1), (torch.randn(64, 1000), torch.randn(64, 1000)))
    src = tmp_path / "k.cpp"
    src.write_text(cm._last.program.source)
    flags = ["-O3", "-march=native", "-fopenmp", "-std=c++17", "-fno-math-errno", "-fno-trapping-math",
             "-ffp-contract=off"]
    res = subprocess.run(["g++", *flags, "-c", str(src), "-o", str(tmp_path / "k.o"), "-fopt-info-vec-optimized"],
                         capture_output=True, text=True, check=True)  # fmt: skip
    kernel_start = cm._last.program.source[: cm._last.program.source.index("static void autofused")].count("\n") + 1
    lines = {int(line.split(":")[1]) for line in res.stderr.splitlines() if "loop vectorized" in line and "k.cpp:" in line}
    loops = [i + 1 for i, line in enumerate(src.read_text().splitlines()) if "for (int64_t g1 = 0" in line]
    assert len(loops) == 3  # max pass, sum pass, output pass
    # GCC reports an omp simd loop at its pragma line or its first body line.
    vectorised = [ln for ln in loops if {ln - 1, ln, ln + 1} & lines]
    assert len(vectorised) == 3, (loops, sorted(x for x in lines if x >= kernel_start))
