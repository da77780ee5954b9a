"""What the rules' library calls run after their GEMM or convolution: the activation one IR node is, as
the post-op name `ir/targets.POST_OPS_ONEDNN` lists (runtime/library.py runs them), and which input of
a residual add is the residual. One place for the conv rules (library.py's conv_bn_act, conv_act.py)
and the linear ones."""

from __future__ import annotations

from autofusion.ir.graph import Node


def activation(node: Node | None) -> str | None:
    """The post-op `node` computes ("none" for no node), or None when it is not one a call fuses."""
    if node is None:
        return "none"
    if node.op in ("relu", "silu"):
        return node.op
    if node.op == "gelu":
        return "gelu_tanh" if node.attr("approximate") == "tanh" else "gelu"
    if node.op == "clamp" and node.attr("min") in (0, 0.0) and node.attr("max") in (6, 6.0):
        return "relu6"
    return None


def residual(add: Node, main: int) -> int | None:
    """The input of `add` that is not value `main` (None when `add` does not read `main`)."""
    if add.inputs[0] == main:
        return add.inputs[1]
    return add.inputs[0] if add.inputs[1] == main else None
