"""The ONNX frontend: read a model file (or ModelProto), check it, convert it to IR.

`load_model` (loader.py) reads and checks; `fix_input_shapes` pins dynamic input dims to the shapes of
the tensors the model is called with; `convert_model` (convert.py) builds the IR graph.
"""

from autofusion.frontend.onnx.convert import convert_model
from autofusion.frontend.onnx.loader import fix_input_shapes, graph_inputs, input_dims, is_static, load_model

__all__ = [
    "convert_model",
    "fix_input_shapes",
    "graph_inputs",
    "input_dims",
    "is_static",
    "load_model",
]
