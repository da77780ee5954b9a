"""The rule pass: apply fusion rules to a graph, before the fusion solver.

In: a graph, the rules (built-in `classify_rule.yaml` first, then user files), the names switched off,
and a predicate for nodes the blacklist / skip list excludes. Out: `RuleResult`: the rewritten graph
(library rules replaced their windows), the node groups kernel rules want as one generated kernel
(indices into the new graph; the solver starts from them), and one report line per decision.

Order, fixed and stable:
1. Rules sort by priority (higher first), then by size (more pattern steps first: longer chains and
   larger scopes before their parts), then by where they were defined (built-in file, then user files
   in the order given, each top to bottom). Nothing depends on hashing.
2. Each rule's matches are taken in graph order (by the position of the window's last node).
3. A window that overlaps one already taken is skipped: taken windows are locked against every later
   rule (mutual exclusion), so a large pattern is never broken up by a smaller one.
4. A window whose conditions, constraints or library check fail is skipped with the reason logged.
   Every window is a vertical chain; horizontal merging is the graph passes' and the solver's business,
   after this pass (vertical before horizontal).
5. All accepted library rewrites are applied in one rebuild. If that rebuild fails for any reason the
   pass returns the input graph unchanged and logs why: nothing is half-applied.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from autofusion.ir.graph import Graph, GraphBuilder, Node
from autofusion.passes.rebuild import Emitter
from autofusion.passes.rewrite.library import LIBRARY
from autofusion.passes.rewrite.loader import Rule
from autofusion.passes.rewrite.match import Match, _Index, check_match, find_matches

log = logging.getLogger("autofusion.rules")


@dataclass
class RuleReport:
    rule: str
    window: str
    applied: bool
    reason: str = ""

    def line(self) -> str:
        if self.applied:
            return f"rule {self.rule} applied to {self.window}"
        return f"rule {self.rule} not applied to {self.window}: {self.reason}"


@dataclass
class RuleResult:
    graph: Graph
    groups: list[list[int]] = field(default_factory=list)  # kernel-rule windows, node indices of `graph`
    reports: list[RuleReport] = field(default_factory=list)

    @property
    def applied(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in self.reports:
            if r.applied:
                out[r.rule] = out.get(r.rule, 0) + 1
        return dict(sorted(out.items()))


def rule_order(rules: Sequence[Rule]) -> list[Rule]:
    return [
        r for _, r in sorted(enumerate(rules), key=lambda ir: (-ir[1].priority, -len(ir[1].nodes), ir[0]))
    ]


def apply_rules(
    graph: Graph,
    rules: Sequence[Rule],
    disabled: frozenset[str] = frozenset(),
    excluded: Callable[[Node], str | None] | None = None,
    switched_on: frozenset[str] = frozenset(),
) -> RuleResult:
    ix = _Index(graph)
    locked: set[int] = set()
    chosen: list[Match] = []
    reports: list[RuleReport] = []
    for rule in rule_order(rules):
        if rule.name in disabled or not (rule.enabled or rule.name in switched_on):
            continue
        lib_rule = rule.library is not None and rule.library in LIBRARY
        accept = lambda m, lib_rule=lib_rule: check_match(m, ix, library=lib_rule) is None  # noqa: E731
        for m in find_matches(rule, graph, ix, ok=accept):
            window = m.indices()
            if locked.intersection(window):
                continue  # taken by an earlier (higher-priority or larger) rule
            reason = None
            if excluded is not None:
                for k in window:
                    why = excluded(graph.nodes[k])
                    if why:
                        reason = f"{graph.nodes[k].name} is excluded ({why})"
                        break
            lib = LIBRARY.get(rule.library) if rule.library else None
            reason = reason or check_match(m, ix, library=lib is not None)
            if reason is None and lib is not None:
                reason = lib.check(graph, m)
            report = RuleReport(rule.name, m.describe(), reason is None, reason or "")
            reports.append(report)
            log.info("%s", report.line())
            if reason is None:
                locked.update(window)
                chosen.append(m)
    try:
        new_graph, groups = _rewrite(graph, chosen)
    except Exception as e:  # noqa: BLE001 - the pass is all or nothing; the reason is logged
        log.warning("fusion rules were not applied to %s: rewriting failed: %s", graph.name, e)
        undone = [RuleReport(r.rule, r.window, False, r.reason or f"rewrite failed: {e}") for r in reports]
        return RuleResult(graph, [], undone)
    return RuleResult(new_graph, groups, reports)


def _rewrite(graph: Graph, chosen: list[Match]) -> tuple[Graph, list[list[int]]]:
    if not chosen:
        return graph, []
    final_of: dict[int, Match] = {}
    dropped: set[int] = set()
    kernel_of: dict[int, int] = {}  # old node index -> kernel group number
    kernel_matches = [m for m in chosen if not m.rule.library]
    for gi, m in enumerate(kernel_matches):
        for k in m.indices():
            kernel_of[k] = gi
    for m in chosen:
        if m.rule.library:
            final_k = m.indices()[-1]
            final_of[final_k] = m
            dropped.update(k for k in m.indices() if k != final_k)
    b = GraphBuilder(graph.name)
    env: dict[int, int] = {}
    for inp in graph.inputs:
        env[inp.value.id] = b.add_input(inp.value.type, inp.name, inp.role)
    groups: list[list[int]] = [[] for _ in kernel_matches]
    for k, node in enumerate(graph.nodes):
        if k in dropped:
            continue
        b.scope = node.scope  # copies and library calls keep the SuperKernel scope of the node they replace
        if k in final_of:
            m = final_of[k]
            lib = LIBRARY[m.rule.library or ""]
            out = lib.emit(Emitter(b, node, env), graph, m)
            if b.type_of(out) != node.outputs[0].type:
                raise ValueError(
                    f"{m.rule.name} at {node.name} produced {b.type_of(out)}, expected {node.outputs[0].type}"
                )
            env[node.outputs[0].id] = out
            continue
        before = b.mark()[0]
        ins = [env[i] for i in node.inputs]
        outs = b.copy(node, ins, graph.constants)
        if k in kernel_of:
            groups[kernel_of[k]].extend(range(before, b.mark()[0]))
        for v, o in zip(node.outputs, outs, strict=True):
            env[v.id] = o
    return b.build([env[o] for o in graph.outputs]), [g for g in groups if len(g) > 1]
