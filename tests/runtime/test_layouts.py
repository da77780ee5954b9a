"""Strides count only where they address elements: not on size-1 dims, not on empty tensors.

torch gives such dims arbitrary strides (a permute of a size-1 head dim keeps its old stride), so
two tensors with the same elements in the same places may differ there. A SuperKernel used to refuse
such a view (`ExecutionError: view ... has strides (..., 32, 32, 1), the SuperKernel was built for
(..., 32, 131072, 1)`), and the signature cache compiled the same graph again for it.
"""

from __future__ import annotations

import pytest
import torch

import autofusion
from autofusion.api import signature_of
from autofusion.ir.dtypes import DType
from autofusion.ir.types import TensorType, strides_match
from autofusion.runtime.buffers import to_layout


def test_strides_match_ignores_size_one_dims_and_empty_tensors() -> None:
    assert strides_match((1, 16, 8), (128, 8, 1), (999, 8, 1))
    assert strides_match((4, 1, 8), (8, 8, 1), (8, 1, 1))
    assert strides_match((0, 5), (5, 1), (1, 0))
    assert not strides_match((2, 16, 8), (128, 8, 1), (999, 8, 1))
    assert not strides_match((4, 8), (8, 1), (1, 4))


def test_to_layout_copies_instead_of_reinterpreting() -> None:
    x = torch.arange(12.0).reshape(3, 4)  # contiguous
    t = TensorType(DType.float32, (3, 4), (1, 3))  # the kernel wants a column-major layout
    y = to_layout(x, t)
    assert y.stride() == (1, 3) and torch.equal(y, x)
    same = torch.empty_strided((1, 4), (99, 1)).copy_(x[:1])
    assert to_layout(same, TensorType(DType.float32, (1, 4))) is same  # equivalent layout: no copy


def test_signature_ignores_strides_of_size_one_dims() -> None:
    a = torch.empty_strided((1, 16, 8), (128, 8, 1))
    b = torch.empty_strided((1, 16, 8), (999, 8, 1))
    assert signature_of([a]) == signature_of([b])
    assert signature_of([torch.empty(0, 5)]) == signature_of([torch.empty(5, 0).t()])
    assert signature_of([torch.empty(2, 3)]) != signature_of([torch.empty(3, 2).t()])


def _attention_scores(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    return (q @ k.transpose(-2, -1) * 0.5).softmax(-1)


@pytest.mark.parametrize("mode", ["on", "off"])
def test_a_view_whose_strides_differ_on_a_size_one_dim_runs(mode: str) -> None:
    q, k = torch.randn(1, 16, 8), torch.randn(1, 16, 8)
    k_odd = torch.empty_strided((1, 16, 8), (999, 8, 1)).copy_(k)  # same elements, odd batch stride
    with torch.no_grad():
        cm = autofusion.compile(_attention_scores, [q, k], super_kernel=mode)
        ref = _attention_scores(q, k)
        # The executor itself (as the reported model reached it): the transpose of k runs inside the
        # SuperKernel, where the view's strides used to be compared on every dim.
        out = cm.compiled.program.executor.run([q, k_odd])[0]
        torch.testing.assert_close(out, ref)
        torch.testing.assert_close(cm(q, k_odd), ref)
        torch.testing.assert_close(cm(q, k), ref)
    assert cm.stats["signatures"] == 1  # one compiled graph serves both layouts
    assert "build_error" not in cm.stats and cm.stats["generated_calls"] >= 3
    if mode == "on":
        assert cm.stats["super_kernel"]["views_inside"] >= 1, cm.stats["super_kernel"]


def test_permute_of_a_size_one_head_dim_in_a_super_kernel() -> None:
    """A one-head attention block: the head dim has size 1, so reshapes and permutes around it give
    strides that differ from the compile-time replay only there."""

    def f(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        b, n, c = x.shape
        qkv = (x * 2 + 1) @ w
        q, k, v = qkv.reshape(b, n, 3, 1, c).permute(2, 0, 3, 1, 4)
        a = (q @ k.transpose(-2, -1) * c**-0.5).softmax(-1)
        return ((a @ v).transpose(1, 2).reshape(b, n, c) + 1).relu()

    x, w = torch.randn(1, 16, 32), torch.randn(32, 96)
    x_odd = torch.empty_strided(x.shape, (7, 32, 1)).copy_(x)
    with torch.no_grad():
        cm = autofusion.compile(f, [x, w], super_kernel="on")
        for inp in (x, x_odd):
            torch.testing.assert_close(cm(inp, w), f(x, w), rtol=1e-5, atol=1e-5)
    assert cm.stats["signatures"] == 1 and cm.stats["super_kernel"]["on"]
    assert "build_error" not in cm.stats and cm.stats["generated_calls"] >= 2
