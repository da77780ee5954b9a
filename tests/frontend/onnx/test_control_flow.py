"""If, Loop and Scan against onnxruntime: subgraphs converted by the ONNX frontend, compiled, run by externs
(frontend/onnx/control.py); an If whose condition is known at import is inlined."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper

import autofusion
from autofusion.errors import FrontendError
from autofusion.frontend import subgraph
from autofusion.frontend.onnx import control
from autofusion.frontend.subgraph import hosts

F32 = np.float32


def vi(name: str, elem: int, shape: Sequence[int | str] | None) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, None if shape is None else list(shape))


def body(nodes: list[onnx.NodeProto], ins: list[onnx.ValueInfoProto], outs: list[onnx.ValueInfoProto]) -> Any:
    return helper.make_graph(nodes, "body", ins, outs)


def model(nodes: list[onnx.NodeProto], ins: list[onnx.ValueInfoProto], outs: list[onnx.ValueInfoProto],
          opset: int = 17) -> onnx.ModelProto:  # fmt: skip
    graph = helper.make_graph(nodes, "g", ins, outs)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m


@pytest.fixture(params=["unrolled", "extern"])
def unroll(request, monkeypatch) -> bool:
    """Both routes of a Loop or Scan with a trip count known at import: unrolled into the main graph, or
    one extern running the compiled body per step (what longer ones take)."""
    if request.param == "extern":
        monkeypatch.setattr(control, "UNROLL_NODES", 0)
    return request.param == "unrolled"


def check_route(cm: Any, unrolled: bool, steps: int) -> None:
    externs = [n for n in cm.graph.nodes if n.op == "extern"]
    if unrolled:
        assert not externs  # every step is part of the main graph (and its kernels ran: onnx_equal)
    else:
        assert len(externs) == 1 and body_calls(cm) >= steps  # the body ran as generated code per step


def body_calls(cm: Any) -> int:
    """Calls into generated code by the subgraphs of the last compiled graph's externs."""
    return sum(h.generated_calls for h in hosts(cm.graph))


# ---- Scan -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("in_axis", "in_dir", "out_axis", "out_dir"),
    [(0, 0, 0, 0), (1, 1, 0, 0), (0, 0, 1, 1), (-1, 1, -1, 0), (1, 0, 1, 1)],
)
def test_scan_axes_and_directions(onnx_equal, rng, unroll: bool, in_axis: int, in_dir: int, out_axis: int,
                                  out_dir: int) -> None:  # fmt: skip
    # A running sum with a second state (a running max), the body reading an outer runtime value (w) and
    # an outer constant (c); x is [3, 4, 5] and scanned along in_axis.
    x_shape = [3, 4, 5]
    ax = in_axis % 3
    slice_shape = [d for k, d in enumerate(x_shape) if k != ax]
    b = body(
        [
            helper.make_node("Add", ["s_in", "x_t"], ["s_out"]),
            helper.make_node("Max", ["m_in", "x_t"], ["m_out"]),
            helper.make_node("Mul", ["s_out", "w"], ["y0"]),
            helper.make_node("Add", ["y0", "c"], ["y_t"]),
            helper.make_node("Sigmoid", ["m_out"], ["z_t"]),
        ],
        [vi(n, TP.FLOAT, slice_shape) for n in ("s_in", "m_in", "x_t")],
        [vi(n, TP.FLOAT, slice_shape) for n in ("s_out", "m_out", "y_t", "z_t")],
    )  # fmt: skip
    n = x_shape[ax]
    out_shape = list(slice_shape)
    out_shape.insert(out_axis % 3, n)
    m = model(
        [
            helper.make_node("Constant", [], ["c"], value=helper.make_tensor("c", TP.FLOAT, [], [0.5])),
            helper.make_node("Tanh", ["wi"], ["w"]),
            helper.make_node(
                "Scan", ["s0", "m0", "x"], ["s", "mx", "y", "z"], num_scan_inputs=1, body=b,
                scan_input_axes=[in_axis], scan_input_directions=[in_dir],
                scan_output_axes=[out_axis, out_axis], scan_output_directions=[out_dir, 1 - out_dir],
            ),
        ],
        [vi("s0", TP.FLOAT, slice_shape), vi("m0", TP.FLOAT, slice_shape), vi("x", TP.FLOAT, x_shape),
         vi("wi", TP.FLOAT, slice_shape)],
        [vi("s", TP.FLOAT, slice_shape), vi("mx", TP.FLOAT, slice_shape), vi("y", TP.FLOAT, out_shape),
         vi("z", TP.FLOAT, out_shape)],
    )  # fmt: skip
    arrays = [rng.standard_normal(s).astype(F32) for s in (slice_shape, slice_shape, x_shape, slice_shape)]
    check_route(onnx_equal(m, *arrays), unroll, n)


def test_scan_two_scan_inputs_fp16(onnx_equal, rng, unroll: bool) -> None:
    b = body(
        [helper.make_node("MatMul", ["a_t", "s_in"], ["p"]), helper.make_node("Add", ["p", "b_t"], ["s_out"]),
         helper.make_node("Relu", ["s_out"], ["y_t"])],
        [vi("s_in", TP.FLOAT16, [4, 4]), vi("a_t", TP.FLOAT16, [4, 4]), vi("b_t", TP.FLOAT16, [4, 4])],
        [vi("s_out", TP.FLOAT16, [4, 4]), vi("y_t", TP.FLOAT16, [4, 4])],
    )  # fmt: skip
    m = model(
        [helper.make_node("Scan", ["s0", "a", "bb"], ["s", "y"], num_scan_inputs=2, body=b,
                          scan_input_axes=[0, 2])],
        [vi("s0", TP.FLOAT16, [4, 4]), vi("a", TP.FLOAT16, [3, 4, 4]), vi("bb", TP.FLOAT16, [4, 4, 3])],
        [vi("s", TP.FLOAT16, [4, 4]), vi("y", TP.FLOAT16, [3, 4, 4])],
    )  # fmt: skip
    arrays = [(rng.standard_normal(s) * 0.3).astype(np.float16) for s in ([4, 4], [3, 4, 4], [4, 4, 3])]
    check_route(onnx_equal(m, *arrays), unroll, 3)


def test_scan_of_length_zero(rng) -> None:
    # (onnxruntime refuses a scan over nothing: the states come back unchanged, the scan outputs empty.)
    b = body([helper.make_node("Add", ["s_in", "x_t"], ["s_out"]),
              helper.make_node("Neg", ["s_out"], ["y_t"])],
             [vi("s_in", TP.FLOAT, [2]), vi("x_t", TP.FLOAT, [2])],
             [vi("s_out", TP.FLOAT, [2]), vi("y_t", TP.FLOAT, [2])])  # fmt: skip
    m = model([helper.make_node("Scan", ["s0", "x"], ["s", "y"], num_scan_inputs=1, body=b)],
              [vi("s0", TP.FLOAT, [2]), vi("x", TP.FLOAT, [0, 2])],
              [vi("s", TP.FLOAT, [2]), vi("y", TP.FLOAT, [0, 2])])  # fmt: skip
    s0, x = rng.standard_normal(2).astype(F32), np.zeros((0, 2), F32)
    s, y = autofusion.compile(m)(s0, x)
    np.testing.assert_array_equal(s.numpy(), s0)
    assert tuple(y.shape) == (0, 2)


# ---- If ---------------------------------------------------------------------------------------------


def _if_model(cond_input: bool) -> onnx.ModelProto:
    """y = If(cond) then (x * w + 1, sum over rows) else (x - w, max over rows); x, w outer values."""
    then = body(
        [helper.make_node("Mul", ["x", "w"], ["t0"]), helper.make_node("Add", ["t0", "one"], ["t_out"]),
         helper.make_node("ReduceSum", ["t_out", "ax"], ["t_red"], keepdims=0)],
        [], [vi("t_out", TP.FLOAT, [3, 5]), vi("t_red", TP.FLOAT, [5])],
    )  # fmt: skip
    other = body(
        [helper.make_node("Sub", ["x", "w"], ["e_out"]),
         helper.make_node("ReduceMax", ["e_out"], ["e_red"], axes=[0], keepdims=0)],
        [], [vi("e_out", TP.FLOAT, [3, 5]), vi("e_red", TP.FLOAT, [5])],
    )  # fmt: skip
    nodes = [
        helper.make_node("Constant", [], ["one"], value=helper.make_tensor("one", TP.FLOAT, [], [1.0])),
        helper.make_node("Constant", [], ["ax"], value=helper.make_tensor("ax", TP.INT64, [1], [0])),
        helper.make_node("Exp", ["wi"], ["w"]),
    ]
    ins = [vi("x", TP.FLOAT, [3, 5]), vi("wi", TP.FLOAT, [3, 5])]
    if cond_input:
        ins.insert(0, vi("cond", TP.BOOL, []))
    else:
        true = helper.make_tensor("c", TP.BOOL, [], [True])
        nodes.append(helper.make_node("Constant", [], ["cond"], value=true))
    nodes.append(helper.make_node("If", ["cond"], ["y", "r"], then_branch=then, else_branch=other))
    nodes.append(helper.make_node("Relu", ["y"], ["out"]))
    return model(nodes, ins, [vi("out", TP.FLOAT, [3, 5]), vi("r", TP.FLOAT, [5])], opset=13)


@pytest.mark.parametrize("cond", [True, False])
def test_if_runs_the_branch_the_condition_picks(onnx_equal, rng, cond: bool) -> None:
    x, w = rng.standard_normal((3, 5)).astype(F32), rng.standard_normal((3, 5)).astype(F32)
    cm = onnx_equal(_if_model(True), np.array(cond), x, w)
    assert body_calls(cm) == 1  # the branch taken ran as generated code, the other not at all
    assert [n.op for n in cm.graph.nodes].count("extern") == 1


def test_if_known_at_import_is_inlined(onnx_equal, rng) -> None:
    x, w = rng.standard_normal((3, 5)).astype(F32), rng.standard_normal((3, 5)).astype(F32)
    cm = onnx_equal(_if_model(False), x, w)
    assert "extern" not in [n.op for n in cm.graph.nodes]  # the then branch is part of the main graph


def test_nested_if_inside_a_scan(onnx_equal, rng, unroll: bool) -> None:
    # The inner If reads the Scan body's state and an outer-scope value of the main graph (k).
    inner_then = body([helper.make_node("Add", ["s_in", "k"], ["a"])], [], [vi("a", TP.FLOAT, [2])])
    inner_else = body([helper.make_node("Sub", ["s_in", "x_t"], ["a2"])], [], [vi("a2", TP.FLOAT, [2])])
    b = body(
        [helper.make_node("ReduceSum", ["x_t"], ["tot"], keepdims=0),
         helper.make_node("Greater", ["tot", "zero"], ["pos"]),
         helper.make_node("If", ["pos"], ["s_out"], then_branch=inner_then, else_branch=inner_else),
         helper.make_node("Identity", ["s_out"], ["y_t"])],
        [vi("s_in", TP.FLOAT, [2]), vi("x_t", TP.FLOAT, [2])],
        [vi("s_out", TP.FLOAT, [2]), vi("y_t", TP.FLOAT, [2])],
    )  # fmt: skip
    m = model(
        [helper.make_node("Constant", [], ["zero"], value=helper.make_tensor("z", TP.FLOAT, [], [0.0])),
         helper.make_node("Scan", ["s0", "x"], ["s", "y"], num_scan_inputs=1, body=b)],
        [vi("s0", TP.FLOAT, [2]), vi("x", TP.FLOAT, [6, 2]), vi("k", TP.FLOAT, [2])],
        [vi("s", TP.FLOAT, [2]), vi("y", TP.FLOAT, [6, 2])],
    )  # fmt: skip
    arrays = [rng.standard_normal(s).astype(F32) for s in ([2], [6, 2], [2])]
    cm = onnx_equal(m, *arrays)
    targets = [n.attr("target") for n in cm.graph.nodes if n.op == "extern"]
    assert targets == ([control.IF_TARGET] * 6 if unroll else [control.SCAN_TARGET])


def test_if_branches_of_different_shapes_are_named(rng) -> None:
    then = body([helper.make_node("Identity", ["x"], ["a"])], [], [vi("a", TP.FLOAT, [4])])
    other = body([helper.make_node("Slice", ["x", "st", "en"], ["b"])], [], [vi("b", TP.FLOAT, [2])])
    m = model(
        [helper.make_node("Constant", [], ["st"], value=helper.make_tensor("st", TP.INT64, [1], [0])),
         helper.make_node("Constant", [], ["en"], value=helper.make_tensor("en", TP.INT64, [1], [2])),
         helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)],
        [vi("c", TP.BOOL, []), vi("x", TP.FLOAT, [4])], [vi("y", TP.FLOAT, ["d"])],
    )  # fmt: skip
    with pytest.raises(FrontendError, match=r"\(If, opset \d+\).*branches give different types"):
        autofusion.compile(m)


def test_if_with_sequence_outputs_is_named(rng) -> None:
    # (The branches' SequenceConstruct of constants would fold at import; the If's output is still a
    # sequence, which autofusion's graphs do not hold: an error, not a tensor in its place.)
    def branch(v: float) -> Any:
        const = helper.make_node("Constant", [], ["t"], value=helper.make_tensor("t", TP.FLOAT, [2], [v, v]))
        seq = helper.make_node("SequenceConstruct", ["t"], ["s"])
        return body([const, seq], [], [helper.make_tensor_sequence_value_info("s", TP.FLOAT, [2])])

    graph = helper.make_graph(
        [helper.make_node("If", ["c"], ["y"], then_branch=branch(1.0), else_branch=branch(2.0))], "g",
        [vi("c", TP.BOOL, [])], [helper.make_tensor_sequence_value_info("y", TP.FLOAT, [2])],
    )  # fmt: skip
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    with pytest.raises(
        FrontendError, match=r"then_branch output 's' is not a tensor \(its type is sequence_type\)"
    ):
        autofusion.compile(m)


# ---- Loop -------------------------------------------------------------------------------------------


def _loop_body(with_scan: bool, stop_at: float | None) -> Any:
    """acc += x * i (i the iteration number, as float) + w; optionally scan out acc; the condition is
    acc's sum below `stop_at` (None: the condition passed through)."""
    nodes = [
        helper.make_node("Cast", ["i"], ["fi"], to=TP.FLOAT),
        helper.make_node("Mul", ["x", "fi"], ["xi"]),
        helper.make_node("Add", ["acc_in", "xi"], ["a1"]),
        helper.make_node("Add", ["a1", "w"], ["acc_out"]),
    ]
    if stop_at is None:
        nodes.append(helper.make_node("Identity", ["c_in"], ["c_out"]))
    else:
        nodes += [
            helper.make_node("ReduceSum", ["acc_out"], ["tot"], keepdims=0),
            helper.make_node("Constant", [], ["lim"], value=helper.make_tensor("l", TP.FLOAT, [], [stop_at])),
            helper.make_node("Less", ["tot", "lim"], ["c_out"]),
        ]
    outs = [vi("c_out", TP.BOOL, []), vi("acc_out", TP.FLOAT, [2, 3])]
    if with_scan:
        nodes.append(helper.make_node("Sigmoid", ["acc_out"], ["sc"]))
        outs.append(vi("sc", TP.FLOAT, [2, 3]))
    return body(nodes, [vi("i", TP.INT64, []), vi("c_in", TP.BOOL, []), vi("acc_in", TP.FLOAT, [2, 3])], outs)


def test_loop_for_with_scan_output(onnx_equal, rng, unroll: bool) -> None:
    m = model(
        [helper.make_node("Constant", [], ["n"], value=helper.make_tensor("n", TP.INT64, [], [4])),
         helper.make_node("Loop", ["n", "", "a0"], ["acc", "scan"], body=_loop_body(True, None))],
        [vi("a0", TP.FLOAT, [2, 3]), vi("x", TP.FLOAT, [2, 3]), vi("w", TP.FLOAT, [2, 3])],
        [vi("acc", TP.FLOAT, [2, 3]), vi("scan", TP.FLOAT, [4, 2, 3])],
    )  # fmt: skip
    cm = onnx_equal(m, *[rng.standard_normal((2, 3)).astype(F32) for _ in range(3)])
    check_route(cm, unroll, 4)


@pytest.mark.parametrize("trip", [0, 1, 7, 100])
def test_loop_while_condition_and_trip_count_inputs(onnx_equal, rng, trip: int) -> None:
    # Both the trip count and the first condition come at run time; the body stops once the sum of acc
    # reaches 20 (or the trip count runs out first).
    m = model(
        [helper.make_node("Loop", ["n", "c", "a0"], ["acc"], body=_loop_body(False, 20.0))],
        [vi("n", TP.INT64, []), vi("c", TP.BOOL, []), vi("a0", TP.FLOAT, [2, 3]), vi("x", TP.FLOAT, [2, 3]),
         vi("w", TP.FLOAT, [2, 3])],
        [vi("acc", TP.FLOAT, [2, 3])],
    )  # fmt: skip
    x = np.abs(rng.standard_normal((2, 3))).astype(F32)
    onnx_equal(m, np.array(trip, np.int64), np.array(True), np.zeros((2, 3), F32), x, x)
    onnx_equal(m, np.array(trip, np.int64), np.array(False), np.ones((2, 3), F32), x, x)


def test_loop_scan_output_length_from_the_declared_shape(onnx_equal, rng) -> None:
    # As onnx's test_loop11: the trip count is an input, the model declares the scan output's length.
    m = model(
        [helper.make_node("Loop", ["n", "c", "a0"], ["acc", "scan"], body=_loop_body(True, None))],
        [vi("n", TP.INT64, []), vi("c", TP.BOOL, []), vi("a0", TP.FLOAT, [2, 3]), vi("x", TP.FLOAT, [2, 3]),
         vi("w", TP.FLOAT, [2, 3])],
        [vi("acc", TP.FLOAT, [2, 3]), vi("scan", TP.FLOAT, [5, 2, 3])],
    )  # fmt: skip
    arrays = [rng.standard_normal((2, 3)).astype(F32) for _ in range(3)]
    cm = onnx_equal(m, np.array(5, np.int64), np.array(True), *arrays)
    with pytest.raises(Exception, match=r"Loop scan output 0 \(after 3 iterations\) has shape \[3, 2, 3\]"):
        cm(np.array(3, np.int64), np.array(True), *arrays)


def _loop11_model() -> onnx.ModelProto:
    b = body(
        [helper.make_node("Constant", [], ["xs"],
                          value=helper.make_tensor("xs", TP.FLOAT, [5], [1, 2, 3, 4, 5])),
         helper.make_node("Constant", [], ["one"], value=helper.make_tensor("one", TP.INT64, [], [1])),
         helper.make_node("Add", ["i", "one"], ["end"]),
         helper.make_node("Unsqueeze", ["i", "ax"], ["st"]),
         helper.make_node("Unsqueeze", ["end", "ax"], ["en"]),
         helper.make_node("Slice", ["xs", "st", "en"], ["sl"]),
         helper.make_node("Add", ["y_in", "sl"], ["y_out"]),
         helper.make_node("Identity", ["c_in"], ["c_out"]),
         helper.make_node("Identity", ["y_out"], ["sc"])],
        [vi("i", TP.INT64, []), vi("c_in", TP.BOOL, []), vi("y_in", TP.FLOAT, [1])],
        [vi("c_out", TP.BOOL, []), vi("y_out", TP.FLOAT, [1]), vi("sc", TP.FLOAT, [1])],
    )  # fmt: skip
    m = model(
        [helper.make_node("Constant", [], ["ax"], value=helper.make_tensor("ax", TP.INT64, [1], [0])),
         helper.make_node("Loop", ["n", "c", "y"], ["res", "scan"], body=b)],
        [vi("n", TP.INT64, []), vi("c", TP.BOOL, []), vi("y", TP.FLOAT, [1])],
        [vi("res", TP.FLOAT, [1]), vi("scan", TP.FLOAT, [5, 1])],
    )  # fmt: skip
    return m


@pytest.mark.parametrize("max_compiled", [16, 2])
def test_loop_body_specialised_on_the_iteration_number(onnx_equal, monkeypatch, max_compiled: int) -> None:
    # As onnx's test_loop11: the body slices a constant at [i, i + 1), a shape computed from the
    # iteration number; the body is converted and compiled per iteration number (at most
    # MAX_COMPILED versions compiled, later ones run on the reference runtime).
    monkeypatch.setattr(subgraph, "MAX_COMPILED", max_compiled)
    cm = onnx_equal(_loop11_model(), np.array(5, np.int64), np.array(True), np.array([-2.0], F32))
    (host,) = hosts(cm.graph)
    assert host.fixed == (0,) and len(host._compiled) == 5
    assert host.generated_calls == min(5, max_compiled)


def test_loop_carried_value_growing_step_by_step_is_unrolled(onnx_equal, rng) -> None:
    # acc grows by one row per step ([1, 3] -> [4, 3]): each unrolled step is converted for its own types.
    b = body(
        [helper.make_node("Mul", ["x", "x"], ["xx"]),
         helper.make_node("Concat", ["acc_in", "xx"], ["acc_out"], axis=0),
         helper.make_node("Identity", ["c_in"], ["c_out"])],
        [vi("i", TP.INT64, []), vi("c_in", TP.BOOL, []), vi("acc_in", TP.FLOAT, ["r", 3])],
        [vi("c_out", TP.BOOL, []), vi("acc_out", TP.FLOAT, ["r2", 3])],
    )  # fmt: skip
    m = model(
        [helper.make_node("Constant", [], ["n"], value=helper.make_tensor("n", TP.INT64, [], [3])),
         helper.make_node("Loop", ["n", "", "a0"], ["acc"], body=b),
         helper.make_node("Relu", ["acc"], ["y"])],
        [vi("a0", TP.FLOAT, [1, 3]), vi("x", TP.FLOAT, [1, 3])], [vi("y", TP.FLOAT, [4, 3])],
    )  # fmt: skip
    cm = onnx_equal(m, *[rng.standard_normal((1, 3)).astype(F32) for _ in range(2)])
    assert "extern" not in [n.op for n in cm.graph.nodes]


@pytest.mark.parametrize("first", [True, False])
def test_loop_known_trip_count_runtime_condition(onnx_equal, rng, first: bool) -> None:
    # The trip count is known at import but the first condition is not: no unrolling, and a False
    # condition runs no step at all.
    m = model(
        [helper.make_node("Constant", [], ["n"], value=helper.make_tensor("n", TP.INT64, [], [6])),
         helper.make_node("Loop", ["n", "c", "a0"], ["acc"], body=_loop_body(False, 20.0))],
        [vi("c", TP.BOOL, []), *(vi(n, TP.FLOAT, [2, 3]) for n in ("a0", "x", "w"))],
        [vi("acc", TP.FLOAT, [2, 3])],
    )  # fmt: skip
    x = np.abs(rng.standard_normal((2, 3))).astype(F32)
    cm = onnx_equal(m, np.array(first), np.zeros((2, 3), F32), x, x)
    assert [n.op for n in cm.graph.nodes].count("extern") == 1


def test_loop_specialised_body_whose_condition_stops_it(onnx_equal, unroll: bool) -> None:
    # The body slices at [i, i + 1) (so it is specialised on i) and stops once i reaches 2, before the
    # trip count of 5: the step at i = 2 has a condition folded to False, so it is not unrolled.
    b = body(
        [helper.make_node("Constant", [], ["xs"],
                          value=helper.make_tensor("xs", TP.FLOAT, [5], [1, 2, 3, 4, 5])),
         helper.make_node("Constant", [], ["one"], value=helper.make_tensor("one", TP.INT64, [], [1])),
         helper.make_node("Constant", [], ["two"], value=helper.make_tensor("two", TP.INT64, [], [2])),
         helper.make_node("Add", ["i", "one"], ["end"]),
         helper.make_node("Unsqueeze", ["i", "ax"], ["st"]),
         helper.make_node("Unsqueeze", ["end", "ax"], ["en"]),
         helper.make_node("Slice", ["xs", "st", "en"], ["sl"]),
         helper.make_node("Add", ["y_in", "sl"], ["y_out"]),
         helper.make_node("Less", ["i", "two"], ["c_out"])],
        [vi("i", TP.INT64, []), vi("c_in", TP.BOOL, []), vi("y_in", TP.FLOAT, [1])],
        [vi("c_out", TP.BOOL, []), vi("y_out", TP.FLOAT, [1])],
    )  # fmt: skip
    m = model(
        [helper.make_node("Constant", [], ["ax"], value=helper.make_tensor("ax", TP.INT64, [1], [0])),
         helper.make_node("Constant", [], ["n"], value=helper.make_tensor("n", TP.INT64, [], [5])),
         helper.make_node("Constant", [], ["c"], value=helper.make_tensor("c", TP.BOOL, [], [True])),
         helper.make_node("Loop", ["n", "c", "y"], ["res"], body=b)],
        [vi("y", TP.FLOAT, [1])], [vi("res", TP.FLOAT, [1])],
    )  # fmt: skip
    cm = onnx_equal(m, np.array([-2.0], F32))
    np.testing.assert_array_equal(cm(np.array([0.0], F32)).numpy(), [6.0])  # 1 + 2 + 3
    assert [n.op for n in cm.graph.nodes].count("extern") == 1


def test_loop_scan_output_of_unknown_length_is_named(rng) -> None:
    m = model(
        [helper.make_node("Loop", ["n", "c", "a0"], ["acc", "scan"], body=_loop_body(True, None))],
        [vi("n", TP.INT64, []), vi("c", TP.BOOL, []), vi("a0", TP.FLOAT, [2, 3]), vi("x", TP.FLOAT, [2, 3]),
         vi("w", TP.FLOAT, [2, 3])],
        [vi("acc", TP.FLOAT, [2, 3]), vi("scan", TP.FLOAT, ["k", 2, 3])],
    )  # fmt: skip
    with pytest.raises(
        FrontendError, match=r"\(Loop, opset \d+\).*length that depends on values known only at run"
    ):
        autofusion.compile(m)


def test_reference_runtime_runs_subgraphs(rng, ort_run, monkeypatch) -> None:
    # fusion=False: the main graph and the body both run on the reference runtime.
    monkeypatch.setattr(control, "UNROLL_NODES", 0)
    m = model(
        [helper.make_node("Constant", [], ["n"], value=helper.make_tensor("n", TP.INT64, [], [3])),
         helper.make_node("Loop", ["n", "", "a0"], ["acc", "scan"], body=_loop_body(True, None))],
        [vi("a0", TP.FLOAT, [2, 3]), vi("x", TP.FLOAT, [2, 3]), vi("w", TP.FLOAT, [2, 3])],
        [vi("acc", TP.FLOAT, [2, 3]), vi("scan", TP.FLOAT, [3, 2, 3])],
    )  # fmt: skip
    arrays = [rng.standard_normal((2, 3)).astype(F32) for _ in range(3)]
    cm = autofusion.compile(m, fusion=False)
    got = cm(*arrays)
    for g, r in zip(got, ort_run(m, arrays), strict=True):
        np.testing.assert_allclose(g.numpy(), r, rtol=1e-5, atol=1e-6)
    assert body_calls(cm) == 0


def test_a_large_outer_weight_is_passed_not_embedded(onnx_equal, rng, monkeypatch) -> None:
    # A Scan body multiplying by an outer [80, 80] initializer: the weight is one input of the body (one
    # const of the main graph), a small outer constant stays an initializer of the body.
    monkeypatch.setattr(control, "UNROLL_NODES", 0)
    w = rng.standard_normal((80, 80)).astype(F32) * 0.1
    b = body(
        [helper.make_node("MatMul", ["s_in", "w"], ["p"]), helper.make_node("Add", ["p", "x_t"], ["p2"]),
         helper.make_node("Mul", ["p2", "half"], ["s_out"])],
        [vi("s_in", TP.FLOAT, [80]), vi("x_t", TP.FLOAT, [80])], [vi("s_out", TP.FLOAT, [80])],
    )  # fmt: skip
    graph = helper.make_graph(
        [helper.make_node("Constant", [], ["half"], value=helper.make_tensor("h", TP.FLOAT, [], [0.5])),
         helper.make_node("Scan", ["s0", "x"], ["s"], num_scan_inputs=1, body=b)],
        "g", [vi("s0", TP.FLOAT, [80]), vi("x", TP.FLOAT, [5, 80])], [vi("s", TP.FLOAT, [80])],
        initializer=[onnx.numpy_helper.from_array(w, "w")],
    )  # fmt: skip
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    cm = onnx_equal(m, rng.standard_normal(80).astype(F32), rng.standard_normal((5, 80)).astype(F32))
    (host,) = hosts(cm.graph)
    assert [tv.type.shape for tv in host.captured] == [(80, 80)]
