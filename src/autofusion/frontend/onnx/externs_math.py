"""Torch implementations of ONNX math and bit ops the IR cannot express: BitShift, BitCast.

Registered into `fallback.FALLBACKS` (the driver runs them as one `extern` ATen call each, see
fallback.py). The same mechanism for converters that lower most of a node to IR and
leave one library call inside it (a scan, a determinant) is `extern_node.extern_call`.

BitShift is ATen's bitwise_left_shift/bitwise_right_shift, whose CPU kernels already give what ONNX
(opset 28) asks for: an amount that is negative or at least the bit width shifts everything out (0,
or -1 for a right shift of a negative signed value), a signed right shift is arithmetic and a left
shift discards the bits past the sign bit. torch has no shift for uint16/32/64: those run as the
signed type of the same width (the same bits), the right shift made logical by a mask.
"""

from __future__ import annotations

from typing import Any

import torch

from autofusion.frontend.onnx.context import OnnxCtx, dtype_of, unsupported
from autofusion.frontend.onnx.fallback import ArgFn, fallback
from autofusion.ir.interpret import PY_TARGETS

NAMESPACE = "autofusion_onnx_math"
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


def _register() -> None:
    try:
        lib = torch.library.Library(NAMESPACE, "DEF")
    except RuntimeError:
        return  # registered already in this process
    lib.define("unsigned_shift(Tensor x, Tensor y, bool left) -> Tensor")
    lib.impl("unsigned_shift", unsigned_shift, "CompositeExplicitAutograd")
    PY_TARGETS[f"{NAMESPACE}.unsigned_shift.default"] = unsigned_shift
    _LIBS.append(lib)  # the registration lives as long as this object


_LIBS: list[Any] = []
_register()


@fallback("BitShift")
def _bit_shift(ctx: OnnxCtx, arg: ArgFn) -> tuple[str, tuple[Any, ...], dict[str, Any]]:
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
def _bit_cast(ctx: OnnxCtx, arg: ArgFn) -> tuple[str, tuple[Any, ...], dict[str, Any]]:
    src = ctx.type(0).dtype
    to = dtype_of(int(ctx.attr("to")), f"BitCast target of node {ctx.name!r}")
    if src.itemsize != to.itemsize:
        raise unsupported(f"BitCast from {src.short} to {to.short} (ONNX needs equal bit widths)")
    # view_copy, not view: the extern's output must not alias a buffer the plan may reuse
    return "aten.view_copy.dtype", (arg(0), to.to_torch()), {}
