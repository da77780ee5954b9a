"""Shapes, axes, pads, sizes given as graph inputs (not initializers): read at call time, specialised on.

Each op with its shape-like input as a graph input, against onnxruntime: the first value converts and
fuses, another value converts again and is right, the first value again finds its graph (no new
conversion), and generated code ran. The input stays in the graph's input list but nothing reads it.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import onnx
import pytest
import torch
from onnx import helper

import autofusion
from autofusion.errors import FrontendError
from autofusion.frontend.onnx import shape_inputs
from autofusion.frontend.onnx.shape_inputs import value_inputs

F, I64 = np.float32, np.int64


def run_ort(model: onnx.ModelProto, arrays: list[np.ndarray]) -> list[np.ndarray]:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return sess.run(None, {i.name: a for i, a in zip(sess.get_inputs(), arrays, strict=True)})


def assert_same(got: torch.Tensor, ref: np.ndarray, what: str = "") -> None:
    r = torch.from_numpy(np.asarray(ref))
    assert (got.dtype, tuple(got.shape)) == (r.dtype, tuple(r.shape)), f"{what}: {got.dtype}{list(got.shape)}"
    if r.dtype.is_floating_point:
        torch.testing.assert_close(got, r, rtol=1e-5, atol=1e-5, msg=lambda m: f"{what}: {m}")
    else:
        assert torch.equal(got, r), f"{what}: {got} != {r}"


def model_of(
    nodes: list[onnx.NodeProto],
    inputs: list[tuple[str, Any, list[Any]]],
    outputs: list[tuple[str, Any, int]],
    inits: dict[str, np.ndarray] | None = None,
    opset: int = 17,
) -> onnx.ModelProto:
    """A model whose outputs have symbolic dims (rank `outputs[k][2]`): their sizes follow the values."""

    def vi(name: str, dtype: Any, dims: list[Any]) -> onnx.ValueInfoProto:
        return helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(np.dtype(dtype)), dims)

    graph = helper.make_graph(
        nodes,
        "g",
        [vi(*i) for i in inputs],
        [vi(n, d, [f"{n}_{k}" for k in range(rank)]) for n, d, rank in outputs],
        initializer=[onnx.numpy_helper.from_array(v, k) for k, v in (inits or {}).items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def ints(*v: int) -> np.ndarray:
    return np.array(v, dtype=I64)


def unread_inputs(cm: Any) -> set[str]:
    """The compiled graph's inputs that no node reads."""
    g = cm.graph
    read = {i for n in g.nodes for i in n.inputs} | set(g.outputs)
    return {i.name for i in g.inputs if i.value.id not in read}


def run_values(
    model: onnx.ModelProto, calls: list[list[np.ndarray]], generated_code_ran: Any, **options: Any
):
    """Compile `model`, call it with each argument list in turn and compare each result with onnxruntime;
    returns the compiled model and `signatures_planned` after each call."""
    onnx.checker.check_model(model)
    cm = autofusion.compile(model, **options)
    planned = []
    for args in calls:
        ref = run_ort(model, args)
        out = cm(*args)
        outs = out if isinstance(out, tuple) else (out,)
        assert len(outs) == len(ref)
        for k, (g, r) in enumerate(zip(outs, ref, strict=True)):
            assert_same(g, r, f"output {k} for {[a.tolist() for a in args if a.dtype == I64]}")
        generated_code_ran(cm.stats, "autofusion.compile(onnx)")
        planned.append(cm.stats["signatures_planned"])
    return cm, planned


# (op, attrs, x shape, [values of the shape-like inputs] per call: first, second, first again, opset)
CASES: list[tuple[str, dict[str, Any], tuple[int, ...], list[list[np.ndarray]], int]] = [
    ("Reshape", {}, (2, 3, 4), [[ints(6, 4)], [ints(4, -1)], [ints(6, 4)]], 17),
    ("Reshape", {}, (2, 3, 4), [[ints(0, 12)], [ints(2, 3, 2, 2)], [ints(0, 12)]], 17),
    ("Expand", {}, (3, 1), [[ints(2, 3, 4)], [ints(3, 5)], [ints(2, 3, 4)]], 17),
    ("Tile", {}, (2, 3), [[ints(2, 1)], [ints(1, 3)], [ints(2, 1)]], 17),
    (
        "Slice",
        {},
        (5, 6),
        [
            [ints(1, 0), ints(4, 5), ints(0, 1), ints(1, 2)],
            [ints(-1, 5), ints(-6, 0), ints(0, 1), ints(-2, -1)],
            [ints(1, 0), ints(4, 5), ints(0, 1), ints(1, 2)],
        ],
        17,
    ),
    (
        "Slice",
        {},
        (5, 6),
        [[ints(1), ints(4), ints(1)], [ints(0), ints(100), ints(0)], [ints(1), ints(4), ints(1)]],
        17,
    ),
    ("Squeeze", {}, (1, 3, 1, 4), [[ints(0)], [ints(0, 2)], [ints(0)]], 17),
    ("Unsqueeze", {}, (3, 4), [[ints(0)], [ints(-1, 1)], [ints(0)]], 17),
    ("Pad", {"mode": "constant"}, (2, 3), [[ints(1, 0, 0, 2)], [ints(0, 2, 3, 0)], [ints(1, 0, 0, 2)]], 17),
    (
        "Pad",
        {"mode": "reflect"},
        (1, 3, 4),
        [[ints(0, 1, 0, 0, 0, 2)], [ints(0, 0, 2, 0, 1, 1)], [ints(0, 1, 0, 0, 0, 2)]],
        17,
    ),
    (
        "Pad",
        {"mode": "constant"},
        (2, 3, 4),
        [[ints(1, 0, 2, 1), ints(0, 2)], [ints(0, 1, 1, 0), ints(1, -1)], [ints(1, 0, 2, 1), ints(0, 2)]],
        18,
    ),
    ("ReduceSum", {"keepdims": 1}, (2, 3, 4), [[ints(1)], [ints(0, 2)], [ints(1)]], 13),
    ("ReduceSum", {"keepdims": 0}, (2, 3, 4), [[ints(-1)], [ints(0, 1)], [ints(-1)]], 13),
    ("ReduceMax", {"keepdims": 0}, (2, 3, 4), [[ints(1)], [ints(0, 2)], [ints(1)]], 18),
    ("ReduceMin", {"keepdims": 1}, (2, 3, 4), [[ints(2)], [ints(0)], [ints(2)]], 18),
    ("ReduceMean", {"keepdims": 1}, (2, 3, 4), [[ints(1)], [ints(-1, 0)], [ints(1)]], 18),
    ("ReduceProd", {"keepdims": 0}, (2, 3, 4), [[ints(1)], [ints(2)], [ints(1)]], 18),
    ("ReduceSumSquare", {"keepdims": 1}, (2, 3, 4), [[ints(0)], [ints(1, 2)], [ints(0)]], 18),
    ("ReduceL2", {"keepdims": 0}, (2, 3, 4), [[ints(1)], [ints(0, 2)], [ints(1)]], 18),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{c[2]}-{len(c[3][0])}in")
def test_op_with_shape_inputs(case, generated_code_ran, rng) -> None:
    op, attrs, shape, values, opset = case
    names = [f"s{k}" for k in range(len(values[0]))]
    # A Relu after the op: a kernel to run whatever the op becomes (a view, an extern).
    slots = ["x", names[0], "", names[1]] if op == "Pad" and len(names) == 2 else ["x", *names]  # pads, axes
    nodes = [helper.make_node(op, slots, ["y"], **attrs), helper.make_node("Relu", ["y"], ["z"])]
    x = rng.standard_normal(shape).astype(F)
    inputs = [("x", F, list(shape))] + [(n, I64, [f"{n}_len"]) for n in names]  # lengths may change too
    rank = run_ort(model_of(nodes, inputs, [("z", F, 1)], opset=opset), [x, *values[0]])[0].ndim
    model = model_of(nodes, inputs, [("z", F, rank)], opset=opset)
    assert value_inputs(model) == set(names)
    cm, planned = run_values(model, [[x, *v] for v in values], generated_code_ran)
    assert planned == [1, 2, 2], "a new value converts again; the first value again finds its graph"
    assert unread_inputs(cm) == set(names), "no kernel is passed the shape inputs"
    assert cm.input_names == ["x", *names]


def test_constant_of_shape_and_topk(generated_code_ran, rng) -> None:
    nodes = [
        helper.make_node("ConstantOfShape", ["s"], ["c"], value=helper.make_tensor("v", 1, [1], [2.5])),
        helper.make_node("Add", ["x", "c"], ["y"]),
        helper.make_node("TopK", ["y", "k"], ["vals", "idx"], axis=-1),
        helper.make_node("Relu", ["vals"], ["z"]),
    ]
    model = model_of(
        nodes, [("x", F, [3, 5]), ("s", I64, [None]), ("k", I64, [1])], [("z", F, 2), ("idx", I64, 2)]
    )
    x = rng.standard_normal((3, 5)).astype(F)
    calls = [
        [x, ints(3, 5), ints(2)],
        [x, ints(5), ints(4)],
        [x, ints(2, 3, 5), ints(2)],
        [x, ints(3, 5), ints(2)],
    ]
    cm, planned = run_values(model, calls, generated_code_ran)
    assert planned == [1, 2, 3, 3]
    assert unread_inputs(cm) == {"s", "k"}


def test_values_through_shape_arithmetic(generated_code_ran, rng) -> None:
    """Reshape(x, Concat(Shape(x)[:1], n * 2, [-1])): the shape is evaluated at import once n is bound."""
    nodes = [
        helper.make_node("Shape", ["x"], ["sh"], end=1),
        helper.make_node("Mul", ["n", "two"], ["n2"]),
        helper.make_node("Concat", ["sh", "n2", "minus1"], ["spec"], axis=0),
        helper.make_node("Reshape", ["x", "spec"], ["y"]),
        helper.make_node("Sigmoid", ["y"], ["z"]),
    ]
    model = model_of(
        nodes,
        [("x", F, [2, 12]), ("n", I64, [1])],
        [("z", F, 2)],
        inits={"two": ints(2), "minus1": ints(-1)},
    )
    assert value_inputs(model) == {"n"}
    x = rng.standard_normal((2, 12)).astype(F)
    cm, planned = run_values(model, [[x, ints(1)], [x, ints(3)], [x, ints(1)]], generated_code_ran)
    assert planned == [1, 2, 2]
    assert unread_inputs(cm) == {"n"}


def test_value_also_used_as_data(generated_code_ran, rng) -> None:
    """An input that gives a shape and is computed with too: it is a known constant of its graph."""
    nodes = [
        helper.make_node("Reshape", ["x", "s"], ["y"]),
        helper.make_node("Relu", ["y"], ["z"]),
        helper.make_node("Mul", ["s", "s"], ["s2"]),
    ]
    model = model_of(nodes, [("x", F, [2, 6]), ("s", I64, [2])], [("z", F, 2), ("s2", I64, 1)])
    x = rng.standard_normal((2, 6)).astype(F)
    run_values(model, [[x, ints(3, 4)], [x, ints(12, 1)]], generated_code_ran)


def test_hot_path_checks_the_value(generated_code_ran, rng) -> None:
    """The same shapes with another value must not take the last call's graph."""
    nodes = [
        helper.make_node("ReduceSum", ["x", "a"], ["y"], keepdims=1),
        helper.make_node("Neg", ["y"], ["z"]),
    ]
    model = model_of(nodes, [("x", F, [3, 4]), ("a", I64, [1])], [("z", F, 2)], opset=13)
    x = rng.standard_normal((3, 4)).astype(F)
    calls = [[x, ints(0)], [x, ints(0)], [x, ints(1)], [x, ints(1)], [x, ints(0)], [x, ints(-1)]]
    cm, planned = run_values(model, calls, generated_code_ran)
    assert planned == [1, 1, 2, 2, 2, 3]  # axis -1 is axis 1 of a rank-2 tensor, but another value
    x2 = torch.from_numpy(x)
    a = torch.tensor([0])
    torch.testing.assert_close(cm(x2, a), -x2.sum(0, keepdim=True))
    a[0] = 1  # the same tensor object, now another value
    torch.testing.assert_close(cm(x2, a), -x2.sum(1, keepdim=True))


def test_max_signatures_bounds_the_values(generated_code_ran, rng, caplog) -> None:
    nodes = [helper.make_node("Reshape", ["x", "s"], ["y"]), helper.make_node("Relu", ["y"], ["z"])]
    model = model_of(nodes, [("x", F, [4, 6]), ("s", I64, [2])], [("z", F, 2)])
    x = rng.standard_normal((4, 6)).astype(F)
    calls = [[x, ints(6, 4)], [x, ints(3, 8)], [x, ints(6, 4)]]
    with caplog.at_level(logging.INFO, logger="autofusion.signatures"):
        cm, planned = run_values(model, calls, generated_code_ran, max_signatures=1)
    assert planned == [1, 2, 3]
    assert cm.stats["signatures"] == 1 and cm.stats["signatures_evicted"] == 2
    text = caplog.text
    assert "planned a new input signature (float32[4, 6], int64[2] s=[3, 8])" in text
    assert "dropped the least recently used signature (float32[4, 6], int64[2] s=[6, 4])" in text


def test_static_model_compiles_at_the_first_call(generated_code_ran, rng) -> None:
    nodes = [helper.make_node("Tile", ["x", "r"], ["y"]), helper.make_node("Relu", ["y"], ["z"])]
    model = model_of(nodes, [("x", F, [2, 3]), ("r", I64, [2])], [("z", F, 2)])
    cm = autofusion.compile(model)
    assert cm.last is None  # all shapes static, but the repeats are the call's
    with pytest.raises(RuntimeError, match="compiled for the values of input"):
        _ = cm.graph
    x = rng.standard_normal((2, 3)).astype(F)
    run_values(model, [[x, ints(2, 2)]], generated_code_ran)
    ex = autofusion.compile(model, example_inputs=[x, ints(1, 3)])
    assert ex.stats["signatures_planned"] == 1
    assert_same(ex(x, ints(1, 3)), run_ort(model, [x, ints(1, 3)])[0])


def test_values_a_converter_asks_for(generated_code_ran, rng, monkeypatch, caplog) -> None:
    """A position the table does not list: `ctx.ints` finds the input it comes from, and the model
    converts again with it bound (what a new converter reading a value through ctx.ints gets)."""
    monkeypatch.delitem(shape_inputs.SHAPE_INPUTS, "Reshape")
    nodes = [
        helper.make_node("Add", ["s", "one"], ["s1"]),
        helper.make_node("Reshape", ["x", "s1"], ["y"]),
        helper.make_node("Relu", ["y"], ["z"]),
    ]
    model = model_of(nodes, [("x", F, [2, 6]), ("s", I64, [2])], [("z", F, 2)], inits={"one": ints(1)})
    assert value_inputs(model) == set()
    x = rng.standard_normal((2, 6)).astype(F)
    with caplog.at_level(logging.INFO, logger="autofusion.frontend"):
        cm, planned = run_values(
            model, [[x, ints(2, 3)], [x, ints(5, 1)], [x, ints(2, 3)]], generated_code_ran
        )
    assert planned == [1, 2, 2]
    assert "the values of input(s) s give shapes" in caplog.text
    assert unread_inputs(cm) == {"s"}


def test_resize_sizes_and_scales(generated_code_ran, rng) -> None:
    attrs = {"mode": "nearest", "coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor"}
    x = rng.standard_normal((1, 2, 3, 4)).astype(F)
    nodes = [
        helper.make_node("Resize", ["x", "", "", "sz"], ["y"], **attrs),
        helper.make_node("Relu", ["y"], ["z"]),
    ]
    model = model_of(nodes, [("x", F, [1, 2, 3, 4]), ("sz", I64, [4])], [("z", F, 4)], opset=18)
    _, planned = run_values(model, [[x, ints(1, 2, 6, 8)], [x, ints(1, 2, 5, 7)]], generated_code_ran)
    assert planned == [1, 2]
    nodes = [
        helper.make_node("Resize", ["x", "", "sc"], ["y"], **attrs),
        helper.make_node("Relu", ["y"], ["z"]),
    ]
    model = model_of(nodes, [("x", F, [1, 2, 3, 4]), ("sc", F, [4])], [("z", F, 4)], opset=18)
    assert value_inputs(model) == {"sc"}
    sc1, sc2 = np.array([1, 1, 2, 2], F), np.array([1, 1, 1.5, 3], F)
    _, planned = run_values(model, [[x, sc1], [x, sc2], [x, sc1]], generated_code_ran)
    assert planned == [1, 2, 2]


def test_shapes_from_data_stay_unsupported(rng) -> None:
    """A shape computed from real data (a float input) is not a value to specialise on."""
    nodes = [
        helper.make_node("Cast", ["f"], ["fi"], to=onnx.TensorProto.INT64),
        helper.make_node("Reshape", ["x", "fi"], ["y"]),
    ]
    model = model_of(nodes, [("x", F, [2, 6]), ("f", F, [2])], [("y", F, 2)])
    assert value_inputs(model) == set()
    with pytest.raises(FrontendError, match=r"shape \(input 1\) is computed at run time from data"):
        autofusion.compile(model)  # static shapes: converted at once


def test_large_inputs_are_not_read(rng) -> None:
    """An integer input too large to be a shape is not read at call time: the error says why."""
    nodes = [
        helper.make_node("Slice", ["big", "zero", "two"], ["spec"]),
        helper.make_node("Reshape", ["x", "spec"], ["y"]),
    ]
    model = model_of(
        nodes,
        [("x", F, [2, 6]), ("big", I64, [100])],
        [("y", F, 2)],
        inits={"zero": ints(0), "two": ints(2)},
    )
    assert value_inputs(model) == {"big"}
    cm = autofusion.compile(model)
    big = np.full(100, 3, I64)
    big[1] = 4
    with pytest.raises(FrontendError, match=r"from input 'big' \(100 elements; autofusion reads at most 64"):
        cm(rng.standard_normal((2, 6)).astype(F), big)


@pytest.mark.parametrize("dtype", [np.int64, np.float32, np.float16])
@pytest.mark.parametrize("largest", [1, 0])
def test_topk_ties_keep_index_order(generated_code_ran, largest, dtype) -> None:
    """Of equal values the lower index comes first (ONNX), which torch.topk does not promise."""
    nodes = [
        helper.make_node("TopK", ["x", "k"], ["v", "i"], axis=1, largest=largest),
        helper.make_node("Identity", ["i"], ["i2"]),
    ]
    model = model_of(nodes, [("x", dtype, [3, 6]), ("k", I64, [1])], [("v", dtype, 2), ("i2", I64, 2)])
    x = np.array([[0, 0, 0, 0, 0, 0], [1, 2, 1, 2, 1, 2], [3, 3, 1, 1, 3, 1]], dtype)
    cm = autofusion.compile(model)
    for k in (3, 5, 3):
        got = cm(x, ints(k))
        for g, r in zip(got, run_ort(model, [x, ints(k)]), strict=True):
            assert_same(g, r, f"k={k}")
    assert cm.stats["signatures_planned"] == 2


@pytest.mark.parametrize("scales", [(1, 1, 0.6, 0.6), (1, 1, 0.5, 0.8), (1, 1, 1.7, 2.5)])
@pytest.mark.parametrize("coord", ["half_pixel", "pytorch_half_pixel"])
def test_resize_linear_maps_with_the_given_scales(generated_code_ran, rng, scales, coord) -> None:
    """Where in * scale is not whole, ONNX maps coordinates by the scale, not by out / in."""
    nodes = [
        helper.make_node(
            "Resize", ["x", "", "sc"], ["y"], mode="linear", coordinate_transformation_mode=coord
        ),
        helper.make_node("Relu", ["y"], ["z"]),
    ]
    model = model_of(nodes, [("x", F, [1, 2, 5, 7]), ("sc", F, [4])], [("z", F, 4)], opset=18)
    x = rng.standard_normal((1, 2, 5, 7)).astype(F)
    run_values(model, [[x, np.array(scales, F)]], generated_code_ran)


def test_pad_value_given_as_an_input(generated_code_ran, rng) -> None:
    """Pad's constant_value as a graph input: a literal of the IR pad, so keyed on too (bit-exact)."""
    nodes = [helper.make_node("Pad", ["x", "p", "v"], ["y"]), helper.make_node("Relu", ["y"], ["z"])]
    model = model_of(nodes, [("x", F, [2, 3]), ("p", I64, [4]), ("v", F, [])], [("z", F, 2)], opset=18)
    assert value_inputs(model) == {"p", "v"}
    x = rng.standard_normal((2, 3)).astype(F)
    pads = ints(1, 0, 0, 2)
    calls = [[x, pads, np.array(1.5, F)], [x, pads, np.array(-0.0, F)], [x, pads, np.array(0.0, F)]]
    calls.append([x, pads, np.array(1.5, F)])
    cm, planned = run_values(model, calls, generated_code_ran)
    assert planned == [1, 2, 3, 3]  # -0.0 and 0.0 are other values (the bits differ)
    assert unread_inputs(cm) == {"p", "v"}


def test_value_key_is_exact() -> None:
    from autofusion.frontend.source import value_key

    nan = torch.tensor([float("nan"), 1.0])
    assert value_key(nan) == value_key(torch.tensor([float("nan"), 1.0]))  # every NaN keys alike
    assert value_key(torch.tensor([0.0])) != value_key(torch.tensor([-0.0]))
    assert value_key(torch.tensor([[1, 2], [3, 4]])) == (1, 2, 3, 4)
    assert value_key(torch.tensor([True, False])) == (True, False)
