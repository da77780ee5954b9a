"""Pass `linear_post_op`: a linear on a weight followed by GELU, as one library call with the GELU as the
GEMM's post-op, where a measurement on this machine says it pays for that shape.

Matched (the linear's result read by nothing else, every intermediate read only inside the window):
    gelu(linear(x, w, b?))                                   the torch route (erf or tanh GELU)
    (y * (1 + erf(y / sqrt2))) * 0.5, y = linear(x, w) + b   the ONNX route's erf GELU as exported
        (also with 0.5 multiplied first, 1 / sqrt2 as a product, and either operand order)
where `w` is a 2-d weight (a parameter, a buffer or a constant: packed once per version) and `b` a
constant [n] bias. The window becomes `autofusion_rules.linear_act(x, w, b, None, None, act)`
(runtime/library.py), which runs oneDNN's linear with the GELU post-op (runtime/linear_post_op.py).

Whether a shape is taken is the `decide` callable's answer (the compiler passes runtime's measured,
cached `PostOpChooser`; without one the pass changes nothing): None to fuse, else why not, logged
with the linear's name. The unfused plan stays what it was (a library linear and a generated GELU
kernel, or a GEMM-epilogue kernel), so a shape where the fused call loses keeps it.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence

from autofusion.ir.analysis import uses
from autofusion.ir.dtypes import DType
from autofusion.ir.graph import Graph, InputRole, Node
from autofusion.ir.targets import RULES_NAMESPACE
from autofusion.passes.rebuild import Emitter, rebuild

log = logging.getLogger("autofusion.passes")

TARGET = f"{RULES_NAMESPACE}.linear_act.default"
# (m rows, k, n, dtype, act) -> None to fuse, else the reason not to.
Decide = Callable[[int, int, int, DType, str], str | None]


class _Graph:
    """What the matcher reads about `graph`: producers, readers, outputs, constants."""

    def __init__(self, graph: Graph) -> None:
        self.g = graph
        self.users = uses(graph)
        self.prod = {o.id: n for n in graph.nodes for o in n.outputs}
        self.outputs = set(graph.outputs)
        self.params = {gi.value.id for gi in graph.inputs if gi.role is not InputRole.USER}
        self.types = graph.value_types()

    def only_reader(self, vid: int) -> Node | None:
        readers = self.users.get(vid, ())
        if vid in self.outputs or len(readers) != 1:
            return None
        return self.g.nodes[readers[0]]

    def constant(self, vid: int) -> bool:
        p = self.prod.get(vid)
        return vid in self.params or (p is not None and p.op in ("const", "full"))

    def scalar(self, vid: int) -> float | None:
        p = self.prod.get(vid)
        if p is None or p.op != "full" or tuple(p.attr("shape")) != ():
            return None
        value = p.attr("value")
        return float(value) if isinstance(value, (int, float)) else None


def _other(node: Node, vid: int) -> int | None:
    """The input of binary `node` that is not `vid` (None when `node` does not read `vid` once)."""
    a, b = node.inputs
    return b if a == vid and b != vid else a if b == vid and a != vid else None


def _near(value: float | None, want: float) -> bool:
    return value is not None and math.isclose(value, want, rel_tol=1e-6)


def _erf_gelu(gr: _Graph, y: int) -> tuple[list[Node], Node] | None:
    """The nodes of an exported erf GELU of `y` (y * 0.5 * (1 + erf(y / sqrt2)), in its exporters'
    orders), and the last of them; None when `y`'s readers are not exactly that."""
    readers = [gr.g.nodes[u] for u in gr.users.get(y, ())]
    if y in gr.outputs or len(readers) != 2:
        return None
    scale = next((r for r in readers if (r.op == "div" and r.inputs[0] == y and _near(gr.scalar(r.inputs[1]),
                  math.sqrt(2.0))) or (r.op == "mul" and _near(gr.scalar(_other(r, y) or -1),
                  math.sqrt(0.5)))), None)  # fmt: skip
    if scale is None:
        return None
    times = next(r for r in readers if r is not scale)
    erf = gr.only_reader(scale.out.id)
    plus = gr.only_reader(erf.out.id) if erf is not None and erf.op == "erf" else None
    if plus is None or plus.op != "add" or not _near(gr.scalar(_other(plus, erf.out.id) or -1), 1.0):  # type: ignore[union-attr]
        return None
    if times.op != "mul":
        return None
    last = gr.only_reader(times.out.id)
    if last is None or last.op != "mul":
        return None
    if _other(times, y) == plus.out.id and _near(gr.scalar(_other(last, times.out.id) or -1), 0.5):
        pass  # (y * (1 + erf)) * 0.5
    elif _near(gr.scalar(_other(times, y) or -1), 0.5) and _other(last, times.out.id) == plus.out.id:
        pass  # (y * 0.5) * (1 + erf)
    else:
        return None
    if gr.only_reader(plus.out.id) is None:
        return None
    return [scale, erf, plus, times], last  # type: ignore[list-item]


def _window(gr: _Graph, lin: Node) -> tuple[list[Node], Node, int | None, str] | None:
    """The nodes after `lin` that the fused call replaces, the last of them, the bias, the act."""
    y = lin.out.id
    bias = lin.inputs[2] if lin.attr("has_bias") else None
    reader = gr.only_reader(y)
    if reader is not None and reader.op == "gelu":
        return [], reader, bias, "gelu_tanh" if reader.attr("approximate") == "tanh" else "gelu"
    if bias is None and reader is not None and reader.op == "add":
        b = _other(reader, y)
        n = lin.out.type.shape[-1]
        if (
            b is None
            or not gr.constant(b)
            or gr.types[b].shape != (n,)
            or gr.types[b].dtype != lin.out.type.dtype
        ):
            return None
        found = _erf_gelu(gr, reader.out.id)
        if found is not None:
            return [reader, *found[0]], found[1], b, "gelu"
    return None


def _candidate(gr: _Graph, lin: Node) -> str | None:
    """Why `lin` cannot take the fused call at all (before any measurement), or None."""
    x, w = gr.types[lin.inputs[0]], gr.types[lin.inputs[1]]
    if x.dtype not in (DType.float32, DType.bfloat16) or w.dtype != x.dtype:
        return f"{x.dtype.short} x {w.dtype.short} (the fused call takes fp32 and bf16)"
    if not all(isinstance(d, int) for d in (*x.shape, *w.shape)):
        return "symbolic sizes (the choice is measured per shape)"
    if not gr.constant(lin.inputs[1]) or w.rank != 2 or not w.is_contiguous:
        return "the weight is not a constant 2-d tensor (packed once per version)"
    if x.rank < 2 or not x.is_contiguous or x.numel == 0:
        return "x is not a dense matrix of rows"
    return None


def fuse_linear_post_ops(
    graph: Graph, decide: Decide | None = None, origin: list[int] | None = None
) -> Graph:
    """Pass `linear_post_op` (module doc); `origin` as passes/layout.choose_layouts takes it."""
    if decide is None or not any(n.op == "linear" for n in graph.nodes):
        return graph
    gr = _Graph(graph)
    plans: dict[int, tuple[Node, int | None, str]] = {}  # id(last node) -> (linear, bias, act)
    skipped: set[int] = set()  # id() of the nodes the fused call replaces, but the last
    for lin in graph.nodes:
        if lin.op != "linear":
            continue
        window = _window(gr, lin)
        if window is None:
            continue
        nodes, last, bias, act = window
        why = _candidate(gr, lin)
        if why is None:
            x = gr.types[lin.inputs[0]]
            k, n = x.shape[-1], lin.out.type.shape[-1]
            why = decide(x.numel // k, k, n, x.dtype, act)
        if why is not None:
            log.info("linear_post_op: %s + %s stays unfused: %s", lin.name, act, why)
            continue
        log.info("linear_post_op: %s + %s runs as one fused call", lin.name, act)
        plans[id(last)] = (lin, bias, act)
        skipped |= {id(lin), *(id(nd) for nd in nodes)}
    if not plans:
        return graph

    def rewrite(e: Emitter, node: Node, ins: list[int]) -> Sequence[int] | None:
        if id(node) in skipped:
            # Read only inside the window, whose last node computes everything: a placeholder no
            # node of the new graph reads.
            return [ins[0]] * len(node.outputs)
        found = plans.get(id(node))
        if found is None:
            return None
        lin, bias, act = found
        tensors: list[int | None] = [
            e.v(lin.inputs[0]),
            e.v(lin.inputs[1]),
            None if bias is None else e.v(bias),
        ]
        return (e.extern(TARGET, [*tensors, None, None], (act,), node.out.type,
                         reason="linear + GELU post-op", name=f"linear_act_{lin.name}"),)  # fmt: skip

    return rebuild(graph, rewrite, origin)
