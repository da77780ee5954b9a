"""The layout pass decides per chain of convolutions by timing the whole chain in each route
(passes/layout_timing.py, runtime/conv_chain.py): the chain's time decides (not a per-convolution
sum), a busy machine measures nothing and caches nothing, reliable timings are cached per chain
signature, every decision is a `layout.chain` event with each route's time and reason, and the real
measurement runs every route of runtime/library.py's list on the chain's real data flow."""

from __future__ import annotations

import math

import pytest
import torch

import autofusion.runtime.conv_chain as conv_chain
from autofusion.ir import DType, Graph, GraphBuilder, InputRole, TensorType, verify
from autofusion.ir.interpret import run_graph
from autofusion.passes import layout, layout_timing
from autofusion.passes.layout import choose_layouts
from autofusion.passes.layout_timing import ChainConv, ChainSpec, ChainTiming
from autofusion.runtime import library

F32 = DType.float32
CONV = {"stride": (1, 1), "padding": (1, 1), "dilation": (1, 1), "transposed": False,
        "output_padding": (0, 0), "groups": 1, "has_bias": False}  # fmt: skip


def g_chain(n: int = 3, name: str = "chain") -> Graph:
    """n convolutions in a row, with an exp outside reading the last one."""
    b = GraphBuilder(name)
    v = b.add_input(TensorType(F32, (1, 4, 6, 6)), "x")
    for k in range(n):
        v = b.add("conv", [v, b.add_input(TensorType(F32, (4, 4, 3, 3)), f"w{k}", InputRole.PARAM)], CONV)
    return b.build([b.add("exp", [v])])


def g_residual_pad() -> Graph:
    """conv -> asymmetric pad -> conv, plus a residual add of the first result: one chain."""
    b = GraphBuilder("respad")
    x = b.add_input(TensorType(F32, (1, 4, 7, 7)), "x")
    w0 = b.add_input(TensorType(F32, (4, 4, 3, 3)), "w0", InputRole.PARAM)
    w1 = b.add_input(TensorType(F32, (4, 4, 2, 2)), "w1", InputRole.PARAM)
    y = b.add("conv", [x, w0], CONV)
    p = b.add("pad", [y], {"pads": (0, 1, 0, 1), "value": 0.0})
    z = b.add("conv", [p, w1], {**CONV, "padding": (0, 0)})
    return b.build([b.add("add", [z, y])])


def _routes(out: Graph) -> list[str]:
    return [n.attr("args")[-2] for n in out.nodes if n.op == "extern"]


def _same_values(before: Graph, after: Graph) -> None:
    verify(after)
    gen = torch.Generator().manual_seed(0)
    inputs = [torch.randn(gi.value.type.shape, generator=gen) for gi in before.inputs]
    for a, b in zip(run_graph(before, inputs), run_graph(after, inputs), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


def test_the_chain_time_decides_not_the_per_conv_sum() -> None:
    """oneDNN loses on each convolution timed alone (110 us against NCHW's 100) but wins the chain run as
    a unit (what the per-conv sum leaves out: per-call overheads, paddings, cache state): it is chosen."""
    per_conv = {"aten": 100e-6, "aten_cl": 105e-6, "onednn": 110e-6}
    per_conv_sum = {r: 3 * s for r, s in per_conv.items()}
    as_chain = {"aten": 330e-6, "aten_cl": 300e-6, "onednn": 240e-6}
    g = g_chain(3)
    assert choose_layouts(g, lambda spec: ChainTiming(per_conv_sum)) is g  # the old view: NCHW
    events: list = []
    out = choose_layouts(g, lambda spec: ChainTiming(as_chain), events=events)
    assert _routes(out) == ["onednn"] * 3
    _same_values(g, out)
    (e,) = [ev.to_dict() for ev in events]
    assert e["event"] == "layout.chain" and e["route"] == "onednn" and e["how"] == "measured"
    assert e["convs"] == 3
    by_route = {r["route"]: r for r in e["routes"]}
    assert by_route["onednn"]["chosen"] and by_route["onednn"]["ms"] == pytest.approx(0.24)
    assert "1.38x faster than NCHW" in by_route["onednn"]["reason"]
    assert "1.38x the chosen route's time" in by_route["aten"]["reason"]
    assert "1.25x the chosen route's time" in by_route["aten_cl"]["reason"]


def test_every_route_not_taken_has_a_reason() -> None:
    events: list = []
    timing = ChainTiming({"aten": 100e-6, "aten_cl": 97e-6, "onednn": math.inf})
    g = g_chain(2)
    assert choose_layouts(g, lambda spec: timing, events=events) is g
    (e,) = [ev.to_dict() for ev in events]
    reasons = {r["route"]: r["reason"] for r in e["routes"]}
    assert e["route"] == "aten" and "is not 5% faster than NCHW" in e["reason"]
    assert "under the 5% margin" in reasons["aten_cl"]
    assert reasons["onednn"] == "cannot run this chain"
    events.clear()
    choose_layouts(g, lambda spec: ChainTiming({"aten": 1e-4, "aten_cl": 9e-5, "onednn": 1e-5}), mkldnn=False,
                   events=events)  # fmt: skip
    (e,) = [ev.to_dict() for ev in events]
    assert e["route"] == "aten_cl"
    assert {r["route"]: r["reason"] for r in e["routes"]}["onednn"] == "left out: mkldnn=False"
    events.clear()
    choose_layouts(g, lambda spec: pytest.fail("measured a forced chain"), layout="blocked", events=events)
    (e,) = [ev.to_dict() for ev in events]
    assert e["how"] == "forced" and e["route"] == "onednn" and "forced: conv_layout blocked" in e["reason"]


def test_a_route_the_list_adds_is_chosen_without_special_cases() -> None:
    """Routes come from the timing (runtime/library.py's ROUTES measured): a new one slots in."""
    events: list = []
    out = choose_layouts(
        g_chain(2), lambda spec: ChainTiming({"aten": 1e-4, "newroute": 5e-5}), events=events
    )
    assert _routes(out) == ["newroute"] * 2
    assert [r["route"] for r in events[0].to_dict()["routes"]] == ["aten", "newroute"]


def test_the_spec_follows_the_data_flow() -> None:
    seen: list[ChainSpec] = []
    choose_layouts(g_residual_pad(), lambda spec: seen.append(spec) or ChainTiming({"aten": 1.0}))
    (spec,) = seen
    first, second = spec.convs
    assert spec.inputs == (((1, 4, 7, 7), False),)
    assert (first.x, first.other, second.x) == (-1, None, 0)
    assert second.pre_pad == (0, 1, 0, 1)  # the asymmetric pad, absorbed into its reader
    assert second.x_shape == (1, 4, 7, 7) and second.out_shape == (1, 4, 7, 7)
    assert first.read_outside and second.read_outside  # both read by the add outside
    assert second.hands_back is False and first.hands_back is False


def test_timings_are_cached_per_chain_signature(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []

    def fake(spec: ChainSpec) -> ChainTiming:
        calls.append(spec.name)
        return ChainTiming({"aten": 1e-4, "aten_cl": 5e-5, "onednn": math.inf}, note="seen")

    monkeypatch.setattr(layout_timing, "measure_chain", fake)
    g = g_chain(3)
    first = choose_layouts(g, layout.timer_for(str(tmp_path)))
    again = choose_layouts(g_chain(3, "renamed"), layout.timer_for(str(tmp_path)))  # recompile: a hit
    assert len(calls) == 1
    assert _routes(first) == _routes(again) == ["aten_cl"] * 3
    (record,) = (tmp_path / "layouts").glob("*/*.json")
    assert '"onednn": null' in record.read_text()  # inf is kept as null: JSON has no inf
    choose_layouts(g_chain(4), layout.timer_for(str(tmp_path)))  # another signature: measured
    assert len(calls) == 2
    record.write_text("not json")
    assert _routes(choose_layouts(g, layout.timer_for(str(tmp_path)))) == ["aten_cl"] * 3
    assert len(calls) == 3  # an unreadable record is absent: measured again


def test_ties_take_the_preferred_route_not_the_lucky_one() -> None:
    """Channels-last routes within TIE of the fastest, or that the paired rounds could not tell from it
    (ChainTiming.tied), are tied: the first of PREFERRED among them runs, whichever measured faster this
    time, so recompiles on one machine agree. A tied route must clear NCHW's margin itself; outside
    the tie the fastest runs."""
    spec = ChainSpec(F32, (), ())
    within = layout.TIE / 2
    route, d = layout._decide(
        spec, ChainTiming({"aten": 1e-3, "onednn": 5e-4, "dnnl": 5e-4 * (1 + within)}), {}
    )
    assert (route, d[0]) == ("dnnl", "measured")
    assert "within 3% of the fastest, onednn" in d[1]
    rows = {r.route: r for r in d[2]}
    assert rows["dnnl"].chosen and "tied with dnnl" in rows["onednn"].reason
    beyond = {"aten": 1e-3, "onednn": 5e-4, "dnnl": 5e-4 * (1 + 2 * layout.TIE)}
    assert layout._decide(spec, ChainTiming(beyond), {})[0] == "onednn"
    route, d = layout._decide(spec, ChainTiming(beyond, tied=("dnnl",)), {})
    assert route == "dnnl" and "not told apart from the fastest, onednn" in d[1]
    # onednn clears the 5 % margin, dnnl (tied by time) does not: the fastest alone decides
    edge = {"aten": 1e-3, "onednn": 0.94e-3, "dnnl": 0.94e-3 * (1 + within)}
    assert edge["dnnl"] >= layout.MARGIN * edge["aten"]
    assert layout._decide(spec, ChainTiming(edge), {})[0] == "onednn"
    # a tied route left out (mkldnn=False) is not taken
    assert layout._decide(spec, ChainTiming(beyond, tied=("dnnl",)), {"dnnl": "left out"})[0] == "onednn"


def test_tied_routes_are_cached_with_the_timing(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []

    def fake(spec: ChainSpec) -> ChainTiming:
        calls.append(spec.name)
        return ChainTiming({"aten": 1e-3, "onednn": 5e-4, "dnnl": 6e-4}, tied=("dnnl",))

    monkeypatch.setattr(layout_timing, "measure_chain", fake)
    first = choose_layouts(g_chain(3), layout.timer_for(str(tmp_path)))
    again = choose_layouts(g_chain(3, "renamed"), layout.timer_for(str(tmp_path)))  # a cache hit
    assert len(calls) == 1
    assert _routes(first) == _routes(again) == ["dnnl"] * 3


def test_a_busy_machine_measures_nothing_and_caches_nothing(
    tmp_path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(layout_timing, "machine_busy", lambda: (True, "other processes use 1.7 cores"))
    monkeypatch.setattr(layout_timing, "_TIMINGS", {})
    monkeypatch.setattr(layout_timing, "_MEASUREMENT", [(lambda s: pytest.fail("measured"), ("aten",))])
    g = g_chain(2)
    events: list = []
    with caplog.at_level("INFO", logger="autofusion.passes"):
        out = layout.choose_layouts(g, layout.timer_for(str(tmp_path)), events=events)
    assert out is g  # NCHW
    assert "not cached" in caplog.text
    assert not list(tmp_path.glob("layouts/*/*.json"))
    (e,) = [ev.to_dict() for ev in events]
    assert e["how"] == "unmeasured" and "busy (other processes use 1.7 cores)" in e["reason"]
    assert next(r["route"] for r in e["routes"]) == "aten" and all(r["reason"] for r in e["routes"])


def test_unreliable_timings_decide_nothing_and_are_not_cached(
    tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """However they compare: rounds that disagree (another process took the cores) keep NCHW, and the
    measurement is tried ATTEMPTS times, then nothing is cached."""
    tries: list[int] = []

    def disturbed(spec: ChainSpec) -> ChainTiming:
        tries.append(1)
        return ChainTiming({"aten": 1.0, "aten_cl": 1e-3}, reliable=False, note="rounds disagree")

    monkeypatch.setattr(layout_timing, "machine_busy", lambda: (False, "quiet"))
    monkeypatch.setattr(layout_timing, "_TIMINGS", {})
    monkeypatch.setattr(layout_timing, "_MEASUREMENT", [(disturbed, ("aten", "aten_cl"))])
    g = g_chain(2)
    assert choose_layouts(g, layout.timer_for(str(tmp_path))) is g
    assert len(tries) == layout_timing.ATTEMPTS
    assert not list(tmp_path.glob("layouts/*/*.json"))
    tries.clear()
    monkeypatch.setattr(layout_timing, "RETRY_WITHIN_S", -1.0)  # a first attempt this slow: no retry
    assert choose_layouts(g, layout.timer_for(str(tmp_path))) is g
    assert len(tries) == 1


def test_no_measurement_registered_keeps_nchw(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(layout_timing, "_MEASUREMENT", [])
    monkeypatch.setattr(layout_timing, "_TIMINGS", {})
    t = layout_timing.measure_chain(ChainSpec(F32, (), ()))
    assert not t.reliable and "no chain measurement registered" in t.note


def _spec() -> ChainSpec:
    """conv (outside input) -> depthwise conv with an absorbed pad -> pointwise conv adding the first
    result (a residual) and handed back as a graph output."""
    n, c, h = 1, 8, 9
    conv0 = ChainConv("c0", -1, None, (n, c, h, h), (c, c, 3, 3), (n, c, h, h), (1, 1), (1, 1), (1, 1), 1,
                      "relu", (), False, False)  # fmt: skip
    conv1 = ChainConv("c1", 0, None, (n, c, h, h), (c, 1, 2, 2), (n, c, h, h), (1, 1), (0, 0), (1, 1), c,
                      "relu6", (0, 1, 0, 1), False, False)  # fmt: skip
    conv2 = ChainConv("c2", 1, 0, (n, c, h, h), (c, c, 1, 1), (n, c, h, h), (1, 1), (0, 0), (1, 1), 1,
                      "relu", (), True, True)  # fmt: skip
    return ChainSpec(F32, (((n, c, h, h), False),), (conv0, conv1, conv2))


def test_the_measurement_runs_every_route_of_the_library() -> None:
    """The real measurement: a finite, positive time per run for each of runtime/library.py's ROUTES
    (whether it is reliable depends on the machine's load), and the library's call counters untouched."""
    calls, pads = dict(library.ROUTE_CALLS), dict(library.PRE_PAD_CALLS)
    t = conv_chain.measure(_spec())
    assert list(t.route_s) == list(library.ROUTES)
    assert all(0 < s < 1 for s in t.route_s.values()), t
    assert dict(library.ROUTE_CALLS) == calls and dict(library.PRE_PAD_CALLS) == pads
    assert layout_timing.measured_routes() == library.ROUTES


def test_the_measured_runs_compute_the_chain(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each route's run is the chain itself: conv_bn_act called in order with the real data flow (the
    results, compared here across routes, agree)."""
    results: dict[str, list[torch.Tensor]] = {}
    real = library.conv_bn_act

    def spy(*args, **kw):
        y = real(*args, **kw)
        results.setdefault(args[14], []).append(y.float().contiguous().clone())
        return y

    monkeypatch.setattr(library, "conv_bn_act", spy)
    spec = _spec()
    gen = torch.Generator().manual_seed(0)
    ins = conv_chain._inputs(spec, gen, torch.float32)
    params = [(torch.randn(c.w_shape, generator=gen) * 0.3, torch.randn(c.w_shape[0], generator=gen))
              for c in spec.convs]  # fmt: skip
    with torch.no_grad():
        for route in library.ROUTES:
            conv_chain._runner(spec, route, ins, params)()
    ref = results["aten"]
    assert len(ref) == 3
    for route, ys in results.items():
        for a, b in zip(ys, ref, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4, msg=route)


def test_explain_shows_each_chain_and_its_routes() -> None:
    import io

    from rich.console import Console

    import autofusion
    from autofusion.tools.cli.explain import layouts_table

    conv = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU(), torch.nn.Conv2d(4, 4, 3)).eval()
    with torch.no_grad():
        cm = autofusion.compile(conv, (torch.randn(1, 3, 8, 8),), conv_layout="channels_last")
    assert layouts_table([e for e in cm.events if e["event"] != "layout.chain"]) is None
    table = layouts_table(cm.events)
    assert table is not None
    out = io.StringIO()
    Console(file=out, width=200).print(table)
    text = out.getvalue()
    assert "aten_cl" in text and "forced: conv_layout channels_last" in text
    events = [layout.LayoutChainEvent("g", "c0", 3, "onednn", "measured", "the fastest", (
        layout.RouteTime("aten", 2.0, False, "slower: 2.00x the chosen route's time"),
        layout.RouteTime("onednn", 1.0, True, "chosen: the fastest"),
    )).to_dict()]  # fmt: skip
    out = io.StringIO()
    Console(file=out, width=200).print(layouts_table(events))
    assert "2.000" in out.getvalue() and "slower: 2.00x" in out.getvalue()


def test_a_torch_op_reading_a_result_as_it_is_is_timed_with_the_chain(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """ResNet's stem: conv -> max_pool2d (an extern, which runs in whatever layout it is given: 11 ms on
    NCHW against 0.3 ms channels-last, seen) -> the next chain. The pooling is an edge of the stem's
    chain, timed in each route on the route's result, and it is no NCHW reader (no conversion charged)."""
    b = GraphBuilder("stem")
    x = b.add_input(TensorType(F32, (1, 3, 12, 12)), "x")
    y = b.add("conv", [x, b.add_input(TensorType(F32, (4, 3, 3, 3)), "w", InputRole.PARAM)], CONV)
    pool_t = TensorType(F32, (1, 4, 6, 6))
    from autofusion.ir.graph import Arg

    spec_attrs = {"target": "aten.max_pool2d.default", "args": (Arg(0), (2, 2)), "kwargs": (),
                  "out_types": (pool_t,)}  # fmt: skip
    pooled = b.add("extern", [y], spec_attrs)
    g = b.build([b.add("exp", [pooled])])
    seen: list[ChainSpec] = []
    out = choose_layouts(g, lambda spec: seen.append(spec) or ChainTiming({"aten": 2e-3, "aten_cl": 1e-3}))
    (spec,) = seen
    (edge,) = spec.edges
    assert (edge.member, edge.target) == (0, "aten.max_pool2d.default")
    assert spec.convs[0].read_outside is False
    _same_values(g, out)
    pooled_layouts: list[bool] = []
    real = torch.ops.aten.max_pool2d.default

    def spy(t, *a, **kw):
        pooled_layouts.append(t.is_contiguous(memory_format=torch.channels_last) and not t.is_contiguous())
        return real(t, *a, **kw)

    from autofusion.ir import interpret

    monkeypatch.setitem(interpret.PY_TARGETS, "aten.max_pool2d.default", spy)
    with torch.no_grad():
        gen = torch.Generator().manual_seed(0)
        ins = conv_chain._inputs(spec, gen, torch.float32)
        params = [
            (torch.randn(c.w_shape, generator=gen), torch.randn(c.w_shape[0], generator=gen))
            for c in spec.convs
        ]
        for route in ("aten", "aten_cl"):
            conv_chain._runner(spec, route, ins, params)()
    assert pooled_layouts == [False, True]  # NCHW on the plain route, channels-last on aten_cl
