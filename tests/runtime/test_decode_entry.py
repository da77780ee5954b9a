"""A decode step inside SuperKernel entries: one-row linears as a GEMV (codegen/cpp/gemv.py), attention
as af_sdpa (codegen/cpp/attention.py), and super_kernel='auto' choosing that route for a decode step.

Each test proves the generated helpers ran through their call counters (`af_gemv_calls`,
`af_sdpa_calls` in the built library), not the BLAS or torch, and compares with eager in float32.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import autofusion
from autofusion.errors import ExecutionError
from autofusion.runtime.super_executor import SuperExecutor

RULES_OFF = {"builtin_rules": False}


def _library(cm: autofusion.CompiledModel):  # type: ignore[name-defined]
    program = cm.compiled.program
    assert program is not None and program.library is not None
    return program.library


class _Linears(nn.Module):
    def __init__(self, k: int, n: int, bias: bool) -> None:
        super().__init__()
        self.a = nn.Linear(k, n, bias=bias)
        self.b = nn.Linear(n, k, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.relu(self.a(x * 2.0))) + 1.0


@pytest.mark.parametrize("k, n", [(1, 1), (3, 5), (16, 4), (17, 33), (515, 130), (64, 1027)])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("lead", [(1,), (1, 1)])
def test_one_row_linears_run_as_gemv(k: int, n: int, bias: bool, lead: tuple[int, ...]) -> None:
    torch.manual_seed(k * 7 + n)
    model = _Linears(k, n, bias).eval().requires_grad_(False)
    x = torch.randn(*lead, k)
    cm = autofusion.compile(model, [x], super_kernel="on", **RULES_OFF)
    lib = _library(cm)
    before = lib.af_gemv_calls()
    for _ in range(2):
        x = torch.randn(*lead, k)
        torch.testing.assert_close(cm(x), model(x), rtol=1e-5, atol=1e-5)
    assert lib.af_gemv_calls() - before == 4  # two linears per call, both inside the entry
    assert cm.stats["super_kernel"]["library_calls_inside"] == 2


def test_gemv_special_values() -> None:
    model = _Linears(40, 24, True).eval().requires_grad_(False)
    x = torch.randn(1, 40)
    cm = autofusion.compile(model, [x], super_kernel="on", **RULES_OFF)
    before = _library(cm).af_gemv_calls()
    for bad in (math.inf, -math.inf, math.nan):
        y = x.clone()
        y[0, 3] = bad
        torch.testing.assert_close(cm(y), model(y), equal_nan=True)
    assert _library(cm).af_gemv_calls() - before == 6


def test_two_rows_stay_on_the_blas() -> None:
    model = _Linears(33, 20, True).eval().requires_grad_(False)
    x = torch.randn(2, 33)
    # (GEMM + epilogue kernels off: the linears are then library calls inside the entry, on sgemm;
    # freezing off: a prepacked weight that measures faster on this machine keeps its linear outside)
    cm = autofusion.compile(
        model, [x], super_kernel="on", disabled=["gemm_epilogue"], freeze=False, **RULES_OFF
    )
    assert cm.stats["super_kernel"]["library_calls_inside"] == 2
    before = _library(cm).af_gemv_calls()
    torch.testing.assert_close(cm(x), model(x))
    assert _library(cm).af_gemv_calls() == before


class _Attention(nn.Module):
    def __init__(self, is_causal: bool = False, scale: float | None = None) -> None:
        super().__init__()
        self.is_causal, self.scale = is_causal, scale

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *mask: torch.Tensor) -> torch.Tensor:
        out = F.scaled_dot_product_attention(
            q * 1.5, k + 0.25, v, attn_mask=mask[0] if mask else None, is_causal=self.is_causal,
            scale=self.scale,
        )  # fmt: skip
        return out * 2.0


CASES = [
    # q shape, S, Ev, mask shape (None: no mask), mask dtype, causal, scale
    ((1, 8, 1, 64), 129, 64, (1, 1, 1, 129), torch.float32, False, None),
    ((2, 3, 4, 5), 7, 6, None, None, False, None),
    ((2, 3, 4, 5), 7, 6, (2, 1, 4, 7), torch.float32, False, 0.3),
    ((2, 3, 4, 5), 7, 6, (4, 7), torch.bool, False, None),
    ((1, 2, 3, 8), 5, 8, None, None, True, None),
    ((1, 2, 6, 8), 4, 3, None, None, True, None),  # more queries than keys
    ((3, 1, 9), 11, 2, (1, 11), torch.float32, False, None),  # rank 3
]


@pytest.mark.parametrize("case", CASES, ids=[str(i) for i in range(len(CASES))])
def test_attention_runs_inside_the_entry(case) -> None:
    qs, s, ev, ms, mdt, causal, scale = case
    g = torch.Generator().manual_seed(len(qs) + s)
    q = torch.randn(*qs, generator=g)
    k = torch.randn(*qs[:-2], s, qs[-1], generator=g)
    v = torch.randn(*qs[:-2], s, ev, generator=g)
    inputs = [q, k, v]
    if ms is not None:
        inputs.append(
            torch.rand(*ms, generator=g) > 0.3 if mdt is torch.bool else torch.randn(*ms, generator=g)
        )
    model = _Attention(causal, scale)
    cm = autofusion.compile(model, inputs, super_kernel="on", **RULES_OFF)
    before = _library(cm).af_sdpa_calls()  # a library is shared by plans of one loop structure
    torch.testing.assert_close(cm(*inputs), model(*inputs), rtol=1e-5, atol=1e-5)
    assert _library(cm).af_sdpa_calls() - before == 1
    assert not cm.stats["super_kernel"]["splits"], cm.stats["super_kernel"]["splits"]


def test_attention_rows_with_every_key_masked() -> None:
    q, k, v = torch.randn(1, 2, 3, 4), torch.randn(1, 2, 5, 4), torch.randn(1, 2, 5, 4)
    fmask = torch.zeros(1, 1, 3, 5)
    fmask[..., 1, :] = -math.inf
    bmask = torch.ones(1, 1, 3, 5, dtype=torch.bool)
    bmask[..., 2, :] = False
    model = _Attention()
    for mask in (fmask, bmask):
        cm = autofusion.compile(model, [q, k, v, mask], super_kernel="on", **RULES_OFF)
        before = _library(cm).af_sdpa_calls()
        torch.testing.assert_close(cm(q, k, v, mask), model(q, k, v, mask))
        assert _library(cm).af_sdpa_calls() - before == 1


def test_attention_nan_propagates() -> None:
    q, k, v = torch.randn(1, 2, 3, 4), torch.randn(1, 2, 5, 4), torch.randn(1, 2, 5, 4)
    model = _Attention()
    cm = autofusion.compile(model, [q, k, v], super_kernel="on", **RULES_OFF)
    k[0, 1, 2, 0] = math.nan
    torch.testing.assert_close(cm(q, k, v), model(q, k, v), equal_nan=True)


def test_half_attention_splits_with_its_reason() -> None:
    q, k, v = (torch.randn(1, 2, 3, 4, dtype=torch.float16) for _ in range(3))
    model = _Attention()
    cm = autofusion.compile(model, [q, k, v], super_kernel="on", **RULES_OFF)
    torch.testing.assert_close(cm(q, k, v), model(q, k, v))
    assert any("float32 only" in s for s in cm.stats["super_kernel"]["splits"])


class _TinyDecoder(nn.Module):
    """One new token against a cache passed as inputs (the shape of benchmarks/zoo.py's llama_decode)."""

    def __init__(self, hidden: int = 64, heads: int = 4, layers: int = 2, vocab: int = 50) -> None:
        super().__init__()
        self.heads = heads
        self.embed = nn.Embedding(vocab, hidden)
        self.qkv = nn.ModuleList(nn.Linear(hidden, 3 * hidden, bias=False) for _ in range(layers))
        self.o = nn.ModuleList(nn.Linear(hidden, hidden, bias=False) for _ in range(layers))
        self.up = nn.ModuleList(nn.Linear(hidden, 4 * hidden, bias=False) for _ in range(layers))
        self.down = nn.ModuleList(nn.Linear(2 * hidden, hidden, bias=False) for _ in range(layers))
        self.norm = nn.ModuleList(nn.RMSNorm(hidden) for _ in range(2 * layers))

    def forward(self, ids: torch.Tensor, *cache: torch.Tensor) -> tuple[torch.Tensor, ...]:
        x = self.embed(ids)  # [1, 1, hidden]
        b, t, hidden = x.shape
        new: list[torch.Tensor] = []
        for i in range(len(self.qkv)):
            h = self.norm[2 * i](x)
            q, k, v = self.qkv[i](h).view(b, t, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
            keys = torch.cat([cache[2 * i], k], 2)
            values = torch.cat([cache[2 * i + 1], v], 2)
            a = F.scaled_dot_product_attention(q, keys, values)
            x = x + self.o[i](a.transpose(1, 2).reshape(b, t, hidden))
            gate, up = self.up[i](self.norm[2 * i + 1](x)).chunk(2, -1)
            x = x + self.down[i](F.silu(gate) * up)
            new += [k, v]
        return (x, *new)


def test_decode_step_runs_as_one_entry_by_default() -> None:
    torch.manual_seed(0)
    model = _TinyDecoder().eval().requires_grad_(False)
    past = 33
    cache = [torch.randn(1, 4, past, 16) for _ in range(4)]
    ids = torch.tensor([[7]])
    cm = autofusion.compile(model, [ids, *cache])  # super_kernel='auto'
    st = cm.stats["super_kernel"]
    assert st["on"] and "one-row linears" in st["why"], st
    lib = _library(cm)
    gemv, sdpa = lib.af_gemv_calls(), lib.af_sdpa_calls()
    kept = []
    for step in range(3):
        ids = torch.tensor([[3 + step]])
        got, ref = cm(ids, *cache), model(ids, *cache)
        for a, b in zip(got, ref, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
        kept.append((got, [r.clone() for r in ref]))
    for got, ref in kept:  # results kept across calls are the caller's: later calls did not change them
        for a, b in zip(got, ref, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    assert lib.af_gemv_calls() - gemv == 3 * 8  # 4 linears per layer, 2 layers, 3 calls
    assert lib.af_sdpa_calls() - sdpa == 3 * 2


class _HiddenOnly(_TinyDecoder):
    """The decoder's hidden state alone: no output is a view torch makes after the entry."""

    def forward(self, ids: torch.Tensor, *cache: torch.Tensor) -> tuple[torch.Tensor, ...]:  # type: ignore[override]
        return super().forward(ids, *cache)[:1]


def test_decode_step_takes_the_executor_fast_path() -> None:
    """The embedding gather runs through torch before the entry; the executor's fast path runs it
    too (no interpreter loop over the program), with the same results as that loop and as eager,
    a fresh gather per call, and an out-of-range token id raising with the node named."""
    torch.manual_seed(2)
    model = _HiddenOnly().eval().requires_grad_(False)
    cache = [torch.randn(1, 4, 9, 16) for _ in range(4)]
    cm = autofusion.compile(model, [torch.tensor([[1]]), *cache])
    ex = cm.compiled.program.executor
    assert isinstance(ex, SuperExecutor)
    kinds = [kind for kind, _, _ in ex._program]
    assert kinds[-1] == "super" and len(kinds) > 1, kinds  # torch steps (the gather) before the entry
    assert ex._fast is not None  # the fast path was built for this program
    lib = _library(cm)
    before = lib.af_gemv_calls()
    for tok in (3, 49, 0):
        ids = torch.tensor([[tok]])
        got, ref = cm(ids, *cache), model(ids, *cache)
        for a, b in zip(got, ref, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
        slow = ex._run(cm.compiled.program.plan_inputs(cm.compiled.bind([ids, *cache])), False)
        for a, b in zip(got, slow, strict=True):
            assert torch.equal(a, b)
    assert lib.af_gemv_calls() - before == 6 * 8  # three calls on the fast path, three on the loop
    with pytest.raises(ExecutionError, match="index_select"):
        cm(torch.tensor([[50]]), *cache)


class _StaticCacheStep(nn.Module):
    """Writes the new key/value row into caller-owned caches in place (`index_put_`), then attends
    with matmuls over the whole cache, as transformers' eager attention on a StaticCache does."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, keys: torch.Tensor,
                values: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:  # fmt: skip
        keys[:, :, pos] = k  # aten.index_put_ with indices (None, None, pos)
        values[:, :, pos] = v
        scores = torch.matmul(q * 0.5, keys.transpose(2, 3))
        return torch.matmul(torch.softmax(scores, -1), values) + 1.0


def _static_step(dtype: torch.dtype = torch.float32, length: int = 12):
    torch.manual_seed(1)
    heads, dim = 2, 8
    step = _StaticCacheStep()
    args = [torch.randn(1, heads, 1, dim, dtype=dtype) for _ in range(3)]
    keys, values = (torch.randn(1, heads, length, dim, dtype=dtype) for _ in range(2))
    cm = autofusion.compile(step, [*args, keys.clone(), values.clone(), torch.tensor([3])], super_kernel="on",
                            **RULES_OFF)  # fmt: skip
    return step, cm, keys, values


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_in_place_cache_update_runs_inside_the_entry(dtype: torch.dtype) -> None:
    step, cm, keys, values = _static_step(dtype)
    heads, dim = keys.shape[1], keys.shape[3]
    splits = cm.stats["super_kernel"]["splits"]
    # the row writes run inside the entry (af_scatter); the matmuls read the updated cache, whose
    # layout is known, so at float32 everything is one entry
    assert not any("index_put" in s or "only known at run time" in s for s in splits), splits
    if dtype == torch.float32:
        assert splits == [] and cm.stats["super_kernel"]["calls_per_run"] == 1
    lib = _library(cm)
    ours = (keys.clone(), values.clone())
    versions = [t._version for t in ours]
    before = lib.af_scatter_calls()
    tol = {"rtol": 1e-3, "atol": 1e-3} if dtype == torch.float16 else {}
    for p in (5, 0, 11, -1, -12):  # negative positions count from the end, as torch's
        pos = torch.tensor([p])
        args = [torch.randn(1, heads, 1, dim, dtype=dtype) for _ in range(3)]
        got = cm(*args, *ours, pos)
        ref = step(*args, keys, values, pos)
        torch.testing.assert_close(got, ref, **tol)
        assert torch.equal(ours[0], keys) and torch.equal(ours[1], values)  # updated in place, as eager
    assert lib.af_scatter_calls() - before == 2 * 5
    # each write bumps the tensor's version, as torch's in-place op does
    assert [t._version - v for t, v in zip(ours, versions, strict=True)] == [5, 5]


def test_rows_above_the_parallel_threshold_keep_every_bit() -> None:
    """Two rows of 8 heads x 16384 floats (1 MiB, SCATTER_PAR_MIN): the entry opens its parallel region
    and the threads share the rows; inf, -inf, nan, -0.0 and subnormals are copied bit for bit."""
    from autofusion.codegen.cpp.scatter import SCATTER_PAR_MIN

    torch.manual_seed(4)
    heads, length, dim = 8, 6, 16384
    assert heads * 2 * dim * 4 >= SCATTER_PAR_MIN

    def write(keys: torch.Tensor, k: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        keys[:, :, pos] = k
        return keys.sum(-1) + 1.0

    k = torch.randn(1, heads, 2, dim)
    k.view(-1)[:5] = torch.tensor([float("inf"), float("-inf"), float("nan"), -0.0, 1e-42])
    keys = torch.randn(1, heads, length, dim)
    pos = torch.tensor([1, 4])
    cm = autofusion.compile(write, [keys.clone(), k, pos], super_kernel="on", **RULES_OFF)
    ours, ref = keys.clone(), keys.clone()
    before = _library(cm).af_scatter_calls()
    for p in ([1, 4], [5, -6]):
        pos = torch.tensor(p)
        # the sums over 16384 elements round in another order (float32 level)
        torch.testing.assert_close(cm(ours, k, pos), write(ref, k, pos), rtol=1e-5, atol=1e-4, equal_nan=True)
        assert torch.equal(ours.view(torch.int32), ref.view(torch.int32))
    assert _library(cm).af_scatter_calls() - before == 2


def test_an_int32_position_is_read_as_such() -> None:
    torch.manual_seed(3)
    step = _StaticCacheStep()
    args = [torch.randn(1, 2, 1, 8) for _ in range(3)]
    keys, values = torch.randn(1, 2, 12, 8), torch.randn(1, 2, 12, 8)
    pos = torch.tensor([3], dtype=torch.int32)
    cm = autofusion.compile(step, [*args, keys.clone(), values.clone(), pos], super_kernel="on", **RULES_OFF)
    ours = (keys.clone(), values.clone())
    before = _library(cm).af_scatter_calls()
    for p in (7, -2):
        pos = torch.tensor([p], dtype=torch.int32)
        torch.testing.assert_close(cm(*args, *ours, pos), step(*args, keys, values, pos))
        assert torch.equal(ours[0], keys) and torch.equal(ours[1], values)
    assert _library(cm).af_scatter_calls() - before == 4


def test_an_index_out_of_range_raises_and_writes_nothing() -> None:
    _, cm, keys, values = _static_step()
    ours = (keys.clone(), values.clone())
    args = [torch.randn(1, 2, 1, 8) for _ in range(3)]
    for bad in (12, -13, 1 << 40):
        with pytest.raises(ExecutionError, match="out of range"):
            cm(*args, *ours, torch.tensor([bad]))
        assert torch.equal(ours[0], keys) and torch.equal(ours[1], values)
    cm(*args, *ours, torch.tensor([2]))  # the flag was reset: the next call runs
    assert not torch.equal(ours[0], keys)


def test_a_cache_without_its_compiled_layout_is_written_by_torch() -> None:
    """A transposed key cache (not contiguous): the entry cannot write it as rows, so torch does
    (before the entry: it reads only graph inputs, so it splits nothing); the value cache is still
    written by the entry, and the result and the caller's tensors are eager's."""
    torch.manual_seed(2)
    step = _StaticCacheStep()
    args = [torch.randn(1, 2, 1, 8) for _ in range(3)]
    keys = torch.randn(1, 2, 8, 12).transpose(2, 3)
    values = torch.randn(1, 2, 12, 8)
    cm = autofusion.compile(step, [*args, keys.clone(), values.clone(), torch.tensor([3])],
                            super_kernel="on", **RULES_OFF)  # fmt: skip
    ours = (keys.clone(), values.clone())
    before = _library(cm).af_scatter_calls()
    got = cm(*args, *ours, torch.tensor([4]))
    assert _library(cm).af_scatter_calls() - before == 1
    torch.testing.assert_close(got, step(*args, keys, values, torch.tensor([4])))
    assert torch.equal(ours[0], keys) and torch.equal(ours[1], values)


def test_transformers_static_cache_decode_runs_as_one_entry() -> None:
    """transformers' LlamaModel on its StaticCache, one token a call: the cache rows are written by the
    entry (no split), and outputs and caches stay eager's step after step."""
    hf = pytest.importorskip("transformers")
    hf.logging.set_verbosity_error()
    torch.manual_seed(0)
    cfg = hf.LlamaConfig(num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                         num_key_value_heads=4, vocab_size=100, max_position_embeddings=32)  # fmt: skip
    model = hf.LlamaModel(cfg).eval().requires_grad_(False)

    def prefilled() -> object:
        cache = hf.StaticCache(config=cfg, max_cache_len=16)
        model(input_ids=torch.arange(5).view(1, -1), cache=cache)
        return cache

    tok = torch.tensor([[7]])
    with torch.no_grad():
        cm = autofusion.compile(model, kwargs={"input_ids": tok, "cache": prefilled()})
        assert cm.stats["super_kernel"]["splits"] == [], cm.stats["super_kernel"]["splits"]
        assert cm.stats["super_kernel"]["calls_per_run"] <= 3  # the embedding gather, then one entry
        lib = _library(cm)
        before = lib.af_scatter_calls()
        ref_cache, our_cache = prefilled(), prefilled()
        for t in range(6):
            ids = torch.tensor([[t + 3]])
            ref = model(input_ids=ids, cache=ref_cache).last_hidden_state
            got = cm(input_ids=ids, cache=our_cache).last_hidden_state
            torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
            for a, b in zip(ref_cache.layers, our_cache.layers, strict=True):
                torch.testing.assert_close(b.keys, a.keys, rtol=1e-5, atol=1e-5)
                torch.testing.assert_close(b.values, a.values, rtol=1e-5, atol=1e-5)
                assert int(b.cumulative_length) == int(a.cumulative_length)
        assert lib.af_scatter_calls() - before == 6 * 2 * 2  # keys and values, two layers, six steps
