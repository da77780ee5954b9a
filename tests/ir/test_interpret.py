"""The reference runtime: covers every IR op, frees dead values, and names the failing node."""

from __future__ import annotations

import pytest
import torch

from autofusion.errors import ExecutionError
from autofusion.ir import Arg, DType, GraphBuilder, TensorType, all_ops
from autofusion.ir import interpret as reference
from autofusion.ir.interpret import IMPLS, last_uses, run_graph


def test_every_ir_op_has_a_reference_implementation() -> None:
    assert set(IMPLS) == set(all_ops())


def test_values_die_after_their_last_use() -> None:
    b = GraphBuilder()
    x = b.add_input(TensorType(DType.float32, (3,)), "x")
    y = b.add("exp", [x], name="y")
    z = b.add("neg", [y], name="z")
    w = b.add("add", [z, x], name="w")
    g = b.build([w])
    dead = last_uses(g)
    assert [sorted(d) for d in dead] == [[], [y], sorted([z, x])]
    t = torch.randn(3)
    torch.testing.assert_close(run_graph(g, [t])[0], -t.exp() + t)


def test_extern_node_runs_the_aten_op_with_its_template() -> None:
    b = GraphBuilder()
    x = b.add_input(TensorType(DType.float32, (4, 3)), "x")
    (vals, idx) = b.add_node(
        "extern", [x],
        {"target": "aten.sort.default", "args": (Arg(0), 0, True), "kwargs": (),
         "out_types": (TensorType(DType.float32, (4, 3)), TensorType(DType.int64, (4, 3)))},
    )  # fmt: skip
    g = b.build([vals, idx])
    t = torch.randn(4, 3)
    out = run_graph(g, [t])
    ref = torch.sort(t, 0, True)
    torch.testing.assert_close(out[0], ref.values)
    torch.testing.assert_close(out[1], ref.indices)


def test_failure_names_node_op_inputs_and_source() -> None:
    b = GraphBuilder()
    x = b.add_input(TensorType(DType.float32, (5, 2)), "x")
    i = b.add_input(TensorType(DType.int64, (2,)), "i")
    y = b.add("index_select", [x, i], {"dim": 0}, name="rows", loc="net.py:42 in forward")
    g = b.build([y])
    with pytest.raises(ExecutionError) as info:
        run_graph(g, [torch.randn(5, 2), torch.tensor([0, 7])])
    msg = str(info.value)
    assert "node 'rows'" in msg and "net.py:42 in forward" in msg
    assert "index_select(%0, %1) {dim=0}" in msg and "(5, 2):float32" in msg
    with pytest.raises(ExecutionError, match="takes 2 inputs, got 1"):
        run_graph(g, [torch.randn(5, 2)])


def test_resolve_target() -> None:
    assert reference.resolve_target("aten.cumsum.default") is torch.ops.aten.cumsum.default


def _reduce_graph(op: str, t: TensorType, dims: tuple[int, ...], keepdim: bool = False):
    b = GraphBuilder()
    x = b.add_input(t, "x")
    y = b.add(op, [x], {"dims": dims, "keepdim": keepdim}, name="r")
    return b.build([y])


def test_prod_over_several_dims_accumulates_once() -> None:
    # Row products 65536 and 2^-16 overflow / underflow fp16; the whole product is exactly 1. Reducing
    # one dim at a time rounded the row products to fp16 (inf); torch's full prod accumulates in fp32.
    x = torch.tensor([[256.0, 256.0], [1 / 256, 1 / 256]], dtype=torch.float16)
    for dims, keep in (((0, 1), False), ((1, 0), True), ((), False)):
        g = _reduce_graph("prod", TensorType(DType.float16, (2, 2)), dims, keep)
        (out,) = run_graph(g, [x])
        assert out.dtype is torch.float16
        assert torch.equal(out.flatten(), torch.ones(1, dtype=torch.float16)), (dims, out)
    y = torch.randn(3, 4, 5)
    (out,) = run_graph(_reduce_graph("prod", TensorType(DType.float32, (3, 4, 5)), (0, 2), True), [y])
    torch.testing.assert_close(out, y.prod(2, keepdim=True).prod(0, keepdim=True))


def test_max_min_of_nothing_is_the_kernels_identity() -> None:
    # torch.amax refuses an empty reduction; softmax of an empty row decomposes into one.
    for dt, lo, hi in ((DType.float32, -float("inf"), float("inf")), (DType.int32, -(2**31), 2**31 - 1),
                       (DType.bool, False, True)):  # fmt: skip
        t = TensorType(dt, (3, 0))
        x = torch.zeros((3, 0), dtype=dt.to_torch())
        (mx,) = run_graph(_reduce_graph("amax", t, (1,), True), [x])
        (mn,) = run_graph(_reduce_graph("amin", t, (1,)), [x])
        assert mx.shape == (3, 1) and mn.shape == (3,)
        assert (mx == lo).all() and (mn == hi).all()


def test_argmax_of_bool() -> None:
    b = GraphBuilder()
    x = b.add_input(TensorType(DType.bool, (4, 3)), "x")
    amax_id = b.add("argmax", [x], {"dim": 1, "keepdim": False})
    g = b.build([amax_id, b.add("argmin", [x], {"dim": 0, "keepdim": True})])
    t = torch.tensor([[False, True, True], [False, False, False], [True, False, True], [True, True, True]])
    amax, amin = run_graph(g, [t])
    as_int = t.to(torch.uint8)
    assert torch.equal(amax, as_int.argmax(1)) and torch.equal(amin, as_int.argmin(0, keepdim=True))
