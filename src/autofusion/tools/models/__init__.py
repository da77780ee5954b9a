"""Built-in models for demos, benchmarks and tests: ``builtin(name) -> (module, example_inputs)``."""

from __future__ import annotations

from autofusion.tools.models.builtins import BUILTIN_NAMES, BuiltinSpec, builtin, describe

__all__ = ["BUILTIN_NAMES", "BuiltinSpec", "builtin", "describe"]
