"""Render loop kernels as one C++ translation unit.

In: `LoopKernel`s (kernel/lower.py) with their tiles. Out: C++ source with one `extern "C" void
<name>(char* const* bufs, const int64_t* P)` per kernel; bufs holds the input pointers, then the
output pointers.

Each kernel body is a `static` function `<name>_body` whose parallel loop is an orphaned
`omp for nowait`: called inside a parallel region the team shares the iterations and the caller
places the barriers (which is what lets a SuperKernel synchronise only where data flows); called
outside any region it runs on the calling thread alone, as OpenMP specifies for orphaned worksharing.
The exported `<name>` entry opens a parallel region around the body when the kernel has more than
PARALLEL_MIN elements and calls it directly otherwise.

Loops: size-1 dims are dropped and adjacent dims merge when every access's offset allows it, so
contiguous data becomes one long unit-stride loop. A pointwise kernel runs blocks of the innermost
loop in parallel (`#pragma omp parallel for` over outer index x block), the block body being an
`omp simd` loop. A reduction kernel runs rows in parallel (or, when there are few long rows, shares
each row between the threads); each stage is one pass over the row's inner dims in blocks, each an
`omp simd reduction(...)` loop or, for float sums, simd loops over a fixed number of lanes added
pairwise, whose result is added in block order into a wider row total (_reduction_body; kernel/tile.py
says why). Sizes and strides come from the parameter
array P, copied into locals first, so one source serves every shape with the same loop structure
(a reduction whose innermost loop is no longer than one group of lanes keeps a plain simd loop).
A reduction whose input is contiguous along a kept dim runs as columns instead (_column_body): blocks
of adjacent outputs keep their accumulators in arrays and walk the reduced dims, each step a simd loop
over the block.
Math: fp32, through af_math.h (branch-free, vectorisable); half types convert at loads and stores:
contiguous fp16 accesses of pointwise loops and reduction stages a run at a time, outside the simd
loop (staging.py: F16C where the build has it), the others per element; a store of a value that is
already of its half type skips the rounding (_half_exact). A reduction stage's row-invariant float
computations run once before its loops (_row_invariant).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from importlib import resources
from typing import Any

from autofusion.codegen.cpp import staging
from autofusion.ir.dtypes import DType
from autofusion.ir.graph import Node
from autofusion.kernel.lower import LoopKernel, Stmt
from autofusion.kernel.nan_flags import drop_nan_flags
from autofusion.kernel.row_alias import alias_output_rows
from autofusion.kernel.tile import PARALLEL_MIN, Tile

_UNSIGNED_C = {DType.uint16: "uint16_t", DType.uint32: "uint32_t", DType.uint64: "uint64_t"}
CTYPE = {DType.float32: "float", DType.float16: "float", DType.bfloat16: "float", DType.int32: "int32_t",
         DType.int64: "int64_t", DType.bool: "bool", **_UNSIGNED_C}  # fmt: skip
STORAGE = {DType.float32: "float", DType.float16: "uint16_t", DType.bfloat16: "uint16_t",
           DType.int32: "int32_t", DType.int64: "int64_t", DType.bool: "uint8_t", **_UNSIGNED_C}  # fmt: skip

# min(max(t, 0), 6) with NaN propagating, as ATen's vectorised maximum/minimum (t is evaluated once per use)
_RELU6 = "(({a}) != ({a}) ? ({a}) : (({a}) < 0.0f ? 0.0f : (({a}) > 6.0f ? 6.0f : ({a}))))"

# Float unary math: op -> C++ template with {a}. af_* come from af_math.h and vectorise; std:: ones
# are correct but keep their loop scalar (the cost model knows which is which through VECTORISES).
FLOAT_UNARY = {
    "neg": "(-{a})", "abs": "fabsf({a})", "exp": "af_exp({a})", "exp2": "af_exp2({a})",
    "expm1": "af_expm1({a})",
    "log": "af_log({a})", "log2": "af_log2({a})", "log10": "(af_log({a}) * 0.43429448190325176f)",
    "log1p": "af_log1p({a})", "sqrt": "sqrtf({a})", "rsqrt": "af_rsqrt({a})", "reciprocal": "(1.0f / {a})",
    "sin": "af_sin({a})", "cos": "af_cos({a})", "tan": "std::tan({a})", "asin": "std::asin({a})",
    "acos": "std::acos({a})", "atan": "std::atan({a})", "sinh": "std::sinh({a})", "cosh": "std::cosh({a})",
    "asinh": "std::asinh({a})", "acosh": "std::acosh({a})", "atanh": "std::atanh({a})",
    "tanh": "af_tanh({a})",
    "sigmoid": "af_sigmoid({a})", "silu": "af_silu({a})", "erf": "af_erf({a})", "erfc": "af_erfc({a})",
    "relu": "({a} < 0.0f ? 0.0f : {a})", "floor": "floorf({a})", "ceil": "ceilf({a})",
    "round": "nearbyintf({a})",
    # sign as eager: (0 < x) - (x < 0), so sign(+-0) = +0 and sign(NaN) = 0
    "trunc": "truncf({a})", "sign": "((float)(({a} > 0.0f) - ({a} < 0.0f)))", "square": "({a} * {a})",
    # eager's formulas, min(max(x + 3, 0), 6) / 6, with its NaN propagation and its overflow in x * 6
    "hardsigmoid": f"({_RELU6.format(a='{a} + 3.0f')} / 6.0f)",
    "hardswish": f"({{a}} * {_RELU6.format(a='{a} + 3.0f')} / 6.0f)",
    "mish": "({a} * af_tanh({a} > 20.0f ? {a} : af_log1p(af_exp({a}))))",
    "isnan": "({a} != {a})", "isinf": "(fabsf({a}) == INFINITY)", "isfinite": "(fabsf({a}) < INFINITY)",
    "logical_not": "({a} == 0.0f)",
}  # fmt: skip
VECTORISES = {k for k, v in FLOAT_UNARY.items() if "std::" not in v}
INT_UNARY = {"neg": "(-{a})", "abs": "({a} < 0 ? -{a} : {a})", "relu": "({a} < 0 ? 0 : {a})",
             "sign": "(({a} > 0) - ({a} < 0))", "square": "({a} * {a})", "floor": "{a}", "ceil": "{a}",
             "round": "{a}", "trunc": "{a}", "bitwise_not": "(~{a})", "logical_not": "({a} == 0)",
             "isnan": "false", "isinf": "false", "isfinite": "true"}  # fmt: skip
BOOL_UNARY = {"logical_not": "(!{a})", "bitwise_not": "(!{a})", "abs": "{a}", "isnan": "false",
              "isinf": "false", "isfinite": "true", "relu": "{a}", "sign": "{a}", "floor": "{a}",
              "ceil": "{a}", "round": "{a}", "trunc": "{a}"}  # fmt: skip
NAN_MAX = "({a} != {a} ? {a} : ({b} != {b} ? {b} : ({a} > {b} ? {a} : {b})))"
NAN_MIN = "({a} != {a} ? {a} : ({b} != {b} ? {b} : ({a} < {b} ? {a} : {b})))"
BINARY = {
    "add": "({a} + {b})", "sub": "({a} - {b})", "mul": "({a} * {b})", "eq": "({a} == {b})",
    "ne": "({a} != {b})", "lt": "({a} < {b})", "le": "({a} <= {b})", "gt": "({a} > {b})",
    "ge": "({a} >= {b})",
    "logical_and": "(({a} != 0) & ({b} != 0))", "logical_or": "(({a} != 0) | ({b} != 0))",
    "logical_xor": "(({a} != 0) != ({b} != 0))", "bitwise_and": "({a} & {b})", "bitwise_or": "({a} | {b})",
    "bitwise_xor": "({a} ^ {b})",
}  # fmt: skip
FLOAT_BINARY = {"div": "({a} / {b})", "maximum": NAN_MAX, "minimum": NAN_MIN, "pow": "af_pow({a}, {b})",
                "atan2": "std::atan2({a}, {b})", "fmod": "std::fmod({a}, {b})",
                "remainder": "af_remainder({a}, {b})"}  # fmt: skip
INT_BINARY = {"maximum": "({a} > {b} ? {a} : {b})", "minimum": "({a} < {b} ? {a} : {b})"}
# Unsigned only: C's % is the remainder of both torch ops there (no sign to take from either side);
# x % 0 gives 0 as x / 0 does (torch raises, a kernel cannot).
UNSIGNED_BINARY = {"remainder": "({b} == 0 ? ({ct})0 : ({ct})({a} % {b}))",
                   "fmod": "({b} == 0 ? ({ct})0 : ({ct})({a} % {b}))"}  # fmt: skip
# Sign-blind unary ops on an unsigned value (a < 0 is never true; compilers warn about it).
UNSIGNED_UNARY = {"abs": "{a}", "relu": "{a}", "sign": "({a} != 0)"}


_ALWAYS = frozenset(
    {
        "cast",
        "where",
        "lerp",
        "clamp",
        "full",
        "arange",
        "gelu",
        "leaky_relu",
        "elu",
        "softplus",
        "sum",
        "amax",
        "amin",
        "prod",
        "permute",
        "expand",
        "slice",
        "select",
        "flip",
        "reshape",
        "concat",
        "pad",
        "div",
    }
)
_PREDICATES = frozenset({"isnan", "isinf", "isfinite", "logical_not"})


def supports(node: Node) -> str | None:
    """None when this backend can generate `node` inside a kernel, else why not."""
    op = node.op
    dtype = node.outputs[0].type.dtype
    if op in _ALWAYS:
        return None
    if op in ("index_select", "gather"):
        # torch raises on an out-of-range index; a kernel cannot, so gathers stay library calls.
        return "gather indices are data and must be bounds-checked by torch"
    if op in _PREDICATES or op in BINARY:
        return None
    if len(node.inputs) == 1:
        table = FLOAT_UNARY if dtype.is_float else BOOL_UNARY if dtype.is_bool else INT_UNARY
        return None if op in table else f"{op} on {dtype.short}"
    if (op in FLOAT_BINARY and dtype.is_float) or (op in INT_BINARY and not dtype.is_float):
        return None
    if op in UNSIGNED_BINARY and dtype in _UNSIGNED_C:
        return None
    return f"no C++ lowering for {op} on {dtype.short}"


def _literal(value: Any, dtype: DType) -> str:
    if dtype.is_bool:
        return "true" if value else "false"
    if dtype.is_int:
        # unsigned literals take ULL: 2^63 and above are not long long values
        suffix = "ULL" if dtype.is_unsigned and int(value) >= 0 else "LL"
        return f"(({CTYPE[dtype]}){int(value)}{suffix})"
    v = float(value)
    if math.isnan(v):
        return "NAN"
    if math.isinf(v):
        return "INFINITY" if v > 0 else "(-INFINITY)"
    return f"{v!r}f"


_ROUND_HALF = {DType.float16: "af_round_f16", DType.bfloat16: "af_round_bf16"}
_FLOAT_TO_INT = {DType.int32: "af_f32_to_i32", DType.int64: "af_f32_to_i64"}


def _float_to_unsigned(a: str, out: DType) -> str:
    """float -> uint as x86 code (numpy, onnxruntime, torch) converts: truncate toward zero through int64
    and wrap; values from 2^63 on are shifted down first for uint64 (out-of-range is undefined in ONNX)."""
    ct = CTYPE[out]
    if out is not DType.uint64:
        return f"(({ct})af_f32_to_i64({a}))"
    return (f"({a} >= 0x1p63f ? (uint64_t)af_f32_to_i64({a} - 0x1p63f) + 0x8000000000000000ULL "
            f": (uint64_t)af_f32_to_i64({a}))")  # fmt: skip


def cast_expr(a: str, src: DType, out: DType, round_input: bool = False) -> str:
    """`a` (a value of IR dtype `src`, held in its C type) converted to `out` exactly as Tensor.to does.

    Half values live in float registers, so a cast to a half type rounds explicitly (else x.half().float()
    would be x); `round_input` rounds a half-typed input first, for inputs computed in fp32 and not yet
    rounded (the lowering sets it: loads and casts are already exact). Float -> int truncates, with x86's
    result where C++ leaves the conversion undefined (NaN, out of range)."""
    if round_input and src in _ROUND_HALF:
        a = f"{_ROUND_HALF[src]}({a})"
    if out.is_bool:
        return f"({a} != 0)"  # NaN != 0: True, as torch
    if out in _ROUND_HALF:
        if src is out or src.is_bool:
            return f"((float){a})"  # already a value of `out` (bools are 0 and 1)
        return f"{_ROUND_HALF[out]}((float){a})"  # ints: to float first (rounds once more, as torch does)
    if out.is_float:
        return f"((float){a})"
    if src.is_float:
        return _float_to_unsigned(a, out) if out in _UNSIGNED_C else f"{_FLOAT_TO_INT[out]}({a})"
    # int64 -> int32 wraps modulo 2^32, as torch; a value held in an unsigned C type zero-extends
    return f"(({CTYPE[out]}){a})"


# Integer + - * wrap around in torch (two's complement); in C++ signed overflow is undefined, so kernels do
# the arithmetic on the unsigned type, where it is defined to wrap, and convert back.
_WRAPPING = {"add": "+", "sub": "-", "mul": "*"}


# The unsigned type each C type's + - * run in: uint16_t promotes to int (where 65535 * 65535 overflows),
# so it runs in uint32_t.
_WRAP_IN = {"int32_t": "uint32_t", "int64_t": "uint64_t", "uint16_t": "uint32_t", "uint32_t": "uint32_t",
            "uint64_t": "uint64_t"}  # fmt: skip


def _wrapping(sym: str, a: str, b: str, ct: str) -> str:
    u = _WRAP_IN[ct]
    return f"(({ct})(({u}){a} {sym} ({u}){b}))"


def compute_expr(op: str, args: tuple[str, ...], out: DType, in_dtype: DType, attrs: dict[str, Any]) -> str:
    a = args[0]
    b = args[1] if len(args) > 1 else ""
    if op == "cast":
        return cast_expr(a, in_dtype, out, bool(attrs.get("round_input")))
    if op == "where":
        return f"({a} ? {b} : {args[2]})"
    if op == "lerp":
        return f"af_lerp({a}, {b}, {args[2]})"
    if op == "clamp":
        expr = a
        lo, hi = attrs.get("min"), attrs.get("max")
        if lo is not None:
            expr = f"({expr} < {_literal(lo, out)} ? {_literal(lo, out)} : {expr})"
        if hi is not None:
            expr = f"({expr} > {_literal(hi, out)} ? {_literal(hi, out)} : {expr})"
        return expr
    if op == "gelu":
        if attrs.get("approximate") == "tanh":
            return f"af_gelu_tanh({a})"
        return f"af_gelu({a})"
    if op == "leaky_relu":
        return f"({a} > 0.0f ? {a} : {a} * {_literal(attrs['negative_slope'], out)})"
    if op == "elu":
        alpha, scale, iscale = (_literal(attrs[k], out) for k in ("alpha", "scale", "input_scale"))
        return f"({a} > 0.0f ? {a} * {scale} : af_expm1({a} * {iscale}) * {alpha} * {scale})"
    if op == "softplus":
        beta, thr = _literal(attrs["beta"], out), _literal(attrs["threshold"], out)
        return f"({a} * {beta} > {thr} ? {a} : af_log1p(af_exp({a} * {beta})) / {beta})"
    if op == "div":
        mode = attrs.get("rounding_mode")
        if in_dtype.is_float:
            # by_reciprocal: the lowering proved 1/b safe (lower.py, _reciprocal_is_safe); else divide
            if mode == "floor":
                suffix = {DType.float16: "_f16", DType.bfloat16: "_bf16"}.get(out, "")
                return f"af_floor_divide{suffix}({a}, {b})"
            q = f"({a} * (1.0f / {b}))" if attrs.get("by_reciprocal") else f"({a} / {b})"
            if mode == "trunc":
                # eager truncates the quotient in the tensor's own type: a half quotient is rounded first
                return f"truncf({_ROUND_HALF[out]}({q}))" if out in _ROUND_HALF else f"truncf({q})"
            return q
        # Integer division by zero is an error in torch, and MIN / -1 traps on x86: keep the kernel from
        # trapping on either (x / -1 is -x, wrapping: MIN // -1 = MIN, as torch's floor_divide gives).
        ct = CTYPE[out]
        if out in _UNSIGNED_C:  # no -1 to trap on, and trunc and floor agree
            return f"({b} == 0 ? ({ct})0 : ({ct})({a} / {b}))"
        q = f"({b} == 0 ? ({ct})0 : ({b} == -1 ? {_wrapping('-', '0', a, ct)} : {a} / {b}))"
        if mode == "floor":
            return f"({q} - ((({a} % ({b} == 0 || {b} == -1 ? 1 : {b})) != 0) & (({a} < 0) != ({b} < 0))))"
        return q
    if op in _WRAPPING and out.is_int:
        return _wrapping(_WRAPPING[op], a, b, CTYPE[out])
    if op in UNSIGNED_UNARY and out in _UNSIGNED_C:
        return UNSIGNED_UNARY[op].format(a=a)
    if op in UNSIGNED_BINARY and out in _UNSIGNED_C:
        return UNSIGNED_BINARY[op].format(a=a, b=b, ct=CTYPE[out])
    if op in ("neg", "square", "abs") and out.is_int:
        neg = _wrapping("-", "0", a, CTYPE[out])
        return {"neg": neg, "square": _wrapping("*", a, a, CTYPE[out]), "abs": f"({a} < 0 ? {neg} : {a})"}[op]
    if op == "pow" and out.is_float and attrs.get("exponent") is not None:
        small = _pow_literal(a, float(attrs["exponent"]))
        if small is not None:
            return small
    if op == "exp" and attrs.get("nonpositive") and in_dtype.is_float:
        return f"af_exp_nonpos({a})"  # the planner proved the argument <= 0 (lower.py, _nonpositive)
    if len(args) == 1:
        table = FLOAT_UNARY if in_dtype.is_float else BOOL_UNARY if in_dtype.is_bool else INT_UNARY
        return table[op].format(a=a)
    if op in BINARY:
        return BINARY[op].format(a=a, b=b)
    if in_dtype.is_float:
        return FLOAT_BINARY[op].format(a=a, b=b)
    return INT_BINARY[op].format(a=a, b=b)


def _pow_literal(a: str, e: float) -> str | None:
    """x ** e for a literal e (lower.py passes it): integers and half-integers up to 64 in magnitude are a few
    multiplies (and a sqrt) in double, correctly rounded. Any other e: None, and the caller's af_pow takes e
    as the float literal, as eager's vectorised kernel does (its scalar tail uses the double: x ** 1.7 on a
    tensor of three elements differs from the same elements of a long one)."""
    if math.isfinite(e) and abs(e) <= 64.0 and (2.0 * e).is_integer():
        return f"af_powi({a}, {int(e)})" if e.is_integer() else f"af_pow_half({a}, {int(2 * e)})"
    return None


class _Loops:
    """Merged loop groups for one kernel."""

    def __init__(self, k: LoopKernel) -> None:
        space = k.space
        blocked: set[int] = set()
        offsets = []
        for s in k.all_stmts():
            if s.offset is None:
                continue
            if s.offset.is_affine:
                offsets.append(s.offset)
            else:
                blocked |= set(s.offset.deps)
        dims = [d for d in range(len(space)) if space[d] != 1 or d in blocked]
        groups: list[list[int]] = []
        for d in dims:
            if groups:
                prev = groups[-1][-1]
                same_side = (prev < k.n_outer) == (d < k.n_outer)
                # Adjacent dims (only size-1 dims between them) merge when every access steps
                # through them as one contiguous run.
                ok = (
                    same_side
                    and prev not in blocked
                    and d not in blocked
                    and all(space[x] == 1 for x in range(prev + 1, d))
                    and all(o.coeff(prev) == o.coeff(d) * space[d] for o in offsets)
                )
                if ok:
                    groups[-1].append(d)
                    continue
            groups.append([d])
        self.groups = groups
        self.sizes = [math.prod(space[d] for d in g) for g in groups]
        self.outer = [i for i, g in enumerate(groups) if g[0] < k.n_outer]
        self.inner = [i for i, g in enumerate(groups) if g[0] >= k.n_outer]
        self.space = space
        self.params: list[int] = []

    def p(self, value: int) -> str:
        """A size or stride read from the call's parameter array, so the source fits every shape
        with the same loop structure (and a new batch size is a cache hit, not a compile)."""
        self.params.append(int(value))
        return f"sz{len(self.params) - 1}"  # the lowering names its values v/acc/p/c; sizes are sz

    def offset(self, ix: Any) -> str:
        if not ix.is_affine:
            return ix.render()
        terms = []
        for gi, g in enumerate(self.groups):
            c = ix.coeff(g[-1])
            if c:
                terms.append(f"g{gi}" if c == 1 else f"g{gi} * {self.p(c)}")
        if ix.const:
            terms.append(self.p(ix.const))
        if not terms:
            terms.append("0")
        return " + ".join(terms)

    def dim_defs(self, groups: list[int]) -> list[str]:
        """Original index variables i<d> for the dims of `groups` (for opaque index expressions)."""
        out = []
        for gi in groups:
            rem = f"g{gi}"
            g = self.groups[gi]
            for pos, d in enumerate(reversed(g)):
                size = self.space[d]
                if pos == len(g) - 1:
                    out.append(f"const int64_t i{d} = {rem};")
                else:
                    sz = self.p(size)
                    out.append(f"const int64_t i{d} = {rem} % {sz};")
                    rem = f"({rem} / {sz})"
        return out


_SMALL_TRIG = {"sin": "af_sin_small", "cos": "af_cos_small"}


def _is_trig(s: Stmt) -> bool:
    return s.kind == "compute" and s.op in _SMALL_TRIG and s.attrs["in_dtype"].is_float


# Encoders for a float that already holds a value of the half type: the store skips the rounding.
_HALF_BITS = {DType.float16: "af_f16_bits", DType.bfloat16: "af_bf16_bits"}
_PICKS = frozenset({"where", "neg", "abs", "relu", "maximum", "minimum"})  # results among their inputs


def _half_exact(k: LoopKernel, dt: DType) -> set[str]:
    """The variables of dtype `dt` (a half type) whose float holds a `dt` value exactly, as the rendered
    code computes them: loads of a `dt` buffer, results rounded where they are made (`round_output`,
    casts to `dt` from another type, rounded inputs, arange values) and picks among such values. A store
    of one needs no rounding (af_f16_bits gives the bits af_f32_to_f16 would, NaN included); anything
    else (literals, row scratch, accumulators) is left to the rounding encoder."""
    exact: set[str] = set()
    for s in k.all_stmts():
        if s.dtype is not dt or not s.var:
            continue
        if s.kind == "load":
            ok = k.buffers[s.buf].type.dtype is dt
        elif s.kind == "index":
            ok = True  # rendered through _ROUND_HALF
        elif s.kind == "compute":
            src = s.attrs.get("in_dtype")
            if s.attrs.get("round_output"):
                ok = True
            elif s.op == "cast":
                ok = src is not dt or bool(s.attrs.get("round_input")) or s.args[0] in exact
            else:
                ok = s.op in _PICKS and bool(s.args) and all(a in exact for a in s.args[-2:])
        else:
            ok = False
        if ok:
            exact.add(s.var)
    return exact


def _stmt(s: Stmt, loops: _Loops, k: LoopKernel, small_trig: bool = False, acc: str = "_b") -> str:
    """One statement as C++; `small_trig`: sin/cos use the small-argument versions and keep the largest
    argument in `af_wide` (NaN and inf are right in the small versions, so max may drop them); `acc`:
    where accumulators add (_acc_refs)."""
    ct = CTYPE[s.dtype]
    if small_trig and _is_trig(s):
        (a,) = s.args
        return (f"const float {s.var} = {_SMALL_TRIG[s.op]}({a}); "
                f"af_wide = af_wide > fabsf({a}) ? af_wide : fabsf({a});")  # fmt: skip
    if s.kind == "load":
        buf = k.buffers[s.buf]
        ref = f"b{s.buf}[{loops.offset(s.offset)}]"
        if buf.type.dtype is DType.float16:
            ref = f"af_f16_to_f32({ref})"
        elif buf.type.dtype is DType.bfloat16:
            ref = f"af_bf16_to_f32({ref})"
        elif buf.type.dtype is DType.bool:
            ref = f"({ref} != 0)"
        return f"const {ct} {s.var} = {ref};"
    if s.kind == "literal":
        return f"const {ct} {s.var} = {_literal(s.value, s.dtype)};"
    if s.kind == "index":
        start, step = s.attrs["start"], s.attrs["step"]
        value = f"({ct})({start!r} + ({loops.offset(s.offset)}) * {step!r})"
        if s.dtype in _ROUND_HALF:
            value = f"{_ROUND_HALF[s.dtype]}({value})"  # arange in a half type holds half values
        return f"const {ct} {s.var} = {value};"
    if s.kind == "compute":
        expr = compute_expr(s.op, s.args, s.dtype, s.attrs["in_dtype"], s.attrs)
        if s.attrs.get("round_output"):
            expr = f"{_ROUND_HALF[s.dtype]}({expr})"  # a half-typed result takes its type's value at once
        return f"const {ct} {s.var} = {expr};"
    if s.kind == "store":
        dt = k.buffers[s.buf].type.dtype
        if dt in _HALF_BITS and s.var in _half_exact(k, dt):
            return f"b{s.buf}[{loops.offset(s.offset)}] = {_HALF_BITS[dt]}({s.var});"
        val = {DType.float16: f"af_f32_to_f16({s.var})", DType.bfloat16: f"af_f32_to_bf16({s.var})",
               DType.bool: f"(uint8_t){s.var}"}.get(dt, s.var)  # fmt: skip
        return f"b{s.buf}[{loops.offset(s.offset)}] = {val};"
    if s.kind == "rowstore":
        return f"{s.value}[{loops.offset(s.offset)}] = {s.var};"
    if s.kind == "rowload":
        return f"const {ct} {s.var} = {s.value}[{loops.offset(s.offset)}];"
    if s.kind == "acc":
        (v,) = s.args
        ref, flag = _acc_refs(s.var, acc)
        if (
            s.dtype.is_float
            and s.op in ("amax", "amin")
            and all(a.nan_flag for a in k.accumulators if a.var == s.var)
        ):
            # an int flag vectorises (bool halves speed) and keeps the compare a plain max
            return f"{_fold(s.op, ref, v)} {flag} |= ({v} != {v});"
        return _fold(s.op, ref, v, s.dtype)
    raise ValueError(f"unknown statement kind {s.kind}")


_INIT = {"sum": "0", "prod": "1"}


def _acc_refs(var: str, where: str) -> tuple[str, str]:
    """Accumulator `var`'s value and NaN flag: in the current item's partial (`where` = "_b"), in the
    partial of the last few elements of an item run in lanes ("_r"), or in lane `af_j` ("lane")."""
    if where == "lane":
        return f"{var}_l[af_j]", f"{var}_n[af_j]"
    return f"{var}{where}", f"{var}{where}_nan"


def _fold(op: str, acc: str, v: str, dtype: DType = DType.float32) -> str:
    """`acc` updated with one more value `v` (NaN flags aside)."""
    if op == "sum":
        return f"{acc} += {v};"
    if op == "prod":
        # a uint16_t product promotes to int, where it can overflow: multiply in uint32_t, wrap on store
        return (
            f"{acc} *= {v};"
            if dtype is not DType.uint16
            else f"{acc} = (uint16_t)((uint32_t){acc} * (uint32_t){v});"
        )
    cmp = ">" if op == "amax" else "<"
    return f"{acc} = {v} {cmp} {acc} ? {v} : {acc};"


def _acc_init(op: str, dtype: DType) -> str:
    if op in _INIT:
        return _INIT[op]
    if dtype.is_float:
        return "(-INFINITY)" if op == "amax" else "INFINITY"
    lim = "min" if op == "amax" else "max"
    return f"std::numeric_limits<{CTYPE[dtype]}>::{lim}()"


def _simd_clause(accs: list[Any], where: str = "_b") -> str:
    parts = []
    for a in accs:
        red = {"sum": "+", "prod": "*", "amax": "max", "amin": "min"}[a.op]
        ref, flag = _acc_refs(a.var, where)
        parts.append(f"reduction({red}:{ref})")
        if _has_nan_flag(a):
            parts.append(f"reduction(|:{flag})")
    return " ".join(parts)


def _total_type(a: Any) -> str:
    """The type a row's block results are added up in: double for float sums (a block's rounding
    error then does not grow with the number of blocks), the accumulator's own type otherwise (a
    product's rounding does not depend on the order; max/min do not round)."""
    if a.op == "sum" and a.dtype.is_float:
        return "double"
    return _acc_type(a)


def _combine(a: Any, total: str, part: str) -> str:
    """`total` combined with one block's result `part` (whose NaN flag is already folded in)."""
    if a.op == "sum":
        return f"{total} += {part};"
    if a.op == "prod":
        return f"{total} *= {part};"
    if a.dtype.is_float:
        return f"{total} = {(NAN_MAX if a.op == 'amax' else NAN_MIN).format(a=total, b=part)};"
    cmp = ">" if a.op == "amax" else "<"
    return f"{total} = {part} {cmp} {total} ? {part} : {total};"


def _part_ref(a: Any, slot: int, n_items: str) -> str:
    """Item `it`'s result of accumulator `a` in the team's shared array (8-byte slots, one run each)."""
    return f"(({_total_type(a)}*)(af_part + 8 * {slot} * {n_items}))[it]"


def _final_value(a: Any) -> str:
    """The row's result as later statements read it. A half-typed sum or product is rounded to its
    type, as torch rounds its fp32 accumulator once at the output."""
    ct = _acc_type(a)
    val = f"({ct}){a.var}_t"
    if a.op in ("sum", "prod") and a.dtype is DType.float16:
        val = f"af_f16_to_f32(af_f32_to_f16({val}))"
    elif a.op in ("sum", "prod") and a.dtype is DType.bfloat16:
        val = f"af_bf16_to_f32(af_f32_to_bf16({val}))"
    return f"const {ct} {a.var} = {val};"


def _needs_dims(stmts: Sequence[Stmt]) -> bool:
    return any(s.offset is not None and not s.offset.is_affine for s in stmts) or any(
        s.kind == "index" for s in stmts
    )


def _loop_nest(loops: _Loops, group_ids: list[int], body: list[str], simd: str, indent: str) -> list[str]:
    """Nested loops over `group_ids` (outermost first); the innermost one carries the simd pragma."""
    if not group_ids:
        return [indent + line for line in body]
    lines: list[str] = []
    pad = indent
    for pos, gi in enumerate(group_ids):
        if pos == len(group_ids) - 1:
            lines.append(f"{pad}#pragma omp simd {simd}".rstrip())
        lines.append(f"{pad}for (int64_t g{gi} = 0; g{gi} < {loops.p(loops.sizes[gi])}; ++g{gi}) {{")
        pad += "  "
    lines += [pad + line for line in body]
    for _ in group_ids:
        pad = pad[:-2]
        lines.append(pad + "}")
    return lines


def _split_index(loops: _Loops, var: str, group_ids: list[int], lines: list[str], indent: str) -> None:
    """Decompose a flat index `var` into the loop variables of `group_ids` (innermost last). Every caller's
    `var` is below the product of their sizes, so the outermost takes what is left without a modulo
    (a 64-bit division per row: with three stages a softmax over 128-wide rows paid four per row)."""
    rem = var
    for pos, g in enumerate(reversed(group_ids)):
        if pos == len(group_ids) - 1:
            lines.append(f"{indent}const int64_t g{g} = {rem};")
            break
        size = loops.p(loops.sizes[g])
        lines.append(f"{indent}const int64_t g{g} = {rem} % {size};")
        rem = f"({rem} / {size})"


def _body(k: LoopKernel, tile: Tile) -> tuple[list[str], list[int], int]:
    """The kernel as the static function `<name>_body` (see the module docstring), its parameter
    values, and the index of the parameter holding the kernel's element count."""
    loops = _Loops(k)
    lines = [f"static void {k.name}_body(char* const* bufs, const int64_t* __restrict P) {{"]
    for i, b in enumerate(k.buffers):
        const = "" if b.is_output else "const "
        lines.append(
            f"  {const}{STORAGE[b.type.dtype]}* __restrict b{i} = ({const}{STORAGE[b.type.dtype]}*)bufs[{i}];"
        )
    loops.p(math.prod(k.space))  # the element count: entries open a parallel region only above PARALLEL_MIN
    work = 0
    if not k.is_reduction:
        inner_gid = (loops.inner or loops.outer)[-1] if loops.groups else None
        outer_ids = [g for g in range(len(loops.groups)) if g != inner_gid]
        n_inner = loops.sizes[inner_gid] if inner_gid is not None else 1
        across = _transposed(k, loops, inner_gid, outer_ids)
        block = max(1, min(TRANSPOSED_BLOCK if across else tile.inner_block, tile.inner_block, n_inner))
        nb = -(-n_inner // block) if n_inner else 0
        rows = math.prod(loops.sizes[g] for g in outer_ids) * nb
        lines.append("  #pragma omp for schedule(static) nowait")
        lines.append(f"  for (int64_t r = 0; r < {loops.p(rows)}; ++r) {{")
        nb_p = loops.p(nb)
        if across:
            # Consecutive rows take the next outer index over the same block (module doc of _transposed).
            last = outer_ids[-1]
            size_p = loops.p(loops.sizes[last])
            lines.append(f"    const int64_t g{last} = r % {size_p};")
            lines.append(f"    const int64_t blk = (r / {size_p}) % {nb_p};")
            _split_index(loops, f"((r / {size_p}) / {nb_p})", outer_ids[:-1], lines, "    ")
        else:
            lines.append(f"    const int64_t blk = r % {nb_p};")
            _split_index(loops, f"(r / {nb_p})", outer_ids, lines, "    ")
        if inner_gid is None:
            body = [_stmt(s, loops, k) for s in k.stages[0]]
            lines += ["    " + line for line in loops.dim_defs(outer_ids) + body]
        else:
            block_p, inner_p = loops.p(block), loops.p(n_inner)
            lines.append(
                f"    const int64_t lo = blk * {block_p}, hi = std::min<int64_t>(lo + {block_p}, {inner_p});"
            )
            head = f"    for (int64_t g{inner_gid} = lo; g{inner_gid} < hi; ++g{inner_gid}) {{"
            defs = loops.dim_defs(list(range(len(loops.groups)))) if _needs_dims(k.stages[0]) else []
            if any(_is_trig(s) for s in k.stages[0]):
                # sin/cos: the block runs with the cheap small-argument versions, and once more with the
                # full-range ones when an argument was out of their range (the block only reads inputs
                # and writes its own outputs, so running it again is safe).
                lines += ["    float af_wide = 0.0f;", "    #pragma omp simd reduction(max:af_wide)", head]
                small = [_stmt(s, loops, k, small_trig=True) for s in k.stages[0]]
                lines += ["      " + line for line in defs + small]
                lines += ["    }", "    if (af_wide >= AF_TRIG_SMALL_LIMIT) {"]
                head = "  " + head
            trig = any(_is_trig(s) for s in k.stages[0])
            stage0 = k.stages[0]
            staged = None if trig else staging.plan(k, stage0, inner_gid, loops.groups[inner_gid][-1], block)
            if staged is not None:
                lines += staged.lines(stage0, loops.offset, lambda s: _stmt(s, loops, k), defs)
            else:
                lines += ["    #pragma omp simd", head]
                lines += ["      " + line for line in defs + [_stmt(s, loops, k) for s in k.stages[0]]]
                lines.append("    }")
            if any(_is_trig(s) for s in k.stages[0]):
                lines.append("    }")
        lines.append("  }")
        lines.append("}")
        return lines, loops.params, work
    if tile.columns:
        lines += _column_body(k, tile, loops)
    else:
        # A split row's scratch is per thread and per item range; whole rows may keep it in the output.
        # (the flags are judged before the move: a moved row stores its carried value into the output)
        kr = drop_nan_flags(k)
        lines += _reduction_body(kr if tile.split_rows else alias_output_rows(kr), tile, loops)
    return lines, loops.params, work


TRANSPOSED_BLOCK = 64  # inner elements per row of a transposing kernel (see _transposed)
# Below this many elements the data stays in cache anyway and the short rows cost more than they save
# (one core of the 2-core VM: 0.78-0.89x at 100-130K elements; 1.3-2.8x from 300K up).
TRANSPOSED_MIN = 1 << 18


def _transposed(k: LoopKernel, loops: _Loops, inner_gid: int | None, outer_ids: list[int]) -> bool:
    """Whether an elementwise kernel reads or writes a buffer across its inner loop (a stride other
    than 0 or 1 there) that is contiguous along the last outer loop: a layout change, such as a
    channels-last convolution result scaled per channel into an NCHW buffer (EfficientNet's
    squeeze-excite product). Rows then run with that outer index fastest over short blocks, so the
    cache lines one row touches are the ones the next rows read: with the block fastest, each row of
    one channel touched a new line per element and the next channel fetched them all again. Only
    kernels of TRANSPOSED_MIN elements or more."""
    if inner_gid is None or not outer_ids or math.prod(k.space) < TRANSPOSED_MIN:
        return False
    inner, last = loops.groups[inner_gid][-1], loops.groups[outer_ids[-1]][-1]
    for st in k.all_stmts():
        ix = st.offset
        if ix is not None and ix.is_affine and ix.coeff(last) == 1 and ix.coeff(inner) not in (0, 1):
            return True
    return False


LANE_TAIL = 16  # an item's tail runs in simd groups of this many lanes (an AVX-512 vector), then one by one
MAX_LANES_FROM = 4  # a float max/min takes lanes in rows longer than this many groups of lanes


def _acc_type(a: Any) -> str:
    return "bool" if a.dtype.is_bool else CTYPE[a.dtype]


def _row_lanes(tile: Tile, block: int) -> int:
    """Accumulators for items of `block` elements: the fewest (a power of two, at least LANE_TAIL, at
    most tile.reduce_lanes) that leave each lane no more additions than a full block gives it
    (reduce_block / reduce_lanes), so the error bound stays the long rows' while a short row folds fewer
    lanes: a layer norm over rows of 96 ran 1.2x faster with 16 lanes than with 64 (3 folds per row)."""
    per_lane = max(1, tile.reduce_block // tile.reduce_lanes)
    lanes = LANE_TAIL
    while lanes < tile.reduce_lanes and lanes * per_lane < block:
        lanes *= 2
    return lanes


def _is_float_sum(a: Any) -> bool:
    return a.op == "sum" and a.dtype.is_float


def _is_float_minmax(a: Any) -> bool:
    return a.op in ("amax", "amin") and a.dtype.is_float


def _has_nan_flag(a: Any) -> bool:
    return _is_float_minmax(a) and a.nan_flag


def _simd_for(head: str, body: list[str], clause: str = "") -> list[str]:
    return [f"#pragma omp simd {clause}".rstrip(), f"for ({head}) {{", *("  " + x for x in body), "}"]


def _lane_loops(
    k: LoopKernel, loops: _Loops, stage: Sequence[Stmt], accs: list[Any], lanes: int, needs: bool
) -> list[str]:
    """One item's loops with `lanes` accumulators per accumulator (kernel/tile.py says why), ending with
    the item's result in `<acc>_b` (and `<acc>_b_nan`). Lane j takes elements lo + j, lo + j + lanes, ...:
    whole groups of `lanes` elements run as a simd loop of constant trip count (the compiler keeps the
    lanes in vector registers), then whole groups of LANE_TAIL elements add into the first LANE_TAIL
    lanes, and the last few elements, one by one, into `<acc>_r`; the lanes are combined pairwise in a
    fixed tree and `<acc>_r` added last, so the order of additions is the source's, whatever the vector
    width. (A simd reduction for the tail would add its own lanes one after another on every item, and a
    scalar tail through the lane arrays stalls the tree's vector loads: both cost short rows time.)"""
    if lanes < LANE_TAIL or lanes & (lanes - 1):
        raise ValueError(f"reduce_lanes must be a power of two >= {LANE_TAIL}, got {lanes}")
    last = loops.inner[-1]
    out: list[str] = []
    init = []
    for a in accs:
        ident = _acc_init(a.op, a.dtype)
        out += [f"{_acc_type(a)} {a.var}_l[{lanes}];", f"{_acc_type(a)} {a.var}_r = {ident};"]
        init.append(f"{a.var}_l[af_j] = {ident};")
        if _has_nan_flag(a):
            out += [f"int {a.var}_n[{lanes}];", f"int {a.var}_r_nan = 0;"]
            init.append(f"{a.var}_n[af_j] = 0;")
    out += _simd_for(f"int af_j = 0; af_j < {lanes}; ++af_j", init)
    head = [f"const int64_t g{last} = af_gb + af_j;"] + (loops.dim_defs(loops.inner) if needs else [])
    # contiguous fp16 loads convert a whole group at once (staging.py), before the group's simd loop
    staged = staging.contiguous_loads(k, stage, loops.groups[last][-1])
    in_lanes = head + [
        f"const float {s.var} = af_s{s.var}[af_j];" if s.var in staged else _stmt(s, loops, k, acc="lane")
        for s in stage
    ]
    out.append("int64_t af_gb = lo;")
    for width in dict.fromkeys((lanes, LANE_TAIL)):
        out += [f"for (; af_gb + {width} <= hi; af_gb += {width}) {{"]
        if width == lanes:
            # An empty volatile asm (no instruction) keeps GCC's -O3 unroll-and-jam from interleaving
            # two groups' loads (cache lines 0,4,1,5,...), which slows rows streamed from memory: a
            # layer_norm over 1024-wide rows ran 1.5x slower with it.
            out.append('  __asm__ __volatile__("");')
        for var, s in staged.items():
            ref = f"&b{s.buf}[{loops.offset(s.offset)}]"
            out.append(f"  alignas(64) float af_s{var}[{width}];")
            out.append(f"  {{ const int64_t g{last} = af_gb; af_f16_load({ref}, af_s{var}, {width}); }}")
        out += ["  " + x for x in _simd_for(f"int64_t af_j = 0; af_j < {width}; ++af_j", in_lanes)] + ["}"]
    tail = [f"const int64_t g{last} = af_gb;"] + (loops.dim_defs(loops.inner) if needs else [])
    tail += [_stmt(s, loops, k, acc="_r") for s in stage]
    out += ["for (; af_gb < hi; ++af_gb) {", *("  " + x for x in tail), "}"]
    w = lanes // 2
    while w:
        step = []
        for a in accs:
            step.append(_fold(a.op, f"{a.var}_l[af_j]", f"{a.var}_l[af_j + {w}]", a.dtype))
            if _has_nan_flag(a):
                step.append(f"{a.var}_n[af_j] |= {a.var}_n[af_j + {w}];")
        out += _simd_for(f"int af_j = 0; af_j < {w}; ++af_j", step)
        w //= 2
    for a in accs:
        out += [f"{_acc_type(a)} {a.var}_b = {a.var}_l[0];", _fold(a.op, f"{a.var}_b", f"{a.var}_r", a.dtype)]
        if _has_nan_flag(a):
            out.append(f"int {a.var}_b_nan = {a.var}_n[0] | {a.var}_r_nan;")
    return out


def _row_invariant(stage: Sequence[Stmt], known: set[str]) -> list[Stmt]:
    """The statements of a reduction stage that compute from earlier stages' results (`known`) and
    literals alone: the same value for the whole row, rendered once before the stage's loops. Left in
    the loop, GCC 12 hoists part of such a chain itself and may leave a select on a loop-invariant
    condition behind (partial redundancy elimination of a layer norm's rsqrt(var + eps)), which it then
    cannot vectorise: the fp16 layer norm's last stage ran scalar. Integer ops are left alone (an
    integer division must not run before the loop when the loop would not)."""
    out: list[Stmt] = []
    inv = set(known)
    for s in stage:
        in_dt = s.attrs.get("in_dtype")
        pure = s.kind == "literal" or (
            s.kind == "compute"
            and bool(s.args)
            and all(a in inv for a in s.args)
            and not s.dtype.is_int
            and not (in_dt is not None and in_dt.is_int)
        )
        if pure:
            out.append(s)
            inv.add(s.var)
    return out


def _one_item(n_blocks: int, accs: list[Any]) -> bool:
    """Whether a stage of a row with no other inner loop than the innermost runs as one item, with no
    item loop: around the stage's simd loops, a one-trip `for (it ...)` with its computed lo/hi left
    softmax over 128-wide rows 15% slower (GCC vectorises the inner loop with run-time bounds derived
    from `it`). So does a stage whose result does not depend on the order of its elements (max/min, or
    no accumulator), however long the row: blocks exist for the rounding of sums, and each block costs
    such a stage its set-up and lane fold (softmax over 3072-wide rows: max and scale passes in three
    blocks each, 4% of the kernel). The results are the same bits either way."""
    return n_blocks == 1 or all(a.op in ("amax", "amin") for a in accs)


def _reduction_body(k: LoopKernel, tile: Tile, loops: _Loops) -> list[str]:
    """A reduction kernel's loops (kernel/tile.py says why they are shaped so).

    Per row and stage, the row's inner index space is cut into items: one block of at most
    `tile.reduce_block` elements of the innermost loop, for each index of the other inner loops. An
    item accumulates into `<acc>_b`, through lanes (_lane_loops) when the stage has a float sum, max or
    min and the innermost loop is longer than `tile.reduce_lanes`, as one `omp simd` loop otherwise;
    its result is combined into the row's total `<acc>_t` in item order (a stage `_one_item` accepts
    runs its loops once over the whole row, with no item loop). Rows run in parallel, or,
    with `tile.split_rows`, every thread runs all rows and takes a contiguous range of each row's
    items; it stores each item's result in a shared array, and after a barrier every thread combines
    the whole array in item order, so all threads hold the same total and it does not depend on how
    many there are. Row buffers are per thread: a thread reads back only the elements of the items it
    stored."""
    split = tile.split_rows
    lines: list[str] = []
    rows = math.prod(loops.sizes[g] for g in loops.outer)
    last = loops.inner[-1] if loops.inner else None
    others = loops.inner[:-1]
    n_last = loops.sizes[last] if last is not None else 1
    block = max(1, min(tile.reduce_block, n_last))
    # Lanes only pay off past one group of them: a shorter innermost loop keeps the single simd loop,
    # and so do stages with neither a float sum nor a float max/min (integer sums). A float max/min is
    # exact in any order, but one simd loop keeps it in one vector register, a chain of dependent
    # vmaxps at one vector per latency: softmax's max pass over 3072-wide rows took a third of the
    # kernel's time; lanes give it reduce_lanes / 16 independent vectors. Their fold costs a short row
    # more than they save: rows of 128 ran 5% slower, 256 the same, 512 and longer 5-15% faster.
    lanes = _row_lanes(tile, block) if n_last > tile.reduce_lanes else 0
    max_lanes = lanes if n_last > MAX_LANES_FROM * tile.reduce_lanes else 0
    nb = -(-n_last // block) if n_last else 0
    n_items = math.prod(loops.sizes[g] for g in others) * nb
    # A row of one item needs no wider total: 0 + the item's result, in double and back, is that result.
    # Short rows (a layer norm over 96 channels) spent a tenth of their time on the conversions.
    single_item_row = n_items == 1 and not split
    items_p, nb_p, block_p = loops.p(n_items), loops.p(nb), loops.p(block)
    last_p = loops.p(n_last)
    whole_row = not split and not others
    acc_stages = list(k.accumulators)
    if k.row_buffers:
        # One scratch row per thread per carried value, allocated once per call, not per row.
        row = loops.p(math.prod(k.space[k.n_outer :]))
        lines.append("  {")
        for name, dt in k.row_buffers:
            ct = CTYPE[dt]
            lines.append(
                f"  {ct}* __restrict {name} = ({ct}*)std::malloc(sizeof({ct}) * ({row} > 0 ? {row} : 1));"
            )
    if split:
        lines += [
            "  int af_nt = 1, af_tid = 0;",
            "#ifdef _OPENMP",
            "  af_nt = omp_get_num_threads(); af_tid = omp_get_thread_num();",
            "#endif",
            f"  const int64_t it_lo = {items_p} * af_tid / af_nt, it_hi = {items_p} * (af_tid + 1) / af_nt;",
        ]
        if acc_stages:
            # One 8-byte slot per accumulator and item, shared by the team (copyprivate hands every
            # thread the pointer the one thread allocated).
            lines += [
                "  char* af_part = nullptr;",
                "  #pragma omp single copyprivate(af_part)",
                f"  af_part = (char*)std::malloc(8 * {len(acc_stages)} * ({items_p} > 0 ? {items_p} : 1));",
            ]
        lines.append(f"  for (int64_t x = 0; x < {loops.p(rows)}; ++x) {{")
    else:
        chunk = loops.p(max(1, tile.rows_per_block))
        lines.append(f"  #pragma omp for schedule(static, {chunk}) nowait")
        lines.append(f"  for (int64_t x = 0; x < {loops.p(rows)}; ++x) {{")
    _split_index(loops, "x", loops.outer, lines, "    ")
    needs = _needs_dims(k.all_stmts())
    if needs:
        lines += ["    " + line for line in loops.dim_defs(loops.outer)]
    slot = {a.var: i for i, a in enumerate(acc_stages)}
    for si, full_stage in enumerate(k.stages):
        accs = [a for a in k.accumulators if a.stage == si]
        hoisted = _row_invariant(full_stage, {a.var for a in k.accumulators if a.stage < si})
        lines += ["    " + _stmt(s, loops, k) for s in hoisted]
        stage = [s for s in full_stage if not any(s is h for h in hoisted)]
        for a in accs:
            total = _acc_type(a) if single_item_row else _total_type(a)
            lines.append(f"    {total} {a.var}_t = {_acc_init(a.op, a.dtype)};")
        lo_hi = ("it_lo", "it_hi") if split else ("0", items_p)
        one_item = whole_row and _one_item(nb, accs)
        if one_item:
            lines.append("    {")
            if last is not None:
                lines.append(f"      const int64_t lo = 0, hi = {last_p};")
        else:
            lines.append(f"    for (int64_t it = {lo_hi[0]}; it < {lo_hi[1]}; ++it) {{")
        if last is not None and not one_item:
            # items are (other inner index, block): with no other inner loop `it` is the block itself
            blk = f"(it % {nb_p})" if others else "it"
            lines.append(f"      const int64_t lo = {blk} * {block_p},")
            lines.append(f"                    hi = std::min<int64_t>(lo + {block_p}, {last_p});")
            _split_index(loops, f"(it / {nb_p})", others, lines, "      ")
        in_lanes = (lanes and any(_is_float_sum(a) for a in accs)) or (
            max_lanes and any(_is_float_minmax(a) for a in accs)
        )
        if in_lanes:
            lines += ["      " + line for line in _lane_loops(k, loops, stage, accs, lanes, needs)]
        else:
            for a in accs:
                lines.append(f"      {_acc_type(a)} {a.var}_b = {_acc_init(a.op, a.dtype)};")
                if _has_nan_flag(a):
                    lines.append(f"      int {a.var}_b_nan = 0;")
            defs = loops.dim_defs(loops.inner) if needs else []
            body = defs + [_stmt(s, loops, k) for s in stage]
            staged = None if last is None else staging.plan(k, stage, last, loops.groups[last][-1], block)
            if last is None:
                lines += ["      " + line for line in body]
            elif staged is not None:
                stmt = lambda s: _stmt(s, loops, k)  # noqa: E731
                lines += ["  " + x for x in staged.lines(stage, loops.offset, stmt, defs, _simd_clause(accs))]
            else:
                lines.append(f"      #pragma omp simd {_simd_clause(accs)}".rstrip())
                lines.append(f"      for (int64_t g{last} = lo; g{last} < hi; ++g{last}) {{")
                lines += ["        " + line for line in body]
                lines.append("      }")
        for a in accs:
            if _has_nan_flag(a):
                lines.append(f"      if ({a.var}_b_nan) {a.var}_b = NAN;")
            if split:
                lines.append(f"      {_part_ref(a, slot[a.var], items_p)} = {a.var}_b;")
            else:
                lines.append("      " + _combine(a, f"{a.var}_t", f"{a.var}_b"))
        lines.append("    }")
        if split and accs:
            lines.append("    #pragma omp barrier")
            lines.append(f"    for (int64_t it = 0; it < {items_p}; ++it) {{")
            for a in accs:
                lines.append("      " + _combine(a, f"{a.var}_t", _part_ref(a, slot[a.var], items_p)))
            lines.append("    }")
        lines += ["    " + _final_value(a) for a in accs]
    post = ["    " + _stmt(s, loops, k) for s in k.post]
    if split:
        # Every thread holds the row's results; one stores them. The barrier keeps a fast thread from
        # overwriting the shared item results of this row while another still combines them.
        lines += ["    if (af_tid == 0) {"] + ["  " + line for line in post] + ["    }"]
        if acc_stages:
            lines.append("    #pragma omp barrier")
    else:
        lines += post
    lines.append("  }")
    if split and acc_stages:
        lines += ["  #pragma omp single nowait", "  std::free(af_part);"]
    if k.row_buffers:
        lines += [f"  std::free({name});" for name, _ in k.row_buffers]
        lines.append("  }")
    lines.append("}")
    return lines


def _column_acc(s: Stmt, grouped: bool) -> str:
    """An accumulation into output element `af_c` of the column block: a float sum of a grouped stage
    into its current group (`_g`), anything else into the block's partial (`_b`)."""
    (v,) = s.args
    grouped = grouped and s.op == "sum" and s.dtype.is_float
    ref, flag = f"{s.var}{'_g' if grouped else '_b'}[af_c]", f"{s.var}_bn[af_c]"
    if s.dtype.is_float and s.op in ("amax", "amin"):
        return f"{_fold(s.op, ref, v)} {flag} |= ({v} != {v});"
    return _fold(s.op, ref, v, s.dtype)


def _column_stmt(s: Stmt, loops: _Loops, k: LoopKernel, cb: str, grouped: bool = False) -> str:
    """A statement inside a column block's simd loop; row buffers hold (reduced index, column) pairs."""
    if s.kind == "acc":
        return _column_acc(s, grouped)
    if s.kind == "rowstore":
        return f"{s.value}[af_jr * {cb} + af_c] = {s.var};"
    if s.kind == "rowload":
        return f"const {CTYPE[s.dtype]} {s.var} = {s.value}[af_jr * {cb} + af_c];"
    return _stmt(s, loops, k)


def _column_invariant(k: LoopKernel, stage: Sequence[Stmt], known: set[str], col: int) -> list[Stmt]:
    """The loads and float computes of a column stage that do not depend on the reduced dims (a layer
    norm's shift x[..., 0], mean + shift): the same value for every reduced element of a column, so
    computed once per column block into an array instead of once per reduced element. `known`: the
    earlier stages' results (per column). Such a load of an input walked across its contiguous dim (the
    channel 0 of an NHWC operand) is a gather per element; in ConvNeXt's residual + layer norm kernel
    one of its two gathers per element and stage. Integer ops stay in the loop (_row_invariant); a
    load unit-strided along the column dim `col` that no hoisted compute reads stays too (an array
    would only copy it)."""
    red = range(k.n_outer, len(k.space))
    out: list[Stmt] = []
    inv = set(known)
    for s in stage:
        if s.kind == "literal":
            inv.add(s.var)
            continue
        in_dt = s.attrs.get("in_dtype")
        load = s.kind == "load" and s.offset is not None and s.offset.is_affine
        if load and s.offset is not None and any(s.offset.coeff(d) for d in red):
            continue
        compute = (
            s.kind == "compute"
            and bool(s.args)
            and all(a in inv for a in s.args)
            and not s.dtype.is_int
            and not (in_dt is not None and in_dt.is_int)
        )
        if load or compute:
            out.append(s)
            inv.add(s.var)
    used = {a for s in out if s.kind == "compute" for a in s.args}
    return [s for s in out if s.kind == "compute" or s.var in used or _strided_along(s, col)]


def _strided_along(s: Stmt, dim: int) -> bool:
    return s.offset is not None and s.offset.coeff(dim) not in (0, 1)


def _column_body(k: LoopKernel, tile: Tile, loops: _Loops) -> list[str]:
    """A reduction kernel run as columns (kernel/tile.py says why and the accumulation order).

    Items are (other kept index, block of `cb` adjacent elements of the innermost kept loop `c`). Per
    item and stage, the reduced dims are walked as one flat index `af_jr` in blocks of `reduce_block`,
    each element a simd loop over the item's columns; a stage with a float sum keeps `reduce_lanes`
    accumulator rows per block (element j into row j mod lanes), folded pairwise, the block result is
    combined into the column's total in block order. With `tile.split_rows` every thread runs every
    item and takes a contiguous range of its blocks, stores their results in a shared array and, after
    a barrier, combines all of them in block order (as _reduction_body does for rows). Accumulated
    values of earlier stages are arrays `<acc>_f[cb]`, read per column."""
    split = tile.split_rows
    col = loops.outer[-1]
    others = loops.outer[:-1]
    n_col = loops.sizes[col]
    cbn = max(1, min(tile.inner_block, n_col))
    ncb = -(-n_col // cbn)
    rows = math.prod(loops.sizes[g] for g in others) * ncb
    n_red = math.prod(loops.sizes[g] for g in loops.inner)
    has_sum = any(_is_float_sum(a) for a in k.accumulators)
    lanes = tile.reduce_lanes if has_sum and n_red > tile.reduce_lanes else 0
    # a block's float sums: groups of `group` consecutive elements added in turn, the block's (at most
    # `lanes`) group sums added pairwise: the error of the rows' lanes (tile.py), in cb + 7 * cb floats
    group = tile.reduce_block // max(tile.reduce_lanes, 1)
    levels = max(tile.reduce_lanes, 1).bit_length() - 1
    if lanes & (lanes - 1) or group & (group - 1) or group * tile.reduce_lanes != tile.reduce_block:
        raise ValueError(
            f"reduce_lanes and reduce_block must be powers of two, got {lanes}, {tile.reduce_block}"
        )
    block = max(1, min(tile.reduce_block, n_red))
    nb = -(-n_red // block) if n_red else 0
    # the block width is a literal: the per-column arrays live on the stack and their loops have a
    # constant trip count (a last, partial block leaves its extra columns at the identity)
    cb, ncb_p, ncol_p = str(cbn), loops.p(ncb), loops.p(n_col)
    red_p, block_p, nb_p = loops.p(n_red), loops.p(block), loops.p(nb)
    needs = _needs_dims(k.all_stmts())
    accs_all = list(k.accumulators)
    lines = ["  {"]
    for name, dt in k.row_buffers:
        ct = CTYPE[dt]
        lines.append(f"  {ct}* __restrict {name} = ({ct}*)std::malloc(sizeof({ct}) * ({red_p} * {cb} + 1));")
    if split:
        lines += [
            "  int af_nt = 1, af_tid = 0;",
            "#ifdef _OPENMP",
            "  af_nt = omp_get_num_threads(); af_tid = omp_get_thread_num();",
            "#endif",
            "  char* af_part = nullptr;",
            "  #pragma omp single copyprivate(af_part)",
            f"  af_part = (char*)std::malloc(8 * {max(1, len(accs_all))} * {cb} * ({nb_p} + 1));",
            f"  for (int64_t x = 0; x < {loops.p(rows)}; ++x) {{",
        ]
    else:
        lines += [
            "  #pragma omp for schedule(static) nowait",
            f"  for (int64_t x = 0; x < {loops.p(rows)}; ++x) {{",
        ]
    lines.append(
        f"    const int64_t c_lo = (x % {ncb_p}) * {cb}, c_hi = std::min<int64_t>(c_lo + {cb}, {ncol_p});"
    )
    _split_index(loops, f"(x / {ncb_p})", others, lines, "    ")
    slot = {a.var: i for i, a in enumerate(accs_all)}

    def simd_over_columns(body: list[str], earlier: list[Any], head: list[str]) -> list[str]:
        reads = [f"const {_acc_type(a)} {a.var} = {a.var}_f[af_c];" for a in earlier]
        defs = loops.dim_defs(list(range(len(loops.groups)))) if needs else []
        return ["#pragma omp simd", f"for (int64_t g{col} = c_lo; g{col} < c_hi; ++g{col}) {{",
                f"  const int64_t af_c = g{col} - c_lo;", *("  " + x for x in head + reads + defs + body),
                "}"]  # fmt: skip

    def per_column(body: list[str]) -> list[str]:
        return ["#pragma omp simd", f"for (int64_t af_c = 0; af_c < {cb}; ++af_c) {{",
                *("  " + x for x in body), "}"]  # fmt: skip

    def reduced_index(var: str) -> list[str]:
        # The empty volatile asm keeps GCC's unroll-and-jam from fusing two reduced elements' column
        # loops into one it then leaves scalar (an amax over dim 0 ran 40x slower).
        out: list[str] = ['__asm__ __volatile__("");']
        rem = var
        for pos, g in enumerate(reversed(loops.inner)):
            last = pos == len(loops.inner) - 1  # the outermost reduced loop needs no modulo
            out.append(f"const int64_t g{g} = {rem if last else f'{rem} % {loops.p(loops.sizes[g])}'};")
            rem = f"({rem} / {loops.p(loops.sizes[g])})"
        return out

    def hoist(stage: Sequence[Stmt], earlier: list[Any]) -> tuple[list[str], list[str], list[Stmt]]:
        """The stage's column-invariant statements (_column_invariant) as a loop filling one array per
        value, the reads of those arrays for the stage's loop, and the statements left in it."""
        if needs:
            return [], [], list(stage)
        hoisted = _column_invariant(k, stage, {a.var for a in earlier}, loops.groups[col][-1])
        if not hoisted:
            return [], [], list(stage)
        lits = [s for s in stage if s.kind == "literal"]
        fill = [_stmt(s, loops, k) for s in lits + hoisted] + [
            f"af_h{s.var}[af_c] = {s.var};" for s in hoisted
        ]
        arrays = [f"{CTYPE[s.dtype]} af_h{s.var}[{cb}];" for s in hoisted]
        reads = [f"const {CTYPE[s.dtype]} {s.var} = af_h{s.var}[af_c];" for s in hoisted]
        rest = [s for s in stage if not any(s is h for h in hoisted)]
        return arrays + simd_over_columns(fill, earlier, []), reads, rest

    done: list[Any] = []
    for si, full_stage in enumerate(k.stages):
        accs = [a for a in k.accumulators if a.stage == si]
        pre, reads, stage = hoist(full_stage, done)
        body: list[str] = list(pre)
        # a thread's blocks: all of them, or with split its own range (its row buffers hold only those)
        lo_hi = (f"{nb_p} * af_tid / af_nt", f"{nb_p} * (af_tid + 1) / af_nt") if split else ("0", nb_p)
        blocks = [
            f"for (int64_t it = {lo_hi[0]}; it < {lo_hi[1]}; ++it) {{",
            f"  const int64_t jlo = it * {block_p}, jhi = std::min<int64_t>(jlo + {block_p}, {red_p});",
        ]
        if not accs:
            # a stage without accumulators (the final stores): one pass over the reduced elements
            inner = [_column_stmt(s, loops, k, cb) for s in stage]
            body += [*blocks, "  for (int64_t af_jr = jlo; af_jr < jhi; ++af_jr) {"]
            body += ["    " + x for x in reduced_index("af_jr") + simd_over_columns(inner, done, reads)]
            lines += ["    " + x for x in [*body, "  }", "}"]]
            continue
        lane = bool(lanes) and any(_is_float_sum(a) for a in accs)
        for a in accs:
            body.append(f"{_total_type(a)} {a.var}_t[{cb}];")
            body.append(f"{_acc_type(a)} {a.var}_f[{cb}];")
        body += per_column([f"{a.var}_t[af_c] = {_acc_init(a.op, a.dtype)};" for a in accs])
        body.append(blocks[0])
        item = [blocks[1].strip()]
        init = []
        for a in accs:
            ident = _acc_init(a.op, a.dtype)
            item.append(f"{_acc_type(a)} {a.var}_b[{cb}];")
            init.append(f"{a.var}_b[af_c] = {ident};")
            if _has_nan_flag(a):
                item.append(f"int {a.var}_bn[{cb}];")
                init.append(f"{a.var}_bn[af_c] = 0;")
        item += per_column(init)
        grouped = [a for a in accs if lane and _is_float_sum(a)]
        for a in grouped:
            item += [f"{_acc_type(a)} {a.var}_g[{cb}];", f"{_acc_type(a)} {a.var}_s[{levels + 1}][{cb}];"]
        item += per_column([f"{a.var}_g[af_c] = 0;" for a in grouped]) if grouped else []
        inner = [_column_stmt(s, loops, k, cb, bool(grouped)) for s in stage]
        item += ["for (int64_t af_jr = jlo; af_jr < jhi; ++af_jr) {"]
        item += ["  " + x for x in reduced_index("af_jr") + simd_over_columns(inner, done, reads)]
        if grouped:
            # a group of `group` elements is done: push it on the block's pairwise stack (a binary
            # counter: the n-th group meets the partial sums of the trailing one bits of n)
            carry = per_column([f"{a.var}_g[af_c] = {a.var}_s[af_l][af_c] + {a.var}_g[af_c];"
                                for a in grouped])  # fmt: skip
            store = per_column([f"{a.var}_s[af_l][af_c] = {a.var}_g[af_c]; {a.var}_g[af_c] = 0;"
                                for a in grouped])  # fmt: skip
            push = [f"if (((af_jr - jlo) & {group - 1}) == {group - 1} || af_jr + 1 == jhi) {{",
                    f"  const int64_t af_n = (af_jr - jlo) / {group};", "  int af_l = 0;",
                    "  for (; (af_n >> af_l) & 1; ++af_l) {", *("    " + x for x in carry), "  }",
                    *("  " + x for x in store), "}"]  # fmt: skip
            item += ["  " + x for x in push]
        item.append("}")
        if grouped:
            # the block's result: the stack's partial sums, largest first (one for a whole block)
            item += [f"const int64_t af_ng = (jhi - jlo + {group - 1}) / {group};",
                     f"for (int af_l = {levels}; af_l >= 0; --af_l) {{", "  if ((af_ng >> af_l) & 1) {",
                     *("    " + x for x in per_column([f"{a.var}_b[af_c] += {a.var}_s[af_l][af_c];"
                                                      for a in grouped])),
                     "  }", "}"]  # fmt: skip
        finish = []
        for a in accs:
            if _has_nan_flag(a):
                finish.append(f"if ({a.var}_bn[af_c]) {a.var}_b[af_c] = NAN;")
            if split:
                finish.append(f"{_column_part(a, slot[a.var], cb, nb_p)} = {a.var}_b[af_c];")
            else:
                finish.append(_combine(a, f"{a.var}_t[af_c]", f"{a.var}_b[af_c]"))
        item += per_column(finish)
        body += ["  " + x for x in item] + ["}"]
        if split:
            body.append("#pragma omp barrier")
            comb = [_combine(a, f"{a.var}_t[af_c]", _column_part(a, slot[a.var], cb, nb_p)) for a in accs]
            body += [
                f"for (int64_t it = 0; it < {nb_p}; ++it) {{",
                *("  " + x for x in per_column(comb)),
                "}",
            ]
            # the next stage or item overwrites the shared block results: every thread must have read them
            body.append("#pragma omp barrier")
        final = [_final_value(a).replace(f"{a.var}_t", f"{a.var}_t[af_c]").replace(
            f"const {_acc_type(a)} {a.var} =", f"{a.var}_f[af_c] =") for a in accs]  # fmt: skip
        body += per_column(final)
        lines += ["    " + x for x in body]
        done += accs
    post = [_column_stmt(s, loops, k, cb) for s in k.post]
    post_lines = simd_over_columns(post, done, []) if post else []
    if split:
        lines += ["    if (af_tid == 0) {"] + ["      " + x for x in post_lines] + ["    }"]
    else:
        lines += ["    " + x for x in post_lines]
    lines.append("  }")
    if split:
        lines += ["  #pragma omp single nowait", "  std::free(af_part);"]
    lines += [f"  std::free({name});" for name, _ in k.row_buffers]
    lines += ["  }", "}"]
    return lines


def _column_part(a: Any, slot: int, cb: str, n_blocks: str) -> str:
    """Block `it`'s result for column `af_c` of accumulator `a` in the team's shared array."""
    return f"(({_total_type(a)}*)(af_part + 8 * {cb} * {slot} * {n_blocks}))[it * {cb} + af_c]"


def parallel_pragma(threads: int = 0) -> str:
    """The line that opens a parallel region: OpenMP's default team, or `threads` threads
    (`Options.kernel_threads`; in the source, so a library is built per thread count)."""
    return "#pragma omp parallel" + (f" num_threads({threads})" if threads > 0 else "")


SHARED_MARK = "the same code as"  # in the comment over a kernel rendered as calls of another


def render_kernel(k: LoopKernel, tile: Tile, threads: int = 0) -> tuple[str, list[int]]:
    """C++ for one kernel (its body and the exported entry
    `extern "C" void <name>(char* const* bufs, const int64_t* P)`) and the values of P; `threads`:
    the entry's team size (0: OpenMP's default)."""
    body, params, work = _body(k, tile)
    entry = [
        f'extern "C" void {k.name}(char* const* bufs, const int64_t* __restrict P) {{',
        f"  if (P[{work}] > {PARALLEL_MIN}) {{",
        "    " + parallel_pragma(threads),
        f"    {k.name}_body(bufs, P);",
        "  } else {",
        f"    {k.name}_body(bufs, P);  // outside a parallel region: the calling thread alone",
        "  }",
        "}",
    ]
    return _with_param_locals(body, params) + "\n" + "\n".join(entry), params


def shared_kernel(name: str, same: str) -> str:
    """Kernel `name` (its body and its entry, as render_kernel makes them) as calls of kernel `same`,
    whose code is the same."""
    sig = "(char* const* bufs, const int64_t* __restrict P)"
    return (f"// {name}: {SHARED_MARK} {same}\n"
            f"static void {name}_body{sig} {{ {same}_body(bufs, P); }}\n"
            f'extern "C" void {name}{sig} {{ {same}(bufs, P); }}')  # fmt: skip


def _with_param_locals(lines: list[str], params: list[int]) -> str:
    """Copy P into locals at the top of the body: the compiler then keeps sizes in registers (and
    vectorises) instead of reloading them from memory through a pointer it cannot prove unaliased."""
    if params:
        lines.insert(1, "  const int64_t " + ", ".join(f"sz{i} = P[{i}]" for i in range(len(params))) + ";")
    return "\n".join(lines)


def math_header() -> str:
    return resources.files("autofusion.codegen.cpp").joinpath("af_math.h").read_text()


def render_unit(kernels: list[tuple[LoopKernel, Tile]], threads: int = 0) -> tuple[str, dict[str, list[int]]]:
    """One translation unit (includes, the math header inline so the source alone rebuilds it, the
    kernels) and each kernel's parameter values, by kernel name; `threads` as render_kernel's."""
    bodies, params = [], {}
    first: dict[str, str] = {}  # each kernel's code with its own name blanked -> the kernel that has it
    for k, t in kernels:
        text, values = render_kernel(k, t, threads)
        params[k.name] = values
        # Sizes are parameters, so a repeated layer's kernels render the same code under another name:
        # compiled once, the others call it (a kernel's code names no other kernel).
        same = first.setdefault(text.replace(k.name, "\0"), k.name)
        bodies.append(text if same == k.name else shared_kernel(k.name, same))
    # The F16C staging functions need <immintrin.h>, which costs g++ ~0.45 s to parse with -march=native
    # (ten times a plain kernel's whole compile): only units that stage fp16 values include it.
    staged = any("af_f16_load(" in b or "af_f16_store(" in b for b in bodies)
    head = ["// generated by autofusion; one translation unit per compiled graph",
            "#include <cstdint>", "#include <cmath>", "#include <cstdlib>", "#include <cstring>",
            "#include <algorithm>", "#include <limits>", "#ifdef _OPENMP", "#include <omp.h>", "#endif",
            *(["#define AF_F16_STAGED 1"] if staged else []), math_header()]  # fmt: skip
    return "\n".join(head + bodies) + "\n", params
