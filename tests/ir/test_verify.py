"""The verifier rejects broken graphs and shows the IR around the fault."""

from __future__ import annotations

import pytest

from autofusion.errors import IRVerifyError
from autofusion.ir import DType, GraphBuilder, Node, TensorType, Value, verify


def f32(*shape: int) -> TensorType:
    return TensorType(DType.float32, shape)


def _graph(n: int = 30):
    b = GraphBuilder()
    x = b.add_input(f32(4), "x")
    v = x
    for i in range(n):
        v = b.add("neg", [v], name=f"neg{i}", loc=f"model.py:{10 + i} in forward")
    return b.build([v])


def test_wrong_declared_type_names_node_source_and_shows_context() -> None:
    g = _graph()
    nodes = list(g.nodes)
    bad = nodes[15]
    nodes[15] = bad.replace(outputs=(Value(bad.out.id, TensorType(DType.float16, (4,))),))
    with pytest.raises(IRVerifyError) as info:
        verify(g.replace(nodes=tuple(nodes)))
    msg = str(info.value)
    assert "node 'neg15' (neg) from model.py:25 in forward" in msg
    assert "declares f16[4] but its op infers f32[4]" in msg
    marked = [line for line in msg.splitlines() if line.startswith(">>")]
    assert len(marked) == 1 and "f16[4] = neg(" in marked[0]
    # about ten lines of context either side, not the whole graph
    assert "neg0" not in msg.split("\n", 1)[1] and 15 <= len(msg.splitlines()) <= 23


def test_use_before_definition() -> None:
    g = _graph(3)
    nodes = list(g.nodes)
    nodes[0], nodes[1] = nodes[1], nodes[0]
    with pytest.raises(IRVerifyError, match="before it is defined"):
        verify(g.replace(nodes=tuple(nodes)))


def test_redefinition_unknown_op_and_missing_output() -> None:
    g = _graph(3)
    dup = g.nodes[1].replace(name="dup")
    with pytest.raises(IRVerifyError, match="redefines value"):
        verify(g.replace(nodes=(*g.nodes, dup)))
    # An unknown op cannot even be built into a node, so no graph holds one.
    with pytest.raises(IRVerifyError, match="unknown IR op 'frobnicate' in node 'w'"):
        Node("frobnicate", (0,), (Value(100, f32(4)),), name="w")
    with pytest.raises(IRVerifyError, match="never defined"):
        verify(g.replace(outputs=(12345,)))


def test_bad_attrs_and_missing_constant() -> None:
    g = _graph(2)
    node = g.nodes[0].replace(attrs=(("bogus", 1),))
    with pytest.raises(IRVerifyError, match="does not take attribute"):
        verify(g.replace(nodes=(node, *g.nodes[1:])))
    b = GraphBuilder()
    c = b.add_constant("w", object(), f32(2))
    g2 = b.build([c])
    verify(g2)
    with pytest.raises(IRVerifyError, match=r"missing from graph\.constants"):
        verify(g2.replace(constants={}))
