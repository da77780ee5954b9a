"""Exporters: IR graphs and fusion plans written in other formats (ONNX: `autofusion.export.onnx`)."""
