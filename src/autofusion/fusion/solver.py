"""The fusion solver: which nodes become one kernel.

In: a decomposed graph, a hardware profile and limits. Out: groups of node indices plus every decision
taken on the way (`Decision`, accepted or rejected with an NF code and numbers).

Algorithm (the one CANN's solver uses):
1. Every fusible node starts as its own group. "Free" nodes (literals, and views of values computed
   outside any kernel) are not grouped: each kernel that reads them includes its own copy, where they
   cost index arithmetic only.
2. Each round, candidates are pairs of groups that share a buffer: producer -> consumer (vertical)
   and two consumers of one value (horizontal). Buckets, in order: vertical between pointwise groups,
   vertical touching a reduction, horizontal. Inside a bucket: larger shared bytes first, then closer
   in topological order, then earlier; the order never depends on hashing.
3. Greedy apply: for each candidate, map both sides to their current groups and check, in order:
   size (NF1010), one SuperKernel scope (NF2009), no cycle through an outside node (NF1002), the
   merged group lowers to one kernel (kernel/lower.py: NF1006, NF2002-NF2005...), inputs within the
   limit (NF1007), a reduction row
   within the on-chip budget unless multi-pass pays (NF2006), and the cost model's net benefit
   (NF2007). Accepted pairs merge (union-find); at most `max_rounds` rounds, stopping when none merge.
The cycle check (fusion/dag.py) is exact and runs on the graph of groups, not of nodes: a kernel
is one step, so a path into any of its nodes leaves through all of them. It keeps a topological rank
per group, so a search stops at the later side's rank: adjacent merges (the common case) cost
O(degree) and a 100k-node graph plans in seconds.
"""

from __future__ import annotations

import logging
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

from autofusion.fusion.cost import Benefit, gemm_epilogue_benefit, merge_benefit
from autofusion.fusion.dag import GroupDag
from autofusion.fusion.gemm import GEMM_OPS, GemmSpec, block_units, epilogue_fit, gemm_operands
from autofusion.fusion.legality import Refusal, op_refusal
from autofusion.fusion.records import Decision as Decision  # defined there, re-exported
from autofusion.fusion.records import GemmOperands
from autofusion.hw.profile import HardwareProfile
from autofusion.ir import nf
from autofusion.ir.analysis import use_def
from autofusion.ir.catalog import VIEWS
from autofusion.ir.graph import Graph, Node
from autofusion.ir.symbolic import unrecorded, verdict
from autofusion.ir.types import TensorType
from autofusion.kernel.lower import REDUCE_COMBINE, LoopKernel, NotExpressible, lower_group
from autofusion.kernel.tile import choose_tile, strided_walk

log = logging.getLogger("autofusion.fusion")

# Budgets that a larger group can only exceed further: the node count. (Not the input count: a larger
# group can absorb an input's producer; not NF2006: a larger group can also save more traffic.)
BUDGET_CODES = frozenset({nf.TOO_MANY_NODES})


@dataclass(frozen=True)
class FusionLimits:
    max_fusion_size: int = 64
    max_inputs: int = 16
    max_rounds: int = 10
    # A cheap pointwise group read by at most this many other kernels is recomputed inside each of
    # them instead of written out (CANN's --recomputation_threshold, default 1: always materialise).
    recomputation_threshold: int = 1
    max_recompute_nodes: int = 8
    min_benefit_s: float = 0.0  # a merge must save more than this (seconds)
    horizontal: bool = True  # merge sibling kernels that share an input (pass name `horizontal_kernel`)
    # Node names whose merges are refused (NF2100), e.g. a list `autofusion bisect` wrote.
    disabled: frozenset[str] = frozenset()
    # Accept only the first N merges in solver order (NF2101 after that); None = no limit. The solver is
    # deterministic, so the first N merges are the same as in the unlimited run: bisection's axis.
    max_merges: int | None = None
    # Run each GEMM (linear, mm, addmm) inside the pointwise kernel that reads its output
    # (fusion/gemm.py), where the cost model says it pays. Off by default: the runtime must have a
    # C-callable sgemm, which the caller checks; `gemm_off` says why it is off (logged per GEMM).
    gemm_epilogue: bool = False
    gemm_off: str = ""
    # Why a GEMM runs faster as its own library call (a prepacked weight measured faster than the
    # plain GEMM the kernel would call per block), or None; given by the caller, who can measure.
    gemm_library: Callable[[Node], str | None] | None = field(default=None, compare=False)


@dataclass
class FusionResult:
    groups: list[list[int]]  # node indices per kernel group, each sorted
    free: set[int]  # node indices copied into the kernels that read them
    decisions: list[Decision] = field(default_factory=list)
    # The GEMM each group runs first, by the group's first node index (fusion/gemm.py).
    gemms: dict[int, GemmSpec] = field(default_factory=dict)


class Solver:
    def __init__(self, graph: Graph, profile: HardwareProfile, limits: FusionLimits,
                 supports: Callable[[Node], str | None]) -> None:  # fmt: skip
        self.g = graph
        self.profile = profile
        self.limits = limits
        self.supports = supports
        self.nodes = graph.nodes
        self.types: dict[int, TensorType] = graph.value_types()
        facts = use_def(graph)
        self.pos_of_value = facts.producer  # value id -> producing node index
        self.users = facts.node_users  # node index -> consumer node indices
        self.value_users = facts.uses  # value id -> consumer node indices
        self.graph_outputs = set(graph.outputs)
        self.fusible = [self._fusible(n) for n in self.nodes]
        self.decisions: list[Decision] = []
        self.free = self._free_nodes()
        self.parent = list(range(len(self.nodes)))
        self.members: dict[int, list[int]] = {
            k: [k] for k in range(len(self.nodes)) if self.fusible[k] and k not in self.free
        }
        self.dag = GroupDag(self.users, self.free)  # groups and the nodes that run alone, kept acyclic
        self.kernels: dict[int, LoopKernel] = {}
        self.rejected: dict[tuple[tuple[int, ...], tuple[int, ...]], Decision] = {}
        # Groups that failed a budget, by their first node index.
        self.over_budget: dict[int, list[tuple[frozenset[int], Decision]]] = {}
        self.merges = 0

    def force(self, groups: list[list[int]]) -> None:
        """Start from the groups fusion rules asked for (`becomes: kernel`): each becomes one group if
        it lowers to one kernel; otherwise the reason is logged and the solver decides as usual."""
        for group in groups:
            members = sorted(k for k in group if k in self.members)
            if len(members) < 2:
                continue
            names = f"{self.nodes[members[0]].name}(+{len(members) - 1} nodes)"
            try:
                if self.dag.creates_cycle(members):
                    raise NotExpressible(nf.CYCLE, "a path between its nodes leaves the group and comes back")
                kernel = self.lower(members)
            except NotExpressible as e:
                d = Decision(
                    names,
                    "rule group",
                    False,
                    e.code,
                    f"a rule's kernel group cannot be one kernel: {e.reason}",
                    kind="rule",
                )
                self.decisions.append(d)
                log.info("%s", d.line())
                continue
            root = members[0]
            self.dag.merge(members, root)
            for k in members[1:]:
                self.parent[k] = root
                del self.members[k]
            self.members[root] = members
            self.kernels[root] = kernel
            d = Decision(names, "rule group", True, kind="rule")
            self.decisions.append(d)
            log.info("node1 %s is one kernel by a fusion rule", names)

    # -- classification ----------------------------------------------------------------------------
    def _fusible(self, n: Node) -> bool:
        # The registry first (fusion/legality.py), then what the backend can render.
        return op_refusal(n.op) is None and self.supports(n) is None

    def _free_nodes(self) -> set[int]:
        free: set[int] = set()
        # Backward: cheap producers to recompute (their consumers are only known looking forward).
        if self.limits.recomputation_threshold >= 2:
            for k in range(len(self.nodes) - 1, -1, -1):
                n = self.nodes[k]
                if not self.fusible[k] or n.op in REDUCE_COMBINE or n.op in VIEWS or n.op == "full":
                    continue
                users = self._effective_users(k, free)
                if self._recomputable(n, users):
                    free.add(k)
                    d = Decision(
                        f"{n.name}({n.op})",
                        f"{len(users)} consumers",
                        True,
                        kind="recompute",
                        rule="recomputation_threshold",
                        first_nodes=(n.name,),
                    )
                    self.decisions.append(d)
                    log.debug("%s", d.line())
        # Forward: literals, and views of values no kernel computes.
        for k, n in enumerate(self.nodes):
            if not self.fusible[k] or k in free:
                continue
            if n.op == "full":
                free.add(k)
            elif n.op in VIEWS:
                src = self.pos_of_value.get(n.inputs[0])
                if src is None or not self.fusible[src] or src in free:
                    free.add(k)
        return free

    def _effective_users(self, k: int, free: set[int]) -> set[int]:
        out: set[int] = set()
        for u in self.users[k]:
            out |= self._effective_users(u, free) if u in free else {u}
        return out

    def _space(self, k: int) -> tuple[int, ...]:
        n = self.nodes[k]
        return self.types[n.inputs[0]].shape if n.op in REDUCE_COMBINE else n.outputs[0].type.shape

    def _recomputable(self, n: Node, users: set[int]) -> bool:
        """Cheap pointwise nodes read by 2..threshold consumers over different iteration spaces (so
        they cannot share one kernel) are recomputed in each instead of written out (CANN semantics)."""
        return (
            2 <= len(users) <= self.limits.recomputation_threshold
            and len({self._space(u) for u in users}) > 1
            and all(self.fusible[u] for u in users)
            and not any(v.id in self.graph_outputs for v in n.outputs)
        )

    def through_free(self, users: Sequence[int]) -> list[int]:
        """Grouped fusible consumers, looking through free nodes (which every consumer copies)."""
        out: list[int] = []
        stack, seen = list(users), set()
        while stack:
            u = stack.pop()
            if u in seen or not self.fusible[u]:
                continue
            seen.add(u)
            if u in self.free:
                stack.extend(self.users[u])
            else:
                out.append(u)
        return sorted(out)

    def find(self, k: int) -> int:
        while self.parent[k] != k:
            self.parent[k] = self.parent[self.parent[k]]
            k = self.parent[k]
        return k

    # -- group facts ---------------------------------------------------------------------------
    def with_free(self, members: list[int]) -> list[int]:
        """Members plus the free nodes they read, transitively, in topological order."""
        out = set(members)
        stack = list(members)
        while stack:
            for i in self.nodes[stack.pop()].inputs:
                p = self.pos_of_value.get(i)
                if p is not None and p in self.free and p not in out:
                    out.add(p)
                    stack.append(p)
        return sorted(out)

    def io(self, members: list[int]) -> tuple[list[int], list[int]]:
        inside = set(self.with_free(members))
        produced = {v.id for k in inside for v in self.nodes[k].outputs}
        inputs: list[int] = []
        for k in sorted(inside):
            for i in self.nodes[k].inputs:
                if i not in produced and i not in inputs:
                    inputs.append(i)
        member_set = set(members)
        outputs = []
        for k in members:
            for v in self.nodes[k].outputs:
                users = self.value_users.get(v.id, ())
                if v.id in self.graph_outputs or any(u not in member_set for u in users):
                    outputs.append(v.id)
        return inputs, outputs

    def lower(self, members: list[int], name: str = "k") -> LoopKernel:
        nodes = [self.nodes[k] for k in self.with_free(members)]
        inputs, outputs = self.io(members)
        # Row buffers only where a row fits the on-chip budget: the same rule as the tile's persistent flag.
        kernel = lower_group(
            name,
            nodes,
            inputs,
            outputs,
            self.types,
            self.supports,
            max_carried_row=self.profile.budget_bytes // 4,
        )
        if len(inputs) > self.limits.max_inputs:
            why = f"{len(inputs)} inputs > max_inputs {self.limits.max_inputs}"
            raise NotExpressible(nf.TOO_MANY_INPUTS, why)
        strided = strided_walk(kernel)
        if strided:
            raise NotExpressible(nf.NON_TRAILING_REDUCTION, f"the kernel {strided}")
        return kernel

    def kernel_for(self, members: list[int]) -> LoopKernel:
        """The lowered kernel of a final group (reusing the one the solver built when it accepted it)."""
        root = self.find(members[0])
        cached = self.kernels.get(root)
        if cached is not None and self.members.get(root) == members:
            return cached
        return self.lower(members)

    def kernel_of(self, root: int) -> LoopKernel | None:
        if root not in self.kernels:
            try:
                self.kernels[root] = self.lower(self.members[root])
            except NotExpressible:
                return None
        return self.kernels[root]

    def label(self, root: int) -> str:
        ms = self.members[root]
        first = self.nodes[ms[0]]
        return f"{first.name}({first.op})" if len(ms) == 1 else f"{first.name}(+{len(ms) - 1} nodes)"

    # -- cycle check ---------------------------------------------------------------------------
    def creates_cycle(self, a: int, b: int) -> bool:
        """Would merging groups a and b close a path through a group or node outside both?"""
        return self.dag.creates_cycle((a, b))

    # -- candidates ----------------------------------------------------------------------------
    def candidates(self) -> list[tuple[int, int, int, int, int, str]]:
        """(bucket, -bytes, proximity, first, second, kind) sorted; first/second are node indices."""
        out: dict[tuple[int, int], tuple[int, int, int, int, int, str]] = {}

        def add(p: int, c: int, nbytes: int, kind: str) -> None:
            gp, gc = self.find(p), self.find(c)
            if gp == gc:
                return
            lo, hi = sorted((gp, gc), key=lambda r: min(self.members[r]))
            key = (lo, hi)
            reduction = any(self.nodes[k].op in REDUCE_COMBINE for k in self.members[lo] + self.members[hi])
            bucket = 2 if kind == "horizontal" else 1 if reduction else 0
            prox = abs(min(self.members[hi]) - max(self.members[lo]))
            cand = (bucket, -nbytes, prox, min(self.members[lo]), max(self.members[hi]), kind)
            if key not in out or verdict(operator.lt, cand, out[key]):  # keys hold sizes: see `_sorted`
                out[key] = cand

        for k, n in enumerate(self.nodes):
            if not self.fusible[k] or k in self.free:
                continue
            for v in n.outputs:
                for u in self.through_free(self.value_users.get(v.id, ())):
                    add(k, u, v.type.nbytes, "vertical")
        if not self.limits.horizontal:
            return _sorted(list(out.values()))
        for vid, users in self.value_users.items():
            consumers = [u for u in users if self.fusible[u] and u not in self.free]
            for x, y in pairwise(consumers):
                add(x, y, self.types[vid].nbytes, "horizontal")
        return _sorted(list(out.values()))

    def scope_of(self, root: int) -> str:
        """The SuperKernel scope name of a group (merges keep groups within one scope)."""
        return self.nodes[self.members[root][0]].scope.name

    # -- one merge attempt -----------------------------------------------------------------------
    def try_merge(self, a: int, b: int, kind: str, nbytes: int) -> Decision:
        ra, rb = sorted((self.find(a), self.find(b)), key=lambda r: min(self.members[r]))
        key = (tuple(self.members[ra]), tuple(self.members[rb]))
        if key in self.rejected:
            return self.rejected[key]  # same pair as an earlier round: same answer, not logged again
        first_nodes = tuple(self.nodes[k].name for k in self.members[ra])
        second_nodes = tuple(self.nodes[k].name for k in self.members[rb])
        # The verdict is worked out in locals and the (frozen) Decision made once at the end.
        accepted, code, reason, rule = False, "", "", ""
        benefit: Benefit | None = None
        live_bytes = budget_bytes = 0
        merged = sorted(self.members[ra] + self.members[rb])
        pruned = self._over_budget_subset(merged)
        size = 0 if pruned is not None else len(self.with_free(merged))
        blocked = sorted(self.limits.disabled.intersection(first_nodes + second_nodes))
        if blocked:
            code, rule = nf.DISABLED_NODE, "disable list"
            reason = f"{', '.join(blocked)} on the disable list (Options.disable_fusion)"
        elif self.limits.max_merges is not None and self.merges >= self.limits.max_merges:
            code, rule = nf.MERGE_LIMIT, "merge limit"
            reason = f"only the first {self.limits.max_merges} merges are on (Options.max_merges, bisection)"
        elif pruned is not None:
            code, rule = (
                pruned.code,
                "on-chip budget" if pruned.code == nf.ON_CHIP_BUDGET else "max_fusion_size",
            )
            reason = f"contains a group that failed its budget: {pruned.reason}"
        elif size > self.limits.max_fusion_size:
            code, rule = nf.TOO_MANY_NODES, "max_fusion_size"
            reason = f"{size} nodes > max_fusion_size {self.limits.max_fusion_size}"
        elif (sa := self.scope_of(ra)) != (sb := self.scope_of(rb)):
            # The user grouped ops into SuperKernel scopes; a kernel spanning two would merge them.
            code, rule = nf.SCOPE_MISMATCH, "super_kernel_scope"
            reason = f"different super_kernel_scope marks ({sa or '<none>'!r} vs {sb or '<none>'!r})"
        elif self.creates_cycle(ra, rb):
            code, rule = nf.CYCLE, "cycle check"
            reason = "a path between the two leaves and re-enters through another kernel"
        else:
            try:
                fused = self.lower(merged)
                # The tile and the cost model's numbers feed the verdict below, which a plan made for
                # many sizes takes again for each (`ir.symbolic.verdict`): their own comparisons are
                # no guards (a row that fits the budget at one size and not at another changes the
                # plan only where it changes the verdict).
                with unrecorded():
                    tile = choose_tile(fused, self.profile)
                live_bytes, budget_bytes = tile.live_bytes, tile.budget_bytes
                ka, kb = self.kernel_of(ra), self.kernel_of(rb)
                if ka is None or kb is None:
                    accepted = True  # one side cannot be a kernel alone: joining makes it one
                    rule = "joining makes a kernel"
                else:
                    with unrecorded():
                        benefit = merge_benefit(ka, kb, fused, self.profile)
                    rule = "cost model"
                    # (refused, over the on-chip budget): NF2006 when the row over the budget
                    # (re-read per stage) is what costs most.
                    refused, over_budget = verdict(_merge_verdict, ka, kb, fused, self.profile,
                                                   self.limits.min_benefit_s)  # fmt: skip
                    if refused:
                        code = nf.ON_CHIP_BUDGET if over_budget else nf.NOT_PROFITABLE
                        rule = "on-chip budget" if over_budget else "cost model"
                        reason = f"not profitable on {self.profile.name}: {benefit.describe()}"
                    else:
                        accepted = True
                if accepted:
                    self.kernels[ra] = fused
            except NotExpressible as e:
                code, reason = e.code, e.reason
                rule = "max_inputs" if e.code == nf.TOO_MANY_INPUTS else "lowering"
        d = Decision(self.label(ra), self.label(rb), accepted, code, reason, benefit, kind, nbytes, rule,
                     first_nodes, second_nodes, live_bytes, budget_bytes)  # fmt: skip
        if d.accepted:
            self.merges += 1
            self.parent[rb] = ra
            self.dag.merge((ra, rb), ra)
            self.members[ra] = merged
            del self.members[rb]
            self.kernels.pop(rb, None)
        else:
            self.rejected[key] = d
            if d.code in BUDGET_CODES and pruned is None:
                self.over_budget.setdefault(merged[0], []).append((frozenset(merged), d))
        # Per pair at DEBUG: on a large graph these are thousands of lines. INFO gets one summary per
        # graph (autofusion.events), so the INFO level stays readable.
        log.debug("%s", d.line())
        return d

    def _over_budget_subset(self, merged: list[int]) -> Decision | None:
        """An earlier rejected group inside `merged` that failed a budget: a larger group needs at
        least as much of that resource, so it fails too (resource monotonicity)."""
        ms = set(merged)
        # A failed group inside `merged` has its first node in `merged`: look only there (O(group)).
        for k in merged:
            for group, decision in self.over_budget.get(k, ()):
                if group <= ms:
                    return decision
        return None

    def solve(self) -> FusionResult:
        for _ in range(self.limits.max_rounds):
            merged_any = False
            for _bucket, neg_bytes, _prox, first, second, kind in self.candidates():
                if self.find(first) == self.find(second):
                    continue
                before = len(self.rejected)
                d = self.try_merge(first, second, kind, -neg_bytes)
                if d.accepted or len(self.rejected) > before:
                    self.decisions.append(d)
                merged_any |= d.accepted
            if not merged_any:
                break
        gemms = self.attach_gemms()
        groups = [self.members[r] for r in sorted(self.members, key=lambda r: min(self.members[r]))]
        return FusionResult(groups, set(self.free), self.decisions, gemms)

    # -- GEMM + epilogue -------------------------------------------------------------------------
    def attach_gemms(self) -> dict[int, GemmSpec]:
        """After the rounds: each GEMM whose output a kernel group reads may run inside that group
        (fusion/gemm.py). One decision per GEMM that has such a reader, accepted or with its reason."""
        out: dict[int, GemmSpec] = {}
        if not self.limits.gemm_epilogue and not self.limits.gemm_off:
            return out  # not asked for: no decisions either
        claimed: set[int] = set()
        for k, n in enumerate(self.nodes):
            if n.op not in GEMM_OPS or len(n.outputs) != 1:
                continue
            y = n.outputs[0].id
            readers = self.through_free(self.value_users.get(y, ()))
            roots = sorted({self.find(u) for u in readers}, key=lambda r: min(self.members[r]))
            if not roots:
                continue
            root = roots[0]
            spec, why, benefit = self._gemm_verdict(k, root, claimed, len(roots))
            label = f"{n.name}({n.op})"
            if isinstance(why, Refusal):
                d = Decision(label, self.label(root), False, why.code, why.reason, benefit,
                             kind="gemm_epilogue", rule="gemm epilogue", first_nodes=(n.name,),
                             second_nodes=tuple(self.nodes[j].name for j in self.members[root]))  # fmt: skip
            else:
                assert spec is not None
                self.dag.merge((k, root), root)
                self.merges += 1  # a merge like the rounds' ones: bisection's axis counts it
                claimed.add(root)
                out[min(self.members[root])] = spec
                d = Decision(label, self.label(root), True, benefit=benefit, kind="gemm_epilogue",
                             bytes_shared=4 * spec.operands.m * spec.operands.n, rule="cost model",
                             first_nodes=(n.name,),
                             second_nodes=tuple(self.nodes[j].name for j in self.members[root]))  # fmt: skip
            self.decisions.append(d)
            log.debug("%s", d.line())
        return out

    def _gemm_verdict(self, k: int, root: int, claimed: set[int],
                      n_readers: int) -> tuple[GemmSpec | None, Refusal | None, Benefit | None]:  # fmt: skip
        n = self.nodes[k]
        if not self.limits.gemm_epilogue:
            why = self.limits.gemm_off or "GEMM epilogue fusion is off"
            return None, Refusal(nf.NO_KERNEL_LOWERING, why), None
        names = [n.name, *(self.nodes[j].name for j in self.members[root])]
        if blocked := sorted(self.limits.disabled.intersection(names)):
            why = f"{', '.join(blocked)} on the disable list (Options.disable_fusion)"
            return None, Refusal(nf.DISABLED_NODE, why), None
        if self.limits.max_merges is not None and self.merges >= self.limits.max_merges:
            why = f"only the first {self.limits.max_merges} merges are on (Options.max_merges, bisection)"
            return None, Refusal(nf.MERGE_LIMIT, why), None
        if (sa := n.scope.name) != (sb := self.scope_of(root)):
            why = f"different super_kernel_scope marks ({sa or '<none>'!r} vs {sb or '<none>'!r})"
            return None, Refusal(nf.SCOPE_MISMATCH, why), None
        ops = gemm_operands(n, self.types)
        if isinstance(ops, Refusal):
            return None, ops, None
        if root in claimed:
            return None, Refusal(nf.NO_KERNEL_LOWERING, "the kernel runs another GEMM already"), None
        kernel = self.kernel_of(root)
        if kernel is None:
            return None, Refusal(nf.NO_KERNEL_LOWERING, "the reading group is not one kernel"), None
        fit = epilogue_fit(kernel, ops)
        if isinstance(fit, Refusal):
            return None, fit, None
        if self.dag.creates_cycle((k, root)):
            why = "a path from the GEMM to the kernel leaves both and comes back"
            return None, Refusal(nf.CYCLE, why), None
        members = set(self.members[root])
        y = ops.y
        # Whole mode writes the full output (the epilogue reads it after a barrier).
        y_out = fit.whole or y in self.graph_outputs or n_readers > 1 or any(
            u not in members for u in self.value_users.get(y, ()))  # fmt: skip
        units_total = ops.m if fit.whole else kernel.space[fit.block_dim]
        units = block_units(ops, fit, units_total, self.profile.cores, self.profile.budget_bytes)
        spec = GemmSpec(k, n.op, ops, fit, units, units_total, y_out)
        with unrecorded():  # what the decision reports; the verdict below is what decides
            benefit = gemm_epilogue_benefit(ops.m, ops.n, ops.k, spec.blocks, y_out, self.profile, fit.whole)
        if verdict(
            _gemm_refused, ops, spec.blocks, y_out, self.profile, fit.whole, self.limits.min_benefit_s
        ):
            mode = f" (whole output: {fit.why_whole})" if fit.whole else ""
            why = (f"not profitable on {self.profile.name} for {ops.m}x{ops.n}x{ops.k} in {spec.blocks} "
                   f"blocks of {spec.rows_per_block} rows{mode}: {benefit.describe()}")  # fmt: skip
            return None, Refusal(nf.NOT_PROFITABLE, why), benefit
        library = self.limits.gemm_library(n) if self.limits.gemm_library is not None else None
        if library:
            return None, Refusal(nf.NOT_PROFITABLE, library), benefit
        return spec, None, benefit


def _sorted(items: list[Any]) -> list[Any]:
    """`sorted(items)`, its order a verdict (`ir.symbolic.verdict`): the keys hold sizes, and a plan
    made for many sizes holds where the order does, not only where each key comparison does."""
    return [items[i] for i in verdict(_sort_order, items)]


def _sort_order(items: list[Any]) -> tuple[int, ...]:
    return tuple(sorted(range(len(items)), key=items.__getitem__))


def _merge_verdict(a: LoopKernel, b: LoopKernel, fused: LoopKernel, profile: HardwareProfile,
                   least: float) -> tuple[bool, bool]:  # fmt: skip
    """Whether the cost model refuses merging `a` and `b` into `fused` (its net benefit is at most
    `least`), and whether the fused kernel's row is over the on-chip budget and costs more re-read
    than the merge saves."""
    benefit = merge_benefit(a, b, fused, profile)
    over_budget = not choose_tile(fused, profile).persistent and benefit.tile_overhead > benefit.mem_saved
    return benefit.net <= least, over_budget


def _gemm_refused(ops: GemmOperands, blocks: int, y_out: bool, profile: HardwareProfile, whole: bool,
                  least: float) -> bool:  # fmt: skip
    """The cost model refuses running the GEMM `ops` inside its epilogue kernel in `blocks` blocks."""
    return gemm_epilogue_benefit(ops.m, ops.n, ops.k, blocks, y_out, profile, whole).net <= least


def solve(graph: Graph, profile: HardwareProfile, limits: FusionLimits,
          supports: Callable[[Node], str | None],
          forced: list[list[int]] | None = None) -> tuple[FusionResult, Solver]:  # fmt: skip
    """`forced`: node-index groups fusion rules keep together (one kernel each when it lowers)."""
    s = Solver(graph, profile, limits, supports)
    if forced:
        s.force(forced)
    return s.solve(), s
