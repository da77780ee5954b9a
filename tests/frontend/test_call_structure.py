"""Calls and results that are more than tensors: keywords, constants, objects holding tensors,
dataclasses and named tuples; the structure key; results that return an object the caller passed."""

from __future__ import annotations

import dataclasses
import logging
from typing import NamedTuple

import pytest
import torch

import autofusion
from autofusion.frontend.torch.pytree import call_tree, flatten, rebuild


class State:
    """A plain object holding tensors (like a cache class no pytree knows)."""

    def __init__(self, k: torch.Tensor, v: torch.Tensor, step: int) -> None:
        self.k, self.v, self.step = k, v, step


@dataclasses.dataclass
class Out:
    y: torch.Tensor
    state: State
    note: str = "done"


class Pair(NamedTuple):
    a: torch.Tensor
    b: torch.Tensor


def test_flatten_and_rebuild_round_trip() -> None:
    t1, t2, t3 = torch.ones(2), torch.zeros(3), torch.arange(4)
    tree = call_tree((t1, Pair(t2, t3)), {"flag": True, "state": State(t1, t2, 7), "none": None})
    flat = flatten(tree)
    assert [id(t) for t in flat.tensors] == [id(t1), id(t2), id(t3), id(t1), id(t2)]
    made: dict = {}
    args, kwargs = rebuild(flat.node, flat.tensors, made=made)
    assert type(args[1]) is Pair and args[1].b is t3
    assert kwargs["flag"] is True and kwargs["none"] is None
    assert type(kwargs["state"]) is State and kwargs["state"] is not tree[1]["state"]  # a copy
    assert kwargs["state"].k is t1 and kwargs["state"].step == 7
    # the key: equal for the same structure and constants, different otherwise
    same = call_tree((t2, Pair(t1, t3)), {"flag": True, "state": State(t3, t1, 7), "none": None})
    assert flatten(same).node == flat.node
    for other in ({"flag": False}, {"flag": 1}, {"state": State(t1, t2, 8)}):
        changed = {**tree[1], **other}
        assert flatten(call_tree(tree[0], changed)).node != flat.node
    hash(flat.node)


def test_an_object_without_tensors_is_a_constant() -> None:
    class Config:
        def __init__(self) -> None:
            self.size = 3

    cfg = Config()
    flat = flatten(call_tree((torch.ones(1),), {"cfg": cfg, "items": [1, 2]}))
    assert len(flat.tensors) == 1 and rebuild(flat.node, flat.tensors)[1]["cfg"] is cfg


def model(x: torch.Tensor, state: State, *, scale: float = 1.0, use_state: bool = True) -> Out:
    if use_state:
        state.k.mul_(0.5)  # an update of a tensor the object holds: replayed
    y = torch.tanh(x * scale) + state.k.sum()
    return Out(y, state)


def test_keywords_objects_and_dataclass_results(generated_code_ran) -> None:
    x = torch.randn(4)
    s_ref, s_ours = State(torch.ones(2), torch.zeros(2), 1), State(torch.ones(2), torch.zeros(2), 1)
    cm = autofusion.compile(
        model, [x], kwargs={"state": State(torch.ones(2), torch.zeros(2), 1), "scale": 2.0}
    )
    with torch.no_grad():
        for _ in range(2):
            ref, got = model(x, s_ref, scale=2.0), cm(x, state=s_ours, scale=2.0)
            assert type(got) is Out and got.note == "done"
            assert got.state is s_ours  # the caller's own object, as eager returns it
            torch.testing.assert_close(got.y, ref.y)
            torch.testing.assert_close(s_ours.k, s_ref.k)
        generated_code_ran(cm.stats, "model", expect_kernel=True)
        # another constant compiles another signature; positional and keyword spellings differ too
        torch.testing.assert_close(cm(x, s_ours, scale=3.0, use_state=False).y,
                                   model(x, s_ref, scale=3.0, use_state=False).y)  # fmt: skip
    assert cm.stats["signatures"] == 2


def test_a_model_that_changes_python_state_of_an_argument_runs_eagerly(caplog) -> None:
    def bump(x: torch.Tensor, state: State) -> torch.Tensor:
        state.step += 1  # not a tensor: a compiled graph could not replay it
        return x + state.k

    s = State(torch.ones(3), torch.zeros(3), 0)
    cm = autofusion.compile(bump)
    with caplog.at_level(logging.WARNING):
        out = cm(torch.ones(3), s)
    torch.testing.assert_close(out, torch.full((3,), 2.0))
    assert s.step == 1  # the eager run did it, once
    assert "changes a State it was given (step)" in cm.stats["eager_fallback"]


def test_named_tuple_and_nested_results() -> None:
    def f(x: torch.Tensor) -> dict:
        return {"pair": Pair(x + 1, x * 2), "list": [x.exp(), None, 3]}

    x = torch.randn(3)
    cm = autofusion.compile(f, [x])
    with torch.no_grad():
        got, ref = cm(x), f(x)
    assert type(got["pair"]) is Pair and got["list"][1] is None and got["list"][2] == 3
    torch.testing.assert_close(got["pair"].b, ref["pair"].b)
    torch.testing.assert_close(got["list"][0], ref["list"][0])


def test_onnx_models_take_positional_tensors_only(tmp_path) -> None:
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])  # fmt: skip
    cm = autofusion.compile(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    assert onnx is not None
    with pytest.raises(TypeError, match="positional tensors only"):
        cm(x=torch.ones(2))


def test_dynamic_contract_names_positional_tensors_only() -> None:
    def f(x: torch.Tensor, *, scale: float = 1.0) -> torch.Tensor:
        return x * scale

    with pytest.raises(TypeError, match="dynamic= names positional tensors"):
        autofusion.compile(f, [torch.ones(2)], kwargs={"scale": 2.0}, dynamic=False)
    cm = autofusion.compile(f, [torch.ones(2)], dynamic=False)
    with pytest.raises(TypeError, match="dynamic= names positional tensors"):
        cm(torch.ones(2), scale=2.0)


def test_an_empty_dict_an_object_makes_anew_each_call_keeps_the_key() -> None:
    """transformers' caches set `self.x = {}` on every update: a dict of plain keys is a constant
    compared by value (as lists are), so the next call's key equals this one's and nothing recompiles;
    a changed content is another key."""
    t = torch.ones(2)
    a = flatten(call_tree((t,), {"state": State(t, t, 1), "extra": {}})).node
    b = flatten(call_tree((t,), {"state": State(t, t, 1), "extra": {}})).node
    c = flatten(call_tree((t,), {"state": State(t, t, 1), "extra": {"k": 1}})).node
    assert a == b and hash(a) == hash(b) and a != c

    holder = State(torch.randn(3), torch.randn(3), 0)
    holder.meta = {}  # type: ignore[attr-defined]

    def f(x: torch.Tensor, s: State) -> torch.Tensor:
        s.meta = {}  # type: ignore[attr-defined]
        return x * 2 + s.k

    from autofusion import compiler

    x = torch.randn(3)
    cm = autofusion.compile(f, (x, holder))
    plans = compiler.COUNTS["plans"]
    for _ in range(3):
        torch.testing.assert_close(cm(x, holder), x * 2 + holder.k)
    assert compiler.COUNTS["plans"] == plans
