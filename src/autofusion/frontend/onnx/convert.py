"""ONNX graph -> IR graph.

In: a checked ModelProto whose user inputs have static shapes (see `loader.fix_input_shapes`), and
the values of the inputs the source binds at call time (`shape_inputs`: shapes, axes, pads given as
graph inputs), which are known values from the start: they stay graph inputs, but nothing reads them.
Out: a `Conversion` (`frontend/driver.py`, whose loop this module's walk feeds): a verified `Graph`
whose inputs are the model's user inputs in order, plus what was lowered and what fell back.

Per node, in order:
1. every input known at import (initializers, Constant, Shape of a static tensor, and what is computed
   from those) -> the node is evaluated at import with onnx's reference evaluator and its outputs
   become known values: shape computations never reach the IR;
2. a converter for the op -> IR nodes; its result is checked against ONNX shape inference;
3. otherwise (no converter, or the converter declined with a reason) -> an `extern` node running a
   torch implementation of the op (`fallback.py`), logged once per op and reason at INFO as
   `Fallback onnx.<Op>(<input types>) # reason: ...`; with no torch implementation either, a
   `FrontendError` names the node.
Known values become IR values only when a converter asks for them: uniform ones as `full` literals
(which fuse), others as `const` nodes holding the tensor (weights are named after their initializer).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import onnx
import onnx.printer
import torch
from onnx import numpy_helper
from onnx.reference import ReferenceEvaluator

from autofusion.errors import FrontendError, ModelFileError, UnsupportedOpError
from autofusion.frontend.driver import Conversion, Step, drive
from autofusion.frontend.onnx import (
    control,
    converters,  # noqa: F401  (registers converters)
    externs,  # noqa: F401  (registers the externs that are not ATen one-liners)
    recurrent,  # noqa: F401  (registers RNN, GRU, LSTM)
)
from autofusion.frontend.onnx.context import (
    ONNX_CONVERTERS,
    OnnxCtx,
    Val,
    array_type,
    dtype_of,
    numpy_dtype,
)
from autofusion.frontend.onnx.externs.reference import REASON as REFERENCE_REASON
from autofusion.frontend.onnx.externs.reference import reference_spec
from autofusion.frontend.onnx.fallback import FALLBACKS
from autofusion.frontend.onnx.fold_unique import fold_unique
from autofusion.frontend.onnx.loader import (
    DEFAULT_DOMAINS,
    default_opset,
    graph_inputs,
    infer_shapes,
    input_dims,
    node_label,
)
from autofusion.frontend.onnx.sequences import is_sequence
from autofusion.frontend.onnx.shape_inputs import MAX_VALUE_ELEMENTS, NeedsInputValues, Origins
from autofusion.frontend.onnx.symbolic_fold import fold_symbolic
from autofusion.frontend.torch.context import TV, py_value
from autofusion.ir.graph import Arg, GraphBuilder, InputRole
from autofusion.ir.interpret import fill_template, resolve_target
from autofusion.ir.types import TensorType

log = logging.getLogger("autofusion.frontend")

# Never evaluated at import: their outputs differ per run.
_NO_FOLD = {
    "RandomNormal",
    "RandomUniform",
    "RandomNormalLike",
    "RandomUniformLike",
    "Multinomial",
    "Bernoulli",
    "Dropout",
}


def op_label(node: onnx.NodeProto) -> str:
    return f"{'onnx' if node.domain in DEFAULT_DOMAINS else node.domain}.{node.op_type}"


def value_type(vi: onnx.ValueInfoProto) -> TensorType | None:
    """A value info's type when it is a tensor of static shape and a supported dtype, else None."""
    if not vi.type.HasField("tensor_type") or not vi.type.tensor_type.HasField("shape"):
        return None
    dims = input_dims(vi)
    ints = tuple(d for d in dims if isinstance(d, int))
    if len(ints) != len(dims):
        return None
    try:
        return TensorType(dtype_of(vi.type.tensor_type.elem_type, vi.name), ints)
    except ModelFileError:
        return None


def _safe_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_]", "_", name).strip("_") or "const"


def _with_opset(label: str, model: onnx.ModelProto, domain: str) -> str:
    """ "'n' (Op)" as "'n' (Op, opset 17)": the version of the op's definition the model uses (an op's
    inputs and attributes differ between opsets, so a refusal names it)."""
    names = DEFAULT_DOMAINS if domain in DEFAULT_DOMAINS else (domain,)
    version = next((int(i.version) for i in model.opset_import if i.domain in names), None)
    return label if version is None or not label.endswith(")") else f"{label[:-1]}, opset {version})"


class _Walk:
    """The ONNX graph as the driver walks it (`frontend.driver.Walk`)."""

    def __init__(self, model: onnx.ModelProto, label: str, known: Mapping[str, np.ndarray]) -> None:
        self.model = model
        self.label = label
        self.log = log
        self.opset = default_opset(model)
        self.builder = self.b = GraphBuilder(_safe_name(model.graph.name or "onnx_model"))
        self.env: dict[str, Val] = {}
        self._made: list[tuple[int, Val]] = []  # known values materialised, for rollback
        self.known = dict(known)
        self._origins: Origins | None = None
        inferred = infer_shapes(_with_initializers(model, self.known), label)
        self.expected: dict[str, TensorType] = {}
        for vi in list(inferred.graph.value_info) + list(inferred.graph.output):
            t = value_type(vi)
            if t is not None:
                self.expected[vi.name] = t

    # -- values --------------------------------------------------------------------------------
    def materialise(self, val: Val, name: str) -> TV:
        if val.tv is not None:
            return val.tv
        if is_sequence(val):
            raise UnsupportedOpError(f"{name!r} is a sequence, and autofusion's graphs hold tensors only")
        assert val.const is not None
        arr = np.asarray(val.const)
        t = val.type
        flat = arr.reshape(-1)
        if flat.size == 1 or (flat.size and bool(np.all(flat == flat[0]))):
            vid = self.b.add(
                "full",
                (),
                {"value": py_value(flat[0].item(), t.dtype), "dtype": t.dtype, "shape": t.shape},
                name=_safe_name(name),
            )
        else:
            arr = np.ascontiguousarray(arr).copy()
            if arr.dtype.char in "qQ" and arr.dtype.itemsize == 8:  # (u)longlong: (u)int64 by another name
                arr = arr.view(np.int64 if arr.dtype.kind == "i" else np.uint64)
            tensor = torch.from_numpy(arr)
            if tensor.dtype != t.dtype.to_torch():
                tensor = tensor.to(t.dtype.to_torch())
            vid = self.b.add_constant(_safe_name(name), tensor, t)
        val.tv = TV(vid, self.b.type_of(vid))
        self._made.append((vid, val))
        return val.tv

    def rollback(self, mark: tuple[int, int]) -> None:
        self.b.rollback(mark)
        keep = []
        for vid, val in self._made:
            if vid >= mark[1]:
                val.tv = None
            else:
                keep.append((vid, val))
        self._made = keep

    def _known(self, arr: Any, name: str) -> Val:
        arr = np.asarray(arr)
        sym = None
        if arr.dtype == object:  # sizes from symbolic dims (`symbolic_fold`): the hints, and the SymInts
            sym, arr = arr, np.array([int(x) for x in arr.reshape(-1)], dtype=np.int64).reshape(arr.shape)
        try:
            return Val(array_type(arr), const=arr, sym=sym)
        except UnsupportedOpError as e:
            raise FrontendError(f"{self.label}: value {name!r}: {e}") from None

    # -- graph ---------------------------------------------------------------------------------
    def begin(self) -> list[str]:
        names = []
        for vi in graph_inputs(self.model):
            dims = input_dims(vi)
            bad = [(i, d) for i, d in enumerate(dims) if not isinstance(d, int)]
            if bad or not vi.type.tensor_type.HasField("shape"):
                i, d = bad[0] if bad else (None, None)
                what = f"dim {i} is {'unknown' if d is None else repr(d)}" if bad else "its rank is unknown"
                raise ModelFileError(
                    f"{self.label}: input {vi.name!r}: {what}; give example inputs "
                    "(autofusion.compile(model, example_inputs)) to fix its shape"
                )
            ints = tuple(d for d in dims if isinstance(d, int))  # all of them: `bad` is empty
            t = TensorType(dtype_of(vi.type.tensor_type.elem_type, f"input {vi.name!r}"), ints)
            vid = self.b.add_input(t, vi.name, InputRole.USER)
            value = self.known.get(vi.name)
            if value is not None:  # bound at call time: a known value, the graph input is left unread
                assert tuple(value.shape) == t.shape, (vi.name, value.shape, t.shape)
                self.env[vi.name] = Val(t, const=value)
            else:
                self.env[vi.name] = Val(t, tv=TV(vid, t))
            names.append(vi.name)
        for init in self.model.graph.initializer:
            dtype = dtype_of(init.data_type, f"initializer {init.name!r}")
            arr = numpy_helper.to_array(init)
            if dtype.is_half and arr.dtype != np.float16:
                arr = arr.astype(np.float32)  # bfloat16: kept as fp32 at import, cast back when materialised
            self.env[init.name] = Val(TensorType(dtype, tuple(int(d) for d in init.dims)), const=arr)
        return names

    def nodes(self) -> Iterator[tuple[int, onnx.NodeProto]]:
        return iter(enumerate(self.model.graph.node))

    def plan(self, item: tuple[int, onnx.NodeProto]) -> Step[tuple[int, onnx.NodeProto]] | None:
        k, node = item
        label = op_label(node)
        ins = [self.env[n] if n else None for n in node.input]
        if (
            node.domain in DEFAULT_DOMAINS
            and node.op_type not in _NO_FOLD
            and node.op_type != "Constant"
            and any(v is not None for v in ins)
            and all(v is None or v.const is not None for v in ins)
            and self._foldable(node, ins)
        ):
            folded = self._fold(node, ins)
            if folded is not None:
                for name, arr in zip(node.output, folded, strict=False):
                    if name:
                        self.env[name] = self._known(arr, name)
                return None
        expected = tuple(self.expected.get(o) for o in node.output)
        base = _safe_name(node.name or node.op_type.lower())
        fn = self._converter(node)

        def lower() -> None:
            assert fn is not None
            loc = self._loc(k, node)
            ctx = OnnxCtx(self.b, node, ins, expected, self.opset, base, self.materialise, loc, self.origin,
                          self.env)  # fmt: skip
            self._store(node, self._check(fn(ctx), node, expected))

        def extern(reason: str) -> str:
            return self._extern(k, node, ins, expected, base, reason)

        return Step(label, None if fn is None else lower, "no converter", extern)

    def _foldable(self, node: onnx.NodeProto, ins: list[Val | None]) -> bool:
        """Whether a node whose inputs are all known is evaluated at import (the symbolic walk keeps
        nodes whose output size is symbolic in the graph: `symbolic.py`)."""
        return True

    def _converter(self, node: onnx.NodeProto) -> Any:
        return ONNX_CONVERTERS.get(node.op_type) if node.domain in DEFAULT_DOMAINS else None

    def origin(self, name: str) -> str:
        """What the run-time value `name` is computed from, for a converter that needs it at import:
        NeedsInputValues when graph inputs the source can bind determine it, else the reason as text."""
        if self._origins is None:
            self._origins = Origins(self.model)
        found = self._origins.of(name, False, lambda v: v in self.env and self.env[v].const is not None)
        if found is None:
            return " from data"
        big = sorted(n for n in found if self.env[n].type.numel > MAX_VALUE_ELEMENTS)
        if big:
            n = big[0]
            return (
                f" from input {n!r} ({self.env[n].type.numel} elements; autofusion reads at most "
                f"{MAX_VALUE_ELEMENTS} values of an input at call time)"
            )
        fresh = [n for n in found if n not in self.known]
        if fresh:
            raise NeedsInputValues(fresh)
        return ""

    def _loc(self, k: int, node: onnx.NodeProto) -> str:
        return f"{self.label} node {node_label(node, k)}"

    def _fold(self, node: onnx.NodeProto, ins: list[Val | None]) -> list[np.ndarray] | None:
        feeds = {n: v.const for n, v in zip(node.input, ins, strict=False) if n and v is not None}
        try:
            raw: Any
            if node.op_type == "Unique":
                raw = fold_unique(node, np.asarray(feeds[node.input[0]]))
            else:
                raw = ReferenceEvaluator(node, opsets={"": self.opset}).run(None, feeds)
            if any(isinstance(r, (list, tuple)) for r in raw):
                return None  # a sequence: frontend/onnx/sequences.py holds it as a list of values
            results = [np.asarray(r) for r in raw]
            # The evaluator is numpy: hold its results to the types ONNX inference gives, where it gives them.
            for k, name in enumerate(node.output[: len(results)]):
                want = self.expected.get(name)
                if want is None:
                    continue
                if tuple(results[k].shape) != want.shape:
                    return None
                if array_type(results[k]).dtype is not want.dtype:
                    results[k] = results[k].astype(numpy_dtype(want.dtype))
            if any(v is not None and v.sym is not None for v in ins):
                return fold_symbolic(node, ins, results)
            return results
        except Exception as e:  # noqa: BLE001 - not foldable here; the converter handles the node instead
            log.debug("could not evaluate %s at import: %s", node.op_type, e)
            return None

    def _check(self, result: Any, node: onnx.NodeProto, expected: tuple[TensorType | None, ...]) -> list[Any]:
        got = list(result) if isinstance(result, (list, tuple)) else [result]
        if len(got) < len([o for o in node.output if o]):
            got += [None] * (len(node.output) - len(got))
        for name, g, e in zip(node.output, got, expected, strict=False):
            if not name:
                continue
            if g is None:
                raise UnsupportedOpError(f"output {name!r} is not produced by the conversion")
            if is_sequence(g):
                continue
            # An object array holds sizes from symbolic dims (int64 values: `_known`).
            sym = isinstance(g, np.ndarray) and g.dtype == object
            t = g.type if isinstance(g, TV) else array_type(g.astype(np.int64) if sym else g)
            if e is not None and (t.shape != e.shape or t.dtype != e.dtype):
                raise UnsupportedOpError(f"converted to {t} but ONNX shape inference says {e}")
        return got

    def _store(self, node: onnx.NodeProto, results: list[Any]) -> None:
        for name, r in zip(node.output, results, strict=False):
            if not name:
                continue
            if is_sequence(r):
                self.env[name] = r
            else:
                self.env[name] = Val(r.type, tv=r) if isinstance(r, TV) else self._known(r, name)

    def _extern(
        self,
        k: int,
        node: onnx.NodeProto,
        ins: list[Val | None],
        expected: tuple[TensorType | None, ...],
        base: str,
        reason: str,
    ) -> str:
        where = f"{self.label}: node {_with_opset(node_label(node, k), self.model, node.domain)}"
        spec = FALLBACKS.get(node.op_type) if node.domain in DEFAULT_DOMAINS else None
        # onnx.reference is the last resort for ops we have nothing for, and for the declines listed in
        # REFERENCE_AFTER_DECLINE; any other converter's "no" (an invalid or random node, shapes we
        # cannot hold) stands.
        last_resort = reason == "no converter" or node.op_type in REFERENCE_AFTER_DECLINE
        if spec is None and last_resort and _reference_knows(node, self.model):
            spec, reason = reference_spec(self.model), f"{reason}; {REFERENCE_REASON}"
        if spec is None:
            raise FrontendError(
                f"{where} cannot be converted ({reason}) and has no torch implementation; "
                "autofusion cannot run this model"
            )
        ctx = OnnxCtx(
            self.b, node, ins, expected, self.opset, base, self.materialise, self._loc(k, node), self.origin
        )
        slots: dict[str, int] = {}
        tensors: list[TV] = []
        for name, v in zip(node.input, ins, strict=False):
            if v is not None and name not in slots:
                slots[name] = len(tensors)
                try:
                    tensors.append(self.materialise(v, name))
                except UnsupportedOpError as e:
                    raise FrontendError(f"{where} cannot be converted ({reason}): {e}") from None
        try:
            target, args, kwargs = spec(ctx, lambda i: Arg(slots[node.input[i]]))
        except UnsupportedOpError as e:
            raise FrontendError(
                f"{where} cannot be converted ({reason}) and its torch implementation does not take it: {e}"
            ) from None
        outs = [o for o in node.output]
        while outs and not outs[-1]:
            outs.pop()
        out_types = self._extern_types(where, target, args, kwargs, tensors, expected[: len(outs)])
        if len(out_types) < len(outs):
            raise FrontendError(
                f"{where}: the torch implementation {target} gives {len(out_types)} outputs, "
                f"the node asks for {len(outs)}"
            )
        text = self._node_text(node, slots)
        ids = self.b.add_node(
            "extern",
            [t.id for t in tensors],
            {
                "target": target,
                "args": tuple(args),
                "kwargs": tuple(sorted(kwargs.items())),
                "out_types": tuple(out_types),
                "reason": reason,
                "onnx": text,
            },
            name=base,
            loc=self._loc(k, node),
        )
        for name, vid in zip(node.output, ids, strict=False):
            if name:
                self.env[name] = Val(self.b.type_of(vid), tv=TV(vid, self.b.type_of(vid)))
        return ", ".join(str(t.type) for t in tensors)

    def _extern_types(
        self,
        where: str,
        target: str,
        args: Any,
        kwargs: dict[str, Any],
        tensors: list[TV],
        expected: tuple[TensorType | None, ...],
    ) -> list[TensorType]:
        # Typed by running the implementation on meta tensors (no data), then checked against ONNX inference.
        metas = [torch.empty(t.shape, dtype=t.dtype.to_torch(), device="meta") for t in tensors]
        try:
            out = resolve_target(target)(
                *fill_template(tuple(args), metas), **{k: fill_template(v, metas) for k, v in kwargs.items()}
            )
        except Exception as e:  # noqa: BLE001 - any failure here means we cannot type the extern
            raise FrontendError(
                f"{where}: its torch implementation {target} fails on these inputs: "
                f"{(str(e).strip().splitlines() or [type(e).__name__])[0]}"  # one line: torch's can be many
            ) from None
        leaves = [t for t in torch.utils._pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]
        types = [TensorType(dtype_of_torch(t.dtype), tuple(int(s) for s in t.shape)) for t in leaves]
        for k, (t, want) in enumerate(zip(types, expected, strict=False)):
            if want is not None and (t.shape != want.shape or t.dtype != want.dtype):
                raise FrontendError(
                    f"{where}: its torch implementation {target} gives {t} for output {k}, ONNX says {want}"
                )
        return types

    @staticmethod
    def _node_text(node: onnx.NodeProto, slots: dict[str, int]) -> str:
        """The node with inputs renamed in<i> (the extern's input slots) and outputs out<k>, as onnx text."""
        copy = onnx.NodeProto()
        copy.CopyFrom(node)
        copy.name = ""
        copy.doc_string = ""
        del copy.input[:]
        copy.input.extend(f"in{slots[n]}" if n else "" for n in node.input)
        del copy.output[:]
        copy.output.extend(f"out{k}" if n else "" for k, n in enumerate(node.output))
        return onnx.printer.to_text(copy).strip()

    def finish(self) -> tuple[list[int], list[tuple[str, Any]], list[str]]:
        ids, names = [], []
        for out in self.model.graph.output:
            val = self.env[out.name]
            if is_sequence(val):
                raise FrontendError(
                    f"{self.label}: graph output {out.name!r} is a sequence; autofusion's graphs return "
                    "tensors"
                )
            ids.append(self.materialise(val, out.name).id)
            names.append(out.name)
        return ids, [("value", i) for i in range(len(ids))], names


def dtype_of_torch(dt: torch.dtype) -> Any:
    from autofusion.ir.dtypes import DType

    return DType.from_torch(dt)


def _with_initializers(model: onnx.ModelProto, known: Mapping[str, np.ndarray]) -> onnx.ModelProto:
    """`model` with the bound inputs as initializers instead (for shape inference to see their values)."""
    if not known:
        return model
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    keep = [vi for vi in copy.graph.input if vi.name not in known]
    del copy.graph.input[:]
    copy.graph.input.extend(keep)
    copy.graph.initializer.extend(numpy_helper.from_array(np.asarray(v), n) for n, v in known.items())
    return copy


# Converters that decline these for a reason onnx.reference computes exactly: BatchNormalization in
# training mode (its batch statistics and running averages as outputs), NonZero (at its declared size).
REFERENCE_AFTER_DECLINE = frozenset({"BatchNormalization", "NonZero"})


def _reference_knows(node: onnx.NodeProto, model: onnx.ModelProto) -> bool:
    """Whether onnx.reference implements this node's op (its last resort: `externs/reference.py`)."""
    try:
        ReferenceEvaluator(node, opsets={imp.domain: int(imp.version) for imp in model.opset_import})
    except Exception:  # noqa: BLE001 - any refusal means: no reference implementation to fall back on
        return False
    return True


def convert_model(
    model: onnx.ModelProto, label: str, known: Mapping[str, np.ndarray] | None = None
) -> Conversion:
    """Convert a checked model whose user inputs are static (see the module docstring); `known` gives
    the values of the inputs bound at call time (NeedsInputValues when more are needed)."""
    return drive(_Walk(model, label, known or {}))


control.use_model_converter(convert_model)  # If branches and Loop/Scan bodies are models of their own


__all__ = ["Conversion", "convert_model", "numpy_dtype"]
