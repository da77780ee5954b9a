"""Elementwise kernels that change layout (read across their inner loop a buffer contiguous along the
last outer one) run their rows with that outer index fastest over short blocks (render._transposed):
the same values as eager, for odd sizes, in parallel and not, with the row order the source shows;
small ones (in cache either way) keep the block-fastest order."""

from __future__ import annotations

import re

import pytest
import torch

import autofusion

SWAPPED = re.compile(r"const int64_t blk = \(r / sz\d+\) % sz\d+;")


def _run(fn, *xs: torch.Tensor) -> tuple[torch.Tensor, str]:
    cm = autofusion.compile(fn, list(xs))
    with torch.no_grad():
        out = cm(*xs)
    assert "build_error" not in cm.stats, cm.stats
    assert cm.stats["generated_calls"] >= 1, "no generated kernel ran"
    return out, cm.last.program.source


def _scale(x: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    # x channels-last in memory, NCHW result: EfficientNet's squeeze-excite product after a
    # channels-last convolution.
    return (x * torch.sigmoid(s)).contiguous()


@pytest.mark.parametrize("shape", [(1, 37, 113, 71), (2, 96, 61, 67)], ids=["one-image", "parallel"])
def test_channels_last_scaled_into_nchw(shape: tuple[int, ...]) -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(shape, generator=g).contiguous(memory_format=torch.channels_last)
    s = torch.randn(shape[0], shape[1], 1, 1, generator=g)
    out, src = _run(_scale, x, s)
    torch.testing.assert_close(out, _scale(x, s), rtol=1e-6, atol=1e-6)
    assert out.is_contiguous()
    assert SWAPPED.search(src), "the transposing kernel kept the block-fastest row order"


def test_transpose_of_a_3d_tensor() -> None:
    x = torch.randn(3, 451, 293, generator=torch.Generator().manual_seed(1))
    out, src = _run(lambda t: (t.transpose(1, 2) * 2.0 + 1.0).contiguous(), x)
    torch.testing.assert_close(out, (x.transpose(1, 2) * 2.0 + 1.0).contiguous())
    assert SWAPPED.search(src)


def test_small_transposes_keep_the_block_fastest_order() -> None:
    x = torch.randn(3, 45, 29, generator=torch.Generator().manual_seed(3))  # in cache either way
    out, src = _run(lambda t: (t.transpose(1, 2) * 2.0 + 1.0).contiguous(), x)
    torch.testing.assert_close(out, (x.transpose(1, 2) * 2.0 + 1.0).contiguous())
    assert not SWAPPED.search(src)


def test_contiguous_kernels_keep_the_block_fastest_order() -> None:
    x = torch.randn(5, 377, 233, generator=torch.Generator().manual_seed(2))
    out, src = _run(lambda t: torch.tanh(t) * t + 1.0, x)
    torch.testing.assert_close(out, torch.tanh(x) * x + 1.0)
    assert not SWAPPED.search(src)
