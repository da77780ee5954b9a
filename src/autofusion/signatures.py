"""Compiled plans kept per input signature, and which input dims a compiled model lets change.

Our IR holds static sizes, so a shape not seen yet is captured and planned for itself (a
specialisation); the generated C++ takes sizes and strides at call time, so plans of shapes with the
same loop structure render the same source and share one built library (the build cache is keyed by
the source). This module holds the two pieces both entry points (`api.CompiledModel` and
`backend.autofusion_backend`) share:

- `SignatureCache`: the plans, bounded and least recently used first out, with counts for stats and
  one INFO line per newly planned signature (a shape that keeps changing is visible in the log).
- `ShapeContract`: the direct API's `dynamic=` argument. It says which dims may change; a call that
  changes any other dim is refused with an InputMismatchError naming the dim, rather than silently
  planned again: the user declared those dims fixed, so another size there is far more likely a bug
  in the caller than a shape to compile for (pass `dynamic=True` to accept any shape).
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from autofusion.errors import InputMismatchError

log = logging.getLogger("autofusion.signatures")

V = TypeVar("V")


class SignatureCache(Generic[V]):
    """Plans by signature, at most `limit` of them; the least recently used is dropped first."""

    def __init__(self, limit: int, owner: str, describe: Callable[[Hashable], str] = str) -> None:
        if limit < 1:
            raise ValueError(f"max_signatures must be >= 1, got {limit}")
        self.limit, self.owner, self.describe = limit, owner, describe
        self._entries: OrderedDict[Hashable, V] = OrderedDict()
        self._lock = threading.Lock()
        self.planned = 0  # signatures planned since the start (evicted ones included)
        self.hits = 0  # lookups that found their plan (the hot path of a caller is not counted)
        self.evicted = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._entries

    def get(self, key: Hashable) -> V | None:
        with self._lock:
            value = self._entries.get(key)
            if value is not None:
                self._entries.move_to_end(key)
                self.hits += 1
            return value

    def put(self, key: Hashable, value: V) -> None:
        with self._lock:
            self._entries[key] = value
            self._entries.move_to_end(key)
            self.planned += 1
            log.info("autofusion: %s: planned a new input signature (%s); %d planned, %d cached",
                     self.owner, self.describe(key), self.planned, len(self._entries))  # fmt: skip
            while len(self._entries) > self.limit:
                old, _ = self._entries.popitem(last=False)
                self.evicted += 1
                log.info("autofusion: %s: dropped the least recently used signature (%s); max_signatures=%d",
                         self.owner, self.describe(old), self.limit)  # fmt: skip

    def values(self) -> list[V]:
        return list(self._entries.values())

    def items(self) -> list[tuple[Hashable, V]]:
        """(signature, plan) pairs, least recently used first."""
        with self._lock:
            return list(self._entries.items())

    def stats(self) -> dict[str, int]:
        return {
            "signatures": len(self._entries),
            "signatures_planned": self.planned,
            "signature_hits": self.hits,
            "signatures_evicted": self.evicted,
        }


@dataclass(frozen=True)
class DynDim:
    """One dim that may change: its name (dims of one name must be equal in a call) and its range."""

    name: str | None
    low: int = 0
    high: int | None = None  # None: no upper bound


def _dyn_dim(value: Any, where: str) -> DynDim | None:
    """A dim of a `dynamic=` spec: a name, a torch.export Dim (or Dim.AUTO/DYNAMIC/STATIC), or None
    (static). Returns None for a static dim."""
    if value is None:
        return None
    if isinstance(value, str):
        return DynDim(value)
    hint = getattr(value, "type", None)
    if type(value).__name__ == "_DimHint" and hint is not None:  # Dim.AUTO, Dim.DYNAMIC, Dim.STATIC
        return None if hint.name == "STATIC" else DynDim(None)
    name = getattr(value, "__name__", None)
    if isinstance(name, str) and hasattr(value, "min") and hasattr(value, "max"):  # torch.export Dim
        high = value.max if isinstance(value.max, int) and value.max < 2**62 else None
        low = value.min if isinstance(value.min, int) else 0
        return DynDim(name, low, high)
    raise ValueError(
        f"dynamic: {where} is a {type(value).__name__}; give a dim name (str), a torch.export Dim or None"
    )


class ShapeContract:
    """Which dims of which inputs may change between calls (the direct API's `dynamic=`).

    `dynamic=None` or True: every dim may change, every new shape is planned (no contract).
    `dynamic=False`: no dim may change from the first signature (the example inputs' shapes).
    A mapping {input name or position: {dim: name or Dim}} or a sequence of per-input dim specs (the
    torch.export `dynamic_shapes` form; None for an input with no dynamic dim): the listed dims may
    change, within a Dim's range, and dims sharing a name must be equal; every other dim, and every
    input's rank, stays as in the first signature. Dtypes are not part of the contract: a call with
    other dtypes is planned for them."""

    def __init__(self, spec: Any, input_names: Sequence[str]) -> None:
        self.any_shape = spec is None or spec is True
        self.dims: dict[int, dict[int, DynDim]] = {}  # input position -> dim -> what it may be
        self.reference: list[tuple[int, ...]] | None = None
        self.names = list(input_names)
        if spec is True or spec is None or spec is False:
            return
        if isinstance(spec, Mapping):
            items = list(spec.items())
        elif isinstance(spec, (list, tuple)):
            items = list(enumerate(spec))
        else:
            raise ValueError(
                f"dynamic must be None, True, False, a mapping or a sequence; got {type(spec).__name__}"
            )
        names = self.names
        for key, per_input in items:
            if isinstance(key, int) and not isinstance(key, bool):
                pos = key
            elif isinstance(key, str) and key in names:
                pos = names.index(key)
            else:
                known = ", ".join(names) if names else "none known before the first call"
                raise ValueError(f"dynamic: no input {key!r} (inputs: {known})")
            if per_input is None:
                continue
            if isinstance(per_input, Mapping):
                dim_items = list(per_input.items())
            elif isinstance(per_input, (list, tuple)):
                dim_items = list(enumerate(per_input))
            else:
                raise ValueError(f"dynamic: input {key!r} needs a {{dim: name}} mapping, "
                                 f"got {type(per_input).__name__}")  # fmt: skip
            for d, v in dim_items:
                dyn = _dyn_dim(v, f"input {key!r} dim {d}")
                if dyn is not None:
                    self.dims.setdefault(pos, {})[int(d)] = dyn

    @property
    def active(self) -> bool:
        return not self.any_shape

    def fix(self, shapes: Sequence[Sequence[int]]) -> None:
        """The first signature's shapes: what the static dims must keep (checked against the spec)."""
        if not self.active or self.reference is not None:
            return
        ref = [tuple(s) for s in shapes]
        for pos, dims in self.dims.items():
            if pos >= len(ref):
                raise ValueError(f"dynamic: input {pos} given, but the model takes {len(ref)} input(s)")
            for d in dims:
                if not -len(ref[pos]) <= d < len(ref[pos]):
                    raise ValueError(
                        f"dynamic: input {self._label(pos)} has rank {len(ref[pos])}, no dim {d}"
                    )
        self.dims = {p: {d % len(ref[p]): v for d, v in dims.items()} for p, dims in self.dims.items()}
        self.check(ref, fixing=True)
        self.reference = ref

    def check(self, shapes: Sequence[Sequence[int]], fixing: bool = False) -> None:
        """InputMismatchError when `shapes` break the contract (a static dim or a rank changed, a dim
        outside its range, two dims of one name differ)."""
        if not self.active:
            return
        ref = self.reference
        seen: dict[str, tuple[int, str]] = {}
        for pos, shape in enumerate(shapes):
            label = self._label(pos)
            dyn = self.dims.get(pos, {})
            if ref is not None and not fixing:
                if pos >= len(ref):
                    break  # the arity is the source's to check
                if len(shape) != len(ref[pos]):
                    raise InputMismatchError(
                        f"input {label} has rank {len(shape)}; it was compiled with rank {len(ref[pos])} "
                        f"{list(ref[pos])} and `dynamic=` fixes the rank"
                    )
                for d, (n, r) in enumerate(zip(shape, ref[pos], strict=True)):
                    if d not in dyn and n != r:
                        raise InputMismatchError(
                            f"input {label} dim {d} is {n}; it is static (compiled for {r}). Declare it in "
                            f"dynamic= (e.g. {{{label!r}: {{{d}: 'name'}}}}) or pass dynamic=True"
                        )
            for d, spec in dyn.items():
                n = shape[d]
                if n < spec.low or (spec.high is not None and n > spec.high):
                    high = "inf" if spec.high is None else spec.high
                    raise InputMismatchError(f"input {label} dim {d} is {n}, outside the range "
                                             f"[{spec.low}, {high}] of dim {spec.name!r}")  # fmt: skip
                if spec.name is not None:
                    other = seen.setdefault(spec.name, (n, f"input {label} dim {d}"))
                    if other[0] != n:
                        raise InputMismatchError(
                            f"input {label} dim {d} is {n} but {other[1]} is {other[0]}; "
                            f"both are dim {spec.name!r}, so they must be equal"
                        )

    def _label(self, pos: int) -> str:
        return self.names[pos] if pos < len(self.names) else str(pos)
