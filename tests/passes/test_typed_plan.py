"""The contracts below the IR are frozen: plans, steps, loop kernels, statements, decisions, programs
and SuperKernel plans cannot be changed once made, and what they store is tuples. Every step reads
the same way (the Step protocol): name, inputs, outputs, nodes."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

import autofusion
from autofusion.kernel.lower import Stmt, StmtKind
from autofusion.plan.schedule import KernelStep, OpStep


def model(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    a = x * 2.0 + 1.0
    c = torch.cumsum(a, 0)  # an op step between two kernels
    s = (a - a.amax(-1, keepdim=True)).exp().sum(-1, keepdim=True)
    return a.exp() + c, s


@pytest.fixture(scope="module")
def program():
    x = torch.randn(16, 64)
    with torch.no_grad():
        cm = autofusion.compile(model, (x,), super_kernel="on")
        torch.testing.assert_close(cm(x), model(x))
    return cm.compiled.program


def _frozen(obj: object) -> None:
    name = dataclasses.fields(obj)[0].name  # type: ignore[arg-type]
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(obj, name, getattr(obj, name))


def test_every_contract_type_is_frozen(program) -> None:
    plan = program.plan
    kernel_step = plan.kernels[0]
    op_step = next(s for s in plan.steps if isinstance(s, OpStep))
    kernel = kernel_step.kernel
    splan = program.super_plan
    assert splan is not None and splan.super_kernels
    objects = [program, plan, kernel_step, op_step, kernel, kernel.all_stmts()[0], kernel.accumulators[0],
               plan.decisions[0], splan, splan.super_kernels[0], splan.splits[0],
               program.records[0]]  # fmt: skip
    for obj in objects:
        _frozen(obj)


def test_stored_collections_are_tuples(program) -> None:
    plan = program.plan
    assert type(plan.steps) is tuple and type(plan.decisions) is tuple and type(program.records) is tuple
    for s in plan.kernels:
        assert all(type(x) is tuple for x in (s.inputs, s.outputs, s.nodes))
        k = s.kernel
        assert all(type(x) is tuple for x in (k.buffers, k.stages, k.accumulators, k.pre, k.post))
        assert all(type(st) is tuple for st in k.stages)
    splan = program.super_plan
    assert type(splan.program) is tuple and type(splan.splits) is tuple
    for sk in splan.super_kernels:
        assert type(sk.members) is tuple and all(type(p) is tuple for p in sk.phases)
        assert sk.members == tuple(m for p in sk.phases for m in p)


def test_steps_read_through_one_protocol(program) -> None:
    graph = program.plan.graph
    for s in program.plan.steps:
        if isinstance(s, OpStep):
            assert s.name == s.node.name and s.inputs == s.node.inputs
            assert s.outputs == tuple(v.id for v in s.node.outputs) and s.nodes == (s.node_index,)
            assert graph.nodes[s.node_index] is s.node
        else:
            assert isinstance(s, KernelStep) and s.name == s.kernel.name
        assert s.first_node == min(s.nodes)


def test_stmt_kind_is_an_enum_that_prints_as_before() -> None:
    s = Stmt(StmtKind.LOAD, "v1")
    assert s.kind is StmtKind.LOAD and s.kind == "load" and f"{s.kind}" == "load"
    assert json.dumps({"kind": s.kind}) == '{"kind": "load"}'
    assert Stmt("store").kind is StmtKind.STORE  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="bogus"):
        Stmt("bogus")  # type: ignore[arg-type]
