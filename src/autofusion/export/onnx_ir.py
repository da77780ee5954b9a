"""The IR itself as ONNX, a picture for Netron (what the debug dumps write as `.onnx` and `.pbtxt`).

In: an IR graph and, after fusion, its plan. Out: an `onnx.ModelProto` that `onnx.checker` accepts:
every IR op is a node of the custom domain `ai.autofusion.ir` (op type = IR op name, attributes
carried over), and each fused kernel is an ONNX function of the domain `ai.autofusion.fused` whose
body is the kernel's IR nodes, so Netron shows one box per kernel and expands it on demand.

This is a picture of our IR, not an export for other runtimes: the nodes keep our op names and
attribute meanings (`autofusion.export.onnx` writes standard ONNX ops).
"""

from __future__ import annotations

import re
from typing import Any

import onnx
from onnx import helper

from autofusion.export.writer import Names, Sink, assemble, function, value_info, write
from autofusion.ir.graph import Graph, Node
from autofusion.ir.printer import format_attr
from autofusion.ir.types import TensorType
from autofusion.plan.schedule import KernelStep, Plan

DOMAIN_IR = "ai.autofusion.ir"
DOMAIN_FUSED = "ai.autofusion.fused"


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


def _vinfo(name: str, t: TensorType) -> onnx.ValueInfoProto:
    # A picture of the graph: a type ONNX lacks (quantized, bit-packed) is shown as UNDEFINED.
    return value_info(name, t, strict=False)


class _Picture:
    """The dialect: IR nodes verbatim; values named after their nodes; kernels over the graph's names."""

    function_domain = DOMAIN_FUSED
    prefix = ""  # makes up no names

    def names(self, graph: Graph) -> Names:
        out: dict[int, str] = {}
        for gi in graph.inputs:
            out[gi.value.id] = re.sub(r"\W", "_", gi.name) or f"v{gi.value.id}"
        for n in graph.nodes:
            for k, v in enumerate(n.outputs):
                out[v.id] = f"{n.name}_{k}" if len(n.outputs) > 1 else (n.name or f"v{v.id}")
        return out.__getitem__

    def node(self, sink: Sink, graph: Graph, node: Node, ins: list[str], outs: list[str]) -> None:
        proto = helper.make_node(
            node.op, ins, outs, name=node.name, domain=DOMAIN_IR, doc_string=node.loc or ""
        )
        # Attributes made here, not as make_node keywords: an IR attribute may be called "name" (const).
        proto.attribute.extend(
            helper.make_attribute(k, _attr(v)) for k, v in sorted(node.attrs) if v is not None
        )
        sink.append(proto)

    def kernel(
        self, graph: Graph, step: KernelStep, types: dict[int, TensorType]
    ) -> tuple[onnx.FunctionProto, list[int]]:
        sink = Sink("", types, allow_initializers=False)
        body = tuple(graph.nodes[k] for k in step.nodes)  # with a GEMM + epilogue step's GEMM
        return function(
            self, graph, step, body, step.inputs, sink, self.names(graph), None, f"tile {step.tile}"
        ), list(step.inputs)

    def call_name(self, step: KernelStep) -> str | None:
        return step.name

    def finish(
        self, graph: Graph, sink: Sink, name: Names, functions: list[onnx.FunctionProto]
    ) -> onnx.ModelProto:
        types = graph.value_types()
        produced = {o for nd in sink.nodes for o in nd.output}
        inner = [
            _vinfo(name(v), t) for v, t in types.items() if name(v) in produced and v not in graph.outputs
        ]
        opsets = [helper.make_opsetid("", 17), helper.make_opsetid(DOMAIN_IR, 1)]
        if functions:
            opsets.append(helper.make_opsetid(DOMAIN_FUSED, 1))
        return assemble(
            re.sub(r"\W", "_", graph.name) or "graph",
            sink,
            [_vinfo(name(gi.value.id), gi.value.type) for gi in graph.inputs],
            [_vinfo(name(v), types[v]) for v in graph.outputs],
            opsets,
            functions,
            8,
            inner,
        )


def to_onnx(graph: Graph, plan: Plan | None = None) -> onnx.ModelProto:
    """`graph` (with `plan`: its steps, fused kernels as functions) as IR-domain ONNX."""
    return write(graph, plan, _Picture())


__all__ = ["DOMAIN_FUSED", "DOMAIN_IR", "to_onnx"]
