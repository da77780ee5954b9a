"""The host's calibrated cost-model parameters, cached per machine like `measure.py`'s measurement.

In: the cache (an `autofusion.cache.Cache` or its root) and, to store, the values `autofusion calibrate`
fitted (tools/calibrate/). Out: a dict of HardwareProfile field -> value that `load_profile` lays over
the measured cpu profile (source "calibrated"), so the planner plans with them from then on.

The record lives in the cache's "hw" namespace under "calibration " + `measure.machine_key()` (CPU model
and features, usable CPUs, torch version): another machine, or this one after an upgrade, does not use
it. Nothing here measures: reading a missing, corrupt or foreign record gives {} and a log line.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Mapping
from typing import Any

from autofusion.cache import Cache, as_cache
from autofusion.hw.measure import machine_key

log = logging.getLogger(__name__)

CALIBRATION_VERSION = 1
# What a calibration may set; scalars are positive numbers, mappings map names to positive numbers.
CALIBRATED_FIELDS = ("memory_bandwidth", "dispatch_overhead_s", "compute_rate", "op_weights",
                     "cache_bandwidth", "spill_s")  # fmt: skip


def _key() -> str:
    return "calibration " + machine_key()


def cached_calibration(cache: Cache | str | os.PathLike[str]) -> dict[str, Any]:
    """The stored calibration of this machine ({} when there is none to trust)."""
    record = as_cache(cache).get_json("hw", _key())
    if record is None:
        return {}
    values = record.get("values") if isinstance(record, dict) else None
    if record.get("version") != CALIBRATION_VERSION or record.get("key") != machine_key():
        log.info("the cached calibration is for another machine or version; not using it")
        return {}
    ok = isinstance(values, dict) and all(k in CALIBRATED_FIELDS and _valid(v) for k, v in values.items())
    if not ok:
        log.warning("ignoring a cached calibration with unknown fields or non-positive values")
        return {}
    assert isinstance(values, dict)
    return values


def store_calibration(cache: Cache | str | os.PathLike[str], values: Mapping[str, Any],
                      meta: Mapping[str, Any] | None = None) -> str:  # fmt: skip
    """Write this machine's calibration; returns where (the record's file). Raises ValueError on a field
    that is not calibrated or a value that is not positive."""
    bad = [k for k, v in values.items() if k not in CALIBRATED_FIELDS or not _valid(v)]
    if bad:
        raise ValueError(f"cannot store calibration field(s) {', '.join(bad)}: unknown or not positive")
    cache = as_cache(cache)
    record = {"version": CALIBRATION_VERSION, "key": machine_key(), "calibrated_at": time.time(),
              "values": dict(values), "meta": dict(meta or {})}  # fmt: skip
    cache.put_json("hw", _key(), record)
    return str(cache.record_path("hw", _key()))


def clear_calibration(cache: Cache | str | os.PathLike[str]) -> None:
    """Forget this machine's calibration (the planner goes back to the measured profile)."""
    as_cache(cache).put_json("hw", _key(), None)


def _valid(v: Any) -> bool:
    if isinstance(v, Mapping):
        return bool(v) and all(isinstance(k, str) and _positive(x) for k, x in v.items())
    return _positive(v)


def _positive(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0
