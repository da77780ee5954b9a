"""Decompose composite ops into the primitives fused kernels are generated from.

In: a graph. Out: the same computation where softmax, log_softmax, layer_norm, rms_norm, batch_norm,
mean and var are spelled out as reductions (sum, amax) and elementwise ops. The fusion planner then
rebuilds them as single kernels, and can also fuse what surrounds them (a prologue feeding the
reduction, an epilogue after it).

Numerics follow torch's kernels: softmax subtracts the row max; variance is two-pass (mean first,
then the mean of squared deviations), which is as accurate as torch's Welford in fp32 for the row
lengths we meet. Anchors (matmul, conv, sdpa) and externs are left alone.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from autofusion.ir.graph import Graph, Node
from autofusion.passes.rebuild import Emitter, rebuild


def _trailing(rank: int, n: int) -> tuple[int, ...]:
    return tuple(range(rank - n, rank))


def _reduce(e: Emitter, op: str, x: int, dims: tuple[int, ...], keepdim: bool = True) -> int:
    return e(op, [x], {"dims": dims, "keepdim": keepdim})


def _count(e: Emitter, x: int, dims: tuple[int, ...]) -> int:
    shape = e.type_of(x).shape
    return math.prod(shape[d] for d in (dims or range(len(shape))))


def _mean(e: Emitter, x: int, dims: tuple[int, ...], keepdim: bool) -> int:
    t = e.type_of(x)
    n = _count(e, x, dims)
    s = _reduce(e, "sum", x, dims, keepdim)
    return e("mul", [s, e.scalar(1.0 / n if n else math.nan, t.dtype)])


def _var(e: Emitter, x: int, dims: tuple[int, ...], correction: float, keepdim: bool) -> int:
    t = e.type_of(x)
    n = _count(e, x, dims)
    mu = _mean(e, x, dims, True)
    d = e("sub", [x, mu])
    ss = _reduce(e, "sum", e("mul", [d, d]), dims, keepdim)
    denom = n - correction
    return e("mul", [ss, e.scalar(1.0 / denom if denom > 0 else math.inf if n else math.nan, t.dtype)])


def _softmax(e: Emitter, node: Node, ins: list[int]) -> Sequence[int]:
    (x,) = ins
    dim = (node.attr("dim"),)
    m = _reduce(e, "amax", x, dim)
    shifted = e("sub", [x, m])
    ex = e("exp", [shifted])
    s = _reduce(e, "sum", ex, dim)
    if node.op == "softmax":
        return (e("div", [ex, s]),)
    return (e("sub", [shifted, e("log", [s])]),)


def _layer_norm(e: Emitter, node: Node, ins: list[int]) -> Sequence[int]:
    x = ins[0]
    t = e.type_of(x)
    dims = _trailing(t.rank, node.attr("normalized_ndim"))
    eps = e.scalar(node.attr("eps"), t.dtype)
    if node.op == "layer_norm":
        mu = _mean(e, x, dims, True)
        centred = e("sub", [x, mu])
        var = _mean(e, e("mul", [centred, centred]), dims, True)
        out = e("mul", [centred, e("rsqrt", [e("add", [var, eps])])])
    else:  # rms_norm
        ms = _mean(e, e("mul", [x, x]), dims, True)
        out = e("mul", [x, e("rsqrt", [e("add", [ms, eps])])])
    params = iter(ins[1:])
    if node.attr("has_weight"):
        out = e("mul", [out, next(params)])
    if node.attr("has_bias", False):
        out = e("add", [out, next(params)])
    return (out,)


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
    return (_mean(e, ins[0], tuple(node.attr("dims")), node.attr("keepdim")),)


def _var_node(e: Emitter, node: Node, ins: list[int]) -> Sequence[int]:
    return (_var(e, ins[0], tuple(node.attr("dims")), node.attr("correction"), node.attr("keepdim")),)


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
        # Integer and half inputs to mean/var keep their composite form only when not float; the
        # catalogue already requires float inputs for these ops.
        return rule(e, node, ins) if rule else None

    return rebuild(graph, rewrite, origin)
