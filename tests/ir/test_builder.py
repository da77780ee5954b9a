"""The builder's generic helpers every pass and frontend shares: copying a node of another graph with
remapped inputs (constants included) and emitting an extern call from tensors and literals."""

from __future__ import annotations

import torch

from autofusion.ir.dtypes import DType
from autofusion.ir.graph import Arg, GraphBuilder
from autofusion.ir.types import TensorType
from autofusion.ir.verify import verify

F = TensorType(DType.float32, (2, 3))


def test_copy_remaps_inputs_and_brings_constants() -> None:
    src = GraphBuilder("src")
    x = src.add_input(F, "x")
    w = src.add_constant("w", torch.ones(2, 3), F)
    y = src.add("mul", (x, w), name="scale", loc="m.py:3")
    g = src.build([y])

    b = GraphBuilder("dst")
    pad = b.add_input(F, "unused")  # shifts every id, so a copy that kept the old ids would be wrong
    env = {g.inputs[0].value.id: b.add_input(F, "x")}
    for node in g.nodes:
        outs = b.copy(node, [env[i] for i in node.inputs], g.constants)
        env.update(zip((v.id for v in node.outputs), outs, strict=True))
    out = b.build([env[g.outputs[0]]])
    verify(out)
    mul = out.nodes[-1]
    assert pad not in mul.inputs and mul.inputs[0] == env[x]
    assert (mul.op, mul.attrs, mul.name, mul.loc) == ("mul", (), "scale", "m.py:3")
    const = out.nodes[0]
    assert torch.equal(out.constants[const.attr("name")], g.constants["w"])


def test_add_extern_lists_each_tensor_once_and_marks_absent_optionals() -> None:
    b = GraphBuilder()
    x = b.add_input(F, "x")
    w = b.add_input(F, "w")
    (y,) = b.add_extern("ns.op.default", [x, None, w, x], (1.5, "relu"), (F,), reason="why", name="op_x")
    node = b.build([y]).nodes[0]
    assert node.op == "extern" and node.inputs == (x, w) and node.name == "op_x"
    assert node.attr("args") == (Arg(0), None, Arg(1), Arg(0), 1.5, "relu")
    assert node.attr("target") == "ns.op.default" and node.attr("reason") == "why"
    assert b.type_of(y) == F
