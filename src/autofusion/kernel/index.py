"""Index expressions over a kernel's iteration dims.

An `Ix` is either affine, `const + sum(coeff_d * i_d)`, or opaque: a C++ expression that depends on
some dims (used for gathers and for clamped concat/pad indices). Loads and stores address buffers
with one `Ix` (the element offset). Affine offsets are what lets the loop builder merge adjacent
dims and hand the compiler unit-stride inner loops.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Ix:
    """An index expression: a linear combination of loop dims plus a constant, or opaque C++."""

    coeffs: tuple[tuple[int, int], ...] = ()  # (dim, coefficient), sorted, no zeros
    const: int = 0
    text: str | None = None  # opaque C++ expression; coeffs/const unused then
    deps: frozenset[int] = frozenset()  # dims an opaque expression depends on

    @staticmethod
    def dim(d: int) -> Ix:
        return Ix(((d, 1),), 0, None, frozenset({d}))

    @staticmethod
    def lit(c: int) -> Ix:
        return Ix((), c)

    @staticmethod
    def opaque(text: str, deps: frozenset[int]) -> Ix:
        return Ix((), 0, text, deps)

    @property
    def is_affine(self) -> bool:
        return self.text is None

    @property
    def dims(self) -> frozenset[int]:
        return frozenset(d for d, _ in self.coeffs) if self.is_affine else self.deps

    def coeff(self, d: int) -> int:
        for k, c in self.coeffs:
            if k == d:
                return c
        return 0

    def __add__(self, other: Ix | int) -> Ix:
        if isinstance(other, int):
            other = Ix.lit(other)
        if self.is_affine and other.is_affine:
            acc = dict(self.coeffs)
            for d, c in other.coeffs:
                acc[d] = acc.get(d, 0) + c
            return Ix(tuple(sorted((d, c) for d, c in acc.items() if c)), self.const + other.const)
        return Ix.opaque(f"({self.render()} + {other.render()})", self.dims | other.dims)

    def scale(self, k: int) -> Ix:
        if k == 1:
            return self
        if self.is_affine:
            return Ix(tuple((d, c * k) for d, c in self.coeffs if c * k), self.const * k)
        return Ix.opaque(f"({self.render()} * {k})", self.deps)

    def render(self, var: str = "i") -> str:
        if not self.is_affine:
            assert self.text is not None
            return self.text
        terms = [f"{var}{d}" if c == 1 else f"{var}{d} * {c}" for d, c in self.coeffs]
        if self.const or not terms:
            terms.append(str(self.const))
        return terms[0] if len(terms) == 1 else "(" + " + ".join(terms) + ")"

    def key(self) -> tuple[object, ...]:
        return (self.coeffs, self.const, self.text)


def broadcast_index(
    index: tuple[Ix, ...], out_shape: tuple[int, ...], in_shape: tuple[int, ...]
) -> tuple[Ix, ...]:
    """Index into an input of `in_shape` broadcast to `out_shape` (numpy rules: align trailing dims)."""
    lead = len(out_shape) - len(in_shape)
    return tuple(
        Ix.lit(0) if s == 1 and out_shape[lead + k] != 1 else index[lead + k] for k, s in enumerate(in_shape)
    )


def offset_of(index: tuple[Ix, ...], strides: tuple[int, ...], base: int) -> Ix:
    """The element offset of `index` in a buffer with `strides`: one pass, no temporary Ix objects
    (this runs for every load of every candidate kernel the planner tries)."""
    acc: dict[int, int] = {}
    const = base
    opaque: list[tuple[Ix, int]] = []
    for ix, st in zip(index, strides, strict=True):
        if st == 0:
            continue
        if ix.text is not None:
            opaque.append((ix, st))
            continue
        const += ix.const * st
        for d, c in ix.coeffs:
            acc[d] = acc.get(d, 0) + c * st
    out = Ix(tuple(sorted((d, c) for d, c in acc.items() if c)), const)
    for ix, st in opaque:
        out = out + ix.scale(st)
    return out
