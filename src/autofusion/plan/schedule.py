"""The plan: what runs, in which order, as kernels or as single ops.

In: a graph, the solver's groups and its lowering of them. Out: a `Plan`, a list of steps in
dependency order (`KernelStep` for a fused kernel, `OpStep` for an op run by the reference runtime:
anchors, externs, ops no kernel can express), plus the statistics users see in `.stats`.
A group whose lowering fails becomes op steps, with the reason kept on each step.
"""

from __future__ import annotations

import heapq
import logging
import math
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Protocol

# The plan's records only: running a plan (a loaded package) must not import the solver.
from autofusion.fusion.records import Decision, GemmSpec
from autofusion.hw.profile import HardwareProfile
from autofusion.ir.catalog import VIEWS
from autofusion.ir.graph import Graph, Node
from autofusion.ir.symbolic import unrecorded
from autofusion.ir.types import TensorType
from autofusion.kernel.lower import LoopKernel, NotExpressible
from autofusion.kernel.tile import Tile, TileKnobs, choose_tile

if TYPE_CHECKING:
    from autofusion.fusion.solver import FusionResult, Solver

log = logging.getLogger("autofusion.fusion")

# Ops that move no data on their own: views fold into index arithmetic and literals into constants.
NO_TRAFFIC = VIEWS | {"full"}


class Step(Protocol):
    """What every plan step says about itself, whatever runs it: the reading contract of schedules,
    memory plans, dumps and exporters. Only code that runs a step (a kernel call or an op call) needs
    to know which kind it is (`PlanStep`)."""

    @property
    def name(self) -> str: ...  # the kernel's symbol, or the node's name
    @property
    def inputs(self) -> tuple[int, ...]: ...  # value ids it reads
    @property
    def outputs(self) -> tuple[int, ...]: ...  # value ids it writes
    @property
    def nodes(self) -> tuple[int, ...]: ...  # node indices it computes
    @property
    def first_node(self) -> int: ...  # its earliest node index (the scheduler's tie-break)


@dataclass(frozen=True)
class KernelStep:
    """A plan step running one fused kernel."""

    name: str
    kernel: LoopKernel
    tile: Tile
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    nodes: tuple[int, ...]  # node indices it computes (its free nodes included)
    # A GEMM the kernel runs first, block by block, its epilogue (`kernel`) reading each block while it
    # is in cache (codegen/cpp/gemm.py). Then `inputs` are the GEMM's operands and the epilogue's other
    # inputs, `outputs` the epilogue's and, when read elsewhere too, the GEMM's output.
    gemm: GemmSpec | None = None

    @property
    def first_node(self) -> int:
        return min(self.nodes)

    def input_types(self, types: dict[int, TensorType]) -> list[TensorType]:
        """The layout each input is read with (for a plain kernel, its buffers' types)."""
        if self.gemm is None:
            return [self.kernel.buffers[j].type for j in range(len(self.inputs))]
        return [types[v] for v in self.inputs]


@dataclass(frozen=True)
class OpStep:
    """A plan step running one node outside any kernel, and why."""

    node_index: int
    node: Node
    reason: str

    @property
    def name(self) -> str:
        return self.node.name

    @property
    def inputs(self) -> tuple[int, ...]:
        return self.node.inputs

    @property
    def outputs(self) -> tuple[int, ...]:
        return tuple(v.id for v in self.node.outputs)

    @property
    def nodes(self) -> tuple[int, ...]:
        return (self.node_index,)

    @property
    def first_node(self) -> int:
        return self.node_index


# The closed set of step kinds a plan holds (isinstance on it where running them differs).
PlanStep = KernelStep | OpStep


@dataclass(frozen=True)
class Plan:
    """What runs a graph: its steps in order, the fusion decisions and the profile they were made for."""

    graph: Graph
    steps: tuple[PlanStep, ...]
    decisions: tuple[Decision, ...]
    profile: HardwareProfile
    # Filled by `build_plan` (and the compiler, before the plan is used); a dict for `.stats` readers,
    # never changed once the plan is made.
    stats: dict[str, Any] = field(default_factory=dict)

    @property
    def kernels(self) -> list[KernelStep]:
        return [s for s in self.steps if isinstance(s, KernelStep)]

    @property
    def op_steps(self) -> list[OpStep]:
        return [s for s in self.steps if isinstance(s, OpStep)]


def _kernel_name(index: int, kernel: LoopKernel, gemm: Node | None = None) -> str:
    ops = [gemm.op] if gemm is not None else []
    for n in kernel.nodes:
        if n.op not in NO_TRAFFIC and n.op not in ops:
            ops.append(n.op)
    return f"autofused_{index}_" + "_".join(ops[:6] or ["copy"])


def build_plan(graph: Graph, result: FusionResult, solver: Solver, profile: HardwareProfile,
               tiles: TileKnobs | None = None) -> Plan:  # fmt: skip
    """The steps of `result`, each kernel with its tile (`tiles`: forced tile parameters, Options')."""
    nodes = graph.nodes
    producer = {v.id: k for k, n in enumerate(nodes) for v in n.outputs}
    steps: list[PlanStep] = []
    covered: set[int] = set()
    n_kernels = 0
    gemm_nodes = {g.node for g in result.gemms.values()}
    for members in result.groups:
        gemm = result.gemms.get(members[0])
        alone = None if len(members) > 1 or gemm else _library_is_faster_alone(nodes[members[0]], profile)
        if alone:
            steps.append(OpStep(members[0], nodes[members[0]], alone))
            continue
        try:
            kernel = solver.kernel_for(members)
        except NotExpressible as e:
            for k in members:
                steps.append(OpStep(k, nodes[k], f"[{e.code}] {e.reason}"))
            if gemm:
                steps.append(OpStep(gemm.node, nodes[gemm.node], f"its epilogue kernel failed: {e.reason}"))
            continue
        name = _kernel_name(n_kernels, kernel, nodes[gemm.node] if gemm else None)
        n_kernels += 1
        kernel = replace(kernel, name=name)
        inputs, outputs = solver.io(members)
        computed = tuple(solver.with_free(members))
        if gemm:
            # The GEMM's output is made inside: not an input; an output only where others read it.
            y = gemm.operands.y
            inputs = list(dict.fromkeys([*gemm.inputs, *(v for v in inputs if v != y)]))
            outputs = [*outputs, y] if gemm.y_out else outputs
            computed = tuple(sorted((*computed, gemm.node)))
        with unrecorded():  # derived from the kernel: chosen again per size (`retile`), no guard
            tile = choose_tile(kernel, profile, tiles)
        steps.append(KernelStep(name, kernel, tile, tuple(inputs), tuple(outputs), computed, gemm))
        covered.update(members)
    grouped = {k for m in result.groups for k in m} | gemm_nodes
    needed = set(graph.outputs)
    for s in steps:
        needed.update(s.inputs)
    for k, n in enumerate(nodes):
        if k in grouped or k in result.free:
            continue
        steps.append(
            OpStep(k, n, "opaque" if n.op in ("extern", "const") else f"{n.op} runs as a library call")
        )
        needed.update(n.inputs)
    # Free nodes run on their own only when something outside the kernels reads them.
    for k in range(len(nodes) - 1, -1, -1):
        if k in result.free and any(v.id in needed for v in nodes[k].outputs):
            steps.append(OpStep(k, nodes[k], "view or literal read outside kernels"))
            needed.update(nodes[k].inputs)
    ordered = _topological(steps, producer)
    plan = Plan(graph, tuple(ordered), tuple(result.decisions), profile)
    with unrecorded():  # derived from the plan: computed again per size, no guard
        return replace(plan, stats=plan_stats(plan))


def retile(plan: Plan, tiles: TileKnobs | None) -> Plan:
    """`plan` with each kernel's tile chosen again and its stats computed again (what `build_plan`
    derives from the kernels, for a plan whose sizes were substituted: `autofusion.reuse`)."""
    steps = tuple(replace(s, tile=choose_tile(s.kernel, plan.profile, tiles)) if isinstance(s, KernelStep)
                  else s for s in plan.steps)  # fmt: skip
    out = replace(plan, steps=steps)
    return replace(out, stats={**plan.stats, **plan_stats(out)})


# Ops whose generated code is slower than ATen's when nothing is fused with them, and the size from
# which ATen wins on the CPU profile. GELU: our erf-GELU keeps relative accuracy in the negative tail
# (ATen's has none below -4) and costs ~0.26-0.39 ns per element per core against ATen's ~0.2-0.28
# (0.73x on the 2-core EPYC, 1 thread, loaded, 2026-12-03; a lone f32 gelu measured 0.77-0.88x eager
# from 16k to 393k elements, 0.98x at 1.5M where both wait on memory); below ~32k elements the call
# into torch costs more than it saves. Fused with neighbours it stays in the kernel (the saved memory
# traffic pays for it). The tanh form is faster than ATen's alone (3.2x) and is not listed.
LIBRARY_FASTER_ALONE: dict[str, int] = {"gelu": 32768}


def _library_is_faster_alone(node: Node, profile: HardwareProfile) -> str | None:
    least = LIBRARY_FASTER_ALONE.get(node.op)
    if least is None or profile.name != "cpu" or node.attr_dict.get("approximate", "none") != "none":
        return None
    numel = math.prod(node.outputs[0].type.shape)
    if numel < least:
        return None
    return f"{node.op} alone on {numel} elements runs faster as ATen's kernel than as ours (>= {least})"


def _topological(steps: list[PlanStep], producer: dict[int, int]) -> list[PlanStep]:
    """Dependency order; among ready steps, the one holding the earliest node goes first."""
    owner: dict[int, int] = {}
    for i, s in enumerate(steps):
        for v in s.outputs:
            owner[v] = i
    deps: list[set[int]] = []
    for s in steps:
        deps.append({owner[v] for v in s.inputs if v in owner})
    users: dict[int, list[int]] = {}
    for i, d in enumerate(deps):
        for j in d:
            users.setdefault(j, []).append(i)
    remaining = [len(d) for d in deps]
    key = [s.first_node for s in steps]
    ready = [(key[i], i) for i in range(len(steps)) if remaining[i] == 0]
    heapq.heapify(ready)
    out: list[PlanStep] = []
    while ready:
        _, i = heapq.heappop(ready)
        out.append(steps[i])
        for j in users.get(i, []):
            remaining[j] -= 1
            if remaining[j] == 0:
                heapq.heappush(ready, (key[j], j))
    if len(out) != len(steps):
        raise RuntimeError("plan steps form a cycle; the solver's cycle check should have prevented this")
    return out


def plan_stats(plan: Plan) -> dict[str, Any]:
    from autofusion.fusion.cost import estimate  # the cost model: compile time only

    g = plan.graph
    types = g.value_types()
    kernels = plan.kernels
    ops = plan.op_steps
    # Unfused traffic: every node reads its inputs and writes its outputs (views and literals excepted).
    before = 0
    for n in g.nodes:
        if n.op in NO_TRAFFIC:
            continue
        before += sum(types[i].nbytes for i in n.inputs) + sum(v.type.nbytes for v in n.outputs)
    estimates = [estimate(k.kernel, plan.profile, k.tile) for k in kernels]
    after = sum(e.bytes for e in estimates)
    after += sum(sum(types[i].nbytes for i in s.node.inputs) + sum(v.type.nbytes for v in s.node.outputs)
                 for s in ops if s.node.op not in NO_TRAFFIC)  # fmt: skip
    return {
        "kernels": len(kernels) + len([s for s in ops if s.node.op not in ("const",)]),
        "fused_kernels": len(kernels),
        "bytes_before": before,
        "bytes_after": after,
        "estimated_us": sum(e.seconds for e in estimates) * 1e6,
        "decisions": len(plan.decisions),
        "rejected": sum(1 for d in plan.decisions if not d.accepted),
    }
