"""An ONNX model as a compiled model's `Source` (`autofusion.compile("model.onnx")`).

In: a path, a ModelProto or serialized bytes. Called with one tensor (torch or numpy) per graph input,
in the graph's input order; the compiled model returns a torch tensor, or a tuple of them when the graph
has several outputs.

Shapes: a model whose inputs are all static is compiled at once. Symbolic or unknown input dims take
their sizes from the tensors given (example inputs, or each call's inputs): the model is converted
once with those dims symbolic, and each new set of sizes instantiates that graph (`symbolic.py`; some
sizes are converted for themselves, as it says) and is planned and compiled once. ONNX has no
strides, so a strided view is copied to the layout the kernels index. There is no eager route: a
model that cannot be converted is an error.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import numpy as np
import onnx
import torch
from torch.utils import _pytree as pytree

from autofusion.errors import FrontendError, InputMismatchError
from autofusion.frontend.driver import Conversion
from autofusion.frontend.onnx.context import dtype_of
from autofusion.frontend.onnx.convert import convert_model
from autofusion.frontend.onnx.loader import fix_input_shapes, graph_inputs, input_dims, load_model
from autofusion.frontend.onnx.shape_inputs import MAX_VALUE_ELEMENTS, NeedsInputValues, value_inputs
from autofusion.frontend.onnx.symbolic import SymbolicSource, symbol_names
from autofusion.frontend.source import Captured, SignatureChanged, as_tensor, value_key
from autofusion.ir.graph import Graph

log = logging.getLogger("autofusion.frontend")

OnnxModel = str | os.PathLike[str] | onnx.ModelProto | bytes
# Per input: (shape, dtype), or (shape, dtype, value_key) for an input whose values the graph needs.
ShapeKey = tuple[tuple[Any, ...], ...]


def is_onnx_source(model: Any) -> bool:
    return isinstance(model, (str, os.PathLike, onnx.ModelProto, bytes))


def captured_from(conv: Conversion) -> Captured:
    """An ONNX conversion as a compiled graph runs it: every graph input is a user input, and one output
    is returned as a tensor, several as a tuple."""
    n = len(conv.graph.outputs)
    spec = pytree.tree_flatten(0 if n == 1 else tuple(range(n)))[1]
    return Captured(conv, [("user", i) for i in range(len(conv.input_names))], spec, "onnx")


class OnnxSource:
    """A checked ONNX model, converted once per set of input shapes."""

    def __init__(self, model: OnnxModel) -> None:
        self.model, self.label = load_model(model)
        self.name = self.label
        self._inputs = graph_inputs(self.model)
        self.input_names = [vi.name for vi in self._inputs]
        self._dtypes = [dtype_of(vi.type.tensor_type.elem_type, f"input {vi.name!r}") for vi in self._inputs]
        # The inputs whose values a shape depends on; grows when a conversion finds another (capture).
        self.valued: set[str] = value_inputs(self.model)
        # Symbolic input dims: converted once, instantiated per size (`symbolic.py`).
        self.symbolic = SymbolicSource(self.model, self.label) if symbol_names(self.model) else None

    @property
    def eager(self) -> Callable[..., Any] | None:
        return None

    @property
    def input_dtypes(self) -> list[torch.dtype]:
        return [d.to_torch() for d in self._dtypes]

    def input_shapes(self) -> list[tuple[int, ...]] | None:
        """The static shape of each input, or None when some input dim is dynamic."""
        shapes: list[tuple[int, ...]] = []
        for vi in self._inputs:
            dims = [d for d in input_dims(vi) if isinstance(d, int)]
            if not vi.type.tensor_type.HasField("shape") or len(dims) != len(input_dims(vi)):
                return None
            shapes.append(tuple(dims))
        return shapes

    def inputs(self, args: Sequence[Any]) -> list[torch.Tensor]:
        if len(args) != len(self._inputs):
            raise InputMismatchError(
                f"{self.label} takes {len(self._inputs)} input(s) "
                f"({', '.join(self.input_names)}), got {len(args)}"
            )
        tensors = [as_tensor(x, i) for i, x in enumerate(args)]
        for t, vi, dt in zip(tensors, self._inputs, self._dtypes, strict=True):
            got = f"a {str(t.dtype).removeprefix('torch.')} tensor of shape {tuple(t.shape)}"
            if t.dtype != dt.to_torch():
                raise InputMismatchError(f"input {vi.name!r} of {self.label} is {dt.short}, got {got}")
            dims = input_dims(vi)
            fits = len(dims) == t.dim() and all(
                not isinstance(d, int) or d == s for d, s in zip(dims, t.shape, strict=False)
            )
            if vi.type.tensor_type.HasField("shape") and not fits:
                declared = "[" + ", ".join("?" if d is None else str(d) for d in dims) + "]"
                raise InputMismatchError(f"input {vi.name!r} of {self.label} has shape {declared}, got {got}")
        # Graphs are compiled for contiguous inputs, keyed by shape and dtype (and the values of
        # the inputs that give shapes: `keyed`).
        return [t if t.is_contiguous() else t.contiguous() for t in tensors]

    def keyed(self, inputs: Sequence[torch.Tensor]) -> tuple[int, ...]:
        # One too large to read is keyed by shape only; its conversion then says why it cannot run.
        return tuple(
            i
            for i, (n, t) in enumerate(zip(self.input_names, inputs, strict=False))
            if n in self.valued and t.numel() <= MAX_VALUE_ELEMENTS
        )

    def signature(self, inputs: Sequence[torch.Tensor]) -> ShapeKey:
        keyed = self.keyed(inputs)
        return tuple(
            (tuple(t.shape), t.dtype, value_key(t)) if i in keyed else (tuple(t.shape), t.dtype)
            for i, t in enumerate(inputs)
        )

    def signature_text(self, signature: Hashable) -> str:
        assert isinstance(signature, tuple)
        parts = []
        for n, (s, d, *v) in zip(self.input_names, signature, strict=True):
            text = f"{str(d).removeprefix('torch.')}{list(s)}"
            if v:
                vals = [float.fromhex(x) if isinstance(x, str) else x for x in v[0]]
                text += f" {n}={vals}"
            parts.append(text)
        return ", ".join(parts)

    def initial_signature(self) -> ShapeKey | None:
        static = self.input_shapes()
        if static is None or self.valued:
            return None  # dynamic dims, or values only the call gives
        return tuple((s, dt.to_torch()) for s, dt in zip(static, self._dtypes, strict=True))

    def capture(self, inputs: Sequence[torch.Tensor] | None, signature: Hashable) -> Captured:
        assert isinstance(signature, tuple)
        shapes = {n: entry[0] for n, entry in zip(self.input_names, signature, strict=True)}
        known = {
            n: _array(entry[2], entry[0], entry[1])
            for n, entry in zip(self.input_names, signature, strict=True)
            if len(entry) == 3
        }
        try:
            if self.symbolic is not None and not self.valued:
                conv = self.symbolic.conversion(shapes, lambda: self._convert(shapes, known))
            else:
                conv = self._convert(shapes, known)
        except NeedsInputValues as e:
            fresh = set(e.names) - self.valued
            if not fresh:  # they were bound: the walk never asks for those again
                raise FrontendError(f"{self.label}: {e}, but they were given") from None
            self.valued |= fresh
            log.info("%s: the values of input(s) %s give shapes: read at each call and compiled per value",
                     self.label, ", ".join(sorted(fresh)))  # fmt: skip
            raise SignatureChanged(str(e)) from None
        return captured_from(conv)

    def _convert(self, shapes: dict[str, Any], known: dict[str, np.ndarray]) -> Conversion:
        return convert_model(fix_input_shapes(self.model, shapes, self.label), self.label, known)

    def symbolic_graph(self) -> Graph | None:
        """The graph converted with symbolic dims (sizes are `ir.symbolic.SymInt`s holding the hints;
        what an export with dynamic axes writes), or None when the model has none or it is off."""
        sym = self.symbolic
        if sym is None or sym.off is not None or sym.template is None:
            return None
        return sym.template.graph

    def symbolic_capture(self) -> tuple[Graph, dict[str, int]] | None:
        """The symbolic graph the last capture instantiated and the symbols' sizes it took, or None when
        that capture was converted for its own sizes (a plan of the symbolic graph serves every size
        it instantiates: `autofusion.reuse`)."""
        sym = self.symbolic
        if sym is None or sym.last_env is None or sym.template is None:
            return None
        return sym.template.graph, dict(sym.last_env)

    def source_stats(self) -> dict[str, Any]:
        """What the compiled model's stats add for this source: how symbolic dims were handled."""
        return {} if self.symbolic is None else self.symbolic.stats()

    def capture_inputs(self, inputs: Sequence[torch.Tensor]) -> Captured:
        """The graph for these inputs, whatever their values say (`capture` with its signature)."""
        for _ in range(len(self.input_names) + 1):
            try:
                return self.capture(inputs, self.signature(inputs))
            except SignatureChanged:
                continue
        raise FrontendError(f"{self.label}: the inputs whose values give shapes kept changing")

    def eager_reason(self, inputs: Sequence[torch.Tensor]) -> str | None:
        return None  # the compiled graph computes without autograd history, as onnxruntime does

    def accepted(self, inputs: Sequence[torch.Tensor]) -> None:
        return None

    def caution(self) -> str | None:
        return None

    def not_compiled(self) -> str:
        if self.valued and self.input_shapes() is not None:
            names = ", ".join(n for n in self.input_names if n in self.valued)
            return (
                f"{self.label} is compiled for the values of input(s) {names}: "
                "call it once or pass example_inputs"
            )
        return f"{self.label} has dynamic input dims: call it once or pass example_inputs"


def _array(key: tuple[Any, ...], shape: tuple[int, ...], dtype: torch.dtype) -> np.ndarray:
    """The values of a signature's `value_key`, as the array the conversion binds."""
    values = [float.fromhex(v) if isinstance(v, str) else v for v in key]
    return np.array(values, dtype=torch.empty(0, dtype=dtype).numpy().dtype).reshape(shape)
