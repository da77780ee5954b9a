"""Old nodes read at their own opset, kept out of `onnx.version_converter` (see `opset.py`).

`hold` swaps each such node in a model still at its old opset for a placeholder (the same node in the
`HELD_DOMAIN` domain, which the converter passes through untouched); after conversion `restore` writes
each placeholder as the opset-13 nodes that compute what the old node computed. The converter gets
these wrong or refuses them:
- Upsample (opsets 1-9): it writes a Resize with the default half-pixel coordinates, which moves every
  'linear' sample. Upsample samples output index i at input i / scale, clamped ('asymmetric' in
  Resize's words), nearest rounding down -> Resize(asymmetric, nearest_mode='floor'), the scales as
  given (attributes or input).
- Resize at opset 10 (the same sampling as Upsample): likewise. Nearest rounds down where the scale is
  >= 1 and up where it is < 1 (onnxruntime's opset-10 kernel); a scale known at import on both sides
  of 1 becomes two Resize nodes, one per rounding (nearest is separable).
- BatchNormalization with spatial=0 (opsets 1-8; it refuses it): statistics per activation (scale etc.
  of shape C x D1 x ...) -> Flatten(x, 1), BatchNormalization on the flat statistics, Reshape back to
  x's shape (what the opset-9 spec tells such models to do).
- Dropout at opsets 1-9 with its mask read: the mask has the input's type there and is bool from 10;
  it writes a bool mask where the graph says float -> Dropout-13 and a Cast of its mask.
- Cast at opsets 1-5 names its type as a string (it has no adapter) -> Cast with the type's number.
BatchNormalization at opsets 1-6 with is_test=0 (the default there) is training mode (statistics of
the batch): refused with a `ModelFileError` naming the node.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import helper, numpy_helper

from autofusion.errors import ModelFileError

HELD_DOMAIN = "autofusion.held"
_DEFAULT = ("", "ai.onnx")

Nodes = tuple[list[onnx.NodeProto], list[onnx.TensorProto]]  # nodes, and the initializers they add
Fresh = Callable[[str], str]  # a name no value of the model has yet
Rewrite = Callable[[Fresh], Nodes]


@dataclass
class Held:
    node: onnx.NodeProto  # the node as the model had it
    index: int  # its place in the original graph, for messages
    opset: int
    rewrite: Rewrite


@dataclass
class _Model:
    """What a check may look up in the model at its old opset: element types and constant values."""

    model: onnx.ModelProto
    _types: dict[str, int] | None = None
    _consts: dict[str, np.ndarray] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for t in (t for g in _graphs(self.model.graph) for t in g.initializer):
            self._consts[t.name] = numpy_helper.to_array(t)
        for n in (n for g in _graphs(self.model.graph) for n in g.node):
            if (
                n.op_type == "Constant"
                and n.domain in _DEFAULT
                and n.attribute
                and n.attribute[0].name == "value"
            ):
                self._consts[n.output[0]] = numpy_helper.to_array(n.attribute[0].t)

    def const(self, name: str) -> np.ndarray | None:
        return self._consts.get(name)

    def elem_type(self, name: str) -> int | None:
        if self._types is None:
            try:
                inferred = onnx.shape_inference.infer_shapes(self.model, strict_mode=False)
            except Exception:  # noqa: BLE001 - without inference only declared types are known
                inferred = self.model
            self._types = {}
            for g in _graphs(inferred.graph):
                for vi in [*g.value_info, *g.input, *g.output]:
                    if vi.type.HasField("tensor_type") and vi.type.tensor_type.elem_type:
                        self._types[vi.name] = vi.type.tensor_type.elem_type
                self._types.update({t.name: t.data_type for t in g.initializer})
        return self._types.get(name)


def _attrs(node: onnx.NodeProto) -> dict[str, object]:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _text(v: object, default: str) -> str:
    if v is None:
        return default
    return v.decode() if isinstance(v, bytes) else str(v)


def _where(label: str, node: onnx.NodeProto, k: int, opset: int) -> str:
    return f"{label}: node '{node.name or f'#{k}'}' ({node.op_type}, opset {opset})"


# -- Upsample, Resize-10 ---------------------------------------------------------------------------
def _resize(
    node: onnx.NodeProto, mode: str, scales: list[float] | None, scales_in: str, fresh: Fresh
) -> Nodes:
    """Resize-13 nodes sampling at i / scale: one, or one per nearest rounding (see the docstring)."""
    inits: list[onnx.TensorProto] = []
    base = node.name or node.output[0]

    def scales_input(values: list[float]) -> str:
        name = fresh(f"{base}_scales")
        inits.append(numpy_helper.from_array(np.asarray(values, dtype=np.float32), name))
        return name

    def make(x: str, y: str, s: str, rounding: str | None) -> onnx.NodeProto:
        extra = {"nearest_mode": rounding} if rounding else {}
        return helper.make_node(
            "Resize",
            [x, "", s],
            [y],
            name=node.name if y == node.output[0] else f"{node.name}_down" if node.name else "",
            mode=mode,
            coordinate_transformation_mode="asymmetric",
            **extra,
        )

    if mode != "nearest":
        return [
            make(node.input[0], node.output[0], scales_input(scales) if scales else scales_in, None)
        ], inits
    if scales is None or all(s >= 1 for s in scales):
        return [
            make(node.input[0], node.output[0], scales_input(scales) if scales else scales_in, "floor")
        ], inits
    if all(s <= 1 for s in scales):
        return [make(node.input[0], node.output[0], scales_input(scales), "ceil")], inits
    down = [s if s < 1 else 1.0 for s in scales]
    up = [s if s >= 1 else 1.0 for s in scales]
    mid = fresh(f"{base}_down")
    return [
        make(node.input[0], mid, scales_input(down), "ceil"),
        make(mid, node.output[0], scales_input(up), "floor"),
    ], inits


def _check_upsample(node: onnx.NodeProto, k: int, opset: int, label: str, m: _Model) -> Rewrite | None:
    a = _attrs(node)
    mode = _text(a.get("mode"), "nearest")
    if mode not in ("nearest", "linear", "bilinear"):
        raise ModelFileError(f"{_where(label, node, k, opset)}: mode {mode!r} is not an Upsample mode")
    mode = "linear" if mode == "bilinear" else mode
    if opset < 7:
        scales: list[float] | None = [1.0, 1.0, float(a["height_scale"]), float(a["width_scale"])]  # type: ignore[arg-type]
    elif opset < 9:
        scales = [float(s) for s in a["scales"]]  # type: ignore[attr-defined]
    else:
        c = m.const(node.input[1])
        # Computed at run time: Upsample scales are >= 1, so nearest rounds down.
        scales = None if c is None else [float(s) for s in np.asarray(c).reshape(-1)]
    return lambda fresh: _resize(node, mode, scales, node.input[1] if opset >= 9 else "", fresh)


def _check_resize10(node: onnx.NodeProto, k: int, opset: int, label: str, m: _Model) -> Rewrite | None:
    if opset != 10:
        return None
    mode = _text(_attrs(node).get("mode"), "nearest")
    c = m.const(node.input[1])
    scales = None if c is None else [float(s) for s in np.asarray(c).reshape(-1)]
    # Scales computed at run time: read as upsampling (nearest rounds down).
    return lambda fresh: _resize(node, mode, scales, node.input[1], fresh)


# -- BatchNormalization -------------------------------------------------------------------------------
def _batch_norm_per_activation(node: onnx.NodeProto, fresh: Fresh) -> Nodes:
    eps = float(_attrs(node).get("epsilon", 1e-5))  # type: ignore[arg-type]
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


def _check_batch_norm(node: onnx.NodeProto, k: int, opset: int, label: str, m: _Model) -> Rewrite | None:
    a = _attrs(node)
    if opset < 7 and not int(a.get("is_test", 0)):  # type: ignore[call-overload]
        raise ModelFileError(
            f"{_where(label, node, k, opset)}: is_test=0 is training mode (batch statistics); "
            "autofusion runs models in inference mode: export with is_test=1"
        )
    if opset >= 9 or int(a.get("spatial", 1)):  # type: ignore[call-overload]
        return None  # the converter writes it as the opset-13 node
    if any(o for o in node.output[1:]):
        raise ModelFileError(
            f"{_where(label, node, k, opset)}: its running-statistics outputs are read (training mode)"
        )
    return lambda fresh: _batch_norm_per_activation(node, fresh)


# -- Dropout ----------------------------------------------------------------------------------------------
def _check_dropout(node: onnx.NodeProto, k: int, opset: int, label: str, m: _Model) -> Rewrite | None:
    if opset >= 10 or len(node.output) < 2 or not node.output[1]:
        return None
    elem = m.elem_type(node.input[0])
    if elem is None:
        raise ModelFileError(f"{_where(label, node, k, opset)}: the type of its input (and mask) is unknown")

    def rewrite(fresh: Fresh) -> Nodes:
        mask = fresh(f"{node.output[1]}_bool")
        return [
            helper.make_node("Dropout", [node.input[0]], [node.output[0], mask], name=node.name),
            helper.make_node("Cast", [mask], [node.output[1]], to=elem),
        ], []

    return rewrite


# -- Cast ------------------------------------------------------------------------------------------------
def _check_cast(node: onnx.NodeProto, k: int, opset: int, label: str, m: _Model) -> Rewrite | None:
    to = _attrs(node).get("to")
    if opset >= 6 or not isinstance(to, bytes):
        return None
    elem = (
        onnx.TensorProto.DataType.Value(to.decode().upper()) if to.decode().upper() in _TYPE_NAMES else None
    )
    if elem is None:
        raise ModelFileError(f"{_where(label, node, k, opset)}: 'to' names no tensor type: {to.decode()!r}")
    return lambda fresh: (
        [helper.make_node("Cast", list(node.input), list(node.output), name=node.name, to=elem)],
        [],
    )


_TYPE_NAMES = set(onnx.TensorProto.DataType.keys())


# Per op: whether (and how) a node is read here; a check raises for a variant nobody reads.
_READERS: dict[str, Callable[[onnx.NodeProto, int, int, str, _Model], Rewrite | None]] = {
    "Upsample": _check_upsample,
    "Resize": _check_resize10,
    "BatchNormalization": _check_batch_norm,
    "Dropout": _check_dropout,
    "Cast": _check_cast,
}


def _graphs(graph: onnx.GraphProto) -> list[onnx.GraphProto]:
    """`graph` and every subgraph in it (If branches, Loop and Scan bodies), outermost first."""
    out = [graph]
    for node in graph.node:
        for a in node.attribute:
            subs = [a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)
            for g in subs:
                out.extend(_graphs(g))
    return out


def hold(model: onnx.ModelProto, opset: int, label: str) -> dict[str, Held]:
    """Swap the nodes read here (in subgraphs too) for placeholders, in place; the held nodes by
    placeholder name."""
    held: dict[str, Held] = {}
    looks = _Model(model)
    for graph in _graphs(model.graph):
        for k, node in enumerate(graph.node):
            check = _READERS.get(node.op_type) if node.domain in _DEFAULT else None
            if check is None:
                continue
            original = onnx.NodeProto()
            original.CopyFrom(node)
            rewrite = check(original, k, opset, label, looks)
            if rewrite is None:
                continue
            token = f"autofusion_held_{len(held)}"
            held[token] = Held(original, k, opset, rewrite)
            node.domain = HELD_DOMAIN
            node.name = token
    if held:
        model.opset_import.append(helper.make_opsetid(HELD_DOMAIN, 1))
    return held


def restore(model: onnx.ModelProto, held: dict[str, Held], label: str) -> None:
    """Write each placeholder in the converted `model` as its opset-13 nodes, in place."""
    if not held:
        return
    graphs = _graphs(model.graph)
    taken = {n for g in graphs for node in g.node for n in (*node.input, *node.output)}
    taken |= {t.name for g in graphs for t in g.initializer} | {i.name for g in graphs for i in g.input}

    def fresh(base: str) -> str:
        name, k = base, 0
        while name in taken:
            k += 1
            name = f"{base}_{k}"
        taken.add(name)
        return name

    pending = dict(held)
    for graph in graphs:
        if not any(n.domain == HELD_DOMAIN for n in graph.node):
            continue
        out: list[onnx.NodeProto] = []
        for node in graph.node:
            if node.domain != HELD_DOMAIN:
                out.append(node)
                continue
            h = pending.pop(node.name)
            nodes, inits = h.rewrite(fresh)
            out.extend(nodes)
            graph.initializer.extend(inits)
        del graph.node[:]
        graph.node.extend(out)
    if pending:
        lost = next(iter(pending.values()))
        raise ModelFileError(f"{_where(label, lost.node, lost.index, lost.opset)}: lost in conversion")
    keep = [o for o in model.opset_import if o.domain != HELD_DOMAIN]
    del model.opset_import[:]
    model.opset_import.extend(keep)


def describe(held: dict[str, Held]) -> str:
    ops = sorted({h.node.op_type for h in held.values()})
    return f"{len(held)} node{'s' if len(held) != 1 else ''} ({', '.join(ops)})"
