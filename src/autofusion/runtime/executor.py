"""Runs a plan: fused kernels through ctypes, everything else through the reference runtime.

In: a `Plan` and the loaded shared library (or None when the build failed: every kernel step then
runs its nodes one by one through the reference runtime, which gives the same results, slower).
Out: the graph's output tensors.

Memory: intermediates a kernel writes (values that are not graph outputs) live in buffers allocated
once per compiled signature and reused by every call: a fresh large allocation page-faults at
~0.45 ms/MiB on this machine class, more than the kernels themselves. Graph outputs, and the
intermediates an output may be a view of (plan/aliasing.py), come from `OutputPool`s, so the caller
owns every result; `buffers.owned` checks that once more at the end of a run. An executor must not
run two calls at once (the API serialises).
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Callable, Sequence
from typing import Any

import torch

from autofusion.ir.graph import Graph
from autofusion.ir.interpret import run_node
from autofusion.plan.aliasing import alias_roots, reachable
from autofusion.plan.schedule import KernelStep, Plan
from autofusion.runtime.blas import install_gemm
from autofusion.runtime.buffers import OutputPool, owned, poison_, storages, to_layout
from autofusion.runtime.fast_ops import fast_call
from autofusion.runtime.prepack import Chooser, packed_call

__all__ = ["OutputPool", "PlanExecutor"]

log = logging.getLogger("autofusion.runtime")


class PlanExecutor:
    """`generated_calls` counts the calls into generated code since construction (tests use it to
    prove the kernels ran, not the reference runtime). With `poison`, every buffer a kernel writes
    is filled with `buffers.sentinel` before each run."""

    def __init__(self, plan: Plan, library: ctypes.CDLL | None, params: dict[str, list[int]] | None = None,
                 poison: bool = False, linear_route: Chooser | None = None) -> None:  # fmt: skip
        """`linear_route`: picks a GEMM route per linear shape (runtime/prepack.py); linear steps whose
        weight is a parameter then run on a prepacked weight where the route says so."""
        self.plan = plan
        self.prepacked: dict[str, str] = {}  # linear node name -> the packed route it runs
        self.graph: Graph = plan.graph
        self.poison = poison
        self.generated_calls = 0
        types = self.graph.value_types()
        outputs = set(self.graph.outputs)
        # Intermediates a graph output may be a view of (through an op step) are handed out like
        # outputs: a reused scratch buffer there would change a result the caller still holds.
        escaping = reachable(outputs, alias_roots(plan.steps))
        self._program: list[tuple[Any, ...]] = []
        self._scratch: dict[int, torch.Tensor] = {}
        self._keep: list[object] = []  # parameter arrays whose addresses the program holds
        # Constants (an ONNX model's initializers: its weights) are bound once, not looked up by a
        # program step per call: a CNN's plan has one `const` step per weight and bias.
        self._consts: dict[int, torch.Tensor] = {}
        last_use: dict[int, int] = {}
        for i, step in enumerate(plan.steps):
            for v in step.inputs:
                last_use[v] = i
        nodes = self.graph.nodes
        made_by_kernel: set[int] = set()
        if library is not None and any(s.gemm is not None for s in plan.kernels):
            install_gemm(library)
        for i, step in enumerate(plan.steps):
            dead = [v for v, k in last_use.items() if k == i and v not in outputs]
            if isinstance(step, KernelStep) and library is not None:
                fn = getattr(library, step.name)
                fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
                fn.restype = None
                values = (params or {}).get(step.name, [])
                p_array = (ctypes.c_int64 * max(1, len(values)))(*values)
                self._keep.append(p_array)
                in_types = step.input_types(types)
                out_specs: list[tuple[int, torch.Tensor | OutputPool]] = []
                for v in step.outputs:
                    t = types[v]
                    if not t.is_contiguous:
                        raise ValueError(f"kernel {step.name} writes %{v} with strides {t.strides}; "
                                         "kernel outputs are contiguous")  # fmt: skip
                    made_by_kernel.add(v)
                    if v in escaping:
                        out_specs.append((v, OutputPool(t.shape, t.dtype.to_torch(), poison=poison)))
                    else:
                        buf = torch.empty(t.shape, dtype=t.dtype.to_torch())
                        self._scratch[v] = buf  # intermediate: ours alone, reused every call
                        out_specs.append((v, buf))
                arr_type = ctypes.c_void_p * (len(step.inputs) + len(step.outputs))
                self._program.append(
                    (
                        "kernel",
                        fn,
                        step.inputs,
                        in_types,
                        out_specs,
                        arr_type,
                        dead,
                        ctypes.addressof(p_array),
                    )
                )
            elif isinstance(step, KernelStep):
                for k in step.nodes:
                    self._program.append(("node", nodes[k], dead if k == step.nodes[-1] else []))
            elif step.node.op == "const":
                self._consts[step.node.outputs[0].id] = self.graph.constants[step.node.attr("name")]
            else:
                call = packed_call(step.node, self.graph, types, linear_route)
                fast = fast_call(step.node, self.graph, types) if call is None else None
                if call is not None:
                    self.prepacked[step.node.name] = call[1]
                    self._program.append(("call", call[0], step.node, dead))
                elif fast is not None:
                    self._program.append(("call", fast, step.node, dead))
                else:
                    self._program.append(("node", step.node, dead))
        self._internal = storages(self._scratch.values()) | storages(self.graph.constants.values())
        # Outputs a torch op made (not written by a kernel into a caller-owned buffer) are checked
        # against the scratch buffers and constants once more at the end of a run (`buffers.owned`).
        self._check = [k for k, o in enumerate(self.graph.outputs) if o not in made_by_kernel]

    def op_calls(self) -> dict[str, Callable[[list[torch.Tensor]], torch.Tensor]]:
        """The library call each op step really makes (a prepacked GEMM, a resolved fast op), by node
        name: what a per-step profile must time, since the reference runtime would call plain ATen."""
        return {instr[2].name: instr[1] for instr in self._program if instr[0] == "call"}

    def run(self, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        env: dict[int, torch.Tensor] = self._consts.copy()
        env.update((gi.value.id, t) for gi, t in zip(self.graph.inputs, inputs, strict=True))
        graph = self.graph
        if self.poison:
            for buf in self._scratch.values():
                poison_(buf)
        with torch.no_grad():
            for instr in self._program:
                if instr[0] == "kernel":
                    _, fn, ins, in_types, out_specs, arr_type, dead, p_addr = instr
                    ptrs = []
                    for v, t in zip(ins, in_types, strict=True):
                        # Values produced by torch ops may be views; kernels index the layout they
                        # were compiled for.
                        x = env[v] = to_layout(env[v], t)
                        ptrs.append(x.data_ptr())
                    for v, buf in out_specs:
                        out = buf.get() if isinstance(buf, OutputPool) else buf
                        env[v] = out
                        ptrs.append(out.data_ptr())
                    fn(arr_type(*ptrs), p_addr)
                    self.generated_calls += 1
                elif instr[0] == "call":
                    _, fn, node, dead = instr
                    env[node.outputs[0].id] = fn([env[i] for i in node.inputs])
                else:
                    _, node, dead = instr
                    outs = run_node(node, [env[i] for i in node.inputs], graph)
                    for v, t in zip(node.outputs, outs, strict=True):
                        env[v.id] = t
                for v in dead:
                    env.pop(v, None)
        result = [env[o] for o in graph.outputs]
        return owned(result, self._internal, self._check) if self._internal else result
