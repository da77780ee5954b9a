"""Pass `channels_last_scale`: a per-channel scale between two channels-last convolutions stays
channels-last.

Squeeze-and-excitation (EfficientNet, MobileNetV3) multiplies a convolution's result by a per-channel
gate, `mul(x, s)` with x [N, C, H, W] and s [N or 1, C, 1, 1], and feeds the product to the next
convolution. After `channels_last` (passes/layout.py) routed both convolutions channels-last, x is an
NHWC buffer, but the mul is an ordinary node: fusion made it a kernel reading x across its strides and
writing a contiguous NCHW result (kernel outputs are contiguous), which the next convolution converted
back to NHWC. On EfficientNet-B0's ONNX export (blocked route forced, one thread) those 16 kernels took
2.3 ms of 18.4, against 0.57 ms for onnxruntime's Mul nodes. Here such a mul becomes torch's mul as an
extern call whose declared result is NHWC: torch keeps x's memory format, reads and writes
contiguously, and the next convolution takes the buffer as it is.

Taken only where every reader of the product is a convolution routed channels-last (a conv_bn_act
call whose route is not "aten") taking it as its input: there an NHWC product costs nothing more, and
nothing else sees a layout other than the one it was planned for.
"""

from __future__ import annotations

from collections.abc import Sequence

from autofusion.ir.analysis import uses
from autofusion.ir.graph import Arg, Graph, Node
from autofusion.ir.types import TensorType
from autofusion.passes.layout import CONV_TARGET
from autofusion.passes.rebuild import Emitter, rebuild

MUL_TARGET = "aten.mul.Tensor"


def _nhwc(t: TensorType) -> bool:
    if t.rank != 4:
        return False
    _, c, h, w = t.shape
    return t.strides == (h * w * c, 1, w * c, c) and not t.is_contiguous


def _channels_last_reader(node: Node, v: int) -> bool:
    """`node` is a conv_bn_act call routed channels-last that reads `v` only as its input."""
    if node.op != "extern" or node.attr("target") != CONV_TARGET:
        return False
    args = tuple(node.attr("args"))
    if len(args) < 16 or args[14] == "aten" or not isinstance(args[0], Arg):
        return False
    tensor_args = [a for a in args[:8] if isinstance(a, Arg)]
    return node.inputs[args[0].index] == v and sum(node.inputs[a.index] == v for a in tensor_args) == 1


def _scaled(node: Node, types: dict[int, TensorType]) -> int | None:
    """The position (0 or 1) of the NHWC activation of a per-channel scale `mul`, else None."""
    if node.op != "mul" or len(node.inputs) != 2:
        return None
    out = node.out.type
    for pos in (0, 1):
        x, s = types[node.inputs[pos]], types[node.inputs[1 - pos]]
        if not _nhwc(x) or x.shape != out.shape or x.dtype != out.dtype or s.dtype != out.dtype:
            continue
        n, c = x.shape[:2]
        if s.rank == 4 and s.shape[1] == c and s.shape[0] in (1, n) and s.shape[2:] == (1, 1):
            return pos
    return None


def keep_scales_channels_last(graph: Graph, origin: list[int] | None = None) -> Graph:
    """Pass `channels_last_scale` (module doc). `origin` as passes/layout.choose_layouts'."""
    types = graph.value_types()
    users = uses(graph)
    chosen: dict[int, int] = {}
    for node in graph.nodes:
        pos = _scaled(node, types)
        if pos is None:
            continue
        v = node.out.id
        readers = users.get(v, ())
        if v in graph.outputs or not readers:
            continue
        if all(_channels_last_reader(graph.nodes[u], v) for u in readers):
            chosen[id(node)] = pos
    if not chosen:
        return graph

    def rewrite(e: Emitter, node: Node, ins: list[int]) -> Sequence[int] | None:
        pos = chosen.get(id(node))
        if pos is None:
            return None
        x = e.type_of(ins[pos])
        out = TensorType(x.dtype, x.shape, x.strides)
        return (e.extern(MUL_TARGET, [ins[pos], ins[1 - pos]], (), out, reason="channels-last scale",
                         name=node.name),)  # fmt: skip

    return rebuild(graph, rewrite, origin)
