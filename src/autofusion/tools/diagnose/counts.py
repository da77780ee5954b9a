"""How much work a run does, said the same way by every tool.

From a compiled model's `.stats` (the plan's `plan_stats`): `fused_kernels` is the generated (fused)
kernels, `kernels` the plan steps one run executes, those kernels plus library and view ops
(constants are not steps). Tools print the pair as "6 fused kernels, 27 steps per run".
"""

from __future__ import annotations

from typing import Any

FUSED_KERNELS = "fused kernels"
STEPS_PER_RUN = "steps per run"
STEPS_MEANING = "fused kernels + library and view ops"


def kernel_counts(stats: dict[str, Any]) -> str:
    """ "6 fused kernels, 27 steps per run" ("1 fused kernel, 1 step per run")."""
    fused, steps = stats.get("fused_kernels", 0), stats.get("kernels", 0)
    return f"{fused} fused kernel{'s' * (fused != 1)}, {steps} step{'s' * (steps != 1)} per run"
