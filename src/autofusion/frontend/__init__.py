"""Frontends: PyTorch (`torch/`) and ONNX (`onnx/`) models to IR graphs."""
