"""The JSON contract of events: the keys of each kind, in order, as `CompiledModel.events`,
`autofusion explain --json` and `events.jsonl` hand them out, made from the typed records."""

from __future__ import annotations

import dataclasses
import json
from unittest import mock

import pytest
import torch

import autofusion
from autofusion import network_layout
from autofusion.events import EVENT_TYPES, EventRecord, RewritePassEvent, code_counts, to_jsonl

# Changing one of these lists changes a public format: say so in the release notes.
PINNED: dict[str, list[str]] = {
    "fusion.candidate": [
        "event", "graph", "seq", "kind", "first", "second", "first_nodes", "second_nodes", "accepted", "code",
        "reason", "rule", "bytes_shared", "bytes_saved", "us_saved", "terms_us", "live_bytes", "budget_bytes",
        "budget_used", "line",
    ],
    "fusion.recompute": ["event", "graph", "seq", "node", "consumers", "accepted", "rule", "nodes"],
    "rewrite.pass": ["event", "graph", "pass", "nodes_before", "nodes_after"],
    "codegen.kernel": [
        "event", "graph", "kernel", "ops", "nodes", "bytes", "flops", "estimated_us", "tile", "live_bytes",
        "budget_bytes", "budget_used",
    ],
    "codegen.build": ["event", "graph", "source_chars", "cache_hit", "compile_s", "error"],
    "runtime.plan": [
        "event", "graph", "steps", "kernels", "library_ops", "fused_kernels", "bytes_before", "bytes_after",
        "estimated_us", "decisions", "rejected",
    ],
    "layout.chain": ["event", "graph", "chain", "convs", "route", "how", "reason", "routes"],
    "layout.network": ["event", "graph", "chains", "layout", "how", "reason", "routes"],
}  # fmt: skip
ROUTE_KEYS = ["route", "ms", "chosen", "reason"]  # each of a layout.chain event's routes
NESTED = {
    ("fusion.candidate", "terms_us"): ["mem_saved", "sched_saved", "ilp_gain", "reg_spill", "tile_overhead"],
    ("codegen.kernel", "tile"): ["rows_per_block", "inner_block", "persistent", "split_rows"],
}
LISTS = {"first_nodes", "second_nodes", "nodes", "ops", "library_ops", "routes"}


def with_extern(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    a = x * 2.0 + 1.0
    c = torch.cumsum(a, 0)  # a library op step, and a cycle for a merge of exp with the add below
    s = (a - a.amax(-1, keepdim=True)).exp().sum(-1, keepdim=True)
    return a.exp() + c, s


_C1, _C2 = torch.nn.Conv2d(3, 4, 3).eval(), torch.nn.Conv2d(4, 4, 3).eval()


def two_chains(x: torch.Tensor) -> torch.Tensor:
    return _C2(_C1(x).softmax(1))


def _events() -> list[dict]:
    x = torch.randn(16, 64)
    with torch.no_grad():
        cm = autofusion.compile(with_extern, (x,))
        cm(x)
        ln = autofusion.compile(torch.nn.LayerNorm(64).eval(), (x,), recomputation_threshold=4)
        # A convolution chain, its layout forced (measuring would depend on the machine's load).
        conv = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU(), torch.nn.Conv2d(4, 4, 3)).eval()
        cv = autofusion.compile(conv, (torch.randn(1, 3, 8, 8),), conv_layout="channels_last")
        # Two chains with the whole-network search on, the machine said busy (a decision, nothing timed).
        with mock.patch.object(network_layout, "machine_busy", lambda: (True, "test")):
            net = autofusion.compile(two_chains, (torch.randn(1, 3, 8, 8),), layout_search=True)
    return cm.events + ln.events + cv.events + net.events


def test_every_kind_has_its_pinned_keys_in_order() -> None:
    events = _events()
    assert {e["event"] for e in events} == set(PINNED)  # every kind is exercised
    assert any(e["event"] == "fusion.candidate" and not e["accepted"] for e in events)
    for e in events:
        assert list(e) == PINNED[e["event"]], e["event"]
        for (kind, key), inner in NESTED.items():
            if e["event"] == kind and e[key] is not None:
                assert list(e[key]) == inner
        for r in e.get("routes", []) if e["event"] in ("layout.chain", "layout.network") else []:
            assert list(r) == ROUTE_KEYS
        for key in LISTS & set(e):
            assert type(e[key]) is list, (e["event"], key)  # JSON arrays, also before any json.dumps
        assert json.loads(json.dumps(e)) == e  # plain JSON, nothing lost


def test_each_record_type_makes_exactly_the_pinned_keys() -> None:
    """A field added to a record changes the JSON; this fails until PINNED says so."""
    assert sorted(t.EVENT for t in EVENT_TYPES) == sorted(PINNED)
    for t in EVENT_TYPES:
        keys = ["event"] + [f.metadata.get("key", f.name) for f in dataclasses.fields(t)]
        assert keys == PINNED[t.EVENT], t.__name__


def test_records_are_frozen_and_public_dicts_are_copies() -> None:
    r = RewritePassEvent("g", "AfterDce", 3, 2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.nodes_after = 1  # type: ignore[misc]
    d = r.to_dict()
    want = {"event": "rewrite.pass", "graph": "g", "pass": "AfterDce", "nodes_before": 3, "nodes_after": 2}
    assert d == want
    d["graph"] = "changed"
    assert r.to_dict()["graph"] == "g"
    assert to_jsonl([r]) == to_jsonl([r.to_dict()]) == json.dumps(r.to_dict(), sort_keys=True) + "\n"


def test_program_records_and_events_agree() -> None:
    x = torch.randn(16, 64)
    with torch.no_grad():
        cm = autofusion.compile(with_extern, (x,))
    program = cm.compiled.program
    assert all(isinstance(r, EventRecord) for r in program.records)
    assert program.events == [r.to_dict() for r in program.records] == cm.events
    rejected = [e["code"] for e in cm.events if e["event"] == "fusion.candidate" and not e["accepted"]]
    assert rejected and set(rejected) == {"NF1002"}
    assert code_counts(program.records) == code_counts(program.events) == {"NF1002": len(rejected)}
