"""Reductions in generated kernels against eager PyTorch and float64, at the sizes where it matters.

Every test compiles with the C++ backend and checks that the build succeeded and that the reductions
ran inside generated kernels (not as torch calls). Sizes are above the 32,768-element parallel
threshold with odd tails (rows not a multiple of the vector width, rows split across threads and
rows taken whole), rows hold special values, inputs are non-contiguous, in fp32, fp16 and bf16.

Regressions covered: half-type means and variances overflowed (the sum was kept, and across kernels
stored, in the half type); layer_norm / var over constant rows were not exactly 0; long sums and
variances lost precision and a full reduction ran on one thread.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import autofusion
from autofusion.plan.schedule import KernelStep, OpStep

REDUCE_OPS = ("sum", "amax", "amin", "prod")
HALF = {"fp16": torch.float16, "bf16": torch.bfloat16}
DTYPES = {"fp32": torch.float32, **HALF}


def _compiled(fn, inputs, *, in_kernels: bool = True, **options):
    """Compile `fn`, run it once; the build must succeed and a generated kernel must have run. With
    `in_kernels`, every reduction of the plan is inside a kernel (none left to torch)."""
    cm = autofusion.compile(fn, list(inputs), **options)
    with torch.no_grad():
        out = cm(*inputs)
    stats = cm.stats
    assert "build_error" not in stats, stats.get("build_error")
    assert "eager_fallback" not in stats, stats.get("eager_fallback")
    assert stats["fused_kernels"] >= 1
    plan = cm.last.program.plan
    if in_kernels:
        left = [s.node.op for s in plan.steps if isinstance(s, OpStep) and s.node.op in REDUCE_OPS]
        assert not left, f"reductions ran as torch calls: {left}"
        assert any(k.kernel.accumulators for k in plan.kernels), "no kernel reduces"
    return cm, out


def _reduction_tiles(cm):
    steps = cm.last.program.plan.steps
    return [s.tile for s in steps if isinstance(s, KernelStep) and s.kernel.accumulators]


def _ulp(dtype: torch.dtype) -> float:
    return torch.finfo(dtype).eps


def _assert_as_accurate_as_eager(
    fn, x: torch.Tensor, out: torch.Tensor, factor: float = 3.0, ulps: float = 4.0
) -> None:
    """|ours - f64| <= factor * max|eager - f64| + ulps * ulp(dtype) * |f64|, elementwise (eager's largest
    error, as eager may be exact by luck on any one element); NaN and infinities where eager has them."""
    with torch.no_grad():
        eager = fn(x)
        ref = fn(x.double())
    assert out.dtype == eager.dtype and out.shape == eager.shape
    o, e, r = out.double(), eager.double(), ref.double()
    nan = torch.isnan(e)
    assert torch.equal(torch.isnan(o), nan), "NaN where eager has none, or none where eager has one"
    inf = torch.isinf(e)
    assert torch.equal(o[inf], e[inf]), "infinities differ from eager"
    keep = ~(nan | inf)
    o, e, r = o[keep], e[keep], r[keep]
    eager_err = float((e - r).abs().max()) if e.numel() else 0.0
    bound = factor * eager_err + ulps * _ulp(out.dtype) * r.abs()
    err = (o - r).abs()
    worst = int(torch.argmax(err - bound)) if err.numel() else 0
    assert bool((err <= bound).all()), (
        f"error {err[worst].item():.3g} > bound {bound[worst].item():.3g} (eager at most {eager_err:.3g}) "
        f"at value {r[worst].item():.6g}"
    )


# ---- half types accumulate in fp32 ---------------------------------------------------------------


FP16_STATS = {
    "mean(0)": lambda x: x.mean(0),
    "var(0)": lambda x: x.var(0),
    "std(0)": lambda x: x.std(0),
    "t.mean(-1)": lambda x: x.t().mean(-1),
    "t.var(-1)": lambda x: x.t().var(-1),
    "full mean": lambda x: (x * 1).mean(),
}


@pytest.mark.parametrize("fn", FP16_STATS.values(), ids=list(FP16_STATS))
def test_fp16_mean_and_var_do_not_overflow(fn) -> None:
    # 2000 x 50.0 sums to 100000, over fp16's 65504: the sum must stay fp32 inside kernels and between them.
    x = torch.full((2000, 8), 50.0, dtype=torch.float16)
    _, out = _compiled(fn, [x], in_kernels=False)
    torch.testing.assert_close(out, fn(x), rtol=0, atol=0)
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("fn", FP16_STATS.values(), ids=list(FP16_STATS))
def test_fp16_mean_and_var_do_not_overflow_on_the_reference_runtime(fn, tmp_path) -> None:
    # A failed build runs the (decomposed) plan op by op on the reference runtime: the same policy holds.
    x = torch.full((2000, 8), 50.0, dtype=torch.float16)
    for options in ({"cxx": "false", "cache_dir": str(tmp_path)}, {"fusion": False}):
        cm = autofusion.compile(fn, [x], **options)
        assert options.get("fusion", True) is False or "build_error" in cm.stats
        with torch.no_grad():
            torch.testing.assert_close(cm(x), fn(x), rtol=0, atol=0)


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("kind", ["layer_norm", "rms_norm", "softmax", "log_softmax", "var", "mean"])
def test_half_composites_match_eager_near_overflow(kind: str, dtype: str) -> None:
    """Rows whose sums (of x, x^2 or exp) overflow the half type but not fp32: eager computes in fp32."""
    dt = HALF[dtype]
    g = torch.Generator().manual_seed(1)
    # fp16: sums of x, x^2 and exp overflow fp16 but not fp32. bf16 has fp32's range: precision only.
    big = 60000.0 if dt is torch.float16 else 1.0
    x = ((torch.rand(5, 70001, generator=g) * 0.5 + 0.5) * big).to(dt)
    fns = {
        "layer_norm": lambda x: F.layer_norm(x, x.shape[-1:]),
        "rms_norm": lambda x: F.rms_norm(x, x.shape[-1:]),
        "softmax": lambda x: torch.softmax(x / big * 12, -1),
        "log_softmax": lambda x: torch.log_softmax(x / big * 12, -1),
        "var": lambda x: (x * (256 / big)).var(-1), "mean": lambda x: x.mean(-1),
    }  # fmt: skip
    fn = fns[kind]
    _, out = _compiled(fn, [x])
    ref = fn(x)
    assert torch.isfinite(ref).all() and torch.isfinite(out).all()
    torch.testing.assert_close(out.float(), ref.float(), rtol=2 * _ulp(dt), atol=2 * _ulp(dt))


def test_fp16_sum_rounds_to_fp16_like_eager() -> None:
    # eager accumulates in fp32 and rounds the sum to fp16 once: 100000 -> inf, and inf * 0.5 stays inf.
    x = torch.full((8, 2000), 50.0, dtype=torch.float16)
    for fn in (lambda x: x.sum(-1), lambda x: x.sum(-1) * 0.5, lambda x: x - x.sum(-1, keepdim=True) * 0.0):
        _, out = _compiled(fn, [x])
        torch.testing.assert_close(out, fn(x), rtol=0, atol=0, equal_nan=True)
    # Below the limit, the fp32 accumulator gives eager's exact sum (an fp16 accumulator stalls at 2048).
    ones = torch.ones(3, 40000, dtype=torch.float16)
    _, out = _compiled(lambda x: x.sum(-1) * 1.0, [ones])
    assert torch.equal(out, torch.ones(3, 40000).sum(-1).half())


def test_fp16_rms_norm_over_every_dim_keeps_its_sum_of_squares_in_fp32() -> None:
    # A full-tensor rms_norm is two kernels (the sum over everything, then the per-element part);
    # the sum of squares (1.9e6 here) crossed between them as fp16 (inf), so every output was 0.
    x = torch.tensor([[[43.25, 463.25, 671.0], [325.5, 782.0, 559.0]]], dtype=torch.float16)
    w = torch.tensor([[[20.23, 396.5, 253.1], [361.0, 49.81, 698.0]]], dtype=torch.float16)
    fn = lambda x: F.rms_norm(x + 0.0, (1, 2, 3), w, eps=0.5) + 0.0  # noqa: E731
    _, out = _compiled(fn, [x])
    torch.testing.assert_close(out, fn(x), rtol=2e-3, atol=0)


@pytest.mark.parametrize("dtype", HALF)
def test_rms_norm_default_eps_of_half_inputs(dtype: str) -> None:
    # torch computes a half rms_norm in fp32 and its default eps is fp32's, not the half type's.
    x = torch.full((4, 64), 0.01).to(HALF[dtype])
    fn = lambda x: F.rms_norm(x, (64,))  # noqa: E731
    _, out = _compiled(fn, [x])
    torch.testing.assert_close(out, fn(x), rtol=_ulp(HALF[dtype]), atol=0)


# ---- variance around an accurate mean -------------------------------------------------------------

CENTRED = {
    "layer_norm": lambda x: F.layer_norm(x, x.shape[-1:]),
    "layer_norm affine": lambda x: F.layer_norm(
        x,
        x.shape[-1:],
        torch.full(x.shape[-1:], 2.0, dtype=x.dtype),
        torch.full(x.shape[-1:], 0.5, dtype=x.dtype),
    ),
    "var": lambda x: x.var(-1),
    "std": lambda x: x.std(-1, correction=0),
    "var_mean": lambda x: torch.var_mean(x, -1)[0],
}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(4, 32), (6, 1000), (2, 100003)], ids=["4x32", "6x1000", "2x100003"])
@pytest.mark.parametrize("kind", CENTRED)
def test_constant_rows_are_exact(kind: str, shape: tuple[int, ...], dtype: str) -> None:
    """The exact answer (x - mean = 0, variance 0), which fp32 eager gives too (fp16 eager layer_norm
    does not: it gives -0.0009 for 63.7)."""
    x = torch.full(shape, 63.7).to(DTYPES[dtype])
    fn = CENTRED[kind]
    _, out = _compiled(fn, [x])
    exact = torch.full_like(out, 0.5 if kind == "layer_norm affine" else 0.0)
    assert torch.equal(out, exact), out.flatten()[:4]
    if dtype == "fp32":
        assert torch.equal(fn(x), exact)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("data", ["near-constant", "offset 1e4", "offset 1e4 long"])
@pytest.mark.parametrize("kind", ["layer_norm", "var", "rms_norm"])
def test_centred_statistics_on_hard_rows(kind: str, data: str, dtype: str) -> None:
    g = torch.Generator().manual_seed(2)
    dt = DTYPES[dtype]
    if data == "near-constant":
        x = 63.7 + 1e-5 * torch.randn(8, 257, generator=g)
    elif data == "offset 1e4":
        x = 1e4 + torch.randn(8, 257, generator=g)
    else:
        x = 1e4 + torch.randn(3, 300007, generator=g)
    x = x.to(dt)
    fns = {"layer_norm": lambda x: F.layer_norm(x, x.shape[-1:]), "var": lambda x: x.var(-1),
           "rms_norm": lambda x: F.rms_norm(x - x[..., :1], x.shape[-1:])}  # fmt: skip
    fn = fns[kind]
    _, out = _compiled(fn, [x])
    _assert_as_accurate_as_eager(fn, x, out, ulps=8)


# ---- long rows: blocked accumulation, rows split across threads -----------------------------------


def _relerr(a: torch.Tensor, ref: torch.Tensor) -> float:
    return float(((a.double() - ref) / ref).abs().max())


def test_long_full_sum_is_accurate_and_shared_by_threads() -> None:
    g = torch.Generator().manual_seed(3)
    x = torch.rand(16 * 1024 * 1024, generator=g)
    fn = lambda x: (x * 2.0).sum()  # noqa: E731
    cm, out = _compiled(fn, [x])
    ref = (x.double() * 2).sum()
    assert _relerr(out, ref) <= 3 * max(_relerr(fn(x), ref), 2**-24)
    (tile,) = _reduction_tiles(cm)
    assert tile.split_rows  # one row: every thread takes a share of it


def test_long_row_variance_is_accurate() -> None:
    g = torch.Generator().manual_seed(4)
    y = torch.rand(2, 300000, generator=g) + 10
    fn = lambda y: y.var(-1)  # noqa: E731
    _, out = _compiled(fn, [y])
    ref = y.double().var(-1)
    assert _relerr(out, ref) <= 3 * max(_relerr(fn(y), ref), 2**-24)


_DETERMINISM = textwrap.dedent("""
    import json, sys, torch, autofusion
    profile = sys.argv[1]
    import torch.nn.functional as F
    g = torch.Generator().manual_seed(5)
    x = torch.randn(3, 200003, generator=g) * 100 + 7
    x[1, 150001] = float("nan")
    out = {}
    fns = {"sum": lambda x: x.sum(-1), "full sum": lambda x: x.sum(), "amax": lambda x: x.amax(-1),
           "amin": lambda x: x.amin(), "var": lambda x: x.var(-1),
           "softmax": lambda x: torch.softmax(x, -1)[:, ::9973],
           "layer_norm": lambda x: F.layer_norm(x, x.shape[-1:])[:, ::9973]}
    for name, fn in fns.items():
        cm = autofusion.compile(fn, [x], target=profile)
        assert "build_error" not in cm.stats and cm.stats["fused_kernels"] >= 1
        tiles = [s.tile.split_rows for s in cm.last.program.plan.kernels if s.kernel.accumulators]
        r = cm(x)
        out[name] = [tiles, r.double().flatten().tolist(), fn(x).double().flatten().tolist()]
    json.dump(out, sys.stdout)
""")


def _unmeasured_cpu_profile(tmp_path) -> str:
    """The cpu profile with its YAML defaults and nothing measured: whether rows are split follows
    the measured bandwidth, which a loaded machine gets high or low (CI planned these rows whole)."""
    text = (Path(autofusion.__file__).parent / "hw" / "profiles" / "cpu.yaml").read_text()
    path = tmp_path / "cpu_defaults.yaml"
    path.write_text(text.split("\nmeasured:")[0] + "\n")
    return str(path)


def test_split_rows_give_the_same_bits_for_any_thread_count(tmp_path) -> None:
    """Rows shared by threads combine their blocks in block order: 1, 2 or 3 threads, the same result."""
    results = []
    profile = _unmeasured_cpu_profile(tmp_path)
    for threads in (1, 2, 3):
        env = dict(os.environ, OMP_NUM_THREADS=str(threads))
        argv = [sys.executable, "-c", _DETERMINISM, profile]
        proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
        results.append(json.loads(proc.stdout))
    for name, (tiles, ours, eager) in results[0].items():
        assert all(tiles), f"{name}: the reduction was not split across threads"
        for other in results[1:]:
            assert json.dumps(other[name][1]) == json.dumps(ours), f"{name} depends on the thread count"
        o, e = torch.tensor(ours), torch.tensor(eager)
        torch.testing.assert_close(o, e, rtol=1e-5, atol=1e-5, equal_nan=True)


# ---- every reduction kind at large odd sizes ----------------------------------------------------

KINDS = {
    "sum": lambda x: x.sum(-1),
    "mean": lambda x: x.mean(-1),
    "amax": lambda x: x.amax(-1),
    "amin": lambda x: x.amin(-1),
    "max.dim values": lambda x: x.max(-1).values,
    "var": lambda x: x.var(-1),
    "std": lambda x: x.std(-1),
    "softmax": lambda x: torch.softmax(x, -1),
    "log_softmax": lambda x: torch.log_softmax(x, -1),
    "layer_norm": lambda x: F.layer_norm(x, x.shape[-1:]),
    "rms_norm": lambda x: F.rms_norm(x, x.shape[-1:]),
    "x - mean": lambda x: x - x.mean(-1, keepdim=True),
    "sum of squares": lambda x: (x * x).sum(-1),
    "full sum": lambda x: (x * 0.5).sum(),
    "full amax": lambda x: (x + 1).amax(),
}
SHAPES = {"1000003": (1000003,), "3x100003": (3, 100003), "40x20011": (40, 20011), "20011x7": (20011, 7)}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("kind", KINDS)
def test_reduction_kinds_at_large_odd_sizes(kind: str, shape: str, dtype: str) -> None:
    g = torch.Generator().manual_seed(6)
    x = (torch.randn(SHAPES[shape], generator=g) * 3 + 1).to(DTYPES[dtype])
    fn = KINDS[kind]
    _, out = _compiled(fn, [x])
    _assert_as_accurate_as_eager(fn, x, out)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", ["1000003", "3x100003", "40x20011"])
def test_prod_at_large_odd_sizes(shape: str, dtype: str) -> None:
    # Mostly ones, with a few 2s and 0.5s: every partial product is exact, so the result is too.
    g = torch.Generator().manual_seed(7)
    x = torch.ones(SHAPES[shape])
    flat = x.view(-1)
    pos = torch.randperm(flat.numel(), generator=g)
    flat[pos[:12]] = 2.0  # 2^12 at most in any partial product: within fp16
    flat[pos[12:18]] = 0.5
    flat[pos[18:19]] = -1.0
    x = x.to(DTYPES[dtype])
    for fn in (lambda x: x.prod(-1), lambda x: (x * 1).prod()):
        _, out = _compiled(fn, [x])
        assert torch.equal(out, fn(x))


# ---- special values inside long rows --------------------------------------------------------------

SPECIAL_KINDS = {k: KINDS[k] for k in ("sum", "mean", "amax", "amin", "softmax", "var", "full sum",
                                        "full amax")}  # fmt: skip


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("where", ["first", "middle", "tail"])
@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "inf and -inf"])
@pytest.mark.parametrize("shape", ["1000003", "3x100003", "40x20011"])
def test_special_values_inside_rows(shape: str, value: str, where: str, dtype: str) -> None:
    g = torch.Generator().manual_seed(8)
    x = torch.randn(SHAPES[shape], generator=g)
    n = x.shape[-1]
    col = {"first": 0, "middle": n // 2 + 1, "tail": n - 1}[where]
    row = x.view(-1, n)[-1]  # the last row (rows before it stay finite)
    if value == "inf and -inf":
        row[col] = float("inf")
        row[(col + 7) % n] = float("-inf")
    else:
        row[col] = float(value)
    x = x.to(DTYPES[dtype])
    tol = {"fp32": 1e-4, "fp16": 1e-2, "bf16": 4e-2}[dtype]
    for name, fn in SPECIAL_KINDS.items():
        _, out = _compiled(fn, [x])
        torch.testing.assert_close(out, fn(x), rtol=tol, atol=tol, equal_nan=True, msg=name)


@pytest.mark.parametrize("shape", ["1000003", "3x100003", "40x20011"])
def test_signed_zeros_and_subnormals(shape: str) -> None:
    zeros = torch.full(SHAPES[shape], -0.0)
    for fn in (lambda x: x.sum(-1), lambda x: x.amax(-1), lambda x: x.amin(-1), lambda x: x.prod(-1)):
        _, out = _compiled(fn, [zeros])
        ref = fn(zeros)
        assert torch.equal(out, ref) and torch.equal(torch.signbit(out), torch.signbit(ref))
    # fp32 subnormals: no flush to zero, and the sum is as exact as eager's (here: exact).
    tiny = torch.full(SHAPES[shape], 2.0**-140)
    for fn in (lambda x: x.sum(-1), lambda x: x.mean(-1), lambda x: x.amax(-1)):
        _, out = _compiled(fn, [tiny])
        ref = fn(tiny)
        assert (out > 0).all()
        torch.testing.assert_close(out, ref, rtol=1e-6, atol=0)


@pytest.mark.parametrize("dtype", DTYPES)
def test_values_near_overflow(dtype: str) -> None:
    dt = DTYPES[dtype]
    top = torch.finfo(dt).max
    # Rows of one sign, so a sum overflows in every order or in none: all top, all -top, top and 0.
    # fp16 sums fit fp32 and overflow only when rounded to fp16; means do not overflow.
    x = torch.full((3, 40009), top, dtype=dt)
    x[1] = -top
    x[2, ::2] = 0
    for fn in (lambda x: x.mean(-1), lambda x: x.amax(-1), lambda x: x.sum(-1), lambda x: x[:, :2].sum(-1)):
        _, out = _compiled(fn, [x])
        ref = fn(x)
        assert torch.equal(torch.isinf(out), torch.isinf(ref)), (out, ref)
        torch.testing.assert_close(out, ref, equal_nan=True)


# ---- layouts ------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", ["transposed", "strided slice", "broadcast", "transposed full"])
def test_non_contiguous_inputs(layout: str, dtype: str) -> None:
    g = torch.Generator().manual_seed(9)
    base = torch.randn(1201, 997, generator=g).to(DTYPES[dtype])
    if layout == "transposed":
        x, fn = base.t(), lambda x: x.sum(-1)
    elif layout == "strided slice":
        x, fn = base[:, ::3], lambda x: F.layer_norm(x, x.shape[-1:])
    elif layout == "broadcast":
        x, fn = base[:1].expand(40, 997), lambda x: x.var(-1) + x.sum(-1)
    else:
        x, fn = base.t(), lambda x: x.sum()
    assert not x.is_contiguous()
    _, out = _compiled(fn, [x])
    _assert_as_accurate_as_eager(fn, x, out)


def test_split_reduction_inside_a_superkernel() -> None:
    g = torch.Generator().manual_seed(10)
    x = torch.randn(1, 600007, generator=g)
    # A full reduction and a per-row one: two iteration spaces, two kernels, both with split rows.
    fn = lambda x: ((x - x.mean()).exp().sum() + x.amax(), torch.softmax(x * 2, -1))  # noqa: E731
    cm = autofusion.compile(fn, [x], super_kernel="on")
    with torch.no_grad():
        out = cm(x)
    assert "build_error" not in cm.stats and cm.stats["fused_kernels"] >= 2
    assert cm.last.program.super_plan is not None
    assert all(t.split_rows for t in _reduction_tiles(cm))
    for o, r in zip(out, fn(x), strict=True):
        torch.testing.assert_close(o, r, rtol=1e-5, atol=1e-7)


# ---- edge cases found by PyTorch's OpInfo samples ------------------------------------------------


@pytest.mark.parametrize("fusion", [True, False])
def test_zero_dim_reductions_and_index_select(fusion: bool) -> None:
    z = torch.tensor(2.5)
    for fn in (lambda z: z.mean(0), lambda z: z.mean(-1), lambda z: z.sum(0) * 2,
               lambda z: z.var(0, correction=0), lambda z: z.amax(-1), lambda z: z.prod(0),
               lambda z: torch.index_select(z, 0, torch.tensor([0])) + 1):  # fmt: skip
        cm = autofusion.compile(fn, [z], fusion=fusion)
        with torch.no_grad():
            torch.testing.assert_close(cm(z), fn(z), rtol=0, atol=0)


@pytest.mark.parametrize("fusion", [True, False])
def test_max_min_with_dim_on_bool(fusion: bool) -> None:
    b = torch.rand(5, 7, generator=torch.Generator().manual_seed(11)) > 0.5
    for fn in (lambda b: b.max(1), lambda b: b.min(0), lambda b: torch.max(b, -1, keepdim=True)):
        cm = autofusion.compile(fn, [b], fusion=fusion)
        with torch.no_grad():
            for o, r in zip(cm(b), fn(b), strict=True):
                assert torch.equal(o, r)


# ---- accuracy of long sums against eager's cascade sum ------------------------------------------


def _rows(data: str, shape: tuple[int, int], g: torch.Generator) -> torch.Tensor:
    if data == "uniform":
        return torch.rand(shape, generator=g)
    if data == "randn":
        return torch.randn(shape, generator=g)
    if data == "offset 1e4":
        return 1e4 + torch.randn(shape, generator=g)
    if data == "mixed signs 1e4":  # +-(1e4 + u): large terms of both signs
        sign = torch.where(torch.rand(shape, generator=g) < 0.5, -1.0, 1.0)
        return sign * (1e4 + torch.rand(shape, generator=g))
    # cancelling: pairs x, -x + noise (x ~ 1e3) in random order, so the sum is far below its terms
    rows, n = shape
    x = torch.randn(rows, n // 2, generator=g) * 1e3
    y = torch.cat([x, -x + torch.randn(rows, n // 2, generator=g), torch.randn(rows, n % 2, generator=g)], -1)
    return y[:, torch.randperm(n, generator=g)].contiguous()


SUM_DATA = ["uniform", "randn", "offset 1e4", "mixed signs 1e4", "cancelling"]
# Enough rows that the summed error is a stable statistic (with 8 rows of 10^6 it varies 0.3-1.4x
# between seeds); every block of a row is reduced alike, so 10^5 elements stand for longer rows too.
LONG = {"4096x810": (4096, 810), "4096x1000": (4096, 1000), "256x10000": (256, 10000),
        "32x100000": (32, 100000)}  # fmt: skip


@pytest.mark.parametrize("data", SUM_DATA)
@pytest.mark.parametrize("shape", LONG)
@pytest.mark.parametrize("kind", ["sum", "mean"])
def test_long_sums_are_as_accurate_as_eager(kind: str, shape: str, data: str) -> None:
    """Over many rows, the error vs float64 is at most eager's (x1.15 for the noise of a finite sample;
    measured 0.4-1.0x). One vector accumulator per block of 4096, its lanes then added in turn, lost
    1.3-2.9x eager's on all but the one-signed large rows."""
    g = torch.Generator().manual_seed(12)
    x = _rows(data, LONG[shape], g)
    fn = (lambda x: x.sum(-1)) if kind == "sum" else (lambda x: x.mean(-1))
    _, out = _compiled(fn, [x])
    ref = fn(x.double())
    ours, eager = float((out.double() - ref).abs().sum()), float((fn(x).double() - ref).abs().sum())
    assert ours <= 1.15 * eager, f"summed error {ours:.4g}, eager's {eager:.4g} ({ours / eager:.2f}x)"


def test_sum_of_matmul_outputs_then_exp_is_as_accurate_as_eager() -> None:
    """benchmarks/stress.py --seed 13, program 1685: exp(min(2s, s)) with s the sum of 810 matmul outputs
    that cancel (s = 12.7 from terms summing to 1235 in magnitude); exp multiplies the error of s by 3e5.
    The compiled result was 3.05x eager's error vs float64 (the stress check allows 3x)."""

    def f(x0, x1):
        v1 = torch.where(x0 > x0, x0, x0 * 0.5) @ x1
        v3 = torch.minimum(v1, v1).sum()
        return torch.exp(torch.minimum(v3 + v3, v3))

    for call in (0, 1):
        gen = torch.Generator().manual_seed(13 * 7919 + 1685 * 2 + call)
        x0, x1 = torch.randn(10, 27, 16, generator=gen), torch.randn(16, 3, generator=gen)
        _, out = _compiled(f, [x0, x1], in_kernels=False)
        ref = f(x0.double(), x1.double())
        # the stress check's bound (the sum alone, over many rows of 810: test_long_sums_are_as_accurate...)
        assert abs(float(out) - float(ref)) <= 3 * abs(float(f(x0, x1)) - float(ref))


@pytest.mark.parametrize("data", ["randn", "offset 1e4", "mixed signs 1e4"])
def test_long_row_variance_is_close_to_eager(data: str) -> None:
    """Over many rows of 10^4, the variance's error vs float64 is within 2.5x eager's (measured 1.3-2.2x;
    one vector accumulator per block gave 2.1-6.0x). What is left is the rounding of the fp32 totals
    and of the arithmetic after them, not the accumulation."""
    g = torch.Generator().manual_seed(13)
    x = _rows(data, (512, 10000), g)
    fn = lambda x: x.var(-1)  # noqa: E731
    _, out = _compiled(fn, [x])
    ref = fn(x.double())
    ours, eager = float((out.double() - ref).abs().sum()), float((fn(x).double() - ref).abs().sum())
    assert ours <= 2.5 * eager, f"summed error {ours:.4g}, eager's {eager:.4g} ({ours / eager:.2f}x)"


@pytest.mark.parametrize("n", [64, 65, 130, 1030])
def test_every_position_of_a_row_reaches_max_min_and_nan(n: int) -> None:
    """Row r holds its extreme (or its NaN) at position r mod n: every accumulator lane, the last
    partial group and rows of exactly one group of lanes must carry it to the result."""
    g = torch.Generator().manual_seed(14)
    x = torch.randn(n, n, generator=g)
    idx = torch.arange(n)
    hi, lo, nan = x.clone(), x.clone(), x.clone()
    hi[idx, idx], lo[idx, idx], nan[idx, idx] = 100.0, -100.0, float("nan")
    for inp, fns in ((hi, [lambda x: x.amax(-1), lambda x: x.max(-1).values]), (lo, [lambda x: x.amin(-1)]),
                     (nan, [lambda x: x.amax(-1), lambda x: x.amin(-1), lambda x: x.sum(-1)])):  # fmt: skip
        for fn in fns:
            _, out = _compiled(fn, [inp])
            torch.testing.assert_close(out, fn(inp), rtol=0, atol=0, equal_nan=True)
            assert out.isnan().all() if inp is nan else out.isfinite().all()


@pytest.mark.parametrize("dtype", DTYPES)
def test_float_max_and_min_of_long_rows_run_in_lanes(dtype: str) -> None:
    """A float max or min over rows longer than one group of lanes keeps one accumulator (and NaN flag)
    per lane, as float sums do (for speed: one vector accumulator is a chain of dependent max
    instructions); the result is eager's, NaN, +-inf and every element position of a group, of the
    16-wide tail and of the scalar tail included."""
    g = torch.Generator().manual_seed(16)
    n = 64 * 5 + 16 + 5
    x = torch.randn(n, n, generator=g).to(DTYPES[dtype])
    idx = torch.arange(n)
    x[idx, idx] = 50.0
    x[idx[::7], (idx[::7] * 3) % n] = float("inf")
    x[idx[::11], (idx[::11] * 5) % n] = -float("inf")
    x[idx[::13], (idx[::13] * 2 + 1) % n] = float("nan")
    for fn, flag in ((lambda x: x.amax(-1), True), (lambda x: x.amin(-1), True),
                     (lambda x: torch.softmax(x, -1), False)):  # fmt: skip
        cm, out = _compiled(fn, [x])
        src = cm.last.program.source
        assert re.search(r"acc\d+_l\[af_j\] = v\d+ [<>] acc\d+_l\[af_j\]", src), (
            "the max/min did not run in lanes"
        )
        # softmax's max keeps no NaN flag: a NaN in a row makes its sum, hence every output, NaN anyway
        assert ("_n[af_j]" in src) == flag
        torch.testing.assert_close(out, fn(x), rtol=1e-5 if out.dtype == torch.float32 else 1e-2, atol=1e-7,
                                   equal_nan=True)  # fmt: skip
    short = x[:, :128].contiguous()  # two groups of lanes: the fold would cost more than the lanes save
    cm, out = _compiled(lambda x: x.amax(-1), [short])
    assert "_n[af_j]" not in cm.last.program.source
    torch.testing.assert_close(out, short.amax(-1), rtol=0, atol=0, equal_nan=True)


def test_integer_and_bool_reductions_of_long_rows_are_exact() -> None:
    g = torch.Generator().manual_seed(15)
    a = torch.randint(-1000, 1000, (3, 20011), generator=g)
    fns = {"sum": lambda a: (a * 3).sum(-1), "amax": lambda a: (a + 1).amax(-1),
           "amin": lambda a: (a - 1).amin(-1), "int32 sum": lambda a: (a.to(torch.int32) * 2).sum(-1),
           "any": lambda a: (a > 998).any(-1), "all": lambda a: (a > -1000).all(-1),
           "prod": lambda a: torch.where(a > 990, 3, 1).prod(-1)}  # fmt: skip
    for name, fn in fns.items():
        _, out = _compiled(fn, [a], in_kernels=False)
        assert torch.equal(out, fn(a)), name


# ---- short rows: lanes sized to the row, one item per row -----------------------------------------


@pytest.mark.parametrize(("block", "lanes"), [(65, 16), (96, 16), (256, 16), (257, 32), (512, 32),
                                              (513, 64), (768, 64), (1024, 64)])  # fmt: skip
def test_short_rows_take_the_fewest_lanes_that_keep_sixteen_additions_each(block: int, lanes: int) -> None:
    from autofusion.codegen.cpp.render import _row_lanes
    from autofusion.kernel.tile import Tile

    tile = Tile()
    assert _row_lanes(tile, block) == lanes
    assert -(-block // lanes) <= tile.reduce_block // tile.reduce_lanes


def _row_layer_norm(c: int):
    w = torch.linspace(0.5, 1.5, c)
    b = torch.linspace(-0.3, 0.3, c)
    return lambda x: F.layer_norm(x, (c,), w.to(x.dtype), b.to(x.dtype), 1e-6)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("c", [96, 97, 130, 384, 768])
def test_layer_norm_over_short_channel_rows(c: int, dtype: str) -> None:
    """ConvNeXt's layer norm over the channels of NHWC activations (96..768 channels, thousands of
    rows, above the parallel threshold): the rows run in LANES-sized lane groups (no 64-lane fold for a
    row of 96) and, being one item each, keep their totals in float; the result is as accurate as
    eager's (the kernel that ran is the one whose source is checked)."""
    g = torch.Generator().manual_seed(21)
    x = (torch.randn(2, 17, 19, c, generator=g) * 3 + 1).to(DTYPES[dtype])
    fn = _row_layer_norm(c)
    cm, out = _compiled(fn, [x])
    src = cm.last.program.source
    lanes = 16 if c <= 256 else 32 if c <= 512 else 64
    assert re.search(rf"float acc\d+_l\[{lanes}\];", src), f"rows of {c} did not run in {lanes} lanes"
    assert not re.search(r"double acc\d+_t", src), "a one-item row kept a double total"
    _assert_as_accurate_as_eager(fn, x, out, ulps=8)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
@pytest.mark.parametrize("col", [0, 50, 95, 96])
def test_special_values_in_short_rows(col: int, value: str, dtype: str) -> None:
    """A special value at a lane group's first element, inside one, in the last group and in the scalar
    tail (97 = 6 groups of 16 + 1) reaches its row's sums, max and layer norm as in eager."""
    g = torch.Generator().manual_seed(22)
    x = torch.randn(400, 97, generator=g)
    x[7, col] = float(value)
    x[399, (col + 3) % 97] = float(value)
    x = x.to(DTYPES[dtype])
    tol = {"fp32": 1e-5, "fp16": 1e-2, "bf16": 4e-2}[dtype]
    for fn in (_row_layer_norm(97), lambda x: x.sum(-1), lambda x: torch.var_mean(x, -1)[0]):
        _, out = _compiled(fn, [x])
        torch.testing.assert_close(out, fn(x), rtol=tol, atol=tol, equal_nan=True)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", ["channel slice", "row stride"])
def test_short_rows_of_non_contiguous_inputs(layout: str, dtype: str) -> None:
    g = torch.Generator().manual_seed(23)
    base = (torch.randn(3000, 200, generator=g) + 5).to(DTYPES[dtype])
    x = base[:, 3:100] if layout == "channel slice" else base[::2, :96]
    assert not x.is_contiguous()
    fn = _row_layer_norm(x.shape[-1])
    cm, out = _compiled(fn, [x])
    assert re.search(r"float acc\d+_l\[16\];", cm.last.program.source)
    _assert_as_accurate_as_eager(fn, x, out, ulps=8)
