"""Built-in models build, run eagerly, are deterministic per seed, and honour dtype and size overrides."""

from __future__ import annotations

import pytest
import torch

from autofusion.tools.models import BUILTIN_NAMES, builtin, describe

EXPECTED = {"mlp", "transformer-block", "resnet-block", "elementwise-chain", "softmax", "layernorm"}


def _state(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def test_names() -> None:
    assert set(BUILTIN_NAMES) == EXPECTED


@pytest.mark.parametrize("name", BUILTIN_NAMES)
def test_builds_and_runs_eagerly(name: str) -> None:
    module, inputs = builtin(name)
    assert not module.training
    assert inputs and all(t.dtype == torch.float32 for t in inputs)
    with torch.no_grad():
        out = module(*inputs)
    assert isinstance(out, torch.Tensor)
    assert out.dtype == torch.float32
    assert torch.isfinite(out).all()
    assert out.abs().max() > 0


@pytest.mark.parametrize("name", BUILTIN_NAMES)
def test_deterministic_per_seed(name: str) -> None:
    m1, x1 = builtin(name, seed=3)
    m2, x2 = builtin(name, seed=3)
    s1, s2 = _state(m1), _state(m2)
    assert s1.keys() == s2.keys()
    for key in s1:
        assert torch.equal(s1[key], s2[key]), key
    for a, b in zip(x1, x2, strict=True):
        assert torch.equal(a, b)
    with torch.no_grad():
        assert torch.equal(m1(*x1), m2(*x2))


@pytest.mark.parametrize("name", BUILTIN_NAMES)
def test_seed_changes_inputs(name: str) -> None:
    _, x0 = builtin(name, seed=0)
    _, x1 = builtin(name, seed=1)
    assert not torch.equal(x0[0], x1[0])


def test_global_rng_untouched() -> None:
    torch.manual_seed(123)
    expected = torch.rand(4)
    torch.manual_seed(123)
    builtin("transformer-block")
    assert torch.equal(torch.rand(4), expected)


def test_normalisation_layers_are_not_identity() -> None:
    module, _ = builtin("resnet-block")
    for bn in (module.bn1, module.bn2):
        assert not torch.allclose(bn.running_mean, torch.zeros_like(bn.running_mean))
        assert not torch.allclose(bn.running_var, torch.ones_like(bn.running_var))
        assert not torch.allclose(bn.weight, torch.ones_like(bn.weight))
    ln, _ = builtin("layernorm")
    assert not torch.allclose(ln.weight, torch.ones_like(ln.weight))
    assert not torch.allclose(ln.bias, torch.zeros_like(ln.bias))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("name", BUILTIN_NAMES)
def test_half_dtypes(name: str, dtype: torch.dtype) -> None:
    module, inputs = builtin(name, dtype=dtype)
    assert all(p.dtype == dtype for p in module.parameters())
    assert all(t.dtype == dtype for t in inputs)
    with torch.no_grad():
        out = module(*inputs)
    assert out.dtype == dtype
    assert torch.isfinite(out).all()


def test_unknown_name_suggests_close_matches() -> None:
    with pytest.raises(ValueError, match="transformer-block") as info:
        builtin("transfomer-blok")
    assert "Did you mean" in str(info.value)
    with pytest.raises(ValueError, match="Available: mlp"):
        builtin("no-such-model")


def test_bad_dtype_rejected() -> None:
    with pytest.raises(ValueError, match="floating"):
        builtin("mlp", dtype=torch.int32)


def test_batch_and_seq_overrides() -> None:
    module, (x,) = builtin("transformer-block", batch=3, seq=7)
    assert x.shape == (3, 7, 128)
    with torch.no_grad():
        assert module(x).shape == (3, 7, 128)
    _, (a, b) = builtin("elementwise-chain", batch=8)
    assert a.shape == b.shape == (8, 1024)
    with pytest.raises(ValueError, match="sequence"):
        builtin("mlp", seq=4)


def test_transformer_attention_is_causal() -> None:
    module, (x,) = builtin("transformer-block")
    changed = x.clone()
    changed[:, -1] += 1.0
    with torch.no_grad():
        a, b = module(x), module(changed)
    torch.testing.assert_close(a[:, :-1], b[:, :-1], rtol=0.0, atol=1e-6)
    assert (a[:, -1] - b[:, -1]).abs().max() > 1e-3


@pytest.mark.parametrize("name", BUILTIN_NAMES)
def test_describe(name: str) -> None:
    text = describe(name)
    assert text.startswith(name + ":")
    assert "inputs [" in text
