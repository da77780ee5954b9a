"""The module torch.export traces: the model called as the user calls it, over tensor leaves only.

`CallModule(model, layout, names)` takes the call's tensors positionally, rebuilds the arguments
around them (keywords, constants, objects holding tensors: `pytree.py`), calls the model and
(non-strict export) returns the result's tensors as a flat tuple, keeping the result's structure in
`.result`. torch.export then sees positional tensors in and a tuple of tensors out, whatever the model
takes and returns. The wrapper shares the model's parameter, buffer and submodule dicts, so the exported
program names every weight as the model does (`p_fc1_weight`), and its forward's signature names each
tensor after the argument it came from (`input_ids`, `cache_layers_0_keys`).

Strict export (Dynamo) traces the wrapper too, but gets the model's result as it is: Dynamo cannot keep
the structure record, and torch.export describes registered results itself.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from typing import Any

import torch

from autofusion.errors import FrontendError
from autofusion.frontend.torch.pytree import Node, call_of, changed_state, flatten, rebuild, state_of


class FunctionModule(torch.nn.Module):
    """A plain function as the module torch.export needs."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)


class _Box:
    def __init__(self) -> None:
        self.record = True
        self.result: Node | None = None


class CallModule(torch.nn.Module):
    _model: torch.nn.Module
    _box: _Box

    def __init__(self, model: torch.nn.Module, layout: Node, names: list[str]) -> None:
        super().__init__()
        # The model's own dicts: parameters and buffers keep their names, and export's lifting of
        # them (set on the owning module) is what the model reads.
        self._parameters = model._parameters
        self._buffers = model._buffers
        self._modules = model._modules
        self._non_persistent_buffers_set = model._non_persistent_buffers_set
        object.__setattr__(self, "_model", model)  # not a submodule: no "model." prefix on any name
        self.layout = layout
        # Export puts the module's attributes back as they were after tracing: what a trace learns is
        # kept in an object of its own.
        object.__setattr__(self, "_box", _Box())
        params = [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n in names]
        signature = inspect.Signature([inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD),
                                       *params])  # fmt: skip

        def forward(self: CallModule, *tensors: torch.Tensor) -> Any:
            return self.run(tensors)

        forward.__signature__ = signature  # type: ignore[attr-defined]  # read by export to name inputs
        self.forward = forward.__get__(self)

    def exported(self, strict: bool) -> torch.nn.Module:
        """What export traces for a try: this wrapper, recording the result's structure unless strict."""
        self._box.record = not strict
        self._box.result = None
        return self

    @property
    def result(self) -> Node | None:
        """The structure of the result of the last non-strict trace (None: none recorded)."""
        return self._box.result

    def run(self, tensors: tuple[torch.Tensor, ...]) -> Any:
        model = self._model
        made: dict[int, Any] = {}
        if self.layout.plain:
            args: tuple[Any, ...] = tensors
            kwargs: dict[str, Any] = {}
        else:
            args, kwargs = call_of(rebuild(self.layout, tensors, made=made))
        if not self._box.record:
            return model(*args, **kwargs)
        before = state_of(made)
        out = model(*args, **kwargs)
        why = changed_state(before, made)
        if why is not None:
            raise FrontendError(f"{why}; a compiled graph replays tensor updates only")
        flat = flatten(out, {id(c): i for i, c in made.items()})
        self._box.result = flat.node
        return tuple(flat.tensors)


def leaf_names(model: torch.nn.Module, layout: Node) -> list[str]:
    """A Python name for each tensor leaf of a call, after where it sits: the forward parameter it was
    passed as, then keys, attributes and positions below it."""
    forward = model.fn if isinstance(model, FunctionModule) else model.forward
    try:  # a function model's own parameter names, not its wrapper's (*args, **kwargs)
        params = list(inspect.signature(forward).parameters.values())
    except (TypeError, ValueError):
        params = []
    names: list[str] = []

    def positional(i: int) -> str:
        for p in params[: i + 1]:
            if p.kind is inspect.Parameter.VAR_POSITIONAL:
                return f"{p.name}_{i - params.index(p)}"
        if i < len(params) and params[i].kind in (inspect.Parameter.POSITIONAL_ONLY,
                                                  inspect.Parameter.POSITIONAL_OR_KEYWORD):  # fmt: skip
            return params[i].name
        return f"arg{i}"

    def walk(n: Node, path: str) -> None:
        if n.kind == "tensor":
            names.append(path)
        elif n.kind in ("seq", "registered"):
            keys: list[Any] = list(n.meta) if n.kind == "registered" and isinstance(n.meta, (list, tuple)) \
                and len(n.meta) == len(n.children) else list(range(len(n.children)))  # fmt: skip
            for k, c in zip(keys, n.children, strict=True):
                walk(c, f"{path}_{k}")
        elif n.kind in ("map", "object"):
            for k, c in zip(n.meta, n.children, strict=True):
                walk(c, f"{path}_{k}")

    if layout.kind != "seq" or len(layout.children) != 2:
        raise FrontendError("a call's layout is the tree (args, kwargs)")
    args, kwargs = layout.children
    if args.kind == "seq":
        for i, c in enumerate(args.children):
            walk(c, positional(i))
    if kwargs.kind == "map":
        for k, c in zip(kwargs.meta, kwargs.children, strict=True):
            walk(c, str(k))
    out: list[str] = []
    for n in names:
        clean = re.sub(r"\W", "_", n)
        clean = clean if clean and not clean[0].isdigit() else f"_{clean}"
        base, k = clean, 1
        while clean in out:
            clean, k = f"{base}_{k}", k + 1
        out.append(clean)
    return out
