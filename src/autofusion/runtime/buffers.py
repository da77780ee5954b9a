"""Buffers the executors hand to generated code: caller-owned outputs, layouts, poison.

- `OutputPool`: output buffers handed to the caller, reused only once the caller let go of them.
- `to_layout`: a tensor in the layout a kernel was compiled for (copied only when it is not).
- `poison_`: fill a buffer with a value no correct kernel leaves behind (NaN for floats, a byte
  pattern for integers, True for bools). With `Options.poison` every buffer a kernel writes is
  poisoned before each run, so an element a kernel forgot to write shows up in the result.
- `owned`: the policy that no graph output may share storage with a buffer the executor reuses.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Iterable, Sequence

import torch

from autofusion.ir.types import TensorType, strides_match

# 0x5A in every byte: a value no test expects by chance, and recognisable in a dump.
_INT_PATTERN = 0x5A


def sentinel(dtype: torch.dtype) -> float | int | bool:
    """The poison value of `dtype`."""
    if dtype == torch.bool:
        return True
    if dtype.is_floating_point or dtype.is_complex:
        return math.nan
    # 0x5A < 0x80, so the pattern is a positive value for signed types too
    return int.from_bytes(bytes([_INT_PATTERN]) * (torch.iinfo(dtype).bits // 8), "little")


def poison_(t: torch.Tensor) -> torch.Tensor:
    """Fill `t` (in place) with its dtype's poison value; returns `t`."""
    if t.numel():
        t.fill_(sentinel(t.dtype))
    return t


def fresh(shape: Sequence[int], strides: Sequence[int], dtype: torch.dtype, poison: bool) -> torch.Tensor:
    out = torch.empty_strided(tuple(shape), tuple(strides), dtype=dtype)
    return poison_(out) if poison else out


class OutputPool:
    """Output buffers handed to the caller, reused once the caller has let go of them.

    A fresh 64 MiB tensor costs ~29 ms of page faults here, more than a fused kernel takes to fill
    it. So each graph output keeps up to `keep` buffers; one is reused only when no Python reference
    (ours aside) and no view of its storage is left, i.e. the caller dropped the previous result.
    Otherwise a fresh tensor is allocated, so results a caller still holds are never overwritten.
    """

    def __init__(self, shape: tuple[int, ...], dtype: torch.dtype, keep: int = 2,
                 poison: bool = False) -> None:  # fmt: skip
        self.shape, self.dtype, self.keep, self.poison = shape, dtype, keep, poison
        self.items: list[torch.Tensor] = []
        self.idle: list[tuple[int, int]] = []  # reference counts while only the pool holds each buffer

    def _get(self) -> torch.Tensor:
        # The counts are taken in the same frame shape where recorded (the list, `item`, the argument),
        # the reference count first: it is the cheaper of the two and the one a caller's result holds.
        items, idle = self.items, self.idle
        for i in range(len(items)):
            item = items[i]
            refs, uses = idle[i]
            if (
                sys.getrefcount(item) == refs
                and torch._C._storage_Use_Count(item.untyped_storage()._cdata) == uses
            ):
                return item
        if len(items) >= self.keep or not math.prod(self.shape):
            return torch.empty(self.shape, dtype=self.dtype)
        item = torch.empty(self.shape, dtype=self.dtype)
        items.append(item)
        idle.append((sys.getrefcount(item), torch._C._storage_Use_Count(item.untyped_storage()._cdata)))
        return item

    def get(self) -> torch.Tensor:
        out = self._get()
        return poison_(out) if self.poison else out


def to_layout(x: torch.Tensor, t: TensorType) -> torch.Tensor:
    """`x` in the layout `t` describes (the one a kernel indexes): `x` itself when its strides agree
    wherever strides matter, else a copy in that layout (never a reinterpretation of x's bytes)."""
    if strides_match(t.shape, tuple(x.stride()), t.strides):
        return x
    return torch.empty_strided(t.shape, t.strides, dtype=x.dtype).copy_(x)


def storages(tensors: Iterable[object]) -> frozenset[int]:
    """The storage addresses of the tensors among `tensors` (what `owned` compares against)."""
    return frozenset(
        t.untyped_storage().data_ptr() for t in tensors if isinstance(t, torch.Tensor) and t.numel()
    )


def owned(outputs: list[torch.Tensor], internal: frozenset[int], check: Sequence[int]) -> list[torch.Tensor]:
    """`outputs` with every one at a position in `check` whose storage is memory the executor keeps
    (`internal`: the storage addresses of its reused buffers and of the graph's constants) replaced by
    a copy the caller owns.

    The executors plan their buffers so that reused ones are never found here (values a graph output
    may be a view of get caller-owned buffers); this is the guarantee for ops whose aliasing the
    planner cannot see (an extern ATen op may return a view of any input). Constants are found: a
    constant the passes folded (eager computes it afresh on every call) or one the model closes over
    (eager returns that very tensor) is one tensor for every call, so a caller changing the result in
    place would change later results and the graph itself. A result that shares storage with memory
    the next call reads or overwrites would be silently wrong; a copy only costs time."""
    for i in check:
        o = outputs[i]
        if o.numel() and o.untyped_storage().data_ptr() in internal:
            outputs[i] = o.clone()
    return outputs
