"""Torch implementations of ONNX ops that do not fuse, one module per family; importing this package
registers them in `fallback.FALLBACKS` (and their composite targets, see `composite.py`)."""

from autofusion.frontend.onnx.externs import (  # noqa: F401
    indexing,
    misc,
    pool,
    resize,
    sampling,
)
