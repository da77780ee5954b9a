"""torch's symbolic sizes (an exported program's `torch.SymInt`s) as the IR's `ir.symbolic.SymInt`s.

A graph exported with dynamic dims (`torch.export.Dim`) has sizes like `s33*s50` in its fake tensors
and scalar nodes (`aten.sym_size.int`, `operator.mul`) that compute them. While `naming` is active,
the FX converter reads each such size as a SymInt holding its example value (the hint) and an
expression over the user's dim names; without it a symbolic size is an error, as before.
Expressions are translated from their sympy form: symbols, integers, sums, products, floor division
and modulo; anything else (a max, a ceiling) is refused (`FrontendError`), and the model is then
captured for each size instead.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator, Mapping
from typing import Any

import torch

from autofusion.errors import FrontendError
from autofusion.ir.symbolic import Expr, SymInt

_names: contextvars.ContextVar[Mapping[str, str] | None] = contextvars.ContextVar(
    "af_torch_symbols", default=None
)


@contextlib.contextmanager
def naming(names: Mapping[str, str]) -> Iterator[None]:
    """While active, torch symbols convert to SymInts; `names` maps torch's (`s33`) to the user's."""
    token = _names.set(names)
    try:
        yield
    finally:
        _names.reset(token)


def active() -> bool:
    return _names.get() is not None


def size(x: Any) -> int:
    """A size as the IR holds it: an int, or a SymInt for a torch.SymInt while `naming` is active."""
    if not isinstance(x, torch.SymInt):
        return int(x)
    names = _names.get()
    if names is None:
        raise FrontendError(f"dynamic (symbolic) size {x}")
    node = x.node
    hint = node.hint if node.has_hint() else None
    if hint is None:
        raise FrontendError(f"symbolic size {x} has no example value")
    expr = _expr(node.expr, names)
    if expr[0] == "c":
        return int(expr[1])
    return SymInt(int(hint), expr)


def _expr(e: Any, names: Mapping[str, str]) -> Expr:
    # sympy's own predicates and torch's function names: no sympy import (it has no type stubs).
    kind = type(e).__name__
    if e.is_Integer:
        return ("c", int(e))
    if e.is_Symbol:
        return ("s", names.get(e.name, e.name))
    if e.is_Add or e.is_Mul:
        op = "add" if e.is_Add else "mul"
        parts = [_expr(a, names) for a in e.args]
        out = parts[0]
        for p in parts[1:]:
            out = (op, out, p)
        return out
    if kind == "FloorDiv":
        return ("floordiv", _expr(e.args[0], names), _expr(e.args[1], names))
    if kind in ("Mod", "PythonMod"):
        return ("mod", _expr(e.args[0], names), _expr(e.args[1], names))
    raise FrontendError(f"symbolic size {e} ({kind}) has no IR expression")
