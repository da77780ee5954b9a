"""Structured events: one typed, frozen record per decision, its JSON dict, and short INFO summaries.

Made by `plan/events.py` (from the solver's decisions and the plan) and `dfx/trace.py` (passes,
builds) as records (`EventRecord` subclasses, one per kind). Used as records inside the library
(`Program.records`) and, through `to_dict()`, as the event dicts of the public contract
(`Program.events`, `CompiledModel.events` / `.decisions`, `autofusion explain --json`, the
`events.jsonl` dump), and one INFO line per channel and graph. A record's fields, in order, are its
dict's keys after `event` (a field may name its key, for `pass`); tuples become lists.

Every event has `event` (`fusion.candidate`, `fusion.recompute`, `rewrite.pass`, `codegen.kernel`,
`codegen.build`, `runtime.plan`, `layout.chain`, `layout.network`) and `graph`. A candidate event
carries the verdict, its NF code and reason, the rule or heuristic that decided, the bytes the two
sides share, the bytes and microseconds the merge saves (negative: it costs) with the cost model's
five terms, and the on-chip budget the merged kernel's tile uses. Per-pair text lines stay at DEBUG
(the `cannot fuse, the reason is [NFxxxx][...]` line users grep for); INFO gets one summary per
channel, so it stays short.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

CHANNELS = ("fusion", "rewrite", "codegen", "runtime")
Event = dict[str, Any]  # an event as JSON: what public accessors and dumps hand out


def channel(name: str) -> logging.Logger:
    if name not in CHANNELS:
        raise ValueError(f"unknown log channel {name!r}; channels: {', '.join(CHANNELS)}")
    return logging.getLogger(f"autofusion.{name}")


def _plain(value: Any) -> Any:
    """A field value as JSON-ready data: records and their parts become dicts, tuples lists."""
    if isinstance(value, _Part):
        return value.to_dict()
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    return value


@dataclass(frozen=True)
class _Part:
    """A nested group of fields (a kernel's tile, a candidate's cost terms): a dict in the JSON."""

    def to_dict(self) -> dict[str, Any]:
        return {f.metadata.get("key", f.name): _plain(getattr(self, f.name)) for f in fields(self)}


@dataclass(frozen=True)
class EventRecord(_Part):
    """One event; `EVENT` is its kind (the `event` key), `graph` the graph it is about."""

    EVENT: ClassVar[str] = ""
    graph: str

    def to_dict(self) -> Event:
        return {"event": self.EVENT, **super().to_dict()}


@dataclass(frozen=True)
class CostTerms(_Part):
    """The cost model's five terms of a merge, in microseconds (negative: the term costs)."""

    mem_saved: float
    sched_saved: float
    ilp_gain: float
    reg_spill: float
    tile_overhead: float


@dataclass(frozen=True)
class CandidateEvent(EventRecord):
    """A merge the solver considered: its verdict, NF code and reason, the deciding rule, the bytes the
    two sides share, what the merge saves (bytes and us; negative: it costs) and its on-chip budget."""

    EVENT: ClassVar[str] = "fusion.candidate"
    seq: int
    kind: str
    first: str
    second: str
    first_nodes: tuple[str, ...]
    second_nodes: tuple[str, ...]
    accepted: bool
    code: str
    reason: str
    rule: str
    bytes_shared: int
    bytes_saved: int | None
    us_saved: float | None
    terms_us: CostTerms | None
    live_bytes: int
    budget_bytes: int
    budget_used: float | None
    line: str


@dataclass(frozen=True)
class RecomputeEvent(EventRecord):
    """A cheap producer copied into each of its consumers instead of written out."""

    EVENT: ClassVar[str] = "fusion.recompute"
    seq: int
    node: str
    consumers: str
    accepted: bool
    rule: str
    nodes: tuple[str, ...]


@dataclass(frozen=True)
class RewritePassEvent(EventRecord):
    """A pipeline stage and the node count before and after it."""

    EVENT: ClassVar[str] = "rewrite.pass"
    pass_: str = field(metadata={"key": "pass"})
    nodes_before: int
    nodes_after: int


@dataclass(frozen=True)
class KernelTile(_Part):
    rows_per_block: int
    inner_block: int
    persistent: bool
    split_rows: int


@dataclass(frozen=True)
class KernelEvent(EventRecord):
    """A generated kernel: its ops and nodes, the cost model's estimate, its tile and on-chip budget."""

    EVENT: ClassVar[str] = "codegen.kernel"
    kernel: str
    ops: tuple[str, ...]
    nodes: tuple[str, ...]
    bytes: int
    flops: int
    estimated_us: float
    tile: KernelTile
    live_bytes: int
    budget_bytes: int
    budget_used: float | None


@dataclass(frozen=True)
class BuildEvent(EventRecord):
    """The build of a graph's translation unit (None where it was not built)."""

    EVENT: ClassVar[str] = "codegen.build"
    source_chars: int
    cache_hit: bool | None
    compile_s: float | None
    error: str | None


@dataclass(frozen=True)
class PlanEvent(EventRecord):
    """The plan's summary: steps, kernels (generated and library), library ops and estimated traffic."""

    EVENT: ClassVar[str] = "runtime.plan"
    steps: int
    kernels: int  # kernel calls per run: generated kernels and library ops (literals excepted)
    library_ops: tuple[str, ...]
    fused_kernels: int
    bytes_before: int
    bytes_after: int
    estimated_us: float
    decisions: int
    rejected: int


@dataclass(frozen=True)
class RouteTime(_Part):
    """One route of a convolution chain: its measured time per run of the whole chain (None: not
    measured), whether it was taken, and why (or why not)."""

    route: str
    ms: float | None
    chosen: bool
    reason: str


@dataclass(frozen=True)
class LayoutChainEvent(EventRecord):
    """The layout pass's decision for one chain of convolutions (passes/layout.py): the route it runs,
    how that was decided (measured, cached, forced, unmeasured) and each route's chain time."""

    EVENT: ClassVar[str] = "layout.chain"
    chain: str  # its first convolution's name
    convs: int
    route: str
    how: str
    reason: str
    routes: tuple[RouteTime, ...]


@dataclass(frozen=True)
class LayoutNetworkEvent(EventRecord):
    """The whole-network layout search (network_layout.py): the layout every chain runs in ("auto":
    each chain by its own timing), how that was decided (measured, cached, not searched) and why, and
    each candidate program's time (empty when nothing was timed)."""

    EVENT: ClassVar[str] = "layout.network"
    chains: int
    layout: str
    how: str
    reason: str
    routes: tuple[RouteTime, ...]


EVENT_TYPES: tuple[type[EventRecord], ...] = (
    CandidateEvent, RecomputeEvent, RewritePassEvent, KernelEvent, BuildEvent, PlanEvent, LayoutChainEvent,
    LayoutNetworkEvent,
)  # fmt: skip


def as_dict(event: Event | EventRecord) -> Event:
    return event.to_dict() if isinstance(event, EventRecord) else event


def code_counts(events: Iterable[Event | EventRecord]) -> dict[str, int]:
    out: Counter[str] = Counter()
    for e in events:
        if isinstance(e, CandidateEvent):
            if not e.accepted:
                out[e.code] += 1
        elif isinstance(e, dict) and e.get("event") == "fusion.candidate" and not e["accepted"]:
            out[e["code"]] += 1
    return dict(out)


def to_jsonl(events: Iterable[Event | EventRecord]) -> str:
    return "".join(json.dumps(as_dict(e), sort_keys=True, default=str) + "\n" for e in events)
