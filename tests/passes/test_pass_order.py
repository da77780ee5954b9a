"""The order rules of issue 4 part 6 in the fusion solver: vertical before horizontal, a stable order,
and a merge that failed a budget prunes every larger merge containing it."""

from __future__ import annotations

import logging

import pytest
import torch

import autofusion
from autofusion.codegen.cpp.render import supports
from autofusion.config import Options
from autofusion.fusion.solver import FusionLimits, Solver
from autofusion.hw.profile import load_profile
from autofusion.passes.decompose import decompose


def branches(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    a, b = x.exp(), y.sin()
    c = a * b
    return (c + a).relu() + b.cos()


def _solver(fn, inputs, **limits) -> Solver:
    graph = decompose(autofusion.compile(fn, inputs, fusion=False).graph)
    return Solver(graph, load_profile("cpu"), FusionLimits(**limits), supports)


def test_vertical_candidates_come_before_horizontal_ones() -> None:
    s = _solver(lambda x: (x.exp() + 1, x.sin() * 2, x.cos()), (torch.randn(4, 5),))
    kinds = [c[-1] for c in s.candidates()]
    assert "horizontal" in kinds and "vertical" in kinds
    assert kinds.index("horizontal") > max(i for i, k in enumerate(kinds) if k == "vertical")
    assert s.candidates() == s.candidates()  # stable: no hashing order leaks in


def test_horizontal_kernel_switch_removes_horizontal_candidates() -> None:
    s = _solver(lambda x: (x.exp(), x.sin()), (torch.randn(4, 5),), horizontal=False)
    assert all(c[-1] == "vertical" for c in s.candidates())


def test_a_failed_budget_prunes_larger_candidates(caplog: pytest.LogCaptureFixture) -> None:
    x, y = torch.randn(4, 5), torch.randn(4, 5)
    with caplog.at_level(logging.DEBUG, logger="autofusion.fusion"):
        cm = autofusion.compile(branches, (x, y), max_fusion_size=2)
    assert "[NF1010][contains a group that failed its budget: 3 nodes > max_fusion_size 2]" in caplog.text
    with torch.no_grad():
        torch.testing.assert_close(cm(x, y), branches(x, y))


def test_pruning_changes_no_decision_only_the_work() -> None:
    """A pruned candidate would have failed the size check anyway: the groups are the same."""
    x, y = torch.randn(4, 5), torch.randn(4, 5)
    s = _solver(branches, (x, y), max_fusion_size=2)
    groups = s.solve().groups
    s2 = _solver(branches, (x, y), max_fusion_size=2)
    s2._over_budget_subset = lambda merged: None  # type: ignore[method-assign]
    assert s2.solve().groups == groups


def test_pipeline_options_reach_the_solver() -> None:
    x = torch.randn(6, 7)
    on = autofusion.compile(lambda t: (t.exp(), t.sin()), (x,))
    off = autofusion.compile(lambda t: (t.exp(), t.sin()), (x,), disabled=frozenset({"horizontal_kernel"}))
    assert (on.stats["fused_kernels"], off.stats["fused_kernels"]) == (1, 2)
    assert Options.from_env(disabled=frozenset({"cse"})).disabled == {"cse"}


def test_sibling_kernels_over_different_spaces_decline_with_a_reason(
    caplog: pytest.LogCaptureFixture,
) -> None:
    x, u = torch.randn(4, 5), torch.randn(3, 4, 5)
    fn = lambda t, v: (t.exp(), t + v)  # noqa: E731 - siblings of t over [4, 5] and [3, 4, 5]
    with caplog.at_level(logging.DEBUG, logger="autofusion.fusion"):
        cm = autofusion.compile(fn, (x, u))
    assert "exp(exp) and node2 add(add) cannot fuse, the reason is [NF1006]" in caplog.text
    assert cm.stats["fused_kernels"] == 2
    with torch.no_grad():
        torch.testing.assert_close(cm(x, u), fn(x, u))
