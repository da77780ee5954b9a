"""ONNX MatMul of an N-d activation by a 2-d initializer -> one `linear` on the activation as it is.

numpy.matmul's general lowering (nn.matmul) flattens x [..., k] to [rows, k] for `mm` and reshapes the
result back. When x is a fused kernel's result, that flattening reshape cannot join the producing
kernel (another iteration space) and became a copy kernel of its own: ConvNeXt's eight MLP GEMMs each
read a copy of their input made just before (~0.6 ms of ~18 ms per-step time on one core of the
development VM, where onnxruntime reshapes in place). `linear(x, w.T)` takes [..., k] directly (the
library call flattens a dense input as a view), and the packed GEMM routes take a linear on a
constant weight as they took the `mm` (runtime/prepack.py). The weight is transposed once, at import,
into a new constant ([n, k], the layout linear reads contiguously).

Taken for floating-point x of rank 3 or more by a constant 2-d weight of the same dtype; a rank-2 x is
already a plain `mm`, and other operands keep the general lowering.
"""

from __future__ import annotations

import numpy as np

from autofusion.frontend.onnx.context import OnnxCtx, Val, array_type
from autofusion.frontend.torch.context import TV


def weight_linear(ctx: OnnxCtx, x: TV, y: TV) -> TV | None:
    """x @ w as `linear(x, w.T)` when w (input 1) is a 2-d initializer (module doc); None otherwise."""
    w = ctx.const(1)
    if w is None or y.rank != 2 or x.rank < 3 or not x.dtype.is_float or y.dtype is not x.dtype:
        return None
    if not all(isinstance(s, int) for s in x.shape) or x.shape[-1] != y.shape[0]:
        return None
    wt = np.ascontiguousarray(np.asarray(w).T)
    weight = ctx.materialise(Val(array_type(wt), const=wt), f"{ctx.name}_weight_t")
    return ctx.add("linear", (x, weight), {"has_bias": False})
