"""`autofusion.compile("model.onnx")`: the compiled callable for ONNX models.

In: a path, a ModelProto or serialized bytes, optionally example inputs. Out: `CompiledOnnxModel`,
called with one tensor (torch or numpy) per graph input, in the graph's input order; it returns a
torch tensor, or a tuple of them when the graph has several outputs.

Shapes: a model whose inputs are all static is compiled at once. Symbolic or unknown input dims are
fixed from the tensors given (example inputs, or each call's inputs): every distinct set of input
shapes is converted and compiled once and cached, as for torch models. `.graph` and `.stats` describe
the most recently used shapes. The pipeline after conversion is the torch frontend's (`CompiledGraph`).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from typing import Any

import onnx
import torch
from torch.utils import _pytree as pytree

from autofusion.api import CompiledGraph, _as_tensor
from autofusion.config import Options
from autofusion.errors import InputMismatchError
from autofusion.frontend.onnx import (
    OnnxConversion,
    convert_model,
    fix_input_shapes,
    graph_inputs,
    input_dims,
    load_model,
)
from autofusion.frontend.onnx.context import dtype_of
from autofusion.frontend.torch.capture import Captured
from autofusion.frontend.torch.fx_to_ir import Conversion
from autofusion.ir.graph import Graph
from autofusion.passes.rewrite import settle_options

OnnxSource = str | os.PathLike[str] | onnx.ModelProto | bytes
_ShapeKey = tuple[tuple[tuple[int, ...], torch.dtype], ...]


def is_onnx_source(model: Any) -> bool:
    return isinstance(model, (str, os.PathLike, onnx.ModelProto, bytes))


def captured_from(conv: OnnxConversion) -> Captured:
    """The ONNX conversion in the shape `CompiledGraph` runs: every graph input is a user input."""
    n = len(conv.graph.outputs)
    conversion = Conversion(
        conv.graph, list(conv.input_names), [("value", i) for i in range(n)], conv.lowered, conv.fallbacks
    )
    spec = pytree.tree_flatten(0 if n == 1 else tuple(range(n)))[1]
    return Captured(conversion, [("user", i) for i in range(len(conv.input_names))], spec, "onnx")


class CompiledOnnxModel:
    """The callable `autofusion.compile` returns for an ONNX model."""

    def __init__(
        self, source: OnnxSource, options: Options, example_inputs: Sequence[Any] | None = None
    ) -> None:
        self.options = settle_options(options)
        self.model, self.label = load_model(source)
        self._inputs = graph_inputs(self.model)
        self.input_names = [vi.name for vi in self._inputs]
        self._dtypes = [dtype_of(vi.type.tensor_type.elem_type, f"input {vi.name!r}") for vi in self._inputs]
        self._cache: dict[_ShapeKey, CompiledGraph] = {}
        self._last: CompiledGraph | None = None
        self._lock = threading.Lock()
        if example_inputs is not None:
            self._entry(self._tensors(example_inputs))
        else:
            static = self.input_shapes()
            if static is not None:
                self._compile(dict(zip(self.input_names, static, strict=True)), None)

    # -- introspection -------------------------------------------------------------------------
    @property
    def graph(self) -> Graph:
        if self._last is None:
            raise RuntimeError(f"{self.label} has dynamic input dims: call it once or pass example_inputs")
        return self._last.graph

    @property
    def compiled(self) -> CompiledGraph:
        """The compiled form for the most recent shapes (its `.program.plan` is what gets exported)."""
        if self._last is None:
            raise RuntimeError(f"{self.label} has dynamic input dims: call it once or pass example_inputs")
        return self._last

    @property
    def stats(self) -> dict[str, Any]:
        out = self._last.stats() if self._last is not None else {"ops": 0, "extern_calls": 0}
        out["signatures"] = len(self._cache)
        return out

    @property
    def events(self) -> list[dict[str, Any]]:
        """Every structured event of the most recent compile (autofusion.events), in order."""
        if self._last is not None and self._last.program is not None:
            return list(self._last.program.events)
        return []

    @property
    def decisions(self) -> list[dict[str, Any]]:
        """The fusion decisions (accepted and rejected, with NF code, rule and numbers), solver order."""
        return [e for e in self.events if e["event"] in ("fusion.candidate", "fusion.recompute")]

    def input_shapes(self) -> list[tuple[int, ...]] | None:
        """The static shape of each input, or None when some input dim is dynamic."""
        shapes: list[tuple[int, ...]] = []
        for vi in self._inputs:
            dims = [d for d in input_dims(vi) if isinstance(d, int)]
            if not vi.type.tensor_type.HasField("shape") or len(dims) != len(input_dims(vi)):
                return None
            shapes.append(tuple(dims))
        return shapes

    @property
    def input_dtypes(self) -> list[torch.dtype]:
        return [d.to_torch() for d in self._dtypes]

    # -- calling -------------------------------------------------------------------------------
    def _tensors(self, args: Sequence[Any]) -> list[torch.Tensor]:
        if len(args) != len(self._inputs):
            raise InputMismatchError(
                f"{self.label} takes {len(self._inputs)} input(s) "
                f"({', '.join(self.input_names)}), got {len(args)}"
            )
        tensors = [_as_tensor(x, i) for i, x in enumerate(args)]
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
        return tensors

    def _compile(self, shapes: dict[str, tuple[int, ...]], key: _ShapeKey | None) -> CompiledGraph:
        model = fix_input_shapes(self.model, shapes, self.label)
        entry = CompiledGraph(captured_from(convert_model(model, self.label)), self.options)
        if key is None:
            pairs = zip(self.input_names, self._dtypes, strict=True)
            key = tuple((shapes[n], dt.to_torch()) for n, dt in pairs)
        self._cache[key] = entry
        self._last = entry
        return entry

    def _entry(self, tensors: list[torch.Tensor]) -> CompiledGraph:
        key = tuple((tuple(t.shape), t.dtype) for t in tensors)
        entry = self._cache.get(key)
        if entry is None:
            shapes = {n: tuple(t.shape) for n, t in zip(self.input_names, tensors, strict=True)}
            entry = self._compile(shapes, key)
        self._last = entry
        return entry

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if kwargs:
            raise InputMismatchError(
                f"compiled models take positional tensors only; got keyword(s) {sorted(kwargs)}"
            )
        # Graphs are compiled for contiguous inputs (ONNX has no strides) and the cache is keyed by shape
        # and dtype, so a strided view is copied to the layout the kernels index.
        tensors = [t if t.is_contiguous() else t.contiguous() for t in self._tensors(args)]
        with self._lock:
            entry = self._entry(tensors)
        return entry.run(tensors)
