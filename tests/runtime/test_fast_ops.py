"""The executor's fast path for op steps (runtime/fast_ops.py): library calls and convolutions run with
their target and argument positions fixed at load time, give the values the reference runtime gives,
and an error still names the node."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import autofusion
from autofusion.errors import ExecutionError
from autofusion.ir.interpret import run_node
from autofusion.runtime.executor import PlanExecutor
from autofusion.runtime.fast_ops import fast_call


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.c1, self.b1 = nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8)
        self.c2 = nn.Conv2d(8, 6, 3, stride=2, groups=2)  # no BN: a plain conv node

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = torch.relu(self.b1(self.c1(x)))
        z = self.c2(y)
        return z, nn.functional.max_pool2d(y, 2, return_indices=True)[1]  # a two-output extern


def _compiled(x: torch.Tensor):
    torch.manual_seed(0)
    model = Net().eval()
    with torch.no_grad():
        model.b1.running_var.uniform_(0.5, 1.5)
        cm = autofusion.compile(model, (x,))
    return model, cm


@pytest.mark.parametrize("batch", [1, 3])
def test_fast_op_steps_equal_eager(batch: int) -> None:
    x = torch.randn(batch, 3, 11, 9)
    model, cm = _compiled(x)
    program = cm.compiled.program  # type: ignore[union-attr]
    ex = program.executor
    assert isinstance(ex, PlanExecutor)
    kinds = {instr[2].name if instr[0] == "call" else instr[1].name: instr[0] for instr in ex._program
             if instr[0] in ("call", "node")}  # fmt: skip
    graph = program.plan.graph
    conv = [n.name for n in graph.nodes if n.op == "conv" or "conv_bn_act" in str(n.attr("target"))]
    assert len(conv) == 2 and all(kinds[c] == "call" for c in conv), kinds  # the fast path runs them
    two = [n.name for n in graph.nodes if len(n.outputs) > 1]
    assert two and all(kinds[n] == "node" for n in two)  # several outputs: the general path
    with torch.no_grad():
        for got, ref in zip(cm(x), model(x), strict=True):
            torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-5)


def test_a_fast_call_that_fails_names_its_node() -> None:
    x = torch.randn(1, 3, 8, 8)
    _, cm = _compiled(x)
    graph = cm.compiled.program.plan.graph  # type: ignore[union-attr]
    types = graph.value_types()
    for node in graph.nodes:
        if node.op == "conv" or "conv_bn_act" in str(node.attr("target")):
            call = fast_call(node, graph, types)
            assert call is not None
            bad = [torch.randn(1, 5, 8, 8)] + [torch.randn(1)] * (len(node.inputs) - 1)
            with pytest.raises(ExecutionError, match=node.name):
                call(bad)
            with pytest.raises(ExecutionError, match=node.name):
                run_node(node, bad, graph)
