"""Reductions over non-trailing dims (leading, middle, several) in generated kernels, against eager.

Every test compiles with the C++ backend and checks that the reductions ran inside generated kernels
(no torch call left) and, where the input is contiguous along a kept dim, that the kernel ran as
columns (kernel/tile.py) - so a passing test is the generated kernel's result, not the fallback's.
Sizes straddle the 32,768-element parallel threshold with odd tails (column blocks not a multiple of
the vector width), outputs are small enough for the threads to split the reduced dim, rows hold NaN
and infinities, inputs are non-contiguous, in fp32, fp16 and bf16, and poison mode fills outputs with
NaN first.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import autofusion
from autofusion.plan.schedule import KernelStep, OpStep

REDUCE_OPS = ("sum", "amax", "amin", "prod")
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def _compiled(fn, inputs, *, columns: bool | None = True, split: bool | None = None, **options):
    """Compile and run `fn`; every reduction must be in a generated kernel. `columns`/`split`: every
    reducing kernel must (True) or must not (False) run as columns / share the reduced dim (None: either)."""
    cm = autofusion.compile(fn, list(inputs), **options)
    with torch.no_grad():
        out = cm(*inputs)
    stats = cm.stats
    assert "build_error" not in stats, stats.get("build_error")
    assert "eager_fallback" not in stats, stats.get("eager_fallback")
    plan = cm.last.program.plan
    left = [(s.node.op, s.reason) for s in plan.steps if isinstance(s, OpStep) and s.node.op in REDUCE_OPS]
    assert not left, f"reductions ran as torch calls: {left}"
    tiles = [s.tile for s in plan.steps if isinstance(s, KernelStep) and s.kernel.accumulators]
    assert tiles, "no kernel reduces"
    if columns is not None:
        assert all(t.columns == columns for t in tiles), [t.columns for t in tiles]
    if split is not None:
        assert all(t.split_rows == split for t in tiles), [t.split_rows for t in tiles]
    return cm, out


def _check(fn, x: torch.Tensor, out, factor: float = 3.0, ulps: float = 4.0) -> None:
    """|ours - f64| <= factor * max|eager - f64| + ulps * ulp * |f64| elementwise; NaN and infinities
    exactly where eager has them."""
    with torch.no_grad():
        eager, ref = fn(x), fn(x.double())
    for o, e, r in zip(*(t if isinstance(t, tuple) else (t,) for t in (out, eager, ref)), strict=True):
        assert o.dtype == e.dtype and o.shape == e.shape
        o, e, r = o.double(), e.double(), r.double()
        nan = torch.isnan(e)
        assert torch.equal(torch.isnan(o), nan), "NaN where eager has none, or none where eager has one"
        inf = torch.isinf(e)
        assert torch.equal(o[inf], e[inf]), "infinities differ from eager"
        keep = ~(nan | inf)
        o, e, r = o[keep], e[keep], r[keep]
        eager_err = float((e - r).abs().max()) if e.numel() else 0.0
        err = (o - r).abs()
        bound = factor * eager_err + ulps * torch.finfo(out_dtype(e, x)).eps * r.abs()
        assert bool((err <= bound).all()), f"error {float((err - bound).max()):.3g} over the bound"


def out_dtype(e: torch.Tensor, x: torch.Tensor) -> torch.dtype:
    return x.dtype if x.dtype.is_floating_point else torch.float32


KINDS = {
    "sum": lambda x, d, k: x.sum(d, keepdim=k),
    "mean": lambda x, d, k: x.mean(d, keepdim=k),
    "amax": lambda x, d, k: x.amax(d, keepdim=k),
    "amin": lambda x, d, k: x.amin(d, keepdim=k),
    "max.dim values": lambda x, d, k: x.max(d[0], keepdim=k).values,
    "prod": lambda x, d, k: (x * 0.01 + 1).prod(d[0], keepdim=k),
    "var": lambda x, d, k: x.var(d, keepdim=k),
    "std": lambda x, d, k: x.std(d, keepdim=k),
    "sum of squares": lambda x, d, k: (x * x).sum(d, keepdim=k),
    "x - mean": lambda x, d, k: x - x.mean(d, keepdim=True),
}
# (shape, dims, runs as columns): leading, middle, several (the kept dim contiguous or not)
CASES = {
    "lead": ((131, 67), (0,), True),
    "lead 3d": ((37, 129, 67), (0,), True),
    "middle": ((9, 257, 67), (1,), True),
    "lead two": ((37, 129, 67), (0, 1), True),
    "outer and inner": ((37, 129, 67), (0, 2), False),
    "lead, parallel": ((2053, 515), (0,), True),
}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("keepdim", [False, True], ids=["", "keepdim"])
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("kind", KINDS)
def test_every_kind_over_non_trailing_dims(kind: str, case: str, keepdim: bool, dtype: str) -> None:
    shape, dims, columns = CASES[case]
    if kind in ("prod", "max.dim values") and len(dims) > 1:
        pytest.skip("prod and max(dim) take one dim")
    g = torch.Generator().manual_seed(1)
    x = (torch.randn(shape, generator=g) * 3 + 1).to(DTYPES[dtype])
    fn = lambda x: KINDS[kind](x, dims, keepdim)  # noqa: E731
    _, out = _compiled(fn, [x], columns=columns)
    # prod rounds once per factor in every order; 16 ulps of its value cover a different order
    _check(fn, x, out, ulps=16.0 if kind == "prod" else 4.0)


COMPOSITES = {
    "softmax over channels": (lambda x: torch.softmax(x, 1), (4, 19, 23, 29)),
    "log_softmax over dim 0": (lambda x: torch.log_softmax(x, 0), (300, 129)),
    "batch-norm statistics": (
        lambda x: (x.mean((0, 2, 3)), x.var((0, 2, 3), unbiased=False)),
        (4, 19, 23, 29),
    ),
    "group sums": (lambda x: x.sum((0, 2)), (8, 50, 64)),
    "relu, column sum, scale": (lambda x: torch.relu(x).sum(0) * 2.0 + 1.0, (1000, 257)),
    "normalise columns": (lambda x: (x - x.mean(0)) / (x.std(0) + 1e-5), (1000, 257)),
}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", COMPOSITES)
def test_composites_fuse_into_one_kernel(name: str, dtype: str) -> None:
    """The reductions' producers and consumers join their kernel: one generated kernel, no library op."""
    fn, shape = COMPOSITES[name]
    g = torch.Generator().manual_seed(2)
    x = (torch.randn(shape, generator=g) * 2).to(DTYPES[dtype])
    cm, out = _compiled(fn, [x], columns=None)
    plan = cm.last.program.plan
    assert len(plan.kernels) == 1, [s.kernel.name for s in plan.kernels]
    compute = [
        s.node.op for s in plan.steps if isinstance(s, OpStep) and s.node.op not in ("reshape", "full")
    ]
    assert not compute, compute
    _check(fn, x, out)


def test_full_reductions_split_across_threads() -> None:
    g = torch.Generator().manual_seed(3)
    for fn, x in [
        (lambda x: x.sum(), torch.randn(1 << 20, generator=g)),
        (lambda x: x.abs().max(), torch.randn(3, 700001, generator=g)),
        (lambda x: x.mean(), torch.randn(1023, 1025, generator=g)),
    ]:
        _, out = _compiled(fn, [x], columns=False, split=True)
        _check(fn, x, out)


def test_small_output_splits_the_reduced_dim() -> None:
    """16 output columns over 2^18 + 3 elements: fewer column blocks than cores, so the threads share
    the reduced dim (on one core the split is not chosen)."""
    g = torch.Generator().manual_seed(4)
    x = torch.randn((1 << 18) + 3, 16, generator=g) + 5
    for fn in (lambda x: x.sum(0), lambda x: x.amax(0), lambda x: x.var(0), lambda x: x - x.mean(0)):
        _, out = _compiled(fn, [x], columns=True, split=len(os.sched_getaffinity(0)) > 1)
        _check(fn, x, out)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
def test_special_values_in_columns(value: str, dtype: str) -> None:
    g = torch.Generator().manual_seed(5)
    x = torch.randn(3001, 67, generator=g)
    x[17, 3] = float(value)
    x[2999, 66] = float(value)  # in the last, partial column block and the last reduced block
    x[1500, 40] = float("nan")
    x[1501, 40] = float("inf")  # NaN and inf in one column: NaN wins everywhere
    x = x.to(DTYPES[dtype])
    for fn in (lambda x: x.amax(0), lambda x: x.amin(0), lambda x: x.sum(0),
               lambda x: x.mean(0, keepdim=True), lambda x: torch.softmax(x, 0)):  # fmt: skip
        _, out = _compiled(fn, [x])
        _check(fn, x, out)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", ["transposed", "sliced", "channels_last", "expanded"])
def test_non_contiguous_inputs(layout: str, dtype: str) -> None:
    g = torch.Generator().manual_seed(6)
    if layout == "transposed":  # contiguous along the reduced dim: rows
        x, fn, columns = torch.randn(300, 517, generator=g).t(), (lambda x: x.sum(0)), False
    elif layout == "sliced":
        x, fn, columns = torch.randn(700, 300, generator=g)[::2, 5:290], (lambda x: x.var(0)), True
    elif layout == "channels_last":  # NHWC memory: the channels are contiguous and kept
        x = torch.randn(4, 33, 17, 19, generator=g).to(memory_format=torch.channels_last)
        fn, columns = (lambda x: x.mean((0, 2, 3))), True
    else:
        x, fn, columns = torch.randn(1, 257, generator=g).expand(1000, 257), (lambda x: x.sum(0)), None
    x = x.to(DTYPES[dtype])
    _, out = _compiled(fn, [x], columns=columns)
    _check(fn, x, out)


def test_poison_mode_leaves_no_element_unwritten() -> None:
    g = torch.Generator().manual_seed(7)
    x = torch.randn(2001, 131, generator=g)
    y = torch.randn((1 << 17) + 1, 16, generator=g)
    for fn, inp in [(lambda x: x.sum(0), x), (lambda x: torch.softmax(x, 0), x), (lambda x: x - x.amax(0), x),
                    (lambda x: x.mean(0), y), (lambda x: x.sum((0, 1)), x)]:  # fmt: skip
        _, out = _compiled(fn, [inp], columns=None, poison=True)
        assert not torch.isnan(out).any()
        _check(fn, inp, out)


def _columns_of(data: str, shape: tuple[int, int], g: torch.Generator) -> torch.Tensor:
    n, cols = shape
    if data == "uniform":
        return torch.rand(shape, generator=g)
    if data == "offset 1e4":
        return 1e4 + torch.rand(shape, generator=g)
    if data == "mixed signs 1e4":
        sign = torch.where(torch.rand(shape, generator=g) < 0.5, -1.0, 1.0)
        return sign * (1e4 + torch.rand(shape, generator=g))
    x = torch.randn(n // 2, cols, generator=g) * 1e3  # cancelling pairs, in random order
    y = torch.cat([x, -x + torch.randn(n // 2, cols, generator=g), torch.randn(n % 2, cols, generator=g)], 0)
    return y[torch.randperm(n, generator=g)].contiguous()


LONG = {"810x4096": (810, 4096), "10000x256": (10000, 256), "100000x32": (100000, 32),
        "200003x64": (200003, 64)}  # fmt: skip


@pytest.mark.parametrize("data", ["uniform", "offset 1e4", "mixed signs 1e4", "cancelling"])
@pytest.mark.parametrize("shape", LONG)
def test_long_column_sums_are_as_accurate_as_eager(shape: str, data: str) -> None:
    """Summed over the columns, the error vs float64 is at most eager's (x1.15 for the noise of a finite
    sample). A column summed with one accumulator per output element (sequential adds) is not."""
    g = torch.Generator().manual_seed(8)
    x = _columns_of(data, LONG[shape], g)
    fn = lambda x: x.sum(0)  # noqa: E731
    _, out = _compiled(fn, [x])
    ref = fn(x.double())
    ours, eager = float((out.double() - ref).abs().sum()), float((fn(x).double() - ref).abs().sum())
    assert ours <= 1.15 * eager + 1e-300, (
        f"summed error {ours:.4g}, eager's {eager:.4g} ({ours / eager:.2f}x)"
    )


_DETERMINISM = textwrap.dedent("""
    import json, sys, torch, autofusion
    g = torch.Generator().manual_seed(9)
    x = torch.randn(200003, 24, generator=g) * 100 + 7
    x[150001, 5] = float("nan")
    out = {}
    fns = {"sum": lambda x: x.sum(0), "amax": lambda x: x.amax(0), "var": lambda x: x.var(0),
           "softmax": lambda x: torch.softmax(x, 0)[::9973]}
    for name, fn in fns.items():
        cm = autofusion.compile(fn, [x])
        assert "build_error" not in cm.stats and cm.stats["fused_kernels"] >= 1
        plan = cm.last.program.plan
        tiles = [(s.tile.columns, s.tile.split_rows) for s in plan.kernels if s.kernel.accumulators]
        r = cm(x)
        out[name] = [tiles, r.double().flatten().tolist(), fn(x).double().flatten().tolist()]
    json.dump(out, sys.stdout)
""")


def test_split_columns_give_the_same_bits_for_any_thread_count() -> None:
    results = []
    for threads in (1, 2, 3):
        env = dict(os.environ, OMP_NUM_THREADS=str(threads))
        proc = subprocess.run([sys.executable, "-c", _DETERMINISM], env=env, capture_output=True, text=True,
                              timeout=600)  # fmt: skip
        assert proc.returncode == 0, proc.stderr[-3000:]
        results.append(json.loads(proc.stdout))
    for name, (tiles, ours, eager) in results[0].items():
        assert all(c for c, _ in tiles), f"{name}: not run as columns"
        for other in results[1:]:
            assert json.dumps(other[name][1]) == json.dumps(ours), f"{name} depends on the thread count"
        torch.testing.assert_close(
            torch.tensor(ours), torch.tensor(eager), rtol=1e-5, atol=1e-4, equal_nan=True
        )
    if len(os.sched_getaffinity(0)) > 1:  # the profile's cores: the split is chosen for them
        assert any(s for _, s in results[0]["sum"][0]), "24 columns over 2 cores should split"


def test_a_reduction_strided_in_both_loop_orders_stays_a_torch_call_with_its_reason() -> None:
    """Contiguous along a kept dim that is not the innermost kept one: either loop order would read a
    cache line per element, so the planner refuses the kernel (NF2004) and torch reduces."""
    g = torch.Generator().manual_seed(11)
    x = torch.randn(40, 30, 20, generator=g).permute(2, 0, 1)  # strides (1, 600, 20)
    fn = lambda x: x.sum(1) * 2  # noqa: E731
    cm = autofusion.compile(fn, [x])
    with torch.no_grad():
        out = cm(x)
    torch.testing.assert_close(out, fn(x))
    (step,) = [s for s in cm.last.program.plan.steps if isinstance(s, OpStep) and s.node.op == "sum"]
    assert step.reason.startswith("[NF2004]") and "reduces dims (1,)" in step.reason, step.reason


@pytest.mark.parametrize("dtype", DTYPES)
def test_trailing_reduction_of_a_transposed_input_runs_as_columns(dtype: str) -> None:
    """x.t().sum(-1) reduces the trailing dim of a view contiguous along the kept one: columns too."""
    g = torch.Generator().manual_seed(12)
    x = (torch.randn(3001, 257, generator=g) * 2).to(DTYPES[dtype]).t()
    for fn in (lambda x: x.sum(-1), lambda x: x.var(-1), lambda x: torch.softmax(x, -1)):
        _, out = _compiled(fn, [x], columns=True)
        _check(fn, x, out)


def test_column_kernels_inside_a_superkernel() -> None:
    """Column kernels, split and not, as SuperKernel entries (their loops are orphaned worksharing)."""
    g = torch.Generator().manual_seed(13)
    x = torch.randn(3001, 131, generator=g)
    y = torch.randn(100003, 16, generator=g)
    fn = lambda x, y: (torch.softmax(x * 2, 0), (y - y.mean(0)).abs().amax(0), x.sum(0))  # noqa: E731
    cm, out = _compiled(fn, [x, y], super_kernel="on")
    assert cm.last.program.super_plan is not None
    with torch.no_grad():
        for _ in range(2):  # a second call through the same SuperKernel
            out = cm(x, y)
    for o, r in zip(out, fn(x, y), strict=True):
        torch.testing.assert_close(o, r, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", ["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("c", [96, 97])
def test_layer_norm_over_nchw_channels_hoists_the_column_invariant_shift(c: int, dtype: str) -> None:
    """ConvNeXt's layer norm over the channels of an NCHW tensor (run as columns) with a residual from
    an NHWC operand: the shift x[..., 0] and mean + shift do not depend on the channel, so they are
    computed once per column block (af_h arrays), not once per channel; results as eager's, NaN and inf
    in a row included."""
    dt = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[dtype]
    g = torch.Generator().manual_seed(31)
    r = torch.randn(2, c, 23, 29, generator=g)
    y = torch.randn(2, 23, 29, c, generator=g)
    r[0, 5, 3, 4], y[1, 2, 7, 0] = float("nan"), float("inf")
    r, y = r.to(dt), y.to(dt)
    w = torch.linspace(0.5, 1.5, c).to(dt)

    def fn(r, y):
        s = r + (w * y).permute(0, 3, 1, 2)
        return s, torch.nn.functional.layer_norm(s.permute(0, 2, 3, 1), (c,), w, None, 1e-6)

    cm = autofusion.compile(fn, [r, y])
    with torch.no_grad():
        out = cm(r, y)
    assert "eager_fallback" not in cm.stats and cm.stats["fused_kernels"] >= 1
    assert "af_hv" in cm.last.program.source, "no column-invariant value was hoisted"
    tol = {"fp32": 1e-5, "fp16": 1e-2, "bf16": 4e-2}[dtype]
    for o, e in zip(out, fn(r, y), strict=True):
        torch.testing.assert_close(o, e, rtol=tol, atol=tol, equal_nan=True)
