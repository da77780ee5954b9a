"""Op steps with their per-call Python work done once: the executor's fast path for library calls.

In: one node a plan runs through torch (an `extern`, such as a routed convolution, or a `conv`) and
the graph's value types. Out: a call taking the node's input tensors and returning its one output,
or None where the reference runtime's general path must run it (`ir.interpret.run_node`).
`any_call` adds every other one-output op on plain dtypes (its reference implementation called
directly), for the torch steps before a SuperKernel entry (runtime/super_executor.py's fast path).

Why: `run_node` resolves the extern's target, fills its argument template, checks for wide unsigned
dtypes and flattens the result with pytree on every call - about 7 us per step on the 2-core
development VM (under load), against ~25 us for a small oneDNN convolution itself; MobileNetV2 and
EfficientNet run 50-110 such steps per call. Here the target and the argument positions are fixed
when the plan is loaded; the values are those run_node computes (the same function is called with
the same arguments). A call that raises is run once more through run_node, which names the node in
its error.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from autofusion.ir.graph import Arg, Graph, Node
from autofusion.ir.interpret import IMPLS, resolve_target, run_node
from autofusion.ir.types import TensorType
from autofusion.ir.unsigned import _WIDE_DTYPES

Call = Callable[[list[torch.Tensor]], torch.Tensor]


def _plain_dtypes(node: Node, types: dict[int, TensorType]) -> bool:
    """No wide unsigned dtype in or out (run_node emulates those through `ir.unsigned`)."""
    return not any(types[v].dtype in _WIDE_DTYPES for v in node.inputs) and not any(
        v.type.dtype in _WIDE_DTYPES for v in node.outputs
    )


def fast_call(node: Node, graph: Graph, types: dict[int, TensorType]) -> Call | None:
    if len(node.outputs) != 1 or not _plain_dtypes(node, types):
        return None
    if node.op == "extern":
        return _extern_call(node, graph)
    if node.op == "conv":
        return _conv_call(node, graph)
    return None


def any_call(node: Node, graph: Graph, types: dict[int, TensorType]) -> Call | None:
    """`fast_call`, else the op's reference implementation called directly (what run_node calls once
    it has ruled out wide unsigned dtypes, here ruled out once): for the torch steps a SuperKernel
    executor's fast path runs before its entry (a decode step's embedding gather). None: a node of
    several outputs or wide unsigned dtypes."""
    fast = fast_call(node, graph, types)
    if fast is not None or len(node.outputs) != 1 or not _plain_dtypes(node, types):
        return fast
    impl = IMPLS[node.op]

    def call(xs: list[torch.Tensor]) -> torch.Tensor:
        try:
            out = impl(node, xs, graph)
        except Exception:  # noqa: BLE001 - run again through run_node, which names the node
            return run_node(node, xs, graph)[0]
        return out[0] if isinstance(out, tuple) else out

    return call


def _extern_call(node: Node, graph: Graph) -> Call | None:
    if node.attr("kwargs"):
        return None
    template = tuple(node.attr("args"))
    # Only a flat template (tensors and literals side by side, as the library rules and most ATen
    # externs write it); nested ones take the general path.
    if any(isinstance(a, (tuple, list)) and any(isinstance(b, Arg) for b in a) for a in template):
        return None
    fn = resolve_target(node.attr("target"))
    slots = [(k, a.index) for k, a in enumerate(template) if isinstance(a, Arg)]
    base: list[Any] = list(template)

    def call(xs: list[torch.Tensor]) -> torch.Tensor:
        args = base.copy()
        for k, i in slots:
            args[k] = xs[i]
        try:
            out = fn(*args)
        except Exception:  # noqa: BLE001 - run again through run_node, which names the node
            return run_node(node, xs, graph)[0]
        if isinstance(out, torch.Tensor):
            return out
        leaves = [t for t in torch.utils._pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]
        if len(leaves) != 1:
            return run_node(node, xs, graph)[0]  # not one tensor: the general path says what it is
        return leaves[0]

    return call


def _conv_call(node: Node, graph: Graph) -> Call | None:
    a = node.attr_dict
    if a.get("channels_last"):
        return None
    has_bias = bool(a["has_bias"])
    stride, padding, dilation = list(a["stride"]), list(a["padding"]), list(a["dilation"])
    transposed, output_padding, groups = bool(a["transposed"]), list(a["output_padding"]), int(a["groups"])

    def call(xs: list[torch.Tensor]) -> torch.Tensor:
        try:
            return torch.convolution(xs[0], xs[1], xs[2] if has_bias else None, stride, padding, dilation,
                                     transposed, output_padding, groups)  # fmt: skip
        except Exception:  # noqa: BLE001 - run again through run_node, which names the node
            return run_node(node, xs, graph)[0]

    return call
