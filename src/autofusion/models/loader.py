"""MODEL arguments of the command line: `builtin:NAME` or `package.module:factory`.

In: the string a user typed. Out: `(model, example_inputs)`. A factory is called with no arguments and
must return that pair. (`.onnx` paths join here when the ONNX frontend lands: one more branch.)
Errors are `ValueError`s that say which form was expected and what went wrong.
"""

from __future__ import annotations

import importlib
from typing import Any


def load_model(spec: str) -> tuple[Any, tuple[Any, ...]]:
    kind, sep, rest = spec.partition(":")
    if not sep or not rest:
        raise ValueError(f"MODEL {spec!r}: expected builtin:NAME or package.module:factory")
    if kind == "builtin":
        from autofusion.models import builtin

        return builtin(rest)
    try:
        module = importlib.import_module(kind)
    except ImportError as e:
        raise ValueError(f"MODEL {spec!r}: cannot import module {kind!r}: {e}") from e
    factory = getattr(module, rest, None)
    if not callable(factory):
        raise ValueError(f"MODEL {spec!r}: module {kind!r} has no callable {rest!r}")
    made = factory()
    if not (isinstance(made, tuple) and len(made) == 2 and callable(made[0])):
        raise ValueError(
            f"MODEL {spec!r}: {rest}() must return (model, example_inputs), got {type(made).__name__}"
        )
    model, inputs = made
    return model, tuple(inputs)
