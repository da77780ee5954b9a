"""The plan half of a package: compiled signatures pickled, with tensors and model weights kept out.

In (save): the objects to keep (captured graphs, plans, SuperKernel plans, fold splits: plain immutable
dataclasses). Out: the pickle bytes, the tensors it refers to (saved apart, with `torch.save`, and read
back with `torch.load(weights_only=True)`), and the names of the model weights it reads live.

A tensor is stored once however often it is referenced (by identity), so views and shared constants
stay shared. A model parameter or buffer the plan reads on every call (`frontend.torch.capture.
LiveTensor`, or `loading.CopiedTensor` when a loaded model is saved again; recognised by class name
and attributes) is stored as its name; loading binds each name to the model given to `load` or to the
copied weights. `MappingProxyType` (the IR's read-only mappings) pickles as the dict it wraps. The
extern targets the pickled graphs call are collected on the way (`target_modules`: the modules whose
import registers the Python ones, which loading imports before it runs anything).

Pickle runs code named in the file when it loads: load only packages you made or trust, as with
`torch.load(weights_only=False)`.
"""

from __future__ import annotations

import gc
import io
import pickle
import types
import warnings
from collections.abc import Callable
from typing import Any

import torch

from autofusion.ir.graph import Node
from autofusion.ir.interpret import PY_TARGETS


def _mapping_proxy(d: dict[Any, Any]) -> types.MappingProxyType[Any, Any]:
    return types.MappingProxyType(d)


def _is_live(obj: Any) -> bool:
    """A model weight read by name: the capture's `LiveTensor`, or a loaded package's `CopiedTensor`
    (a loaded model saved again)."""
    return type(obj).__name__ in ("LiveTensor", "CopiedTensor") and hasattr(obj, "target") \
        and hasattr(obj, "store")  # fmt: skip


class _Pickler(pickle.Pickler):
    def __init__(self, file: io.BytesIO) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.tensors: list[torch.Tensor] = []
        self._index: dict[int, int] = {}
        self.live: dict[str, bool] = {}  # weight name -> is a buffer
        self.targets: set[str] = set()  # the targets of every extern node pickled (subgraphs' too)
        self.calls: set[tuple[str, str]] = set()  # (target, string literal) of those nodes: routes, modes

    def persistent_id(self, obj: Any) -> Any:
        if isinstance(obj, torch.Tensor):
            k = self._index.get(id(obj))
            if k is None:
                k = self._index[id(obj)] = len(self.tensors)
                self.tensors.append(obj.detach() if obj.requires_grad else obj)
            return ("tensor", k)
        if _is_live(obj):
            self.live[obj.target] = obj.store == "_buffers"
            return ("live", obj.target, obj.store == "_buffers")
        if isinstance(obj, torch.nn.Module):
            raise pickle.PicklingError(
                f"the compiled plan holds the module {type(obj).__name__} itself; it cannot be saved"
            )
        return None

    def reducer_override(self, obj: Any) -> Any:
        if type(obj) is types.MappingProxyType:
            return (_mapping_proxy, (dict(obj),))
        if type(obj) is Node and obj.op == "extern":
            target = str(obj.attr("target"))
            self.targets.add(target)
            self.calls.update((target, a) for a in obj.attr("args") or () if isinstance(a, str))
        return NotImplemented


def dump(obj: Any) -> tuple[bytes, list[torch.Tensor], dict[str, bool], set[str], set[tuple[str, str]]]:
    """(pickle bytes, the tensors it refers to by index, weight name -> is a buffer, the extern
    targets its graphs call, and (target, string literal) per call: which route a call takes)."""
    buf = io.BytesIO()
    p = _Pickler(buf)
    p.dump(obj)
    return buf.getvalue(), p.tensors, p.live, p.targets, p.calls


def target_modules(targets: set[str]) -> list[str]:
    """The autofusion modules that register the Python functions among `targets` (`PY_TARGETS`): an
    ONNX composite, a rule's operator, an in-place update. A process that runs the graphs must import
    them first (a target that is a torch operator, `aten.*`, needs nothing)."""
    found = {getattr(PY_TARGETS[t], "__module__", None) for t in targets if t in PY_TARGETS}
    return sorted(m for m in found if isinstance(m, str) and m.startswith("autofusion."))


class _Unpickler(pickle.Unpickler):
    def __init__(self, data: bytes, tensors: list[torch.Tensor], live: Callable[[str, bool], Any]) -> None:
        super().__init__(io.BytesIO(data))
        self.tensors = tensors
        self.live = live
        self._live: dict[str, Any] = {}  # one object per name: the runtime compares them by identity

    def persistent_load(self, pid: Any) -> Any:
        kind = pid[0]
        if kind == "tensor":
            return self.tensors[pid[1]]
        if kind == "live":
            if pid[1] not in self._live:
                self._live[pid[1]] = self.live(pid[1], pid[2])
            return self._live[pid[1]]
        raise pickle.UnpicklingError(f"unknown persistent id {kind!r}")


def load(data: bytes, tensors: list[torch.Tensor], live: Callable[[str, bool], Any]) -> Any:
    """The object `dump` wrote; `live(name, is_buffer)` makes what stands for a model weight."""
    # The cyclic collector is paused while unpickling. Unpickling makes many containers at once (the
    # plan's objects and the unpickler's temporaries); a collection in the middle frees nothing but
    # moves every object still referenced to an older generation, and once enough objects have aged
    # the collector runs a full pass over all of them (torch's ~170,000: longer than the rest of a
    # load; importing torch leaves it near that point). Paused, the temporaries are gone before the
    # next collection and only the plan's own objects age. Measured in fresh processes (transformer-
    # block and BERT packages): the full pass that ran inside `load` ran neither there nor in the first
    # six calls.
    paused = gc.isenabled()
    gc.disable()
    try:
        with warnings.catch_warnings():
            # torch's pytree warns about its own LeafSpec while rebuilding a pickled TreeSpec
            warnings.filterwarnings("ignore", category=FutureWarning, message=".*LeafSpec.*")
            return _Unpickler(data, tensors, live).load()
    finally:
        if paused:
            gc.enable()
