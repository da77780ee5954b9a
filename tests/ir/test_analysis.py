"""ir.analysis: the use-def facts of a graph, built once per graph object and read-only."""

from __future__ import annotations

import gc

import pytest

from autofusion.ir import analysis
from autofusion.ir.dtypes import DType
from autofusion.ir.graph import GraphBuilder
from autofusion.ir.types import TensorType


def _graph():
    b = GraphBuilder()
    t = TensorType(DType.float32, (4, 8))
    x = b.add_input(t, "x")
    y = b.add("mul", [x, x], name="square")  # one node reading one value twice: one use
    z = b.add("add", [y, x], name="plus")
    s = b.add("sum", [z], {"dims": (1,), "keepdim": True})
    return b.build([s, y]), (x, y, z, s)


def test_uses_producers_and_node_users() -> None:
    g, (x, y, z, s) = _graph()
    facts = analysis.use_def(g)
    assert facts.uses[x] == (0, 1)  # each reading node once, in node order
    assert facts.uses[y] == (1,) and facts.uses[z] == (2,) and s not in facts.uses
    assert x not in facts.producer and facts.producer[y] == 0 and facts.producer[s] == 2
    assert facts.node_users == ((1,), (2,), ())
    assert facts.value_types == g.value_types()
    with pytest.raises(TypeError):
        facts.uses[x] = ()  # type: ignore[index]  # shared by every pass: read-only


def test_cached_per_graph_object_and_released_with_it() -> None:
    g, _ = _graph()
    assert analysis.use_def(g) is analysis.use_def(g)
    other, _ = _graph()  # an equal graph, another object: its own facts
    assert analysis.use_def(other) is not analysis.use_def(g)
    gc.collect()  # graphs earlier tests left as garbage go first, so only `other` goes below
    before = len(analysis._CACHE)
    del other
    gc.collect()
    assert len(analysis._CACHE) == before - 1
