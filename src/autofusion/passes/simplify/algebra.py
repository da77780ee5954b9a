"""Algebraic simplification: drop operations that provably return their input unchanged.

In: a graph. Out: the graph where each rule below that applies has replaced a node by an existing
value or by one simpler node. A rule fires only when the replacement has exactly the node's type
(dtype and shape: `x * ones(4, 3)` broadcasts x and is kept) and gives bit-identical results for
every input, infinities, NaN and signed zeros included. So:

    x * 1, 1 * x, x / 1, x - 0, x + (-0.0)      -> x        (floats and ints)
    x + 0, 0 + x                                 -> x        (ints and bools only: -0.0 + 0.0 is +0.0)
    x ** 1                                       -> x
    x * 0                                        kept        (inf * 0 and nan * 0 are nan)
    neg(neg(x)), bitwise_not(bitwise_not(x))     -> x
    relu(relu x), abs(abs x), floor/ceil/round/trunc of themselves -> one of them
    abs(neg(x))                                  -> abs(x)
    cast(x, dtype of x)                          -> x
    cast(cast(x: A, B), C) with A -> B lossless  -> cast(x, C), or x when C is A
    reshape(reshape(x)), reshape to x's shape    -> one reshape, or x
    expand(expand(x)), expand to x's shape       -> one expand, or x
    slice over a whole dim with step 1           -> x
    where(c, a, a)                               -> a
Literals are `full` nodes; a literal operand counts when all of its elements hold the value.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from autofusion.ir.analysis import producer, value_types
from autofusion.ir.dtypes import DType
from autofusion.ir.graph import Graph, Node
from autofusion.passes.rebuild import Emitter, rebuild_if_changed

D = DType
# A -> B casts that represent every value of A exactly (so a later cast from B rounds once, as from A).
_LOSSLESS: dict[DType, frozenset[DType]] = {
    D.bool: frozenset(DType) - {D.bool},
    D.uint8: frozenset(
        {D.int16, D.int32, D.int64, D.uint16, D.uint32, D.uint64, D.float16, D.bfloat16, D.float32, D.float64}
    ),
    D.uint16: frozenset({D.int32, D.int64, D.uint32, D.uint64, D.float32, D.float64}),
    D.uint32: frozenset({D.int64, D.uint64, D.float64}),
    D.uint64: frozenset(),
    D.int8: frozenset({D.int16, D.int32, D.int64, D.float16, D.bfloat16, D.float32, D.float64}),
    D.int16: frozenset({D.int32, D.int64, D.float32, D.float64}),
    D.int32: frozenset({D.int64, D.float64}),
    D.int64: frozenset(),
    D.float16: frozenset({D.float32, D.float64}),
    D.bfloat16: frozenset({D.float32, D.float64}),
    D.float32: frozenset({D.float64}),
    D.float64: frozenset(),
}
IDEMPOTENT = frozenset({"relu", "abs", "floor", "ceil", "round", "trunc"})
INVOLUTIONS = frozenset({"neg", "bitwise_not"})


def lossless_cast(src: DType, dst: DType) -> bool:
    return dst in _LOSSLESS.get(src, frozenset())


def _literal(e: Emitter, vid: int) -> float | int | bool | None:
    node = e.producer(vid)
    if node is None or node.op != "full":
        return None
    value = node.attr("value")
    return value if isinstance(value, (bool, int, float)) else None


def _is(value: float | int | bool | None, target: float, negative_zero: bool | None = None) -> bool:
    if value is None or isinstance(value, bool) or value != target:
        return False
    if negative_zero is None:
        return True
    return math.copysign(1.0, float(value)) < 0 if negative_zero else math.copysign(1.0, float(value)) > 0


def _same_type(e: Emitter, vid: int, node: Node) -> bool:
    return e.type_of(vid).contiguous() == node.out.type.contiguous()


def _binary_identity(e: Emitter, node: Node, ins: list[int]) -> int | None:
    a, b = ins
    la, lb = _literal(e, a), _literal(e, b)
    is_float = node.out.type.dtype.is_float
    candidates: list[int] = []
    if node.op == "mul":
        candidates = [x for x, lit in ((a, lb), (b, la)) if _is(lit, 1)]
    elif node.op == "div" and node.attr("rounding_mode") is None:
        candidates = [a] if _is(lb, 1) else []
    elif node.op == "sub":
        candidates = [a] if _is(lb, 0, negative_zero=False if is_float else None) else []
    elif node.op == "add":
        # x + 0.0 maps -0.0 to +0.0; only x + (-0.0) is exact for floats.
        candidates = [
            x for x, lit in ((a, lb), (b, la)) if _is(lit, 0, negative_zero=True if is_float else None)
        ]
    elif node.op == "pow":
        candidates = [a] if _is(lb, 1) else []
    for x in candidates:
        if _same_type(e, x, node):
            return x
    return None


def _rewrite(e: Emitter, node: Node, ins: list[int]) -> Sequence[int] | None:
    op = node.op
    if op in ("mul", "div", "sub", "add", "pow"):
        x = _binary_identity(e, node, ins)
        return None if x is None else (x,)
    if len(node.outputs) != 1 or not ins:
        return None
    x = ins[0]
    inner = e.producer(x)
    if op in INVOLUTIONS and inner is not None and inner.op == op:
        return (inner.inputs[0],)
    if op in IDEMPOTENT and inner is not None and inner.op == op:
        return (x,)
    if op == "abs" and inner is not None and inner.op == "neg":
        return (e("abs", [inner.inputs[0]]),)
    if op == "cast":
        dst = node.attr("dtype")
        if e.type_of(x).dtype is dst:
            return (x,)
        if inner is not None and inner.op == "cast":
            src = e.type_of(inner.inputs[0]).dtype
            if lossless_cast(src, e.type_of(x).dtype):
                return (inner.inputs[0],) if src is dst else (e("cast", [inner.inputs[0]], {"dtype": dst}),)
        return None
    if op in ("reshape", "expand"):
        if e.type_of(x).shape == node.out.type.shape:
            return (x,)
        if inner is not None and inner.op == op:
            root = inner.inputs[0]
            if e.type_of(root).shape == node.out.type.shape:
                return (root,)
            return (e(op, [root], {"shape": node.out.type.shape}),)
        return None
    if op == "slice":
        shape = e.type_of(x).shape
        size = shape[node.attr("dim") % len(shape)]
        if node.attr("start") == 0 and node.attr("end") == size and node.attr("step") == 1:
            return (x,)
        return None
    if op == "where" and ins[1] == ins[2] and _same_type(e, ins[1], node):
        return (ins[1],)
    return None


def _candidates(graph: Graph) -> bool:
    """Cheap superset test on the original graph: some rule might fire (else skip the rebuild)."""
    made_by = producer(graph)
    types = value_types(graph)

    def producer_of(vid: int) -> Node | None:
        k = made_by.get(vid)
        return None if k is None else graph.nodes[k]

    def literal_01(vid: int) -> bool:
        p = producer_of(vid)
        v = p.attr("value") if p is not None and p.op == "full" else None
        return isinstance(v, (int, float)) and not isinstance(v, bool) and v in (0, 1)

    for n in graph.nodes:
        if len(n.outputs) != 1 or not n.inputs:
            continue
        inner = producer_of(n.inputs[0])
        same_shape = types[n.inputs[0]].shape == n.out.type.shape
        if n.op in ("mul", "div", "sub", "add", "pow") and any(literal_01(i) for i in n.inputs):
            return True
        if n.op in INVOLUTIONS | IDEMPOTENT and inner is not None and inner.op in (n.op, "neg"):
            return True
        if n.op == "cast" and (
            types[n.inputs[0]].dtype is n.attr("dtype") or (inner is not None and inner.op == "cast")
        ):
            return True
        if n.op in ("reshape", "expand", "slice") and (
            same_shape or (inner is not None and inner.op == n.op)
        ):
            return True
        if n.op == "where" and n.inputs[1] == n.inputs[2]:
            return True
    return False


def simplify(graph: Graph) -> Graph:
    return rebuild_if_changed(graph, _rewrite) if _candidates(graph) else graph
