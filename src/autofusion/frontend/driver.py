"""The one frontend loop: source nodes in, a verified IR graph and what became of each node out.

Both frontends (torch FX, ONNX) run the same loop over a `Walk`, which knows its own source format:
1. the walk adds the graph inputs and names them (`begin`);
2. every source node, in order, is planned (`plan`): nothing to convert (an assert, a tuple index, a
   value known at import) gives None; else a `Step` with the converter registered for it, or the
   reason there is none;
3. a converter that raises `UnsupportedOpError` or `ShapeInferenceError` has what it added rolled back,
   and the node becomes an `extern` (or, where the walk has no way to run it, a `FrontendError`); each
   (op, reason) is logged once per conversion at INFO as `Fallback <op>(<args>) # reason: ...`;
4. the walk names the outputs (`finish`); the graph is built, verified, and a summary logged.
Converters themselves are the frontends' own (`torch/converters`, `onnx/converters`).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from autofusion.errors import ShapeInferenceError, UnsupportedOpError
from autofusion.ir.graph import Graph, GraphBuilder
from autofusion.ir.verify import verify

N = TypeVar("N")
N_contra = TypeVar("N_contra", contravariant=True)


@dataclass
class Conversion:
    """A source graph converted to IR: what a compiled graph needs to bind inputs and rebuild outputs."""

    graph: Graph
    input_names: list[str]  # the source's name for each graph input, in graph input order
    # Per output leaf of the source: ("value", index into graph.outputs) or ("literal", a value
    # returned as is).
    output_leaves: list[tuple[str, Any]]
    output_names: list[str] = field(default_factory=list)  # the source's name of each graph output
    lowered: Counter[str] = field(default_factory=Counter)  # op label -> nodes converted to IR ops
    fallbacks: Counter[tuple[str, str]] = field(default_factory=Counter)  # (op label, reason) -> externs

    @property
    def placeholders(self) -> list[str]:
        """The torch frontend's word for `input_names` (FX placeholder names)."""
        return self.input_names

    def leaves(self, values: Sequence[Any]) -> list[Any]:
        """The source's output leaves, in order: computed outputs interleaved with the literal ones."""
        return [values[x] if kind == "value" else x for kind, x in self.output_leaves]


@dataclass(frozen=True)
class Step(Generic[N]):
    """One source node to convert."""

    label: str  # what `lowered` and `fallbacks` count it as: "aten.add.Tensor", "onnx.Relu"
    # Runs the registered converter and stores its results; None when no converter applies.
    lower: Callable[[], None] | None
    reason: str  # why it is not lowered when `lower` is None
    # Adds the extern node for a reason (or raises FrontendError); returns its arguments as text for the log.
    extern: Callable[[str], str]


class Walk(Protocol[N_contra]):
    """What a frontend tells the driver about its source graph."""

    builder: GraphBuilder
    log: logging.Logger

    def begin(self) -> list[str]:
        """Add the graph inputs; the source name of each, in order."""
        ...

    def nodes(self) -> Iterable[Any]:
        """The source nodes, in order (a FrontendError for a node kind the walk cannot take)."""
        ...

    def plan(self, node: N_contra) -> Step[Any] | None:
        """The node's step, or None when it needs no conversion."""
        ...

    def rollback(self, mark: tuple[int, int]) -> None:
        """Undo what a failed converter added since `mark` (the builder's `mark()`)."""
        ...

    def finish(self) -> tuple[list[int], list[tuple[str, Any]], list[str]]:
        """Graph output value ids, the output leaves and the output names."""
        ...


def drive(walk: Walk[Any]) -> Conversion:
    """Convert a source graph node by node (see the module docstring)."""
    names = walk.begin()
    lowered: Counter[str] = Counter()
    fallbacks: Counter[tuple[str, str]] = Counter()
    for node in walk.nodes():
        step = walk.plan(node)
        if step is None:
            continue
        reason = step.reason
        if step.lower is not None:
            mark = walk.builder.mark()
            try:
                step.lower()
                lowered[step.label] += 1
                continue
            except (UnsupportedOpError, ShapeInferenceError) as e:
                walk.rollback(mark)
                reason = str(e)
        text = step.extern(reason)
        key = (step.label, reason)
        if key not in fallbacks:
            walk.log.info("Fallback %s(%s) # reason: %s", step.label, text, reason)
        fallbacks[key] += 1
    ids, leaves, out_names = walk.finish()
    graph = walk.builder.build(ids)
    verify(graph)
    for label, n in sorted(lowered.items()):
        walk.log.info("Lowered %dx %s", n, label)
    for (label, why), n in sorted(fallbacks.items()):
        walk.log.info("Fallback %dx %s # reason: %s", n, label, why)
    return Conversion(graph, names, leaves, out_names, lowered, fallbacks)
