"""ONNX ScatterND, ScatterElements (and opset-9 Scatter), GatherND and TensorScatter as torch externs.

Indices are read at run time (they are data); negative ones count from the end, as ONNX says.
Reductions map to torch's: add -> sum, mul -> prod, max -> amax, min -> amin, always including the
value already in the output (ONNX applies each update to it). Duplicate indices with reduction none
are undefined in ONNX; torch then keeps one of the updates.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from autofusion.frontend.onnx.context import OnnxCtx, norm_axis, unsupported
from autofusion.frontend.onnx.externs.composite import composite, target
from autofusion.frontend.onnx.fallback import ArgFn, fallback

_REDUCE = {"add": "sum", "mul": "prod", "max": "amax", "min": "amin"}


def _reduction(ctx: OnnxCtx) -> str:
    r = ctx.attr("reduction", "none")
    if r != "none" and r not in _REDUCE:
        raise unsupported(f"reduction {r!r}")
    return r


def _flat_rows(idx: torch.Tensor, dims: tuple[int, ...]) -> torch.Tensor:
    """Index tuples idx [..., m] into the leading dims `dims` (len m) -> row numbers [...]."""
    idx = idx.to(torch.int64)
    flat = torch.zeros(idx.shape[:-1], dtype=torch.int64, device=idx.device)
    for d, size in enumerate(dims):
        i = idx[..., d]
        flat = flat * size + torch.where(i < 0, i + size, i)
    return flat


@composite("scatter_nd")
def scatter_nd(
    data: torch.Tensor, indices: torch.Tensor, updates: torch.Tensor, reduction: str
) -> torch.Tensor:
    m = indices.shape[-1]
    lead = tuple(data.shape[:m])
    rows = _flat_rows(indices, lead).reshape(-1)
    out = data.reshape(math.prod(lead), *data.shape[m:]).clone()
    upd = updates.reshape(rows.shape[0], *data.shape[m:]).to(data.dtype)
    if reduction == "none":
        out[rows] = upd
    else:
        where = rows.reshape(-1, *([1] * (upd.dim() - 1))).expand(upd.shape)
        out.scatter_reduce_(0, where, upd, _REDUCE[reduction], include_self=True)
    return out.reshape(data.shape)


@fallback("ScatterND")
def _scatter_nd(ctx: OnnxCtx, arg: ArgFn) -> tuple[str, tuple[Any, ...], dict[str, Any]]:
    m = ctx.type(1).shape[-1] if ctx.type(1).rank else 0
    if not 1 <= m <= ctx.type(0).rank:
        raise unsupported(f"ScatterND with index tuples of length {m}")
    return target("scatter_nd"), (arg(0), arg(1), arg(2), _reduction(ctx)), {}


@composite("scatter_elements")
def scatter_elements(
    data: torch.Tensor, indices: torch.Tensor, updates: torch.Tensor, axis: int, reduction: str
) -> torch.Tensor:
    idx = indices.to(torch.int64)
    idx = torch.where(idx < 0, idx + data.shape[axis], idx)
    upd = updates.to(data.dtype)
    if reduction == "none":
        return torch.scatter(data, axis, idx, upd)
    return torch.scatter_reduce(data, axis, idx, upd, _REDUCE[reduction], include_self=True)


@fallback("ScatterElements", "Scatter")
def _scatter_elements(ctx: OnnxCtx, arg: ArgFn) -> tuple[str, tuple[Any, ...], dict[str, Any]]:
    axis = norm_axis(int(ctx.attr("axis", 0)), ctx.type(0).rank)
    return target("scatter_elements"), (arg(0), arg(1), arg(2), axis, _reduction(ctx)), {}


@composite("gather_nd")
def gather_nd(data: torch.Tensor, indices: torch.Tensor, batch_dims: int) -> torch.Tensor:
    b = batch_dims
    m = indices.shape[-1]
    batch = tuple(data.shape[:b])
    nb = math.prod(batch)
    lead = tuple(data.shape[b : b + m])
    rest = tuple(data.shape[b + m :])
    src = data.reshape(nb, math.prod(lead), *rest)
    rows = _flat_rows(indices.reshape(nb, -1, m), lead)  # [nb, k]
    picked = src[torch.arange(nb, device=data.device).reshape(nb, 1), rows]  # [nb, k, *rest]
    return picked.reshape(*indices.shape[:-1], *rest)


@fallback("GatherND")
def _gather_nd(ctx: OnnxCtx, arg: ArgFn) -> tuple[str, tuple[Any, ...], dict[str, Any]]:
    b = int(ctx.attr("batch_dims", 0))
    idx, data = ctx.type(1), ctx.type(0)
    if idx.rank < 1 or not 1 <= idx.shape[-1] <= data.rank - b or idx.shape[:b] != data.shape[:b]:
        raise unsupported(f"GatherND of {data} by {idx} with batch_dims {b}")
    return target("gather_nd"), (arg(0), arg(1), b), {}


@composite("tensor_scatter")
def tensor_scatter(
    cache: torch.Tensor, update: torch.Tensor, write: torch.Tensor | None, axis: int, circular: bool
) -> torch.Tensor:
    """Writes update into cache along `axis` from position write[batch] on (modulo the axis length in
    circular mode), for every batch entry (dim 0)."""
    n, seq = cache.shape[axis], update.shape[axis]
    batch = cache.shape[0]
    start = (
        torch.zeros(batch, dtype=torch.int64, device=cache.device) if write is None else write.to(torch.int64)
    )
    pos = start.reshape(batch, 1) + torch.arange(seq, device=cache.device).reshape(1, seq)  # [batch, seq]
    if circular:
        pos = pos % n
    shape = [1] * cache.dim()
    shape[0], shape[axis] = batch, seq
    idx = pos.reshape(shape).expand(update.shape)
    return torch.scatter(cache, axis, idx, update.to(cache.dtype))


@fallback("TensorScatter")
def _tensor_scatter(ctx: OnnxCtx, arg: ArgFn) -> tuple[str, tuple[Any, ...], dict[str, Any]]:
    cache = ctx.type(0)
    axis = norm_axis(int(ctx.attr("axis", -2)), cache.rank)
    if axis == 0:
        raise unsupported("TensorScatter along the batch axis")
    mode = ctx.attr("mode", "linear")
    if mode not in ("linear", "circular"):
        raise unsupported(f"TensorScatter mode {mode!r}")
    write = arg(2) if ctx.has(2) else None
    return target("tensor_scatter"), (arg(0), arg(1), write, axis, mode == "circular"), {}
