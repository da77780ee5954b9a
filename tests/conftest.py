"""Shared test options: `--update-golden` rewrites golden files instead of comparing with them.

Shared fixtures: `golden` (compare text with tests/golden/*), `compile_both_ways` (one function
through autofusion.compile and the torch.compile backend, checked against eager) and
`generated_code_ran` (the check both use: the build worked and generated code executed).

Every test plans against one fixed host profile (`pinned_cpu_profile`, autouse): the measured `cpu`
profile (hw/measure.py, cached per machine) depends on the machine and on its load when it was
measured, and the plans (fusion groups, GEMM epilogues, tiles) depend on it: a test asserting a plan's
shape must not pass on one machine and fail on another, or after a cache measured under a parallel
run. Tests of the measurement itself are marked `measured_hardware` and measure.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from torch.utils import _pytree as pytree

import autofusion
from autofusion.backend import autofusion_backend
from autofusion.hw import calibration as hw_calibration
from autofusion.hw import measure as hw_measure

GOLDEN_DIR = Path(__file__).parent / "golden"

# pytest-xdist gives its workers COLUMNS=80 (the controller's terminal size, 80 without one), which the
# CLI's consoles then wrap at; a serial run has no COLUMNS and no terminal (output is captured), so the
# CLI tests expect unwrapped lines. Workers run as a serial run does.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.pop("COLUMNS", None)
    os.environ.pop("LINES", None)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--update-golden", action="store_true", help="rewrite tests/golden/* from current output"
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "no_kernel(reason): the case's graph legitimately has no generated kernel (library calls "
        "or views only); compile_both_ways then checks that it has none",
    )
    config.addinivalue_line(
        "markers",
        "measured_hardware: the test measures the host cpu or reads a stored calibration (hw/measure.py, "
        "hw/calibration.py); without it every test plans against PINNED_CPU_MEASUREMENT",
    )


# ---- one host profile for every test (see the module docstring) ----

# The 2-core AVX-512 development VM, measured quiet (its L2 is 1 MiB per core): the machine the plans
# the tests document were first worked out on.
PINNED_CPU_MEASUREMENT: dict[str, int | float] = {
    "cores": 2, "memory_bandwidth": 1.6e10, "dispatch_overhead_s": 1.0e-6, "on_chip_bytes": 1 << 20,
    "l1_bytes": 48 << 10, "l2_bytes": 1 << 20, "l3_bytes": 32 << 20, "vector_bytes": 32,
    "vector_registers": 32,
}  # fmt: skip


@pytest.fixture(autouse=True)
def pinned_cpu_profile(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> dict | None:
    """load_profile("cpu", cache_dir=...) reads PINNED_CPU_MEASUREMENT (returned) instead of this
    machine's cached measurement, and no stored calibration (`autofusion calibrate`) is laid over it;
    tests marked `measured_hardware` see the real ones (and get None)."""
    if request.node.get_closest_marker("measured_hardware") is not None:
        return None
    monkeypatch.setattr(hw_measure, "cached_cpu_measurement", lambda cache: dict(PINNED_CPU_MEASUREMENT))
    monkeypatch.setattr(hw_calibration, "cached_calibration", lambda cache: {})
    return dict(PINNED_CPU_MEASUREMENT)


@pytest.fixture(autouse=True)
def pinned_linear_post_op(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """The `linear_post_op` pass's measurement (runtime/linear_post_op.py) finds the fused call slower at
    every shape, so plans do not depend on this machine's timings; tests of the fused call force it
    (linear_route="onednn") or patch `measure` themselves, and `measured_hardware` tests measure."""
    if request.node.get_closest_marker("measured_hardware") is not None:
        return
    from autofusion.runtime import linear_post_op

    slower = {"fused": 2e-3, "packed_then_gelu": 1e-3, "plain_then_gelu": 1e-3, "plain_alone": 1e-3}
    monkeypatch.setattr(linear_post_op, "measure", lambda m, k, n, dtype, act: dict(slower))


@pytest.fixture
def golden(request: pytest.FixtureRequest):
    """golden(relpath, text): compare `text` with tests/golden/relpath (or rewrite it with
    --update-golden)."""
    update = request.config.getoption("--update-golden")

    def check(relpath: str, text: str) -> None:
        path = GOLDEN_DIR / relpath
        if update:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            return
        assert path.exists(), f"missing golden file {path}; run pytest --update-golden to create it"
        expected = path.read_text()
        assert text == expected, (
            f"{relpath} differs from the golden file (pytest --update-golden rewrites it)"
        )

    return check


@pytest.fixture(name="eager_reference")
def eager_reference_fixture():
    return eager_reference


def eager_reference(fn, inputs):
    """The eager result from a second call. Eager CPU kernels are not bitwise reproducible between the
    first call in a process and later ones: tanh/sigmoid over 1M elements was seen to differ by 5.2e-5
    relative on the first call (eager against eager), which is torch's doing, not ours."""
    fn(*inputs)
    return fn(*inputs)


# ---- proof that generated code ran (not the reference runtime after a failed build) ----


def assert_generated_code_ran(stats: dict, where: str, expect_kernel: bool | None = None) -> None:
    """`stats` (a compiled object's .stats, after a call) show no eager fallback, a build without
    error and, when the plan has kernel steps, calls into generated code.

    expect_kernel: True, the plan must have a kernel; False, the graph legitimately has none (a lone
    view, a matmul) and must have none, so that expectation is checked too; None, either."""
    assert "eager_fallback" not in stats, f"{where}: ran eagerly: {stats['eager_fallback']}"
    assert not stats.get("build_error"), f"{where}: the kernels did not build: {stats['build_error']}"
    steps = stats.get("kernel_steps", 0)
    if expect_kernel is False:
        assert steps == 0, f"{where}: expected no generated kernel, the plan has {steps}"
    elif expect_kernel:
        assert steps >= 1, f"{where}: the plan has no generated kernel"
    if steps:
        ran = stats.get("generated_calls", 0)
        assert ran >= 1, f"{where}: {steps} kernel step(s) but no generated code ran"


@pytest.fixture
def generated_code_ran():
    return assert_generated_code_ran


# ---- one function through autofusion.compile and the torch.compile backend (op-catalogue tests) ----


def _assert_matches(got, ref, rtol: float, atol: float, path: str) -> None:
    got_leaves, got_spec = pytree.tree_flatten(got)
    ref_leaves, ref_spec = pytree.tree_flatten(ref)
    assert got_spec == ref_spec, f"{path}: output structure {got_spec} != eager {ref_spec}"
    for k, (g, r) in enumerate(zip(got_leaves, ref_leaves, strict=True)):
        where = f"{path}, output {k}"
        if not isinstance(r, torch.Tensor):
            assert g == r, f"{where}: {g!r} != eager {r!r}"
            continue
        assert isinstance(g, torch.Tensor), f"{where}: got {type(g).__name__}, eager gives a tensor"
        assert (g.dtype, g.shape) == (r.dtype, r.shape), (
            f"{where}: {g.dtype}{list(g.shape)} != eager {r.dtype}{list(r.shape)}"
        )
        if r.dtype.is_floating_point:
            torch.testing.assert_close(
                g, r, rtol=rtol, atol=atol, equal_nan=True, msg=lambda m, where=where: f"{where}: {m}"
            )
        else:
            assert torch.equal(g, r), f"{where}: {g} != eager {r}"


@pytest.fixture
def compile_both_ways(request: pytest.FixtureRequest):
    """compile_both_ways(fn, inputs, rtol=, atol=, expect_kernel=True) -> the autofusion CompiledModel.

    Runs `fn` eagerly, through `autofusion.compile` and through `torch.compile` with the autofusion
    backend (fullgraph, static shapes), all under no_grad, and checks both results against eager:
    float outputs with assert_close(rtol, atol), int and bool outputs exactly, dtypes and shapes always.
    Every captured graph must be pure IR: no extern ATen call, no eager fallback, and its generated
    kernels must have built and run (`assert_generated_code_ran`). A graph that legitimately has no
    kernel says so: a `no_kernel(reason)` mark on the test case, or `expect_kernel=False`."""
    marked = request.node.get_closest_marker("no_kernel") is not None

    def run(fn, inputs, *, rtol: float = 1e-5, atol: float = 1e-6, expect_kernel: bool | None = None):
        expect_kernel = not marked if expect_kernel is None else expect_kernel
        inputs = tuple(inputs)
        graphs: list = []

        def recording_backend(gm, example_inputs):
            compiled = autofusion_backend(gm, example_inputs)
            graphs.append(getattr(compiled, "autofusion_graph", None))
            return compiled

        with torch.no_grad():
            ref = eager_reference(fn, inputs)
            cm = autofusion.compile(fn, inputs)
            out = cm(*inputs)
            torch._dynamo.reset()
            out_tc = torch.compile(fn, backend=recording_backend, fullgraph=True, dynamic=False)(*inputs)
        _assert_matches(out, ref, rtol, atol, "autofusion.compile")
        _assert_matches(out_tc, ref, rtol, atol, "torch.compile(backend=autofusion)")
        assert "eager_fallback" not in cm.stats, cm.stats["eager_fallback"]
        assert graphs and all(g is not None for g in graphs), "the torch.compile backend ran eagerly"
        assert cm.stats["extern_calls"] == 0, f"fell back: {cm.stats['fallbacks']}\n{cm.graph}"
        assert_generated_code_ran(cm.stats, "autofusion.compile", expect_kernel)
        for g in graphs:
            stats = g.stats()
            assert stats["extern_calls"] == 0, f"backend fell back: {stats['fallbacks']}\n{g.graph}"
            assert_generated_code_ran(stats, "torch.compile(backend=autofusion)", expect_kernel)
        return cm

    return run


def _call_recorder(seen: list, calls: list | None = None):
    """A Dynamo backend: compiles each graph with autofusion's backend, appends the compiled function to
    `seen`, and (when `calls` is given) returns a wrapper that appends the arguments of each call to it."""

    def backend(gm, example_inputs):
        fn = autofusion_backend(gm, example_inputs)
        seen.append(fn)
        if calls is None:
            return fn

        def record(*args):
            calls.append(args)
            return fn(*args)

        return record

    return backend


@pytest.fixture
def call_recorder():
    """call_recorder(seen[, calls]) -> a torch.compile backend recording graphs (and call arguments)."""
    return _call_recorder
