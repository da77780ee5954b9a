"""Profiles for targets we cannot run keep their datasheet values, and their budgets change fusion
groups where they bind; a stored calibration is laid over the measured cpu profile."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

import autofusion
from autofusion.compiler import plan_graph
from autofusion.config import Options
from autofusion.hw import calibration
from autofusion.hw.profile import ProfileError, load_profile

PROFILES = {n: load_profile(n, measure=False) for n in ("cpu", "ascend910b", "h200")}


def _groups(fn, inputs) -> dict[str, list[list[str]]]:
    cm = autofusion.compile(fn, inputs, fusion=False)
    out = {}
    for name, profile in PROFILES.items():
        plan = plan_graph(cm.graph, Options.from_env(), profile)
        out[name] = [sorted(plan.graph.nodes[i].op for i in k.nodes) for k in plan.kernels]
    return out


def test_datasheet_values_stay() -> None:
    h200, ascend = PROFILES["h200"], PROFILES["ascend910b"]
    assert h200.vector_registers == 255 and h200.source["vector_registers"] == "datasheet"
    assert ascend.vector_registers is None  # the vector unit computes from UB
    for p in (h200, ascend):
        assert p.cache_bandwidth is None and p.compute_rate is None and p.op_weights is None
        assert "calibrated" not in p.source.values()


def test_a_reduction_row_over_the_h200_budget_splits_the_softmax() -> None:
    """A 256 KiB row fits the cpu's L2 budget (and fuses on Ascend, whose 24 cores idle less over 8
    rows), but not an SM's 182 KiB: streamed once per stage over 8 of 132 SMs, the fused softmax costs
    more than it saves, and the reason says so (NF2006)."""
    groups = _groups(lambda x: torch.softmax(x, -1), (torch.randn(8, 65536),))
    assert len(groups["cpu"]) == 1 and len(groups["ascend910b"]) == 1
    assert len(groups["h200"]) > 1
    cm = autofusion.compile(lambda x: torch.softmax(x, -1), (torch.randn(8, 65536),), fusion=False)
    plan = plan_graph(cm.graph, Options.from_env(), PROFILES["h200"])
    refused = [d for d in plan.decisions if not d.accepted and d.code == "NF2006"]
    assert refused and all(
        "not profitable on h200" in d.reason and "tile_overhead=" in d.reason for d in refused
    )


def test_a_fused_kernel_compute_bound_on_cpu_but_not_on_h200_or_ascend() -> None:
    """Six exp/sin over [512], broadcast over [512, 2048]: fused, they run per element of the output.
    On the cpu (380 GFLOP/s against 20 GB/s) that kernel is compute-bound and the merge loses (negative
    ILP); the accelerators' compute rates keep it memory-bound and fusing pays."""

    def fn(x, y):
        for _ in range(6):
            x = x.exp().sin()
        return x[:, None] + y

    groups = _groups(fn, (torch.randn(512), torch.randn(512, 2048)))
    assert len(groups["cpu"]) == 2 and groups["cpu"][1] == ["add"]
    assert len(groups["h200"]) == 1 and len(groups["ascend910b"]) == 1
    cm = autofusion.compile(fn, (torch.randn(512), torch.randn(512, 2048)), fusion=False)
    plan = plan_graph(cm.graph, Options.from_env(), PROFILES["cpu"])
    refused = [d for d in plan.decisions if not d.accepted and d.code == "NF2007"]
    assert refused and refused[0].benefit is not None and refused[0].benefit.ilp_gain < 0
    assert "ilp_gain=-" in refused[0].reason


def test_spill_binds_on_cpu_registers_only() -> None:
    """Forty values alive at once, made from one input and read again at the end: on the cpu (16
    registers) a merge that must keep them all spills; an h200 thread holds 255 registers."""
    from autofusion.codegen.cpp.render import supports
    from autofusion.fusion import terms
    from autofusion.tools.calibrate.micro import _spill

    k = _spill("s", 1 << 16, 40)
    assert supports is not None and terms.live_values(k) == 42
    assert terms.spilled_values(k, PROFILES["cpu"]) == [42 - 16]
    assert terms.spilled_values(k, PROFILES["h200"]) == [0]


@pytest.mark.measured_hardware
def test_calibration_is_laid_over_the_cpu_profile(tmp_path: Path) -> None:
    values = {
        "memory_bandwidth": 3e10,
        "compute_rate": 2e11,
        "spill_s": 1e-11,
        "cache_bandwidth": {"l2": 2e11, "l3": 1e11},
        "op_weights": {"trig": 20.0, "arith.fp16": 1.5},
    }
    where = calibration.store_calibration(tmp_path, values)
    assert Path(where).is_file()
    p = load_profile("cpu", cache_dir=tmp_path)
    assert (
        p.memory_bandwidth == 3e10
        and p.compute_rate == 2e11
        and p.cache_bandwidth == {"l2": 2e11, "l3": 1e11}
    )
    assert p.source["op_weights"] == p.source["compute_rate"] == "calibrated"
    assert "calibrated: " in p.describe()
    assert load_profile("cpu", cache_dir=tmp_path, measure=False).compute_rate is None  # measure=False: YAML
    assert load_profile("h200", cache_dir=tmp_path).compute_rate is None  # only the host profile
    calibration.clear_calibration(tmp_path)
    assert load_profile("cpu", cache_dir=tmp_path).compute_rate is None
    with pytest.raises(ValueError, match="not_a_field"):
        calibration.store_calibration(tmp_path, {"not_a_field": 1.0})
    with pytest.raises(ValueError, match="spill_s"):
        calibration.store_calibration(tmp_path, {"spill_s": -1.0})


def test_a_foreign_calibration_is_ignored(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calibration.store_calibration(tmp_path, {"compute_rate": 2e11})
    monkeypatch.setattr(calibration, "machine_key", lambda: "another machine")
    assert calibration.cached_calibration(tmp_path) == {}


def test_profile_rejects_bad_calibrated_fields() -> None:
    with pytest.raises(ProfileError, match=r"op_weights\.sine.*unknown key"):
        load_profile("cpu", measure=False, overrides={"op_weights": {"sine": 2.0}})
    with pytest.raises(ProfileError, match=r"cache_bandwidth\.l4"):
        load_profile("cpu", measure=False, overrides={"cache_bandwidth": {"l4": 1e11}})
    p = load_profile("cpu", measure=False, overrides={"op_weights": {"trig.fp16": 30.0}})
    assert dataclasses.asdict(p)["op_weights"] == {"trig.fp16": 30.0}
