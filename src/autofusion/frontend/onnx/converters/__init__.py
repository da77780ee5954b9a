"""ONNX -> IR converters, one module per op family; importing this package registers them all."""

from autofusion.frontend.onnx.converters import (  # noqa: F401
    activations,
    arg_reduce,
    attention,
    classic,
    elementwise,
    losses,
    math_misc,
    nn,
    norms,
    quantized,
    rearrange,
    reduce_composite,
    reduction,
    shape,
)
