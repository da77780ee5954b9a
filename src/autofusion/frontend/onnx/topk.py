"""ONNX TopK as torch runs it: a stable sort, so equal values keep their index order.

ONNX says that of equal elements the one with the lower index comes first (largest and smallest
alike); torch.topk does not order ties. A stable sort along the axis, cut to k, does: an extern
target registered here (a torch.library op for typing on meta tensors, and its Python function for
the interpreter, as `frontend/torch/mutation.py` does).
"""

from __future__ import annotations

import torch

from autofusion.ir.interpret import PY_TARGETS

TARGET = "autofusion_onnx_topk.topk.default"


def stable_topk(x: torch.Tensor, k: int, dim: int, largest: bool) -> tuple[torch.Tensor, torch.Tensor]:
    values, indices = torch.sort(x, dim=dim, descending=largest, stable=True)
    return values.narrow(dim, 0, k).contiguous(), indices.narrow(dim, 0, k).contiguous()


_LIB = torch.library.Library("autofusion_onnx_topk", "DEF")
_LIB.define("topk(Tensor x, int k, int dim, bool largest) -> (Tensor, Tensor)")
_LIB.impl("topk", stable_topk, "CompositeExplicitAutograd")
PY_TARGETS[TARGET] = stable_topk
