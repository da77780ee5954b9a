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
- Mean and variance are taken around a first estimate of the mean, so that a constant row gives
  exactly its value and variance exactly 0 (torch's Welford does too; sum(x) / n carries the sum's
  rounding error into every x - mean, which layer_norm amplifies by 1/sqrt(eps)), and so that an
  element near the mean keeps a small absolute error. The estimate is m0 = x0 + sum(x - x0) / n
  around the row's first element x0 (exact for a constant row; its error is an ulp of the row's
  spread); then with d = x - m0, mean = m0 + sum(d) / n and the sum of squares around the mean is
  sum(d^2) - sum(d)^2 / n (the corrected two-pass form; sum(d) is tiny, so this loses nothing). A
  row containing inf or NaN gives NaN, as torch's variance does.
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


def _reduced_shape(e: Emitter, x: int, dims: tuple[int, ...]) -> list[int]:
    shape = e.type_of(x).shape
    gone = {d % len(shape) for d in dims} if dims else set(range(len(shape)))
    return [s for k, s in enumerate(shape) if k not in gone]


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


def _moments(e: Emitter, x: int, dims: tuple[int, ...]) -> tuple[int, int, int]:
    """(mean, sum of squares around the mean, n) over `dims`, kept as size-1 dims (module docstring)."""
    n = _count(e, x, dims)
    if n == 0 or e.type_of(x).rank == 0:
        mean = _mean(e, x, dims, True)
        d = e("sub", [x, mean])
        return mean, _reduce(e, "sum", e("mul", [d, d]), dims), n
    x0 = _pivot(e, x, dims)
    m0 = e("add", [x0, _mean(e, e("sub", [x, x0]), dims, True)])
    d = e("sub", [x, m0])
    sd = _reduce(e, "sum", d, dims)
    mean = e("add", [m0, e("div", [sd, e.scalar(float(n), e.type_of(x).dtype)])])
    sd2 = _reduce(e, "sum", e("mul", [d, d]), dims)
    correction = e("div", [e("mul", [sd, sd]), e.scalar(float(n), e.type_of(x).dtype)])
    # rounding can take it a hair below 0 where the variance is ~0; maximum keeps NaN
    ss = e("maximum", [e("sub", [sd2, correction]), e.scalar(0.0, e.type_of(x).dtype)])
    return mean, ss, n


def _var(e: Emitter, x: int, dims: tuple[int, ...], correction: float, keepdim: bool) -> int:
    _, ss, n = _moments(e, x, dims)
    # eager divides by max(0, n - correction): 0/0 is NaN and ss/0 is inf, as there
    out = e("div", [ss, e.scalar(float(max(n - correction, 0)), e.type_of(x).dtype)])
    return out if keepdim else e("reshape", [out], {"shape": _reduced_shape(e, x, dims)})


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
        mean, ss, n = _moments(e, x, dims)
        var = e("div", [ss, e.scalar(float(n), t.dtype)])
        out = e("mul", [e("sub", [x, mean]), e("rsqrt", [e("add", [var, eps])])])
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
