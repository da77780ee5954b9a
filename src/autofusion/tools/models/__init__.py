"""Built-in models for demos, benchmarks and tests: ``builtin(name) -> (module, example_inputs)``.

Names load on first use (`builtins` imports torch), so the command line can read `BUILTIN_NAMES` and
the MODEL loader without it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from autofusion.tools.models.names import BUILTIN_NAMES

if TYPE_CHECKING:
    from autofusion.tools.models.builtins import BuiltinSpec, builtin, describe

_LAZY = ("BuiltinSpec", "builtin", "describe")


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'autofusion.tools.models' has no attribute {name!r}")
    value = getattr(importlib.import_module("autofusion.tools.models.builtins"), name)
    globals()[name] = value
    return value


__all__ = ["BUILTIN_NAMES", "BuiltinSpec", "builtin", "describe"]
