"""Hardware profiles: what a device offers the fusion planner, as data.

`load_profile("cpu" | "ascend910b" | "h200" | "path/to/profile.yaml", cache_dir=..., overrides=...)`
returns a frozen `HardwareProfile`; the `cpu` profile is measured on first use and cached per machine.
"""

from autofusion.hw.measure import measure_cpu
from autofusion.hw.profile import (
    BUILTIN_PROFILES,
    DTYPE_NAMES,
    KINDS,
    SOURCES,
    HardwareProfile,
    ProfileError,
    load_profile,
)

__all__ = [
    "BUILTIN_PROFILES", "DTYPE_NAMES", "KINDS", "SOURCES", "HardwareProfile", "ProfileError", "load_profile",
    "measure_cpu",
]  # fmt: skip
