"""ATen -> IR converters, one module per op family; importing this package registers them all."""

from autofusion.frontend.torch.converters import elementwise, nn, reduction, shape  # noqa: F401
