"""Options: one typed, frozen set of compiler settings; the only module that reads the environment.

`Options.from_env(**overrides)` starts from the defaults, applies the environment variables users of
CANN and torch know (as later issues add them), then explicit keyword overrides, which win.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
from dataclasses import dataclass, field
from typing import Any

from autofusion.errors import InputMismatchError

CAPTURE_MODES = ("auto", "strict", "non-strict")
SUPER_KERNEL_MODES = ("auto", "on", "off")


@dataclass(frozen=True)
class Options:
    capture: str = field(
        default="auto",
        metadata={"help": "torch.export mode: 'strict' (Dynamo), 'non-strict', or 'auto' (strict, then non-strict)"},
    )
    verify: bool = field(default=True, metadata={"help": "run the IR verifier after every stage"})
    cache_dir: str = field(
        default="", metadata={"help": "where compiled artefacts are cached (env AUTOFUSION_CACHE_DIR; "
                                      "default $XDG_CACHE_HOME/autofusion or ~/.cache/autofusion)"}
    )
    fusion: bool = field(default=True, metadata={"help": "fuse and generate kernels (False: reference runtime only)"})
    target: str = field(default="cpu", metadata={"help": "hardware profile: cpu, ascend910b, h200 or a YAML path"})
    max_fusion_size: int = field(default=64, metadata={"help": "most IR nodes in one fused kernel (NF1010)"})
    max_inputs: int = field(default=16, metadata={"help": "most input buffers of one fused kernel (NF1007)"})
    recomputation_threshold: int = field(
        default=1, metadata={"help": "recompute a cheap pointwise producer in up to this many consumer kernels "
                                     "instead of writing it out (CANN semantics; 1 = always materialise)"})
    cxx: str = field(default="g++", metadata={"help": "C++ compiler for generated kernels (env CXX)"})
    super_kernel: str = field(
        default="auto", metadata={"help": "run each plan as SuperKernels, one compiled entry per scope: 'on', 'off', or "
                                          "'auto' (on where the profile's dispatch overhead is a noticeable share of "
                                          "the estimated kernel time)"})

    def __post_init__(self) -> None:
        if self.max_fusion_size < 1 or self.max_inputs < 1:
            raise ValueError("max_fusion_size and max_inputs must be >= 1")
        if self.super_kernel not in SUPER_KERNEL_MODES:
            raise ValueError(f"super_kernel={self.super_kernel!r}; choose one of {', '.join(SUPER_KERNEL_MODES)}")
        if self.capture not in CAPTURE_MODES:
            raise ValueError(f"capture={self.capture!r}; choose one of {', '.join(CAPTURE_MODES)}")

    @staticmethod
    def names() -> list[str]:
        return [f.name for f in dataclasses.fields(Options)]

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None, **overrides: Any) -> Options:
        env = dict(os.environ) if env is None else env
        values: dict[str, Any] = {}
        if env.get("AUTOFUSION_CACHE_DIR"):
            values["cache_dir"] = env["AUTOFUSION_CACHE_DIR"]
        else:
            base = env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
            values["cache_dir"] = os.path.join(base, "autofusion")
        if env.get("CXX"):
            values["cxx"] = env["CXX"]
        unknown = [k for k in overrides if k not in cls.names()]
        if unknown:
            hints = {k: difflib.get_close_matches(k, cls.names(), n=1) for k in unknown}
            detail = ", ".join(f"{k!r}" + (f" (did you mean {h[0]!r}?)" if h else "") for k, h in hints.items())
            raise InputMismatchError(f"unknown option(s) {detail}; known: {', '.join(cls.names())}")
        values.update(overrides)
        return cls(**values)

    def help(self) -> dict[str, str]:
        return {f.name: f.metadata.get("help", "") for f in dataclasses.fields(self)}
