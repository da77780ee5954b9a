"""A model's default-domain opset brought to one the converters read, on load.

The converters read opsets `MIN_OPSET` to `NEWEST_READ` (each converter knows the forms its op took
over that range). A model outside it is converted with `onnx.version_converter`, logged at INFO with
both versions:
- older (any opset the installed onnx has adapters from, down to 1) -> `MIN_OPSET`, the smallest step;
- newer, up to what the installed onnx knows -> `NEWEST_READ`; where the converter cannot take it
  down, the model is read at its own opset (the converters name any node they cannot read);
- newer than the installed onnx knows -> a `ModelFileError`.

Some old nodes do not go through the converter: it refuses them or converts them wrongly (Upsample
'linear' becomes a half-pixel Resize, which moves every sample). `legacy.py` reads those at their own
opset: they are held out of the conversion as placeholders and then written as the opset-13 nodes
that compute the same thing. When the converter fails on an old model, the `ModelFileError` names the
node that stopped it, found by converting the nodes one by one.
"""

from __future__ import annotations

import logging

import onnx
from onnx import helper, version_converter

from autofusion.errors import ModelFileError
from autofusion.frontend.onnx import legacy

log = logging.getLogger("autofusion.frontend")

MIN_OPSET = 13
# The newest opset the converters are written against (onnx 1.23's); a newer installed onnx can
# read newer models, which are taken down to this one so no op's newer semantics go unnoticed.
NEWEST_READ = 28
DEFAULT_DOMAINS = ("", "ai.onnx")


def default_opset(model: onnx.ModelProto) -> int:
    for imp in model.opset_import:
        if imp.domain in DEFAULT_DOMAINS:
            return int(imp.version)
    return 0


def node_label(node: onnx.NodeProto, index: int) -> str:
    name = node.name or f"#{index}"
    domain = f"{node.domain}." if node.domain not in DEFAULT_DOMAINS else ""
    return f"'{name}' ({domain}{node.op_type})"


def newest_read() -> int:
    return min(NEWEST_READ, onnx.defs.onnx_opset_version())


def upgrade(model: onnx.ModelProto, label: str) -> onnx.ModelProto:
    """`model` itself when its opset is read as is, else a converted copy (see the module docstring)."""
    version = default_opset(model)
    if version == 0:
        if model.opset_import and not any(n.domain in DEFAULT_DOMAINS for n in model.graph.node):
            return model  # only other domains' ops (ai.onnx.ml...): the converters name each node
        raise ModelFileError(f"{label}: the model imports no default-domain opset (opset_import is empty)")
    newest = newest_read()
    if MIN_OPSET <= version <= newest:
        return model
    known = onnx.defs.onnx_opset_version()
    if version > known:
        raise ModelFileError(
            f"{label}: opset {version} is newer than the installed onnx {onnx.__version__} knows "
            f"(opset {known}); upgrade the onnx package or export the model at opset {known} or older"
        )
    target = MIN_OPSET if version < MIN_OPSET else newest
    work = onnx.ModelProto()
    work.CopyFrom(model)
    # Old files (IR < 4) list initializers among the inputs; the converter needs the IR the target
    # opset asks for, and a newer IR reads the same graph.
    work.ir_version = max(work.ir_version, helper.find_min_ir_version_for([helper.make_opsetid("", target)]))
    held = legacy.hold(work, version, label) if version < MIN_OPSET else {}
    # Some adapters need their inputs' shapes (Add's broadcast of opsets 1-6, Gemm's): give them what
    # inference knows. They are dropped again afterwards (some would be stale at the new opset; the
    # loaded model is inferred anew once its input shapes are fixed).
    try:
        work = onnx.shape_inference.infer_shapes(work, strict_mode=False)
    except Exception as e:  # noqa: BLE001 - the converter still runs; adapters needing shapes say so
        log.debug("%s: shape inference before conversion failed: %s", label, e)
    try:
        converted = version_converter.convert_version(work, target)
    except Exception as e:  # noqa: BLE001 - the converter raises ConvertError, RuntimeError, IndexError...
        where = _culprit(work, target, e)
        if version > newest:
            log.info(
                "%s: opset %d could not be converted to %d (%s); reading it at opset %d",
                label,
                version,
                target,
                where,
                version,
            )
            return model
        raise ModelFileError(
            f"{label}: opset {version} could not be converted to opset {target} "
            f"(onnx.version_converter): {where}"
        ) from None
    del converted.graph.value_info[:]
    legacy.restore(converted, held, label)
    converted.ir_version = max(converted.ir_version, work.ir_version)
    log.info(
        "%s: converted from opset %d to opset %d with onnx.version_converter%s",
        label,
        version,
        target,
        f" ({legacy.describe(held)} read at opset {version})" if held else "",
    )
    return converted


def _message(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[-1].strip() if text else type(e).__name__


def _culprit(model: onnx.ModelProto, target: int, error: BaseException) -> str:
    """Which node stops the conversion, and the converter's message.

    Its message names no node, so each node is converted alone (with the types inference gives its
    inputs and outputs, and the initializers it reads). A node whose message is the whole model's wins;
    else the first that fails alone."""
    whole = _message(error)
    version = default_opset(model)
    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False)
    except Exception:  # noqa: BLE001 - inference only adds types; the nodes are tried without them
        inferred = model
    types = {
        vi.name: vi for vi in [*inferred.graph.value_info, *inferred.graph.input, *inferred.graph.output]
    }
    inits = {t.name: t for t in model.graph.initializer}
    first: str | None = None
    for k, node in enumerate(model.graph.node):
        if node.domain not in DEFAULT_DOMAINS or any(
            a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute
        ):
            continue  # a subgraph reads outer names; alone it would fail for that, not for its op
        alone = _single_node_model(model, node, types, inits)
        try:
            version_converter.convert_version(alone, target)
        except Exception as e:  # noqa: BLE001 - any failure marks this node
            text = f"node {node_label(node, k)} at opset {version} stops it: {_message(e)}"
            if _message(e) == whole:
                return text
            first = first or text
    return first or f"{whole} (no single node fails to convert on its own)"


def _single_node_model(
    model: onnx.ModelProto,
    node: onnx.NodeProto,
    types: dict[str, onnx.ValueInfoProto],
    inits: dict[str, onnx.TensorProto],
) -> onnx.ModelProto:
    def vi(name: str) -> onnx.ValueInfoProto:
        if name in types:
            return types[name]
        if name in inits:
            t = inits[name]
            return helper.make_tensor_value_info(name, t.data_type, list(t.dims))
        return helper.make_empty_tensor_value_info(name)

    ins = [n for n in dict.fromkeys(node.input) if n]
    graph = helper.make_graph(
        [node],
        "alone",
        [vi(n) for n in ins],
        [vi(n) for n in node.output if n],
        initializer=[inits[n] for n in ins if n in inits],
    )
    alone = helper.make_model(graph, opset_imports=list(model.opset_import))
    alone.ir_version = model.ir_version
    return alone
