"""The dims a Dynamo graph traced as symbols, for one symbolic capture of it (`backend.Specialized`).

Dynamo hands the backend a graph whose tensors have symbolic sizes (`s0`, `s1`) and whose size inputs
are SymInts of those symbols. A dim that is a symbol of its own becomes a dynamic dim of one
torch.export capture (`symbolic.make_template`), named after its symbol, so dims Dynamo found equal
share a name; each size input is read off a tensor dim of its symbol (`SizeBound`), so the capture
computes it rather than baking it in. The other scalars, and floats read with `.item()`, are fixed
per family of calls (`Family`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from autofusion.frontend.torch.symbolic import TorchTemplate


class SizeBound(torch.nn.Module):
    """Dynamo's graph taking only its tensors, each size input read off a tensor dim Dynamo traced with
    the same symbol and the other scalars fixed: captured with those dims symbolic, it is one graph for
    every size (`Family`). `sizes`: input position -> (tensor position among the tensors, dim)."""

    def __init__(self, gm: torch.fx.GraphModule, sizes: dict[int, tuple[int, int]], scalars: dict[int, Any],
                 arity: int) -> None:  # fmt: skip
        super().__init__()
        self.gm, self.sizes, self.scalars, self.arity = gm, sizes, scalars, arity

    def forward(self, *tensors: torch.Tensor) -> Any:
        args: list[Any] = []
        it = iter(tensors)
        for i in range(self.arity):
            if i in self.sizes:
                k, d = self.sizes[i]
                args.append(tensors[k].size(d))
            elif i in self.scalars:
                args.append(self.scalars[i])
            else:
                args.append(next(it))
        return self.gm(*args)


def dim_name(k: int, d: int) -> str:
    """The name of a symbolic dim: where it first occurs (tensor position among the tensors, dim), not
    Dynamo's symbol, so the captures of one computation by different Dynamo graphs (a static first
    trace, later symbolic ones) name their sizes alike and print alike (`reuse.fingerprint`)."""
    return f"t{k}d{d}"


def static_dims(
    example_inputs: Sequence[Any], tensor_pos: list[int], state: set[int]
) -> dict[int, dict[int, str]]:
    """For a graph Dynamo traced with fixed sizes: every dim of 2 and up of the tensors that are not the
    module's parameters and buffers (`state`), to capture it with those dims symbolic where the model
    lets them be (export fixes the others: a hidden size a weight's shape ties). Dynamo's guards send
    this graph its traced sizes only; the symbolic capture is what lets later graphs of the same
    computation (retraced as sizes change) instantiate its plan instead of planning again."""
    dims: dict[int, dict[int, str]] = {}
    for k, i in enumerate(tensor_pos):
        t = example_inputs[i]
        if i in state or not isinstance(t, torch.Tensor):
            continue
        for d, n in enumerate(t.shape):
            if int(n) >= 2:
                dims.setdefault(k, {})[d] = dim_name(k, d)
    return dims


def _symbol(value: Any) -> str | None:
    """The name of the symbol a symbolic size is (None: a plain int, or an expression of symbols)."""
    if isinstance(value, torch.SymInt) and value.node.expr.is_Symbol:
        return str(value.node.expr.name)
    return None


def symbolic_dims(
    gm: torch.fx.GraphModule, example_inputs: Sequence[Any], scalar_pos: list[int], tensor_pos: list[int]
) -> tuple[dict[int, dict[int, str]], dict[int, tuple[int, int]]] | str:
    """The dims Dynamo traced as symbols of their own (tensor position among the tensors -> dim -> the
    symbol's name) and, for each size input, the tensor dim it is read from; or why there are none
    (then each signature is captured for itself)."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if len(placeholders) != len(example_inputs):
        return "the graph's placeholders do not line up with its inputs"
    dims: dict[int, dict[int, str]] = {}
    where: dict[str, tuple[int, int]] = {}
    for k, i in enumerate(tensor_pos):
        meta = placeholders[i].meta.get("example_value", placeholders[i].meta.get("val"))
        shape = meta.shape if isinstance(meta, torch.Tensor) else example_inputs[i].shape
        for d, n in enumerate(shape):
            name = _symbol(n)
            if name is not None:
                where.setdefault(name, (k, d))
                dims.setdefault(k, {})[d] = dim_name(*where[name])
    if not dims:
        return "no tensor dim was traced as a symbol of its own"
    sizes: dict[int, tuple[int, int]] = {}
    for i in scalar_pos:
        v = example_inputs[i]
        if isinstance(v, torch.SymInt):
            name = _symbol(v)
            if name is None or name not in where:
                return f"size input {i} ({v}) is no tensor dim of the graph"
            sizes[i] = where[name]
    return dims, sizes


@dataclass
class Family:
    """The calls of one Dynamo graph with the same fixed scalars and baked floats: captured once with the
    symbolic dims (`frontend/torch/symbolic.py`), each signature an instantiation of that capture."""

    bound: SizeBound
    template: TorchTemplate | None = None
    off: str | None = None  # why this family's calls are captured for themselves
    shared: Any = None  # the plans it shares with captures that print alike (`backend.SharedPlans`)
