"""SuperKernel: numerics against per-kernel execution, phases and barriers, splits, arena, outputs."""

from __future__ import annotations

import logging

import pytest
import torch

import autofusion
from autofusion.runtime.blas import sgemm_address
from autofusion.runtime.super_executor import SuperExecutor

BUILTINS = ["mlp", "transformer-block", "resnet-block", "elementwise-chain", "softmax", "layernorm"]


# The built-in rules turn linears and convs into library calls the entry cannot make (they split the
# scope, see test_rules_and_super_kernel_agree); the structure tests here take plain ATen linears.
# Freezing off too: these tests pin the SuperKernel's own mechanics (sgemm inside the entries, results
# bit-equal to per-kernel runs), and a linear measured faster on a prepacked weight runs outside them.
RULES_OFF = {"builtin_rules": False, "freeze": False}


def _both(fn, inputs, **kw):
    kw = {**RULES_OFF, **kw}
    on = autofusion.compile(fn, inputs, super_kernel="on", **kw)
    off = autofusion.compile(fn, inputs, super_kernel="off", **kw)
    return on, off


def _ran(*cms) -> None:
    """Each compiled model's kernels built and, where its plan has any, generated code ran."""
    for cm in cms:
        assert "build_error" not in cm.stats, cm.stats["build_error"]
        assert cm.stats["kernel_steps"] == 0 or cm.stats["generated_calls"] >= 1, cm.stats


def _super_plan(cm):
    return cm.last.program.super_plan


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("name", BUILTINS)
def test_builtins_equal_per_kernel(name: str, dtype: torch.dtype) -> None:
    kw = {"batch": 1, "seq": 16} if name == "transformer-block" else {}
    model, inputs = autofusion.builtin(name, dtype=dtype, **kw)
    on, off = _both(model, inputs)
    assert isinstance(on.last.program.executor, SuperExecutor)
    assert not isinstance(off.last.program.executor, SuperExecutor)
    with torch.no_grad():
        ref = off(*inputs)
        first = on(*inputs)
        second = on(*inputs)  # arena and pools reused
    # The same kernels (and, for fp32 linear, the same MKL GEMM torch calls) in the same order.
    assert torch.equal(first, ref) and torch.equal(second, ref)
    _ran(on, off)


@pytest.mark.parametrize("name", BUILTINS)
def test_rules_and_super_kernel_agree(name: str) -> None:
    """With the built-in rules on (the default), SuperKernel still equals per-kernel execution."""
    model, inputs = autofusion.builtin(name)
    on, off = _both(model, inputs, builtin_rules=True)
    with torch.no_grad():
        assert torch.equal(on(*inputs), off(*inputs))
    _ran(on, off)


def test_mlp_runs_as_one_entry_with_blas_inside() -> None:
    if sgemm_address() is None:
        pytest.skip("no LP64 sgemm_ in the loaded libraries")
    model, inputs = autofusion.builtin("mlp")
    # GEMM + epilogue kernels off: the linears stay library calls, made from inside the entry (the
    # plain route: a prepacked weight measured faster would keep a linear out of the entry, and
    # which one wins depends on the machine and its load)
    plain = {"linear_route": "plain", **RULES_OFF}
    cm = autofusion.compile(model, inputs, super_kernel="on", disabled=["gemm_epilogue"], **plain)
    st = cm.stats["super_kernel"]
    assert st["entries"] == 1 and st["calls_per_run"] == 1 and st["library_calls_inside"] == 3
    with torch.no_grad():
        torch.testing.assert_close(cm(*inputs), model(*inputs))
    # On (the default): the linears an activation reads run inside those kernels instead.
    cm = autofusion.compile(model, inputs, super_kernel="on", **plain)
    st = cm.stats["super_kernel"]
    fused = sum(1 for s in cm.last.program.plan.kernels if s.gemm is not None)
    assert fused >= 1 and st["entries"] == 1 and st["library_calls_inside"] + fused == 3
    with torch.no_grad():
        torch.testing.assert_close(cm(*inputs), model(*inputs))


def _chain(x: torch.Tensor, n: int) -> torch.Tensor:
    for i in range(n):
        x = (torch.sin(x), x * 1.01, x + 0.1, torch.tanh(x))[i % 4]
    return x


def _three(x: torch.Tensor) -> torch.Tensor:
    a = _chain(x, 7)
    b = _chain(a - a.mean(-1, keepdim=True), 7).reshape(x.shape[0] // 2, -1)  # a reshape of computed dims
    return _chain(b / b.amax(-1, keepdim=True), 6).reshape(-1)


@pytest.mark.parametrize(
    "shape", [(8, 8), (2, 1), (2, 3), (512, 1030)]
)  # tiny, size-1, odd, above PARALLEL_MIN
def test_dependent_kernels_get_barriers(shape: tuple[int, int]) -> None:
    x = torch.randn(shape)
    on, off = _both(_three, (x,))
    sp = _super_plan(on)
    assert len(sp.plan.kernels) == 3 and len(sp.super_kernels) == 1
    (sk,) = sp.super_kernels
    assert [len(p) for p in sk.phases] == [1, 1, 1] and sk.barriers == 2
    src = on.last.program.source
    entry = src[src.index('extern "C" void af_super_0') :]
    assert entry.count("#pragma omp barrier") == 2 and entry.count("#pragma omp parallel") == 1
    torch.testing.assert_close(on(x), off(x), rtol=0, atol=0)
    torch.testing.assert_close(on(x), _three(x), rtol=1e-4, atol=1e-4)


def _two_independent(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    a = torch.softmax(x * 2, -1).sum(-1).sum(-1, keepdim=True)
    b = torch.softmax(y * 3, -1).sum(-1).sum(-1, keepdim=True)
    return a + b


@pytest.mark.parametrize(
    "sizes", [((8, 64), (4, 32)), ((300, 200), (5, 7))]
)  # the second: one large, one small
def test_independent_kernels_share_a_phase(sizes) -> None:
    x, y = torch.randn(sizes[0]), torch.randn(sizes[1])
    on, off = _both(_two_independent, (x, y))
    (sk,) = _super_plan(on).super_kernels
    assert len(sk.phases[0]) == 2, sk.phases  # the two softmax kernels start together
    assert sk.barriers == len(sk.phases) - 1
    src = on.last.program.source
    entry = src[src.index('extern "C" void af_super_0') :]
    assert entry.count("#pragma omp barrier") == sk.barriers
    torch.testing.assert_close(on(x, y), off(x, y), rtol=0, atol=0)


def test_sync_all_options_give_every_kernel_its_phase() -> None:
    class M(torch.nn.Module):
        def forward(self, x, y):
            with autofusion.super_kernel_scope("s", options="early-start=0"):
                return _two_independent(x, y)

    x, y = torch.randn(8, 64), torch.randn(4, 32)
    cm = autofusion.compile(M(), (x, y), super_kernel="on", **RULES_OFF)
    (sk,) = _super_plan(cm).super_kernels
    assert sk.options.sync_all and all(len(p) == 1 for p in sk.phases)
    torch.testing.assert_close(cm(x, y), _two_independent(x, y))


def test_split_at_an_op_the_entry_cannot_call(caplog: pytest.LogCaptureFixture) -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        a = torch.softmax(x * 2, -1)
        return torch.tanh(torch.cumsum(a, -1)) + a  # cumsum: an extern ATen op

    x = torch.randn(16, 33)
    with caplog.at_level(logging.INFO, logger="autofusion.superkernel"):
        on, off = _both(f, (x,))
    sp = _super_plan(on)
    assert [type(p).__name__ for p in sp.program] == ["SuperKernel", "int", "SuperKernel"]
    assert [s.code for s in sp.splits] == ["OP_UNSUPPORT"]
    assert "cumsum" in sp.splits[0].reason
    assert any("splits at [OP_UNSUPPORT]" in r.getMessage() for r in caplog.records)
    torch.testing.assert_close(on(x), off(x), rtol=0, atol=0)
    torch.testing.assert_close(on(x), f(x))


def test_half_linear_splits_with_its_reason() -> None:
    model, inputs = autofusion.builtin("mlp", dtype=torch.float16)
    cm = autofusion.compile(model, inputs, super_kernel="on", **RULES_OFF)
    splits = cm.stats["super_kernel"]["splits"]
    assert splits and all("float32 only" in s for s in splits)


def test_auto_mode_follows_the_dispatch_share() -> None:
    small = autofusion.compile(lambda x: _chain(x, 20), (torch.randn(64),))
    assert small.stats["super_kernel"]["on"]
    big = autofusion.compile(lambda x: _chain(x, 4), (torch.randn(1024, 1024),))
    st = big.stats["super_kernel"]
    assert not st["on"] and "dispatch" in st["why"]


def test_outputs_are_owned_by_the_caller() -> None:
    x = torch.randn(8, 8)
    cm = autofusion.compile(_three, (x,), super_kernel="on", **RULES_OFF)
    first = cm(x)
    kept = first.clone()
    second = cm(x + 1)
    assert first.data_ptr() != second.data_ptr()
    assert torch.equal(first, kept)  # the held result was not overwritten
    del first
    third = cm(x)
    torch.testing.assert_close(third, kept, rtol=0, atol=0)


def test_arena_holds_the_intermediates() -> None:
    x = torch.randn(8, 8)
    cm = autofusion.compile(_three, (x,), super_kernel="on", **RULES_OFF)
    sp = _super_plan(cm)
    types = sp.plan.graph.value_types()
    inner = [v for s in sp.plan.kernels for v in s.outputs if v not in sp.plan.graph.outputs]
    assert sorted(sp.arena_values) == sorted(inner)
    # Two intermediates, each read by the next kernel only: a and b are never live together with
    # both of their consumers, but b is written while a is read, so they must not share bytes.
    assert sp.arena.size >= sum(types[v].nbytes for v in inner)


def test_torch_compile_path_uses_the_super_kernel() -> None:
    x = torch.randn(8, 8)
    with torch.no_grad():
        got = torch.compile(_three, backend="autofusion", options={"super_kernel": "on"})(x)
    torch.testing.assert_close(got, _three(x), rtol=1e-4, atol=1e-4)


def test_bmm_on_views_runs_inside_the_entry() -> None:
    """bmm reading permuted views of a kernel's output calls sgemm per batch entry from the same entry
    (the transformer-block test below covers views that stay aliases of an arena buffer)."""
    if sgemm_address() is None:
        pytest.skip("no LP64 sgemm_ in the loaded libraries")

    def f(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        h = torch.relu(x * 2 + 1)
        q = h.reshape(4, 8, 16).permute(1, 0, 2)  # [8, 4, 16] with strides (16, 128, 1)
        kt = h.reshape(4, 8, 16).permute(1, 2, 0)  # [8, 16, 4] with strides (16, 1, 128): a transposed matrix
        return torch.sigmoid(torch.bmm(q, w) + torch.bmm(q, kt).sum(-1, keepdim=True)) * 3

    x, w = torch.randn(32, 16), torch.randn(8, 16, 5)
    on, off = _both(f, (x, w))
    sp = _super_plan(on)
    assert len(sp.program) == 1 and list(sp.callable_ops.values()).count("bmm") == 2
    assert on.stats["super_kernel"]["calls_per_run"] == 1
    torch.testing.assert_close(on(x, w), off(x, w), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(on(x, w), f(x, w))


def test_bmm_without_a_unit_stride_splits() -> None:
    def f(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = torch.relu(x * 2 + 1)
        # every other column of x: no unit stride; the other operand comes from an entry (a bmm that
        # reads only graph inputs would run before the first entry and split nothing)
        return h, torch.sigmoid(torch.bmm(x[:, :, ::2], w * h.mean()))

    x, w = torch.randn(3, 8, 10), torch.randn(3, 5, 4)
    on, off = _both(f, (x, w))
    splits = on.stats["super_kernel"]["splits"]
    assert len(splits) == 1 and "OP_UNSUPPORT" in splits[0] and "unit stride" in splits[0]
    torch.testing.assert_close(on(x, w), off(x, w), rtol=0, atol=0)
    torch.testing.assert_close(on(x, w), f(x, w))
    assert len(_super_plan(on).super_kernels) == 2


@pytest.mark.parametrize(
    "shape", [(0, 8), (8, 0), (), (1,), (3, 1), "t"]
)  # "t": a transposed (strided) input
def test_edge_shapes(shape) -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        a = torch.softmax(x * 2, -1)
        return torch.sin(a) + a.sum(-1, keepdim=True)

    x = torch.randn(16, 24).t() if shape == "t" else torch.randn(shape)
    on, off = _both(f, (x,))
    assert on.stats["super_kernel"]["on"]
    torch.testing.assert_close(on(x), off(x), rtol=0, atol=0)
    torch.testing.assert_close(on(x), f(x), equal_nan=True)


def test_views_of_the_arena_are_made_once() -> None:
    model, inputs = autofusion.builtin("transformer-block", batch=1, seq=16)
    cm = autofusion.compile(model, inputs, super_kernel="on", **RULES_OFF)
    sp = _super_plan(cm)
    ex = cm.last.program.executor
    ops_left = [item.op for kind, item, _ in ex._program if kind == "node"]
    # q, k, v are views of the qkv linear's output in the arena, and both bmm run inside the entry;
    # what is left is the reshape that has to copy (a permuted bmm result back to [1, 16, 128]).
    assert ops_left == ["reshape"]
    assert cm.stats["super_kernel"]["calls_per_run"] == len(ex._program) == 3 < len(sp.program)
    assert cm.stats["super_kernel"]["views_inside"] > 0
    (split,) = cm.stats["super_kernel"]["splits"]
    assert split.startswith("[EXTERNAL_DEPEND]") and "must copy" in split
