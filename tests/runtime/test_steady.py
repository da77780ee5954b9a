"""The steady-state call path (runtime/stamp.py, `steady` in runtime/frozen.py and
runtime/super_executor.py, frontend/torch/live.py's `fetcher`): a call whose parameters are the
previous call's, unchanged, skips the fold check and the parameter slot writes; any change to a
parameter (in place, re-assigned, `.data =`, a module replaced) gives the result eager gives.

Every step is compared with eager; the generated entry's GEMV counter proves the entry ran.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import autofusion
from autofusion.errors import FrontendError
from autofusion.frontend.torch.live import LiveTensor, fetcher
from autofusion.runtime.frozen import FoldedExecutor
from autofusion.runtime.stamp import Stamp
from autofusion.runtime.super_executor import SuperExecutor


class _Decoder(nn.Module):
    """A LLaMA-shaped decode step: separate q/k/v and gate/up projections (the passes merge them, so
    their weights are folded values), RMSNorm, the cache passed in, the new rows returned."""

    def __init__(self, hidden: int = 64, heads: int = 4, layers: int = 2, vocab: int = 40) -> None:
        super().__init__()
        self.heads = heads
        self.embed = nn.Embedding(vocab, hidden)
        self.q = nn.ModuleList(nn.Linear(hidden, hidden, bias=False) for _ in range(layers))
        self.k = nn.ModuleList(nn.Linear(hidden, hidden, bias=False) for _ in range(layers))
        self.v = nn.ModuleList(nn.Linear(hidden, hidden, bias=False) for _ in range(layers))
        self.o = nn.ModuleList(nn.Linear(hidden, hidden, bias=False) for _ in range(layers))
        self.gate = nn.ModuleList(nn.Linear(hidden, 2 * hidden, bias=False) for _ in range(layers))
        self.up = nn.ModuleList(nn.Linear(hidden, 2 * hidden, bias=False) for _ in range(layers))
        self.down = nn.ModuleList(nn.Linear(2 * hidden, hidden, bias=False) for _ in range(layers))
        self.norm = nn.ModuleList(nn.RMSNorm(hidden) for _ in range(2 * layers))

    def forward(self, ids: torch.Tensor, *cache: torch.Tensor) -> tuple[torch.Tensor, ...]:
        x = self.embed(ids)
        b, t, hidden = x.shape
        new: list[torch.Tensor] = []
        for i in range(len(self.q)):
            h = self.norm[2 * i](x)
            q, k, v = (p[i](h).view(b, t, self.heads, -1).transpose(1, 2) for p in (self.q, self.k, self.v))
            keys = torch.cat([cache[2 * i], k], 2)
            values = torch.cat([cache[2 * i + 1], v], 2)
            a = F.scaled_dot_product_attention(q, keys, values)
            x = x + self.o[i](a.transpose(1, 2).reshape(b, t, hidden))
            h = self.norm[2 * i + 1](x)
            x = x + self.down[i](F.silu(self.gate[i](h)) * self.up[i](h))
            new += [keys[:, :, -1:], values[:, :, -1:]]
        return (x, *new)


def _compiled(poison: bool = False) -> tuple[_Decoder, list[torch.Tensor], autofusion.CompiledModel]:  # type: ignore[name-defined]
    torch.manual_seed(0)
    model = _Decoder().eval()  # parameters require grad, as a user's model's do
    cache = [torch.randn(1, 4, 20, 16) for _ in range(4)]
    cm = autofusion.compile(model, [torch.tensor([[3]]), *cache], poison=poison)
    return model, cache, cm


def _check(cm, model: nn.Module, cache: list[torch.Tensor], tok: int) -> tuple[torch.Tensor, ...]:  # type: ignore[no-untyped-def]
    ids = torch.tensor([[tok]])
    got = cm(ids, *cache)
    with torch.no_grad():
        ref = model(ids, *cache)
    for a, b in zip(got, ref, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    return got


def _executors(cm) -> tuple[FoldedExecutor, SuperExecutor]:  # type: ignore[no-untyped-def]
    ex = cm.compiled.program.executor
    assert isinstance(ex, FoldedExecutor) and isinstance(ex.inner, SuperExecutor), type(ex)
    assert ex.inner._fast is not None  # the fast path, steady variant included, is what runs
    return ex, ex.inner


def _gemv_calls(cm) -> int:  # type: ignore[no-untyped-def]
    return int(cm.compiled.program.library.af_gemv_calls())


def test_many_steps_equal_eager_and_kept_results_stay_valid() -> None:
    model, cache, cm = _compiled()
    ex, _ = _executors(cm)
    _check(cm, model, cache, 0)
    folds = ex.fold_runs
    before = _gemv_calls(cm)
    kept = []
    for step in range(40):
        got = _check(cm, model, cache, step % 40)
        kept.append((got, [g.clone() for g in got]))
    for got, copy in kept:  # outputs the caller holds are its own: later calls wrote elsewhere
        for a, b in zip(got, copy, strict=True):
            assert torch.equal(a, b)
    assert ex.fold_runs == folds  # nothing changed: the folded values were reused every call
    assert _gemv_calls(cm) - before >= 40 * 2  # the entry's GEMVs ran on every call


def test_parameter_changes_between_calls_give_new_results() -> None:
    model, cache, cm = _compiled()
    ex, _ = _executors(cm)
    _check(cm, model, cache, 1)
    folds = ex.fold_runs
    with torch.no_grad():
        model.q[0].weight.mul_(1.5)  # in place, a folded (merged) weight: version counter
    _check(cm, model, cache, 1)
    assert ex.fold_runs == folds + 1
    with torch.no_grad():
        model.o[1].weight.add_(0.25)  # in place, a weight the entry reads directly
    _check(cm, model, cache, 2)
    model.k[1].weight = nn.Parameter(torch.randn(64, 64) * 0.1)  # re-assigned: a new tensor
    _check(cm, model, cache, 3)
    model.down[0].weight = nn.Parameter(torch.randn(64, 128) * 0.1)
    _check(cm, model, cache, 3)
    # `.data =` keeps the tensor object and its version counter: only its address changes
    model.up[1].weight.data = torch.randn(128, 64) * 0.1
    _check(cm, model, cache, 4)
    model.o[0].weight.data = torch.randn(64, 64) * 0.1
    _check(cm, model, cache, 4)
    with torch.no_grad():
        model.embed.weight[5] = 3.0  # the embedding, gathered by torch before the entry
    _check(cm, model, cache, 5)
    model.norm[3] = nn.RMSNorm(64)  # a module replaced
    with torch.no_grad():
        model.norm[3].weight.fill_(0.5)
    _check(cm, model, cache, 6)
    model.load_state_dict({k: v * 0.9 for k, v in model.state_dict().items()})  # copied in place
    _check(cm, model, cache, 7)
    for step in range(5):  # and steady again after the changes
        _check(cm, model, cache, 8 + step)


def test_a_plain_run_in_between_does_not_leave_stale_slots() -> None:
    """The executor's plain `run` with other parameters fills the pointer slots; the next steady call
    must fill them again even though its own parameters did not change."""
    model, cache, cm = _compiled()
    ex, _ = _executors(cm)
    _check(cm, model, cache, 2)
    other = _Decoder()
    cg = cm.compiled
    inputs = cg.bind([torch.tensor([[2]]), *cache])
    swapped = [
        dict(other.named_parameters())[v.target] if kind == "live" else x
        for (kind, v), x in zip(cg.captured.sources, inputs, strict=True)
    ]
    ex.run(swapped)  # slots now hold the other model's weights
    _check(cm, model, cache, 2)


def test_poison_mode_steady_calls() -> None:
    model, cache, cm = _compiled(poison=True)
    _, inner = _executors(cm)
    assert inner.poison
    for step in range(6):
        _check(cm, model, cache, step)
    with torch.no_grad():
        model.v[0].weight.mul_(-1.0)
    _check(cm, model, cache, 9)


def test_a_removed_parameter_names_itself() -> None:
    model, cache, cm = _compiled()
    _check(cm, model, cache, 1)
    del model.o[1].weight
    with pytest.raises(FrontendError, match=r"o\.1\.weight"):
        cm(torch.tensor([[1]]), *cache)


def test_fetcher_reads_what_live_tensors_read() -> None:
    model = _Decoder()
    refs = [LiveTensor(model, name, False) for name, _ in model.named_parameters()]
    fetch = fetcher(refs)
    assert all(a is b for a, b in zip(fetch(), [r.get() for r in refs], strict=True))
    model.q[1] = nn.Linear(64, 64, bias=False)
    model.embed.weight = nn.Parameter(torch.zeros(40, 64))
    assert all(a is b for a, b in zip(fetch(), [r.get() for r in refs], strict=True))
    del model.o[0].weight
    model.o[0].weight = torch.ones(64, 64)  # a plain attribute now: the separate lookups find it
    got = fetch()
    assert all(a is b for a, b in zip(got, [r.get() for r in refs], strict=True))


def test_stamp_sees_every_kind_of_change() -> None:
    a, b = nn.Parameter(torch.randn(3)), torch.randn(4)
    stamp = Stamp([0, 2])
    xs = [a, torch.randn(1), b]
    assert not stamp.same(xs)  # nothing taken yet
    stamp.take(xs)
    assert stamp.same(xs)
    assert stamp.same([a, torch.randn(2), b])  # positions outside the stamp are not compared
    with torch.no_grad():
        a.add_(1)
    assert not stamp.same(xs)
    stamp.take(xs)
    a.data = torch.randn(3)  # same object, same version, new memory
    assert not stamp.same(xs)
    stamp.take(xs)
    assert not stamp.same([a, xs[1], b.clone()])  # another tensor
    with torch.inference_mode():
        c = torch.randn(4)
    stamp.take([a, xs[1], c])
    assert not stamp.same([a, xs[1], c])  # no version counter: never the same


class _StaticCacheStep(nn.Module):
    """Projects the token, writes its key and value row into caller-owned caches in place, attends over
    the whole cache (as transformers' StaticCache step does)."""

    def __init__(self, hidden: int = 32, heads: int = 2) -> None:
        super().__init__()
        self.heads = heads
        self.kv = nn.Linear(hidden, 2 * hidden, bias=False)
        self.q = nn.Linear(hidden, hidden, bias=False)
        self.o = nn.Linear(hidden, hidden, bias=False)

    def forward(
        self, x: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, pos: torch.Tensor
    ) -> torch.Tensor:
        b, t, hidden = x.shape
        k, v = self.kv(x).view(b, t, 2, self.heads, -1).permute(2, 0, 3, 1, 4)
        q = self.q(x).view(b, t, self.heads, -1).transpose(1, 2)
        keys[:, :, pos] = k
        values[:, :, pos] = v
        scores = torch.matmul(q, keys.transpose(2, 3)) * 0.25
        a = torch.matmul(torch.softmax(scores, -1), values)
        return self.o(a.transpose(1, 2).reshape(b, t, hidden))


def test_static_cache_written_back_every_step_with_parameter_changes() -> None:
    torch.manual_seed(3)
    step = _StaticCacheStep().eval().requires_grad_(False)
    length = 24
    keys, values = torch.zeros(1, 2, length, 16), torch.zeros(1, 2, length, 16)
    x = torch.randn(1, 1, 32)
    cm = autofusion.compile(step, [x, keys.clone(), values.clone(), torch.tensor([0])])
    ex = cm.compiled.program.executor
    fixed = [p for p, (kind, _) in enumerate(cm.compiled.captured.sources) if kind != "user"]
    assert fixed and ex.steady(fixed) is not None  # the steady path is what the calls below take
    ours, ref = (keys.clone(), values.clone()), (keys.clone(), values.clone())
    for p in range(length):
        if p == 9:
            with torch.no_grad():
                step.kv.weight.mul_(0.5)  # in place, between two steps
        if p == 15:
            step.o.weight = nn.Parameter(torch.randn(32, 32) * 0.2)  # re-assigned
        x = torch.randn(1, 1, 32)
        pos = torch.tensor([p])
        got = cm(x, *ours, pos)
        want = step(x, *ref, pos)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(ours[0], ref[0], rtol=1e-5, atol=1e-5)  # the caches, updated in place
        torch.testing.assert_close(ours[1], ref[1], rtol=1e-5, atol=1e-5)
    assert ex.generated_calls >= length  # the entry ran on every step
