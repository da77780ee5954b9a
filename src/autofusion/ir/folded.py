"""`FoldSplit`: a graph split into the part computed once per parameter version and the per-call rest.

Made by freezing (`passes/freeze.py`), run by `runtime/frozen.py`, kept in saved packages; here, with
the IR, so that running a plan does not import the passes.
"""

from __future__ import annotations

from dataclasses import dataclass

from autofusion.ir.graph import Graph


@dataclass(frozen=True)
class FoldSplit:
    """A graph split into its parameter-only part (folded once) and the rest."""

    graph: Graph  # the original inputs in their order, then one PARAM input per folded value
    fold: Graph  # inputs: original inputs it reads (positions in `fold_inputs`); outputs: the folded values
    fold_inputs: tuple[int, ...]  # per input of `fold`: its position among the original graph's inputs
    folded_nodes: int  # nodes of the original graph computed by `fold` instead of on every call

    @property
    def folded_values(self) -> int:
        return len(self.fold.outputs)
