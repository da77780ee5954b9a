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
ModelProto. They are the standard-ONNX dialect of `autofusion.export.writer`, the writer the debug
dumps' IR picture (`autofusion.export.onnx_ir`) shares.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import onnx

from autofusion.export.onnx_ops import OPSET, emit
from autofusion.export.writer import (
    Names,
    Sink,
    assemble,
    function,
    opset_imports,
    tensor_proto,
    value_info,
    write,
)
from autofusion.ir.graph import Graph, Node
from autofusion.ir.types import TensorType
from autofusion.plan.schedule import KernelStep, Plan

FUNCTION_DOMAIN = "autofusion"
# Names we make up (values, helper constants) start with this, so they cannot collide with the
# graph's input names, which are kept as they are.
PREFIX = "_af_"


class _Standard:
    """The export dialect: standard ONNX ops; weights as initializers; outputs renamed by Identity nodes."""

    function_domain = FUNCTION_DOMAIN
    prefix = PREFIX

    def __init__(
        self, output_names: Sequence[str] | None, weights: Mapping[str, Any] | None, opset: int
    ) -> None:
        self.output_names = output_names
        self.weights = weights or {}
        self.opset = opset

    def names(self, graph: Graph) -> Names:
        """Graph inputs keep their names, everything else is _af_v<id>."""
        kept = {gi.value.id: gi.name for gi in graph.inputs}
        return lambda vid: kept.get(vid, f"{PREFIX}v{vid}")

    def node(self, sink: Sink, graph: Graph, node: Node, ins: list[str], outs: list[str]) -> None:
        if node.op == "const":  # an initializer in the graph, a Constant node in a function body
            sink.weight(graph.constants[node.attr("name")], node.out.type, outs[0])
        else:
            emit(sink, node, ins, outs)

    def kernel(
        self, graph: Graph, step: KernelStep, types: dict[int, TensorType]
    ) -> tuple[onnx.FunctionProto, list[int]]:
        nodes = [graph.nodes[k] for k in sorted(step.nodes)]
        produced = {v.id for n in nodes for v in n.outputs}
        inputs = list(step.inputs)
        for n in nodes:  # a value the body reads that the step does not list (defensive; plans list them all)
            for i in n.inputs:
                if i not in produced and i not in inputs:
                    inputs.append(i)
        local = {vid: f"x{k}" for k, vid in enumerate(inputs)}
        sink = Sink(f"{step.name}_", types, allow_initializers=False)
        doc = f"fused kernel {step.name}: " + ", ".join(n.op for n in nodes)
        fn = function(
            self, graph, step, nodes, inputs, sink, lambda v: local.get(v, f"v{v}"), self.opset, doc
        )
        return fn, inputs

    def call_name(self, step: KernelStep) -> str | None:
        return None

    def finish(
        self, graph: Graph, sink: Sink, name: Names, functions: list[onnx.FunctionProto]
    ) -> onnx.ModelProto:
        types = graph.value_types()
        inputs = []
        for gi in graph.inputs:
            if gi.name in self.weights:
                sink.initializers.append(tensor_proto(self.weights[gi.name], gi.value.type.dtype, gi.name))
            else:
                inputs.append(value_info(gi.name, gi.value.type))
        outputs = []
        out_names = self.output_names or [f"output_{k}" for k in range(len(graph.outputs))]
        for vid, oname in zip(graph.outputs, out_names, strict=True):
            sink.node("Identity", [name(vid)], [oname])
            outputs.append(value_info(oname, types[vid]))
        return assemble(
            graph.name or "autofusion",
            sink,
            inputs,
            outputs,
            opset_imports(self.opset, sink.domains),
            functions,
            min(onnx.IR_VERSION, 10),  # readable by onnxruntime releases of the last two years
        )


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
    return write(graph, None, _Standard(output_names, weights, max(opset, OPSET)))


def export_plan(
    plan: Plan,
    output_names: Sequence[str] | None = None,
    weights: Mapping[str, Any] | None = None,
    opset: int = OPSET,
) -> onnx.ModelProto:
    """`plan.graph` with each fused kernel as a call to an `autofusion`-domain ONNX function
    (`weights`, `opset`: as for `export_graph`)."""
    return write(plan.graph, plan, _Standard(output_names, weights, max(opset, OPSET)))


def save(model: onnx.ModelProto, path: str | Path) -> None:
    """Write `model`; over 2 GiB of weights go to `<file>.data` next to it (protobuf's size limit)."""
    path = Path(path)
    large = model.ByteSize() > (2**31 - 2**20)
    onnx.save_model(
        model, str(path), save_as_external_data=large, location=path.name + ".data" if large else None
    )


__all__ = ["FUNCTION_DOMAIN", "export_graph", "export_plan", "save", "tensor_proto"]
