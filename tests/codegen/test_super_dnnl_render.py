"""How an entry calls its oneDNN convolutions (codegen/cpp/superkernel.py): through the glue's execute
in F[1], with the handle the runtime put in F at the index P names, never inside one of the entry's own
`omp parallel` regions (oneDNN opens its own), returning at once when the call fails; the handle
indices the renderer writes are the ones the executor fills (plan/superkernel.dnnl_handles)."""

from __future__ import annotations

import re

import pytest
import torch
from torch import nn

import autofusion
from autofusion.codegen.cpp import dnnl_conv
from autofusion.plan.superkernel import DNNL_FIRST_HANDLE, dnnl_handles

pytestmark = pytest.mark.skipif(isinstance(dnnl_conv.find_install(), str), reason="oneDNN is not installed")


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Conv2d(3, 8, 3, padding=1)
        self.b = nn.Conv2d(8, 8, 3, padding=1, groups=8)
        self.c = nn.Conv2d(8, 8, 1)
        self.d = nn.Conv2d(8, 4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.a(x))
        z = torch.relu(self.b(y))
        z = torch.relu(self.c(z) + y)
        return self.d(z) * 0.5  # a generated kernel after the chain


def _entries(source: str) -> list[list[str]]:
    out: list[list[str]] = []
    for line in source.splitlines():
        if line.startswith('extern "C" void af_super_'):
            out.append([])
        elif out and not line.startswith("}"):
            out[-1].append(line)
    return out


def test_the_entry_calls_oneDNN_between_its_parallel_regions() -> None:
    torch.manual_seed(0)
    m = Net().eval()
    x = torch.randn(2, 3, 10, 9)
    with torch.no_grad():
        cm = autofusion.compile(m, (x,), conv_layout="dnnl", super_kernel="on")
        torch.testing.assert_close(cm(x), m(x), rtol=1e-4, atol=1e-4)
    prog = cm.last.program
    handles = dnnl_handles(prog.super_plan)
    assert len(handles) >= 2
    assert sorted(handles.values()) == list(range(DNNL_FIRST_HANDLE, DNNL_FIRST_HANDLE + len(handles)))
    calls = 0
    for body in _entries(prog.source):
        depth, in_region = 0, None  # brace depth, and the depth at which the open region started
        pending = False
        for line in body:
            s = line.strip()
            if s.startswith("#pragma omp parallel"):
                pending = True
                continue
            if "af_dnnl_conv(" in s:
                assert in_region is None, f"oneDNN called inside an omp parallel region: {s}"
                assert re.search(r"F\[1\], F\[P\[\d+\]\]", s) and s.endswith("return;"), s
                calls += 1
            for ch in s:
                if ch == "{":
                    depth += 1
                    if pending:
                        in_region, pending = depth, False
                elif ch == "}":
                    if in_region == depth:
                        in_region = None
                    depth -= 1
    # Each member is called once in the parallel branch and once in the serial one (P[0] == 0).
    assert calls == 2 * len(handles)
    # The P entries the calls read hold the F indices the executor fills.
    ex = prog.executor
    ex = getattr(ex, "inner", ex)
    assert [int(v) for v in ex.dnnl.fptrs[DNNL_FIRST_HANDLE:]] and all(ex.dnnl.fptrs[DNNL_FIRST_HANDLE:])
    params = [p for e in ex.entries for p in e.params]
    assert set(handles.values()) <= set(params)
