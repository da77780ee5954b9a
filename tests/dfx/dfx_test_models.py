"""Model factories for the DFX command-line tests (MODEL = dfx_test_models:NAME)."""

from __future__ import annotations

import torch


class Cycle(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = x.exp()
        return a + torch.cumsum(a, 0)


class Chain(torch.nn.Module):
    """exp -> mul -> tanh -> add -> sigmoid over one tensor: four merges in solver order."""

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(torch.tanh(x.exp() * y) + 0.5) * 2.0


def cycle() -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    return Cycle(), (torch.randn(5, 6),)


def chain() -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    g = torch.Generator().manual_seed(0)
    return Chain(), (torch.randn(32, 70, generator=g), torch.randn(32, 70, generator=g))


class Residual(torch.nn.Module):
    """linear + residual add (the `linear_residual` rule's pattern), then a fused tail (tanh, mul)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(24, 24)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.fc(x) + x) * 0.5 + x.exp()


def residual() -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    return Residual().eval(), (torch.randn(16, 24, generator=g),)
