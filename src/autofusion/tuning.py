"""Tuning records: the option overrides a measured search (`autofusion tune`) found faster for one
graph on one machine, and how `compile` finds and applies them.

A record is keyed by
- the graph's hash: sha256 of the captured IR graph's text (ops, attributes, types; so the input
  signature is part of it), before any pass runs;
- the machine's fingerprint (`machine_fingerprint`): CPU model, usable cores, the CPU's instruction
  set flags, torch and autofusion versions. A record measured elsewhere never applies here.
It holds the overrides (`Options` fields and their values), the default and tuned times measured in
the same run, and each accepted decision with its measured gain, so `explain` and the report can say
which decisions came from tuning.

Where records live: the cache's "tuning" namespace (`Options.tuning="auto"`, the default), or a JSON
lines file the user names (`tuning=PATH`: one record per line, as `autofusion tune --record PATH`
writes), or nowhere (`tuning="off"`). Applying a record only replaces options; the plan is made by the
same compiler with them, so every check and fallback still holds.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autofusion._version import __version__
from autofusion.cache import Cache
from autofusion.config import Options
from autofusion.hw.isa import host_features
from autofusion.hw.measure import machine_key
from autofusion.ir.graph import Graph
from autofusion.ir.printer import print_graph

log = logging.getLogger("autofusion.tuning")

NAMESPACE = "tuning"
FORMAT = 1
# Options a record may set: what the tuner searches. Anything else in a record is refused, so a record
# cannot change where files go or what is checked.
TUNABLE = frozenset(
    {"enabled_rules", "disabled", "super_kernel", "max_fusion_size", "recomputation_threshold", "freeze",
     "tile_rows_per_block", "tile_inner_block", "kernel_threads", "conv_layout", "conv_chain_layouts",
     "linear_route", "super_kernel_gemm"}
)  # fmt: skip


def graph_hash(graph: Graph) -> str:
    return hashlib.sha256(print_graph(graph).encode()).hexdigest()


def machine_fingerprint() -> str:
    """What a measured plan's speed depends on, as one line; see the module docstring."""
    flags = hashlib.sha256(" ".join(sorted(host_features())).encode()).hexdigest()[:16]
    return f"{machine_key()}|isa={flags}|autofusion={__version__}"


@dataclass(frozen=True)
class Decision:
    """One accepted change: the option, its value, and the gain measured when it was taken."""

    option: str
    value: Any
    gain: float  # incumbent time / time with this change (> 1: faster)


@dataclass(frozen=True)
class TuningRecord:
    graph: str
    machine: str
    overrides: dict[str, Any]
    default_ms: float
    tuned_ms: float
    decisions: tuple[Decision, ...] = ()
    model: str = ""
    created: float = field(default_factory=time.time)

    def key(self) -> str:
        return record_key(self.graph, self.machine)

    def to_json(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["format"] = FORMAT
        return out

    @staticmethod
    def from_json(data: dict[str, Any]) -> TuningRecord:
        if data.get("format") != FORMAT:
            raise ValueError(f"tuning record format {data.get('format')!r}, expected {FORMAT}")
        decisions = tuple(Decision(**d) for d in data.get("decisions", ()))
        fields = {f.name for f in dataclasses.fields(TuningRecord)} - {"decisions"}
        record = TuningRecord(**{k: v for k, v in data.items() if k in fields}, decisions=decisions)
        unknown = sorted(set(record.overrides) - TUNABLE)
        if unknown:
            raise ValueError(f"tuning record sets options a record may not set: {', '.join(unknown)}")
        return record


def record_key(graph: str, machine: str) -> str:
    return hashlib.sha256(f"{graph}\n{machine}".encode()).hexdigest()


def store(record: TuningRecord, where: Cache | Path) -> str:
    """Keep `record` (replacing one with the same key); returns where it went, for the user."""
    if isinstance(where, Cache):
        where.put_json(NAMESPACE, record.key(), record.to_json())
        return f"{where.root} ({NAMESPACE} {record.key()[:12]})"
    lines = [ln for ln in _lines(where) if _line_key(ln) != record.key()]
    lines.append(json.dumps(record.to_json(), sort_keys=True))
    where.parent.mkdir(parents=True, exist_ok=True)
    where.write_text("\n".join(lines) + "\n")
    return str(where)


def _lines(path: Path) -> list[str]:
    try:
        return [ln for ln in path.read_text().splitlines() if ln.strip()]
    except FileNotFoundError:
        return []


def _line_key(line: str) -> str | None:
    try:
        data = json.loads(line)
        return record_key(data["graph"], data["machine"])
    except (ValueError, KeyError, TypeError):
        return None


def lookup(graph: Graph, options: Options, cache: Cache | None) -> TuningRecord | None:
    """The record for this graph on this machine under `options.tuning`, or None."""
    if options.tuning == "off":
        return None
    key = record_key(graph_hash(graph), machine_fingerprint())
    if options.tuning == "auto":
        data = cache.get_json(NAMESPACE, key) if cache is not None else None
    else:
        path = Path(options.tuning)
        if not path.is_file():
            raise FileNotFoundError(f"tuning={options.tuning!r}: no such record file")
        data = next((json.loads(ln) for ln in _lines(path) if _line_key(ln) == key), None)
    if data is None:
        return None
    try:
        return TuningRecord.from_json(data)
    except (TypeError, ValueError) as e:
        where = options.tuning if options.tuning != "auto" else "the cache"
        log.warning("ignoring a tuning record in %s for %s: %s", where, graph.name, e)
        return None


def apply(record: TuningRecord, options: Options) -> Options:
    """`options` with the record's overrides. Set-valued ones (rules and passes switched on or off) are
    added to what `options` holds, so a switch the caller gave is never dropped by a record; per-chain
    conv layouts likewise (the caller's entry for a chain wins over the record's)."""
    values: dict[str, Any] = {}
    for name, value in record.overrides.items():
        current = getattr(options, name)
        if isinstance(current, frozenset):
            values[name] = current | frozenset(value)
        elif name == "conv_chain_layouts":
            mine = {str(e).partition("=")[0] for e in current}
            values[name] = (*current, *(e for e in value if str(e).partition("=")[0] not in mine))
        else:
            values[name] = value
    return dataclasses.replace(options, **values)


def overrides_json(overrides: dict[str, Any]) -> dict[str, Any]:
    """Overrides as JSON values (sets as sorted lists)."""
    return {
        k: sorted(v) if isinstance(v, (set, frozenset)) else list(v) if isinstance(v, tuple) else v
        for k, v in overrides.items()
    }


def tuning_stats(record: TuningRecord) -> dict[str, Any]:
    """What `stats["tuning"]` shows: which decisions came from tuning, with their measured gains."""
    return {
        "record": record.key()[:12],
        "default_ms": record.default_ms,
        "tuned_ms": record.tuned_ms,
        "overrides": overrides_json(record.overrides),
        "decisions": [dataclasses.asdict(d) for d in record.decisions],
    }
