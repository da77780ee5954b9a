"""What autofusion cannot run is one FrontendError line naming the node, the op, its opset and the reason,
and the CLI (`optimize`, `check`) exits 2 with that line on stderr, no traceback.

The unsupported ops here are ones no converter will take: an operator of a domain autofusion does not
implement (ai.onnx.ml, out of scope by design) and one of a custom domain.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import autofusion
from autofusion.errors import FrontendError
from autofusion.tools.cli import main as cli

N = helper.make_node


def _model(node, domain: str, version: int):
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", 1, [2, 3])],
        [helper.make_tensor_value_info("y", 1, [2, 3])],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(domain, version)]
    )
    model.ir_version = 8
    return model


CASES = [
    # (an ml op onnx.reference does not implement either: those it does run on it, externs/reference.py)
    (N("CategoryMapper", ["x"], ["y"], name="bin", domain="ai.onnx.ml"), "ai.onnx.ml", 3,
     "'bin' (ai.onnx.ml.CategoryMapper, opset 3)"),
    (N("Frobnicate", ["x"], ["y"], name="frob", domain="com.example"), "com.example", 2,
     "'frob' (com.example.Frobnicate, opset 2)"),
]  # fmt: skip


@pytest.mark.parametrize("node,domain,version,label", CASES, ids=["ml-domain", "custom-domain"])
def test_an_unsupported_node_is_one_line_naming_node_op_opset_and_reason(
    node, domain, version, label
) -> None:
    model = _model(node, domain, version)
    with pytest.raises(FrontendError) as info:
        autofusion.compile(model)(np.zeros((2, 3), np.float32))
    text = str(info.value)
    assert len(text.splitlines()) == 1, text
    assert f"node {label} cannot be converted (no converter)" in text, text
    assert "has no torch implementation" in text


@pytest.mark.parametrize("command", ["optimize", "check"])
@pytest.mark.parametrize("node,domain,version,label", CASES, ids=["ml-domain", "custom-domain"])
def test_the_cli_exits_2_with_that_line(tmp_path, capsys, command, node, domain, version, label) -> None:
    path = tmp_path / "unsupported.onnx"
    path.write_bytes(_model(node, domain, version).SerializeToString())
    assert cli.main([command, str(path)]) == 2
    got = capsys.readouterr()
    err = got.err.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    assert f"autofusion {command}: error:" in err and label in err and "cannot be converted" in err, err


def test_a_cast_to_a_type_autofusion_lacks_names_the_node_too() -> None:
    graph = helper.make_graph(
        [N("Cast", ["x"], ["y"], name="to_f8", to=TensorProto.FLOAT8E4M3FN)],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT8E4M3FN, [4])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    with pytest.raises(FrontendError) as info:
        autofusion.compile(model)(np.zeros(4, np.float32))
    text = str(info.value)
    assert len(text.splitlines()) == 1, text
    assert (
        "node 'to_f8' (Cast, opset 21) cannot be converted (the target type has element type FLOAT8E4M3FN"
        in text
    )
