"""Each built-in model through the frontend: golden IR text, and results equal to eager both ways."""

from __future__ import annotations

import pytest
import torch

import autofusion
from autofusion.ir import print_graph
from autofusion.tools.models.builtins import BUILTIN_NAMES


def _rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out.float() - ref.float()).abs().max() / ref.float().abs().max().clamp_min(1e-30))


@pytest.mark.parametrize("name", BUILTIN_NAMES)
def test_golden_ir(name: str, golden) -> None:
    model, inputs = autofusion.builtin(name)
    cm = autofusion.compile(model, inputs)
    golden(f"frontend/{name}.txt", print_graph(cm.graph))
    assert cm.stats["extern_calls"] == 0


@pytest.mark.parametrize(
    "dtype,tol",
    [(torch.float32, 1e-5), (torch.float16, 1e-2), (torch.bfloat16, 2e-2)],
    ids=["fp32", "fp16", "bf16"],
)
@pytest.mark.parametrize("name", BUILTIN_NAMES)
def test_builtin_equals_eager_both_ways(name: str, dtype: torch.dtype, tol: float, eager_reference) -> None:
    model, inputs = autofusion.builtin(name, dtype=dtype)
    with torch.no_grad():
        ref = eager_reference(model, inputs)
        out = autofusion.compile(model, inputs)(*inputs)
        torch._dynamo.reset()
        out_tc = torch.compile(model, backend="autofusion")(*inputs)
    for got in (out, out_tc):
        assert got.dtype == ref.dtype and got.shape == ref.shape
        assert _rel_err(got, ref) <= tol
