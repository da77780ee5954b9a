"""Row buffers kept in the output row (kernel/row_alias.py): softmax's exp(x - max) and layer_norm's x - mean
are stored where the result goes instead of in a per-thread scratch row; and max accumulators no output can
observe drop their NaN flag (kernel/nan_flags.py). The results must be those of the scratch row and the
flagged max bit for bit (checked by rendering the same kernels with both switched off) and eager's within
tolerance, for fp32 and the half types (which keep the scratch row), odd row lengths, -inf rows, NaN,
infinities and large values; and the kernels must have run."""

from __future__ import annotations

import re

import pytest
import torch

import autofusion
from autofusion.codegen.cpp import render

WIDTHS = [1, 7, 17, 63, 64, 65, 128, 129, 255, 256, 1000, 1024, 1025, 3001]


def _compiled(fn, x: torch.Tensor) -> tuple[torch.Tensor, str]:
    cm = autofusion.compile(fn, [x])
    with torch.no_grad():
        out = cm(x)
    assert "build_error" not in cm.stats, cm.stats
    assert cm.stats["generated_calls"] >= 1, "no generated kernel ran"
    return out, cm.last.program.source


def _rows(rows: int, width: int, dtype: torch.dtype, special: str) -> torch.Tensor:
    g = torch.Generator().manual_seed(width)
    x = torch.randn(rows, width, generator=g) * 4
    if special == "large":
        x = x * 1e37 / 4
    elif special == "neg_inf_rows":
        x[1::3] = -float("inf")
        x[::5, 0] = -float("inf")
    elif special == "nan":
        x[2, width // 2] = float("nan")
    elif special == "inf":
        x[3, width - 1] = float("inf")
    return x.to(dtype)


def _without_alias(monkeypatch: pytest.MonkeyPatch, fn, x: torch.Tensor) -> tuple[torch.Tensor, str]:
    with monkeypatch.context() as m:
        m.setattr(render, "alias_output_rows", lambda k: k)
        m.setattr(render, "drop_nan_flags", lambda k: k)
        return _compiled(fn, x)


NAN_FLAG = re.compile(r"\bacc\d+_b_nan\b")  # the flag of an item's max


KINDS = {
    "softmax": lambda x: torch.softmax(x, -1),
    "log_softmax": lambda x: torch.log_softmax(x, -1),
    "layer_norm": lambda x: torch.nn.functional.layer_norm(x, x.shape[-1:]),
}


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("special", ["plain", "large", "neg_inf_rows", "nan", "inf"])
def test_fp32_softmax_in_the_output_row_is_bit_identical(width: int, special: str, monkeypatch) -> None:
    x = _rows(37, width, torch.float32, special)
    fn = KINDS["softmax"]
    out, src = _compiled(fn, x)
    ref, src_ref = _without_alias(monkeypatch, fn, x)
    assert torch.equal(out.isnan(), ref.isnan())
    assert torch.equal(out.nan_to_num(), ref.nan_to_num()), "the move changed bits"
    torch.testing.assert_close(out, fn(x), rtol=2e-6, atol=1e-7, equal_nan=True)
    if width > 1:  # a one-element row carries nothing (and its exp is a kernel's output)
        assert "std::malloc" in src_ref and "std::malloc" not in src, "the scratch row was not moved"
        assert NAN_FLAG.search(src_ref) and not NAN_FLAG.search(src), "softmax's max kept its NaN flag"


@pytest.mark.parametrize("kind", ["log_softmax", "layer_norm"])
@pytest.mark.parametrize("width", [65, 1024, 1025])
def test_other_carried_rows_are_bit_identical(kind: str, width: int, monkeypatch) -> None:
    x = _rows(33, width, torch.float32, "plain")
    fn = KINDS[kind]
    out, _ = _compiled(fn, x)
    ref, _ = _without_alias(monkeypatch, fn, x)
    assert torch.equal(out, ref)
    torch.testing.assert_close(out, fn(x), rtol=1e-5, atol=1e-5)


# (function, whether its max may drop the NaN flag): only where every output is NaN for a row with a NaN
OBSERVED = {
    "log_softmax": (lambda x: torch.log_softmax(x, -1), True),
    "softmax_plus_max": (lambda x: torch.softmax(x, -1) + x.amax(-1, keepdim=True), True),
    "max": (lambda x: x.amax(-1), False),
    "shifted": (lambda x: x - x.amax(-1, keepdim=True), False),
    "softmax_and_max": (lambda x: (torch.softmax(x, -1), x.amax(-1)), False),
    "relu_shift": (lambda x: torch.relu(x - x.amax(-1, keepdim=True) + 1.0).sum(-1), False),
    "max_of_scaled": (lambda x: torch.softmax(x * 0.5, -1), True),
}


@pytest.mark.parametrize("name", list(OBSERVED))
@pytest.mark.parametrize("width", [17, 300, 1025])
def test_nan_flag_dropped_only_where_no_output_sees_it(name: str, width: int, monkeypatch) -> None:
    fn, blind = OBSERVED[name]
    x = _rows(23, width, torch.float32, "nan")
    x[5, 3] = float("inf")
    x[7] = -float("inf")
    out, src = _compiled(fn, x)
    ref, src_ref = _without_alias(monkeypatch, fn, x)
    outs, refs = (out, ref) if isinstance(out, tuple) else ((out,), (ref,))
    for o, r, e in zip(outs, refs, fn(x) if isinstance(out, tuple) else (fn(x),), strict=True):
        assert torch.equal(o.isnan(), r.isnan()) and torch.equal(o.nan_to_num(), r.nan_to_num())
        torch.testing.assert_close(o, e, rtol=1e-5, atol=1e-6, equal_nan=True)
    assert NAN_FLAG.search(src_ref)
    assert (not NAN_FLAG.search(src)) == blind


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("width", [17, 128, 1025])
@pytest.mark.parametrize("special", ["plain", "neg_inf_rows", "nan"])
def test_half_softmax_keeps_its_scratch_row(
    dtype: torch.dtype, width: int, special: str, monkeypatch
) -> None:
    x = _rows(29, width, dtype, special)
    fn = KINDS["softmax"]
    out, src = _compiled(fn, x)
    assert "std::malloc" in src, "a half output cannot hold the float scratch row"
    ref_bits, src_ref = _without_alias(monkeypatch, fn, x)
    assert torch.equal(out.isnan(), ref_bits.isnan())
    assert torch.equal(out.nan_to_num(), ref_bits.nan_to_num()), "dropping the NaN flag changed bits"
    assert NAN_FLAG.search(src_ref) and not NAN_FLAG.search(src), "the half softmax's max kept its NaN flag"
    ref = fn(x)
    tol = {torch.float16: 1e-3, torch.bfloat16: 8e-3}[dtype]
    torch.testing.assert_close(out.float(), ref.float(), rtol=tol, atol=tol, equal_nan=True)


def test_parallel_rows_and_a_second_output(monkeypatch) -> None:
    # 4M elements: over the parallel threshold; the second output (the exp itself) is another buffer.
    x = _rows(4096, 1024, torch.float32, "plain")

    def fn(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.softmax(t, -1), torch.softmax(t, -1) * 2.0

    cm = autofusion.compile(fn, [x])
    with torch.no_grad():
        a, b = cm(x)
    assert cm.stats["generated_calls"] >= 1
    torch.testing.assert_close(a, torch.softmax(x, -1), rtol=2e-6, atol=1e-8)
    torch.testing.assert_close(b, torch.softmax(x, -1) * 2.0, rtol=2e-6, atol=1e-8)
    with monkeypatch.context() as m:
        m.setattr(render, "alias_output_rows", lambda k: k)
        cm2 = autofusion.compile(fn, [x])
        with torch.no_grad():
            a2, b2 = cm2(x)
    assert torch.equal(a, a2) and torch.equal(b, b2)
