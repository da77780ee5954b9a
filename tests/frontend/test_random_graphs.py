"""Property: random elementwise/broadcast/reduce/view programs compile to IR and match eager exactly."""

from __future__ import annotations

from collections.abc import Callable

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import autofusion

UNARY: list[Callable[[torch.Tensor], torch.Tensor]] = [
    torch.neg, torch.abs, torch.exp, torch.tanh, torch.sigmoid, torch.relu, torch.sin,
    lambda t: torch.sqrt(t.abs()), lambda t: t.clamp(-0.5, 0.5), torch.nn.functional.gelu,
]  # fmt: skip
BINARY: list[Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = [
    torch.add, torch.sub, torch.mul, torch.maximum, torch.minimum,
    lambda a, b: torch.where(a > b, a, b * 0.5),
]  # fmt: skip
REDUCE: list[Callable[[torch.Tensor], torch.Tensor]] = [
    lambda t: t.sum(-1, keepdim=True), lambda t: t.amax(0, keepdim=True), lambda t: t.mean(-1, keepdim=True),
    lambda t: torch.softmax(t, -1),
]  # fmt: skip


@st.composite
def programs(draw: st.DrawFn) -> tuple[list[tuple[str, int, int, int]], tuple[int, int]]:
    shape = (draw(st.integers(1, 5)), draw(st.integers(1, 9)))
    steps = []
    for k in range(draw(st.integers(1, 8))):
        kind = draw(st.sampled_from(["unary", "binary", "reduce", "transpose2"]))
        n_values = 2 + k  # two inputs, then one value per step
        a, b = draw(st.integers(0, n_values - 1)), draw(st.integers(0, n_values - 1))
        fn = draw(st.integers(0, 100))
        steps.append((kind, a, b, fn))
    return steps, shape


def build(steps: list[tuple[str, int, int, int]]) -> Callable[..., torch.Tensor]:
    def program(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        vals = [x, y]
        for kind, a, b, fn in steps:
            if kind == "unary":
                vals.append(UNARY[fn % len(UNARY)](vals[a]))
            elif kind == "binary":
                vals.append(BINARY[fn % len(BINARY)](vals[a], vals[b]))  # broadcasts reduced values back
            elif kind == "reduce":
                vals.append(REDUCE[fn % len(REDUCE)](vals[a]))
            else:
                vals.append(vals[a].t().contiguous().t() + 1.0)
        return vals[-1]

    return program


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs())
def test_random_programs_match_eager(prog: tuple[list[tuple[str, int, int, int]], tuple[int, int]]) -> None:
    steps, shape = prog
    fn = build(steps)
    x, y = torch.randn(shape), torch.randn(shape)
    ref = fn(x, y)
    cm = autofusion.compile(fn, (x, y))
    torch.testing.assert_close(cm(x, y), ref, rtol=1e-6, atol=1e-6)
    assert cm.stats["extern_calls"] == 0
    assert "build_error" not in cm.stats
    assert cm.stats["kernel_steps"] == 0 or cm.stats["generated_calls"] >= 1, "no generated kernel ran"
