"""Old nodes read at their own opset, kept out of `onnx.version_converter` (see `opset.py`).

`hold` swaps each such node in a model still at its old opset for a placeholder (the same node in the
`HELD_DOMAIN` domain, which the converter passes through untouched); after conversion `restore` writes
each placeholder as the opset-13 nodes that compute what the old node computed:
- Upsample (opsets 1-9; deprecated in 10): the converter writes a Resize with the default half-pixel
  coordinates, wrong for 'linear'. Upsample samples output index i at input i / scale, clamped
  ('asymmetric' in Resize's words) -> Resize(mode, coordinate_transformation_mode='asymmetric',
  nearest_mode='floor'), the scales as given (attribute or input).
- BatchNormalization with spatial=0 (opsets 1-8; the converter refuses it): statistics per activation
  (scale etc. of shape C x D1 x ...) -> Flatten(x, 1), BatchNormalization on the flat statistics,
  Reshape back to x's shape (what the opset-9 spec tells such models to do).
BatchNormalization at opsets 1-6 with is_test=0 (the default there) is training mode: statistics of the
batch, and running-statistics outputs. It is refused with a `ModelFileError` naming the node.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper, numpy_helper

from autofusion.errors import ModelFileError

HELD_DOMAIN = "autofusion.held"
_DEFAULT = ("", "ai.onnx")

Nodes = tuple[list[onnx.NodeProto], list[onnx.TensorProto]]  # nodes, and the initializers they add
Rewrite = Callable[[onnx.NodeProto, int, Callable[[str], str]], Nodes]


@dataclass
class Held:
    node: onnx.NodeProto  # the node as the model had it
    index: int  # its place in the original graph, for messages
    opset: int
    rewrite: Rewrite


def _attrs(node: onnx.NodeProto) -> dict[str, object]:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _where(label: str, node: onnx.NodeProto, k: int, opset: int) -> str:
    return f"{label}: node '{node.name or f'#{k}'}' ({node.op_type}, opset {opset})"


# -- Upsample ----------------------------------------------------------------------------------
def _upsample(node: onnx.NodeProto, opset: int, fresh: Callable[[str], str]) -> Nodes:
    a = _attrs(node)
    mode = a.get("mode", b"nearest")
    mode = mode.decode() if isinstance(mode, bytes) else str(mode)
    inits: list[onnx.TensorProto] = []
    if opset < 7:
        scales = [1.0, 1.0, float(a["height_scale"]), float(a["width_scale"])]  # type: ignore[arg-type]
    elif opset < 9:
        scales = [float(s) for s in a["scales"]]  # type: ignore[attr-defined]
    else:
        scales = []
    if scales:
        name = fresh(f"{node.name or node.output[0]}_scales")
        inits.append(numpy_helper.from_array(np.asarray(scales, dtype=np.float32), name))
        scales_in = name
    else:
        scales_in = node.input[1]
    extra = {"nearest_mode": "floor"} if mode == "nearest" else {}
    resize = helper.make_node(
        "Resize",
        [node.input[0], "", scales_in],
        [node.output[0]],
        name=node.name,
        mode="linear" if mode in ("linear", "bilinear") else mode,
        coordinate_transformation_mode="asymmetric",
        **extra,
    )
    return [resize], inits


def _check_upsample(node: onnx.NodeProto, k: int, opset: int, label: str) -> bool:
    mode = _attrs(node).get("mode", b"nearest")
    mode = mode.decode() if isinstance(mode, bytes) else str(mode)
    if mode not in ("nearest", "linear", "bilinear"):
        raise ModelFileError(f"{_where(label, node, k, opset)}: mode {mode!r} is not an Upsample mode")
    return True


# -- BatchNormalization ---------------------------------------------------------------------------
def _batch_norm_per_activation(node: onnx.NodeProto, opset: int, fresh: Callable[[str], str]) -> Nodes:
    a = _attrs(node)
    eps = float(a.get("epsilon", 1e-5))  # type: ignore[arg-type]
    base = node.name or node.output[0]
    flat_shape = fresh(f"{base}_flat_shape")
    inits = [numpy_helper.from_array(np.asarray([-1], dtype=np.int64), flat_shape)]
    x_flat, y_flat, x_shape = fresh(f"{base}_x_flat"), fresh(f"{base}_y_flat"), fresh(f"{base}_x_shape")
    nodes = [helper.make_node("Flatten", [node.input[0]], [x_flat], axis=1)]
    stats = []
    for name in node.input[1:5]:
        flat = fresh(f"{name}_flat")
        nodes.append(helper.make_node("Reshape", [name, flat_shape], [flat]))
        stats.append(flat)
    nodes.append(
        helper.make_node("BatchNormalization", [x_flat, *stats], [y_flat], name=node.name, epsilon=eps)
    )
    nodes.append(helper.make_node("Shape", [node.input[0]], [x_shape]))
    nodes.append(helper.make_node("Reshape", [y_flat, x_shape], [node.output[0]]))
    return nodes, inits


def _check_batch_norm(node: onnx.NodeProto, k: int, opset: int, label: str) -> bool:
    a = _attrs(node)
    if opset < 7 and not int(a.get("is_test", 0)):  # type: ignore[call-overload]
        raise ModelFileError(
            f"{_where(label, node, k, opset)}: is_test=0 is training mode (batch statistics); "
            "autofusion runs models in inference mode: export with is_test=1"
        )
    if opset >= 9 or int(a.get("spatial", 1)):  # type: ignore[call-overload]
        return False  # the converter writes it as the opset-13 node
    if any(o for o in node.output[1:]):
        raise ModelFileError(
            f"{_where(label, node, k, opset)}: its running-statistics outputs are read (training mode)"
        )
    return True


# Per op: (does this node need holding? raises for a variant nobody reads, the rewrite).
_READERS: dict[str, tuple[Callable[[onnx.NodeProto, int, int, str], bool], Rewrite]] = {
    "Upsample": (_check_upsample, _upsample),
    "BatchNormalization": (_check_batch_norm, _batch_norm_per_activation),
}


def hold(model: onnx.ModelProto, opset: int, label: str) -> dict[str, Held]:
    """Swap the nodes read here for placeholders, in place; the held nodes by placeholder name."""
    held: dict[str, Held] = {}
    for k, node in enumerate(model.graph.node):
        entry = _READERS.get(node.op_type) if node.domain in _DEFAULT else None
        if entry is None or not entry[0](node, k, opset, label):
            continue
        token = f"autofusion_held_{k}"
        original = onnx.NodeProto()
        original.CopyFrom(node)
        held[token] = Held(original, k, opset, entry[1])
        node.domain = HELD_DOMAIN
        node.name = token
    if held:
        model.opset_import.append(helper.make_opsetid(HELD_DOMAIN, 1))
    return held


def restore(model: onnx.ModelProto, held: dict[str, Held], label: str) -> None:
    """Write each placeholder in the converted `model` as its opset-13 nodes, in place."""
    if not held:
        return
    taken = {n for node in model.graph.node for n in (*node.input, *node.output)}
    taken |= {t.name for t in model.graph.initializer} | {i.name for i in model.graph.input}

    def fresh(base: str) -> str:
        name, k = base, 0
        while name in taken:
            k += 1
            name = f"{base}_{k}"
        taken.add(name)
        return name

    pending = dict(held)
    out: list[onnx.NodeProto] = []
    for node in model.graph.node:
        if node.domain != HELD_DOMAIN:
            out.append(node)
            continue
        h = pending.pop(node.name)
        nodes, inits = h.rewrite(h.node, h.opset, fresh)
        out.extend(nodes)
        model.graph.initializer.extend(inits)
    if pending:
        lost = next(iter(pending.values()))
        raise ModelFileError(f"{_where(label, lost.node, lost.index, lost.opset)}: lost in conversion")
    del model.graph.node[:]
    model.graph.node.extend(out)
    keep = [o for o in model.opset_import if o.domain != HELD_DOMAIN]
    del model.opset_import[:]
    model.opset_import.extend(keep)


def describe(held: dict[str, Held]) -> str:
    ops = sorted({h.node.op_type for h in held.values()})
    return f"{len(held)} node{'s' if len(held) != 1 else ''} ({', '.join(ops)})"
