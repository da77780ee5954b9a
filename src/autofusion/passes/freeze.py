"""Freezing: split off the parameter-only part of a graph, to be computed once per parameter version.

In: a graph after the graph passes. Out: a `FoldSplit`, or None when nothing is worth folding:
- `fold`, a graph whose inputs are the original graph's parameters and buffers it reads and whose outputs
  are the folded values: every maximal subgraph whose inputs are all parameters, buffers, constants or
  literals (transitively) and that computes something (a concatenated QKV weight, a cast weight, a mask
  built from a buffer or from `arange`, a position embedding looked up with constant indices);
- `graph`, the original computation with each folded value read from a new PARAM input appended after
  the original inputs (which keep their positions, so the caller's binding is unchanged).

The runtime (`runtime/frozen.py`) runs `fold` with the reference runtime only when a source tensor is
replaced or changed in place (identity and `_version`, the library fold cache's guard), so a changed
parameter is never read stale.

Not folded: views of a source alone (reshape, permute, expand, slice, select of one weight: free, and a
matmul reads a transposed weight in place), graph outputs (the caller owns those, so they are computed
on every call), random or stateful externs (torch's `nondeterministic_seeded` tag, mutable schemas,
targets we cannot resolve), and values that would take much more memory than what they are computed from
(more than `GROWTH` x their sources' bytes plus `SLACK_BYTES`: an activation-sized broadcast of a bias
stays a broadcast), and, in a graph with symbolic sizes (one plan for many sizes), values whose size
follows a size symbol (the budget would decide per size and flip the plan; they are computed per call).
"""

from __future__ import annotations

import logging

import torch

from autofusion.ir.catalog import VIEWS
from autofusion.ir.folded import FoldSplit
from autofusion.ir.graph import Graph, GraphBuilder, InputRole, Node
from autofusion.ir.symbolic import SymInt, symbols
from autofusion.passes.simplify.dce import eliminate_dead_nodes

log = logging.getLogger("autofusion.passes")

GROWTH = 2
SLACK_BYTES = 1 << 20
SOURCE_OPS = frozenset({"const", "full", "arange"})


def _follows_sizes(nbytes: int) -> bool:
    """Is a byte count a symbolic size's (it depends on a size symbol), read without taking a guard?"""
    return isinstance(nbytes, SymInt) and bool(symbols(nbytes.expr))


def _pure_extern(node: Node) -> bool:
    """Whether an extern call may be computed once: a resolvable torch op that is neither random nor
    mutating (an unknown target might read global state)."""
    target = str(node.attr("target") or "")
    parts = target.split(".")
    if len(parts) != 3:
        return False
    try:
        op = getattr(getattr(getattr(torch.ops, parts[0]), parts[1]), parts[2])
    except (AttributeError, RuntimeError):
        return False
    if not isinstance(op, torch._ops.OpOverload) or op._schema.is_mutable:
        return False
    return torch.Tag.nondeterministic_seeded not in op.tags


def split_frozen(graph: Graph) -> FoldSplit | None:
    derived: set[int] = set()  # values computed from parameters, buffers, constants and literals only
    computes: set[int] = set()  # ... whose computation is more than views of one source
    src_bytes: dict[int, int] = {}  # bytes of the sources a derived value is computed from (an upper bound)
    for gi in graph.inputs:
        if gi.role in (InputRole.PARAM, InputRole.BUFFER):
            derived.add(gi.value.id)
            src_bytes[gi.value.id] = gi.value.type.nbytes
    outputs = set(graph.outputs)
    folded: set[int] = set()  # node indices computed by the fold graph
    for k, n in enumerate(graph.nodes):
        if not all(i in derived for i in n.inputs) or (n.op == "extern" and not _pure_extern(n)):
            continue
        nbytes = sum(v.type.nbytes for v in n.outputs)
        sb = sum(src_bytes[i] for i in n.inputs) if n.inputs else nbytes
        for v in n.outputs:
            derived.add(v.id)
            src_bytes[v.id] = sb
        if n.op in SOURCE_OPS or (n.op in VIEWS and not any(i in computes for i in n.inputs)):
            continue
        computes.update(v.id for v in n.outputs)
        if any(v.id in outputs for v in n.outputs):
            continue
        if _follows_sizes(nbytes):
            # A size symbol in a plan made once for many sizes (`autofusion.reuse`): the budget below
            # would decide per size (a [batch, seq, hidden] broadcast of a weight folded for small
            # batches only) and flip the plan as the sizes grow. One decision for every size: what
            # grows with the call is computed per call, as an activation is.
            log.info("freeze: %s (%s) not folded: its size follows the call's sizes", n.name, n.op)
            continue
        if nbytes > GROWTH * sb + SLACK_BYTES:
            log.info(
                "freeze: %s (%s) not folded: %d bytes from %d bytes of parameters", n.name, n.op, nbytes, sb
            )
            continue
        folded.add(k)
    if not folded:
        return None
    folded_vals = {v.id for k in folded for v in graph.nodes[k].outputs}
    # Fold outputs: folded values something outside the fold reads.
    fold_out: list[int] = []
    for k, n in enumerate(graph.nodes):
        if k in folded:
            continue
        for i in n.inputs:
            if i in folded_vals and i not in fold_out:
                fold_out.append(i)
    if not fold_out:
        return None
    return _build(graph, folded, fold_out)


def _build(graph: Graph, folded: set[int], fold_out: list[int]) -> FoldSplit:
    producer: dict[int, int] = {v.id: k for k, n in enumerate(graph.nodes) for v in n.outputs}
    # Everything the fold outputs are computed from (folded nodes and the views/sources they read).
    need: set[int] = set()
    stack = [producer[v] for v in fold_out]
    while stack:
        k = stack.pop()
        if k in need:
            continue
        need.add(k)
        stack.extend(producer[i] for i in graph.nodes[k].inputs if i in producer)
    read = {i for k in need for i in graph.nodes[k].inputs}
    fb = GraphBuilder(f"{graph.name}_fold")
    env: dict[int, int] = {}
    fold_inputs: list[int] = []
    for pos, gi in enumerate(graph.inputs):
        if gi.value.id in read:
            env[gi.value.id] = fb.add_input(gi.value.type, gi.name, gi.role)
            fold_inputs.append(pos)
    for k in sorted(need):
        n = graph.nodes[k]
        fb.scope = n.scope
        for v, o in zip(n.outputs, fb.copy(n, [env[i] for i in n.inputs], graph.constants), strict=True):
            env[v.id] = o
    fold = fb.build([env[v] for v in fold_out])

    mb = GraphBuilder(graph.name)
    menv: dict[int, int] = {}
    for gi in graph.inputs:
        menv[gi.value.id] = mb.add_input(gi.value.type, gi.name, gi.role)
    types = graph.value_types()
    for vid in fold_out:
        name = graph.nodes[producer[vid]].name
        menv[vid] = mb.add_input(types[vid], f"{name}_frozen", InputRole.PARAM)
    for k, n in enumerate(graph.nodes):
        if k in folded:
            continue
        mb.scope = n.scope
        outs = mb.copy(n, [menv[i] for i in n.inputs], graph.constants)
        for v, o in zip(n.outputs, outs, strict=True):
            menv[v.id] = o
    main = eliminate_dead_nodes(mb.build([menv[o] for o in graph.outputs]))
    log.info("freeze: %d nodes of %s folded into %d values computed once per parameter version",
             len(folded), graph.name, len(fold_out))  # fmt: skip
    return FoldSplit(main, fold, tuple(fold_inputs), len(folded))
