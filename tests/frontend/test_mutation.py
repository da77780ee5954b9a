"""Models that update inputs and buffers in place: compiled (no eager fallback), the caller's tensors
updated as eager updates them, scatters into a cache done in place (no copy of the cache), and the
aliasing cases: an updated input read again, returned, or passed twice; poison mode; held results."""

from __future__ import annotations

import logging

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import autofusion
from autofusion.backend import autofusion_backend


class Writes(TorchDispatchMode):
    """The torch ops a call runs, with the data pointer of each tensor they return."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[tuple[str, tuple[int, ...], int]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in torch.utils._pytree.tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self.ops.append((str(func), tuple(t.shape), t.data_ptr()))
        return out


def index_copy_step(cache: torch.Tensor, pos: torch.Tensor, k: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    cache.index_copy_(2, pos, k)
    return torch.softmax(q @ cache.transpose(-1, -2), -1) * 2


def slice_step(cache: torch.Tensor, k: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    cache[:, :, 3:4] = k
    return torch.softmax(q @ cache.transpose(-1, -2), -1) * 2


def _cache_args() -> tuple[torch.Tensor, ...]:
    torch.manual_seed(0)
    return torch.randn(1, 2, 64, 8), torch.tensor([5]), torch.randn(1, 2, 1, 8), torch.randn(1, 2, 1, 8)


def _clone(args: tuple[torch.Tensor, ...]) -> list[torch.Tensor]:
    return [a.clone() for a in args]


@pytest.mark.parametrize("super_kernel", ["on", "off"])
@pytest.mark.parametrize("poison", [False, True])
def test_index_copy_into_a_cache_is_done_in_place(
    super_kernel: str, poison: bool, generated_code_ran
) -> None:
    args = _cache_args()
    ref, ours = _clone(args), _clone(args)
    cm = autofusion.compile(index_copy_step, _clone(args), super_kernel=super_kernel, poison=poison)
    (m,) = cm.compiled.captured.mutations
    assert m.inplace and m.target == ("user", 0)
    ptr = ours[0].data_ptr()
    with torch.no_grad():
        for step in range(3):
            ref[1].fill_(step)
            ours[1].fill_(step)
            expect = index_copy_step(*ref)
            with Writes() as seen:
                got = cm(*ours)
            torch.testing.assert_close(got, expect)
            torch.testing.assert_close(ours[0], ref[0])
            # no op returned a cache-sized tensor other than the cache itself, updated in place; with
            # SuperKernels the entry writes the row itself (no torch op at all), else torch's index_put_
            big = [(op, p) for op, shape, p in seen.ops if shape == tuple(ours[0].shape)]
            assert all(p == ptr for _, p in big), seen.ops
            assert bool(big) == (super_kernel == "off"), seen.ops
    generated_code_ran(cm.stats, "index_copy_step", expect_kernel=True)
    if super_kernel == "on":
        lib = cm.compiled.program.library
        before = lib.af_scatter_calls()
        with torch.no_grad():
            cm(*ours)
        assert lib.af_scatter_calls() - before == 1 and cm.stats["super_kernel"]["splits"] == []


def test_slice_assignment_is_done_in_place(generated_code_ran) -> None:
    cache, _, k, q = _cache_args()
    ref, ours = [cache.clone(), k, q], [cache.clone(), k, q]
    cm = autofusion.compile(slice_step, [cache.clone(), k, q])
    assert [m.inplace for m in cm.compiled.captured.mutations] == [True]
    with torch.no_grad():
        torch.testing.assert_close(cm(*ours), slice_step(*ref))
    torch.testing.assert_close(ours[0], ref[0])
    generated_code_ran(cm.stats, "slice_step", expect_kernel=True)


def test_old_value_read_after_the_update_is_not_overwritten() -> None:
    """The old cache is read after the update: the scatter cannot run in place (it would change what
    the later read sees), so the new value is computed apart and copied in after the graph."""

    def f(cache: torch.Tensor, pos: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        old = cache * 1.0
        cache.index_copy_(0, pos, k)
        return old + 1, cache.sum(0)

    cache, pos, k = torch.randn(6, 4), torch.tensor([2]), torch.randn(1, 4)
    ref, ours = [cache.clone(), pos, k], [cache.clone(), pos, k]
    cm = autofusion.compile(f, [cache.clone(), pos, k], poison=True)
    assert [m.inplace for m in cm.compiled.captured.mutations] == [False]
    with torch.no_grad():
        for _ in range(2):
            expect, got = f(*ref), cm(*ours)
            torch.testing.assert_close(got, expect)
            torch.testing.assert_close(ours[0], ref[0])
    assert "eager_fallback" not in cm.stats


@pytest.mark.parametrize("poison", [False, True])
def test_elementwise_update_of_an_input_also_read_and_returned(poison: bool) -> None:
    def f(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        before = x * 2
        x.add_(1)
        return before + x, x

    x_ref, x = torch.randn(5), None
    x = x_ref.clone()
    cm = autofusion.compile(f, [x.clone()], poison=poison)
    held = []
    with torch.no_grad():
        for _ in range(3):
            (a, _), (c, d) = f(x_ref), cm(x)
            torch.testing.assert_close(c, a)
            assert d is x  # eager returns the updated input itself
            torch.testing.assert_close(x, x_ref)
            held.append((c, c.clone()))
    for got, copy in held:  # results the caller holds are not overwritten by later calls
        torch.testing.assert_close(got, copy)
    assert cm.stats["generated_calls"] >= 3 and "eager_fallback" not in cm.stats


def test_scatter_result_returned_is_the_callers_tensor() -> None:
    def f(cache: torch.Tensor, pos: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        cache.index_copy_(0, pos, k)
        return cache

    cache, pos, k = torch.zeros(4, 3), torch.tensor([1]), torch.ones(1, 3)
    cm = autofusion.compile(f, [cache.clone(), pos, k])
    with torch.no_grad():
        out = cm(cache, pos, k)
    assert out is cache or out.data_ptr() == cache.data_ptr()
    assert cache[1].tolist() == [1.0, 1.0, 1.0] and cache.sum() == 3


def test_an_updated_input_passed_twice_runs_eagerly(caplog: pytest.LogCaptureFixture) -> None:
    def f(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        a.add_(1)
        return b * 2  # b is a: eager reads the updated value

    cm = autofusion.compile(f, [torch.zeros(3), torch.zeros(3)])
    x, y = torch.zeros(3), torch.zeros(3)
    with torch.no_grad():
        torch.testing.assert_close(cm(x, y), torch.zeros(3))  # distinct: compiled
        assert "eager_fallback" not in cm.stats and x.tolist() == [1.0] * 3
        with caplog.at_level(logging.WARNING):
            z = torch.zeros(3)
            torch.testing.assert_close(cm(z, z), torch.full((3,), 2.0))  # the same tensor: eager semantics
            w = torch.zeros(6)
            torch.testing.assert_close(
                cm(w[:3], w[:3].view(3)), torch.full((3,), 2.0)
            )  # views of one storage
    assert z.tolist() == [1.0] * 3
    assert "shares memory" in cm.stats["eager_fallback"] and "shares memory" in caplog.text
    with torch.no_grad():
        cm(x, y)
    assert "eager_fallback" not in cm.stats and x.tolist() == [2.0] * 3


def test_two_arguments_that_are_the_same_tensor_at_capture() -> None:
    def f(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        a.mul_(3)
        return a + b

    z = torch.ones(3)
    cm = autofusion.compile(f, [z, z])  # traced as distinct inputs; this call itself runs eagerly
    x, y = torch.ones(3), torch.ones(3)
    with torch.no_grad():
        torch.testing.assert_close(cm(x, y), torch.full((3,), 4.0))
    assert x.tolist() == [3.0] * 3 and y.tolist() == [1.0] * 3 and "eager_fallback" not in cm.stats


class Counter(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("n", torch.zeros(()))
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.n += 1
        return torch.relu(self.lin(x)) + self.n


def test_buffer_counter_both_routes(generated_code_ran) -> None:
    torch.manual_seed(0)
    eager, ours, dyn = Counter().eval(), Counter().eval(), Counter().eval()
    ours.load_state_dict(eager.state_dict())
    dyn.load_state_dict(eager.state_dict())
    x = torch.randn(2, 4)
    cm = autofusion.compile(ours, [x])  # capture does not run the update
    assert ours.n.item() == 0
    graphs: list = []

    def backend(gm, example_inputs):
        compiled = autofusion_backend(gm, example_inputs)
        graphs.append(compiled)
        return compiled

    torch._dynamo.reset()
    tc = torch.compile(dyn, backend=backend)
    with torch.no_grad():
        for _ in range(3):
            expect = eager(x)
            torch.testing.assert_close(cm(x), expect)
            torch.testing.assert_close(tc(x), expect)
    assert eager.n.item() == ours.n.item() == dyn.n.item() == 3
    generated_code_ran(cm.stats, "Counter", expect_kernel=True)
    assert graphs and all(g.autofusion_graph is not None for g in graphs)


def test_torch_compile_backend_updates_a_cache_in_place() -> None:
    args = _cache_args()
    ref, ours = _clone(args), _clone(args)
    graphs: list = []

    def backend(gm, example_inputs):
        compiled = autofusion_backend(gm, example_inputs)
        graphs.append(compiled)
        return compiled

    torch._dynamo.reset()
    fn = torch.compile(index_copy_step, backend=backend, dynamic=False)
    with torch.no_grad():
        torch.testing.assert_close(fn(*ours), index_copy_step(*ref))
    torch.testing.assert_close(ours[0], ref[0])
    (g,) = graphs
    assert g.autofusion_graph is not None, g.autofusion_stats()
    assert [m.inplace for m in g.autofusion_graph.captured.mutations] == [True]


class CachedAttention(torch.nn.Module):
    """A hand-written static KV cache: buffers written at `pos` by index_copy_, read whole."""

    def __init__(self, length: int = 32, dim: int = 8) -> None:
        super().__init__()
        self.qkv = torch.nn.Linear(dim, 3 * dim)
        self.register_buffer("k", torch.zeros(1, length, dim))
        self.register_buffer("v", torch.zeros(1, length, dim))

    def forward(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).chunk(3, -1)
        self.k.index_copy_(1, pos, k)
        self.v.index_copy_(1, pos, v)
        return torch.softmax(q @ self.k.transpose(1, 2), -1) @ self.v


def test_buffers_of_a_hand_written_cache_are_updated_in_place() -> None:
    torch.manual_seed(0)
    eager, ours = CachedAttention().eval(), CachedAttention().eval()
    ours.load_state_dict(eager.state_dict())
    x = torch.randn(1, 1, 8)
    cm = autofusion.compile(ours, [x, torch.tensor([0])])
    assert [(m.inplace, m.target[1].target) for m in cm.compiled.captured.mutations] == [
        (True, "k"),
        (True, "v"),
    ]
    ptrs = (ours.k.data_ptr(), ours.v.data_ptr())
    with torch.no_grad():
        for step in range(4):
            pos = torch.tensor([step])
            x = torch.randn(1, 1, 8)
            torch.testing.assert_close(cm(x, pos), eager(x, pos))
    torch.testing.assert_close(ours.k, eager.k)
    torch.testing.assert_close(ours.v, eager.v)
    assert (ours.k.data_ptr(), ours.v.data_ptr()) == ptrs and "eager_fallback" not in cm.stats


def test_the_in_place_result_is_an_alias_of_the_input_for_the_planner() -> None:
    """The executors keep the buffers a graph output may share out of reused memory (plan/aliasing.py):
    the in-place update's result is the caller's cache, and must count as sharing the input's storage."""
    from autofusion.plan.aliasing import alias_roots

    args = _cache_args()
    cm = autofusion.compile(index_copy_step, _clone(args))
    plan = cm.compiled.program.plan
    cache_id = plan.graph.inputs[0].value.id
    roots = alias_roots(plan.steps)
    (step,) = [s for s in plan.steps if getattr(s, "node", None) is not None and s.node.op == "extern"]
    assert step.node.attr("target") in ("aten.index_copy_.default", "aten.index_put_.default")
    assert cache_id in roots[step.node.outputs[0].id]
