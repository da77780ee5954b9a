"""Which values may share storage: op steps run torch ops, and some of those return views.

In: plan steps. Out: for each value an op step makes that may alias its inputs, the set of values
whose storage it may share (its "roots"). Kernel steps always write buffers of their own, so only op
steps create aliases. The executors use this to keep every buffer a graph output may be a view of
out of the memory they reuse across calls (scratch buffers, the SuperKernel arena).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from autofusion.plan.entry_conv import CONV_TARGET
from autofusion.plan.schedule import NO_TRAFFIC, OpStep, Step

# Ops whose torch result may alias an input: views, externs we cannot see into, and casts (torch's
# `.to` returns its input when the dtype already matches).
MAY_ALIAS = NO_TRAFFIC | {"extern", "cast"}
# Externs we can see into whose result is always a new tensor: the library's conv_bn_act (a convolution's
# output, in every route of runtime/library.py).
FRESH_EXTERNS = frozenset({CONV_TARGET})


def may_alias(step: Step) -> bool:
    return (
        isinstance(step, OpStep)
        and step.node.op in MAY_ALIAS
        and not (step.node.op == "extern" and step.node.attr("target") in FRESH_EXTERNS)
    )


def alias_roots(steps: Sequence[Step]) -> dict[int, frozenset[int]]:
    """value -> the values whose storage it may share, for values op steps make; every input of such
    an op counts, not only the first (an extern may return a view of any of them)."""
    roots: dict[int, frozenset[int]] = {}
    for s in steps:
        if may_alias(s):
            assert isinstance(s, OpStep)
            src = frozenset().union(*(roots.get(x, frozenset((x,))) for x in s.node.inputs))
            for out in s.node.outputs:
                roots[out.id] = src
    return roots


def reachable(values: Iterable[int], roots: dict[int, frozenset[int]]) -> set[int]:
    """`values` and every value whose storage one of them may share."""
    out: set[int] = set()
    for v in values:
        out.add(v)
        out |= roots.get(v, frozenset())
    return out
