"""The op registry is the one source of op kinds, op groups and NF codes."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import torch

import autofusion
from autofusion.errors import IRVerifyError
from autofusion.fusion.legality import op_refusal
from autofusion.ir import DType, GraphBuilder, Node, TensorType, nf
from autofusion.ir.catalog import COMMUTATIVE, KERNEL_EXCLUDED
from autofusion.ir.ops import FusionClass, Op, all_ops
from autofusion.passes.rewrite import match
from autofusion.passes.simplify import cse

SRC = Path(autofusion.__file__).parent
README = SRC.parents[1] / "README.md"


def test_op_has_one_member_per_opdef() -> None:
    assert sorted(o.value for o in Op) == sorted(all_ops())
    assert all(o.name == o.value.upper() for o in Op)


def test_node_op_is_the_enum_and_still_equals_its_string() -> None:
    b = GraphBuilder()
    x = b.add_input(TensorType(DType.float32, (4,)), "x")
    b.add("add", [x, x])
    g = b.build([x])
    node = g.nodes[0]
    assert node.op is Op.ADD and node.op == "add" and node.op in ("add",)
    assert f"{node.op}" == "add" and str(node.op) == "add" and {"add": 1}[node.op] == 1
    assert "= add(%0, %0)" in str(g)  # the printer shows the bare name


def test_unknown_op_names_the_op_and_the_node() -> None:
    with pytest.raises(IRVerifyError, match=r"unknown IR op 'frob' in node 'n7'"):
        Node("frob", (), (), name="n7")
    assert Op.parse("mul") is Op.MUL


def _bits(t: torch.Tensor) -> bytes:
    return t.numpy().tobytes()


@pytest.mark.parametrize("op", sorted(all_ops()))
def test_commutative_flag_means_bit_for_bit(op: str) -> None:
    """An op is commutative iff swapping its inputs gives the same bits; signed zeros and NaN
    included. maximum/minimum propagate NaN symmetrically but return their first operand on
    (+0.0, -0.0), so they are not."""
    opdef = all_ops()[op]
    if opdef.max_inputs != 2 or opdef.min_inputs != 2 or opdef.fusion is not FusionClass.BROADCAST:
        assert op not in COMMUTATIVE
        return
    fn = getattr(torch, op)
    vals = [0.0, -0.0, 1.5, -2.0, float("nan"), float("inf")]
    a = torch.tensor([x for x in vals for _ in vals])
    b = torch.tensor([y for _ in vals for y in vals])
    if op.startswith(("bitwise", "logical")):
        a, b = (a * 3).to(torch.int32), (b * 5).nan_to_num(0, 7, -7).to(torch.int32)
    same = _bits(fn(a, b)) == _bits(fn(b, a))
    assert (op in COMMUTATIVE) == same, f"{op}: commutative flag {op in COMMUTATIVE}, bit-for-bit {same}"


def test_cse_and_the_rule_matcher_use_the_one_commutative_set() -> None:
    assert cse.COMMUTATIVE is COMMUTATIVE and match.COMMUTATIVE is COMMUTATIVE
    b = GraphBuilder()
    t = TensorType(DType.float32, (4,))
    x, y = b.add_input(t, "x"), b.add_input(t, "y")
    outs = [b.add(op, ins) for op in ("add", "maximum") for ins in ([x, y], [y, x])]
    g = cse.eliminate_common_subexpressions(b.build(outs))
    assert [n.op for n in g.nodes] == ["add", "maximum", "maximum"]


def test_kernel_exclusions_come_from_fusion_class_and_flags() -> None:
    for op, d in all_ops().items():
        excluded = d.fusion in (FusionClass.ANCHOR, FusionClass.OPAQUE) or not d.kernel
        assert (op in KERNEL_EXCLUDED) == excluded
        refusal = op_refusal(op)
        assert (refusal is not None) == excluded
        if refusal is not None:
            assert refusal.code in nf.CODES and op in refusal.reason
    # Reductions the kernel language cannot form, though their class is REDUCE.
    assert {"argmax", "argmin", "any", "all"} <= KERNEL_EXCLUDED
    assert "sum" not in KERNEL_EXCLUDED and "mm" in KERNEL_EXCLUDED and "extern" in KERNEL_EXCLUDED


def test_nf_codes_are_produced_only_through_the_table() -> None:
    table = SRC / "ir" / "nf.py"
    for path in SRC.rglob("*.py"):
        text = path.read_text()
        mentioned = set(re.findall(r"NF\d{4}", text))
        unknown = sorted(mentioned - set(nf.CODES))
        assert not unknown, f"{path}: codes {unknown} are not in ir/nf.py"
        if path == table:
            continue
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                code = re.fullmatch(r"\[?NF\d{4}\]?", node.value.strip())
                assert not code, f"{path}:{node.lineno}: produce NF codes through autofusion.ir.nf"


def test_every_nf_code_is_in_the_readme_table() -> None:
    rows = set(re.findall(r"^\s*\|\s*(NF\d{4})\s*\|", README.read_text(), re.M))
    assert rows == set(nf.CODES)
    assert all(nf.CODES.values())


def test_every_nf_constant_has_a_meaning() -> None:
    constants = {v for k, v in vars(nf).items() if k.isupper() and isinstance(v, str)}
    assert constants == set(nf.CODES) and len(constants) == len([k for k in vars(nf) if k.isupper()]) - 1
