"""ONNX -> IR converters, one module per op family; importing this package registers them all."""

from autofusion.frontend.onnx.converters import classic, elementwise, nn, reduction, shape  # noqa: F401
