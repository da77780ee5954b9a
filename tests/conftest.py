"""Shared test options: `--update-golden` rewrites golden files instead of comparing with them.

Shared fixtures: `golden` (compare text with tests/golden/*) and `compile_both_ways` (one function
through autofusion.compile and the torch.compile backend, checked against eager).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch.utils import _pytree as pytree

import autofusion
from autofusion.backend import autofusion_backend

GOLDEN_DIR = Path(__file__).parent / "golden"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--update-golden", action="store_true", help="rewrite tests/golden/* from current output")


@pytest.fixture
def golden(request: pytest.FixtureRequest):
    """golden(relpath, text): compare `text` with tests/golden/relpath (or rewrite it with --update-golden)."""
    update = request.config.getoption("--update-golden")

    def check(relpath: str, text: str) -> None:
        path = GOLDEN_DIR / relpath
        if update:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            return
        assert path.exists(), f"missing golden file {path}; run pytest --update-golden to create it"
        expected = path.read_text()
        assert text == expected, f"{relpath} differs from the golden file (pytest --update-golden rewrites it)"

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
def compile_both_ways():
    """compile_both_ways(fn, inputs, rtol=, atol=) -> the autofusion CompiledModel.

    Runs `fn` eagerly, through `autofusion.compile` and through `torch.compile` with the autofusion
    backend (fullgraph, static shapes), all under no_grad, and checks both results against eager:
    float outputs with assert_close(rtol, atol), int and bool outputs exactly, dtypes and shapes always.
    Every captured graph must be pure IR: no extern ATen call, no eager fallback."""

    def run(fn, inputs, *, rtol: float = 1e-5, atol: float = 1e-6):
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
        for g in graphs:
            stats = g.stats()
            assert stats["extern_calls"] == 0, f"backend fell back: {stats['fallbacks']}\n{g.graph}"
        return cm

    return run
