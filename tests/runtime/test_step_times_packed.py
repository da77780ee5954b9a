"""tools/diagnose/measure.step_times times a linear the executor runs on a prepacked weight through that
same packed call (it timed the reference runtime's plain GEMM, another library route)."""

from __future__ import annotations

import torch

import autofusion
from autofusion.plan.schedule import OpStep
from autofusion.runtime import prepack
from autofusion.tools.diagnose import measure


class _Mlp(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(24, 37)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.fc(torch.relu(x) * 2.0))


def test_packed_linears_are_timed_on_their_packed_route(monkeypatch) -> None:
    if not prepack.available("onednn", torch.float32):
        return  # a torch build without oneDNN's linear: no packed step to time
    x = torch.randn(5, 24)
    model = _Mlp().eval()
    cm = autofusion.compile(model, [x], freeze=True, linear_route="onednn")
    with torch.no_grad():
        torch.testing.assert_close(cm(x), model(x), rtol=1e-5, atol=1e-5)
    program = cm.last.program
    packed = program.executor.prepacked
    assert list(packed.values()) == ["onednn"]
    # The timed call is the executor's own (the prepacked GEMM it runs), not the reference runtime's.
    timed: list[str] = []
    real_calls = program.executor.op_calls()
    assert set(packed) <= set(real_calls)

    def recording(name, fn):
        return lambda xs: timed.append(name) or fn(xs)

    monkeypatch.setattr(
        program.executor, "op_calls", lambda: {n: recording(n, f) for n, f in real_calls.items()}
    )
    args = cm.last.bind([x])
    times = measure.step_times(program, args, runs=2)
    steps = program.plan.steps
    assert len(times) == len(steps) and all(t > 0 for t in times)
    assert set(packed) <= set(timed)
    assert any(isinstance(s, OpStep) and s.node.name in packed for s in steps)
