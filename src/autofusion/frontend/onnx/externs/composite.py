"""Extern targets that are Python functions: ONNX ops that need more than one ATen call.

An extern node names its target as a string; `ir.interpret.resolve_target` looks a name up in
`PY_TARGETS` before `torch.ops`, so a function registered here under `autofusion_onnx.<name>.default`
runs wherever externs run (the reference interpreter, the compiled plan's executor). Each function
takes tensors and literals only, as the extern's argument template gives them, and must also run on
meta tensors: the frontend types every extern by calling it on meta inputs, and that call is the
op's shape function (it computes the output shape from the input shapes and literals alone).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import torch

from autofusion.frontend.subgraph import register_target

NAMESPACE = "autofusion_onnx"
F = TypeVar("F", bound=Callable[..., Any])


def target(name: str) -> str:
    """The extern target string of composite `name`."""
    return f"{NAMESPACE}.{name}.default"


def composite(name: str) -> Callable[[F], F]:
    """Registers `fn` as the extern target `target(name)`."""

    def deco(fn: F) -> F:
        register_target(target(name), fn)
        return fn

    return deco


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The type a composite does its arithmetic in: fp32 for half types (as onnxruntime's CPU kernels
    compute them), the input's own otherwise."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype
