"""Build a set of lowered kernels into one library and time each: the measuring half of `calibrate`.

In: `Item`s (a kernel with a unique name, its tile, and one tensor per buffer, in buffer order) and the
cache to build in. Out: seconds per call of each kernel, called through ctypes exactly as
`tools/diagnose/measure.step_times` calls plan steps (so the fixed cost of a call is in every time).

All kernels go into one translation unit (one compiler run however many there are). Every call is
timed alone (a batch of calls would carry any slow one in it), the kernels take turns round by round,
and each kernel's fastest call is kept: on a shared machine an OpenMP region whose second thread was
descheduled waits a scheduler slice (30 ms seen for a 9 us kernel on a machine loaded 6x), which says
nothing about the kernel.
"""

from __future__ import annotations

import ctypes
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from autofusion.cache import Cache
from autofusion.codegen.cpp.build import CompilerConfig, build, load
from autofusion.codegen.cpp.render import render_unit
from autofusion.kernel.lower import LoopKernel
from autofusion.kernel.tile import Tile

BUILD_TIMEOUT_S = 900.0


@dataclass(frozen=True)
class Item:
    kernel: LoopKernel  # its name is the C symbol: unique within one `time_items` call
    tile: Tile
    tensors: tuple[torch.Tensor, ...]  # one per buffer of the kernel, inputs then outputs


def _call(lib: ctypes.CDLL, item: Item, params: list[int]) -> Callable[[], None]:
    fn = getattr(lib, item.kernel.name)
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    fn.restype = None
    p_array = (ctypes.c_int64 * max(1, len(params)))(*params)
    ptrs = (ctypes.c_void_p * len(item.tensors))(*[t.data_ptr() for t in item.tensors])
    addr = ctypes.addressof(p_array)
    keep = (item.tensors, p_array, ptrs)

    def call() -> None:
        fn(ptrs, addr)
        _ = keep

    return call


def time_items(items: Sequence[Item], cache: Cache, *, rounds: int = 8, per_round: int = 5,
               max_rounds: int = 40, total_s: float = 60.0) -> list[float]:  # fmt: skip
    """Seconds per call of each item's kernel: the fastest of its timed calls (module docstring). Each
    round calls every kernel `per_round` times, each call timed alone. After `rounds` rounds, more
    follow (up to `max_rounds`, while under `total_s`) as long as a round still lowered some kernel's
    fastest time by more than 5 %: on a busy machine the fast calls come in windows."""
    names = [it.kernel.name for it in items]
    if len(set(names)) != len(names):
        raise ValueError(f"kernel names must be unique in one library: {names}")
    if not items:
        return []
    source, params = render_unit([(it.kernel, it.tile) for it in items])
    # Many kernels in one unit: more compiler time than a model's unit, on a machine that may be busy.
    lib = load(build(source, CompilerConfig(timeout_s=BUILD_TIMEOUT_S), cache, name="calibrate"))
    calls = [_call(lib, it, params[it.kernel.name]) for it in items]
    for call in calls:
        call()  # warm-up: page faults, the OpenMP team
    best = [float("inf")] * len(calls)
    clock = time.perf_counter
    deadline = clock() + total_s
    for r in range(max_rounds):
        improved = False
        for k, call in enumerate(calls):
            before = best[k]
            for _ in range(per_round):
                start = clock()
                call()
                best[k] = min(best[k], clock() - start)
            improved |= best[k] < 0.95 * before
        if r + 1 >= rounds and (not improved or clock() > deadline):
            break
    return best
