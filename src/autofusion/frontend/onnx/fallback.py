"""Torch implementations of ONNX ops the converters do not lower: how each runs as an `extern` ATen call.

Each entry maps an ONNX op type to a function `(ctx, arg) -> (target, args, kwargs)`: `target` is an
ATen overload ("aten.max_pool2d.default"), `args`/`kwargs` a literal template in which `arg(i)` marks
ONNX input i (the runtime passes the tensor there). Attributes and inputs known at import become
literals. An entry raises `UnsupportedOpError` for a variant it cannot express; the driver then names
the node in a `FrontendError`. The externs that need more than one ATen call (a composite) or more code
than a template live in `externs/`, one module per family (pooling, Resize, sampling, indexing...).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from autofusion.frontend.onnx.context import OnnxCtx, norm_axis, unsupported
from autofusion.frontend.onnx.externs_math import MATH_FALLBACKS
from autofusion.ir.graph import Arg

ArgFn = Callable[[int], Arg]
Fallback = Callable[[OnnxCtx, ArgFn], tuple[str, tuple[Any, ...], dict[str, Any]]]
FALLBACKS: dict[str, Fallback] = {}


def fallback(*names: str) -> Callable[[Fallback], Fallback]:
    def deco(fn: Fallback) -> Fallback:
        for n in names:
            FALLBACKS[n] = fn
        return fn

    return deco


@fallback("Einsum")
def _einsum(ctx: OnnxCtx, arg: ArgFn) -> tuple[str, tuple[Any, ...], dict[str, Any]]:
    return "aten.einsum.default", (ctx.attr("equation"), tuple(arg(i) for i in range(ctx.n_inputs))), {}


@fallback("Tile")
def _tile(ctx: OnnxCtx, arg: ArgFn) -> tuple[str, tuple[Any, ...], dict[str, Any]]:
    repeats = ctx.ints(1, "repeats")
    assert repeats is not None
    return "aten.repeat.default", (arg(0), tuple(repeats)), {}


@fallback("InstanceNormalization")
def _instance_norm(ctx: OnnxCtx, arg: ArgFn) -> tuple[str, tuple[Any, ...], dict[str, Any]]:
    eps = float(ctx.attr("epsilon", 1e-5))
    return "aten.instance_norm.default", (arg(0), arg(1), arg(2), None, None, True, 0.0, eps, False), {}


@fallback("Pad")
def _pad(ctx: OnnxCtx, arg: ArgFn) -> tuple[str, tuple[Any, ...], dict[str, Any]]:
    mode = {"constant": "constant", "reflect": "reflect", "edge": "replicate", "wrap": "circular"}.get(
        ctx.attr("mode", "constant")
    )
    if mode is None:
        raise unsupported(f"Pad mode {ctx.attr('mode')!r}")
    rank = ctx.type(0).rank
    pads = ctx.ints(1, "pads")
    assert pads is not None
    axes = [norm_axis(a, rank) for a in (ctx.ints(3, "axes") or range(rank))]
    lo, hi = [0] * rank, [0] * rank
    for k, d in enumerate(axes):
        lo[d], hi[d] = pads[k], pads[k + len(axes)]
    aten: list[int] = []
    for d in reversed(range(rank)):
        aten += [lo[d], hi[d]]
    # torch pads only the trailing dims it is told about: drop untouched leading ones.
    while len(aten) > 2 and aten[-2:] == [0, 0]:
        aten = aten[:-2]
    return "aten.pad.default", (arg(0), tuple(aten), mode), {}


# Externs of math and bit ops (BitShift, BitCast, CumSum/CumProd, Det) live in their own module.
FALLBACKS.update(MATH_FALLBACKS)
