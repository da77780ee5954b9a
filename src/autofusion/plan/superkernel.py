"""SuperKernel planning: which plan steps run inside one compiled entry, in which phases, where.

In: a `Plan` (kernel steps and op steps in dependency order) and which op steps the C++ entry can
call itself (`callable_ops`: step index -> how, e.g. a BLAS sgemm). Out: a `SuperPlan`:
- `program`: the run order, each item a `SuperKernel` (several steps, one C++ call) or the index of
  a step that runs on its own through torch;
- `splits`: why a scope had to split, with codes in the spirit of CANN's SuperKernel fail reasons
  (OP_UNSUPPORT, EXTERNAL_DEPEND, IN_UNFUSIBLE_SCOPE), each logged once at INFO;
- `arena`: one buffer for every intermediate a SuperKernel writes, offsets planned by lifetime.

Grouping: steps are re-ordered (staying topological) so that a SuperKernel takes every kernel that
is ready before an op it cannot call forces a return to Python: ready members of the current scope
first, op steps only when no member is ready, except before the first SuperKernel, where ready op
steps run first (they then split nothing). Only steps of the same scope mark (the
`super_kernel_scope` names around the code, or the default scope "") share a SuperKernel.

Phases: inside a SuperKernel a member's phase is one more than the latest phase of the members it
reads from (0 if none), so independent kernels share a phase and start together (early start), and
a barrier separates consecutive phases (sync only where data flows). `early-start=0` or
`debug-sync-all=1` give every member its own phase.
"""

from __future__ import annotations

import heapq
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field

from autofusion.errors import FusionError
from autofusion.ir.graph import Graph
from autofusion.ir.scope import NO_SCOPE, Scope, SuperKernelOptions
from autofusion.plan.aliasing import alias_roots, reachable
from autofusion.plan.memory import ArenaPlan, Lifetime, plan_arena
from autofusion.plan.schedule import NO_TRAFFIC, KernelStep, OpStep, Plan, PlanStep

log = logging.getLogger("autofusion.superkernel")


@dataclass(frozen=True)
class SuperKernel:
    """One SuperKernel entry: the plan steps it runs, in phases with a barrier between them."""

    name: str
    scope: str
    options: SuperKernelOptions
    members: tuple[int, ...]  # plan step indices, in an order that is a valid serial schedule
    phases: tuple[tuple[int, ...], ...] = ()  # members per phase; a barrier between phases

    @property
    def barriers(self) -> int:
        """Synchronisation points: barriers inside parallel regions and region ends around library calls."""
        return max(0, len(self.phases) - 1)


@dataclass(frozen=True)
class Split:
    """Where a SuperKernel scope was split, and why."""

    code: str
    scope: str
    step: int
    reason: str

    def __str__(self) -> str:
        return f"[{self.code}] {self.reason}"


@dataclass(frozen=True)
class SuperPlan:
    """A plan as SuperKernel entries and the steps between them, with their arena."""

    plan: Plan
    program: tuple[SuperKernel | int, ...]
    splits: tuple[Split, ...]
    arena: ArenaPlan
    arena_values: dict[int, int]  # value id -> byte offset in the arena
    callable_ops: dict[
        int, str
    ]  # step index -> "sgemm" | "gemv" | "bmm" | "sdpa" | "scatter" | "dnnl_conv" | "alias"
    strides: dict[int, tuple[int, ...]] = field(default_factory=dict)  # real strides, where not the IR's

    @property
    def super_kernels(self) -> list[SuperKernel]:
        return [p for p in self.program if isinstance(p, SuperKernel)]


@dataclass
class SuperEntry:
    """How one SuperKernel entry point is called (rendered by `codegen/cpp/superkernel.py`, run by
    `runtime/super_executor.py`; here so that running a plan needs no code generator)."""

    name: str
    slots: list[int]  # value id held by each pointer slot
    params: list[int]  # the P array


# The entry's library pointer array F: F[0] a Fortran-ABI sgemm_, F[1] the dnnl glue's
# `af_dnnl_conv_execute`, F[2] a buffer for its error text (DNNL_ERR_LEN bytes; empty while all is well),
# then one oneDNN primitive handle per "dnnl_conv" member (`dnnl_handles`), filled in at call time.
DNNL_FIRST_HANDLE = 3
DNNL_ERR_LEN = 512


def dnnl_handles(splan: SuperPlan) -> dict[int, int]:
    """Each "dnnl_conv" member's index in F, in program order (renderer and executor agree on it)."""
    members = [m for sk in splan.super_kernels for m in sk.members
               if splan.callable_ops.get(m) == "dnnl_conv"]  # fmt: skip
    return {m: DNNL_FIRST_HANDLE + k for k, m in enumerate(members)}


def step_scope(step: PlanStep, graph: Graph) -> Scope:
    """The scope of a step: its first computing node's."""
    if isinstance(step, OpStep):
        return step.node.scope  # an op step's node may be a view or literal: its own mark counts
    marks = [graph.nodes[k].scope for k in sorted(step.nodes) if graph.nodes[k].op not in NO_TRAFFIC]
    return marks[0] if marks else NO_SCOPE


def _split_code(step: OpStep, why_not: str | None) -> tuple[str, str]:
    node = step.node
    if node.scope.no_fuse:
        return "IN_UNFUSIBLE_SCOPE", f"{node.name} ({node.op}) is marked super_kernel_scope(None)"
    if node.op in NO_TRAFFIC:
        return (
            "EXTERNAL_DEPEND",
            f"{node.name} ({node.op}) is materialised by torch: {why_not or step.reason}",
        )
    what = node.attr("target") if node.op == "extern" else node.op
    return "OP_UNSUPPORT", f"{node.name} ({what}) cannot be called from the entry: {why_not or step.reason}"


def build_super_plan(
    plan: Plan,
    callable_ops: Mapping[int, str] | None = None,
    why_not: Mapping[int, str] | None = None,
    strides: Mapping[int, tuple[int, ...]] | None = None,
) -> SuperPlan:
    """`callable_ops`: op steps the entry runs itself; `why_not`: why other op steps cannot be;
    `strides`: real strides of values whose layout differs from their IR type (views)."""
    callable_ops = dict(callable_ops or {})
    why_not = why_not or {}
    steps, graph = plan.steps, plan.graph
    n = len(steps)
    owner = {v: i for i, s in enumerate(steps) for v in s.outputs}
    deps = [{owner[v] for v in s.inputs if v in owner} for s in steps]
    users: list[list[int]] = [[] for _ in steps]
    for i, d in enumerate(deps):
        for j in d:
            users[j].append(i)
    member = [isinstance(s, KernelStep) or i in callable_ops for i, s in enumerate(steps)]
    scope = [step_scope(s, graph) for s in steps]
    remaining = [len(d) for d in deps]
    ready_members: list[int] = []
    ready_ops: list[int] = []
    for i in range(n):
        if remaining[i] == 0:
            _push(ready_members, ready_ops, member[i], i)

    program: list[SuperKernel | int] = []
    splits: list[Split] = []
    current: list[int] = []
    current_scope: Scope | None = None

    def finish(i: int) -> None:
        for j in users[i]:
            remaining[j] -= 1
            if remaining[j] == 0:
                _push(ready_members, ready_ops, member[j], j)

    def close() -> None:
        nonlocal current, current_scope
        if current:
            program.append(_make(len(program), current, current_scope or NO_SCOPE, plan, callable_ops))
        current, current_scope = [], None

    while ready_members or ready_ops:
        if ready_ops and not current and not any(isinstance(p, SuperKernel) for p in program):
            # Before the first entry, torch steps run as soon as they are ready: a member that waits
            # for one would otherwise split the entry (a decode step's embedding gather).
            i = heapq.heappop(ready_ops)
            program.append(i)
            finish(i)
            continue
        key = None if current_scope is None else current_scope.name
        same = [j for j in ready_members if key is None or scope[j].name == key]
        if same:
            i = min(same)
            ready_members.remove(i)
            current_scope = scope[i] if current_scope is None else current_scope
            current.append(i)
            finish(i)
            continue
        if not ready_ops:
            close()  # only members of another scope are ready: they start the next SuperKernel
            continue
        i = heapq.heappop(ready_ops)
        # An op a later member waits for forces a return to Python between two entries: say why.
        if any(member[j] for j in users[i]) and (current or any(isinstance(p, SuperKernel) for p in program)):
            # Not a member, so not a KernelStep: an OpStep (the list of steps is not typed per index).
            code, reason = _split_code(steps[i], why_not.get(i))  # type: ignore[arg-type]
            splits.append(Split(code, key or "", i, reason))
            log.info("super kernel scope %r splits at %s", key or "<default>", splits[-1])
            if current_scope is not None and current_scope.options.strict_scope_check:
                node = steps[i].node  # type: ignore[union-attr]  # an OpStep, as above
                where = f" (from {node.loc})" if node.loc else ""
                raise FusionError(f"super_kernel_scope({key!r}) has strict-scope-check=1 but must split at "
                                  f"{node.name}{where}: {splits[-1]}")  # fmt: skip
        close()
        program.append(i)
        finish(i)
    close()
    if sum(len(p.members) if isinstance(p, SuperKernel) else 1 for p in program) != n:
        raise RuntimeError("super kernel grouping lost a step; plan steps form a cycle")
    arena, values = _plan_memory(plan, program, callable_ops)
    return SuperPlan(plan, tuple(program), tuple(splits), arena, values, callable_ops, dict(strides or {}))


def _push(members: list[int], ops: list[int], is_member: bool, i: int) -> None:
    if is_member:
        members.append(i)
    else:
        heapq.heappush(ops, i)


def _make(index: int, members: list[int], scope: Scope, plan: Plan,
          callable_ops: Mapping[int, str]) -> SuperKernel:  # fmt: skip
    # Planning only: a loaded package's SuperPlan is made already, and its load path skips entry_ops.
    from autofusion.plan.entry_ops import REGION_KINDS

    produced = {v: m for m in members for v in plan.steps[m].outputs}
    phase: dict[int, int] = {}
    library_phases: set[int] = set()
    for m in members:
        kind = callable_ops.get(m)
        srcs = [phase[produced[v]] for v in plan.steps[m].inputs if v in produced]
        if kind == "alias":
            # A view runs no code: it is ready when its source is, and its readers wait for that.
            phase[m] = max(srcs, default=0)
        elif scope.options.sync_all:
            phase[m] = max(phase.values(), default=-1) + 1
        elif kind is not None and kind not in REGION_KINDS:
            # A library call (BLAS) brings its own threads: it runs alone, after all earlier members.
            phase[m] = max(phase.values(), default=-1) + 1
            library_phases.add(phase[m])
        else:
            phase[m] = 1 + max(srcs) if srcs else 0
            while phase[m] in library_phases:
                phase[m] += 1
    count = max(phase.values(), default=-1) + 1
    phases = [[m for m in members if phase[m] == p] for p in range(count)]
    # Phases with nothing but views hold no code: fold them into the phase before (no barrier).
    merged: list[list[int]] = []
    for p in phases:
        if merged and all(callable_ops.get(m) == "alias" for m in p):
            merged[-1] += p
        elif p:
            merged.append(p)
    return SuperKernel(f"af_super_{index}", scope.name, scope.options, tuple(m for p in merged for m in p),
                       tuple(tuple(p) for p in merged))  # fmt: skip


def _plan_memory(plan: Plan, program: list[SuperKernel | int], callable_ops: Mapping[int, str]
                 ) -> tuple[ArenaPlan, dict[int, int]]:  # fmt: skip
    """Arena offsets for values written inside SuperKernels that no caller ever sees."""
    graph = plan.graph
    types = graph.value_types()
    tick_of: dict[int, int] = {}  # step index -> tick
    tick = 0
    for item in program:
        if isinstance(item, SuperKernel):
            for phase in item.phases:
                for m in phase:
                    tick_of[m] = tick
                tick += 1
        else:
            tick_of[item] = tick
            tick += 1
    in_super = {m for item in program if isinstance(item, SuperKernel) for m in item.members}
    # Alias roots: a torch op that may return a view keeps its inputs alive as long as its result. An op
    # an entry runs itself (but a view) writes the buffer the entry hands it: no alias, so its result
    # can live in the arena (a oneDNN convolution is an extern, which torch could alias: counted as
    # one, MobileNetV2's 51 entry convolutions got a fresh tensor per call, 192 MB at batch 8).
    own = {i for i in in_super if callable_ops.get(i) not in (None, "alias")}
    root = alias_roots([s for i, s in enumerate(plan.steps) if i not in own])
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    escapes = reachable(graph.outputs, root)
    for i, s in enumerate(plan.steps):
        for v in s.outputs:
            first.setdefault(v, tick_of[i])
        for v in s.inputs:
            for r in root.get(v, (v,)):
                last[r] = max(last.get(r, -1), tick_of[i])
    lifetimes = []
    for i, s in enumerate(plan.steps):
        if i not in in_super:
            continue
        for v in s.outputs:
            if v in escapes or v in root:
                continue
            lifetimes.append(Lifetime(v, types[v].nbytes, first[v], max(last.get(v, first[v]), first[v])))
    arena = plan_arena(lifetimes)
    return arena, dict(arena.offsets)
