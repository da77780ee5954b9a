"""Symbolic sizes: an int that remembers how it was computed from named dims, and the guards it met.

A `SymInt` is an `int` (its value is the example size, the hint every cost decision reads) that also
holds an expression over named symbols (`batch`, `seq`): arithmetic on it (+, -, *, //, %) gives
another SymInt, so a shape computed from the input dims (a Reshape target, a ConstantOfShape size)
keeps saying how it follows from them. A graph built with SymInt sizes is a template: `evaluate`
substitutes other sizes for the symbols. Every comparison a SymInt takes part in (`==`, `<`,
`bool()`...) while a `Guards` recorder is active is recorded with its outcome: a decision taken for
the hint (a dim of 1 broadcasts, a size above a threshold) holds for other sizes only where each
recorded comparison comes out the same, which `Guards.hold` checks.

What is not tracked: `int(x)`, numpy and torch read a SymInt as its plain value, so a size that
passes through them is fixed to the hint without a guard. Whoever instantiates a template must check
that it did not happen where it matters (`frontend/onnx/symbolic.py` re-infers every type and
compares one instantiation with a real conversion before it trusts the template).
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import enum
import operator
from collections.abc import Callable, Iterator, Mapping
from types import MappingProxyType
from typing import Any

# An expression: ("s", name) a symbol, ("c", value) a constant, (op, a, b) an operation on two.
Expr = tuple[Any, ...]

_OPS: dict[str, Callable[[int, int], int]] = {
    "add": operator.add,
    "sub": operator.sub,
    "mul": operator.mul,
    "floordiv": operator.floordiv,
    "mod": operator.mod,
    "min": min,
    "max": max,
}
_CMP: dict[str, Callable[[int, int], bool]] = {
    "eq": operator.eq,
    "ne": operator.ne,
    "lt": operator.lt,
    "le": operator.le,
    "gt": operator.gt,
    "ge": operator.ge,
}
_TEXT = {"add": "+", "sub": "-", "mul": "*", "floordiv": "//", "mod": "%", "min": " min ", "max": " max "}

Guard = tuple[str, Expr, Expr, bool]  # (comparison, left, right, its outcome for the hints)
_recorder: contextvars.ContextVar[set[Guard] | None] = contextvars.ContextVar("af_guards", default=None)
# A decision taken on values other than ints (a cost model's float verdict): the pure function, its
# arguments (holding SymInts) and its outcome for the hints; `Guards` calls it again for other sizes.
Verdict = tuple[Callable[..., Any], tuple[Any, ...], Any]
_verdicts: contextvars.ContextVar[list[Verdict] | None] = contextvars.ContextVar("af_verdicts", default=None)


def expr_of(x: int) -> Expr:
    return x.expr if isinstance(x, SymInt) else ("c", int(x))


def _value(x: int) -> int:
    return int.__int__(x)


class SymInt(int):
    """An int whose value is a hint and whose `expr` says how it follows from named symbols."""

    expr: Expr

    def __new__(cls, value: int, expr: Expr) -> SymInt:
        obj = super().__new__(cls, value)
        obj.expr = expr
        return obj

    @classmethod
    def symbol(cls, name: str, hint: int) -> SymInt:
        return cls(hint, ("s", name))

    def __reduce__(self) -> tuple[Any, ...]:
        return (SymInt, (_value(self), self.expr))

    def __repr__(self) -> str:
        return int.__repr__(self)

    __str__ = __repr__

    def __hash__(self) -> int:
        return int.__hash__(self)

    def describe(self) -> str:
        return text(self.expr)

    # -- arithmetic ---------------------------------------------------------------------------
    def _arith(self, op: str, other: Any, swap: bool) -> Any:
        if isinstance(other, bool) or not isinstance(other, int):
            return getattr(int, f"__{'r' if swap else ''}{op}__")(self, other)
        a, b = (other, self) if swap else (self, other)
        value = _OPS[op](_value(a), _value(b))
        ea, eb = expr_of(a), expr_of(b)
        # The identities that keep the common expressions short (x * 1, x + 0).
        if (op in ("add", "sub") and eb == ("c", 0)) or (op in ("mul", "floordiv") and eb == ("c", 1)):
            return a
        if op in ("add", "mul") and ea == ("c", 0 if op == "add" else 1):
            return b
        if op == "mul" and ("c", 0) in (ea, eb):
            return 0
        return SymInt(value, (op, ea, eb))

    def __add__(self, o: Any) -> Any:
        return self._arith("add", o, False)

    def __radd__(self, o: Any) -> Any:
        return self._arith("add", o, True)

    def __sub__(self, o: Any) -> Any:
        return self._arith("sub", o, False)

    def __rsub__(self, o: Any) -> Any:
        return self._arith("sub", o, True)

    def __mul__(self, o: Any) -> Any:
        return self._arith("mul", o, False)

    def __rmul__(self, o: Any) -> Any:
        return self._arith("mul", o, True)

    def __floordiv__(self, o: Any) -> Any:
        return self._arith("floordiv", o, False)

    def __rfloordiv__(self, o: Any) -> Any:
        return self._arith("floordiv", o, True)

    def __mod__(self, o: Any) -> Any:
        return self._arith("mod", o, False)

    def __rmod__(self, o: Any) -> Any:
        return self._arith("mod", o, True)

    def __neg__(self) -> Any:
        return SymInt(-_value(self), ("sub", ("c", 0), self.expr))

    def __pos__(self) -> SymInt:
        return self

    # -- comparisons (recorded as guards) ---------------------------------------------------
    def _cmp(self, op: str, other: Any) -> Any:
        if isinstance(other, bool) or not isinstance(other, int):
            return getattr(int, f"__{op}__")(self, other)
        result = _CMP[op](_value(self), _value(other))
        guards = _recorder.get()
        if guards is not None:
            guards.add((op, self.expr, expr_of(other), result))
        return result

    def __eq__(self, o: object) -> Any:
        return self._cmp("eq", o)

    def __ne__(self, o: object) -> Any:
        return self._cmp("ne", o)

    def __lt__(self, o: Any) -> Any:
        return self._cmp("lt", o)

    def __le__(self, o: Any) -> Any:
        return self._cmp("le", o)

    def __gt__(self, o: Any) -> Any:
        return self._cmp("gt", o)

    def __ge__(self, o: Any) -> Any:
        return self._cmp("ge", o)

    def __bool__(self) -> bool:
        return bool(self._cmp("ne", 0))


def _pick(op: str, a: int, b: int) -> int:
    if not isinstance(a, SymInt) and not isinstance(b, SymInt):
        return int(_OPS[op](a, b))
    return SymInt(_OPS[op](_value(a), _value(b)), (op, expr_of(a), expr_of(b)))


def sym_min(a: int, b: int) -> int:
    """min(a, b) taking no guard: for SymInts a SymInt that is the smaller one for every size (a
    choice that only sizes a tiling, re-derived for other sizes instead of compared as a guard)."""
    return _pick("min", a, b)


def sym_max(a: int, b: int) -> int:
    """max(a, b) taking no guard (`sym_min`)."""
    return _pick("max", a, b)


def evaluate_expr(expr: Expr, env: Mapping[str, int]) -> int:
    kind = expr[0]
    if kind == "c":
        return int(expr[1])
    if kind == "s":
        return int(env[expr[1]])
    return _OPS[kind](evaluate_expr(expr[1], env), evaluate_expr(expr[2], env))


def text(expr: Expr) -> str:
    kind = expr[0]
    if kind in ("c", "s"):
        return str(expr[1])
    return f"({text(expr[1])}{_TEXT[kind]}{text(expr[2])})"


def symbols(expr: Expr) -> set[str]:
    if expr[0] == "s":
        return {expr[1]}
    if expr[0] == "c":
        return set()
    return symbols(expr[1]) | symbols(expr[2])


def is_symbolic(x: Any) -> bool:
    return isinstance(x, SymInt)


def evaluate(x: Any, env: Mapping[str, int], on: Callable[[Any], Any] | None = None) -> Any:
    """`x` with every SymInt replaced by its value under `env`: ints, tuples and lists, and dataclass-like
    objects through `on` (called for any other object, returning it changed or as it is)."""
    if isinstance(x, SymInt):
        return evaluate_expr(x.expr, env)
    if isinstance(x, tuple):
        return tuple(evaluate(v, env, on) for v in x)
    if isinstance(x, list):
        return [evaluate(v, env, on) for v in x]
    return x if on is None else on(x)


def contains_symbol(x: Any) -> bool:
    if isinstance(x, SymInt):
        return True
    if isinstance(x, (tuple, list)):
        return any(contains_symbol(v) for v in x)
    return False


class Guards:
    """The comparisons recorded while a template was built, and whether other sizes keep them."""

    def __init__(self) -> None:
        self.recorded: set[Guard] = set()
        self.verdicts: list[Verdict] = []  # `verdict` calls: re-evaluated, not compared as expressions
        self._static: dict[int, Any] = {}  # what the verdicts' arguments hold that no size reaches

    @contextlib.contextmanager
    def recording(self) -> Iterator[None]:
        token = _recorder.set(self.recorded)
        vtoken = _verdicts.set(self.verdicts)
        try:
            yield
        finally:
            _verdicts.reset(vtoken)
            _recorder.reset(token)

    def failing(self, env: Mapping[str, int]) -> Guard | None:
        """The first recorded comparison that comes out otherwise under `env`, or None when all hold."""
        for guard in sorted(self.recorded, key=repr):
            op, a, b, result = guard
            if _CMP[op](evaluate_expr(a, env), evaluate_expr(b, env)) != result:
                return guard
        return None

    def failing_verdict(
        self, env: Mapping[str, int], memo: dict[int, tuple[Any, Any]] | None = None
    ) -> str | None:
        """The first recorded verdict that another call gives under `env` (its function's name and both
        outcomes), or None when all hold. Comparisons made inside are not recorded. `memo`: the
        substitution memo of a caller that substitutes more for `env` (`substitute`)."""
        memo = {} if memo is None else memo
        with unrecorded():
            for fn, args, result in self.verdicts:
                now = substitute(args, env, memo, static=self._static)
                if now is args:
                    continue  # no size of `env` reaches it
                again = fn(*now)
                if again != result:
                    return f"{getattr(fn, '__name__', fn)} gives {again!r} (for the hints: {result!r})"
        return None

    def hold(self, env: Mapping[str, int]) -> bool:
        return self.failing(env) is None and self.failing_verdict(env) is None

    def __len__(self) -> int:
        return len(self.recorded) + len(self.verdicts)


@contextlib.contextmanager
def unrecorded() -> Iterator[None]:
    """Comparisons inside are not guards (checks against facts that hold for every size anyway)."""
    token = _recorder.set(None)
    vtoken = _verdicts.set(None)
    try:
        yield
    finally:
        _verdicts.reset(vtoken)
        _recorder.reset(token)


def recording() -> bool:
    """Is a `Guards` recorder active (a plan made once for many sizes)?"""
    return _recorder.get() is not None


def verdict(fn: Callable[..., Any], *args: Any) -> Any:
    """`fn(*args)`, recorded as a guard while a recorder is active: a decision on floats computed from
    sizes (a cost model's net benefit against a threshold) is not a comparison of SymInts, so the
    recorder keeps the call itself, and `Guards.failing_verdict` calls `fn` again on the arguments
    evaluated for other sizes. `fn` must be pure and its result comparable with `==` and free of sizes
    (an order, a bool). The comparisons `fn` makes are not recorded: the verdict stands for them all
    (a sort whose order is the same for other sizes holds, whichever ties its keys meet)."""
    verdicts = _verdicts.get()
    if verdicts is None:
        return fn(*args)
    with unrecorded():
        result = fn(*args)
    verdicts.append((fn, args, result))
    return result


_ATOMS = (int, float, complex, str, bytes, bool, type(None), enum.Enum, type)
_FIELDS: dict[type, tuple[str, ...] | None] = {}  # per class: the attributes `substitute` walks


def substitute(
    x: Any, env: Mapping[str, int], memo: dict[int, tuple[Any, Any]] | None = None, rehint: bool = False,
    static: dict[int, Any] | None = None,
) -> Any:  # fmt: skip
    """`x` with every SymInt inside replaced by its value under `env` (with `rehint`, by a SymInt of the
    same expression holding that value as its hint: the same template, for other hints): through
    tuples, lists, dicts, sets and mapping proxies, and through dataclasses (a new instance with its
    fields substituted, made without running `__init__` or `__post_init__`: the fields were normalised
    once already) and other objects with `__slots__`. An object nothing inside of changes is returned
    itself, so shared structure stays shared and what holds no size (tensors, profiles, functions) is
    never copied. `memo` (by object identity) keeps one copy per object across calls; `static`, kept by
    a caller that substitutes the same objects for many sizes, remembers those that hold no SymInt
    (by identity, holding them alive), so later walks skip them."""
    if memo is None:
        memo = {}
    key = id(x)
    hit = memo.get(key)
    if hit is not None and hit[0] is x:
        return hit[1]
    if isinstance(x, SymInt):
        # One evaluation per SymInt object: a plan's sizes are shared by many of its records.
        value = evaluate_expr(x.expr, env)
        out: Any = SymInt(value, x.expr) if rehint else value
        memo[key] = (x, out)
        return out
    if isinstance(x, _ATOMS):
        return x
    if static is not None and key in static:
        return x
    out = _substitute(x, env, memo, rehint, static)
    memo[key] = (x, out)  # the original is kept alive, so its id is not reused during the walk
    if out is x and static is not None:
        static[key] = x  # nothing inside is a SymInt (one would have made a new object)
    return out


def _fields(cls: type, x: Any) -> tuple[str, ...] | None:
    names = _FIELDS.get(cls, ())
    if names != ():
        return names
    if dataclasses.is_dataclass(x):
        found: tuple[str, ...] | None = tuple(f.name for f in dataclasses.fields(x))
    elif "__slots__" in cls.__dict__ and not hasattr(x, "__dict__"):
        found = tuple(n for c in cls.__mro__ for n in c.__dict__.get("__slots__", ()))
    else:
        found = None
    _FIELDS[cls] = found
    return found


def _substitute(x: Any, env: Mapping[str, int], memo: dict[int, tuple[Any, Any]], rehint: bool,
                static: dict[int, Any] | None) -> Any:  # fmt: skip
    if isinstance(x, (tuple, list, set, frozenset)):
        items = [substitute(v, env, memo, rehint, static) for v in x]
        if all(a is b for a, b in zip(items, x, strict=True)):
            return x
        if isinstance(x, tuple) and hasattr(x, "_fields"):  # a NamedTuple
            return type(x)(*items)
        return type(x)(items)
    if isinstance(x, (dict, MappingProxyType)):
        pairs = [(substitute(k, env, memo, rehint, static), substitute(v, env, memo, rehint, static))
                 for k, v in x.items()]  # fmt: skip
        if all(k is a and v is b for (k, v), (a, b) in zip(pairs, x.items(), strict=True)):
            return x
        out = dict(pairs)
        return MappingProxyType(out) if isinstance(x, MappingProxyType) else type(x)(out)
    cls = type(x)
    names = _fields(cls, x)
    if names is None:
        return x
    names = tuple(n for n in names if hasattr(x, n))
    values = [getattr(x, n) for n in names]
    new = [substitute(v, env, memo, rehint, static) for v in values]
    if all(a is b for a, b in zip(new, values, strict=True)):
        return x
    obj = object.__new__(cls)
    if hasattr(x, "__dict__"):
        obj.__dict__.update(x.__dict__)
    for n, v in zip(names, new, strict=True):
        object.__setattr__(obj, n, v)
    return obj


def guard_text(guard: Guard) -> str:
    op, a, b, result = guard
    sign = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}[op]
    return f"{text(a)} {sign} {text(b)} is {result}"
