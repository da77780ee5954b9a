"""The rules stage of the pipeline: rule pass, then what the solver needs from rules and lists.

In: a captured graph and Options. Out: `Prepared`: the decomposed graph the solver plans, the node
groups kernel rules want kept together (indices into that graph), a `supports` wrapper that keeps
blacklisted, skip-listed and switched-off kinds out of kernels (with the reason), and the rule report.
Decomposed nodes inherit exclusions from the op they came from (`Softmax` in a blacklist excludes
the amax/sub/exp/sum/div it becomes).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from autofusion.config import Options
from autofusion.ir.catalog import NORMALIZATIONS, REDUCTIONS
from autofusion.ir.graph import Graph, Node
from autofusion.passes.decompose import decompose
from autofusion.passes.rewrite import all_rules
from autofusion.passes.rewrite.apply import RuleResult, apply_rules
from autofusion.passes.rewrite.lists import Exclusions, load_exclusions
from autofusion.passes.simplify.dce import eliminate_dead_nodes

log = logging.getLogger("autofusion.rules")

# CANN's optional fusion kinds -> the IR ops (before decomposition) each covers. `split` has no op of
# its own in the IR (a split is slices), so it shares `slice`'s ops.
KIND_OPS: dict[str, frozenset[str]] = {
    "reduce": REDUCTIONS | NORMALIZATIONS | {"mean", "var"},
    "concat": frozenset({"concat"}),
    "slice": frozenset({"slice", "select"}),
    "split": frozenset({"slice"}),
    "transpose": frozenset({"permute"}),
    "gather": frozenset({"gather", "index_select"}),
    "matmul": frozenset({"mm", "bmm", "addmm", "linear"}),
    "conv": frozenset({"conv"}),
}

Supports = Callable[[Node], "str | None"]


@dataclass
class Prepared:
    graph: Graph
    forced: list[list[int]] = field(default_factory=list)
    excluded: Callable[[Node], str | None] | None = None
    rules: RuleResult | None = None

    def wrap(self, supports: Supports) -> Supports:
        if self.excluded is None:
            return supports
        excluded = self.excluded

        def wrapped(node: Node) -> str | None:
            return excluded(node) or supports(node)

        return wrapped


def _kind_excluder(options: Options) -> Callable[[Node], str | None] | None:
    off = [k for k in KIND_OPS if k not in options.fusion_kinds]
    if not off:
        return None
    ops = {op: k for k in off for op in KIND_OPS[k]}

    def excluded(node: Node) -> str | None:
        k = ops.get(node.op)
        return f"fusion kind {k!r} is off (autofuse_disable_pass)" if k else None

    return excluded


def prepare(graph: Graph, options: Options) -> Prepared:
    exclusions: Exclusions = load_exclusions(options.blacklist, options.skip_node_names_cfg)
    kinds = _kind_excluder(options)

    def excluded_original(node: Node) -> str | None:
        return (exclusions.reason(node) if exclusions else None) or (kinds(node) if kinds else None)

    rules = all_rules(options.rules_files, options.builtin_rules)
    result: RuleResult | None = None
    g = graph
    if rules and any(r.name not in options.disabled for r in rules):
        result = apply_rules(g, rules, options.disabled, excluded_original, options.enabled_rules)
        g = result.graph
    # Dead-node elimination keeps node objects, so kernel-rule groups follow them by identity.
    groups_nodes = [[g.nodes[k] for k in grp] for grp in (result.groups if result else [])]
    g = eliminate_dead_nodes(g)
    where = {id(n): k for k, n in enumerate(g.nodes)}
    groups = [[where[id(n)] for n in grp if id(n) in where] for grp in groups_nodes]
    origin: list[int] = []
    # An excluded composite (blacklisted Softmax, reduce kind off) stays one op: it runs as one torch
    # call instead of as the five primitives it would decompose into, none of which may fuse.
    dg = decompose(
        g, origin, keep=(lambda n: excluded_original(n) is not None) if (exclusions or kinds) else None
    )
    forced = []
    for grp in groups:
        members = set(grp)
        forced.append([k for k in range(len(dg.nodes)) if origin[k] in members])
    excluded = None
    if exclusions or kinds:
        source = {id(dg.nodes[k]): g.nodes[origin[k]] for k in range(len(dg.nodes))}
        reported: set[str] = set()

        def excluded(node: Node) -> str | None:
            orig = source.get(id(node))
            why = (exclusions.reason(node, orig) if exclusions else None) or (
                kinds(orig or node) if kinds else None
            )
            if why and node.name not in reported:
                reported.add(node.name)
                log.info("node %s(%s) is not fused: %s", node.name, node.op, why)
            return why

    return Prepared(dg, [f for f in forced if len(f) > 1], excluded, result)
