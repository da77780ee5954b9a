"""One DType <-> ONNX element type table: the export (`optimize --export`), the debug dump's picture and the
ONNX frontend agree on every DType, and a type ONNX lacks is an error in the export, UNDEFINED in the dump."""

from __future__ import annotations

import onnx
import pytest
import torch
from onnx import TensorProto

from autofusion.dfx.onnx_dump import to_onnx
from autofusion.errors import ExportError, ModelFileError
from autofusion.export.onnx import export_graph
from autofusion.frontend.onnx.context import dtype_of
from autofusion.ir.dtypes import DType
from autofusion.ir.graph import Graph, GraphBuilder
from autofusion.ir.onnx_dtypes import DTYPE_TO_ONNX, ONNX_TO_DTYPE
from autofusion.ir.types import TensorType


def _passthrough(dtype: DType) -> Graph:
    b = GraphBuilder("g")
    x = b.add_input(TensorType(dtype, (2, 3)), "x")
    return b.build([x])


def _elem(vi: onnx.ValueInfoProto) -> int:
    return vi.type.tensor_type.elem_type


@pytest.mark.parametrize("dtype", list(DType), ids=lambda d: d.name)
def test_export_and_dump_write_the_same_elem_type_and_it_reads_back(dtype: DType) -> None:
    g = _passthrough(dtype)
    dumped = _elem(to_onnx(g).graph.input[0])
    code = DTYPE_TO_ONNX.get(dtype)
    if code is None:
        assert dumped == TensorProto.UNDEFINED
        with pytest.raises(ExportError, match=f"dtype {dtype.name} has no ONNX element type"):
            export_graph(g)
        return
    exported = export_graph(g)
    assert _elem(exported.graph.input[0]) == _elem(exported.graph.output[0]) == dumped == code
    assert ONNX_TO_DTYPE[code] is dtype  # the round trip IR -> ONNX -> IR
    if dtype.is_opaque:  # carried by the IR, but no IR op computes on it: the frontend refuses it
        with pytest.raises(ModelFileError, match="does not support"):
            dtype_of(code, "input 'x'")
    else:
        assert dtype_of(code, "input 'x'") is dtype


def test_the_table_is_one_to_one() -> None:
    assert len(ONNX_TO_DTYPE) == len(DTYPE_TO_ONNX)
    assert all(DTYPE_TO_ONNX[d] == c for c, d in ONNX_TO_DTYPE.items())


def test_the_dump_writes_const_nodes_and_their_name_attribute() -> None:
    # An IR attribute called "name" once collided with onnx.helper.make_node's keyword of that name.
    b = GraphBuilder("g")
    x = b.add_input(TensorType(DType.float32, (2,)), "x")
    w = b.add_constant("w", torch.ones(2), TensorType(DType.float32, (2,)))
    g = b.build([b.add("add", (x, w))])
    model = to_onnx(g)
    onnx.checker.check_model(model, full_check=True)
    const = next(n for n in model.graph.node if n.op_type == "const")
    assert {a.name for a in const.attribute} == {"name", "type"}
    assert onnx.helper.get_attribute_value(next(a for a in const.attribute if a.name == "name")) == b"w"
