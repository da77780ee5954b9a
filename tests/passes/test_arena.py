"""The arena planner: buffers live at the same time never share bytes."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from autofusion.plan.memory import ALIGN, Lifetime, plan_arena

lifetimes = st.lists(
    st.tuples(st.integers(0, 5000), st.integers(0, 20), st.integers(0, 6)).map(
        lambda t: (t[0], t[1], t[1] + t[2])
    ),
    max_size=40,
).map(lambda xs: [Lifetime(i, n, a, b) for i, (n, a, b) in enumerate(xs)])


@settings(max_examples=300, deadline=None)
@given(lifetimes)
def test_live_buffers_never_overlap(lts: list[Lifetime]) -> None:
    plan = plan_arena(lts)
    for i, a in enumerate(lts):
        oa = plan.offsets[a.id]
        assert oa % ALIGN == 0
        assert oa + a.nbytes <= plan.size
        for b in lts[i + 1 :]:
            if a.overlaps(b):
                ob = plan.offsets[b.id]
                assert oa + max(a.nbytes, 1) <= ob or ob + max(b.nbytes, 1) <= oa, (a, b, oa, ob)
    assert plan.size >= plan.max_live


def test_dead_buffers_are_reused() -> None:
    plan = plan_arena([Lifetime(0, 1000, 0, 1), Lifetime(1, 1000, 2, 3), Lifetime(2, 1000, 1, 2)])
    assert plan.offsets[0] == plan.offsets[1]  # 0 is dead before 1 is written
    assert plan.offsets[2] != plan.offsets[0]
    assert plan.size == 2 * 1024


def test_same_tick_is_live_together() -> None:
    # Read in phase 1 by one kernel, written in phase 1 by another: they run at the same time.
    plan = plan_arena([Lifetime(0, 64, 0, 1), Lifetime(1, 64, 1, 2)])
    assert plan.offsets[0] != plan.offsets[1]
