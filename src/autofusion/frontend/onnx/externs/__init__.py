"""Torch implementations of ONNX ops that do not fuse, one module per family; importing this package
registers them in `fallback.FALLBACKS` and their composite targets (`composite.py`). Resize also has
a converter for the case that is only views (nearest by whole factors, `resize.py`)."""

from autofusion.frontend.onnx.externs import (  # noqa: F401
    indexing,
    misc,
    pool,
    resize,
    sampling,
)
