"""Measurements for reports: each plan step timed alone, peak live memory, whole-model latency.

In: a compiled `Program` and its graph inputs. Out: per-step median seconds (`step_times`), the
peak bytes of intermediates alive at once over the plan's steps (`peak_live_bytes`) and the bytes
the executor holds as reusable scratch.

Each step runs on the values a reference run gives its inputs (as in precision.py), so one step's
time does not depend on the others. Kernel steps call the built library directly with pointers set
up once; linears the executor runs on a prepacked weight run on it here too; other steps run through
the reference runtime, as the executor runs them. Times are the
best of `runs` rounds after two warm-up calls; in each round every step runs once, in plan order.
"""

from __future__ import annotations

import ctypes
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from autofusion.ir.graph import Node
from autofusion.ir.interpret import run_node
from autofusion.plan.schedule import KernelStep, OpStep, Plan
from autofusion.runtime.buffers import to_layout
from autofusion.runtime.prepack import packed_call
from autofusion.tools.diagnose.precision import reference_values


def _kernel_call(program: Any, step: KernelStep, env: dict[int, torch.Tensor]) -> Callable[[], None]:
    fn = getattr(program.library, step.name)
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    fn.restype = None
    values = program.params.get(step.name, [])
    p_array = (ctypes.c_int64 * max(1, len(values)))(*values)
    types = program.plan.graph.value_types()
    tensors = []
    for v, t in zip(step.inputs, step.input_types(types), strict=True):
        x = to_layout(env[v], t)  # the layout the kernel was compiled for
        tensors.append(x)
    tensors += [torch.empty(types[v].shape, dtype=types[v].dtype.to_torch()) for v in step.outputs]
    ptrs = (ctypes.c_void_p * len(tensors))(*[t.data_ptr() for t in tensors])
    addr = ctypes.addressof(p_array)

    def call() -> None:
        fn(ptrs, addr)
        _ = (tensors, p_array)  # keep the buffers alive as long as the closure

    return call


def step_times(program: Any, graph_inputs: Sequence[torch.Tensor], runs: int = 20) -> list[float]:
    """Seconds of each plan step, in plan order: the fastest of `runs` rounds. The steps take turns
    within every round (as compare.median_ms does for models), and the minimum, not the median, is kept:
    a step of a few microseconds that loses the CPU once loses a whole scheduler slice (15-25 ms
    seen on the shared 2-core machine), which no kernel change explains."""
    plan: Plan = program.plan
    env = reference_values(plan.graph, program.plan_inputs(graph_inputs))  # + folded parameters
    calls: list[Callable[[], Any]] = []
    for step in plan.steps:
        if isinstance(step, KernelStep) and program.library is not None:
            calls.append(_kernel_call(program, step, env))
        elif isinstance(step, KernelStep):  # no library: the executor runs the nodes one by one
            calls.append(_nodes_call([plan.graph.nodes[k] for k in step.nodes], env, plan))
        else:
            assert isinstance(step, OpStep)
            packed = _packed_call(program, step.node, env, plan)
            calls.append(packed or _nodes_call([step.node], env, plan))
    times: list[list[float]] = [[] for _ in calls]
    with torch.no_grad():
        for call in calls:
            call()
            call()
        for _ in range(runs):
            for k, call in enumerate(calls):
                start = time.perf_counter()
                call()
                times[k].append(time.perf_counter() - start)
    return [min(t) for t in times]


def _packed_call(
    program: Any, node: Node, env: dict[int, torch.Tensor], plan: Plan
) -> Callable[[], None] | None:
    """A linear the executor runs on a prepacked weight (runtime/prepack.py), timed the same way: the
    reference runtime's plain GEMM is another library call (on an AMD EPYC VM MKL's AVX2 path took
    twice oneDNN's time, so ConvNeXt's GEMMs read 20 ms here against the 9 ms they take)."""
    route = getattr(getattr(program, "executor", None), "prepacked", {}).get(node.name)
    if route is None:
        return None
    made = packed_call(node, plan.graph, plan.graph.value_types(), lambda *_: route)
    if made is None:
        return None
    fn, args = made[0], [env[i] for i in node.inputs]

    def call() -> None:
        fn(args)

    return call


def _nodes_call(nodes: list[Node], env: dict[int, torch.Tensor], plan: Plan) -> Callable[[], None]:
    def call() -> None:
        local = dict(env)
        for n in nodes:
            for v, t in zip(n.outputs, run_node(n, [local[i] for i in n.inputs], plan.graph), strict=True):
                local[v.id] = t

    return call


def peak_live_bytes(plan: Plan) -> int:
    """Most bytes of step outputs alive at once, walking the steps in order (inputs and parameters
    excluded: they exist either way). Views are counted as 0: they share their source's storage."""
    from autofusion.plan.schedule import NO_TRAFFIC

    types = plan.graph.value_types()
    last: dict[int, int] = {}
    for i, s in enumerate(plan.steps):
        for v in s.inputs if isinstance(s, KernelStep) else s.node.inputs:
            last[v] = i
    outputs = set(plan.graph.outputs)
    live: dict[int, int] = {}
    peak = 0
    for i, s in enumerate(plan.steps):
        if isinstance(s, KernelStep):
            made = {v: types[v].nbytes for v in s.outputs}
        else:
            made = {v.id: 0 if s.node.op in NO_TRAFFIC else v.type.nbytes for v in s.node.outputs}
        live.update(made)
        peak = max(peak, sum(live.values()))
        for v in list(live):
            if last.get(v, -1) <= i and v not in outputs:
                del live[v]
    return peak


def scratch_bytes(program: Any) -> int:
    """Intermediate buffers the executor allocated once and reuses on every call."""
    scratch = getattr(program.executor, "_scratch", {})
    return sum(t.numel() * t.element_size() for t in scratch.values())
