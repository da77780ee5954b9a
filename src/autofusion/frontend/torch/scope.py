"""`autofusion.super_kernel_scope`: mark model code whose ops form one SuperKernel, and its options.

In: a scope name (or None: the ops inside are never fused) and an option string in the real
system's `key=value:key=value` form. Out: while the context is active, every op torch traces gets
the scope in `node.meta["custom"]` (through `torch.fx.traceback.annotate`), which strict and
non-strict `torch.export` and Dynamo keep when node meta is preserved (capture does so); the
frontend reads it once per fx node (`autofusion.ir.scope.Scope.from_meta`) onto each IR node.
Semantics and options: `autofusion.ir.scope`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
import torch.fx.traceback as fx_traceback

from autofusion.errors import InputMismatchError
from autofusion.ir.scope import MAX_NAME, NO_FUSE, OPTIONS_KEY, SCOPE_KEY, format_options, parse_options

# The enclosing scopes while model code runs. A plain list, not a ContextVar: Dynamo (strict export
# and torch.compile) traces list appends and pops, and refuses ContextVar methods.
_STACK: list[str | None] = []


@torch.compiler.assume_constant_result
def _canonical(options: str, name: str | None) -> str:
    """Parsed and re-written options. Dynamo runs this eagerly and keeps the string as a constant
    (it cannot trace dataclass introspection), so warnings and errors still reach the user."""
    # stacklevel 5: here, the generator, contextlib's __enter__, then the user's `with` line.
    return format_options(parse_options(options, f"super_kernel_scope({name!r})", stacklevel=5))


@contextlib.contextmanager
def super_kernel_scope(name: str | None, options: str = "") -> Iterator[None]:
    """Ops traced inside run as one SuperKernel named `name` (None: never fused). Options: see
    `SuperKernelOptions`, written `key=value:key=value` (e.g. "early-start=0:debug-sync-all=1")."""
    if name is not None and (not isinstance(name, str) or not name or len(name) > MAX_NAME or "/" in name):
        raise InputMismatchError(f"super_kernel_scope name must be a non-empty string of at most {MAX_NAME} "
                                 f"characters without '/', got {name!r}")  # fmt: skip
    text = _canonical(options, name)
    _STACK.append(name)
    mark = NO_FUSE if any(s is None for s in _STACK) else "/".join(s for s in _STACK if s is not None)
    try:
        with fx_traceback.annotate({SCOPE_KEY: mark, OPTIONS_KEY: text}):
            yield
    finally:
        _STACK.pop()
