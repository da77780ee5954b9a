"""Runs a `SuperPlan`: each SuperKernel is one ctypes call; ops it cannot call run through torch.

In: the SuperPlan, the loaded library and the rendered entries (codegen/cpp/superkernel.py).
Out: the graph's outputs, as tensors the caller owns.

Memory: every intermediate a SuperKernel writes and no caller sees lives in one arena allocated
(and zero-filled, so its pages fault in once, here) per compiled signature; its offsets come from
lifetimes (plan/memory.py), so values that are never live together share bytes. Graph outputs come
from an `OutputPool` each: a buffer is handed out again only once the caller dropped it, since a
fresh large tensor page-faults (~0.45 ms/MiB here) for longer than the kernels run. Values a torch
op reads later are arena views made once; values a torch op may alias into a graph output get a
fresh tensor per call.

Call path: pointer slots, parameter arrays and library pointers are ctypes arrays built once; a call
writes the input and output data pointers into the slot array and makes one foreign call per
SuperKernel, with argtypes fixed at load time and integer addresses as arguments. As with
`PlanExecutor`, one executor must not run two calls at once (the API serialises).
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.autograd.graph import increment_version

from autofusion.errors import ExecutionError
from autofusion.ir.catalog import VIEWS
from autofusion.ir.graph import Node
from autofusion.ir.interpret import run_node
from autofusion.ir.types import TensorType, strides_match
from autofusion.plan.entry_scatter import in_place_results
from autofusion.plan.superkernel import SuperEntry, SuperKernel, SuperPlan
from autofusion.runtime.blas import install_gemm, sgemm_address
from autofusion.runtime.buffers import OutputPool, fresh, owned, poison_, storages, to_layout
from autofusion.runtime.fast_ops import any_call, fast_call
from autofusion.runtime.library import ROUTE_CALLS
from autofusion.runtime.prepack import Chooser, packed_call
from autofusion.runtime.super_dnnl import DnnlHandles

_VOIDP3 = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]


class _Call:
    """One SuperKernel call: its entry point, arrays, and how to fill the slots each run."""

    def __init__(self, fn: Any, entry: SuperEntry, fptrs: Any) -> None:
        self.fn = fn
        self.slots = (ctypes.c_void_p * max(1, len(entry.slots)))()
        self.params = (ctypes.c_int64 * max(1, len(entry.params)))(*entry.params)
        self.fptrs = fptrs
        self.addrs = (ctypes.addressof(self.slots), ctypes.addressof(self.params), ctypes.addressof(fptrs))
        self.convs = 0  # oneDNN convolutions the entry calls (its "dnnl_conv" members)
        self.inputs: list[tuple[int, int, TensorType | None]] = []  # slot, value, layout to enforce
        self.pooled: list[tuple[int, int, OutputPool]] = []  # slot, value, pool (graph outputs)
        self.fresh: list[tuple[int, int, TensorType]] = []  # slot, value, type (aliased by an escaping view)
        # Views made per call (their source buffer changes): node, slot, the strides the entry expects.
        self.aliases: list[tuple[Node, int | None, tuple[int, ...]]] = []
        # Results of the entry's in-place scatters: (result, the graph input the entry wrote).
        self.in_place: list[tuple[int, int]] = []


class SuperExecutor:
    """`generated_calls` counts entry calls since construction, `entry_convs` the oneDNN convolutions
    those entries ran; with `poison`, the arena and every buffer an entry writes are filled with
    `buffers.sentinel` before each run (see `PlanExecutor`)."""

    def __init__(self, splan: SuperPlan, library: ctypes.CDLL, entries: Sequence[SuperEntry],
                 poison: bool = False, linear_route: Chooser | None = None) -> None:  # fmt: skip
        """`linear_route`: as `PlanExecutor`'s, for the linear op steps outside the entries."""
        self.splan = splan
        self.entries = tuple(entries)  # what a saved package keeps to build this executor again
        self.poison = poison
        self.generated_calls = 0
        self.entry_convs = 0
        self.prepacked: dict[str, str] = {}  # linear node name -> the packed route it runs
        plan = splan.plan
        graph = self.graph = plan.graph
        types = graph.value_types()
        outputs = set(graph.outputs)
        self.arena = torch.zeros(max(1, splan.arena.size), dtype=torch.uint8)
        self._static: dict[int, torch.Tensor] = {}
        for v, off in splan.arena_values.items():
            t = types[v]
            flat = self.arena[off : off + t.nbytes].view(t.dtype.to_torch())
            self._static[v] = torch.as_strided(flat, t.shape, t.strides)
        self._arena_views = list(self._static.values())  # what poison mode fills before each run
        static_steps = self._precompute_views(outputs)
        gemm = sgemm_address() if any(k != "alias" for k in splan.callable_ops.values()) else None
        self.dnnl = DnnlHandles(splan, gemm)
        self._fptrs = self.dnnl.fptrs
        by_name = {e.name: e for e in entries}
        if any(s.gemm is not None for s in plan.kernels):
            install_gemm(library)
        graph_inputs = {gi.value.id for gi in graph.inputs}
        self._pools: dict[int, OutputPool] = {}
        self._program: list[tuple[str, Any, list[int]]] = []
        last: dict[int, int] = {}
        for pos, item in enumerate(splan.program):
            members = item.members if isinstance(item, SuperKernel) else (item,)
            for m in members:
                for v in plan.steps[m].inputs:
                    last[v] = pos
        for pos, item in enumerate(splan.program):
            dead = [v for v, p in last.items() if p == pos and v not in outputs]
            if isinstance(item, int):
                if item not in static_steps:
                    # An int in the program is the index of an OpStep (steps are not typed per index).
                    node = plan.steps[item].node  # type: ignore[union-attr]
                    packed = packed_call(node, graph, types, linear_route)
                    fast = fast_call(node, graph, types) if packed is None else None
                    if packed is not None:
                        self.prepacked[node.name] = packed[1]
                        self._program.append(("call", (packed[0], node), dead))
                    elif fast is not None:  # a library call with its per-call work done once
                        self._program.append(("call", (fast, node), dead))
                    else:
                        self._program.append(("node", node, dead))
                continue
            entry = by_name[item.name]
            fn = getattr(library, item.name)
            fn.argtypes, fn.restype = _VOIDP3, None
            call = _Call(fn, entry, self._fptrs)
            call.convs = sum(1 for m in item.members if splan.callable_ops.get(m) == "dnnl_conv")
            made = {v for m in item.members for v in plan.steps[m].outputs}
            call.in_place = list(in_place_results(plan.steps, splan.callable_ops, item.members).items())
            slot_of = {v: k for k, v in enumerate(entry.slots)}
            alias_out: set[int] = set()
            for m in item.members:
                if splan.callable_ops.get(m) == "alias":
                    node = plan.steps[m].node  # type: ignore[union-attr]  # an alias is an OpStep
                    v = node.outputs[0].id
                    alias_out.add(v)
                    want = splan.strides.get(v, types[v].strides)
                    fixed = self._static.get(v)
                    if fixed is not None and not strides_match(fixed.shape, fixed.stride(), want):
                        raise ExecutionError(f"view {node.name} ({node.op}) has strides {fixed.stride()}, "
                                             f"the SuperKernel was built for {want}")  # fmt: skip
                    if fixed is None:
                        call.aliases.append((node, slot_of.get(v), want))
            for slot, v in enumerate(entry.slots):
                fixed = self._static.get(v)
                want = splan.strides.get(v, types[v].strides)
                if fixed is not None and strides_match(fixed.shape, fixed.stride(), want):
                    call.slots[slot] = fixed.data_ptr()
                elif v in alias_out:
                    continue  # made per call from its source, just before the entry runs
                elif v not in made:
                    # Produced by torch (an op step) or a constant: enforce the compiled layout.
                    check = None if v in graph_inputs else TensorType(types[v].dtype, types[v].shape, want)
                    call.inputs.append((slot, v, check))
                elif v in outputs:
                    t = types[v]
                    pool = self._pools.setdefault(v, OutputPool(t.shape, t.dtype.to_torch(), poison=poison))
                    call.pooled.append((slot, v, pool))
                else:
                    call.fresh.append((slot, v, types[v]))
            self._program.append(("super", call, dead))
        # Set by an entry's scatter that met an index out of range (it wrote nothing; the entry cannot raise).
        scatters = any(call.in_place for kind, call, _ in self._program if kind == "super")
        self._scatter_bad = ctypes.c_int64.in_dll(library, "af_scatter_bad") if scatters else None
        self._input_ids = [gi.value.id for gi in graph.inputs]
        self._output_ids = list(graph.outputs)
        self._has_nodes = any(kind == "node" for kind, _, _ in self._program)
        # Outputs no entry writes into a pool buffer are checked against the arena (the planner keeps
        # escaping values out of it) and the constants once more at the end of a run (`buffers.owned`).
        pooled = {v for kind, call, _ in self._program if kind == "super" for _, v, _ in call.pooled}
        self._check = [k for k, o in enumerate(self._output_ids) if o not in pooled]
        self._internal = storages([self.arena]) | storages(graph.constants.values())
        # Whose inputs the pointer slots and oneDNN handles were last filled from (`steady`); None: a
        # plain `run`'s.
        self._holder: object | None = None
        self._fast = self._fast_path()
        self.outputs_pooled = self._fast is not None  # every output in a pool buffer, none our memory
        self.run: Callable[[Sequence[torch.Tensor]], list[torch.Tensor]] = self._plain

    def _written(self, targets: list[torch.Tensor]) -> None:
        """After an entry wrote `targets` in place: raise for an index out of range (as torch's op would;
        the scatter that met it wrote nothing), else bump their version counters as torch's in-place op
        does, so that whatever watches them (autograd, a parameter's version guard) sees the change."""
        flag = self._scatter_bad
        if flag is not None and flag.value:
            flag.value = 0
            raise ExecutionError("an index_put_/index_copy_ inside a SuperKernel entry got an index out of "
                                 "range for its target (that write did not happen)")  # fmt: skip
        for t in targets:
            increment_version(t)

    def op_calls(self) -> dict[str, Callable[[list[torch.Tensor]], torch.Tensor]]:
        """The library call each op step outside the entries really makes, by node name (as
        `PlanExecutor.op_calls`)."""
        return {call[1].name: call[0] for kind, call, _ in self._program if kind == "call"}

    @property
    def calls_per_run(self) -> int:
        """Foreign calls plus torch ops per run (what Python still dispatches)."""
        return len(self._program)

    def _precompute_views(self, outputs: set[int]) -> set[int]:
        """Views of arena values (and constants) are the same tensors every call: make them once
        here instead of per call in Python. Returns the op steps that need not run any more. A
        reshape that has to copy is not a view and stays a per-call step."""
        plan, graph = self.splan.plan, self.graph
        done: set[int] = set()
        candidates: list[int] = []
        for item in self.splan.program:
            if isinstance(item, int):
                candidates.append(item)
            else:
                candidates += [m for m in item.members if self.splan.callable_ops.get(m) == "alias"]
        for item in candidates:
            node = plan.steps[item].node  # type: ignore[union-attr]  # an int or an alias: an OpStep
            if any(v.id in outputs for v in node.outputs):
                continue
            if node.op == "const":
                self._static[node.outputs[0].id] = graph.constants[node.attr("name")]
                done.add(item)
            elif node.op in VIEWS and node.inputs and all(i in self._static for i in node.inputs):
                (out,) = run_node(node, [self._static[i] for i in node.inputs], graph)
                src = self._static[node.inputs[0]].untyped_storage().data_ptr()
                if out.untyped_storage().data_ptr() == src:  # a view, not a copy
                    self._static[node.outputs[0].id] = out
                    done.add(item)
        return done

    def _fast_path(
        self, fixed: frozenset[int] = frozenset()
    ) -> Callable[[Sequence[torch.Tensor], bool], list[torch.Tensor]] | None:
        """A plain closure for the common case: torch op steps that only feed one SuperKernel (a decode
        step's embedding gather), then that SuperKernel, reading only graph inputs, constants and those
        steps' results and writing only graph outputs (arena values aside). No dicts, no interpreter
        loop over the program, no `owned` pass: no value the torch steps make is an output.

        The closure takes (inputs, same): with `same` the graph inputs at the positions `fixed` are
        the tensors the slots already hold (see `steady`), so only the others' addresses are written."""
        *pre, last = self._program
        if last[0] != "super":
            return None
        call: _Call = last[1]
        if call.fresh or call.aliases or call.convs:
            return None
        made = {v for _, v, _ in call.pooled}
        same = dict(call.in_place)  # results that are graph inputs the entry wrote in place
        if not all(o in made or o in same for o in self._output_ids):
            return None
        # The per-call value list: graph inputs first, then the torch steps' results; constants and
        # arena values the steps read are filled in once.
        index = {v: i for i, v in enumerate(self._input_ids)}
        base: list[Any] = [None] * len(index)
        steps: list[tuple[Callable[[list[torch.Tensor]], torch.Tensor], list[int], int]] = []
        types = self.graph.value_types()
        for kind, item, _ in pre:
            if kind == "super":
                return None
            fn, node = item if kind == "call" else (any_call(item, self.graph, types), item)
            if fn is None or len(node.outputs) != 1 or node.outputs[0].id in self._output_ids:
                return None
            srcs: list[int] = []
            for v in node.inputs:
                if v not in index:
                    if v not in self._static:
                        return None
                    index[v] = len(base)
                    base.append(self._static[v])
                srcs.append(index[v])
            index[node.outputs[0].id] = len(base)
            base.append(None)
            steps.append((fn, srcs, len(base) - 1))
        for _, v, _ in call.inputs:
            if v not in index:
                if v not in self._static:
                    return None
                index[v] = len(base)
                base.append(self._static[v])
        n_in = len(self._input_ids)
        in_slots = [(slot, index[v], check) for slot, v, check in call.inputs]
        # Graph inputs at fixed positions (parameters, folded values) keep their slot between steady
        # calls; a graph input is never re-laid out (its check is None), so its address is all there is.
        varying = [(slot, i, check) for slot, i, check in in_slots if i not in fixed or check is not None]
        pools = [pool for _, _, pool in call.pooled]
        out_slots = [slot for slot, _, _ in call.pooled]
        pooled = [v for _, v, _ in call.pooled]
        # Each output: a pool buffer's position, or (~) the position of the graph input it is.
        order = [pooled.index(o) if o in made else ~index[same[o]] for o in self._output_ids]
        written = [index[src] for _, src in call.in_place]
        slots, entry, (a, b, c) = call.slots, call.fn, call.addrs
        arena = self._arena_views if self.poison else []

        def run(inputs: Sequence[torch.Tensor], same: bool) -> list[torch.Tensor]:
            env = base.copy()
            env[:n_in] = inputs
            if steps:
                if torch.is_grad_enabled():
                    with torch.no_grad():
                        for fn, srcs, dst in steps:
                            env[dst] = fn([env[i] for i in srcs])
                else:  # the caller's no_grad already (a context costs more than the gather it wraps)
                    for fn, srcs, dst in steps:
                        env[dst] = fn([env[i] for i in srcs])
            for slot, i, check in varying if same else in_slots:
                x = env[i]
                # A torch result: the entry indexes the layout it was built for (exact strides first).
                if check is not None and x.stride() != check.strides:
                    x = env[i] = to_layout(x, check)
                slots[slot] = x.data_ptr()
            for view in arena:
                poison_(view)
            outs = [pool.get() for pool in pools]
            for slot, o in zip(out_slots, outs, strict=True):
                slots[slot] = o.data_ptr()
            entry(a, b, c)
            self.generated_calls += 1
            if written:
                self._written([env[i] for i in written])
                return [outs[i] if i >= 0 else env[~i] for i in order]
            return [outs[i] for i in order]

        return run

    def steady(self, fixed: Sequence[int]) -> Callable[[Sequence[torch.Tensor], bool], list[torch.Tensor]]:
        """A run for callers that know when the graph inputs at positions `fixed` (the model's
        parameters, folded values) are the very tensors of their previous call, unchanged (identity,
        address and version: `runtime.stamp.Stamp`): called as (inputs, same). With `same`, the work
        done per such input is skipped where this executor still holds its result from that caller's
        previous call: the entry's pointer slots (the fast path), the oneDNN handles' parameter check
        (entries with convolutions). Any other run in between (`run`, another steady caller) makes the
        next call do it all again."""
        fixed_set = frozenset(fixed)
        fast = self._fast_path(fixed_set)
        token = object()
        # The handles' check may be skipped only when every convolution parameter is a fixed input or
        # one of our own values (constants, arena views).
        held = {self._input_ids[p] for p in fixed_set if p < len(self._input_ids)} | set(self._static)
        handles_fixed = all(v in held for v in self.dnnl.param_values)

        def run(inputs: Sequence[torch.Tensor], same: bool) -> list[torch.Tensor]:
            same = same and self._holder is token
            self._holder = token
            try:
                return fast(inputs, same) if fast is not None else self._run(inputs, same and handles_fixed)
            except BaseException:
                self._holder = None
                raise

        return run

    def _plain(self, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        self._holder = None
        fast = self._fast
        return fast(inputs, False) if fast is not None else self._run(inputs, False)

    def _run(self, inputs: Sequence[torch.Tensor], same: bool) -> list[torch.Tensor]:
        env: dict[int, torch.Tensor] = dict(self._static)
        env.update(zip(self._input_ids, inputs, strict=True))
        graph = self.graph
        if self.poison:
            for view in self._arena_views:
                poison_(view)
        if self.dnnl and not same:  # same: the parameters the handles were made from, unchanged
            self.dnnl.refresh(env)  # the convolutions' primitives, for the parameters as they are now
        with torch.no_grad():
            for kind, item, dead in self._program:
                if kind == "super":
                    call: _Call = item
                    slots = call.slots
                    for slot, v, check in call.inputs:
                        x = env[v]
                        if check is not None:
                            # torch results may be views; the entry indexes the layout it was built for
                            x = env[v] = to_layout(x, check)
                        slots[slot] = x.data_ptr()
                    for slot, v, pool in call.pooled:
                        out = pool.get()
                        env[v] = out
                        slots[slot] = out.data_ptr()
                    for slot, v, vt in call.fresh:
                        out = fresh(vt.shape, vt.strides, vt.dtype.to_torch(), self.poison)
                        env[v] = out
                        slots[slot] = out.data_ptr()
                    for result, target in call.in_place:  # the result of a write in place is its target
                        env[result] = env[target]
                    for node, aslot, want in call.aliases:  # views of buffers allocated above: no data read
                        (view,) = run_node(node, [env[i] for i in node.inputs], graph)
                        if not strides_match(view.shape, view.stride(), want):
                            # the layout replayed at compile time was wrong: refuse rather than misread
                            raise ExecutionError(f"view {node.name} ({node.op}) has strides {view.stride()}, "
                                                 f"the SuperKernel was built for {want}")  # fmt: skip
                        env[node.outputs[0].id] = view
                        if aslot is not None:
                            slots[aslot] = view.data_ptr()
                    call.fn(*call.addrs)
                    self.generated_calls += 1
                    if call.in_place:
                        self._written([env[target] for _, target in call.in_place])
                    if call.convs:
                        self.dnnl.check()
                        self.entry_convs += call.convs
                        ROUTE_CALLS["dnnl"] += call.convs
                elif kind == "call":  # a prepacked linear (runtime/prepack.py) or a fast op (fast_ops.py)
                    fn, node = item
                    env[node.outputs[0].id] = fn([env[i] for i in node.inputs])
                else:
                    outs = run_node(item, [env[i] for i in item.inputs], graph)
                    for v, t in zip(item.outputs, outs, strict=True):
                        env[v.id] = t
                for v in dead:
                    if v not in self._static:
                        env.pop(v, None)
        return owned([env[o] for o in self._output_ids], self._internal, self._check)
