"""A 1x1 Conv on a 1x1 input -> a small matrix-vector product the fusion compiler generates.

Squeeze-and-excitation blocks (EfficientNet, MobileNetV3, RegNet) run two such convolutions per block on
the globally pooled [N, C, 1, 1] map: a few thousand multiply-adds each. As a library convolution each
costs a oneDNN call (~40-50 us under load on the 2-core development VM, against ~5 us for
onnxruntime's), so EfficientNet-B0's 32 of them were ~1.5 ms of a ~13 ms profile. Written as
`sum(x[n, 1, c] * w[1, k, c], c) + b[k]`, the product is a reduction the generated kernels fuse with
their neighbours (the activation after it, the bias), with no library call at all.

Taken only where it is cheap in generated code: a static 1x1 input, a kernel of ones, no padding, one
group, floating point, and at most MAX_MACS multiply-adds (a large 1x1 "classifier" convolution on a
pooled map stays a library GEMM, which is faster there).
"""

from __future__ import annotations

from autofusion.frontend.onnx.context import OnnxCtx
from autofusion.frontend.torch.context import TV
from autofusion.ir.dtypes import DType

MAX_MACS = 1 << 17  # EfficientNet-B0's largest SE convolution: 1152 x 48 = 55,296
DTYPES = (DType.float32,)  # fp16/bf16 keep the library route: its accumulation is the reference there


def pointwise_matvec(
    ctx: OnnxCtx, x: TV, w: TV, b: TV | None, lo: list[int], hi: list[int], groups: int
) -> TV | None:
    """conv(x, w, b) as a reduction when it is a 1x1 convolution of a 1x1 map (module doc); None to
    convert it as a convolution. Strides and dilations do not matter on a 1x1 map without padding."""
    spatial = x.shape[2:]
    if groups != 1 or any(lo) or any(hi) or x.dtype not in DTYPES or w.dtype is not x.dtype:
        return None
    if not all(isinstance(s, int) and s == 1 for s in spatial) or any(s != 1 for s in w.shape[2:]):
        return None
    n, c = x.shape[0], x.shape[1]
    k = w.shape[0]
    if not isinstance(n, int) or w.shape[1] != c or n * k * c > MAX_MACS:
        return None
    if b is not None and b.dtype is not x.dtype:
        return None
    rows = ctx.reshape(x, (n, 1, c))
    weight = ctx.reshape(w, (1, k, c))
    y = ctx.add("sum", (ctx.add("mul", (rows, weight)),), {"dims": (2,), "keepdim": False})
    if b is not None:
        y = ctx.add("add", (y, b))
    return ctx.reshape(y, (n, k) + (1,) * len(spatial))
