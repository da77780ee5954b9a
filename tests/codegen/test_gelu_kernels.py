"""Both GELU forms through `autofusion.compile`: the generated kernel (af_gelu / af_gelu_tanh) against float64
references over the whole range, the negative tail included, special values, half types and layouts.

tests/codegen/test_af_math.py checks the header's functions straight from g++; this checks what a model
gets: the kernel the planner emits, its fp16/bf16 staging and its parallel split. `gelu(x + b)` with b = -0.0
keeps the GELU in a generated kernel at every size (a lone large erf-GELU runs as ATen's op,
plan/schedule.LIBRARY_FASTER_ALONE) and adds nothing: x + -0.0 is x for every x, -0.0 and NaN included.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import autofusion

FLT_MIN = float(torch.finfo(torch.float32).tiny)
SUBNORMAL_UNIT = 2.0**-149
# the header's asserted bounds: relative error (subnormal results: that, or within one subnormal step)
BOUND = {"none": 6e-7, "tanh": 5e-7}
SPECIALS = [
    0.0, -0.0, math.inf, -math.inf, math.nan, 1e-45, -1e-45, 1e-40, -1e-40, FLT_MIN, -FLT_MIN, 1e-30, -1e-30,
    3e38, -3e38, 1e10, -1e10, 11.0, -11.0, 11.5, -11.5, 13.3, -13.3, 14.36, -14.36, 14.5, -14.5, 20.0, -20.0,
]  # fmt: skip


def _reference(x: torch.Tensor, approximate: str) -> torch.Tensor:
    """float64 GELU of the float32 inputs, in forms without cancellation for x < 0"""
    t = x.double()
    if approximate == "none":
        return 0.5 * t * torch.special.erfc(-t * math.sqrt(0.5))
    u = math.sqrt(2.0 / math.pi) * (t + 0.044715 * t**3)
    return t * torch.sigmoid(2.0 * u)


def _inputs(n: int) -> torch.Tensor:
    sweep = torch.linspace(-16.0, 12.0, n - len(SPECIALS), dtype=torch.float64).float()
    return torch.cat([torch.tensor(SPECIALS, dtype=torch.float32), sweep])


def _compiled(approximate: str, x: torch.Tensor) -> tuple[autofusion.CompiledModel, torch.Tensor]:
    def fn(x: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return F.gelu(x + b, approximate=approximate)

    b = torch.full(x.shape[-1:], -0.0, dtype=x.dtype)
    cm = autofusion.compile(fn, (x, b))
    with torch.no_grad():
        out = cm(x, b)
    assert "build_error" not in cm.stats
    assert cm.stats["fused_kernels"] == 1, cm.stats
    assert cm.stats["generated_calls"] >= 1, "no generated kernel ran"
    return cm, out


def _assert_within_bound(x: torch.Tensor, out: torch.Tensor, approximate: str) -> None:
    ref = _reference(x, approximate)
    y = out.double()
    assert torch.equal(torch.isnan(y), torch.isnan(ref)), x[torch.isnan(y) != torch.isnan(ref)]
    finite = ~torch.isnan(ref)
    y, ref, xs = y[finite], ref[finite], x[finite]
    same = y == ref  # infinities and exact zeros
    err = (y - ref).abs()
    # relative for every result; a subnormal one may instead be within one subnormal step (as the header says)
    rel = err / ref.abs().clamp_min(1e-300)
    bad = ~same & (rel > BOUND[approximate]) & ~((ref.abs() < FLT_MIN) & (err <= SUBNORMAL_UNIT))
    assert not bad.any(), [
        (float(a), float(b), float(c)) for a, b, c in zip(xs[bad], y[bad], ref[bad], strict=True)
    ][:8]
    zeros = (y == 0) & (ref.float() == 0)
    assert torch.equal(torch.signbit(y[zeros]), torch.signbit(ref[zeros]))


@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize("shape", [(5, 1003), (3, 40001)], ids=["17x1003-ish", "parallel 3x40001"])
def test_fp32_kernel_within_the_documented_bound(approximate: str, shape: tuple[int, int]) -> None:
    x = _inputs(shape[0] * shape[1]).reshape(shape)
    _, out = _compiled(approximate, x)
    _assert_within_bound(x.flatten(), out.flatten(), approximate)
    # and next to eager PyTorch, whose erf-GELU is only absolutely accurate (1.2e-6) and whose tanh-GELU
    # cancels for x < 0.  Beyond 1e10 they part: ATen's vectorised erf-GELU overflows (gelu(3e38) = inf,
    # gelu(+inf) = NaN, though its scalar path gives inf), ours gives the float64 result, x.
    with torch.no_grad():
        eager = F.gelu(x, approximate=approximate)
    moderate = ~(x.abs() > 1e10)
    torch.testing.assert_close(out[moderate], eager[moderate], rtol=1e-5, atol=2e-6, equal_nan=True)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_relative_accuracy_in_the_negative_tail(approximate: str) -> None:
    """Where eager's float32 result has no correct digit left, ours keeps the bound."""
    x = torch.linspace(-13.0, -4.0, 50_000, dtype=torch.float64).float().reshape(50, 1000)
    _, out = _compiled(approximate, x)
    _assert_within_bound(x.flatten(), out.flatten(), approximate)
    ref = _reference(x, approximate)
    if approximate == "none":
        assert (out != 0).all()  # normal results down to -13.1
    kept = ref.abs() >= FLT_MIN
    eager = F.gelu(x, approximate=approximate).double()
    eager_rel = ((eager - ref).abs()[kept] / ref.abs()[kept]).max().item()
    assert eager_rel > 1e-3  # a range where the form matters


def test_non_contiguous_input() -> None:
    base = _inputs(64 * 700).reshape(700, 64)
    x = base.t()
    assert not x.is_contiguous()
    for approximate in ("none", "tanh"):
        _, out = _compiled(approximate, x)
        _assert_within_bound(x.flatten(), out.flatten(), approximate)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_half_kernels_round_the_accurate_result(approximate: str, dtype: torch.dtype) -> None:
    """fp16/bf16: the kernel computes in float and rounds once, so it lands on the float64 result rounded to
    the half type or on one of its neighbours (the float result is within 6e-7 of it)."""
    x = _inputs(6 * 4001).reshape(6, 4001).clamp(-60000.0, 60000.0).to(dtype)
    _, out = _compiled(approximate, x)
    assert out.dtype == dtype
    ref = _reference(x.float(), approximate)
    assert torch.equal(torch.isnan(out), torch.isnan(ref))
    rounded = ref.to(dtype)
    ok = torch.isnan(ref) | (out == rounded)
    # one step in the half type's bit pattern (same sign), where the exact result is close to a tie
    bits = out.view(torch.int16).int(), rounded.view(torch.int16).int()
    ok |= ((bits[0] - bits[1]).abs() <= 1) & (torch.signbit(out) == torch.signbit(rounded))
    bad = ~ok
    assert not bad.any(), list(zip(x[bad].tolist(), out[bad].tolist(), rounded[bad].tolist(), strict=True))[
        :8
    ]
    with torch.no_grad():
        eager = F.gelu(x, approximate=approximate)
    torch.testing.assert_close(out.float(), eager.float(), rtol=2e-2, atol=2e-2, equal_nan=True)


def test_references_are_cancellation_free() -> None:
    """The float64 references agree with torch's float64 GELU where that one does not cancel (x > -3)."""
    x = torch.linspace(-3.0, 8.0, 10_001)
    for approximate in ("none", "tanh"):
        ref = _reference(x, approximate)
        torch_ref = F.gelu(x.double(), approximate=approximate)
        np.testing.assert_allclose(ref.numpy(), torch_ref.numpy(), rtol=1e-12, atol=1e-15)
