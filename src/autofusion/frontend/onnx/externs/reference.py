"""The last resort for an ONNX op with neither a converter nor a torch implementation: onnx's own
reference implementation (`onnx.reference`, numpy), run as an extern on the host.

Taken only where ONNX shape inference gives every output a static tensor type (the plan needs the
types; ops whose output shape depends on the values, such as NonMaxSuppression or Unique, stay a clear
error) and every input is a tensor. The node is carried serialized in the extern's literal arguments,
with the model's opset imports, so the plan holds all it needs; the evaluator is built once per node.
It is slow (numpy, one thread) and logged as every fallback is, with this reason; it makes the rest of
the model fuse and run instead of refusing it.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import onnx
import torch
from onnx.reference import ReferenceEvaluator

from autofusion.frontend.onnx.context import OnnxCtx, numpy_dtype, unsupported
from autofusion.frontend.onnx.externs.composite import composite, target
from autofusion.frontend.onnx.fallback import ArgFn
from autofusion.ir.dtypes import DType

NAME = "onnx_reference"
REASON = "runs on onnx's reference implementation (numpy, on the host)"


@functools.lru_cache(maxsize=256)
def _evaluator(node: bytes, opsets: tuple[tuple[str, int], ...]) -> ReferenceEvaluator:
    return ReferenceEvaluator(onnx.NodeProto.FromString(node), opsets=dict(opsets))


@composite(NAME)
def run_reference(
    node: bytes,
    opsets: tuple[tuple[str, int], ...],
    names: tuple[str, ...],
    out_types: tuple[tuple[tuple[int, ...], str], ...],
    *inputs: torch.Tensor,
) -> tuple[torch.Tensor, ...]:
    """The node's outputs for `inputs` (the node's present inputs, named `names`); on meta inputs, empty
    tensors of the types shape inference gave (the extern's shape function)."""
    if any(x.device.type == "meta" for x in inputs):
        return tuple(torch.empty(s, dtype=DType(d).to_torch(), device="meta") for s, d in out_types)
    feeds = {n: x.detach().contiguous().numpy() for n, x in zip(names, inputs, strict=True)}
    outs = _evaluator(node, opsets).run(None, feeds)
    result = []
    op = onnx.NodeProto.FromString(node).op_type
    for o, (shape, d) in zip(outs, out_types, strict=False):
        arr = np.asarray(o, dtype=numpy_dtype(DType(d)))
        if tuple(arr.shape) != tuple(shape):  # an op whose output size depends on the values
            raise RuntimeError(
                f"ONNX {op} gave an output of shape {list(arr.shape)}, where the model declares "
                f"{list(shape)} (the plan was made for that shape)"
            )
        result.append(torch.from_numpy(np.ascontiguousarray(arr)))
    return tuple(result)


def reference_spec(model: onnx.ModelProto) -> Any:
    """The fallback spec (as `fallback.FALLBACKS` holds) that runs a node of `model` on onnx.reference."""
    opsets = tuple(sorted((imp.domain, int(imp.version)) for imp in model.opset_import))

    def spec(ctx: OnnxCtx, arg: ArgFn) -> tuple[str, tuple[Any, ...], dict[str, Any]]:
        outs = [o for o in ctx.node.output]
        while outs and not outs[-1]:
            outs.pop()
        types = [ctx.out_type(k) for k in range(len(outs))]
        if not outs or any(t is None for t in types):
            raise unsupported("an output's shape is not known before it runs (it depends on the values)")
        present = [i for i, n in enumerate(ctx.node.input) if n]
        if any(not ctx.has(i) for i in present):
            raise unsupported("an input is not a tensor")
        names = tuple(ctx.node.input[i] for i in present)
        out_types = tuple((t.shape, t.dtype.value) for t in types if t is not None)
        node = ctx.node.SerializeToString()
        return target(NAME), (node, opsets, names, out_types, *(arg(i) for i in present)), {}

    return spec
