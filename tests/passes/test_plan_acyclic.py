"""Property: the fusion plan of any DAG is acyclic and computes what the graph computes.

Random IR graphs mix what makes the solver's cycle check hard: values read by several consumers
(horizontal candidates, multi-output kernels), reductions and their broadcast back, broadcast bias
inputs, extern ATen calls and library matmuls (steps no kernel takes, which a path may run through),
and view chains (free nodes copied into each reader). Plans are built with and without horizontal
merges and recomputation; the plan runs step by step and must match the graph run node by node. A
smaller set is compiled to C++ and run through the generated kernels, per kernel and as SuperKernels.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import autofusion
from autofusion.compiler import _no_fuse, compile_graph, plan_graph
from autofusion.config import Options
from autofusion.fusion.dag import GroupDag
from autofusion.fusion.solver import FusionLimits, Solver, solve
from autofusion.hw.profile import load_profile
from autofusion.ir import DType, Graph, GraphBuilder, InputRole, TensorType
from autofusion.ir.graph import Arg
from autofusion.ir.interpret import run_graph
from autofusion.plan.schedule import Plan, build_plan
from autofusion.runtime.executor import PlanExecutor

UNARY = ("exp", "sin", "neg", "tanh", "relu")
BINARY = ("add", "mul", "sub", "maximum")
F32 = DType.float32


def cumsum(b: GraphBuilder, v: int, t: TensorType) -> int:
    """An extern ATen call (torch runs it): a step no kernel takes."""
    attrs = {"target": "aten.cumsum.default", "args": (Arg(0), 1), "kwargs": (), "out_types": (t,)}
    return b.add_node("extern", [v], attrs)[0]


@st.composite
def graphs(draw: st.DrawFn) -> Graph:
    rows, cols = draw(st.integers(1, 5)), draw(st.integers(1, 7))
    full = TensorType(F32, (rows, cols))
    b = GraphBuilder("random_dag")
    vals = [b.add_input(full, "x"), b.add_input(full, "y")]
    shapes = {vals[0]: (rows, cols), vals[1]: (rows, cols)}
    bias = b.add_input(TensorType(F32, (cols,)), "bias")  # broadcast against every full value
    weight = b.add_input(TensorType(F32, (cols, cols)), "w", InputRole.PARAM)
    shapes[bias] = (cols,)

    def pick() -> int:
        # The last three values (long chains), any value (many consumers) or an input (siblings).
        where = draw(st.sampled_from(["recent", "any", "input"]))
        lo = max(0, len(vals) - 3) if where == "recent" else 0
        return vals[draw(st.integers(lo, 1 if where == "input" else len(vals) - 1))]

    def pick_full() -> int:
        v = pick()
        return v if shapes[v] == (rows, cols) else new(b.add("add", [v, vals[0]]), (rows, cols))

    def new(v: int, shape: tuple[int, ...]) -> int:
        shapes[v] = shape
        vals.append(v)
        return v

    for _ in range(draw(st.integers(2, 20))):
        kind = draw(st.sampled_from(["unary", "binary", "binary", "bias", "reduce", "extern", "mm", "view",
                                     "detour", "detour"]))  # fmt: skip
        if kind == "unary":
            v = pick()
            new(b.add(draw(st.sampled_from(UNARY)), [v]), shapes[v])
        elif kind == "binary":
            v, w = pick_full(), pick()  # w may be a reduced row/column: broadcast back
            args = [v, w] if draw(st.booleans()) else [w, v]
            new(b.add(draw(st.sampled_from(BINARY)), args), (rows, cols))
        elif kind == "bias":
            new(b.add("add", [pick_full(), bias]), (rows, cols))
        elif kind == "reduce":
            dim = draw(st.sampled_from([0, 1]))
            op = draw(st.sampled_from(["sum", "amax"]))
            shape = (1, cols) if dim == 0 else (rows, 1)
            new(b.add(op, [pick_full()], {"dims": (dim,), "keepdim": True}), shape)
        elif kind == "extern":  # a library step a path between two kernels may run through
            v = pick_full()
            new(cumsum(b, v, full), (rows, cols))
        elif kind == "mm":
            new(b.add("mm", [pick_full(), weight]), (rows, cols))
        elif kind == "detour":  # v's consumer also reads v through a library call, maybe after
            # joining an earlier value (so the consumer's kernel starts before v: a path back into it).
            early = vals[draw(st.integers(0, len(vals) - 1))]
            v = pick_full()
            lib = b.add("mm", [v, weight]) if draw(st.booleans()) else cumsum(b, v, full)
            new(lib, (rows, cols))
            w = new(b.add(draw(st.sampled_from(UNARY)), [v]), (rows, cols)) if draw(st.booleans()) else v
            if draw(st.integers(0, 3)):
                lib = new(b.add(draw(st.sampled_from(BINARY)), [early, lib]), (rows, cols))
            new(b.add(draw(st.sampled_from(BINARY)), [lib, w]), (rows, cols))
        else:  # a view chain, then a consumer of it
            t = b.add("permute", [pick_full()], {"dims": (1, 0)})
            new(b.add("permute", [b.add("neg", [t])], {"dims": (1, 0)}), (rows, cols))
    outs = list(dict.fromkeys([vals[-1]] + [pick() for _ in range(draw(st.integers(0, 2)))]))
    return b.build(outs)


def _inputs(g: Graph, seed: int = 0) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(gi.value.type.shape, generator=gen) * 0.5 for gi in g.inputs]


def _assert_topological(plan: Plan) -> None:
    ready = {gi.value.id for gi in plan.graph.inputs}
    for step in plan.steps:
        missing = [v for v in step.inputs if v not in ready]
        assert not missing, f"step reads {missing} before they are computed"
        ready.update(step.outputs)


def _match(got: list[torch.Tensor], ref: list[torch.Tensor]) -> None:
    for o, r in zip(got, ref, strict=True):
        torch.testing.assert_close(o, r, rtol=1e-4, atol=1e-4, equal_nan=True)


OPTION_SETS = [
    {},
    {"recomputation_threshold": 3},
    {"disabled": frozenset({"horizontal_kernel"})},
    {"recomputation_threshold": 4, "max_fusion_size": 4},
]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graphs(), st.sampled_from(OPTION_SETS))
def test_random_dags_plan_without_cycles_and_match_the_graph(g: Graph, opts: dict) -> None:
    options = Options.from_env(verify=True, **opts)
    plan = plan_graph(g, options, load_profile("cpu", measure=False))  # raises on a cyclic plan
    _assert_topological(plan)
    xs = _inputs(g)
    _match(PlanExecutor(plan, None).run(xs), run_graph(g, xs))


@pytest.mark.parametrize("super_kernel", ["off", "on"])
@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(g=graphs())
def test_random_dags_through_generated_kernels(tmp_path_factory, super_kernel: str, g: Graph) -> None:
    cache = str(tmp_path_factory.getbasetemp() / "cache")
    options = Options.from_env(cache_dir=cache, super_kernel=super_kernel, recomputation_threshold=3)
    program = compile_graph(g, options)
    _assert_topological(program.plan)
    xs = _inputs(g)
    _match(program.executor.run(xs), run_graph(g, xs))
    if program.plan.kernels:  # the generated code ran, not the reference runtime
        assert "build_error" not in program.stats, program.stats["build_error"]
        assert program.library is not None


# ---- fixed graphs the old node-level check (one direction only) got wrong ----


def _shared_input_baddbmm() -> Graph:
    """baddbmm(z.sin(), z.cos(), z) * 2: the bias chain and the bmm's left operand read one input, so
    they are horizontal siblings, and the bias chain's epilogue runs after the bmm."""
    t = TensorType(F32, (5, 5, 5))
    b = GraphBuilder("shared_input_baddbmm")
    z = b.add_input(t, "z")
    bias = b.add("sin", [z])
    left = b.add("cos", [z])
    mm = b.add("bmm", [left, z])
    out = b.add("mul", [b.add("add", [bias, mm]), b.add("full", (), {"value": 2.0, "dtype": F32})])
    return b.build([out])


def test_a_sibling_that_reaches_the_group_through_a_library_call_is_not_merged() -> None:
    g = _shared_input_baddbmm()
    plan = plan_graph(g, Options.from_env(), load_profile("cpu", measure=False))
    _assert_topological(plan)
    assert any(d.code == "NF1002" and d.kind == "horizontal" for d in plan.decisions)
    xs = _inputs(g)
    _match(PlanExecutor(plan, None).run(xs), run_graph(g, xs))


def test_a_path_through_another_kernel_counts_as_a_cycle() -> None:
    """a -> cumsum -> k1, and k2 -> b, where k1 and k2 are one (multi-output) kernel: merging a with b
    closes a -> cumsum -> kernel -> b, though no node-level path leaves a and reaches b."""
    t = TensorType(F32, (4, 6))
    bld = GraphBuilder("through_a_kernel")
    x, y = bld.add_input(t, "x"), bld.add_input(t, "y")
    a = bld.add("exp", [x])
    e = cumsum(bld, a, t)
    k1 = bld.add("neg", [e])
    k2 = bld.add("sin", [y])
    out = bld.add("add", [a, k2])
    g = bld.build([k1, out])
    profile = load_profile("cpu", measure=False)
    # Nodes: 0 exp, 1 cumsum, 2 neg, 3 sin, 4 add. A rule asks for neg and sin in one kernel.
    solver = Solver(g, profile, FusionLimits(), _no_fuse)
    solver.force([[2, 3]])
    assert solver.find(3) == solver.find(2)
    assert solver.creates_cycle(0, 4)
    assert not solver.creates_cycle(solver.find(3), 4)
    result, solver = solve(g, profile, FusionLimits(), _no_fuse, forced=[[2, 3]])
    plan = build_plan(g, result, solver, profile)
    _assert_topological(plan)
    assert [2, 3] in [sorted(m) for m in result.groups] or [2, 3, 4] in [sorted(m) for m in result.groups]
    assert not any(0 in m and 4 in m for m in result.groups)
    xs = _inputs(g)
    _match(PlanExecutor(plan, None).run(xs), run_graph(g, xs))


def test_group_dag_ranks_stay_topological_after_merges() -> None:
    # 0 -> 1 -> 3, 0 -> 2 -> 3, 2 -> 4, 1 -> 5 (nodes in topological order); merge far-apart vertices.
    users = [[1, 2], [3, 5], [3, 4], [], [], []]
    dag = GroupDag(users, set())
    assert dag.creates_cycle((0, 3))  # 0 -> 1 -> 3 leaves and re-enters
    assert not dag.creates_cycle((1, 2))
    dag.merge((1, 2), 1)
    assert dag.creates_cycle((0, 3))
    assert not dag.creates_cycle((1, 3))
    dag.merge((1, 3), 1)
    assert not dag.creates_cycle((4, 5)) and not dag.creates_cycle((0, 1))
    for v, succ in dag.succ.items():
        assert all(dag.rank[v] < dag.rank[s] for s in succ)


def test_group_dag_reorders_ranks_when_a_late_vertex_joins_an_early_one() -> None:
    # 0 -> 2, 1 -> 3 -> 4, 2 -> 4 ... merge 0 with 3 (unrelated): 2 (after 0) must move after the merged
    # vertex's predecessors, and 1 (before 3) before it; the ranks must still order every edge.
    users = [[2], [3], [4], [4], []]
    dag = GroupDag(users, set())
    dag.merge((0, 3), 0)
    assert dag.succ[0] == {2, 4} and dag.pred[0] == {1}
    for v, succ in dag.succ.items():
        assert all(dag.rank[v] < dag.rank[s] for s in succ)
    assert dag.creates_cycle((1, 2))  # 1 -> {0, 3} -> 2


# ---- the models that met the cyclic plan ----


def test_onnx_mean_variance_normalization_expanded() -> None:
    """ONNX's own backend case test_mvn_expanded: the mean and the variance over axes (0, 2, 3) fuse
    with their epilogue while one square is a sibling of the first mean's input."""
    onnx_cases = pytest.importorskip("onnx.backend.test.case.node")
    case = next(c for c in onnx_cases.collect_testcases() if c.name == "test_mvn_expanded")
    inputs, expected = case.data_sets[0]
    cm = autofusion.compile(case.model)
    got = cm(*[torch.from_numpy(i) for i in inputs])
    got = got if isinstance(got, torch.Tensor) else got[0]
    torch.testing.assert_close(got, torch.from_numpy(expected[0]), rtol=1e-5, atol=1e-5)
    assert "build_error" not in cm.stats and cm.stats["fused_kernels"] >= 1, cm.stats


@pytest.mark.parametrize("beta,alpha", [(1.0, 1.0), (0.2, 0.6)])
@pytest.mark.parametrize("bias_shape", [(5, 5, 5), (1,), ()])
def test_baddbmm_with_siblings_of_its_operands(beta: float, alpha: float, bias_shape: tuple) -> None:
    def fn(z: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.baddbmm((b + z).sin(), z.cos(), z, beta=beta, alpha=alpha).cos()

    z, b = torch.randn(5, 5, 5), torch.randn(bias_shape)
    with torch.no_grad():
        ref = fn(z, b)
        cm = autofusion.compile(fn, [z, b])
        torch.testing.assert_close(cm(z, b), ref, rtol=1e-5, atol=1e-5)
        torch._dynamo.reset()
        torch.testing.assert_close(torch.compile(fn, backend="autofusion")(z, b), ref, rtol=1e-5, atol=1e-5)
    assert "build_error" not in cm.stats and cm.stats["fused_kernels"] >= 1, cm.stats
