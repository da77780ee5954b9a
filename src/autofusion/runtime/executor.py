"""Runs a plan: fused kernels through ctypes, everything else through the reference runtime.

In: a `Plan` and the loaded shared library (or None when the build failed: every kernel step then
runs its nodes one by one through the reference runtime, which gives the same results, slower).
Out: the graph's output tensors.

Memory: intermediates a kernel writes (values that are not graph outputs) live in buffers allocated
once per compiled signature and reused by every call: a fresh large allocation page-faults at
~0.45 ms/MiB on this machine class, more than the kernels themselves. Graph outputs are fresh
tensors the caller owns. An executor therefore must not run two calls at once (the API serialises).
"""

from __future__ import annotations

import ctypes
import logging
import math
import sys
from collections.abc import Sequence
from typing import Any

import torch

from autofusion.ir.graph import Graph
from autofusion.plan.schedule import KernelStep, OpStep, Plan
from autofusion.runtime.reference import run_node

log = logging.getLogger("autofusion.runtime")


class OutputPool:
    """Output buffers handed to the caller, reused once the caller has let go of them.

    A fresh 64 MiB tensor costs ~29 ms of page faults here, more than a fused kernel takes to fill
    it. So each graph output keeps up to `keep` buffers; one is reused only when no Python reference
    (ours aside) and no view of its storage is left, i.e. the caller dropped the previous result.
    Otherwise a fresh tensor is allocated, so results a caller still holds are never overwritten.
    """

    def __init__(self, shape: tuple[int, ...], dtype: torch.dtype, keep: int = 2) -> None:
        self.shape, self.dtype, self.keep = shape, dtype, keep
        self.items: list[torch.Tensor] = []
        self.idle: list[tuple[int, int]] = []  # reference counts while only the pool holds each buffer

    def _counts(self, i: int) -> tuple[int, int]:
        return sys.getrefcount(self.items[i]), torch._C._storage_Use_Count(self.items[i].untyped_storage()._cdata)

    def get(self) -> torch.Tensor:
        for i in range(len(self.items)):
            if self._counts(i) == self.idle[i]:
                return self.items[i]
        if len(self.items) >= self.keep or not math.prod(self.shape):
            return torch.empty(self.shape, dtype=self.dtype)
        self.items.append(torch.empty(self.shape, dtype=self.dtype))
        self.idle.append(self._counts(len(self.items) - 1))
        return self.items[-1]


class PlanExecutor:
    def __init__(self, plan: Plan, library: ctypes.CDLL | None, params: dict[str, list[int]] | None = None) -> None:
        self.plan = plan
        self.graph: Graph = plan.graph
        types = self.graph.value_types()
        outputs = set(self.graph.outputs)
        self._program: list[tuple[Any, ...]] = []
        self._scratch: dict[int, torch.Tensor] = {}
        self._keep: list[object] = []  # parameter arrays whose addresses the program holds
        last_use: dict[int, int] = {}
        for i, step in enumerate(plan.steps):
            for v in step.inputs if isinstance(step, KernelStep) else step.node.inputs:
                last_use[v] = i
        nodes = self.graph.nodes
        for i, step in enumerate(plan.steps):
            dead = [v for v, k in last_use.items() if k == i and v not in outputs]
            if isinstance(step, KernelStep) and library is not None:
                fn = getattr(library, step.name)
                fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
                fn.restype = None
                values = (params or {}).get(step.name, [])
                p_array = (ctypes.c_int64 * max(1, len(values)))(*values)
                self._keep.append(p_array)
                in_types = [step.kernel.buffers[j].type for j in range(len(step.inputs))]
                out_specs = []
                for v in step.outputs:
                    t = types[v]
                    if v in outputs:
                        out_specs.append((v, t.shape, t.dtype.to_torch(), OutputPool(t.shape, t.dtype.to_torch())))
                    else:
                        buf = torch.empty(t.shape, dtype=t.dtype.to_torch())
                        self._scratch[v] = buf  # intermediate: ours alone, reused every call
                        out_specs.append((v, t.shape, t.dtype.to_torch(), buf))
                arr_type = ctypes.c_void_p * (len(step.inputs) + len(step.outputs))
                self._program.append(("kernel", fn, step.inputs, in_types, out_specs, arr_type, dead,
                                      ctypes.addressof(p_array)))
            elif isinstance(step, KernelStep):
                for k in step.nodes:
                    self._program.append(("node", nodes[k], dead if k == step.nodes[-1] else []))
            else:
                assert isinstance(step, OpStep)
                self._program.append(("node", step.node, dead))

    def run(self, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        env: dict[int, torch.Tensor] = {gi.value.id: t for gi, t in zip(self.graph.inputs, inputs, strict=True)}
        graph = self.graph
        with torch.no_grad():
            for instr in self._program:
                if instr[0] == "kernel":
                    _, fn, ins, in_types, out_specs, arr_type, dead, p_addr = instr
                    ptrs = []
                    for v, t in zip(ins, in_types):
                        x = env[v]
                        if tuple(x.stride()) != t.strides and x.numel() > 1:
                            # Values produced by torch ops may be views; kernels index the layout
                            # they were compiled for.
                            x = x.contiguous() if t.is_contiguous else x.as_strided(x.shape, t.strides)
                            env[v] = x
                        ptrs.append(x.data_ptr())
                    for v, shape, dtype, buf in out_specs:
                        out = buf.get() if isinstance(buf, OutputPool) else buf
                        env[v] = out
                        ptrs.append(out.data_ptr())
                    fn(arr_type(*ptrs), p_addr)
                else:
                    _, node, dead = instr
                    outs = run_node(node, [env[i] for i in node.inputs], graph)
                    for v, t in zip(node.outputs, outs):
                        env[v.id] = t
                for v in dead:
                    env.pop(v, None)
        return [env[o] for o in graph.outputs]
