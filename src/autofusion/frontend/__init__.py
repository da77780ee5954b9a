"""Frontends: PyTorch (`torch/`) and ONNX (`onnx/`) models to IR graphs.

Both feed one conversion loop (`driver.py`: converters, externs, the fallback log, verification) and
give one result type (`driver.Conversion`); `source.py` says what a compiled model asks of a model
(`Source`) and what it gets back per input signature (`Captured`).
"""
