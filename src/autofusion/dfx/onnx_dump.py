"""Debug dumps as ONNX (`.onnx`) and protobuf text (`.pbtxt`), for Netron.

In: an IR graph and, after fusion, its plan. Out: an `onnx.ModelProto` that `onnx.checker` accepts:
every IR op is a node of the custom domain `ai.autofusion.ir` (op type = IR op name, attributes
carried over), and each fused kernel is an ONNX function of the domain `ai.autofusion.fused` whose
body is the kernel's IR nodes, so Netron shows one box per kernel and expands it on demand.

This is a picture of our IR, not an export for other runtimes: the nodes keep our op names and
attribute meanings. (The ONNX exporter of the ONNX frontend issue maps to standard ONNX ops; it can
replace `to_onnx` here by registering its own function for the same suffixes.)
"""

from __future__ import annotations

import re
from typing import Any

import onnx
from google.protobuf import text_format  # type: ignore[import-untyped]
from onnx import TensorProto, helper

from autofusion.dfx.dump import register_format
from autofusion.ir.dtypes import DType
from autofusion.ir.graph import Graph, Node
from autofusion.ir.printer import format_attr
from autofusion.ir.types import TensorType
from autofusion.plan.schedule import KernelStep, Plan

DOMAIN_IR = "ai.autofusion.ir"
DOMAIN_FUSED = "ai.autofusion.fused"
ONNX_DTYPE = {
    DType.float32: TensorProto.FLOAT,
    DType.float16: TensorProto.FLOAT16,
    DType.bfloat16: TensorProto.BFLOAT16,
    DType.float64: TensorProto.DOUBLE,
    DType.int64: TensorProto.INT64,
    DType.int32: TensorProto.INT32,
    DType.int16: TensorProto.INT16,
    DType.int8: TensorProto.INT8,
    DType.uint8: TensorProto.UINT8,
    DType.bool: TensorProto.BOOL,
    DType.complex64: TensorProto.COMPLEX64,
    DType.complex128: TensorProto.COMPLEX128,
    DType.uint16: TensorProto.UINT16,
    DType.uint32: TensorProto.UINT32,
    DType.uint64: TensorProto.UINT64,
    DType.float8_e4m3fn: TensorProto.FLOAT8E4M3FN,
    DType.float8_e4m3fnuz: TensorProto.FLOAT8E4M3FNUZ,
    DType.float8_e5m2: TensorProto.FLOAT8E5M2,
    DType.float8_e5m2fnuz: TensorProto.FLOAT8E5M2FNUZ,
}


def _attr(value: Any) -> Any:
    """An IR attribute as an ONNX attribute value (ints, floats, strings; anything else as its IR text)."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, (int, float, str)):
        return value
    if (
        isinstance(value, tuple)
        and value
        and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
    ):
        return list(value)
    if isinstance(value, tuple) and value and all(isinstance(v, float) for v in value):
        return list(value)
    return format_attr(value)


def _node(n: Node, name_of: dict[int, str]) -> onnx.NodeProto:
    attrs = {k: _attr(v) for k, v in n.attrs if v is not None}
    return helper.make_node(
        n.op,
        [name_of[i] for i in n.inputs],
        [name_of[v.id] for v in n.outputs],
        name=n.name,
        domain=DOMAIN_IR,
        doc_string=n.loc or "",
        **attrs,
    )


def _vinfo(name: str, t: TensorType) -> onnx.ValueInfoProto:
    # A picture of the graph: a type ONNX lacks (quantized, bit-packed) is shown as UNDEFINED.
    return helper.make_tensor_value_info(name, ONNX_DTYPE.get(t.dtype, TensorProto.UNDEFINED), list(t.shape))


def _names(graph: Graph) -> dict[int, str]:
    out: dict[int, str] = {}
    for gi in graph.inputs:
        out[gi.value.id] = re.sub(r"\W", "_", gi.name) or f"v{gi.value.id}"
    for n in graph.nodes:
        for k, v in enumerate(n.outputs):
            out[v.id] = f"{n.name}_{k}" if len(n.outputs) > 1 else (n.name or f"v{v.id}")
    return out


def to_onnx(graph: Graph, plan: Plan | None = None) -> onnx.ModelProto:
    name_of = _names(graph)
    types = graph.value_types()
    nodes: list[onnx.NodeProto] = []
    functions: list[onnx.FunctionProto] = []
    if plan is None:
        nodes = [_node(n, name_of) for n in graph.nodes]
    else:
        for step in plan.steps:
            if isinstance(step, KernelStep):
                body = [_node(n, name_of) for n in step.kernel.nodes]
                functions.append(
                    helper.make_function(
                        DOMAIN_FUSED,
                        step.name,
                        [name_of[v] for v in step.inputs],
                        [name_of[v] for v in step.outputs],
                        body,
                        [helper.make_opsetid(DOMAIN_IR, 1)],
                        doc_string=f"tile {step.tile}",
                    )
                )
                nodes.append(
                    helper.make_node(
                        step.name,
                        [name_of[v] for v in step.inputs],
                        [name_of[v] for v in step.outputs],
                        name=step.name,
                        domain=DOMAIN_FUSED,
                    )
                )
            else:
                nodes.append(_node(step.node, name_of))
    produced = {o for nd in nodes for o in nd.output}
    inner = [
        _vinfo(name_of[v], t)
        for v, t in types.items()
        if name_of.get(v) in produced and v not in graph.outputs
    ]
    g = helper.make_graph(
        nodes,
        re.sub(r"\W", "_", graph.name) or "graph",
        [_vinfo(name_of[gi.value.id], gi.value.type) for gi in graph.inputs],
        [_vinfo(name_of[v], types[v]) for v in graph.outputs],
        value_info=inner,
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid(DOMAIN_IR, 1)]
    if functions:
        opsets.append(helper.make_opsetid(DOMAIN_FUSED, 1))
    model = helper.make_model(g, opset_imports=opsets, functions=functions, producer_name="autofusion")
    model.ir_version = 8
    return model


def onnx_bytes(graph: Graph, plan: Plan | None) -> bytes:
    return bytes(to_onnx(graph, plan).SerializeToString())


def onnx_text(graph: Graph, plan: Plan | None) -> str:
    return str(text_format.MessageToString(to_onnx(graph, plan)))


register_format("onnx", onnx_bytes)
register_format("pbtxt", onnx_text)
