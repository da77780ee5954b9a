"""Parameters are read from the live module on every call, through both routes, and what the rules
derive from them once (the Conv+BN fold, prepacked weights) follows a replaced or in-place-changed
parameter: a new nn.Parameter assigned to a layer, `load_state_dict(..., assign=True)`, `.copy_()`
under no_grad. (Compiled models used to keep reading the tensors bound at capture.)"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

import autofusion
from autofusion.runtime.library import FOLDS


class ConvBn(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.bn(self.conv(x)))


def _conv_bn() -> torch.nn.Module:
    torch.manual_seed(0)
    m = ConvBn().eval()
    with torch.no_grad():
        m.bn.running_mean.uniform_(-1, 1)
        m.bn.running_var.uniform_(0.5, 2.0)
    return m


def _linear() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh()).eval()


def _assign(m: torch.nn.Module) -> None:
    layer = m.conv if isinstance(m, ConvBn) else m[0]
    layer.weight = torch.nn.Parameter(torch.randn_like(layer.weight))


def _load_assign(m: torch.nn.Module) -> None:
    sd = {k: torch.rand_like(v) + 0.5 if v.is_floating_point() else v for k, v in m.state_dict().items()}
    m.load_state_dict(sd, assign=True)


def _copy_in_place(m: torch.nn.Module) -> None:
    for p in m.parameters():
        p.copy_(torch.randn_like(p))
    for b in m.buffers():
        if b.is_floating_point():
            b.mul_(1.5)


CHANGES: dict[str, Callable[[torch.nn.Module], None]] = {
    "assign a new Parameter": _assign,
    "load_state_dict(assign=True)": _load_assign,
    "copy_ in place": _copy_in_place,
}


@pytest.mark.parametrize("route", ["autofusion.compile", "torch.compile"])
@pytest.mark.parametrize("change", list(CHANGES))
@pytest.mark.parametrize("make", [_linear, _conv_bn], ids=["linear", "conv_bn"])
def test_changed_parameters_are_seen(make, change: str, route: str) -> None:
    m = make()
    x = torch.randn(2, 3, 8, 8) if isinstance(m, ConvBn) else torch.randn(4, 8)
    torch._dynamo.reset()
    with torch.no_grad():
        if route == "autofusion.compile":
            cm = autofusion.compile(m, [x])
        else:
            cm = torch.compile(m, backend="autofusion")
        torch.testing.assert_close(cm(x), m(x), rtol=1e-4, atol=1e-5)
        if route == "autofusion.compile":
            assert "build_error" not in cm.stats
            if isinstance(m, ConvBn):  # one library call on the folded weights
                assert cm.stats["rules"] == {"conv_bn_relu": 1}, cm.stats["rules"]
            else:  # the GEMM, then a generated kernel
                assert cm.stats["kernel_steps"] == 1 and cm.stats["generated_calls"] >= 1
        CHANGES[change](m)
        torch.testing.assert_close(cm(x), m(x), rtol=1e-4, atol=1e-5)
        CHANGES["copy_ in place"](m)  # and a later in-place change of whatever is live now
        torch.testing.assert_close(cm(x), m(x), rtol=1e-4, atol=1e-5)


def test_the_fold_is_reused_while_parameters_stay_the_same() -> None:
    m = _conv_bn()
    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        cm = autofusion.compile(m, [x])
        cm(x)
        misses = FOLDS.misses
        for _ in range(3):
            cm(x)
        assert FOLDS.misses == misses, "the BN fold was recomputed for unchanged parameters"
        m.bn.weight.mul_(2.0)
        torch.testing.assert_close(cm(x), m(x), rtol=1e-4, atol=1e-5)
        assert FOLDS.misses == misses + 1
