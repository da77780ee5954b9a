"""Write IR graphs and fusion plans as ONNX models.

- `export_graph(graph)`: the graph as plain ONNX (each IR node as its ONNX op or ops). Given the
  rewritten graph of a plan (`plan.graph`: dead nodes dropped, composites decomposed) this is the
  "plain" export, which onnxruntime runs.
- `export_plan(plan)`: the same graph with every fused kernel as one call to an ONNX function in the
  `autofusion` domain, whose body holds the ONNX ops of the kernel's nodes; viewers such as Netron
  show one node per kernel and expand it on demand, and onnx.checker validates the bodies.
  Library ops and externs stay top-level nodes (an extern that came from ONNX as its original node).
- `save(model, path)`: writes the file, weights over 2 GiB to an external data file next to it.

Weights (`const` nodes) become initializers. Both functions take only IR objects and return a
ModelProto, so other tools (debug dumps) can call them on any graph or plan.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import onnx
from onnx import helper

from autofusion.export.onnx_ops import OPSET, Sink, emit, onnx_type, tensor_proto
from autofusion.ir.graph import Graph, Node
from autofusion.ir.types import TensorType
from autofusion.plan.schedule import KernelStep, Plan

FUNCTION_DOMAIN = "autofusion"
# Names we make up (values, helper constants) start with this, so they cannot collide with the
# graph's input names, which are kept as they are.
PREFIX = "_af_"


class _Names:
    """ONNX names for IR values: graph inputs keep their names, everything else is _af_v<id>."""

    def __init__(self, graph: Graph) -> None:
        self.names = {gi.value.id: gi.name for gi in graph.inputs}

    def __call__(self, vid: int) -> str:
        return self.names.get(vid, f"{PREFIX}v{vid}")


def _value_info(name: str, t: TensorType) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, onnx_type(t.dtype), list(t.shape))


def _emit_node(sink: Sink, graph: Graph, node: Node, name: _Names) -> None:
    ins = [name(i) for i in node.inputs]
    outs = [name(v.id) for v in node.outputs]
    if node.op == "const":
        sink.weight(graph.constants[node.attr("name")], node.out.type, outs[0])
    else:
        emit(sink, node, ins, outs)


def _finish(
    graph: Graph,
    sink: Sink,
    name: _Names,
    output_names: Sequence[str] | None,
    weights: Mapping[str, Any] | None,
    opset: int,
    functions: Sequence[onnx.FunctionProto] = (),
) -> onnx.ModelProto:
    types = graph.value_types()
    weights = weights or {}
    inputs = []
    for gi in graph.inputs:
        if gi.name in weights:
            sink.initializers.append(tensor_proto(weights[gi.name], gi.value.type.dtype, gi.name))
        else:
            inputs.append(_value_info(gi.name, gi.value.type))
    outputs = []
    out_names = list(output_names) if output_names else [f"output_{k}" for k in range(len(graph.outputs))]
    for vid, oname in zip(graph.outputs, out_names, strict=True):
        sink.node("Identity", [name(vid)], [oname])
        outputs.append(_value_info(oname, types[vid]))
    g = helper.make_graph(
        sink.nodes, graph.name or "autofusion", inputs, outputs, initializer=sink.initializers
    )
    imports = [helper.make_opsetid("", opset)] + [helper.make_opsetid(d, 1) for d in sorted(sink.domains)]
    model = helper.make_model(g, opset_imports=imports, functions=list(functions), producer_name="autofusion")
    model.ir_version = min(model.ir_version, 10)  # readable by onnxruntime releases of the last two years
    return model


def export_graph(
    graph: Graph,
    output_names: Sequence[str] | None = None,
    weights: Mapping[str, Any] | None = None,
    opset: int = OPSET,
) -> onnx.ModelProto:
    """`graph` as plain ONNX, one or more ONNX nodes per IR node. Graph inputs named in `weights`
    (parameters and buffers a compiled callable binds) become initializers holding those tensors.
    `opset` (18 or newer): give the source model's when it is newer, so externs written back as
    their original ONNX nodes keep the semantics they were read with."""
    sink = Sink(PREFIX, graph.value_types(), allow_initializers=True)
    name = _Names(graph)
    for node in graph.nodes:
        _emit_node(sink, graph, node, name)
    return _finish(graph, sink, name, output_names, weights, max(opset, OPSET))


def _function(
    graph: Graph, step: KernelStep, types: dict[int, TensorType], opset: int
) -> tuple[onnx.FunctionProto, list[int]]:
    nodes = [graph.nodes[k] for k in sorted(step.nodes)]
    produced = {v.id for n in nodes for v in n.outputs}
    inputs = list(step.inputs)
    for n in nodes:  # a value the body reads that the step does not list (defensive; plans list them all)
        for i in n.inputs:
            if i not in produced and i not in inputs:
                inputs.append(i)
    sink = Sink(f"{step.name}_", types, allow_initializers=False)
    local = {vid: f"x{k}" for k, vid in enumerate(inputs)}

    def name(vid: int) -> str:
        return local.get(vid, f"v{vid}")

    for n in nodes:
        if n.op == "const":
            sink.const(graph.constants[n.attr("name")], n.out.type.dtype, name(n.out.id))
        else:
            emit(sink, n, [name(i) for i in n.inputs], [name(v.id) for v in n.outputs])
    fn = helper.make_function(
        FUNCTION_DOMAIN,
        step.name,
        [name(v) for v in inputs],
        [name(v) for v in step.outputs],
        sink.nodes,
        opset_imports=[helper.make_opsetid("", opset)]
        + [helper.make_opsetid(d, 1) for d in sorted(sink.domains)],
        doc_string=f"fused kernel {step.name}: " + ", ".join(n.op for n in nodes),
    )
    return fn, inputs


def export_plan(
    plan: Plan,
    output_names: Sequence[str] | None = None,
    weights: Mapping[str, Any] | None = None,
    opset: int = OPSET,
) -> onnx.ModelProto:
    """`plan.graph` with each fused kernel as a call to an `autofusion`-domain ONNX function
    (`weights`, `opset`: as for `export_graph`)."""
    opset = max(opset, OPSET)
    graph = plan.graph
    types = graph.value_types()
    sink = Sink(PREFIX, types, allow_initializers=True)
    name = _Names(graph)
    functions = []
    for step in plan.steps:
        if isinstance(step, KernelStep):
            fn, inputs = _function(graph, step, types, opset)
            functions.append(fn)
            sink.node(
                step.name, [name(v) for v in inputs], [name(v) for v in step.outputs], domain=FUNCTION_DOMAIN
            )
        else:
            _emit_node(sink, graph, step.node, name)
    return _finish(graph, sink, name, output_names, weights, opset, functions)


def save(model: onnx.ModelProto, path: str | Path) -> None:
    """Write `model`; over 2 GiB of weights go to `<file>.data` next to it (protobuf's size limit)."""
    path = Path(path)
    large = model.ByteSize() > (2**31 - 2**20)
    onnx.save_model(
        model, str(path), save_as_external_data=large, location=path.name + ".data" if large else None
    )


__all__ = ["FUNCTION_DOMAIN", "export_graph", "export_plan", "save", "tensor_proto"]
