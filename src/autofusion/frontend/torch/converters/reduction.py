"""Converters for reductions and the composite normalisations kept whole (softmax, layer_norm...).

ATen reductions accumulate ints and bools in int64 and take an optional `dtype`; the IR reduces in its
input dtype, so the input is cast to the output dtype first.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from autofusion.frontend.torch.context import TV, ConvCtx, converts, norm_dims, unsupported
from autofusion.ir.dtypes import DType


def _reduce(ctx: ConvCtx, op: str, x: TV, dims: Any, keepdim: bool, **attrs: Any) -> TV:
    out = ctx.out_dtype
    src = x if op in ("any", "all") else ctx.cast(x, out)
    return ctx.add(op, (src,), {"dims": norm_dims(dims, x.rank), "keepdim": bool(keepdim), **attrs})


def _register(aten: str, op: str) -> None:
    converts(aten)(lambda ctx, a: _reduce(ctx, op, a["self"], a.get("dim"), a.get("keepdim", False)))


for _n in ("sum", "mean", "amax", "amin", "any", "all", "nansum"):
    if _n != "nansum":
        _register(_n, _n)


@converts("prod")
def _prod(ctx: ConvCtx, a: dict[str, Any]) -> TV:
    return _reduce(ctx, "prod", a["self"], a.get("dim"), a.get("keepdim", False))


def _correction(a: dict[str, Any]) -> float:
    if a.get("correction") is not None:
        return float(a["correction"])
    return 1.0 if a.get("unbiased", True) else 0.0


@converts("var")
def _var(ctx: ConvCtx, a: dict[str, Any]) -> TV:
    return _reduce(ctx, "var", a["self"], a.get("dim"), a.get("keepdim", False), correction=_correction(a))


@converts("std")
def _std(ctx: ConvCtx, a: dict[str, Any]) -> TV:
    return ctx.add("sqrt", (_var(ctx, a),))


@converts("var_mean", "std_mean")
def _var_mean(ctx: ConvCtx, a: dict[str, Any]) -> tuple[TV, TV]:
    x, dims, keep = a["self"], a.get("dim"), a.get("keepdim", False)
    var = _reduce(ctx, "var", x, dims, keep, correction=_correction(a))
    if ctx.overload_packet == "std_mean":
        var = ctx.add("sqrt", (var,))
    return var, _reduce(ctx, "mean", x, dims, keep)


@converts("argmax", "argmin")
def _argreduce(ctx: ConvCtx, a: dict[str, Any]) -> TV:
    x = a["self"]
    dim = a.get("dim")
    return ctx.add(ctx.overload_packet, (x,), {"dim": None if dim is None else dim % max(x.rank, 1),
                                               "keepdim": bool(a.get("keepdim", False))})  # fmt: skip


def max_min_reduce(ctx: ConvCtx, a: dict[str, Any]) -> Any:
    """max()/min() over everything, or max.dim/min.dim returning (values, indices)."""
    x = a["self"]
    op = "amax" if ctx.overload_packet == "max" else "amin"
    if "dim" not in a:
        return ctx.add(op, (x,), {"dims": tuple(range(x.rank)), "keepdim": False})
    keep = bool(a.get("keepdim", False))
    dim = a["dim"] % max(x.rank, 1)
    values = ctx.add(op, (x,), {"dims": (dim,), "keepdim": keep})
    # torch returns the first index on ties, exactly as argmax/argmin do.
    idx = ctx.add("argmax" if op == "amax" else "argmin", (x,), {"dim": dim, "keepdim": keep})
    return values, idx


@converts("softmax", "_softmax", "log_softmax", "_log_softmax", "special_softmax")
def _softmax(ctx: ConvCtx, a: dict[str, Any]) -> TV:
    x = a["self"]
    op = "log_softmax" if "log" in ctx.overload_packet else "softmax"
    out = ctx.out_dtype
    if not out.is_float:
        raise unsupported(f"{op} to non-float {out.short}")
    return ctx.add(op, (ctx.cast(x, out),), {"dim": a["dim"] % max(x.rank, 1)})


def _optional_params(*params: Any) -> tuple[list[TV], list[bool]]:
    present = [p for p in params if p is not None]
    return present, [p is not None for p in params]


@converts("layer_norm", "native_layer_norm")
def _layer_norm(ctx: ConvCtx, a: dict[str, Any]) -> Any:
    x = a["input"]
    nd = len(a["normalized_shape"])
    params, (has_w, has_b) = _optional_params(a.get("weight"), a.get("bias"))
    if any(p.dtype is not x.dtype for p in params):
        raise unsupported("layer_norm with parameters of another dtype than the input")
    out = ctx.add("layer_norm", (x, *params), {"normalized_ndim": nd, "eps": float(a.get("eps", 1e-5)),
                                               "has_weight": has_w, "has_bias": has_b})  # fmt: skip
    # native_layer_norm also returns mean and rstd; they are only converted when unused.
    return (out, None, None) if ctx.overload_packet == "native_layer_norm" else out


@converts("group_norm", "native_group_norm")
def _group_norm(ctx: ConvCtx, a: dict[str, Any]) -> Any:
    """GroupNorm as a layer_norm over each group's (channels / groups) x spatial elements, then the
    per-channel affine, so that the planner fuses it with its neighbours (wav2vec2's GroupNorm + GELU
    becomes one kernel instead of ATen's norm and a separate GELU). Half inputs are normalised in
    float32 and rounded once at the end, as ATen's CPU kernel does."""
    x = a["input"]
    groups = int(a["group"] if ctx.overload_packet == "native_group_norm" else a["num_groups"])
    eps = float(a.get("eps", 1e-5))
    if not x.dtype.is_float or x.rank < 2:
        raise unsupported(f"group_norm of {x.dtype.short}[{x.rank}-d]")
    if not all(isinstance(d, int) for d in x.shape):
        raise unsupported("group_norm over symbolic sizes")
    n, c = x.shape[0], x.shape[1]
    if groups <= 0 or c % groups:
        raise unsupported(f"group_norm of {c} channels in {groups} groups")
    w, b = a.get("weight"), a.get("bias")
    st = DType.float32 if x.dtype.is_half else x.dtype
    rest = math.prod(x.shape[2:])
    grouped = ctx.reshape(ctx.cast(x, st), (n, groups, (c // groups) * rest))
    attrs = {"normalized_ndim": 1, "eps": eps, "has_weight": False, "has_bias": False}
    y = ctx.reshape(ctx.add("layer_norm", (grouped,), attrs), x.shape)
    per_channel = (1, c) + (1,) * (x.rank - 2)
    if w is not None:
        y = ctx.add("mul", (y, ctx.reshape(ctx.cast(w, st), per_channel)))
    if b is not None:
        y = ctx.add("add", (y, ctx.reshape(ctx.cast(b, st), per_channel)))
    y = ctx.cast(y, x.dtype)
    # native_group_norm also returns mean and rstd; they are only converted when unused.
    return (y, None, None) if ctx.overload_packet == "native_group_norm" else y


@converts("rms_norm")
def _rms_norm(ctx: ConvCtx, a: dict[str, Any]) -> TV:
    x = a["input"]
    eps = a.get("eps")
    if eps is None:
        # torch's default is the epsilon of the dtype it computes in: fp32 for half inputs.
        eps = torch.finfo(torch.float32 if x.dtype.is_half else x.dtype.to_torch()).eps
    params, (has_w,) = _optional_params(a.get("weight"))
    attrs = {"normalized_ndim": len(a["normalized_shape"]), "eps": float(eps), "has_weight": has_w}
    return ctx.add("rms_norm", (x, *params), attrs)


@converts("_native_batch_norm_legit_no_training", "batch_norm", "_native_batch_norm_legit")
def _batch_norm(ctx: ConvCtx, a: dict[str, Any]) -> Any:
    if a.get("training", False):
        raise unsupported("batch_norm in training mode updates running statistics; call model.eval()")
    x, mean, var = a["input"], a.get("running_mean"), a.get("running_var")
    if mean is None or var is None:
        raise unsupported("batch_norm without running statistics")
    params, (has_w, has_b) = _optional_params(a.get("weight"), a.get("bias"))
    stats = [ctx.cast(t, x.dtype) for t in (mean, var, *params)]
    out = ctx.add("batch_norm", (x, *stats), {"eps": float(a["eps"]), "has_weight": has_w, "has_bias": has_b})
    return out if ctx.overload_packet == "batch_norm" else (out, None, None)
