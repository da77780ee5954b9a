"""ONNX sequences inside a graph (frontend/onnx/sequences.py) against onnxruntime: resolved at import, only
tensors reach the IR; a sequence leaving the graph is an error naming it."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto as TP
from onnx import helper

import autofusion
from autofusion.errors import FrontendError

F32 = np.float32


def ints(name: str, values: list[int], scalar: bool = False) -> object:
    t = helper.make_tensor(name, TP.INT64, [] if scalar else [len(values)], values)
    return helper.make_node("Constant", [], [name], value=t)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_split_at_and_concat_with_a_new_axis(onnx_model, onnx_equal, rng, dtype) -> None:
    nodes = [
        helper.make_node("Relu", ["x"], ["r"]),
        helper.make_node("SplitToSequence", ["r"], ["s"], axis=1, keepdims=0),  # 4 x [3, 5]
        ints("last", [-1], scalar=True),
        helper.make_node("SequenceAt", ["s", "last"], ["y"]),
        helper.make_node("ConcatFromSequence", ["s"], ["z"], axis=-1, new_axis=1),  # [3, 5, 4]
        helper.make_node("SequenceLength", ["s"], ["n"]),
        helper.make_node("Cast", ["n"], ["nf"], to=TP.FLOAT if dtype == np.float32 else TP.FLOAT16),
        helper.make_node("Mul", ["z", "nf"], ["zn"]),
    ]
    m = onnx_model(
        nodes, [("x", dtype, [3, 4, 5])], [("y", dtype, [3, 5]), ("zn", dtype, [3, 5, 4])], opset=13
    )
    onnx_equal(m, rng.standard_normal((3, 4, 5)).astype(dtype))


def test_split_sizes_insert_erase(onnx_model, onnx_equal, rng) -> None:
    nodes = [
        ints("sizes", [1, 2, 3]),
        helper.make_node("SplitToSequence", ["x", "sizes"], ["s"], axis=0),  # [1,4], [2,4], [3,4]
        helper.make_node("Exp", ["w"], ["e"]),
        ints("zero", [0], scalar=True),
        helper.make_node("SequenceInsert", ["s", "e", "zero"], ["s2"]),  # e first
        ints("one", [1], scalar=True),
        helper.make_node("SequenceErase", ["s2", "one"], ["s3"]),  # drops x[0:1]
        helper.make_node("SequenceInsert", ["s3", "e"], ["s4"]),  # e last
        helper.make_node("ConcatFromSequence", ["s4"], ["y"], axis=0),  # [2 + 2 + 3, 4]
    ]
    m = onnx_model(nodes, [("x", F32, [6, 4]), ("w", F32, [2, 4])], [("y", F32, [9, 4])], opset=13)
    onnx_equal(m, rng.standard_normal((6, 4)).astype(F32), rng.standard_normal((2, 4)).astype(F32))


def test_equal_chunks_and_an_empty_sequence(onnx_model, onnx_equal, rng) -> None:
    nodes = [
        ints("two", [2], scalar=True),
        helper.make_node("SplitToSequence", ["x", "two"], ["s"], axis=1),  # [3,2], [3,2], [3,1]
        ints("mid", [1], scalar=True),
        helper.make_node("SequenceAt", ["s", "mid"], ["a"]),
        helper.make_node("SequenceEmpty", [], ["e"], dtype=TP.FLOAT),
        helper.make_node("SequenceInsert", ["e", "a"], ["e1"]),
        helper.make_node("SequenceInsert", ["e1", "a"], ["e2"]),
        helper.make_node("ConcatFromSequence", ["e2"], ["y"], axis=0, new_axis=1),  # [2, 3, 2]
        ints("lastpos", [-1], scalar=True),
        helper.make_node("SequenceAt", ["s", "lastpos"], ["b"]),
    ]
    m = onnx_model(nodes, [("x", F32, [3, 5])], [("y", F32, [2, 3, 2]), ("b", F32, [3, 1])], opset=13)
    onnx_equal(m, rng.standard_normal((3, 5)).astype(F32))


def test_sequence_of_constants_is_known_at_import(onnx_model, onnx_equal, rng) -> None:
    # SequenceConstruct of constants is not folded into a stacked array: it stays a sequence of two.
    nodes = [
        helper.make_node("Constant", [], ["a"], value=helper.make_tensor("a", TP.FLOAT, [2], [1, 2])),
        helper.make_node("Constant", [], ["b"], value=helper.make_tensor("b", TP.FLOAT, [2], [3, 4])),
        helper.make_node("SequenceConstruct", ["a", "b"], ["s"]),
        helper.make_node("ConcatFromSequence", ["s"], ["c"], axis=0),  # [1, 2, 3, 4]
        helper.make_node("SequenceLength", ["s"], ["n"]),
        helper.make_node("Cast", ["n"], ["nf"], to=TP.FLOAT),
        helper.make_node("Add", ["x", "c"], ["y0"]),
        helper.make_node("Mul", ["y0", "nf"], ["y"]),
    ]
    m = onnx_model(nodes, [("x", F32, [3, 4])], [("y", F32, [3, 4])], opset=13)
    onnx_equal(m, rng.standard_normal((3, 4)).astype(F32))


def test_a_sequence_graph_output_is_named(onnx_model) -> None:
    nodes = [helper.make_node("SplitToSequence", ["x"], ["s"], axis=0)]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TP.FLOAT, [2, 3])],
        [helper.make_tensor_sequence_value_info("s", TP.FLOAT, [3])],
    )  # fmt: skip
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    with pytest.raises(FrontendError, match="graph output 's' is a sequence"):
        autofusion.compile(m)


def test_a_sequence_read_by_an_op_without_sequence_support_is_named(onnx_model) -> None:
    nodes = [
        helper.make_node("SplitToSequence", ["x"], ["s"], axis=0),
        helper.make_node("Identity", ["s"], ["t"]),
        helper.make_node("ConcatFromSequence", ["t"], ["y"], axis=0),
    ]
    m = onnx_model(nodes, [("x", F32, [2, 3])], [("y", F32, [6])], opset=13)
    with pytest.raises(FrontendError, match=r"\(Identity, opset \d+\).*'s' is a sequence"):
        autofusion.compile(m)
