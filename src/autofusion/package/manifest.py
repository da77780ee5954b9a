"""A package's manifest.json: what it was built with and for, and whether this machine may load it.

The rule (`refusal`): the package format, autofusion's and torch's versions and the machine architecture
must equal this process's, and every CPU feature a library in the package was built to use
(`codegen.cpp.build.resolved_features`, recorded per library) must be present here
(`hw/isa.missing_features`). Anything else would at best fail to unpickle and at worst run an instruction
this CPU lacks (SIGILL), so it is refused before any library is opened.
"""

from __future__ import annotations

import platform
import sys
from typing import Any

import torch

from autofusion._version import __version__
from autofusion.hw.isa import missing_features

FORMAT = "autofusion-package"
FORMAT_VERSION = 2  # 2: tensors raw and mapped (`tensorfile`); 1: `torch.save`d (still read)
READABLE_VERSIONS = (1, 2)
MANIFEST = "manifest.json"
PLAN = "plan.pkl"
TENSORS = "tensors.pt"  # format 1: the plan's tensors; format 2: only those `tensorfile` cannot map
WEIGHTS = "weights.pt"  # format 1 only: the copied weights
LIBS = "libs"


def environment() -> dict[str, Any]:
    """The fields a loading process must match, as this process has them."""
    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "autofusion": __version__,
        "torch": torch.__version__,
        "machine": platform.machine(),
        "python": ".".join(map(str, sys.version_info[:2])),  # recorded; pickles read across 3.x
    }


def required_features(manifest: dict[str, Any]) -> list[str]:
    """Every CPU feature any library of the package was built to use."""
    out: set[str] = set()
    for lib in manifest.get("libraries", {}).values():
        out.update(lib.get("features", []))
    return sorted(out)


def refusal(manifest: Any, where: str) -> str | None:
    """Why this process must not load the package (None: it may)."""
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        return f"{where} is not an autofusion package (no {MANIFEST} of format {FORMAT!r})"
    here = environment()
    if manifest.get("format_version") not in READABLE_VERSIONS:
        readable = " and ".join(map(str, READABLE_VERSIONS))
        return (f"{where} has package format version {manifest.get('format_version')}; this autofusion "
                f"reads versions {readable}")  # fmt: skip
    for key, what in (("autofusion", "autofusion"), ("torch", "torch"), ("machine", "machine architecture")):
        if manifest.get(key) != here[key]:
            return f"{where} was saved with {what} {manifest.get(key)}; this process has {here[key]}"
    missing = missing_features(required_features(manifest))
    if missing:
        return (f"{where} holds kernels built for CPU features this machine lacks: {', '.join(missing)} "
                f"(built on {manifest.get('host_cpu') or 'another CPU'}); running them could stop the "
                "process with an illegal instruction")  # fmt: skip
    return None
