"""The tests' pinned host profile (conftest.py): a compile plans against it whatever this machine's cache
holds, so a plan's shape does not depend on the machine or on its load when the cache was filled."""

from __future__ import annotations

from pathlib import Path

from autofusion.cache import Cache
from autofusion.compiler import profile_for
from autofusion.config import Options
from autofusion.hw import calibration, measure


def test_a_compile_plans_against_the_pinned_profile(tmp_path: Path, pinned_cpu_profile: dict) -> None:
    # This machine's record as a parallel run leaves it (measured under load, on another core count),
    # and a stored calibration: neither is read.
    values = dict(pinned_cpu_profile, cores=16, memory_bandwidth=4e9, dispatch_overhead_s=5e-6)
    record = {"version": measure.CACHE_VERSION, "key": measure.machine_key(), "measured_at": 0.0,
              "seconds": 1.0, "quiet": False, "others_cores": 1.5, "values": values}  # fmt: skip
    Cache(tmp_path).put_json("hw", "cpu " + measure.machine_key(), record)
    calibration.store_calibration(tmp_path, {"memory_bandwidth": 9e9})
    p = profile_for(Options(cache_dir=str(tmp_path)))
    assert {k: getattr(p, k) for k in pinned_cpu_profile} == pinned_cpu_profile
    assert p.source["memory_bandwidth"] == p.source["cores"] == "measured"
