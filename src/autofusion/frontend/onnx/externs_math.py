"""Torch implementations of ONNX math and bit ops the IR cannot express: BitShift, BitCast, CumSum,
CumProd, Det.

Entries go to `MATH_FALLBACKS`, which fallback.py merges into `FALLBACKS` (same form): the driver runs
each node as one `extern` call, which keeps the ONNX node for export. Where no single ATen op covers
every variant, the call is a small torch function registered here (namespace autofusion_onnx_math,
also in `PY_TARGETS` so the executor calls it without the dispatcher).

CumSum/CumProd: `reverse` flips the axis on both sides of the scan and `exclusive` shifts the input
one place along it first (the identity, 0 or 1, enters at the front, the last element drops out), so
no value is subtracted or divided back out; integer scans keep their dtype (torch widens to int64).
Det runs torch's linalg_det, in fp32 for half inputs (torch has no half LU).

BitShift is ATen's bitwise_left_shift/bitwise_right_shift, whose CPU kernels already give what ONNX
(opset 28) asks for: an amount that is negative or at least the bit width shifts everything out (0,
or -1 for a right shift of a negative signed value), a signed right shift is arithmetic and a left
shift discards the bits past the sign bit. torch has no shift for uint16/32/64: those run as the
signed type of the same width (the same bits), the right shift made logical by a mask.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from autofusion.frontend.onnx.context import OnnxCtx, dtype_of, norm_axis, unsupported
from autofusion.ir.graph import Arg
from autofusion.ir.interpret import PY_TARGETS

NAMESPACE = "autofusion_onnx_math"
ArgFn = Callable[[int], Arg]
Template = tuple[str, tuple[Any, ...], dict[str, Any]]
Fallback = Callable[[OnnxCtx, ArgFn], Template]
MATH_FALLBACKS: dict[str, Fallback] = {}


def fallback(*names: str) -> Callable[[Fallback], Fallback]:
    def deco(fn: Fallback) -> Fallback:
        for n in names:
            MATH_FALLBACKS[n] = fn
        return fn

    return deco


_SIGNED_TWIN = {torch.uint16: torch.int16, torch.uint32: torch.int32, torch.uint64: torch.int64}


def unsigned_shift(x: torch.Tensor, y: torch.Tensor, left: bool) -> torch.Tensor:
    """x << y or x >> y (logical) for uint16/32/64, computed on the signed twin type's bits."""
    signed = _SIGNED_TWIN[x.dtype]
    bits = x.element_size() * 8
    xs, ys = x.view(signed), y.view(signed)
    out_of_range = (ys < 0) | (ys >= bits)  # a "negative" twin is an amount >= 2**(bits-1)
    amount = ys.clamp(0, bits - 1)
    if left:
        out = torch.bitwise_left_shift(xs, amount)
    else:
        # the arithmetic shift filled `amount` high bits with the sign: clear them
        sign_bit = torch.full((), -(2 ** (bits - 1)), dtype=signed, device=x.device)
        filled = torch.bitwise_left_shift(torch.bitwise_right_shift(sign_bit, amount), 1)
        out = torch.bitwise_and(torch.bitwise_right_shift(xs, amount), torch.bitwise_not(filled))
    out = torch.where(out_of_range, torch.zeros((), dtype=signed, device=x.device), out)
    return out.view(x.dtype)


def cumulative(x: torch.Tensor, dim: int, prod: bool, exclusive: bool, reverse: bool) -> torch.Tensor:
    """ONNX CumSum/CumProd with its exclusive and reverse attributes."""
    twin = _SIGNED_TWIN.get(x.dtype)
    if twin is not None:
        # torch scans no uint16/32/64; sums and products wrap the same on the signed twin's bits
        return cumulative(x.view(twin), dim, prod, exclusive, reverse).view(x.dtype)
    t = x.flip(dim) if reverse else x
    n = t.shape[dim]
    if exclusive and n > 0:
        head = t.narrow(dim, 0, 1)
        ident = torch.ones_like(head) if prod else torch.zeros_like(head)
        t = torch.cat([ident, t.narrow(dim, 0, n - 1)], dim)
    out = torch.cumprod(t, dim, dtype=x.dtype) if prod else torch.cumsum(t, dim, dtype=x.dtype)
    return out.flip(dim) if reverse else out


def half_det(x: torch.Tensor) -> torch.Tensor:
    """det of a half tensor, computed in fp32 and rounded once."""
    return torch.linalg.det(x.float()).to(x.dtype)


_TARGETS: dict[str, tuple[str, Callable[..., torch.Tensor]]] = {
    "unsigned_shift": ("unsigned_shift(Tensor x, Tensor y, bool left) -> Tensor", unsigned_shift),
    "cumulative": (
        "cumulative(Tensor x, int dim, bool prod, bool exclusive, bool reverse) -> Tensor",
        cumulative,
    ),
    "half_det": ("half_det(Tensor x) -> Tensor", half_det),
}


def _register() -> None:
    try:
        lib = torch.library.Library(NAMESPACE, "DEF")
    except RuntimeError:
        return  # registered already in this process
    for name, (schema, fn) in _TARGETS.items():
        PY_TARGETS[f"{NAMESPACE}.{name}.default"] = fn
        lib.define(schema)
        lib.impl(name, fn, "CompositeExplicitAutograd")
    _LIBS.append(lib)  # the registration lives as long as this object


_LIBS: list[Any] = []
_register()


@fallback("BitShift")
def _bit_shift(ctx: OnnxCtx, arg: ArgFn) -> Template:
    direction = ctx.attr("direction")
    if direction not in ("LEFT", "RIGHT"):
        raise unsupported(f"BitShift direction {direction!r}")
    dtype = ctx.type(0).dtype
    if not dtype.is_int or dtype.is_bool:
        raise unsupported(f"BitShift of {dtype.short}")
    if dtype.to_torch() in _SIGNED_TWIN:
        return f"{NAMESPACE}.unsigned_shift.default", (arg(0), arg(1), direction == "LEFT"), {}
    op = "bitwise_left_shift" if direction == "LEFT" else "bitwise_right_shift"
    return f"aten.{op}.Tensor", (arg(0), arg(1)), {}


@fallback("BitCast")
def _bit_cast(ctx: OnnxCtx, arg: ArgFn) -> Template:
    src = ctx.type(0).dtype
    to = dtype_of(int(ctx.attr("to")), f"BitCast target of node {ctx.name!r}")
    if src.itemsize != to.itemsize:
        raise unsupported(f"BitCast from {src.short} to {to.short} (ONNX needs equal bit widths)")
    # view_copy, not view: the extern's output must not alias a buffer the plan may reuse
    return "aten.view_copy.dtype", (arg(0), to.to_torch()), {}


@fallback("CumSum", "CumProd")
def _cumulative(ctx: OnnxCtx, arg: ArgFn) -> Template:
    x = ctx.type(0)
    if x.rank == 0:
        raise unsupported(f"{ctx.node.op_type} of a 0-d tensor")
    axis = ctx.ints(1, "axis")
    if axis is None or len(axis) != 1:
        raise unsupported("axis must be one value")
    d = norm_axis(axis[0], x.rank)
    prod = ctx.node.op_type == "CumProd"
    exclusive, reverse = bool(int(ctx.attr("exclusive", 0))), bool(int(ctx.attr("reverse", 0)))
    if exclusive or reverse or x.dtype.to_torch() in _SIGNED_TWIN:
        return f"{NAMESPACE}.cumulative.default", (arg(0), d, prod, exclusive, reverse), {}
    # dtype keeps integer scans in their type (torch widens them to int64)
    return f"aten.{'cumprod' if prod else 'cumsum'}.default", (arg(0), d), {"dtype": x.dtype.to_torch()}


@fallback("Det")
def _det(ctx: OnnxCtx, arg: ArgFn) -> Template:
    x = ctx.type(0)
    if x.rank < 2 or x.shape[-1] != x.shape[-2] or not x.dtype.is_float:
        raise unsupported(f"Det of {x}")
    return (
        ("aten.linalg_det.default" if not x.dtype.is_half else f"{NAMESPACE}.half_det.default"),
        (arg(0),),
        {},
    )
