"""Finding a rule's pattern in a graph: anchored, backtracking subgraph matching.

In: a `Rule` and a graph. Out: every `Match` in graph order (by the position of the final node), each
with the graph nodes its pattern steps matched, the reshapes it looked through, and the tensors its
free names bound; `check_match` then says whether conditions and constraints hold (None) or why not.

How: start at each node whose op the final step accepts, then walk the pattern backwards along its
named edges. An edge may pass through reshapes of a single user (the frontend spells batched matmuls
as reshape -> bmm -> reshape); those reshapes join the window. Commutative binary ops try both input
orders. The same free name must bind the same tensor everywhere.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from autofusion.ir.analysis import use_def, value_types
from autofusion.ir.catalog import COMMUTATIVE
from autofusion.ir.dtypes import DType
from autofusion.ir.graph import Graph, Node
from autofusion.ir.types import TensorType
from autofusion.passes.rewrite import expr as E
from autofusion.passes.rewrite.loader import PatternNode, Rule


@dataclass
class Match:
    rule: Rule
    graph: Graph
    steps: dict[str, int]  # pattern output name -> node index
    absorbed: list[int] = field(default_factory=list)  # reshape node indices looked through
    bind: dict[str, int] = field(default_factory=dict)  # free name -> value id

    def indices(self) -> list[int]:
        return sorted(set(self.steps.values()) | set(self.absorbed))

    def nodes(self) -> list[Node]:
        return [self.graph.nodes[k] for k in sorted(self.steps.values())]

    def node_of(self, op: str) -> Node | None:
        return next((n for n in self.nodes() if n.op == op), None)

    def position(self, n: Node) -> int:
        # The window first: a node of the match is found without a walk over the whole graph.
        found = next((k for k in self.indices() if self.graph.nodes[k] is n), None)
        return self.graph.nodes.index(n) if found is None else found

    def final(self) -> Node:
        return self.graph.nodes[self.steps[self.rule.nodes[-1].output]]

    def producer_in_window(self, vid: int) -> Node | None:
        for n in self.nodes():
            if any(v.id == vid for v in n.outputs):
                return n
        return None

    def env(self) -> dict[str, Any]:
        types = value_types(self.graph)
        out: dict[str, Any] = {name: types[v] for name, v in self.bind.items()}
        for name, k in self.steps.items():
            out[name] = self.graph.nodes[k].outputs[0].type
        out["out"] = self.final().outputs[0].type
        for alias, name in self.rule.aliases:
            if name in out:
                out[alias] = out[name]
        return out

    def describe(self) -> str:
        return ", ".join(f"{self.graph.nodes[k].name}({self.graph.nodes[k].op})" for k in self.indices())


# A partial match while the search runs: (pattern step -> node index, absorbed view nodes, name -> value id).
_Partial = tuple[dict[str, int], list[int], dict[str, int]]


class _Index:
    """Per-graph lookups shared by every rule (the use-def maps are the graph's cached ones)."""

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        facts = use_def(graph)
        self.pos = facts.producer
        self.users = facts.uses
        self.outputs = set(graph.outputs)


def find_matches(
    rule: Rule, graph: Graph, index: _Index | None = None, ok: Callable[[Match], bool] | None = None
) -> list[Match]:
    """One match per anchor node: the first in a stable order that `ok` accepts (without `ok`, or when
    it accepts none, the first). `ok` lets a commutative node's other binding be tried: in
    `a + bn(conv(y))` where `a = bn(conv(x))` is read elsewhere too, the first binding (the add's
    first input as the pattern's conv) cannot be fused, the second can."""
    ix = index or _Index(graph)
    last = rule.nodes[-1]
    found: list[Match] = []
    for k, n in enumerate(graph.nodes):
        if n.op not in last.ops:
            continue
        first: Match | None = None
        for steps, absorbed, bind in _match_step(rule, ix, len(rule.nodes) - 1, k, {}, [], {}):
            m = Match(rule, graph, steps, absorbed, bind)
            if ok is None or ok(m):
                first = None
                found.append(m)
                break
            first = first or m
        if first is not None:
            found.append(first)
    return found


def _attrs_ok(p: PatternNode, n: Node) -> bool:
    for key, want in p.attrs:
        got = n.attr(key)
        if isinstance(got, tuple) and isinstance(want, tuple):
            if tuple(got) != want:
                return False
        elif got != want:
            return False
    return True


def _producer(ix: _Index, vid: int) -> tuple[int | None, list[int]]:
    """The node producing vid, looking through single-user reshapes; and the reshapes passed."""
    passed: list[int] = []
    k = ix.pos.get(vid)
    while (
        k is not None
        and ix.graph.nodes[k].op == "reshape"
        and len(ix.users.get(vid, [])) == 1
        and vid not in ix.outputs
    ):
        passed.append(k)
        vid = ix.graph.nodes[k].inputs[0]
        k = ix.pos.get(vid)
    return k, passed


def _match_step(
    rule: Rule, ix: _Index, i: int, k: int, steps: dict[str, int], absorbed: list[int], bind: dict[str, int]
) -> Iterator[_Partial]:
    """Yield (steps, absorbed, bind) extending the partial match with pattern step i at node k."""
    p = rule.nodes[i]
    n = ix.graph.nodes[k]
    if n.op not in p.ops or not _attrs_ok(p, n) or len(n.outputs) != 1:
        return
    if p.output in steps:
        if steps[p.output] == k:
            yield steps, absorbed, bind
        return
    if k in steps.values() or k in absorbed:
        return
    steps = {**steps, p.output: k}
    if p.chain:
        # Sequence step: the previous step's output is one of this node's inputs.
        for vid in n.inputs:
            q, passed = _producer(ix, vid)
            if q is None:
                continue
            yield from _match_step(rule, ix, i - 1, q, steps, absorbed + passed, bind)
        return
    if len(p.inputs) > len(n.inputs):
        return
    orders = [tuple(range(len(n.inputs)))]
    if n.op in COMMUTATIVE and len(n.inputs) == 2:
        orders.append((1, 0))
    for order in orders:
        yield from _bind_inputs(rule, ix, p, [n.inputs[j] for j in order], 0, steps, absorbed, bind)


def _bind_inputs(
    rule: Rule,
    ix: _Index,
    p: PatternNode,
    actual: list[int],
    j: int,
    steps: dict[str, int],
    absorbed: list[int],
    bind: dict[str, int],
) -> Iterator[_Partial]:
    if j == len(p.inputs):
        yield steps, absorbed, bind
        return
    name, vid = p.inputs[j], actual[j]
    producer_step = next((s for s in range(len(rule.nodes)) if rule.nodes[s].output == name), None)
    if producer_step is not None:
        q, passed = _producer(ix, vid)
        if q is None:
            return
        for st, ab, bd in _match_step(rule, ix, producer_step, q, steps, absorbed + passed, bind):
            yield from _bind_inputs(rule, ix, p, actual, j + 1, st, ab, bd)
        return
    if name in bind:
        if bind[name] == vid:
            yield from _bind_inputs(rule, ix, p, actual, j + 1, steps, absorbed, bind)
        return
    yield from _bind_inputs(rule, ix, p, actual, j + 1, steps, absorbed, {**bind, name: vid})


def _float_types(m: Match) -> list[TensorType]:
    types = value_types(m.graph)
    ts = [types[v] for v in m.bind.values()] + [m.graph.nodes[k].outputs[0].type for k in m.steps.values()]
    return [t for t in ts if t.dtype.is_float]


def check_match(m: Match, ix: _Index, library: bool) -> str | None:
    """None when the match may be applied; otherwise why not (conditions, constraints, escaping values)."""
    env = m.env()
    rule = m.rule
    for cond in rule.conditions + rule.constraint.shape:
        try:
            ok = E.evaluate(cond, env)
        except E.EvalError as e:
            return f"condition {cond.text!r} cannot be evaluated: {e}"
        if not ok:
            return f"condition {cond.text!r} is false"
    c = rule.constraint
    if c.input_dtype is not None:
        bad = sorted({t.dtype.name for t in _float_types(m) if t.dtype not in c.input_dtype})
        if bad:
            return f"dtype {', '.join(bad)} is not in input_dtype {sorted(d.name for d in c.input_dtype)}"
    if c.max_tile_size is not None:
        biggest = max(m.graph.nodes[k].outputs[0].type.numel for k in m.indices())
        if biggest > c.max_tile_size:
            return f"a value of {biggest} elements exceeds max_tile_size {c.max_tile_size}"
    if c.require_contiguous:
        types = value_types(m.graph)
        bad_v = [name for name, v in m.bind.items() if not types[v].is_contiguous]
        if bad_v:
            return f"input {bad_v[0]!r} is not contiguous (require_contiguous)"
    if library:
        inside = set(m.indices())
        final = m.final()
        for k in inside:
            node = ix.graph.nodes[k]
            if node is final:
                continue
            for v in node.outputs:
                if v.id in ix.outputs or any(u not in inside for u in ix.users.get(v.id, [])):
                    return f"{node.name}'s result is also used outside the window"
    return None


_ = DType
