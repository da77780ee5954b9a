"""A repeated layer's kernels are compiled once (codegen/cpp/render.render_unit: the same code under
another name calls the first), and its linears' library routes are measured once per shape
(runtime/prepack.RouteChooser); layers whose code differs share nothing, and every result matches
eager."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import autofusion
from autofusion.codegen.cpp.render import SHARED_MARK
from autofusion.runtime import prepack


class Block(torch.nn.Module):
    """A transformer layer's MLP half: linear, GELU, linear, residual add, LayerNorm."""

    def __init__(self, d: int, hidden: int, approximate: str = "tanh") -> None:
        super().__init__()
        self.fc1, self.fc2 = torch.nn.Linear(d, hidden), torch.nn.Linear(hidden, d)
        self.ln = torch.nn.LayerNorm(d)
        self.approximate = approximate

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.gelu(self.fc1(x), approximate=self.approximate)
        return self.ln(x + self.fc2(h))


class Stack(torch.nn.Module):
    def __init__(self, *blocks: torch.nn.Module) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList(blocks)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = b(x)
        return x


class Shared(torch.nn.Module):
    """ALBERT's way: one layer's weights, applied `times` times."""

    def __init__(self, block: torch.nn.Module, times: int) -> None:
        super().__init__()
        self.block, self.times = block, times

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(self.times):
            x = self.block(x)
        return x


def _compile(model: torch.nn.Module, x: torch.Tensor, generated_code_ran, **options):  # type: ignore[no-untyped-def]
    model = model.eval()
    # Linears on oneDNN's packed weight stay library calls: the generated kernels are the layers' own.
    # (linear_post_op off: forced onednn would take GELU into the library call too)
    options.setdefault("linear_route", "onednn")
    options.setdefault("disabled", frozenset({"linear_post_op"}))
    cm = autofusion.compile(model, [x], **options)
    with torch.no_grad():
        torch.testing.assert_close(cm(x), model(x), rtol=1e-5, atol=2e-5)
    generated_code_ran(cm.stats, type(model).__name__, expect_kernel=True)
    return cm.compiled.program.source


def _defined_and_shared(source: str) -> tuple[int, int]:
    """(kernels compiled from their own code, kernels that call another's)."""
    shared = source.count(SHARED_MARK)
    return source.count("static void autofused_") - shared, shared


# (8, 64, 96): 49152 elements, above the kernels' parallel threshold; (3, 7, 40): odd sizes.
@pytest.mark.parametrize("shape", [(8, 64, 96), (3, 7, 40)])
@pytest.mark.parametrize("shared_weights", [False, True])
def test_a_repeated_layer_compiles_once(shape, shared_weights, generated_code_ran) -> None:
    if not prepack.available("onednn", torch.float32):
        pytest.skip("no oneDNN packed linear in this torch build")
    torch.manual_seed(0)
    d = shape[-1]
    model = Shared(Block(d, 2 * d), 3) if shared_weights else Stack(*(Block(d, 2 * d) for _ in range(3)))
    x = torch.randn(*shape)
    one = _defined_and_shared(_compile(Block(d, 2 * d), x, generated_code_ran))
    own, shared = _defined_and_shared(_compile(model, x, generated_code_ran))
    # The three layers compile what one layer compiles; the other two layers' kernels call it.
    assert own == one[0] and one[1] == 0
    assert shared == 2 * one[0]


def test_layers_of_other_code_share_nothing(generated_code_ran) -> None:
    """erf GELU against tanh GELU: another kernel, compiled from its own code."""
    torch.manual_seed(0)
    x = torch.randn(4, 16, 48)
    tanh_only = _defined_and_shared(_compile(Block(48, 96), x, generated_code_ran))
    erf_only = _defined_and_shared(_compile(Block(48, 96, "none"), x, generated_code_ran))
    both = _defined_and_shared(_compile(Stack(Block(48, 96), Block(48, 96, "none")), x, generated_code_ran))
    assert both[0] > max(tanh_only[0], erf_only[0])


def test_layers_of_other_widths_run_with_their_own_sizes(generated_code_ran) -> None:
    """Sizes are parameters: layers of another width may share code, and each runs with its sizes."""
    torch.manual_seed(0)
    model = Stack(
        Block(40, 96), torch.nn.Linear(40, 72), Block(72, 96), torch.nn.Linear(72, 40), Block(40, 80)
    )
    _compile(model, torch.randn(5, 9, 40), generated_code_ran)
    _compile(model, torch.randn(5, 9, 40), generated_code_ran, super_kernel="off")


def test_a_repeated_layer_is_measured_once_per_shape(
    monkeypatch: pytest.MonkeyPatch, generated_code_ran, tmp_path
) -> None:
    """The route of each linear shape is timed once per compile, however many layers have it; layers of
    another shape are timed for theirs."""
    if not prepack.available("onednn", torch.float32):
        pytest.skip("no oneDNN packed linear in this torch build")
    timed: list[tuple[int, int, int]] = []

    def fake(m: int, k: int, n: int, dtype: torch.dtype) -> dict[str, float]:
        timed.append((m, k, n))
        return {"plain": 1e-3, "onednn": 5e-4}  # oneDNN's packed weight wins: the packed call runs

    monkeypatch.setattr(prepack, "measure", fake)
    torch.manual_seed(0)
    x = torch.randn(4, 32, 64)
    _compile(
        Stack(*(Block(64, 128) for _ in range(3))),
        x,
        generated_code_ran,
        freeze=True,
        linear_route="auto",
        cache_dir=tmp_path / "a",
    )
    assert sorted(timed) == [(128, 64, 128), (128, 128, 64)]
    timed.clear()
    _compile(
        Stack(Block(64, 128), Block(64, 160)),
        x,
        generated_code_ran,
        freeze=True,
        linear_route="auto",
        cache_dir=tmp_path / "b",
    )
    assert sorted(set(timed)) == sorted(timed), timed
    assert sorted(timed) == [(128, 64, 128), (128, 64, 160), (128, 128, 64), (128, 160, 64)], timed
