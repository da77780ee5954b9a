"""Precision analyzer: per fused kernel against the reference, a planted wrong kernel is flagged."""

from __future__ import annotations

import json
import math

import pytest
import torch

import autofusion
from autofusion.tools.cli import main as cli
from autofusion.tools.diagnose.compare import compare_tensors as compare
from autofusion.tools.diagnose.precision import check_model


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("name", ["transformer-block", "layernorm", "softmax", "elementwise-chain"])
def test_builtins_are_within_tolerance(name: str, dtype: torch.dtype) -> None:
    model, inputs = autofusion.builtin(name, dtype=dtype)
    checks, cm = check_model(model, inputs)
    assert len(checks) == cm.stats["fused_kernels"] >= 1
    for c in checks:
        assert not c.flagged, c
        assert c.cosine > 0.999 and c.outputs, c


def test_planted_wrong_kernel_is_flagged(plant_wrong_fused_tanh: None, tmp_path) -> None:
    from dfx_test_models import chain

    model, inputs = chain()
    checks, _ = check_model(model, inputs, cache_dir=str(tmp_path))
    (bad,) = [c for c in checks if c.flagged]
    assert "tanh" in bad.ops
    assert 1e-4 < bad.scaled < 2e-3  # 1.001 * tanh, damped by the sigmoid after it


def test_check_cli_exit_codes(
    plant_wrong_fused_tanh: None,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path,
) -> None:
    monkeypatch.setenv("AUTOFUSION_CACHE_DIR", str(tmp_path))
    assert cli.main(["check", "dfx_test_models:chain"]) == 1
    out = capsys.readouterr().out
    assert "FLAGGED" in out and "over tolerance" in out
    # Refusing tanh's merges leaves tanh alone in its kernel, which the planted fault spares.
    assert cli.main(["check", "dfx_test_models:chain", "--disable", "tanh", "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert rows and not any(r["flagged"] for r in rows)


def test_compare_edge_cases() -> None:
    x = torch.tensor([1.0, float("inf"), float("nan"), -2.0])
    assert compare(x, x.clone()).scaled == 0 and compare(x, x.clone()).cosine == pytest.approx(1.0)
    assert math.isinf(compare(torch.tensor([1.0, float("nan")]), torch.tensor([1.0, 2.0])).max_abs)
    assert compare(torch.zeros(0), torch.zeros(0)).scaled == 0
    assert compare(torch.zeros(3), torch.zeros(3)).cosine == 1.0
    c = compare(torch.tensor([1.0, 1e-9]), torch.tensor([1.0, 0.0]))
    assert c.max_rel < 1e-5  # the near-zero element is measured against max|ref| / 1000
    assert compare(torch.tensor([1, 2]), torch.tensor([1, 3])).cosine == 0.0


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("name", ["transformer-block", "layernorm", "softmax", "elementwise-chain"])
def test_fused_half_kernels_are_not_worse_than_the_reference_against_fp64(
    name: str, dtype: torch.dtype
) -> None:
    # Kernels compute in fp32 and round once; the op-by-op reference rounds after every op.
    model, inputs = autofusion.builtin(name, dtype=dtype)
    checks, _ = check_model(model, inputs)
    floating = [c for c in checks if c.fused_vs_fp64 is not None]
    # every kernel with a floating output is compared (transformer-block's mask kernel is bool)
    assert floating and all(c.reference_vs_fp64 is not None for c in floating)
    assert len(floating) >= len([c for c in checks if "logical_not" not in c.kernel])
    for c in floating:
        assert c.fused_vs_fp64 <= c.reference_vs_fp64 * 1.01 + 1e-7, c


def test_failed_build_is_reported_not_compared(tmp_path) -> None:
    from dfx_test_models import chain

    model, inputs = chain()
    # A compiler that always fails: the plan runs on the reference runtime, nothing to compare.
    checks, cm = check_model(model, inputs, cxx="false", cache_dir=str(tmp_path))
    assert "build_error" in cm.stats
    assert checks and all(not c.flagged and "not built" in c.note for c in checks)
