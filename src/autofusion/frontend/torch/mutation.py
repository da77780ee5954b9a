"""Models that update their inputs or buffers in place: what torch.export records, and how it is replayed.

torch.export's functional graph returns each mutated input or buffer's new value as an extra output
(`OutputKind.USER_INPUT_MUTATION`, `BUFFER_MUTATION`), before the user outputs. The compiled graph
computes that value like any other and the caller's tensor is then updated (`write_back`):

- In place, by the op itself, where the update is a scatter into the input (a static KV cache written
  with `index_copy_`, `index_put_` or slice assignment) and the graph reads the old value nowhere
  else: `inplace_updates` turns the functional scatter (which would copy the whole cache to change one
  slot) back into the in-place op on the input, so a decode step writes only the new slot. The result
  of that op is the caller's tensor itself, and write-back has nothing left to do.
- Otherwise by a copy into the caller's tensor after the graph ran (`x.add_(1)`, a buffer counter): the
  graph computed the new value into a buffer of its own, and all reads of the old value are done.

Aliasing: the graph is traced with every input distinct. A call whose mutated input shares memory with
another input (the same tensor passed twice, a view of it) would need the graph to see its own writes
through the other input: `overlap` finds those calls, and they run eagerly.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from autofusion.ir.interpret import PY_TARGETS

aten = torch.ops.aten

# In-place forms of scatters torch has no single op for: a view of the input, then copy_ into it.
_LIB = torch.library.Library("autofusion_inplace", "DEF")
_LIB.define(
    "slice_scatter_(Tensor(a!) self, Tensor src, int dim=0, SymInt? start=None, SymInt? end=None, "
    "SymInt step=1) -> Tensor(a!)"
)
_LIB.define("select_scatter_(Tensor(a!) self, Tensor src, int dim, SymInt index) -> Tensor(a!)")


def _slice_scatter_(self: torch.Tensor, src: torch.Tensor, dim: int = 0, start: int | None = None,
                    end: int | None = None, step: int = 1) -> torch.Tensor:  # fmt: skip
    aten.slice.Tensor(self, dim, start, end, step).copy_(src)
    return self


def _select_scatter_(self: torch.Tensor, src: torch.Tensor, dim: int, index: int) -> torch.Tensor:
    self.select(dim, index).copy_(src)
    return self


_LIB.impl("slice_scatter_", _slice_scatter_, "CompositeExplicitAutograd")
_LIB.impl("select_scatter_", _select_scatter_, "CompositeExplicitAutograd")
PY_TARGETS["autofusion_inplace.slice_scatter_.default"] = _slice_scatter_
PY_TARGETS["autofusion_inplace.select_scatter_.default"] = _select_scatter_

# functional scatter -> its in-place form (same arguments): the result is the first argument, updated.
_INPLACE: dict[Any, Any] = {
    aten.index_copy.default: aten.index_copy_.default,
    aten.index_put.default: aten.index_put_.default,
    aten.slice_scatter.default: torch.ops.autofusion_inplace.slice_scatter_.default,
    aten.select_scatter.default: torch.ops.autofusion_inplace.select_scatter_.default,
    aten.copy.default: aten.copy_.default,
}


def _drop_overwritten_copies(graph: torch.fx.Graph) -> None:
    """`copy(a, b)` with b already of a's shape and dtype, written into a scatter, is b: slice assignment
    (`x[:, i] = v`) reads the slice it overwrites only for its shape, and that read would keep the old
    value alive. (Only there: elsewhere the copy is a tensor of its own, which a result may be.)"""
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target is not aten.copy.default or len(node.args) != 2:
            continue
        if node.kwargs or not node.users or any(u.target not in _SCATTERS or u.args[1] is not node
                                                for u in node.users):  # fmt: skip
            continue
        a, b = node.args
        va, vb = getattr(a, "meta", {}).get("val"), getattr(b, "meta", {}).get("val")
        if not (isinstance(va, torch.Tensor) and isinstance(vb, torch.Tensor)):
            continue
        if va.shape == vb.shape and va.dtype == vb.dtype:
            node.replace_all_uses_with(b)
            graph.erase_node(node)
            if isinstance(a, torch.fx.Node) and not a.users and a.op == "call_function":
                graph.erase_node(a)


# Scatters whose second argument is the source written into the first.
_SCATTERS = (aten.slice_scatter.default, aten.select_scatter.default)


def _chain(node: torch.fx.Node, base: torch.fx.Node) -> list[torch.fx.Node] | None:
    """The scatters from `base` to `node` (each the only reader of the one before), or None when
    `node` is not such a chain or the old value is read anywhere else."""
    chain: list[torch.fx.Node] = []
    cur = node
    while True:
        if cur.op != "call_function" or cur.target not in _INPLACE or not cur.args:
            return None
        chain.append(cur)
        src = cur.args[0]
        if not isinstance(src, torch.fx.Node) or len(src.users) != 1:
            return None  # the value before this update is read elsewhere (or is not a node)
        if src is base:
            return chain[::-1]
        cur = src


def _same_layout(a: Any, b: Any) -> bool:
    return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape
            and a.dtype == b.dtype and a.stride() == b.stride())  # fmt: skip


def inplace_updates(gm: torch.fx.GraphModule, mutated: dict[str, str]) -> list[str]:
    """Rewrite each mutation output (output node name -> placeholder name) that is a chain of scatters
    on its placeholder, read nowhere else, into the in-place ops; returns the placeholders done so."""
    graph = gm.graph
    _drop_overwritten_copies(graph)
    placeholders = {n.name: n for n in graph.nodes if n.op == "placeholder"}
    by_name = {n.name: n for n in graph.nodes}
    done: list[str] = []
    for out_name, ph_name in mutated.items():
        node, base = by_name.get(out_name), placeholders.get(ph_name)
        if node is None or base is None:
            continue
        chain = _chain(node, base)
        # The in-place op keeps the input's layout; the functional one returns a contiguous tensor.
        if chain is None or not all(_same_layout(c.meta.get("val"), base.meta.get("val")) for c in chain):
            continue
        for c in chain:
            c.target = _INPLACE[c.target]
        done.append(ph_name)
    graph.lint()
    gm.recompile()
    return done


@dataclass(frozen=True)
class Mutation:
    """One input or buffer the graph updates: which graph output holds its new value, and where the
    caller's tensor is (("user", index into the call's tensors) or ("live", a module buffer))."""

    output: int
    target: tuple[str, Any]
    inplace: bool  # the graph's own op updates the tensor; write-back only checks


def _write(target: torch.Tensor, value: torch.Tensor) -> None:
    if value is target:
        return
    if (value.data_ptr() == target.data_ptr() and value.shape == target.shape
            and value.stride() == target.stride()):  # fmt: skip
        return  # the in-place op's result: the caller's tensor, already updated
    if value.numel() and value.untyped_storage().data_ptr() == target.untyped_storage().data_ptr():
        value = value.clone()  # a view of the target itself: copying in place would read what it writes
    target.copy_(value)


def write_back(
    mutations: Sequence[Mutation],
) -> Callable[[Sequence[torch.Tensor], Sequence[torch.Tensor]], None]:
    """The per-call update: `(call tensors, graph outputs) -> None`, copying each new value into the
    caller's tensor (or the model's buffer) unless the graph already wrote it there."""
    users = [(m.output, m.target[1]) for m in mutations if m.target[0] == "user"]
    live = [(m.output, m.target[1].get) for m in mutations if m.target[0] == "live"]
    bound = [(m.output, m.target[1]) for m in mutations if m.target[0] == "bound"]

    def update(user: Sequence[torch.Tensor], values: Sequence[torch.Tensor]) -> None:
        with torch.no_grad():
            for out, i in users:
                _write(user[i], values[out])
            for out, get in live:
                _write(get(), values[out])
            for out, t in bound:
                _write(t, values[out])

    return update


Updated = Callable[[Sequence[torch.Tensor]], torch.Tensor]  # the call's tensors -> an updated tensor


def _updated(kind: str, v: Any) -> Updated:
    if kind == "user":
        return lambda user: user[v]
    if kind == "live":
        return lambda user: v.get()
    return lambda user: v


def returned_inputs(
    mutations: Sequence[Mutation], user_leaves: Sequence[tuple[str, Any]], outputs: Sequence[int]
) -> list[tuple[int, Updated]]:
    """(graph output position, the updated tensor given the call's tensors) for each result that is an
    updated input itself (the same graph value: `outputs` are the graph's output value ids): after
    write-back the caller's tensor holds that value, and eager returns the tensor."""
    out: list[tuple[int, Updated]] = []
    for m in mutations:
        get = _updated(*m.target)
        out += [(x, get) for leaf, x in user_leaves if leaf == "value" and outputs[x] == outputs[m.output]]
    return out


class SharedInputMemory(Exception):
    """This call's updated input shares memory with another input: run it eagerly (`overlap`)."""


def mutated_positions(mutations: Sequence[Mutation], sources: Sequence[tuple[str, Any]]) -> list[int]:
    """The graph input positions of the tensors `mutations` update (`sources`: `Captured.sources`)."""
    out = []
    for m in mutations:
        out += [pos for pos, src in enumerate(sources) if (src[0] == m.target[0] and src[1] is m.target[1])
                or (src[0] == m.target[0] == "user" and src[1] == m.target[1])]  # fmt: skip
    return out


def overlap(tensors: Sequence[torch.Tensor], mutated: Sequence[int]) -> str | None:
    """Why a call cannot run the compiled graph: a mutated graph input (a position in `tensors`) shares
    storage with another input. None when every mutated input's storage is its own."""
    if not mutated:
        return None
    ptrs = [t.untyped_storage().data_ptr() if t.numel() else None for t in tensors]
    for i in mutated:
        j = next((k for k, p in enumerate(ptrs) if k != i and p is not None and p == ptrs[i]), None)
        if j is not None:
            return (f"graph input {i} is updated in place and shares memory with graph input {j}; the "
                    "compiled graph treats its inputs as distinct, so this call runs eagerly")  # fmt: skip
    return None
