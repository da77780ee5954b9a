"""Hugging Face models as users call them: default configs (use_cache on, so decoders return a cache
object), keyword inputs, both routes (autofusion.compile and torch.compile's backend), and a decode
step with a static KV cache updated in place (no copy of the cache per step).

Random init, 2 layers, hidden 64: the definitions are what is tested, not the weights."""

from __future__ import annotations

import copy
import logging
from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import autofusion
from autofusion.backend import autofusion_backend

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()

VOCAB, SEQ = 128, 16


def gpt2() -> torch.nn.Module:
    return transformers.GPT2LMHeadModel(
        transformers.GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=VOCAB, n_positions=64)
    )


def llama_config(kv_heads: int = 2) -> Any:
    return transformers.LlamaConfig(num_hidden_layers=2, hidden_size=64, intermediate_size=128,
                                    num_attention_heads=4, num_key_value_heads=kv_heads, vocab_size=VOCAB,
                                    max_position_embeddings=64)  # fmt: skip


def llama() -> torch.nn.Module:
    return transformers.LlamaForCausalLM(llama_config())


def bert() -> torch.nn.Module:
    return transformers.BertModel(transformers.BertConfig(
        num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=2, vocab_size=VOCAB,
        max_position_embeddings=64))  # fmt: skip


MODELS = {"gpt2": gpt2, "llama": llama, "bert": bert}


def same(got: Any, ref: Any, path: str = "output") -> None:
    """Equal structure (the same classes all the way down) and equal tensors."""
    assert type(got) is type(ref), f"{path}: {type(got).__name__} != eager {type(ref).__name__}"
    if isinstance(ref, torch.Tensor):
        torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-5, msg=lambda m: f"{path}: {m}")
    elif isinstance(ref, dict):  # ModelOutput is an OrderedDict
        assert list(got.keys()) == list(ref.keys()), f"{path}: keys {list(got)} != {list(ref)}"
        for k in ref:
            same(got[k], ref[k], f"{path}.{k}")
    elif isinstance(ref, (list, tuple)):
        assert len(got) == len(ref), path
        for i, (g, r) in enumerate(zip(got, ref, strict=True)):
            same(g, r, f"{path}[{i}]")
    elif hasattr(ref, "__dict__") and not isinstance(ref, (torch.dtype, torch.device)):
        assert vars(got).keys() == vars(ref).keys(), path
        for k in vars(ref):
            same(vars(got)[k], vars(ref)[k], f"{path}.{k}")
    else:
        assert got == ref, f"{path}: {got!r} != eager {ref!r}"


@pytest.fixture(scope="module", params=sorted(MODELS))
def model(request: pytest.FixtureRequest) -> torch.nn.Module:
    torch.manual_seed(0)
    return MODELS[request.param]().eval()


def _inputs() -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(1)
    return torch.randint(0, VOCAB, (1, SEQ)), torch.ones(1, SEQ, dtype=torch.long)


def test_positional_call_returns_what_eager_returns(model, generated_code_ran, caplog) -> None:
    ids, _ = _inputs()
    with torch.no_grad(), caplog.at_level(logging.WARNING, logger="autofusion"):
        ref = model(ids)
        cm = autofusion.compile(model, [ids])
        got = cm(ids)
    same(got, ref)
    if not isinstance(model, transformers.BertModel):  # a decoder's default result holds its cache
        assert [type(v).__name__ for v in got.values() if "Cache" in type(v).__name__] == ["DynamicCache"]
    generated_code_ran(cm.stats, type(model).__name__, expect_kernel=True)
    assert "eagerly" not in caplog.text


def test_keyword_call(model, generated_code_ran) -> None:
    ids, mask = _inputs()
    with torch.no_grad():
        ref = model(input_ids=ids, attention_mask=mask)
        cm = autofusion.compile(model, kwargs={"input_ids": ids, "attention_mask": mask})
        got = cm(input_ids=ids, attention_mask=mask)
        same(got, ref)
        generated_code_ran(cm.stats, type(model).__name__, expect_kernel=True)
        # args and kwargs together, and a flag that is a constant of the call (compiled per value)
        ref = model(ids, attention_mask=mask, use_cache=False)
        got = cm(ids, attention_mask=mask, use_cache=False)
    same(got, ref)
    assert cm.stats["signatures"] == 2
    generated_code_ran(cm.stats, type(model).__name__, expect_kernel=True)


def test_torch_compile_backend(model) -> None:
    ids, mask = _inputs()
    graphs: list[Any] = []

    def recording_backend(gm, example_inputs):
        compiled = autofusion_backend(gm, example_inputs)
        graphs.append(compiled)
        return compiled

    torch._dynamo.reset()
    with torch.no_grad():
        ref = model(input_ids=ids, attention_mask=mask)
        got = torch.compile(model, backend=recording_backend)(input_ids=ids, attention_mask=mask)
    same(got, ref)
    assert graphs and all(g.autofusion_graph is not None for g in graphs), [
        g.autofusion_stats() for g in graphs
    ]
    assert sum(g.autofusion_graph.generated_calls for g in graphs) >= 1


# ---- a decode step with a static KV cache ----


class Allocations(TorchDispatchMode):
    """Every torch op of a call that returns a tensor of at least `numel` elements (a cache-sized one)."""

    def __init__(self, numel: int) -> None:
        super().__init__()
        self.numel = numel
        self.ops: list[tuple[str, int]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in torch.utils._pytree.tree_leaves(out):
            # (a oneDNN-packed weight, made on the first call where prepacking measured faster, is an
            # opaque tensor with no storage: not an allocation of ours to count)
            if isinstance(t, torch.Tensor) and t.layout == torch.strided and t.numel() >= self.numel:
                self.ops.append((str(func), t.data_ptr()))
        return out


def _prefilled(model: torch.nn.Module) -> Any:
    cache = transformers.StaticCache(config=model.config, max_cache_len=32)
    with torch.no_grad():
        model(input_ids=torch.arange(8).view(1, 8), cache=cache)
    return cache


def test_static_cache_decode_updates_the_cache_in_place() -> None:
    torch.manual_seed(0)
    # As many KV heads as query heads: the model's own attention then reads the cache without copying it
    # (grouped heads are repeated by a copy, in eager as well).
    model = transformers.LlamaForCausalLM(llama_config(kv_heads=4)).eval()
    ref_cache, cache = _prefilled(model), _prefilled(model)
    tok = torch.tensor([[5]])
    with torch.no_grad():
        cm = autofusion.compile(model, kwargs={"input_ids": tok, "cache": copy.deepcopy(cache)})
        mutations = cm.compiled.captured.mutations
        # keys and values of both layers in place; the position counters (one int each) by a copy
        assert sum(m.inplace for m in mutations) == 4 and len(mutations) == 6, mutations
        keys = [layer.keys for layer in cache.layers]
        pointers = [
            (k.data_ptr(), layer.values.data_ptr()) for k, layer in zip(keys, cache.layers, strict=True)
        ]
        lib = cm.compiled.program.library
        scatters = lib.af_scatter_calls()
        for step in range(3):
            ref = model(input_ids=tok, cache=ref_cache)
            with Allocations(keys[0].numel()) as seen:
                got = cm(input_ids=tok, cache=cache)
            assert got.cache is cache  # the caller's own cache object, as eager returns it
            torch.testing.assert_close(got.logits, ref.logits, rtol=1e-4, atol=1e-5)
            for a, b in zip(cache.layers, ref_cache.layers, strict=True):
                torch.testing.assert_close(a.keys, b.keys)
                torch.testing.assert_close(a.values, b.values)
                assert int(a.cumulative_length) == int(b.cumulative_length)
            # 0 copies of the cache: no torch op makes a cache-sized result at all (on the first call,
            # freezing concatenates the Q/K/V weights, once: not the cache); the SuperKernel entry
            # writes the new rows itself, four per step (keys and values of two layers)
            if step == 0:
                seen.ops = [(op, ptr) for op, ptr in seen.ops if op != "aten.cat.default"]
            assert seen.ops == [], seen.ops
            assert lib.af_scatter_calls() - scatters == 4 * (step + 1)
            tok = ref.logits[:, -1:].argmax(-1)
        assert [(layer.keys.data_ptr(), layer.values.data_ptr()) for layer in cache.layers] == pointers
    assert "eager_fallback" not in cm.stats


def test_static_cache_decode_through_torch_compile() -> None:
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(llama_config(kv_heads=4)).eval()
    ref_cache, cache = _prefilled(model), _prefilled(model)
    graphs: list[Any] = []

    def recording_backend(gm, example_inputs):
        compiled = autofusion_backend(gm, example_inputs)
        graphs.append(compiled)
        return compiled

    torch._dynamo.reset()
    step = torch.compile(model, backend=recording_backend)
    tok = torch.tensor([[5]])
    with torch.no_grad():
        for _ in range(3):
            ref, got = model(input_ids=tok, cache=ref_cache), step(input_ids=tok, cache=cache)
            torch.testing.assert_close(got.logits, ref.logits, rtol=1e-4, atol=1e-5)
            for a, b in zip(cache.layers, ref_cache.layers, strict=True):
                torch.testing.assert_close(a.keys, b.keys)
                torch.testing.assert_close(a.values, b.values)
            tok = ref.logits[:, -1:].argmax(-1)
    assert len(graphs) == 1 and graphs[0].autofusion_graph is not None, [g.autofusion_stats() for g in graphs]
    # the Dynamo graph takes the cache tensors as inputs: keys and values updated in place
    assert sum(m.inplace for m in graphs[0].autofusion_graph.captured.mutations) == 4
