"""Runs a frozen plan: the parameter-only part (`passes/freeze.py`) once per parameter version, then the plan.

In: a `FoldSplit` and the executor of its main graph. Out: an executor called with the original graph's
inputs. Each call compares the fold's source tensors (parameters and buffers, read live by the caller)
with those the folded values were computed from, by identity, address and `_version`; on any difference (a new
parameter assigned, `load_state_dict`, an in-place update, an optimizer step) the fold runs again before
the plan does, so a result never comes from a stale weight. Folded values are stored in the library
fold cache (`library.FOLDS`, one entry per executor: the previous version's values are dropped when the
new ones are stored, and the entry goes when a source tensor is freed or this executor is).

Tensors made under `torch.inference_mode()` have no version counter: an in-place change to one cannot
be seen (torch cannot see it either), so their folds last until a different tensor is bound.
"""

from __future__ import annotations

import itertools
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import torch

from autofusion.ir.folded import FoldSplit
from autofusion.ir.interpret import run_graph
from autofusion.runtime.buffers import owned, storages, to_layout
from autofusion.runtime.library import FOLDS

_TOKENS = itertools.count()


def _version(t: torch.Tensor) -> tuple[int, int]:
    # The address too: `p.data = other` gives the same tensor object new memory but keeps its version.
    return t.data_ptr(), -1 if t.is_inference() else t._version


class FoldedExecutor:
    """`fold_runs` counts how often the parameter-only part was computed (tests prove it ran once)."""

    def __init__(self, split: FoldSplit, inner: Any) -> None:
        self.split = split
        self.inner = inner
        self.poison = inner.poison
        self.fold_runs = 0
        self._tag = ("freeze", next(_TOKENS))
        self._sources = split.fold_inputs
        n_in = len(split.graph.inputs) - len(split.fold.outputs)
        self._types = [gi.value.type for gi in split.graph.inputs[n_in:]]
        # The last folded values and the sources they came from (weak: a replaced parameter may go).
        self._last: (
            tuple[list[weakref.ReferenceType[torch.Tensor]], list[tuple[int, int]], tuple[torch.Tensor, ...]]
            | None
        )
        self._last = None
        self._internal: frozenset[int] = frozenset()
        self._check = list(range(len(split.graph.outputs)))
        weakref.finalize(self, FOLDS.discard, self._tag)

    @property
    def generated_calls(self) -> int:
        return int(self.inner.generated_calls)

    def __getattr__(self, name: str) -> Any:
        # What tools read of the executor (calls_per_run, prepacked, scratch buffers) is the inner one's.
        if name == "inner":  # not set yet (unpickling, a failed __init__): no recursion
            raise AttributeError(name)
        return getattr(self.inner, name)

    def _compute(self, sources: list[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        self.fold_runs += 1
        values = run_graph(self.split.fold, sources)
        # In the layout the plan was compiled for, detached from the sources' storage only where copied.
        return tuple(to_layout(v, t) for v, t in zip(values, self._types, strict=True))

    def folded(self, inputs: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        """The folded values for these inputs: the stored ones while every source is the same tensor
        at the same version, else computed afresh."""
        sources = [inputs[i] for i in self._sources]
        last = self._last
        if last is not None:
            refs, versions, values = last
            for r, v, t in zip(refs, versions, sources, strict=True):
                if r() is not t or _version(t) != v:
                    break
            else:
                return values
        values = FOLDS.get(self._tag, list(sources), lambda: self._compute(sources), single=True)
        self._internal = storages(values)
        self._last = ([weakref.ref(t) for t in sources], [_version(t) for t in sources], values)
        return values

    def current(self, inputs: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...] | None:
        """The folded values when they were computed from exactly these inputs' sources, each the same
        tensor at the same version now (what a package may store in place of computing them again)."""
        last = self._last
        if last is None:
            return None
        refs, versions, values = last
        for r, v, i in zip(refs, versions, self._sources, strict=True):
            if r() is not inputs[i] or _version(inputs[i]) != v:
                return None
        return values

    def seed(self, inputs: Sequence[torch.Tensor], values: Sequence[torch.Tensor]) -> None:
        """Take `values` as the folded values of these inputs' sources at their present versions (a
        package's stored ones, computed from the same weights when it was saved); a source changed or
        replaced later makes `folded` compute them again, as after any call."""
        if len(values) != len(self._types):
            raise ValueError(f"{len(values)} folded values given; the plan takes {len(self._types)}")
        sources = [inputs[i] for i in self._sources]
        kept = tuple(to_layout(v, t) for v, t in zip(values, self._types, strict=True))
        self._internal = storages(kept)
        self._last = ([weakref.ref(t) for t in sources], [_version(t) for t in sources], kept)

    def steady(
        self, fixed: Sequence[int]
    ) -> Callable[[Sequence[torch.Tensor], bool], list[torch.Tensor]] | None:
        """As `SuperExecutor.steady`: a run taking (inputs, same), where `same` says the inputs at
        positions `fixed` are the tensors of the caller's previous call, unchanged. With `same` the
        folded values of that call are taken without checking their sources again (every source is
        among `fixed`), and the inner executor is told its parameters are unchanged. None where the
        inner executor has no such run or a source is not among `fixed`."""
        make = getattr(self.inner, "steady", None)
        if make is None or not set(self._sources) <= set(fixed):
            return None
        n_in = len(self.split.graph.inputs) - len(self._types)
        inner = make([*fixed, *range(n_in, n_in + len(self._types))])
        # An inner fast path writes every output into a pool buffer: none can be a folded value.
        pooled = bool(getattr(self.inner, "outputs_pooled", False))
        seen: list[object] = [None]  # the `_last` the previous steady call used

        def run(inputs: Sequence[torch.Tensor], same: bool) -> list[torch.Tensor]:
            last = self._last
            if same and last is not None and last is seen[0]:
                values = last[2]
            else:
                values, same = self.folded(inputs), False
                seen[0] = self._last
            result = inner([*inputs, *values], same)
            return result if pooled else owned(result, self._internal, self._check)

        return run

    def run(self, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        values = self.folded(inputs)
        result = self.inner.run([*inputs, *values])
        # A result that is (a view of) a folded value would let the caller change it for later calls.
        return owned(result, self._internal, self._check)
