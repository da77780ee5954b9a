"""Decompose composite ops into the primitives fused kernels are generated from.

In: a graph. Out: the same computation where softmax, log_softmax, layer_norm, rms_norm, batch_norm,
mean and var are spelled out as reductions (sum, amax) and elementwise ops. The fusion planner then
rebuilds them as single kernels, and can also fuse what surrounds them (a prologue feeding the
reduction, an epilogue after it).

Numerics follow torch's kernels:
- Half types (fp16, bf16) compute in fp32: a composite of a half input casts it (and its weights) to
  fp32, is decomposed in fp32 and rounds once, at its output, as torch's CPU kernels do. So its
  intermediate sums are fp32 values, and stay fp32 when they cross a kernel boundary; a sum of
  2000 x 50.0 in fp16 is 100000 there, not inf.
- Softmax subtracts the row max.
- Variance is two-pass around an accurate mean: the row is shifted by its first element x0 first,
  mean - x0 = sum(x - x0) / n, and x - mean is (x - x0) - (mean - x0). A constant row then has
  x - mean exactly 0 and variance exactly 0 (torch's Welford gives the same), where sum(x) / n
  carries the sum's rounding error into every x - mean (layer_norm amplifies it by 1/sqrt(eps)).
  A row containing inf or NaN gives NaN either way, as torch's variance does.
Anchors (matmul, conv, sdpa) and externs are left alone.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from autofusion.ir.dtypes import DType
from autofusion.ir.graph import Graph, Node
from autofusion.passes.rebuild import Emitter, rebuild


def _trailing(rank: int, n: int) -> tuple[int, ...]:
    return tuple(range(rank - n, rank))


def _reduce(e: Emitter, op: str, x: int, dims: tuple[int, ...], keepdim: bool = True) -> int:
    return e(op, [x], {"dims": dims, "keepdim": keepdim})


def _count(e: Emitter, x: int, dims: tuple[int, ...]) -> int:
    shape = e.type_of(x).shape
    return math.prod(shape[d] for d in (dims or range(len(shape))))


def _compute_dtype(dtype: DType) -> DType:
    """The dtype a composite computes in: fp32 for half types (the one place this policy is written)."""
    return DType.float32 if dtype.is_half else dtype


def _to(e: Emitter, x: int, dtype: DType) -> int:
    return x if e.type_of(x).dtype is dtype else e("cast", [x], {"dtype": dtype})


def _upcast(e: Emitter, x: int) -> int:
    return _to(e, x, _compute_dtype(e.type_of(x).dtype))


def _mean(e: Emitter, x: int, dims: tuple[int, ...], keepdim: bool) -> int:
    t = e.type_of(x)
    n = _count(e, x, dims)
    s = _reduce(e, "sum", x, dims, keepdim)
    return e("div", [s, e.scalar(float(n), t.dtype)])  # a division, as eager: sum * (1/n) rounds twice


def _pivot(e: Emitter, x: int, dims: tuple[int, ...]) -> int:
    """The first element of each row of `x` over `dims`, kept as size-1 dims (broadcasts against x)."""
    for d in dims or range(e.type_of(x).rank):
        x = e("slice", [x], {"dim": d, "start": 0, "end": 1, "step": 1})
    return x


def _centred(e: Emitter, x: int, dims: tuple[int, ...]) -> int:
    """x - mean(x) over `dims`, with the mean taken around the row's first element (module docstring)."""
    if _count(e, x, dims) == 0 or e.type_of(x).rank == 0:
        return e("sub", [x, _mean(e, x, dims, True)])
    shifted = e("sub", [x, _pivot(e, x, dims)])
    return e("sub", [shifted, _mean(e, shifted, dims, True)])


def _var(e: Emitter, x: int, dims: tuple[int, ...], correction: float, keepdim: bool) -> int:
    t = e.type_of(x)
    n = _count(e, x, dims)
    d = _centred(e, x, dims)
    ss = _reduce(e, "sum", e("mul", [d, d]), dims, keepdim)
    denom = n - correction
    # eager divides by max(0, n - correction): 0/0 is NaN and ss/0 is inf, as there
    return e("div", [ss, e.scalar(float(max(denom, 0)), t.dtype)])


def _softmax(e: Emitter, node: Node, ins: list[int]) -> Sequence[int]:
    x = _upcast(e, ins[0])
    dim = (node.attr("dim"),)
    m = _reduce(e, "amax", x, dim)
    shifted = e("sub", [x, m])
    ex = e("exp", [shifted])
    s = _reduce(e, "sum", ex, dim)
    if node.op == "softmax":
        return (_to(e, e("div", [ex, s]), node.out.type.dtype),)
    return (_to(e, e("sub", [shifted, e("log", [s])]), node.out.type.dtype),)


def _layer_norm(e: Emitter, node: Node, ins: list[int]) -> Sequence[int]:
    x = _upcast(e, ins[0])
    t = e.type_of(x)
    dims = _trailing(t.rank, node.attr("normalized_ndim"))
    eps = e.scalar(node.attr("eps"), t.dtype)
    if node.op == "layer_norm":
        centred = _centred(e, x, dims)
        var = _mean(e, e("mul", [centred, centred]), dims, True)
        out = e("mul", [centred, e("rsqrt", [e("add", [var, eps])])])
    else:  # rms_norm
        ms = _mean(e, e("mul", [x, x]), dims, True)
        out = e("mul", [x, e("rsqrt", [e("add", [ms, eps])])])
    params = iter(ins[1:])
    if node.attr("has_weight"):
        out = e("mul", [out, _upcast(e, next(params))])
    if node.attr("has_bias", False):
        out = e("add", [out, _upcast(e, next(params))])
    return (_to(e, out, node.out.type.dtype),)


def _batch_norm(e: Emitter, node: Node, ins: list[int]) -> Sequence[int]:
    x, mean, var = ins[:3]
    t = e.type_of(x)
    channel_shape = (t.shape[1],) + (1,) * (t.rank - 2)

    def per_channel(v: int) -> int:
        return e("reshape", [v], {"shape": channel_shape})

    eps = e.scalar(node.attr("eps"), t.dtype)
    inv = e("rsqrt", [e("add", [per_channel(var), eps])])
    out = e("mul", [e("sub", [x, per_channel(mean)]), inv])
    params = iter(ins[3:])
    if node.attr("has_weight"):
        out = e("mul", [out, per_channel(next(params))])
    if node.attr("has_bias"):
        out = e("add", [out, per_channel(next(params))])
    return (out,)


def _mean_node(e: Emitter, node: Node, ins: list[int]) -> Sequence[int]:
    out = _mean(e, _upcast(e, ins[0]), tuple(node.attr("dims")), node.attr("keepdim"))
    return (_to(e, out, node.out.type.dtype),)


def _var_node(e: Emitter, node: Node, ins: list[int]) -> Sequence[int]:
    out = _var(e, _upcast(e, ins[0]), tuple(node.attr("dims")), node.attr("correction"), node.attr("keepdim"))
    return (_to(e, out, node.out.type.dtype),)


RULES: dict[str, Callable[[Emitter, Node, list[int]], Sequence[int]]] = {
    "softmax": _softmax,
    "log_softmax": _softmax,
    "layer_norm": _layer_norm,
    "rms_norm": _layer_norm,
    "batch_norm": _batch_norm,
    "mean": _mean_node,
    "var": _var_node,
}


def decompose(
    graph: Graph, origin: list[int] | None = None, keep: Callable[[Node], bool] | None = None
) -> Graph:
    """`origin` (optional) receives, per new node, the index of the node it was decomposed from;
    nodes for which `keep` is true stay composite (a blacklisted softmax runs as one torch call)."""

    def rewrite(e: Emitter, node: Node, ins: list[int]) -> Sequence[int] | None:
        rule = None if keep is not None and keep(node) else RULES.get(node.op)
        return rule(e, node, ins) if rule else None

    return rebuild(graph, rewrite, origin)
