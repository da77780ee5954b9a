"""Library implementation `conv_act`: a convolution without BatchNorm (+ residual Add) (+ activation).

The `conv_*` rules of classify_rule.yaml make it. An ONNX export of an eval-mode CNN has no
BatchNorm left (torch.onnx.export folds it into the convolution's weight and bias), so its
convolutions are Conv (+ Add) (+ Relu/Clip): without this they stay a plain `conv` and a generated
kernel for the activation, so no two convolutions are adjacent and the layout pass
(`passes/layout.py`) never finds a chain worth moving to channels-last or to oneDNN's fused route.
As a `conv_bn_act` call with no BN tensors (mean = None: the runtime then skips the fold), the
activation and the residual become post-ops, and the graph reaches the same call, routes and
prepacked weights as the torch route's Conv + BatchNorm (+ act).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from autofusion.ir.analysis import value_types
from autofusion.ir.graph import Graph, Node
from autofusion.ir.targets import CONV_POST_OPS, RESIDUAL_POST_OPS
from autofusion.passes.rebuild import Emitter
from autofusion.passes.rewrite.post_ops import activation, residual

if TYPE_CHECKING:
    from autofusion.passes.rewrite.match import Match

TARGET = "autofusion_rules.conv_bn_act.default"  # library.py's NAMESPACE (it imports this module)


def _parts(m: Match) -> tuple[Node | None, Node | None, list[Node]]:
    conv, add = m.node_of("conv"), m.node_of("add")
    return conv, add, [n for n in m.nodes() if n not in (conv, add)]


def _act_of(acts: list[Node], src: int) -> str | None:
    """The post-op the activation nodes compute on value `src`: one activation node, or SiLU spelled
    as `src * sigmoid(src)` (how ONNX exports write it: opsets before 24 have no SiLU)."""
    if len(acts) <= 1:
        return activation(acts[0] if acts else None)
    if len(acts) == 2:
        sig, mul = sorted(acts, key=lambda n: n.op != "sigmoid")
        if sig.op == "sigmoid" and mul.op == "mul" and sig.inputs[0] == src \
                and sorted(mul.inputs) == sorted((src, sig.out.id)):  # fmt: skip
            return "silu"
    return None


def check(g: Graph, m: Match) -> str | None:
    conv, add, acts = _parts(m)
    if conv is None:
        return "the window has no conv"
    a = conv.attr_dict
    if a["transposed"]:
        return "a transposed convolution"
    if any(o != 0 for o in a["output_padding"]):
        return "output_padding is set"
    types = value_types(g)
    x, w, out = types[conv.inputs[0]], types[conv.inputs[1]], conv.out.type
    if not (x.dtype.is_float and x.dtype == w.dtype == out.dtype):
        return f"dtypes differ or are not float ({x.dtype.short}, {w.dtype.short})"
    bias = types[conv.inputs[2]] if a["has_bias"] else None
    if bias is not None and (bias.dtype != x.dtype or bias.shape != (w.shape[0],)):
        return "the bias is not one value per output channel of the convolution's dtype"
    if w.shape[0] != out.shape[1]:
        return "weight dim 0 is not the output channel dim"
    if add is not None:
        other = residual(add, conv.out.id)
        if other is None:
            return "the add does not take the conv output"
        if types[other].shape != out.shape or types[other].dtype != x.dtype:
            return "the residual does not have the conv output's shape and dtype"
    src = (add or conv).out.id
    act = _act_of(acts, src)
    if act not in CONV_POST_OPS:
        return "the activation is not relu, relu6 or silu (x * sigmoid(x) included)"
    if len(acts) == 1 and acts[0].inputs[0] != src:
        return "the activation does not read the convolution (or its residual add)"
    if add is not None and act not in RESIDUAL_POST_OPS:
        return "oneDNN's binary post-op is followed by relu or nothing here"
    return None


def emit(e: Emitter, g: Graph, m: Match) -> int:
    conv, add, acts = _parts(m)
    assert conv is not None
    other = residual(add, conv.out.id) if add is not None else None
    act = _act_of(acts, (add or conv).out.id) or "none"
    a = conv.attr_dict
    # conv_bn_act's tensors: x, w, b, then BN's mean, var, gamma, beta (absent: no fold), residual.
    tensors = [conv.inputs[0], conv.inputs[1], conv.inputs[2] if a["has_bias"] else None]
    tensors += [None, None, None, None, other]
    lits = (0.0, tuple(a["stride"]), tuple(a["padding"]), tuple(a["dilation"]), int(a["groups"]), act)
    args = [None if t is None else e.v(t) for t in tensors]
    name = f"conv_bn_act_{e.node.name}"
    return e.extern(TARGET, args, lits, m.final().out.type, reason="fusion rule", name=name)
