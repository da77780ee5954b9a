"""The typed, immutable IR: dtypes, tensor types, the op registry, graphs, printer and verifier."""

from autofusion.ir.dtypes import DType
from autofusion.ir.graph import Arg, Graph, GraphBuilder, GraphInput, InputRole, Node, Value
from autofusion.ir.ops import FusionClass, OpDef, all_ops, get_op
from autofusion.ir.printer import print_graph
from autofusion.ir.types import TensorType
from autofusion.ir.verify import verify

__all__ = [
    "Arg", "DType", "FusionClass", "Graph", "GraphBuilder", "GraphInput", "InputRole", "Node", "OpDef",
    "TensorType", "Value", "all_ops", "get_op", "print_graph", "verify",
]  # fmt: skip
