"""Spearman's rank correlation (tools/calibrate/accuracy.spearman) and the verdict bookkeeping."""

from __future__ import annotations

import math

import pytest

from autofusion.tools.calibrate.accuracy import TIE, Verdict, _ranks, spearman


def test_known_values() -> None:
    assert spearman([1, 2, 3, 4, 5], [5, 6, 7, 8, 7]) == pytest.approx(0.8207826816681233)  # ties in y
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    # monotone but not linear: ranks only
    assert spearman([1e-6, 1e-3, 1.0, 1e3], [1, 2, 3, 1e9]) == pytest.approx(1.0)
    # d^2 formula without ties: 1 - 6 * sum(d^2) / (n (n^2 - 1)); here d = (0, 1, -1, 0, 0)
    assert spearman([1, 2, 3, 4, 5], [1, 3, 2, 4, 5]) == pytest.approx(1 - 6 * 2 / (5 * 24))


def test_ranks_average_ties() -> None:
    assert _ranks([3.0, 1.0, 3.0, 2.0]) == [3.5, 1.0, 3.5, 2.0]


def test_degenerate_inputs() -> None:
    assert math.isnan(spearman([1.0], [2.0]))
    assert math.isnan(spearman([1, 1, 1], [1, 2, 3]))
    with pytest.raises(ValueError, match="2 x values but 3 y values"):
        spearman([1, 2], [1, 2, 3])


def test_verdict_ties_and_agreement() -> None:
    clear = Verdict(
        "c", "a + b", model_fuse=True, measured_fuse=False, net_s=1e-6, unfused_s=1.0, fused_s=1.5
    )
    assert not clear.tie and not clear.agrees
    close = Verdict("c", "a + b", True, False, 1e-6, 1.0, 1.0 + TIE / 2)
    assert close.tie and close.agrees
