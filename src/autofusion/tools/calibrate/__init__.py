"""`autofusion calibrate`: fit this machine's cost-model parameters, store them, and measure how well the
model then predicts.

1. micro.py times micro-kernels and fits dispatch, bandwidth per cache level, per-op compute cost by
   op class and dtype, and the spill cost;
2. hw/calibration.py stores them in the cache, keyed by the machine fingerprint; `load_profile("cpu",
   cache_dir=...)` lays them over the measured profile from then on (source "calibrated"), so every
   later plan uses them;
3. accuracy.py plans benchmark cases with the calibrated profile and reports the rank correlation of
   estimated and measured kernel times and the agreement of fuse/no-fuse verdicts with measurement.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field
from typing import Any

from autofusion.cache import Cache
from autofusion.hw import calibration
from autofusion.hw.measure import machine_key
from autofusion.hw.profile import load_profile
from autofusion.tools.calibrate.accuracy import Point, Verdict, benchmark_cases, measure_case, spearman
from autofusion.tools.calibrate.micro import fit, measure_micro

__all__ = ["Calibration", "calibrate", "spearman"]


@dataclass
class Calibration:
    parameters: dict[str, Any]
    notes: dict[str, Any]
    stored: str  # where the record is ("" with store=False)
    points: list[Point] = field(default_factory=list)
    verdicts: list[Verdict] = field(default_factory=list)
    seconds: float = 0.0
    load: float = 0.0  # 1-minute load average over the CPUs when it ended: >1 means a busy machine

    @property
    def rank_correlation(self) -> float:
        return spearman([p.estimated_s for p in self.points], [p.measured_s for p in self.points])

    @property
    def verdict_agreement(self) -> float:
        return sum(v.agrees for v in self.verdicts) / len(self.verdicts) if self.verdicts else math.nan

    @property
    def strict_agreement(self) -> float:
        """Agreement counting a tie as agreeing only when the verdicts agree."""
        if not self.verdicts:
            return math.nan
        return sum(v.model_fuse == v.measured_fuse for v in self.verdicts) / len(self.verdicts)

    def summary(self) -> dict[str, Any]:
        def num(x: float, digits: int = 4) -> float | None:
            return None if math.isnan(x) else round(x, digits)

        return {
            "rank_correlation": num(self.rank_correlation),
            "verdict_agreement": num(self.verdict_agreement),
            "verdict_agreement_strict": num(self.strict_agreement),
            "kernels": len(self.points),
            "candidates": len(self.verdicts),
            "ties": sum(v.tie for v in self.verdicts),
            # how many candidates each side would fuse: agreement means little when all say "fuse"
            "model_fuse": sum(v.model_fuse for v in self.verdicts),
            "measured_fuse": sum(v.measured_fuse for v in self.verdicts),
            "parameters": self.parameters,
            "stored": self.stored,
            "machine": machine_key(),
            "load_per_cpu": round(self.load, 2),
            "seconds": round(self.seconds, 1),
        }


def calibrate(cache: Cache, *, quick: bool = False, kernels: int | None = None, candidates: int | None = None,
              store: bool = True) -> Calibration:  # fmt: skip
    """Fit, store (unless `store` is False: the accuracy is then that of the fit, planned with it as an
    override), and measure. `kernels` caps the benchmark cases, `candidates` the merges sampled per case."""
    start = time.perf_counter()
    base = load_profile("cpu", cache_dir=cache)
    times = measure_micro(base, cache, quick)
    values, notes = fit(times, base, quick)
    notes["micro_seconds"] = times
    stored = calibration.store_calibration(cache, values, {"quick": quick}) if store else ""
    profile = load_profile("cpu", cache_dir=cache, overrides=None if store else values)
    out = Calibration(values, notes, stored)
    per_case = candidates if candidates is not None else (2 if quick else 6)
    for case in benchmark_cases(quick, kernels):
        result = measure_case(case, cache, candidates=per_case, quick=quick, profile=profile)
        out.points += result.points
        out.verdicts += result.verdicts
    out.seconds = time.perf_counter() - start
    try:
        out.load = os.getloadavg()[0] / max(1, base.cores)
    except OSError:
        out.load = math.nan
    return out
