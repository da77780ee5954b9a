"""The condition language of rule files: a small, safe expression language (no eval).

In: text such as `linear_out.shape == residual.shape and x.shape[-1] % 8 == 0`.
Out: an `Expr` tree, parsed once when the rule file loads; `evaluate(tree, bindings)` runs it against
the tensor types a match bound to each name.

Grammar (precedence low to high):
    expr    := and ('or' and)*
    and     := not ('and' not)*
    not     := 'not' not | compare
    compare := sum (('=='|'!='|'<'|'<='|'>'|'>=') sum)*      chained as in Python
    sum     := product (('+'|'-') product)*
    product := unary (('*'|'//'|'%') unary)*
    unary   := '-' unary | postfix
    postfix := atom ('.' NAME | '[' expr ']')*
    atom    := INT | FLOAT | STRING | true | false | NAME | '(' expr ')' | '[' expr, ... ']'
             | 'len' '(' expr ')'
A NAME is a name the pattern binds (a tensor); its attributes are shape, dtype (the IR dtype name, e.g.
"float32"), rank, numel and contiguous. Tuples index with negative indices as in Python.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from autofusion.ir.dtypes import DType
from autofusion.ir.types import TensorType

ATTRIBUTES = ("shape", "dtype", "rank", "numel", "contiguous")
_TOKEN = re.compile(
    r"\s*(?:(?P<num>\d+\.\d*(?:[eE][-+]?\d+)?|\d+(?:[eE][-+]?\d+)?)|(?P<str>\"[^\"]*\"|'[^']*')"
    r"|(?P<name>[A-Za-z_][A-Za-z0-9_]*)|(?P<op>==|!=|<=|>=|//|[<>+\-*%()\[\].,]))"
)


class ExprError(ValueError):
    """A condition does not parse or names something the pattern does not bind."""


@dataclass(frozen=True)
class Expr:
    # "lit" | "name" | "attr" | "index" | "list" | "len" | "neg" | "not" | "bin" | "cmp" | "and" | "or"
    kind: str
    args: tuple[Any, ...]
    text: str = ""

    def names(self) -> set[str]:
        if self.kind == "name":
            return {self.args[0]}
        out: set[str] = set()
        for a in self.args:
            if isinstance(a, Expr):
                out |= a.names()
            elif isinstance(a, tuple):
                for b in a:
                    if isinstance(b, Expr):
                        out |= b.names()
        return out


def _tokens(text: str) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    pos = 0
    text = text.rstrip()
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if not m or m.end() == pos:
            raise ExprError(f"cannot read {text[pos:]!r} (at column {pos + 1})")
        kind = m.lastgroup or ""
        out.append((kind, m.group(kind)))
        pos = m.end()
    out.append(("end", ""))
    return out


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.toks = _tokens(text)
        self.i = 0

    def peek(self) -> tuple[str, str]:
        return self.toks[self.i]

    def take(self, value: str | None = None) -> tuple[str, str]:
        tok = self.toks[self.i]
        if value is not None and tok[1] != value:
            got = tok[1] or "end of condition"
            raise ExprError(f"expected {value!r}, got {got!r} in {self.text!r}")
        self.i += 1
        return tok

    def at(self, *values: str) -> bool:
        kind, v = self.peek()
        return kind in ("op", "name") and v in values

    def parse(self) -> Expr:
        e = self.or_()
        if self.peek()[0] != "end":
            raise ExprError(f"unexpected {self.peek()[1]!r} in {self.text!r}")
        return e

    def or_(self) -> Expr:
        e = self.and_()
        while self.at("or"):
            self.take()
            e = Expr("or", (e, self.and_()))
        return e

    def and_(self) -> Expr:
        e = self.not_()
        while self.at("and"):
            self.take()
            e = Expr("and", (e, self.not_()))
        return e

    def not_(self) -> Expr:
        if self.at("not"):
            self.take()
            return Expr("not", (self.not_(),))
        return self.compare()

    def compare(self) -> Expr:
        first = self.sum()
        ops, rest = [], []
        while self.at("==", "!=", "<", "<=", ">", ">="):
            ops.append(self.take()[1])
            rest.append(self.sum())
        return Expr("cmp", (first, tuple(ops), tuple(rest))) if ops else first

    def sum(self) -> Expr:
        e = self.product()
        while self.at("+", "-"):
            op = self.take()[1]
            e = Expr("bin", (op, e, self.product()))
        return e

    def product(self) -> Expr:
        e = self.unary()
        while self.at("*", "//", "%"):
            op = self.take()[1]
            e = Expr("bin", (op, e, self.unary()))
        return e

    def unary(self) -> Expr:
        if self.at("-"):
            self.take()
            return Expr("neg", (self.unary(),))
        return self.postfix()

    def postfix(self) -> Expr:
        e = self.atom()
        while self.at(".", "["):
            if self.take()[1] == ".":
                kind, name = self.take()
                if kind != "name" or name not in ATTRIBUTES:
                    raise ExprError(
                        f"unknown attribute {name!r} in {self.text!r}; use one of {', '.join(ATTRIBUTES)}"
                    )
                e = Expr("attr", (e, name))
            else:
                idx = self.or_()
                self.take("]")
                e = Expr("index", (e, idx))
        return e

    def atom(self) -> Expr:
        kind, v = self.take()
        if kind == "num":
            return Expr("lit", (float(v) if any(c in v for c in ".eE") else int(v),))
        if kind == "str":
            return Expr("lit", (v[1:-1],))
        if kind == "name":
            if v in ("true", "True"):
                return Expr("lit", (True,))
            if v in ("false", "False"):
                return Expr("lit", (False,))
            if v in ("and", "or", "not"):
                raise ExprError(f"unexpected {v!r} in {self.text!r}")
            if v == "len" and self.at("("):
                self.take("(")
                inner = self.or_()
                self.take(")")
                return Expr("len", (inner,))
            return Expr("name", (v,))
        if v == "(":
            e = self.or_()
            self.take(")")
            return e
        if v == "[":
            items: list[Expr] = []
            while not self.at("]"):
                items.append(self.or_())
                if not self.at("]"):
                    self.take(",")
            self.take("]")
            return Expr("list", tuple(items))
        raise ExprError(f"unexpected {v or 'end of condition'!r} in {self.text!r}")


def parse(text: str) -> Expr:
    if not isinstance(text, str) or not text.strip():
        raise ExprError(f"a condition must be a non-empty string, got {text!r}")
    e = _Parser(text).parse()
    return Expr(e.kind, e.args, text)


class EvalError(ValueError):
    pass


def _attr(t: Any, name: str) -> Any:
    if not isinstance(t, TensorType):
        raise EvalError(f".{name} of a non-tensor {t!r}")
    if name == "shape":
        return tuple(t.shape)
    if name == "dtype":
        return t.dtype.name if isinstance(t.dtype, DType) else str(t.dtype)
    if name == "rank":
        return t.rank
    if name == "numel":
        return t.numel
    return t.is_contiguous


_CMP = {
    "==": lambda a, b: a == b,
    "!=": lambda a, b: a != b,
    "<": lambda a, b: a < b,
    "<=": lambda a, b: a <= b,
    ">": lambda a, b: a > b,
    ">=": lambda a, b: a >= b,
}


def evaluate(e: Expr, env: dict[str, Any]) -> Any:
    k, a = e.kind, e.args
    if k == "lit":
        return a[0]
    if k == "name":
        if a[0] not in env:
            raise EvalError(f"{a[0]!r} is not bound")
        return env[a[0]]
    if k == "attr":
        return _attr(evaluate(a[0], env), a[1])
    if k == "index":
        seq, idx = evaluate(a[0], env), evaluate(a[1], env)
        if not isinstance(seq, tuple) or not isinstance(idx, int) or not -len(seq) <= idx < len(seq):
            raise EvalError(f"index {idx!r} out of range for {seq!r}")
        return seq[idx]
    if k == "list":
        return tuple(evaluate(x, env) for x in a)
    if k == "len":
        v = evaluate(a[0], env)
        if not isinstance(v, tuple):
            raise EvalError(f"len of {v!r}")
        return len(v)
    if k == "neg":
        return -_number(evaluate(a[0], env))
    if k == "not":
        return not evaluate(a[0], env)
    if k == "and":
        return bool(evaluate(a[0], env)) and bool(evaluate(a[1], env))
    if k == "or":
        return bool(evaluate(a[0], env)) or bool(evaluate(a[1], env))
    if k == "bin":
        op, x, y = a[0], _number(evaluate(a[1], env)), _number(evaluate(a[2], env))
        if op in ("//", "%") and y == 0:
            raise EvalError("division by zero")
        return (
            {"+": x + y, "-": x - y, "*": x * y}.get(op) if op in "+-*" else (x // y if op == "//" else x % y)
        )
    if k == "cmp":
        left = evaluate(a[0], env)
        for op, r in zip(a[1], a[2], strict=True):
            right = evaluate(r, env)
            try:
                if not _CMP[op](left, right):
                    return False
            except TypeError as err:
                raise EvalError(f"cannot compare {left!r} {op} {right!r}") from err
            left = right
        return True
    raise EvalError(f"bad expression node {k}")


def _number(v: Any) -> int | float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise EvalError(f"{v!r} is not a number")
    return v
