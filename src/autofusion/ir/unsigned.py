"""The reference runtime on uint16, uint32 and uint64, which eager torch barely implements.

In: an IR node whose inputs or outputs are one of those types, its torch implementation (from
`interpret`) and its argument tensors. Out: the node's results, computed exactly as the unsigned
types wrap, compare and divide (numpy's and ONNX's semantics), or an error saying why not.

torch 2.x stores these types and converts, views, copies, concatenates and pads them, but has no CPU
kernel for add, sub, comparisons, max/min, division or most reductions on them. So:
- uint16 and uint32 run widened: every value is exact in int64, so the op runs there and each result
  of a wide unsigned type converts back, which wraps modulo 2^16 / 2^32 exactly as the narrow op would
  (int64 arithmetic is modulo 2^64, a multiple of both).
- uint64 cannot widen. Ring operations (add, sub, mul, neg, bitwise, sums, products, matmul, selects)
  give the same bits in two's complement, so they run on the int64 view of the same memory. Ordered
  operations (comparisons, max/min and their reductions, argmax) run on x - 2^63 (an int64 with the
  same order: the sign bit flipped), and results come back flipped again. Division and remainder go
  through numpy, which has uint64 kernels. The sign-blind unary ops (abs, relu, rounding) are the
  identity on an unsigned value.
Extern calls (ATen ops the frontends did not lower) run natively first: where torch has a kernel for
the type it is the op's own; where it has none, uint16/uint32 run widened and uint64 raises naming
the op, since widening it is not exact.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from autofusion.ir.dtypes import DType
from autofusion.ir.graph import Graph, Node

WIDE_UNSIGNED = frozenset({torch.uint16, torch.uint32, torch.uint64})
_WIDE_DTYPES = frozenset({DType.uint16, DType.uint32, DType.uint64})
_NARROW = frozenset({torch.uint16, torch.uint32})

# torch runs these on every unsigned type itself (views, copies, casts and data movement).
NATIVE = frozenset(
    {"reshape", "permute", "expand", "slice", "select", "concat", "pad", "flip", "index_select", "const",
     "full", "cast", "eq", "ne", "bitwise_and", "bitwise_or", "bitwise_xor"}
)  # fmt: skip
# Same bits on the int64 view of a uint64 (two's complement arithmetic is arithmetic modulo 2^64).
_RING = frozenset(
    {"add", "sub", "mul", "neg", "square", "bitwise_not", "where", "sum", "prod", "mm", "bmm", "addmm",
     "linear", "pow", "gather", "logical_and", "logical_or", "logical_xor", "logical_not", "isnan",
     "isinf", "isfinite"}
)  # fmt: skip
# Order-dependent: run on x - 2^63, which orders as x does.
_ORDERED = frozenset(
    {"lt", "le", "gt", "ge", "maximum", "minimum", "amax", "amin", "argmax", "argmin", "clamp"}
)
# x itself for an unsigned x.
_IDENTITY = frozenset({"abs", "relu", "floor", "ceil", "round", "trunc"})
_NUMPY_BINARY: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "div": np.floor_divide,  # trunc and floor agree on unsigned values
    "remainder": np.remainder,
    "fmod": np.fmod,
}
_BIAS = -(2**63)

Impl = Callable[[Node, list[torch.Tensor], Graph], Any]


def involved(node: Node, args: Sequence[torch.Tensor]) -> bool:
    """Whether `node` reads or writes a type this module must handle (cheap: dtypes only)."""
    if any(a.dtype in WIDE_UNSIGNED for a in args if isinstance(a, torch.Tensor)):
        return True
    return any(v.type.dtype in _WIDE_DTYPES for v in node.outputs)


def run(node: Node, args: list[torch.Tensor], graph: Graph, impl: Impl) -> Any:
    op = str(node.op)
    if op in NATIVE:
        return impl(node, args, graph)
    if op == "extern":
        return _extern(node, args, graph, impl)
    if op == "arange":
        start, end, step = node.attr("start"), node.attr("end"), node.attr("step")
        return torch.arange(start, end, step, dtype=torch.int64).to(node.out.type.dtype.to_torch())
    if op == "sign":
        x = args[0]
        return (x != 0).to(x.dtype)
    wide64 = any(a.dtype is torch.uint64 for a in args)
    if not wide64:
        return _back(node, impl(node, [_widen(a) for a in args], graph))
    if op in _IDENTITY:
        return args[0].clone()
    if op in _RING:
        return _back(node, impl(node, [_as_i64(a) for a in args], graph))
    if op in _ORDERED:
        biased = [_biased(a) for a in args]
        if op == "clamp":
            lo, hi = node.attr("min"), node.attr("max")
            out = torch.clamp(
                biased[0], None if lo is None else lo + _BIAS, None if hi is None else hi + _BIAS
            )
        else:
            out = impl(node, biased, graph)
        return _back(node, out, unbias=op not in ("lt", "le", "gt", "ge", "argmax", "argmin"))
    if op in _NUMPY_BINARY and len(args) == 2:
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            a, b = (x.contiguous().numpy() for x in args)
            # x / 0 is 0, as generated code gives (torch raises on an integer division by zero)
            q = np.where(b == 0, np.uint64(0), _NUMPY_BINARY[op](a, np.where(b == 0, np.uint64(1), b)))
        return torch.from_numpy(np.ascontiguousarray(q.astype(np.uint64)))
    raise NotImplementedError(f"{op} has no exact implementation on uint64 in the reference runtime")


def _widen(t: torch.Tensor) -> torch.Tensor:
    return t.to(torch.int64) if isinstance(t, torch.Tensor) and t.dtype in _NARROW else t


def _as_i64(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int64) if t.dtype is torch.uint64 else t


def _biased(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int64) ^ _BIAS if t.dtype is torch.uint64 else t


def _back(node: Node, out: Any, unbias: bool = False) -> Any:
    """Each result as the node's declared dtype: narrow types convert (wrapping), uint64 re-views."""
    outs = out if isinstance(out, tuple) else (out,)
    fixed = []
    for v, t in zip(node.outputs, outs, strict=True):
        want = v.type.dtype.to_torch()
        if isinstance(t, torch.Tensor) and t.dtype is not want:
            if want is torch.uint64 and t.dtype is torch.int64:
                t = (t ^ _BIAS if unbias else t).view(torch.uint64)
            else:
                t = t.to(want)
        fixed.append(t)
    return tuple(fixed) if isinstance(out, tuple) else fixed[0]


def _extern(node: Node, args: list[torch.Tensor], graph: Graph, impl: Impl) -> Any:
    try:
        return impl(node, args, graph)
    except (NotImplementedError, RuntimeError) as e:
        if "not implemented for 'UInt" not in str(e):
            raise
        if any(a.dtype is torch.uint64 for a in args if isinstance(a, torch.Tensor)):
            raise NotImplementedError(
                f"{node.attr('target')} has no uint64 kernel in torch, and uint64 does not widen exactly; "
                "cast the input to int64 first if its values allow"
            ) from None
        target = str(node.attr("target"))
        if target.startswith(("aten.view.dtype", "aten.view_copy.dtype")):
            raise  # a bit cast reads the stored bits: widening would change them
        return _back(node, impl(node, [_widen(a) for a in args], graph))
