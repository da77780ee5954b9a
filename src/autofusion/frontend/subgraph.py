"""Subgraphs an extern node runs (control flow: If branches, Loop and Scan bodies), and how they get compiled.

A frontend that meets control flow turns each branch or body into an IR `Graph` of its own and puts a
`SubgraphHost` (the object that converts it per input signature and runs it) among the literal
arguments of one `extern` node; the extern's target is a Python function registered with
`register_target` that drives the hosts (picks the branch, iterates the body).

Hosts are compiled the way the enclosing graph is: the compiler layer, which the frontend sits below,
calls `attach_compiler(graph, compile_fn)` on each graph it compiles, and every host found in that
graph's externs then compiles its subgraphs with `compile_fn` (the same options; nested hosts get it in
turn). A host that was never attached (a graph run by the reference interpreter alone) runs its
subgraphs through the reference interpreter.

The extern registry here is `PY_TARGETS` of the reference runtime: a target name -> a Python callable
the extern node calls with its filled-in arguments (no torch.library operator behind it).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from autofusion.ir.graph import Graph
from autofusion.ir.interpret import PY_TARGETS, run_graph

log = logging.getLogger("autofusion.frontend")

GraphRun = Callable[[Sequence[torch.Tensor]], list[torch.Tensor]]
# Versions (input signatures, specialised values) of one subgraph compiled at most; later ones run on the
# reference runtime.
MAX_COMPILED = 16


@dataclass
class CompiledSubgraph:
    """One subgraph ready to run: `run` takes one tensor per graph input and gives the outputs (owned by
    the caller); `generated_calls` counts calls into generated code (0 for the reference runtime)."""

    run: GraphRun
    generated_calls: Callable[[], int] = field(default=lambda: 0)


SubgraphCompiler = Callable[[Graph], CompiledSubgraph]
# What a subgraph is converted and compiled for: (shape, dtype) per input, and values it is specialised on.
SubgraphKey = tuple[tuple[tuple[tuple[int, ...], torch.dtype], ...], tuple[Any, ...]]


def reference_compiler(graph: Graph) -> CompiledSubgraph:
    """The reference runtime for a subgraph (what runs when no compiler was attached). Constants the
    graph returns are copied: the caller may hold on to (or change) what it gets."""
    consts = {t.untyped_storage().data_ptr() for t in graph.constants.values() if isinstance(t, torch.Tensor)}

    def run(xs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        outs = run_graph(graph, xs)
        return [o.clone() if o.numel() and o.untyped_storage().data_ptr() in consts else o for o in outs]

    return CompiledSubgraph(run)


class SubgraphHost:
    """Base of the objects extern nodes carry as literal arguments to run subgraphs. Compared and hashed
    by identity (each belongs to one node). Subclasses implement `subgraph(key)` (the IR graph for those
    input types and values, built on demand and kept); `run` runs it, compiled once per key."""

    def __init__(self, label: str) -> None:
        self.label = label
        self._compiler: SubgraphCompiler = reference_compiler
        self._compiled: dict[Any, CompiledSubgraph] = {}
        self._lock = threading.Lock()

    def use_compiler(self, compiler: SubgraphCompiler) -> None:
        with self._lock:
            if compiler is not self._compiler:
                self._compiler = compiler
                self._compiled.clear()

    def subgraph(self, key: SubgraphKey) -> Graph:
        raise NotImplementedError

    def compiled(self, key: SubgraphKey) -> CompiledSubgraph:
        """The subgraph for `key` (its inputs' signature and the values baked into it), compiled once by
        the attached compiler and kept."""
        with self._lock:
            entry = self._compiled.get(key)
            if entry is None:
                graph = self.subgraph(key)
                compiler = self._compiler
                if len(self._compiled) >= MAX_COMPILED:
                    # A body specialised per iteration number would build one library per step.
                    if len(self._compiled) == MAX_COMPILED:
                        log.info("%s: %d versions compiled; further ones run on the reference runtime",
                                 self.label, MAX_COMPILED)  # fmt: skip
                    compiler = reference_compiler
                attach_compiler(graph, compiler)
                entry = compiler(graph)
                self._compiled[key] = entry
            return entry

    def run(self, tensors: Sequence[torch.Tensor], values: tuple[Any, ...] = ()) -> list[torch.Tensor]:
        """Run on these inputs (made contiguous: compiled graphs index contiguous inputs); `values`: what
        the subgraph is specialised on (a Loop body's iteration number, where it feeds shapes)."""
        xs = [t if t.is_contiguous() else t.contiguous() for t in tensors]
        return self.compiled((tuple((tuple(t.shape), t.dtype) for t in xs), values)).run(xs)

    @property
    def generated_calls(self) -> int:
        """Calls into generated code by this host's compiled subgraphs so far."""
        return sum(c.generated_calls() for c in self._compiled.values())

    def __eq__(self, other: object) -> bool:
        return self is other

    def __hash__(self) -> int:
        return id(self)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.label}>"


def hosts(graph: Graph) -> list[SubgraphHost]:
    """The subgraph hosts among the literal arguments of `graph`'s extern nodes."""
    found: list[SubgraphHost] = []
    for node in graph.nodes:
        if node.op == "extern":
            for a in node.attr("args"):
                if isinstance(a, SubgraphHost):
                    found.append(a)
    return found


def attach_compiler(graph: Graph, compiler: SubgraphCompiler) -> None:
    """Make every subgraph host in `graph` compile its subgraphs with `compiler`."""
    for h in hosts(graph):
        h.use_compiler(compiler)


def register_target(name: str, fn: Callable[..., Any]) -> str:
    """File `fn` as the extern target `name` ("namespace.op.overload"); returns the name."""
    known = PY_TARGETS.get(name)
    if known is not None and known is not fn:
        raise ValueError(f"extern target {name} registered twice")
    PY_TARGETS[name] = fn
    return name
