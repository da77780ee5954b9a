"""Graph passes (passes/manager.py): golden before/after IR for each, and the values they keep.

Each case builds a small IR graph by hand, runs one pass and compares "before" and "after" with
tests/golden/passes/<pass>.txt; the reference runtime must give the same outputs on both (bitwise
for the exact rewrites), for fp32 and fp16.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import torch

import autofusion.runtime.library  # noqa: F401  (registers conv_bn_act, which routed convolutions call)
from autofusion.ir import DType, Graph, GraphBuilder, InputRole, TensorType, print_graph, verify
from autofusion.ir.interpret import run_graph
from autofusion.passes.horizontal import merge_sibling_matmuls
from autofusion.passes.layout import choose_layouts, eliminate_transposes
from autofusion.passes.layout_timing import ChainSpec, ChainTiming
from autofusion.passes.simplify.algebra import simplify
from autofusion.passes.simplify.cse import eliminate_common_subexpressions
from autofusion.passes.simplify.dce import eliminate_dead_nodes
from autofusion.passes.simplify.fold import fold_constants

F32, F16 = DType.float32, DType.float16
CONV = {"stride": (1, 1), "padding": (1, 1), "dilation": (1, 1), "transposed": False,
        "output_padding": (0, 0), "groups": 1, "has_bias": False}  # fmt: skip


def lit(b: GraphBuilder, value: float, dtype: DType = F32, shape: tuple[int, ...] = ()) -> int:
    attrs = {"value": value, "dtype": dtype}
    if shape:
        attrs["shape"] = shape
    return b.add("full", (), attrs)


def inputs_for(g: Graph, gen: torch.Generator) -> list[torch.Tensor]:
    out = []
    for gi in g.inputs:
        t = gi.value.type
        x = (
            torch.randn(t.shape, generator=gen)
            if t.dtype.is_float
            else torch.randint(-5, 5, t.shape, generator=gen)
        )
        x = x.to(t.dtype.to_torch())
        if t.dtype.is_float and x.numel() >= 4:  # the values identities must keep exactly
            x.view(-1)[:4] = torch.tensor([math.inf, -math.inf, math.nan, -0.0]).to(x.dtype)
        out.append(x)
    return out


def assert_same_values(before: Graph, after: Graph, exact: bool = True) -> None:
    verify(after)
    assert [gi.value.type for gi in after.inputs] == [gi.value.type for gi in before.inputs]
    gen = torch.Generator().manual_seed(0)
    xs = inputs_for(before, gen)
    ref, got = run_graph(before, xs), run_graph(after, xs)
    for r, o in zip(ref, got, strict=True):
        assert (r.dtype, r.shape) == (o.dtype, o.shape)
        if exact:
            # Bitwise, NaN and the sign of zero included.
            assert torch.equal(
                r.view(-1).view(torch.uint8) if r.dtype.is_floating_point else r,
                o.contiguous().view(-1).view(torch.uint8) if o.dtype.is_floating_point else o,
            )
        else:
            torch.testing.assert_close(o, r, rtol=1e-5 if r.dtype == torch.float32 else 2e-3, atol=1e-5,
                                       equal_nan=True)  # fmt: skip


def before_after(golden, name: str, before: Graph, after: Graph) -> None:
    golden(f"passes/{name}.txt", "# before\n" + print_graph(before) + "# after\n" + print_graph(after))


# ---- graphs, one per pass, each built for fp32 and fp16 ---------------------------------------------


def g_folding(dt: DType) -> Graph:
    b = GraphBuilder("folding")
    x = b.add_input(TensorType(dt, (4, 6)), "x")
    c = b.add_constant("table", torch.arange(6, dtype=dt.to_torch()) * 0.5, TensorType(dt, (6,)))
    two = lit(b, 2.0, dt)
    scaled = b.add("exp", [b.add("mul", [c, two])])  # const * literal -> a new constant
    uniform = b.add("add", [lit(b, 1.5, dt, (6,)), two])  # every element equal -> a `full` literal
    big = b.add("expand", [two], {"shape": (100, 100)})  # over the size cap: stays a broadcast
    y = b.add("add", [b.add("mul", [x, scaled]), uniform])
    return b.build([y, b.add("sum", [big], {"dims": ()})])


def g_cse(dt: DType) -> Graph:
    b = GraphBuilder("cse")
    x = b.add_input(TensorType(dt, (4, 6)), "x")
    y = b.add_input(TensorType(dt, (4, 6)), "y")
    s1 = b.add("add", [x, y])
    s2 = b.add("add", [y, x])  # commutative: the same value
    e1, e2 = b.add("exp", [s1]), b.add("exp", [s2])
    pz, nz = lit(b, 0.0, dt), lit(b, -0.0, dt)  # +0 and -0 are different literals
    d1, d2 = b.add("sub", [x, y]), b.add("sub", [y, x])  # not commutative: kept apart
    out = b.add("add", [b.add("mul", [e1, e2]), b.add("add", [d1, d2])])
    return b.build([out, b.add("div", [x, b.add("add", [y, pz])]), b.add("div", [x, b.add("add", [y, nz])])])


def g_algebra(dt: DType) -> Graph:
    b = GraphBuilder("algebra")
    x = b.add_input(TensorType(dt, (4, 6)), "x")
    one, zero, nzero = lit(b, 1.0, dt), lit(b, 0.0, dt), lit(b, -0.0, dt)
    a = b.add("mul", [one, b.add("mul", [x, one])])
    a = b.add("sub", [b.add("div", [a, one]), zero])
    a = b.add("add", [a, nzero])
    kept_add = b.add("add", [a, zero])  # x + 0.0 turns -0.0 into +0.0: kept
    kept_mul = b.add("mul", [a, zero])  # inf * 0 is nan: kept
    a = b.add("neg", [b.add("neg", [a])])
    a = b.add("relu", [b.add("relu", [a])])
    wide = DType.float64
    a = b.add("cast", [b.add("cast", [a], {"dtype": wide})], {"dtype": dt})  # lossless round trip
    narrow = b.add("cast", [b.add("cast", [x], {"dtype": DType.int32})], {"dtype": dt})  # lossy: kept
    r = b.add("reshape", [b.add("reshape", [a], {"shape": (24,)})], {"shape": (2, 12)})
    r = b.add("reshape", [r], {"shape": (4, 6)})
    e = b.add("expand", [a], {"shape": (4, 6)})
    s = b.add("slice", [e], {"dim": 1, "start": 0, "end": 6, "step": 1})
    bcast = b.add("mul", [lit(b, 1.0, dt, (2, 4, 6)), x])  # broadcasts x to a larger shape: kept
    return b.build([b.add("add", [r, s]), kept_add, kept_mul, narrow, bcast])


def g_transpose(dt: DType) -> Graph:
    b = GraphBuilder("transpose")
    x = b.add_input(TensorType(dt, (2, 3, 4, 5)), "x")
    a = b.add_input(TensorType(dt, (7, 5)), "a")
    w = b.add_input(TensorType(dt, (6, 5)), "w", InputRole.PARAM)
    bias = b.add_input(TensorType(dt, (6,)), "bias", InputRole.PARAM)
    back = b.add("permute", [b.add("permute", [x], {"dims": (0, 2, 1, 3)})], {"dims": (0, 2, 1, 3)})
    two = b.add("permute", [b.add("permute", [x], {"dims": (0, 2, 1, 3)})], {"dims": (0, 1, 3, 2)})
    wt = b.add("permute", [w], {"dims": (1, 0)})
    mm = b.add("mm", [a, wt])
    addmm = b.add("addmm", [bias, a, wt])
    return b.build([b.add("exp", [back]), b.add("exp", [two]), mm, addmm])


def g_conv(dt: DType) -> Graph:
    b = GraphBuilder("convs")
    x = b.add_input(TensorType(dt, (2, 4, 6, 6)), "x")
    w1 = b.add_input(TensorType(dt, (4, 4, 3, 3)), "w1", InputRole.PARAM)
    w2 = b.add_input(TensorType(dt, (4, 4, 3, 3)), "w2", InputRole.PARAM)
    y = b.add("relu", [b.add("conv", [x, w1], CONV)])
    return b.build([b.add("exp", [b.add("conv", [y, w2], CONV)])])


def g_siblings(dt: DType, const: bool = False) -> Graph:
    b = GraphBuilder("siblings")
    x = b.add_input(TensorType(dt, (2, 5, 8)), "x")
    gen = torch.Generator().manual_seed(1)
    outs = []
    for name, n in (("q", 8), ("k", 8), ("v", 4)):
        wt, bt = TensorType(dt, (n, 8)), TensorType(dt, (n,))
        if const:
            w = b.add_constant(f"w{name}", torch.randn(n, 8, generator=gen).to(dt.to_torch()), wt)
            bias = b.add_constant(f"b{name}", torch.randn(n, generator=gen).to(dt.to_torch()), bt)
        else:
            w = b.add_input(wt, f"w{name}", InputRole.PARAM)
            bias = b.add_input(bt, f"b{name}", InputRole.PARAM)
        outs.append(b.add("relu", [b.add("linear", [x, w, bias], {"has_bias": True})]))
    no_bias = b.add_input(TensorType(dt, (3, 8)), "w_nobias", InputRole.PARAM)
    outs.append(b.add("linear", [x, no_bias], {"has_bias": False}))  # a different signature: not merged
    return b.build(outs)


def _fast_nhwc(spec: ChainSpec) -> ChainTiming:  # the chain's time per run in each route
    n = len(spec.convs)
    return ChainTiming({"aten": 100e-6 * n, "aten_cl": 35e-6 * n, "onednn": 45e-6 * n})


def _slow_nhwc(spec: ChainSpec) -> ChainTiming:  # channels-last under 5 % faster: not worth it
    n = len(spec.convs)
    return ChainTiming({"aten": 100e-6 * n, "aten_cl": 96e-6 * n, "onednn": 97e-6 * n})


CASES: dict[str, tuple[Callable[[DType], Graph], Callable[[Graph], Graph], bool]] = {
    "constant_folding": (g_folding, fold_constants, True),
    "cse": (g_cse, eliminate_common_subexpressions, True),
    "algebraic_simplify": (g_algebra, simplify, True),
    "layout_transpose_eliminate": (g_transpose, eliminate_transposes, False),
    "channels_last_pays": (g_conv, lambda g: choose_layouts(g, _fast_nhwc), False),
    "channels_last_does_not_pay": (g_conv, lambda g: choose_layouts(g, _slow_nhwc), True),
    "horizontal_pattern": (g_siblings, lambda g: merge_sibling_matmuls(g, None), False),
    "horizontal_pattern_const": (
        lambda dt: g_siblings(dt, True),
        lambda g: merge_sibling_matmuls(g, None),
        False,
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_golden_before_after(name: str, golden) -> None:
    build, run, _exact = CASES[name]
    before = build(F32)
    after = eliminate_dead_nodes(run(before))
    before_after(golden, name, before, after)


@pytest.mark.parametrize("dt", [F32, F16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_values_kept(name: str, dt: DType) -> None:
    build, run, exact = CASES[name]
    before = build(dt)
    after = eliminate_dead_nodes(run(before))
    assert_same_values(before, after, exact=exact)
    if name != "channels_last_does_not_pay":
        assert print_graph(after) != print_graph(before), f"{name} changed nothing"
    else:
        assert after is before


def test_nothing_to_do_returns_the_same_graph() -> None:
    b = GraphBuilder("plain")
    x = b.add_input(TensorType(F32, (3,)), "x")
    g = b.build([b.add("exp", [x])])
    for fn in (fold_constants, eliminate_common_subexpressions, simplify, eliminate_transposes,
               choose_layouts, merge_sibling_matmuls):  # fmt: skip
        assert fn(g) is g


def test_folding_respects_the_size_cap() -> None:
    b = GraphBuilder("cap")
    c = b.add_constant("c", torch.ones(50, 50), TensorType(F32, (50, 50)))
    g = b.build([b.add("exp", [c])])
    assert fold_constants(g, max_elements=100) is g
    folded = eliminate_dead_nodes(fold_constants(g, max_elements=10_000))
    assert [n.op for n in folded.nodes] == ["full"]  # exp(1) everywhere: a literal, nothing baked


def test_folding_never_runs_random_externs() -> None:
    b = GraphBuilder("rand")
    r = b.add("extern", [], {"target": "aten.rand.default", "args": ((3,),), "kwargs": (),
                             "out_types": (TensorType(F32, (3,)),)})  # fmt: skip
    g = b.build([b.add("exp", [r]), b.add("exp", [r])])
    assert fold_constants(g) is g
    assert len(eliminate_common_subexpressions(g).nodes) == 2  # one draw, one exp


def test_random_externs_are_not_merged() -> None:
    b = GraphBuilder("rand2")
    spec = {
        "target": "aten.rand.default",
        "args": ((3,),),
        "kwargs": (),
        "out_types": (TensorType(F32, (3,)),),
    }
    g = b.build([b.add("extern", [], spec), b.add("extern", [], spec)])
    assert eliminate_common_subexpressions(g) is g


def test_channels_last_skips_transposed_and_hands_graph_outputs_back_nchw(
    caplog: pytest.LogCaptureFixture,
) -> None:
    b = GraphBuilder("convout")
    x = b.add_input(TensorType(F32, (1, 4, 5, 5)), "x")
    w = b.add_input(TensorType(F32, (4, 4, 3, 3)), "w", InputRole.PARAM)
    wt = b.add_input(TensorType(F32, (4, 4, 3, 3)), "wt", InputRole.PARAM)
    y = b.add("conv", [x, w], CONV)
    z = b.add("conv", [b.add("exp", [y]), wt], {**CONV, "transposed": True})
    g = b.build([y, z])
    out = choose_layouts(g, _fast_nhwc)
    (call,) = [n for n in out.nodes if n.op == "extern"]
    assert call.attr("args")[-2:] == ("aten_cl", False)  # a graph output: NCHW, as eager's
    assert out.value_types()[out.outputs[0]].is_contiguous
    assert [n.attr("transposed") for n in out.nodes if n.op == "conv"] == [True]  # not routed
    assert_same_values(g, out, exact=False)


def test_a_chain_is_decided_as_a_whole() -> None:
    """A chain of four convolutions is timed as one unit, its conversions at its two ends: the whole
    chain runs channels-last, and its intermediate results are declared NHWC-strided (the kernels
    reading them index those strides). The fake timer charges what the spec says crosses the edges."""
    b = GraphBuilder("chain")
    x = b.add_input(TensorType(F32, (1, 4, 6, 6)), "x")
    v = x
    for k in range(4):
        wk = b.add_input(TensorType(F32, (4, 4, 3, 3)), f"w{k}", InputRole.PARAM)
        v = b.add("conv", [v, wk], CONV)
    g = b.build([b.add("exp", [v])])
    seen: list[ChainSpec] = []

    def t(spec: ChainSpec, conversion: float = 30e-6) -> ChainTiming:  # 25 us saved per conv
        seen.append(spec)
        edges = len(spec.inputs) + sum(c.read_outside for c in spec.convs)
        return ChainTiming({"aten": 100e-6 * 4, "aten_cl": 75e-6 * 4 + conversion * edges})

    out = choose_layouts(g, t)
    (spec,) = seen
    assert [c.x for c in spec.convs] == [-1, 0, 1, 2]  # the outside input, then each member's result
    assert [c.read_outside for c in spec.convs] == [False, False, False, True]
    calls = [n for n in out.nodes if n.op == "extern"]
    assert [c.attr("args")[-2:] for c in calls] == [("aten_cl", True)] * 4
    assert all(not c.out.type.is_contiguous for c in calls)
    assert_same_values(g, out, exact=False)
    assert choose_layouts(g, lambda spec: t(spec, 50e-6)) is g  # 100 us of conversions: no


def test_horizontal_pattern_declines_when_the_weight_copy_costs_more(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from autofusion.hw.profile import load_profile

    g = g_siblings(F32)  # x has 80 elements; the weights 200: copying them per call does not pay
    with caplog.at_level("INFO", logger="autofusion.passes"):
        assert merge_sibling_matmuls(g, load_profile("cpu")) is g
    assert "not merged: saves" in caplog.text
    assert "differ in (op, dtype, k, bias)" in caplog.text


def test_horizontal_pattern_mm_siblings() -> None:
    b = GraphBuilder("mm")
    x = b.add_input(TensorType(F32, (6, 8)), "x")
    ws = [b.add_input(TensorType(F32, (8, n)), f"w{n}", InputRole.PARAM) for n in (3, 5)]
    g = b.build([b.add("exp", [b.add("mm", [x, w])]) for w in ws])
    after = eliminate_dead_nodes(merge_sibling_matmuls(g, None))
    assert [n.op for n in after.nodes].count("mm") == 1
    assert_same_values(g, after, exact=False)


def test_horizontal_pattern_needs_weights_defined_first() -> None:
    b = GraphBuilder("late")
    x = b.add_input(TensorType(F32, (6, 8)), "x")
    w = b.add_input(TensorType(F32, (4, 8)), "w", InputRole.PARAM)
    y1 = b.add("linear", [x, w], {"has_bias": False})
    w2 = b.add("exp", [w])  # computed after the first sibling
    y2 = b.add("linear", [x, w2], {"has_bias": False})
    g = b.build([y1, y2])
    assert merge_sibling_matmuls(g, None) is g


def test_cse_keeps_maximum_operand_order() -> None:
    """maximum(+0.0, -0.0) is +0.0 and maximum(-0.0, +0.0) is -0.0: not a commutative op for CSE."""
    b = GraphBuilder("max")
    x = b.add_input(TensorType(F32, (2,)), "x")
    y = b.add("neg", [x])
    g = b.build([b.add("maximum", [x, y]), b.add("maximum", [y, x])])
    assert eliminate_common_subexpressions(g) is g
    xs = [torch.tensor([0.0, -0.0])]
    a, c = run_graph(g, xs)
    assert torch.signbit(a).tolist() != torch.signbit(c).tolist()


@pytest.mark.parametrize("xshape", [(8,), (1, 8), (0, 8), (2, 1, 8)], ids=str)
def test_horizontal_pattern_edge_shapes(xshape: tuple[int, ...]) -> None:
    b = GraphBuilder("edge")
    x = b.add_input(TensorType(F32, xshape), "x")
    ws = [b.add_input(TensorType(F32, (n, 8)), f"w{n}", InputRole.PARAM) for n in (1, 3)]
    g = b.build([b.add("linear", [x, w], {"has_bias": False}) for w in ws])
    after = eliminate_dead_nodes(merge_sibling_matmuls(g, None))
    assert [n.op for n in after.nodes].count("linear") == 1
    assert_same_values(g, after, exact=False)
