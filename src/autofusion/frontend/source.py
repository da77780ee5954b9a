"""What a compiled model is compiled from: a `Source` (a torch or an ONNX model) and its `Captured` graphs.

`autofusion.api.CompiledModel` is one class over any source: it keeps one compiled graph per input
signature and asks the source, per call, how to read the caller's arguments, what the signature is,
and, for a signature not seen yet, for the graph captured or converted for it. A `Captured` says how
a compiled graph binds its inputs (the caller's tensors, parameters read live, fixed tensors) and how
its outputs are rebuilt into what the source returns.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch
from torch.utils import _pytree as pytree

from autofusion.errors import InputMismatchError
from autofusion.frontend.driver import Conversion


@dataclass
class Captured:
    """One source graph captured for one input signature."""

    conversion: Conversion
    # Per graph input: ("user", index into the call's tensors), ("live", an object whose .get() returns
    # the tensor to read now: a parameter or buffer of the model), or ("bound", tensor fixed at capture).
    sources: list[tuple[str, Any]]
    out_spec: pytree.TreeSpec  # the source's output structure (leaves: `conversion.output_leaves`)
    capture_mode: str  # how it was captured: "strict"/"non-strict" (torch.export) or "onnx"
    # Inputs and buffers the graph updates (`frontend/torch/mutation.Mutation`): their new values are
    # the first graph outputs, before the source's own.
    mutations: tuple[Any, ...] = ()
    # (the source's output leaves, the containers of the call) -> the result, for results torch's pytree
    # cannot describe (`frontend/torch/pytree.py`); None: `out_spec` rebuilds them.
    rebuild: Callable[[Sequence[Any], Sequence[Any]], Any] | None = None

    @property
    def bindings(self) -> list[tuple[str, Any]]:
        """Per graph input: ("user", index) or ("bound", the tensor it reads now)."""
        return [("bound", v.get()) if kind == "live" else (kind, v) for kind, v in self.sources]


class Source(Protocol):
    """What `CompiledModel` needs from the thing it compiles."""

    name: str  # what messages call it: the module's class, the function's or the file's name
    model: Any  # what was compiled: the nn.Module or function, or the checked ModelProto
    input_names: list[str]  # the inputs' names where the source declares them ([] where only capture tells)

    @property
    def eager(self) -> Callable[..., Any] | None:
        """Runs the source as written, for calls that cannot run compiled; None when there is no such
        way (then a capture error is raised to the caller instead)."""
        ...

    def inputs(self, args: Sequence[Any]) -> list[torch.Tensor]:
        """One call's arguments as the tensors a compiled graph takes (InputMismatchError when they
        do not fit)."""
        ...

    def signature(self, inputs: Sequence[torch.Tensor]) -> Hashable:
        """The cache key: calls with equal signatures run the same compiled graph."""
        ...

    def signature_text(self, signature: Hashable) -> str:
        """The signature for a message."""
        ...

    def capture(self, inputs: Sequence[torch.Tensor] | None, signature: Hashable) -> Captured:
        """The graph for `signature` (FrontendError when it cannot be captured). `inputs` is None for
        a signature the source gave itself (`initial_signature`)."""
        ...

    def keyed(self, inputs: Sequence[torch.Tensor]) -> tuple[int, ...]:
        """The positions of the inputs whose values (`value_key`), not only shapes, the signature holds."""
        ...

    def initial_signature(self) -> Hashable | None:
        """A signature to compile when no example inputs are given (an ONNX model with static inputs)."""
        ...

    def eager_reason(self, inputs: Sequence[torch.Tensor]) -> str | None:
        """Why this call must run eagerly whatever its signature (autograd), or None."""
        ...

    def accepted(self, inputs: Sequence[torch.Tensor]) -> None:
        """These inputs ran compiled (or were the example inputs): the source may fix its arity."""
        ...

    def caution(self) -> str | None:
        """A warning for a call that runs compiled (results without autograd history), or None."""
        ...

    def not_compiled(self) -> str:
        """Why there is no graph yet, and what to do."""
        ...


class SignatureChanged(Exception):  # a signal to the compiled model, not an error
    """Raised by `capture`: the source learned that its signature must hold more of these inputs
    (an ONNX input's value that a shape depends on); compute the signature again and capture that."""


def value_key(t: torch.Tensor) -> tuple[Any, ...]:
    """A small tensor's values as a hashable key: ints as ints, floats by their exact bits (as hex text,
    so every NaN keys alike and -0.0 apart from 0.0)."""
    flat = t.detach().reshape(-1).tolist()
    if t.dtype.is_floating_point:
        return tuple(float(v).hex() for v in flat)
    return tuple(flat)


def as_tensor(x: Any, position: int) -> torch.Tensor:
    """A call argument as a CPU tensor (numpy arrays are wrapped, not copied)."""
    if isinstance(x, torch.Tensor):
        if x.device.type != "cpu":
            raise InputMismatchError(f"input {position} is on {x.device}; autofusion runs on the CPU")
        return x
    if isinstance(x, np.ndarray):
        if x.dtype.kind in "iu" and x.dtype.itemsize == 8 and x.dtype.char in "qQ":
            # numpy's (u)longlong is (u)int64 under a second name (onnxruntime returns uint64 results
            # so), which torch.from_numpy refuses
            x = x.view(np.int64 if x.dtype.kind == "i" else np.uint64)
        return torch.from_numpy(x)
    raise InputMismatchError(
        f"input {position} is a {type(x).__name__}; compiled models take tensors (or numpy arrays)"
    )
