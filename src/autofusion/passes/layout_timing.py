"""Timing a chain of convolutions as a unit: what the layout pass (passes/layout.py) decides by.

A chain (a connected group of convolutions, passes/layout.py) is described by a `ChainSpec`: its
convolutions in plan order with their configurations, shapes and data flow (which member's result or
which outside input each reads), the zero paddings they absorb, and which results leave the chain.
A `ChainTimer` turns it into a `ChainTiming`: seconds per run of the whole chain in each route. The
measurement itself runs torch and the library's conv_bn_act (runtime/conv_chain.py, a layer above
this one), so it registers itself here (`register_measurement`) when imported; the compiler imports
it. Tests pass their own timer instead (deterministic).

Why the whole chain and not a sum of isolated per-convolution timings: the sum left out the per-call
overheads, the asymmetric paddings a channels-last chain absorbs, and the cache state one
convolution leaves for the next; on MobileNetV2 it rated NCHW level with oneDNN (6.37 vs 6.40 ms)
where the whole model ran 12.1 ms NCHW against 7.95 blocked.

Rules kept from the per-convolution measurement: a chain is timed only when the machine is quiet
(hw/busy.py); its rounds must repeat (a route's second- and third-best rounds within
REPEAT_TOLERANCE) and the NCHW run must be plausibly fast; a timing that fails either decides this
compile only (the chain stays NCHW) and is never cached. Reliable timings are kept per process and
in the cache's "layouts" namespace, one record per chain signature (configurations, shapes, dtype,
data flow; torch version, thread count, CPU features and the routes measured).
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from autofusion.cache import Cache, as_cache
from autofusion.hw.busy import machine_busy
from autofusion.hw.isa import features_digest
from autofusion.ir.dtypes import DType

log = logging.getLogger("autofusion.passes")

ATTEMPTS = 2  # a chain's measurement is repeated once when its rounds disagree (a disturbed run)...
RETRY_WITHIN_S = 1.0  # ...if the first took less than this (a slow chain's retry costs too much compile time)


@dataclass(frozen=True)
class ChainConv:
    """One convolution of a chain, as the measurement runs it. Inputs are encoded as an index: >= 0, the
    result of that member (earlier in the chain); < 0, the chain's outside input number -1 - index."""

    name: str
    x: int
    other: int | None  # the residual added before the activation (conv_bn_act), encoded as x
    x_shape: tuple[int, ...]  # before pre_pad
    w_shape: tuple[int, ...]
    out_shape: tuple[int, ...]
    stride: tuple[int, ...]
    padding: tuple[int, ...]
    dilation: tuple[int, ...]
    groups: int
    act: str
    pre_pad: tuple[int, ...]  # an absorbed asymmetric zero padding (F.pad's order), () for none
    hands_back: bool  # its result comes back NCHW (a graph output, or passed on to one)
    read_outside: bool  # read outside the chain in NCHW order: the reader's conversion is charged

    def signature(self) -> tuple[object, ...]:
        """Everything but the name: two chains of equal signatures time the same."""
        return (
            self.x,
            self.other,
            self.x_shape,
            self.w_shape,
            self.out_shape,
            self.stride,
            self.padding,
            self.dilation,
            self.groups,
            self.act,
            self.pre_pad,
            self.hands_back,
            self.read_outside,
        )

    def flops(self) -> float:
        n, co = self.out_shape[0], self.out_shape[1]
        spatial = math.prod(self.out_shape[2:])
        return 2.0 * n * co * spatial * math.prod(self.w_shape[1:])


@dataclass(frozen=True)
class ChainEdge:
    """A torch op outside the chain that reads one member's result as it is (an `extern` whose every
    tensor input is that result, e.g. a max pooling): it runs in whatever layout the route gives the
    result, so its time is part of the chain's (ResNet's stem: max_pool2d took 11 ms on NCHW against
    0.3 ms on channels-last). `args`/`kwargs`: the extern's templates, every Arg standing for the result."""

    member: int
    target: str
    args: tuple[object, ...]
    kwargs: tuple[tuple[str, object], ...]


@dataclass(frozen=True)
class ChainSpec:
    """A chain of convolutions in plan order, its outside inputs' shapes (and whether each comes in
    channels-last, as its declared type says), its dtype and the torch ops reading its results as
    they are (`ChainEdge`)."""

    dtype: DType
    inputs: tuple[tuple[tuple[int, ...], bool], ...]
    convs: tuple[ChainConv, ...]
    edges: tuple[ChainEdge, ...] = ()

    @property
    def name(self) -> str:
        """The chain's name in messages: its first convolution's, and how many there are."""
        return self.convs[0].name + (f" (+{len(self.convs) - 1})" if len(self.convs) > 1 else "")

    def key(self) -> str:
        edges = tuple((e.member, e.target, repr(e.args), repr(e.kwargs)) for e in self.edges)
        text = repr((self.dtype.short, self.inputs, tuple(c.signature() for c in self.convs), edges))
        return hashlib.sha256(text.encode()).hexdigest()[:32]

    def flops(self) -> float:
        return sum(c.flops() for c in self.convs)


@dataclass(frozen=True)
class ChainTiming:
    """Seconds per run of the whole chain in each route measured (inf: the route cannot run it), and
    whether the timing can be trusted (see the module doc). `note`: what the measurement saw (a route
    that fell back for some of the convolutions, why the timing is not reliable)."""

    route_s: dict[str, float] = field(default_factory=dict)
    reliable: bool = True
    note: str = ""
    # Routes the rounds could not tell from the fastest one (runtime/conv_chain.py's `decisive`): the
    # layout pass takes them as tied with it, as it does routes within its TIE of it.
    tied: tuple[str, ...] = ()


ChainTimer = Callable[[ChainSpec], ChainTiming]
# The real measurement (runtime/conv_chain.py) and the routes it measures, once registered.
_MEASUREMENT: list[tuple[ChainTimer, tuple[str, ...]]] = []
_TIMINGS: dict[str, ChainTiming] = {}


def register_measurement(measure: ChainTimer, routes: Sequence[str]) -> None:
    """Install the measurement `measure_chain` runs (one: a later registration replaces it)."""
    _MEASUREMENT[:] = [(measure, tuple(routes))]
    _TIMINGS.clear()


def measured_routes() -> tuple[str, ...]:
    return _MEASUREMENT[0][1] if _MEASUREMENT else ()


def unmeasured(why: str) -> ChainTiming:
    return ChainTiming({}, reliable=False, note=why)


def measure_chain(spec: ChainSpec) -> ChainTiming:
    """Time `spec` in every route on this CPU: the first of ATTEMPTS measurements that is reliable, kept
    for the process; not measured (unreliable) while the machine is busy or where no measurement is
    registered."""
    key = spec.key()
    if key in _TIMINGS:
        return _TIMINGS[key]
    if not _MEASUREMENT:
        return unmeasured("no chain measurement registered (runtime/conv_chain.py not imported)")
    busy, seen = machine_busy()
    if busy:
        log.info("layout: chain %s not timed: the machine is busy (%s)", spec.name, seen)
        return unmeasured(f"the machine is busy ({seen})")
    measure = _MEASUREMENT[0][0]
    start = time.perf_counter()
    t = measure(spec)
    for _ in range(ATTEMPTS - 1):
        if t.reliable or time.perf_counter() - start > RETRY_WITHIN_S:
            break
        t = measure(spec)
    if t.reliable:
        _TIMINGS[key] = t
    return t


class DiskCachedChainTimer:
    """`measure_chain` with its reliable results kept in the cache (per machine), one record per chain
    signature: a chain is timed once, later compiles are fast and make the same choice."""

    def __init__(self, cache: Cache | str | os.PathLike[str], measure: ChainTimer | None = None) -> None:
        self.cache = as_cache(cache)
        self.measure = measure

    def key(self, spec: ChainSpec) -> str:
        import torch

        return (
            f"chain|{spec.key()}|routes {','.join(measured_routes())}|torch {torch.__version__}"
            f"|{torch.get_num_threads()} threads|cpu {features_digest()}"
        )

    def __call__(self, spec: ChainSpec) -> ChainTiming:
        key = self.key(spec)
        hit = self.cache.get_json("layouts", key)
        if isinstance(hit, dict) and isinstance(hit.get("route_s"), dict):
            times = hit["route_s"]
            if times and all(isinstance(v, (int, float)) or v is None for v in times.values()):
                route_s = {str(r): math.inf if v is None else float(v) for r, v in times.items()}
                tied = tuple(str(r) for r in hit.get("tied", ()) if r in route_s)
                return ChainTiming(route_s, True, str(hit.get("note", "")), tied)
        t = (self.measure or measure_chain)(spec)
        if not t.reliable:
            log.info("layout: timings of chain %s not cached: %s", spec.name, t.note or "not reliable")
            return t  # measured again next time
        record = {
            "route_s": {r: (s if math.isfinite(s) else None) for r, s in t.route_s.items()},
            "note": t.note,
            "tied": list(t.tied),
        }
        self.cache.put_json("layouts", key, record)
        return t


def timer_for(cache: Cache | str | None) -> ChainTimer:
    """The timer the pipeline uses: disk-cached in `cache` (a Cache or its root), else measured once
    per process."""
    return DiskCachedChainTimer(cache) if cache else measure_chain
