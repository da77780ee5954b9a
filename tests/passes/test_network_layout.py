"""The whole-network layout candidate (autofusion/network_layout.py): every chain in one layout, the
whole program timed, against the per-chain choice. The decision (with a substituted timer), its cache,
the cases that do not search, the `layout.network` event each decision leaves, and every candidate
program's results against eager."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import autofusion
from autofusion import network_layout
from autofusion.passes.layout import CONV_TARGET


class TwoChains(nn.Module):
    """Two depthwise-convolution chains separated by a LayerNorm over channels (ConvNeXt's shape)."""

    def __init__(self) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(8, 8, 7, padding=3, groups=8)
        self.norm = nn.LayerNorm(8)
        self.c2 = nn.Conv2d(8, 8, 7, padding=3, groups=8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.c1(x).permute(0, 2, 3, 1)
        y = F.gelu(self.norm(y)).permute(0, 3, 1, 2)
        return self.c2(y) + x


@pytest.fixture
def search(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """A quiet machine for the search (which `_compile` switches on: `layout_search` is opt-in); returns
    the list of candidate sets each fake timing saw."""
    monkeypatch.setattr(network_layout, "machine_busy", lambda: (False, "quiet"))
    return []


def _routes(cm) -> set[str]:
    nodes = cm.last.program.plan.graph.nodes
    convs = [tuple(n.attr("args")) for n in nodes if n.op == "extern" and n.attr("target") == CONV_TARGET]
    routes = {str(a[14]) if len(a) > 14 else "aten" for a in convs}
    return routes | ({"aten"} if any(n.op == "conv" for n in nodes) else set())


def _fake(monkeypatch, seen, times):
    def timer(runs):
        seen.append(sorted(runs))
        for run in runs.values():
            run()  # every candidate program runs
        return None if times is None else {r: times.get(r, 1.0) for r in runs}

    monkeypatch.setattr(network_layout, "time_rounds", timer)


def _compile(tmp_path, **kw):
    torch.manual_seed(0)
    model = TwoChains().eval()
    x = torch.randn(2, 8, 9, 11)
    cm = autofusion.compile(model, [x], cache_dir=str(tmp_path), **{"layout_search": True, **kw})
    with torch.no_grad():
        torch.testing.assert_close(cm(x), model(x), rtol=1e-5, atol=1e-5)
    return cm


def _network(cm) -> dict:
    (e,) = [e for e in cm.events if e["event"] == "layout.network"]
    return e


def test_a_faster_forced_layout_replaces_auto_and_is_cached(tmp_path, monkeypatch, search) -> None:
    _fake(monkeypatch, search, {"auto": 1.0, "channels_last": 0.5, "nchw": 0.9})
    cm = _compile(tmp_path)
    assert search == [["auto", "blocked", "channels_last", "dnnl", "nchw"]]
    assert _routes(cm) == {"aten_cl"}
    e = _network(cm)
    assert (e["layout"], e["how"], e["chains"]) == ("channels_last", "measured", 2)
    assert {r["route"]: r["chosen"] for r in e["routes"]} == {
        "auto": False, "blocked": False, "channels_last": True, "dnnl": False, "nchw": False
    }  # fmt: skip
    assert [r["ms"] for r in e["routes"] if r["route"] == "channels_last"] == [500.0]
    # A second compile takes the cached choice without timing, and says so.
    _fake(monkeypatch, search, None)
    cm = _compile(tmp_path)
    assert len(search) == 1 and _routes(cm) == {"aten_cl"}
    e = _network(cm)
    assert (e["layout"], e["how"]) == ("channels_last", "cached") and len(e["routes"]) == 5


def test_auto_stays_within_the_margin(tmp_path, monkeypatch, search) -> None:
    _fake(monkeypatch, search, {"auto": 1.0, "channels_last": 0.99})
    cm = _compile(tmp_path)  # auto: each chain by its own timing
    assert len(search) == 1
    e = _network(cm)
    assert (e["layout"], e["how"]) == ("auto", "measured")
    assert [r["reason"] for r in e["routes"] if r["route"] == "channels_last"] == [
        "0.990x auto's time, 0.97x needed"
    ]
    # Stored: auto, so the next compile does not time again.
    _fake(monkeypatch, search, {"auto": 1.0, "channels_last": 0.1})
    assert _routes(_compile(tmp_path)) == _routes(cm) and len(search) == 1


def test_disagreeing_rounds_decide_nothing_and_are_not_cached(tmp_path, monkeypatch, search) -> None:
    _fake(monkeypatch, search, None)
    e = _network(_compile(tmp_path))
    assert (e["layout"], e["how"], e["routes"]) == ("auto", "not searched", [])
    assert "disagree" in e["reason"]
    _fake(monkeypatch, search, {"auto": 1.0, "nchw": 0.5})
    assert _routes(_compile(tmp_path)) == {"aten"} and len(search) == 2


def test_no_search_when_off_busy_forced_or_one_chain(tmp_path, monkeypatch, search) -> None:
    _fake(monkeypatch, search, {"auto": 1.0, "channels_last": 0.5})
    compiled = [_compile(tmp_path, layout_search=False)]  # the default
    compiled.append(_compile(tmp_path, conv_layout="nchw"))
    assert _routes(compiled[-1]) == {"aten"}
    monkeypatch.setattr(network_layout, "MIN_CHAINS", 3)
    compiled.append(_compile(tmp_path))
    # Where the search does not apply there is no decision to show.
    assert all(e["event"] != "layout.network" for cm in compiled for e in cm.events)
    monkeypatch.setattr(network_layout, "MIN_CHAINS", 2)
    monkeypatch.setattr(network_layout, "machine_busy", lambda: (True, "4 cores"))
    e = _network(_compile(tmp_path))
    assert (e["layout"], e["how"], e["reason"]) == ("auto", "not searched", "the machine is busy (4 cores)")
    assert search == []


def test_every_candidate_program_matches_eager(search) -> None:
    torch.manual_seed(0)
    model = TwoChains().eval()
    x = torch.randn(1, 8, 13, 7)
    with torch.no_grad():
        ref = model(x)
        for layout in network_layout.LAYOUTS:
            cm = autofusion.compile(model, [x], conv_layout=layout)
            torch.testing.assert_close(cm(x), ref, rtol=1e-5, atol=1e-5)


def test_time_rounds_times_every_candidate() -> None:
    ticks = {"a": 0, "b": 0}

    def run(name):
        return lambda: ticks.__setitem__(name, ticks[name] + 1)

    times = network_layout.time_rounds({"a": run("a"), "b": run("b")})
    assert ticks["a"] == ticks["b"] >= 4
    assert times is None or set(times) == {"a", "b"}


def test_explain_shows_the_whole_network_decision(tmp_path, monkeypatch, search) -> None:
    import io

    from rich.console import Console

    from autofusion.tools.cli.explain import layouts_table

    _fake(monkeypatch, search, {"auto": 1.0, "dnnl": 0.8})
    cm = _compile(tmp_path)
    out = io.StringIO()
    Console(file=out, width=200).print(layouts_table(cm.events))
    text = out.getvalue()
    assert (
        "whole network" in text and "2 chains" in text and "800.000" in text and "0.800x auto's time" in text
    )
