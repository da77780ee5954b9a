"""Structured events: one JSON-serialisable dict per decision, and short INFO summaries.

Made by `plan/events.py` (from the solver's decisions and the plan) and `dfx/trace.py` (passes,
builds). Used as event dicts (`program.events`, `CompiledModel.decisions`, `autofusion explain --json`, the
`events.jsonl` dump) and one INFO line per channel and graph.

Every event has `event` (`fusion.candidate`, `fusion.recompute`, `rewrite.pass`, `codegen.kernel`,
`codegen.build`, `runtime.plan`) and `graph`. A candidate event carries the verdict, its NF code and
reason, the rule or heuristic that decided, the bytes the two sides share, the bytes and microseconds
the merge saves (negative: it costs) with the cost model's five terms, and the on-chip budget the
merged kernel's tile uses. Per-pair text lines stay at DEBUG (the `cannot fuse, the reason is
[NFxxxx][...]` line users grep for); INFO gets one summary per channel, so it stays short.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Iterable
from typing import Any

CHANNELS = ("fusion", "rewrite", "codegen", "runtime")
Event = dict[str, Any]


def channel(name: str) -> logging.Logger:
    if name not in CHANNELS:
        raise ValueError(f"unknown log channel {name!r}; channels: {', '.join(CHANNELS)}")
    return logging.getLogger(f"autofusion.{name}")


def code_counts(events: Iterable[Event]) -> dict[str, int]:
    return dict(
        Counter(e["code"] for e in events if e.get("event") == "fusion.candidate" and not e["accepted"])
    )


def to_jsonl(events: Iterable[Event]) -> str:
    return "".join(json.dumps(e, sort_keys=True, default=str) + "\n" for e in events)
