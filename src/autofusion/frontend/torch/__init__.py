"""The PyTorch frontend: capture with torch.export (`capture`), FX -> IR (`fx_to_ir`), ATen converters."""
