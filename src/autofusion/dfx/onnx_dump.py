"""Debug dumps as ONNX (`.onnx`) and protobuf text (`.pbtxt`), for Netron.

In: an IR graph and, after fusion, its plan. Out: the bytes or text of `autofusion.export.onnx_ir.to_onnx`
(the IR's own ops in a custom domain, fused kernels as functions), which `onnx.checker` accepts.
"""

from __future__ import annotations

from google.protobuf import text_format

from autofusion.dfx.dump import register_format
from autofusion.export.onnx_ir import DOMAIN_FUSED, DOMAIN_IR, to_onnx
from autofusion.ir.graph import Graph
from autofusion.plan.schedule import Plan


def onnx_bytes(graph: Graph, plan: Plan | None) -> bytes:
    return bytes(to_onnx(graph, plan).SerializeToString())


def onnx_text(graph: Graph, plan: Plan | None) -> str:
    return str(text_format.MessageToString(to_onnx(graph, plan)))


register_format("onnx", onnx_bytes)
register_format("pbtxt", onnx_text)

__all__ = ["DOMAIN_FUSED", "DOMAIN_IR", "onnx_bytes", "onnx_text", "to_onnx"]
