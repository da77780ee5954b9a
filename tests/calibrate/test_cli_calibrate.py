"""`autofusion calibrate` end to end, at its smallest: micro-kernels built and timed, parameters fitted and
stored for this machine, one benchmark case planned with them and measured."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from autofusion.hw import calibration
from autofusion.hw.profile import load_profile
from autofusion.tools.cli import main as cli


@pytest.mark.measured_hardware  # reads back the calibration it stored
def test_quick_calibration_stores_and_reports(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = [
        "calibrate",
        "--quick",
        "--kernels",
        "1",
        "--candidates",
        "1",
        "--json",
        "--cache-dir",
        str(tmp_path),
    ]
    assert cli.main(argv) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    out = json.loads(last)
    assert {"rank_correlation", "verdict_agreement", "parameters", "stored", "kernels", "candidates"} <= set(
        out
    )
    assert out["kernels"] >= 3 and out["candidates"] == 1  # the plan's kernel and a candidate's three
    assert -1.0 <= out["rank_correlation"] <= 1.0 and out["verdict_agreement"] in (0.0, 1.0)
    params = out["parameters"]
    assert set(params) == set(calibration.CALIBRATED_FIELDS)
    assert all(v > 0 for v in params["op_weights"].values()) and set(params["cache_bandwidth"]) == {
        "l2",
        "l3",
    }
    assert Path(out["stored"]).is_file()
    # the planner now plans with them
    p = load_profile("cpu", cache_dir=tmp_path)
    assert p.source["compute_rate"] == "calibrated" and math.isclose(
        p.compute_rate or 0, params["compute_rate"]
    )
    assert cli.main(["calibrate", "--clear", "--cache-dir", str(tmp_path)]) == 0
    assert load_profile("cpu", cache_dir=tmp_path).compute_rate is None


def test_usage_errors(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["calibrate", "--candidates", "-1", "--cache-dir", "/nonexistent/never-used"]) == 2
    assert "--candidates must be >= 0" in capsys.readouterr().err
