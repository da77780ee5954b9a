"""Graph outputs are owned by the caller: a later call never changes a result already returned.

The executors reuse memory across calls (per-kernel scratch buffers, the SuperKernel arena). An
output that is a view of such memory (through a view op, an extern ATen op, or directly) used to be
overwritten by the next call: `torch.diagonal(torch.tanh(x) * 2 + 1)` returned a view of the
kernel's scratch buffer in the per-kernel executor.
"""

from __future__ import annotations

import pytest
import torch

import autofusion
import autofusion.plan.superkernel
import autofusion.runtime.executor

MODES = ["off", "on"]  # super_kernel: the per-kernel executor, the SuperKernel executor


def _leaves(out) -> list[torch.Tensor]:
    return list(out) if isinstance(out, (tuple, list)) else [out]


CASES = {
    # an extern (no converter for diagonal) returning a view of a kernel's intermediate
    "diagonal of a kernel result": (lambda x: torch.diagonal(torch.tanh(x) * 2 + 1), (64, 64)),
    "views of one intermediate": (lambda x: ((x.exp() + 1).t(), (x.exp() + 1)[1:, ::2]), (16, 24)),
    "the same value twice": (lambda x: ((y := x.sigmoid() * 3), y), (8, 8)),
    "outputs aliasing each other": (lambda x: ((y := x.cos() - 1), y.reshape(-1), y[0]), (6, 10)),
    "an input and a view of it": (lambda x: (x, x.t(), x * 2), (5, 7)),
    "a diagonal of an intermediate behind a matmul": (
        lambda x: (torch.diagonal((x.relu() + 1) @ x), torch.diagonal(x.abs() + 2)),
        (32, 32),
    ),
}


def _check_owned(fn, shape, mode: str) -> autofusion.CompiledModel:
    torch.manual_seed(0)
    x, x2 = torch.randn(shape), torch.randn(shape)
    with torch.no_grad():
        cm = autofusion.compile(fn, [x], super_kernel=mode)
        first = _leaves(cm(x))
        kept = [t.clone() for t in first]
        second = _leaves(cm(x2))
        for k, (a, b) in enumerate(zip(first, kept, strict=True)):
            assert torch.equal(a, b), f"output {k} changed when the model was called again"
        for k, (a, r) in enumerate(zip(first, _leaves(fn(x)), strict=True)):
            torch.testing.assert_close(a, r, msg=f"output {k} (first call)")
        for k, (a, r) in enumerate(zip(second, _leaves(fn(x2)), strict=True)):
            torch.testing.assert_close(a, r, msg=f"output {k} (second call)")
    assert "build_error" not in cm.stats and cm.stats["generated_calls"] >= 2
    assert (type(cm.compiled.program.executor).__name__ == "SuperExecutor") == (mode == "on")
    return cm


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", list(CASES))
def test_results_survive_the_next_call(name: str, mode: str) -> None:
    fn, shape = CASES[name]
    _check_owned(fn, shape, mode)


def test_large_diagonal_regression() -> None:
    """The reported case: 1024x1024, default options."""
    f = lambda x: torch.diagonal(torch.tanh(x) * 2 + 1)  # noqa: E731
    x, x2 = torch.randn(1024, 1024), torch.randn(1024, 1024)
    cm = autofusion.compile(f, [x])
    r1 = cm(x)
    keep = r1.clone()
    cm(x2)
    assert torch.equal(r1, keep)
    assert cm.stats["generated_calls"] >= 2


@pytest.mark.parametrize("mode", MODES)
def test_an_alias_the_planner_misses_is_still_copied(mode: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """With the alias analysis switched off, the end-of-run check (`buffers.owned`) must still hand the
    caller storage of its own: an op the planner cannot see into may return a view of any input."""
    monkeypatch.setattr(autofusion.runtime.executor, "alias_roots", lambda steps: {})
    monkeypatch.setattr(autofusion.plan.superkernel, "alias_roots", lambda steps: {})
    fn, shape = CASES["diagonal of a kernel result"]
    cm = _check_owned(fn, shape, mode)
    ex = cm.compiled.program.executor
    out = cm(torch.randn(shape))
    assert out.untyped_storage().data_ptr() not in ex._internal


_CLOSED_OVER = torch.tensor([1.0, 2.0, 3.0])
CONSTANT_CASES = {
    "a constant the passes folded": lambda x: (x + 1, torch.arange(3.0) * 2),
    "a constant computed from a closed-over tensor": lambda x: (x + 1, _CLOSED_OVER * 2),
    "a view of a folded constant": lambda x: (x + 1, (torch.arange(6.0) * 2).reshape(2, 3).t()),
}


@pytest.mark.parametrize("mode", ["off", "on", "reference runtime"])
@pytest.mark.parametrize("name", list(CONSTANT_CASES))
def test_changing_a_result_in_place_does_not_change_later_results(name: str, mode: str) -> None:
    """A constant output was the same tensor on every call: `out.add_(1)` changed every later result."""
    fn = CONSTANT_CASES[name]
    x = torch.randn(3)
    options = {"fusion": False} if mode == "reference runtime" else {"super_kernel": mode}
    cm = autofusion.compile(fn, [x], **options)
    first = cm(x)[1]
    first.add_(100.0)
    torch.testing.assert_close(cm(x)[1], fn(x)[1])
    if mode != "reference runtime":
        assert "build_error" not in cm.stats and cm.stats["generated_calls"] >= 2
