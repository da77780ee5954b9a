"""ONNX -> IR converters, one module per op family; importing this package registers them all."""

from autofusion.frontend.onnx.converters import elementwise, nn, reduction, shape  # noqa: F401
from autofusion.frontend.onnx.converters import losses, reduce_composite  # noqa: F401
