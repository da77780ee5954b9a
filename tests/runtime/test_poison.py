"""Poison mode (`AUTOFUSION_POISON=1`, `Options.poison`): every buffer generated code writes is filled
with a value no correct kernel leaves behind before each run, so an element a kernel forgets to write
shows in the result instead of silently keeping what the buffer held before (often the right value
from the previous call, which is why such bugs pass tests).

The bug is planted: the compiled kernel (or SuperKernel entry) is wrapped so that it leaves the last
element of a buffer as it found it, which is what a kernel with a wrong tail loop does.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import Any

import pytest
import torch

import autofusion
from autofusion.config import Options
from autofusion.runtime.buffers import poison_, sentinel
from autofusion.runtime.executor import PlanExecutor
from autofusion.runtime.super_executor import SuperExecutor

RULES_OFF = {"builtin_rules": False}


def test_the_option_and_its_environment_variable() -> None:
    assert Options.from_env({}).poison is False
    assert Options.from_env({"AUTOFUSION_POISON": "1"}).poison is True
    assert Options.from_env({"AUTOFUSION_POISON": "0"}).poison is False
    assert Options.from_env({"AUTOFUSION_POISON": "1"}, poison=False).poison is False  # keywords win
    with pytest.raises(ValueError, match="AUTOFUSION_POISON"):
        Options.from_env({"AUTOFUSION_POISON": "maybe"})


DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int8, torch.uint8, torch.int32,
          torch.int64, torch.bool]  # fmt: skip


@pytest.mark.parametrize("dtype", DTYPES)
def test_sentinels(dtype: torch.dtype) -> None:
    t = poison_(torch.zeros(5, dtype=dtype))
    if dtype.is_floating_point:
        assert t.isnan().all()
    elif dtype == torch.bool:
        assert t.all()
    else:
        assert (t == sentinel(dtype)).all() and sentinel(dtype) != 0
        assert t.view(torch.uint8).eq(0x5A).all()


Entry = Callable[..., Any]


def _skip_tail(real: Entry, out_ptr: Callable[[tuple[Any, ...]], int], n: int) -> Entry:
    """`real`, except that the float32 element n-1 of the buffer at `out_ptr(args)` is left unwritten."""

    def fn(*args: Any) -> None:
        cell = ctypes.c_float.from_address(out_ptr(args) + (n - 1) * 4)
        before = cell.value
        real(*args)
        cell.value = before

    return fn


def _plant_per_kernel(cm: Any, kernel: int, n: int) -> None:
    """Kernel number `kernel` of the per-kernel executor skips the tail of its first output."""
    ex = cm.compiled.program.executor
    assert isinstance(ex, PlanExecutor)
    k = [i for i, instr in enumerate(ex._program) if instr[0] == "kernel"][kernel]
    instr = list(ex._program[k])
    n_in = len(instr[2])
    instr[1] = _skip_tail(instr[1], lambda args: args[0][n_in], n)
    ex._program[k] = tuple(instr)


def _replace_entry(cm: Any, make: Callable[[Any, Any], Callable[..., Any]]) -> None:
    """The (only) SuperKernel entry of `cm` replaced by `make(call, real entry)`."""
    ex = cm.compiled.program.executor
    assert isinstance(ex, SuperExecutor)
    (call,) = [item for kind, item, _ in ex._program if kind == "super"]
    call.fn = make(call, call.fn)
    # The fast path and the compiled model's call hold the entry point: rebuild both.
    ex._fast = ex._fast_path()
    cm.compiled.call = cm.compiled._make_call()
    cm._hot = None


def _plant_super(cm: Any, n: int) -> None:
    """The (only) SuperKernel entry skips the tail of its first pooled output."""

    def make(call: Any, real: Callable[..., Any]) -> Callable[..., Any]:
        slot = call.pooled[0][0]
        return _skip_tail(real, lambda args: call.slots[slot], n)

    _replace_entry(cm, make)


def _run_planted(fn, inputs, plant, poison: bool, **options: Any) -> tuple[torch.Tensor, torch.Tensor]:
    with torch.no_grad():
        cm = autofusion.compile(fn, inputs, poison=poison, **RULES_OFF, **options)
        ref = fn(*inputs)
        torch.testing.assert_close(cm(*inputs), ref)  # correct before the bug is planted; dropped
        plant(cm)
        out = cm(*inputs)
    assert "build_error" not in cm.stats and cm.stats["generated_calls"] >= 2
    return out, ref


N = 257  # an odd size, so a vector loop has a scalar tail


@pytest.mark.parametrize("poison", [False, True])
def test_unwritten_output_element_per_kernel(poison: bool) -> None:
    fn = lambda x: (x * 2 + 1).exp()  # noqa: E731
    out, ref = _run_planted(fn, (torch.randn(N),), lambda cm: _plant_per_kernel(cm, 0, N), poison,
                            super_kernel="off")  # fmt: skip
    if poison:  # the element the kernel skipped is NaN: the comparison fails loudly
        assert out[-1].isnan() and not out[:-1].isnan().any()
    else:  # the reused output buffer still holds the previous call's value: the bug is invisible
        torch.testing.assert_close(out, ref)


@pytest.mark.parametrize("poison", [False, True])
def test_unwritten_scratch_element_per_kernel(poison: bool) -> None:
    """The skipped element is in an intermediate (a reused scratch buffer) the next kernel reads."""
    fn = lambda x, w: ((x * 2).tanh() @ w).relu() + 1  # noqa: E731
    x, w = torch.randn(N, 8), torch.randn(8, 4)
    plant = lambda cm: _plant_per_kernel(cm, 0, N * 8)  # noqa: E731
    out, ref = _run_planted(fn, (x, w), plant, poison, super_kernel="off")
    if poison:
        assert out[-1].isnan().all() and not out[:-1].isnan().any()
    else:
        torch.testing.assert_close(out, ref)


@pytest.mark.parametrize("poison", [False, True])
def test_unwritten_output_element_super_kernel(poison: bool) -> None:
    fn = lambda x: (x * 2 + 1).exp().sigmoid() - x.abs().mean()  # noqa: E731
    out, ref = _run_planted(fn, (torch.randn(N),), lambda cm: _plant_super(cm, N), poison, super_kernel="on")
    if poison:
        assert out[-1].isnan() and not out[:-1].isnan().any()
    else:
        torch.testing.assert_close(out, ref)


def _three(x: torch.Tensor) -> torch.Tensor:
    """Three kernels (reshapes of computed dims split them); two intermediates live in the arena."""
    a = (x * 1.5).tanh().sin()
    b = (a - a.mean(-1, keepdim=True)).exp().reshape(x.shape[0] // 2, -1)
    return (b / b.amax(-1, keepdim=True)).sigmoid().reshape(-1)


def test_arena_and_outputs_are_poisoned_before_each_entry_call() -> None:
    x = torch.randn(16, 33)
    seen: list[bool] = []
    with torch.no_grad():
        cm = autofusion.compile(_three, (x,), poison=True, super_kernel="on", **RULES_OFF)
        ex = cm.compiled.program.executor
        assert ex._arena_views, "the plan should keep intermediates in the arena"

        def make(call: Any, real: Callable[..., Any]) -> Callable[..., Any]:
            def checking(*args: Any) -> None:
                slots = set(call.slots)
                outs = [p for _, _, pool in call.pooled for p in pool.items if p.data_ptr() in slots]
                arena = all(v.isnan().all() for v in ex._arena_views)
                seen.append(arena and bool(outs) and all(o.isnan().all() for o in outs))
                real(*args)

            return checking

        _replace_entry(cm, make)
        for _ in range(2):  # the second call reuses the first call's (dropped) output buffer
            torch.testing.assert_close(cm(x), _three(x))
    assert seen == [True, True]


def test_environment_switches_it_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AUTOFUSION_POISON", "1")
    x = torch.randn(N)
    cm = autofusion.compile(lambda x: x.exp() + 1, (x,), **RULES_OFF)
    assert cm.compiled.program.executor.poison
    torch.testing.assert_close(cm(x), x.exp() + 1)
