"""Reduction rows without an item loop (render._one_item): a row that is one block, and a max/min-only or
accumulator-free stage of any row, run their simd loops over the whole row with no `for (it ...)` around
them. The results must be the same bits as the item-loop rendering (checked by rendering the same kernels
with `_one_item` switched off) and eager's within tolerance: fp32 and the half types, odd row widths, rows
over the parallel threshold, -inf rows, NaN, non-contiguous inputs and a reduction over a non-last dim;
and the generated kernels must have run."""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest
import torch

import autofusion
from autofusion.codegen.cpp import render

ITEM_LOOP = re.compile(r"for \(int64_t it = ")

KINDS = {
    "softmax": lambda x: torch.softmax(x, -1),
    "log_softmax": lambda x: torch.log_softmax(x, -1),
    "amax_amin": lambda x: x.amax(-1) - x.amin(-1),
}
TOL = {torch.float32: 2e-6, torch.float16: 1e-3, torch.bfloat16: 8e-3}


def _compiled(fn, x: torch.Tensor, ran: Callable[..., None]) -> tuple[torch.Tensor, str]:
    """fn's compiled result on x and the unit's source; `ran` (the generated_code_ran fixture) checks
    that the generated kernel ran."""
    cm = autofusion.compile(fn, [x])
    with torch.no_grad():
        out = cm(x)
    ran(cm.stats, "row items", expect_kernel=True)
    return out, cm.last.program.source


def _rows(rows: int, width: int, dtype: torch.dtype, special: str) -> torch.Tensor:
    x = torch.randn(rows, width, generator=torch.Generator().manual_seed(width)) * 4
    if special == "neg_inf_rows":
        x[1::3] = -float("inf")
        x[::5, 0] = -float("inf")
    elif special == "nan":
        x[2, width // 2] = float("nan")
        x[4, 0] = float("inf")
    return x.to(dtype)


def _check(fn, x: torch.Tensor, monkeypatch: pytest.MonkeyPatch, ran: Callable[..., None]) -> tuple[str, str]:
    out, src = _compiled(fn, x, ran)
    with monkeypatch.context() as m:
        m.setattr(render, "_one_item", lambda n_blocks, accs: False)
        ref, src_ref = _compiled(fn, x, ran)
    assert torch.equal(out.isnan(), ref.isnan())
    assert torch.equal(out.nan_to_num(), ref.nan_to_num()), "dropping the item loop changed bits"
    tol = TOL[x.dtype]
    eager = fn(x)
    torch.testing.assert_close(out.float(), eager.float(), rtol=tol, atol=tol, equal_nan=True)
    return src, src_ref


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("width", [1, 3, 127, 129, 1000, 3001])
@pytest.mark.parametrize("special", ["plain", "neg_inf_rows", "nan"])
def test_rows_without_item_loop_are_bit_identical(
    kind: str, dtype: torch.dtype, width: int, special: str, monkeypatch, generated_code_ran
) -> None:
    src, src_ref = _check(KINDS[kind], _rows(37, width, dtype, special), monkeypatch, generated_code_ran)
    assert ITEM_LOOP.search(src_ref), "the reference rendering has no item loop"
    if width <= 1024 or kind == "amax_amin":
        assert not ITEM_LOOP.search(src), "a one-block row or a max/min-only kernel kept an item loop"
    else:
        # softmax over 3001: only the sum stage keeps its blocks (three), the max and scale passes do not
        assert len(ITEM_LOOP.findall(src)) == 1, src


@pytest.mark.parametrize("kind", ["softmax", "log_softmax"])
@pytest.mark.parametrize("shape", [(32768, 128), (16384, 256), (1024, 3072)])
def test_rows_over_the_parallel_threshold(
    kind: str, shape: tuple[int, int], monkeypatch, generated_code_ran
) -> None:
    _check(KINDS[kind], _rows(*shape, torch.float32, "nan"), monkeypatch, generated_code_ran)


@pytest.mark.parametrize("layout", ["transposed", "strided slice", "non-last dim"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_non_contiguous_and_non_last_dim(
    layout: str, dtype: torch.dtype, monkeypatch, generated_code_ran
) -> None:
    base = torch.randn(300, 1030, generator=torch.Generator().manual_seed(3)).to(dtype)
    if layout == "transposed":
        x, fn = base.t(), KINDS["softmax"]
    elif layout == "strided slice":
        x, fn = base[:, ::3], KINDS["log_softmax"]
    else:
        x, fn = base.reshape(3, 100, 1030), lambda t: torch.softmax(t, 1)
    if layout != "non-last dim":
        assert not x.is_contiguous()
    _check(fn, x, monkeypatch, generated_code_ran)
