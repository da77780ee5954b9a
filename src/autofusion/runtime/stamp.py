"""`Stamp`: whether a fixed set of an executor's inputs (the model's parameters and buffers) are the very
tensors of the previous call, unchanged, in one comparison.

In: the input positions to watch; per call, the call's inputs. Out: `same(inputs)`, True when every
watched input is the same tensor object as at the last `take`, at the same data address and version
counter; `take(inputs)` records them for a call that does the full per-parameter work.

Why: a decode step binds ~20 parameters per call and a CNN 100-300; checking each one's identity and
version in a Python loop, and writing each one's address into the entry's pointer array, costs
microseconds per tensor on a call whose kernels take well under a millisecond. Here the ids, addresses
and versions are read by `map` over the tuple (no Python frame per tensor) and compared as tuples.

What counts as a change: a different tensor object (a parameter re-assigned, `load_state_dict(...,
assign=True)`), a different data address (`p.data = other` keeps the object and its version counter),
or a new version (any in-place update under `no_grad`, an optimizer step, `load_state_dict` copying in
place). Tensors made under `torch.inference_mode()` have no version counter: with one among them
`same` is never True, so every call takes the full path (as the executors do without a stamp). The
previous tensors are held weakly, so a replaced parameter is freed as usual; once one of them is gone
(its id free for another object) `same` is False until the next `take`.
"""

from __future__ import annotations

import operator
import weakref
from collections.abc import Callable, Sequence

import torch

_address = torch.Tensor.data_ptr
_version = operator.attrgetter("_version")

State = tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]


class Stamp:
    __slots__ = ("_alive", "_pick", "_refs", "_state")

    def __init__(self, positions: Sequence[int]) -> None:
        pick = [*positions]
        self._pick: Callable[[Sequence[torch.Tensor]], tuple[torch.Tensor, ...]]
        if len(pick) == 1:
            (only,) = pick
            self._pick = lambda xs: (xs[only],)
        elif pick:
            self._pick = operator.itemgetter(*pick)
        else:
            self._pick = lambda xs: ()
        self._state: State | None = None
        # Identity as `id`s: sound while every tensor of the last `take` lives (an id is reused only
        # once its object is gone), which the references' callbacks report by clearing `_alive[0]`.
        self._alive = [False]
        self._refs: list[weakref.ReferenceType[torch.Tensor]] = []

    @staticmethod
    def _read(ts: tuple[torch.Tensor, ...]) -> State | None:
        try:
            return tuple(map(id, ts)), tuple(map(_address, ts)), tuple(map(_version, ts))
        except (RuntimeError, TypeError):  # an inference tensor (no version counter), or not a tensor
            return None

    def same(self, inputs: Sequence[torch.Tensor]) -> bool:
        return self._alive[0] and self._read(self._pick(inputs)) == self._state

    def take(self, inputs: Sequence[torch.Tensor]) -> None:
        ts = self._pick(inputs)
        self._state = self._read(ts)
        alive = self._alive = [self._state is not None]

        def gone(_: object) -> None:
            alive[0] = False

        self._refs = [weakref.ref(t, gone) for t in ts] if alive[0] else []

    def clear(self) -> None:
        """Forget the last call's tensors (the next `same` is False)."""
        self._state, self._refs, self._alive = None, [], [False]
