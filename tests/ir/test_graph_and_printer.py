"""IR: dtypes, tensor types, the op registry, graph building, printing and immutability."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from autofusion.errors import ShapeInferenceError
from autofusion.ir import DType, FusionClass, GraphBuilder, TensorType, all_ops, get_op, print_graph, verify
from autofusion.ir.analysis import producer, use_def, uses
from autofusion.ir.ops import OpDef, register


def f32(*shape: int) -> TensorType:
    return TensorType(DType.float32, shape)


def test_dtype_round_trips_with_torch() -> None:
    for d in DType:
        assert DType.from_torch(d.to_torch()) is d
        assert d.itemsize == torch.empty((), dtype=d.to_torch()).element_size()
    assert {d for d in DType if d.is_core} == {
        DType.float32, DType.float16, DType.bfloat16, DType.int32, DType.int64, DType.bool
    }  # fmt: skip
    # Complex, float8 and quantized types are carried opaquely (extern calls only); the wide unsigned
    # types are computed on (the C++ backend generates them, the reference runtime widens them).
    assert DType.from_torch(torch.complex64).is_opaque and DType.from_torch(torch.float8_e4m3fn).is_opaque
    computed = (DType.float64, DType.int8, DType.uint8, DType.uint16, DType.uint32, DType.uint64)
    assert not any(d.is_opaque for d in DType if d.is_core or d in computed)
    every = {v for v in vars(torch).values() if isinstance(v, torch.dtype)}
    assert all(DType.from_torch(d).to_torch() is d for d in every)  # a newer torch's types: add them


def test_tensor_type_strides_and_text() -> None:
    t = f32(2, 3)
    assert t.strides == (3, 1) and t.is_contiguous and t.numel == 6 and t.nbytes == 24
    nc = TensorType(DType.float16, (2, 3), (1, 2))
    assert not nc.is_contiguous and str(nc) == "f16[2,3]{strides=1,2}"
    # size-1 dims never make a tensor non-contiguous
    assert TensorType(DType.float32, (1, 4), (99, 1)).is_contiguous
    assert str(TensorType(DType.bool, ())) == "b8[]"
    with pytest.raises(ValueError):
        TensorType(DType.float32, (2, -1))


def test_every_op_has_exactly_one_entry_with_a_fusion_class() -> None:
    ops = all_ops()
    assert len(ops) > 100
    for name, opdef in ops.items():
        assert opdef.name == name
        assert isinstance(opdef.fusion, FusionClass)
    assert get_op("add").fusion is FusionClass.BROADCAST
    assert get_op("exp").fusion is FusionClass.ELEMWISE
    assert get_op("reshape").fusion is FusionClass.INJECTIVE
    assert get_op("sum").fusion is FusionClass.REDUCE
    assert get_op("conv").fusion is FusionClass.ANCHOR
    assert get_op("extern").fusion is FusionClass.OPAQUE
    with pytest.raises(ValueError, match="registered twice"):
        register(OpDef("add", FusionClass.ELEMWISE, lambda ts, a: ts, 2, 2))


@pytest.mark.parametrize(
    "op,inputs,attrs,expected",
    [
        ("add", [f32(4, 1), f32(3)], {}, f32(4, 3)),
        ("lt", [f32(2, 3), f32()], {}, TensorType(DType.bool, (2, 3))),
        ("sum", [f32(2, 3, 4)], {"dims": (1,), "keepdim": False}, f32(2, 4)),
        ("sum", [f32(2, 3, 4)], {"dims": (0, 2), "keepdim": True}, f32(1, 3, 1)),
        ("amax", [f32(2, 3)], {"dims": ()}, f32()),
        ("permute", [f32(2, 3, 4)], {"dims": (2, 0, 1)}, f32(4, 2, 3)),
        ("slice", [f32(10)], {"dim": 0, "start": 1, "end": 9, "step": 3}, f32(3)),
        ("concat", [f32(2, 3), f32(2, 5)], {"dim": 1}, f32(2, 8)),
        ("expand", [f32(3, 1)], {"shape": (2, 3, 4)}, f32(2, 3, 4)),
        ("mm", [f32(2, 3), f32(3, 5)], {}, f32(2, 5)),
        ("linear", [f32(7, 2, 3), f32(5, 3), f32(5)], {"has_bias": True}, f32(7, 2, 5)),
        ("argmax", [f32(2, 3)], {"dim": 1, "keepdim": True}, TensorType(DType.int64, (2, 1))),
        ("pad", [f32(2, 3)], {"pads": (1, 2, 0, 1)}, f32(3, 6)),
        (
            "conv",
            [f32(1, 4, 9, 9), f32(8, 2, 3, 3)],
            {"stride": (2, 2), "padding": (1, 1), "dilation": (1, 1), "transposed": False,
             "output_padding": (0, 0), "groups": 2, "has_bias": False},
            f32(1, 8, 5, 5),
        ),
    ],
)  # fmt: skip
def test_shape_inference(op: str, inputs: list[TensorType], attrs: dict, expected: TensorType) -> None:
    b = GraphBuilder()
    ids = [b.add_input(t, f"x{i}") for i, t in enumerate(inputs)]
    out = b.add(op, ids, attrs)
    assert b.type_of(out) == expected


@pytest.mark.parametrize(
    "op,inputs,attrs,message",
    [
        ("add", [f32(2, 3), f32(4)], {}, "do not broadcast"),
        ("add", [f32(2), TensorType(DType.float16, (2,))], {}, "one dtype"),
        ("exp", [TensorType(DType.int32, (2,))], {}, "float input"),
        ("reshape", [f32(2, 3)], {"shape": (4, 2)}, "cannot reshape"),
        ("mm", [f32(2, 3), f32(4, 5)], {}, r"\[m,k\] x \[k,n\]"),
        ("sum", [f32(2)], {}, "missing attribute"),
        ("sum", [f32(2)], {"dims": (), "bogus": 1}, "does not take attribute"),
        ("where", [f32(2), f32(2), f32(2)], {}, "condition must be bool"),
        ("add", [f32(2)], {}, "takes 2 inputs"),
    ],
)
def test_shape_inference_errors(op: str, inputs: list[TensorType], attrs: dict, message: str) -> None:
    b = GraphBuilder()
    ids = [b.add_input(t, f"x{i}") for i, t in enumerate(inputs)]
    with pytest.raises(ShapeInferenceError, match=message):
        b.add(op, ids, attrs)


def _small_graph():
    b = GraphBuilder()
    x = b.add_input(f32(4, 8), "x")
    c = b.add("full", [], {"value": 2.0, "dtype": DType.float32})
    y = b.add("mul", [x, c], name="scale")
    s = b.add("sum", [y], {"dims": (1,), "keepdim": True})
    return b.build([s, y])


def test_printer_is_stable_and_renumbers() -> None:
    g = _small_graph()
    text = print_graph(g)
    assert text == (
        "graph forward(\n"
        '    %0: f32[4,8] "x",\n'
        ") {\n"
        "  %1: f32[] = full() {dtype=f32, value=2.0}\n"
        "  %2: f32[4,8] = mul(%0, %1)\n"
        "  %3: f32[4,1] = sum(%2) {dims=[1], keepdim=true}\n"
        "  return (%3, %2)\n"
        "}\n"
    )
    assert print_graph(_small_graph()) == text
    assert str(g) == text


def test_graph_is_immutable_and_replace_returns_self_when_unchanged() -> None:
    g = _small_graph()
    node = g.nodes[1]
    with pytest.raises(dataclasses.FrozenInstanceError):
        node.op = "add"  # type: ignore[misc]
    assert node.replace(op="mul") is node
    assert node.replace(name="other").name == "other"
    assert g.nodes[1].name == "scale"
    assert isinstance(g.nodes, tuple)
    verify(g)


def test_users_producers_and_op_counts() -> None:
    g = _small_graph()
    prod = producer(g)
    users = uses(g)
    y = g.nodes[1].out.id
    assert g.nodes[prod[y]].op == "mul"
    assert [g.nodes[k].op for k in users[y]] == ["sum"]
    assert use_def(g) is use_def(g)  # built once per graph object
    assert g.op_counts() == {"full": 1, "mul": 1, "sum": 1}


def test_builder_rollback_forgets_nodes_and_names() -> None:
    b = GraphBuilder()
    x = b.add_input(f32(2), "x")
    mark = b.mark()
    b.add("neg", [x], name="n")
    b.rollback(mark)
    y = b.add("neg", [x], name="n")
    g = b.build([y])
    assert [n.name for n in g.nodes] == ["n"]
    verify(g)
