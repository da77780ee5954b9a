"""Read and check an ONNX model before conversion: file or ModelProto in, a checked ModelProto out.

What is checked here, each failure a `ModelFileError` that names the file (and the tensor or node):
- the bytes parse as a ModelProto (a truncated or corrupt file does not);
- the default-domain opset is 13 or newer;
- every external-data file exists and holds the bytes the tensor says it has;
- the graph is well formed: onnx.checker (ops without a schema excepted: those become externs or
  errors that name the node at conversion), every node input is defined before use.

Then `fix_input_shapes` replaces symbolic or unknown input dims by the sizes of the tensors the model
will be called with, and `infer_shapes` runs ONNX shape inference (with data propagation, so shape
computations such as Shape -> Gather -> Concat -> Reshape give static shapes downstream).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import onnx
from google.protobuf.message import DecodeError
from onnx import external_data_helper

from autofusion.errors import ModelFileError

log = logging.getLogger("autofusion.frontend")

MIN_OPSET = 13
DEFAULT_DOMAINS = ("", "ai.onnx")


def default_opset(model: onnx.ModelProto) -> int:
    for imp in model.opset_import:
        if imp.domain in DEFAULT_DOMAINS:
            return int(imp.version)
    return 0


def load_model(source: str | os.PathLike[str] | onnx.ModelProto | bytes) -> tuple[onnx.ModelProto, str]:
    """The checked model and a label for messages (the path, or '<ModelProto>')."""
    if isinstance(source, onnx.ModelProto):
        model, label, base = source, "<ModelProto>", None
    elif isinstance(source, bytes):
        model, label, base = _parse(source, "<bytes>"), "<bytes>", None
    else:
        path = Path(source)
        label = str(path)
        if not path.is_file():
            raise ModelFileError(f"{label}: no such file")
        model, base = _parse(path.read_bytes(), label), path.parent
    _check_opset(model, label)
    _load_external_data(model, label, base)
    _check_graph(model, label)
    return model, label


def _parse(data: bytes, label: str) -> onnx.ModelProto:
    model = onnx.ModelProto()
    try:
        model.ParseFromString(data)
    except (DecodeError, RuntimeError, ValueError) as e:
        raise ModelFileError(f"{label}: not a valid ONNX file (truncated or corrupt: {e})") from None
    if not model.HasField("graph") or (not model.graph.node and not model.graph.output):
        raise ModelFileError(f"{label}: not a valid ONNX file (no graph; truncated or not an ONNX model)")
    return model


def _check_opset(model: onnx.ModelProto, label: str) -> None:
    version = default_opset(model)
    if version == 0:
        raise ModelFileError(f"{label}: the model imports no default-domain opset (opset_import is empty)")
    if version < MIN_OPSET:
        raise ModelFileError(
            f"{label}: opset {version} is not supported; autofusion reads opset {MIN_OPSET} and newer. "
            f"Convert it first: onnx.version_converter.convert_version(model, 17)"
        )


def _load_external_data(model: onnx.ModelProto, label: str, base: Path | None) -> None:
    tensors = [
        t for t in external_data_helper._get_all_tensors(model) if external_data_helper.uses_external_data(t)
    ]
    if not tensors:
        return
    if base is None:
        raise ModelFileError(
            f"{label}: tensor {tensors[0].name!r} keeps its data in an external file; load the model "
            "from its "
            "path (autofusion.compile('model.onnx')) so the file can be found next to it"
        )
    for t in tensors:
        info = {e.key: e.value for e in t.external_data}
        location = info.get("location", "")
        file = (base / location).resolve()
        if not location or not file.is_file():
            raise ModelFileError(
                f"{label}: tensor {t.name!r} keeps its data in {location!r}, which does not exist "
                f"(looked in {base})"
            )
        need = int(info.get("offset", 0)) + int(info.get("length", 0))
        if file.stat().st_size < need:
            raise ModelFileError(
                f"{label}: external data file {location!r} for tensor {t.name!r} is shorter than "
                f"the {need} bytes it should hold (truncated?)"
            )
    try:
        external_data_helper.load_external_data_for_model(model, str(base))
    except (OSError, ValueError) as e:
        raise ModelFileError(f"{label}: reading external data failed: {e}") from None


def _check_graph(model: onnx.ModelProto, label: str) -> None:
    try:
        onnx.checker.check_model(model)
    except onnx.checker.ValidationError as e:
        text = str(e).strip()
        # An op without a schema is reported by the converter, which names the node and says
        # whether it can run it through torch; anything else is a broken file.
        if "No Op registered" not in text and "No opset import for domain" not in text:
            raise ModelFileError(f"{label}: the model is not valid ONNX: {text.splitlines()[0]}") from None
    if model.graph.sparse_initializer:
        name = model.graph.sparse_initializer[0].values.name
        raise ModelFileError(f"{label}: sparse initializer {name!r}: sparse tensors are not supported")
    defined = {i.name for i in model.graph.input} | {t.name for t in model.graph.initializer}
    for k, node in enumerate(model.graph.node):
        for name in node.input:
            if name and name not in defined:
                raise ModelFileError(
                    f"{label}: node {node_label(node, k)} reads {name!r}, which nothing defines "
                    "before it (a truncated or corrupt file?)"
                )
        defined.update(o for o in node.output if o)
    for out in model.graph.output:
        if out.name not in defined:
            raise ModelFileError(f"{label}: graph output {out.name!r} is not produced by any node")


def node_label(node: onnx.NodeProto, index: int) -> str:
    name = node.name or f"#{index}"
    domain = f"{node.domain}." if node.domain not in DEFAULT_DOMAINS else ""
    return f"'{name}' ({domain}{node.op_type})"


def graph_inputs(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    """The inputs a caller passes: graph inputs that are not initializers (old exporters list both)."""
    inits = {t.name for t in model.graph.initializer}
    return [i for i in model.graph.input if i.name not in inits]


def input_dims(vi: onnx.ValueInfoProto) -> list[int | str | None]:
    """Each dim as an int, the symbol's name, or None when unknown."""
    if not vi.type.HasField("tensor_type"):
        raise ModelFileError(f"input {vi.name!r} is not a tensor (sequences and maps are not supported)")
    tt = vi.type.tensor_type
    if not tt.HasField("shape"):
        return []  # rank unknown: the caller's tensor decides
    out: list[int | str | None] = []
    for d in tt.shape.dim:
        if d.HasField("dim_value"):
            out.append(int(d.dim_value))
        elif d.HasField("dim_param"):
            out.append(d.dim_param)
        else:
            out.append(None)
    return out


def is_static(vi: onnx.ValueInfoProto) -> bool:
    tt = vi.type.tensor_type
    return tt.HasField("shape") and all(isinstance(d, int) for d in input_dims(vi))


def fix_input_shapes(
    model: onnx.ModelProto, shapes: Mapping[str, Sequence[int]], label: str
) -> onnx.ModelProto:
    """A copy of `model` whose user inputs have the given static shapes (checked against the declared)."""
    fixed = onnx.ModelProto()
    fixed.CopyFrom(model)
    by_name = {vi.name: vi for vi in graph_inputs(fixed)}
    for name, shape in shapes.items():
        vi = by_name[name]
        declared = input_dims(vi)
        tt = vi.type.tensor_type
        if tt.HasField("shape") and len(declared) != len(shape):
            raise ModelFileError(
                f"{label}: input {name!r} has rank {len(declared)} but a tensor of shape "
                f"{tuple(shape)} was given"
            )
        for i, (d, s) in enumerate(zip(declared, shape, strict=False)):
            if isinstance(d, int) and d != s:
                raise ModelFileError(
                    f"{label}: input {name!r} has size {d} in dim {i} but a tensor of shape "
                    f"{tuple(shape)} was given"
                )
        tt.shape.Clear()
        for s in shape:
            tt.shape.dim.add().dim_value = int(s)
    # Value infos of intermediates may carry the old symbols; inference recomputes them.
    del fixed.graph.value_info[:]
    return fixed


def infer_shapes(model: onnx.ModelProto, label: str) -> onnx.ModelProto:
    """ONNX shape inference with data propagation; a failure only loses the cross-checks, so it is logged."""
    try:
        return onnx.shape_inference.infer_shapes(model, check_type=False, strict_mode=False, data_prop=True)
    except Exception as e:  # noqa: BLE001 - onnx raises several types here; conversion still works without it
        log.info(
            "%s: ONNX shape inference failed (%s); converting with our own shape rules only",
            label,
            str(e).splitlines()[0] if str(e) else type(e).__name__,
        )
        return model
