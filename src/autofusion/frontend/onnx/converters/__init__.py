"""ONNX -> IR converters, one module per op family; importing this package registers them all."""

from autofusion.frontend.onnx.converters import (  # noqa: F401
    elementwise,
    nn,
    rearrange,
    reduction,
    shape,
)
