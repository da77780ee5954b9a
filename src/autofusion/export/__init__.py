"""Exporters: IR graphs and fusion plans written in other formats.

ONNX: one writer (`writer`: the walk, fused kernels as functions, the model) with two dialects, standard
ONNX ops (`onnx`, with `onnx_ops` and `onnx_library`) and the IR's own ops for viewers (`onnx_ir`).
"""
