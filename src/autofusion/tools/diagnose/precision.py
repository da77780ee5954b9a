"""Precision analyzer: each fused kernel against the unfused reference, on the same inputs.

In: a compiled model and example inputs. Out: one `GroupCheck` per fused kernel: cosine similarity,
max absolute error, max relative error and the scaled error (max |fused - ref| / max |ref|, the
measure the demo uses), flagged when the scaled error exceeds `rtol` or the cosine falls below
`min_cosine` (defaults per dtype: `compare.TOLERANCES`, the table every tool uses).

Method (CANN's fusion_precision_analyzer, per fused op): run the whole planned graph through the
reference runtime once, keeping every value; then call each kernel of the built library alone on the
values its inputs had in that run, and compare its outputs with the reference values of the same IR
values (computed op by op in torch). Feeding every kernel reference inputs isolates it: an error in
one kernel is not blamed on the kernels after it.

Both are also compared with the same nodes run in float64 (`fused_vs_fp64`, `reference_vs_fp64`):
in half precision the op-by-op reference rounds after every op while the kernel computes in fp32,
so a fused result that differs from the reference is often the closer one to the exact value.

Each output is compared by `compare.compare_tensors`, the comparison every tool uses.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from autofusion.ir.graph import Graph
from autofusion.ir.interpret import run_node
from autofusion.plan.schedule import KernelStep
from autofusion.runtime.buffers import to_layout
from autofusion.tools.diagnose.compare import compare_tensors, tolerance


@dataclass
class GroupCheck:
    kernel: str
    ops: list[str]
    nodes: list[str]
    dtype: str
    cosine: float = 1.0
    max_abs: float = 0.0
    max_rel: float = 0.0
    scaled: float = 0.0
    rtol: float = 0.0
    min_cosine: float = 0.0
    flagged: bool = False
    # Scaled error against a float64 run of the same nodes on the same inputs: is the fused kernel
    # (fp32 inside) closer to the exact result than the op-by-op reference (CANN: "not worse than eager")?
    fused_vs_fp64: float | None = None
    reference_vs_fp64: float | None = None
    note: str = ""
    outputs: list[dict[str, Any]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def reference_values(graph: Graph, inputs: Sequence[torch.Tensor]) -> dict[int, torch.Tensor]:
    """Every value of one reference run (nothing is dropped: the checks read intermediates)."""
    env: dict[int, torch.Tensor] = {gi.value.id: t for gi, t in zip(graph.inputs, inputs, strict=True)}
    with torch.no_grad():
        for node in graph.nodes:
            outs = run_node(node, [env[i] for i in node.inputs], graph)
            for v, t in zip(node.outputs, outs, strict=True):
                env[v.id] = t
    return env


def call_kernel(program: Any, step: KernelStep, env: dict[int, torch.Tensor]) -> list[torch.Tensor]:
    """Run one kernel of the built library on `env`'s values of its inputs; fresh output tensors."""
    fn = getattr(program.library, step.name)
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    fn.restype = None
    values = program.params.get(step.name, [])
    p_array = (ctypes.c_int64 * max(1, len(values)))(*values)
    types = program.plan.graph.value_types()
    keep: list[torch.Tensor] = []
    ptrs: list[int] = []
    for v, t in zip(step.inputs, step.input_types(types), strict=True):
        x = to_layout(env[v], t)  # the layout the kernel was compiled for
        keep.append(x)
        ptrs.append(x.data_ptr())
    outs = [torch.empty(types[v].shape, dtype=types[v].dtype.to_torch()) for v in step.outputs]
    ptrs += [o.data_ptr() for o in outs]
    fn((ctypes.c_void_p * len(ptrs))(*ptrs), ctypes.addressof(p_array))
    return outs


def fp64_values(
    step: KernelStep, env: dict[int, torch.Tensor], graph: Graph
) -> dict[int, torch.Tensor] | None:
    """The kernel's nodes run op by op in float64 on its (upcast) inputs; None when an op refuses.
    Casts between float types keep float64: the exact value is the unrounded one (a half-type
    composite casts to fp32 and back, and rounding here would make a 1-ulp tie flip look like error)."""
    local = {v: env[v].double() if env[v].is_floating_point() else env[v] for v in step.inputs}
    try:
        with torch.no_grad():
            for n in (graph.nodes[k] for k in step.nodes):  # a GEMM + epilogue step's GEMM included
                ins = [local[i] for i in n.inputs]
                if n.op == "cast" and n.out.type.dtype.is_float and ins[0].is_floating_point():
                    local[n.out.id] = ins[0]
                    continue
                outs = run_node(n, ins, graph)
                for v, t in zip(n.outputs, outs, strict=True):
                    local[v.id] = t.double() if t.is_floating_point() else t
    except Exception:  # noqa: BLE001 - an op without a float64 path: no exact reference for this kernel
        return None
    return local


def check_program(
    program: Any,
    graph_inputs: Sequence[torch.Tensor],
    rtol: float | None = None,
    min_cosine: float | None = None,
) -> list[GroupCheck]:
    plan = program.plan
    env = reference_values(plan.graph, program.plan_inputs(graph_inputs))  # + folded parameters
    types = plan.graph.value_types()
    results = []
    for step in plan.kernels:
        dtypes = [types[v].dtype.to_torch() for v in step.outputs]
        dtype = next((d for d in dtypes if d.is_floating_point), dtypes[0])
        d_rtol, d_cos = tolerance(dtype).rtol, tolerance(dtype).min_cosine
        check = GroupCheck(
            step.name,
            [n.op for n in step.kernel.nodes],
            [n.name for n in step.kernel.nodes],
            str(dtype).removeprefix("torch."),
            rtol=d_rtol if rtol is None else rtol,
            min_cosine=d_cos if min_cosine is None else min_cosine,
        )
        if program.library is None:
            check.note = "not built (the plan runs on the reference runtime): nothing to compare"
            results.append(check)
            continue
        outs = call_kernel(program, step, env)
        exact = fp64_values(step, env, plan.graph)
        for v, out in zip(step.outputs, outs, strict=True):
            if exact is not None and out.is_floating_point():
                f, r = compare_tensors(out, exact[v]).scaled, compare_tensors(env[v], exact[v]).scaled
                check.fused_vs_fp64 = max(check.fused_vs_fp64 or 0.0, f)
                check.reference_vs_fp64 = max(check.reference_vs_fp64 or 0.0, r)
            c = compare_tensors(out, env[v])
            check.outputs.append({"value": v, **asdict(c)})
            check.cosine = min(check.cosine, c.cosine)
            check.max_abs = max(check.max_abs, c.max_abs)
            check.max_rel = max(check.max_rel, c.max_rel)
            check.scaled = max(check.scaled, c.scaled)
        check.flagged = check.scaled > check.rtol or check.cosine < check.min_cosine
        results.append(check)
    return results


def check_model(
    model: Any,
    inputs: Sequence[Any],
    rtol: float | None = None,
    min_cosine: float | None = None,
    **options: Any,
) -> tuple[list[GroupCheck], Any]:
    """Compile `model` for `inputs` and check every fused kernel. Returns the checks and the model."""
    from autofusion import api

    with torch.no_grad():
        cm = api.compile(model, inputs, **options)
    cg = cm.compiled
    if cg is None or cg.program is None:
        return [], cm
    return check_program(cg.program, cg.bind(list(inputs)), rtol, min_cosine), cm
