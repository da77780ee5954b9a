"""The graph of fusion groups, kept acyclic as groups merge (the solver's exact cycle check).

Vertices are groups (a fused kernel, or one node that runs on its own: an extern, a library call, an
op no kernel takes); an edge u -> v means some value of u is read by v. Free nodes (literals, views,
recomputed producers) are no vertices: every kernel that reads one copies it, so an edge through a
free node is an edge from its producer to each of its readers.

A merge of groups S is legal iff no path leaves S and comes back, i.e. no path s -> x -> ... -> t with
s, t in S and x outside. Paths are taken between groups, not nodes: a kernel runs as one step, so every
value it writes waits for every value it reads; a node-level walk misses the path a -> c1 (in kernel
K), c2 (in K) -> b.

Each vertex keeps a rank, a topological number (edges go from lower to higher rank), so a search for
a path into S stops at the highest rank in S: merges of neighbours, the common case, cost O(degree).
After a merge the ranks of the vertices between the two sides are reassigned as in Pearce and Kelly's
dynamic topological order (JEA 2006): the ancestors of S that rank above its lowest member take the
lowest of the freed ranks, the merged vertex the next one, the descendants of S below its highest
member the highest ones.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence


class GroupDag:
    def __init__(self, users: Sequence[Sequence[int]], free: set[int]) -> None:
        """`users[k]`: consumer node indices of node k (nodes in topological order); `free`: nodes
        that are copied into their readers (not vertices)."""
        n = len(users)
        through: dict[int, set[int]] = {}  # free node -> the non-free nodes reading it, transitively
        for k in range(n - 1, -1, -1):  # readers have higher indices: theirs are known first
            if k in free:
                through[k] = _readers(users[k], free, through)
        self.succ: dict[int, set[int]] = {}
        self.pred: dict[int, set[int]] = {}
        for k in range(n):
            if k in free:
                continue
            self.succ.setdefault(k, set())
            self.pred.setdefault(k, set())
            for u in _readers(users[k], free, through):
                self.succ[k].add(u)
                self.pred.setdefault(u, set()).add(k)
        self.rank: dict[int, int] = {k: k for k in self.succ}  # node order is a topological order

    def creates_cycle(self, group: Iterable[int]) -> bool:
        """Would merging these vertices close a cycle (a path leaving them and coming back)?"""
        members = set(group)
        return self._forward(members) is None

    def merge(self, group: Iterable[int], keep: int) -> None:
        """Merge the vertices into `keep` (one of them). The caller checked `creates_cycle` first."""
        members = set(group)
        assert keep in members
        below = self._forward(members)
        if below is None:
            raise ValueError("merging these groups would close a cycle")
        above = self._backward(members)
        pool = sorted(self.rank[v] for v in members | below | above)
        order = [*sorted(above, key=self.rank.__getitem__), keep, *sorted(below, key=self.rank.__getitem__)]
        # `above` takes the lowest ranks and `below` the highest (each only moves away from `keep`,
        # so edges to and from vertices outside the pool keep their direction); one rank is left over.
        slots = pool[: len(above) + 1] + pool[len(pool) - len(below) :]
        for v, r in zip(order, slots, strict=True):
            self.rank[v] = r
        for v in members - {keep}:
            for s in self.succ.pop(v):
                self.pred[s].discard(v)
                if s not in members:
                    self.pred[s].add(keep)
                    self.succ[keep].add(s)
            for p in self.pred.pop(v):
                self.succ[p].discard(v)
                if p not in members:
                    self.succ[p].add(keep)
                    self.pred[keep].add(p)
            del self.rank[v]
        self.succ[keep] -= members
        self.pred[keep] -= members

    def _forward(self, members: set[int]) -> set[int] | None:
        """Vertices outside `members` reachable from them and ranked below their highest; None if
        one of them reaches back into `members` (a cycle after merging)."""
        hi = max(self.rank[v] for v in members)
        seen: set[int] = set()
        stack = [s for v in members for s in self.succ[v] if s not in members]
        while stack:
            v = stack.pop()
            if v in seen or self.rank[v] > hi:
                continue
            seen.add(v)
            for s in self.succ[v]:
                if s in members:
                    return None
                if s not in seen:
                    stack.append(s)
        return seen

    def _backward(self, members: set[int]) -> set[int]:
        """Vertices outside `members` that reach them and rank above their lowest."""
        lo = min(self.rank[v] for v in members)
        seen: set[int] = set()
        stack = [p for v in members for p in self.pred[v] if p not in members]
        while stack:
            v = stack.pop()
            if v in seen or self.rank[v] < lo:
                continue
            seen.add(v)
            stack.extend(p for p in self.pred[v] if p not in seen and p not in members)
        return seen


def _readers(users: Sequence[int], free: set[int], through: dict[int, set[int]]) -> set[int]:
    out: set[int] = set()
    for u in users:
        if u in free:
            out |= through[u]
        else:
            out.add(u)
    return out
