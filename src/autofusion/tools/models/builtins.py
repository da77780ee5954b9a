"""Built-in demo models: a name in, an eval-mode ``nn.Module`` and its example inputs out.

``builtin(name)`` is what ``autofusion demo``, ``optimize builtin:NAME``, the benchmarks and the tests use.
Invariants:
- The same ``(name, dtype, batch, seq, seed)`` gives bit-identical weights, buffers and inputs. Weights are
  drawn from a local ``torch.Generator``; the global RNG is left exactly as it was.
- Modules are in eval mode; normalisation layers have non-trivial affine parameters and running stats,
  so no layer is an identity that a compiler could silently get away with dropping.
- ``batch`` overrides the leading dimension of every input; ``seq`` exists only for sequence models.
- Every model runs eagerly in a few milliseconds on two CPU cores at its default size.
"""

from __future__ import annotations

import difflib
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from autofusion.tools.models.names import BUILTIN_NAMES

logger = logging.getLogger(__name__)

_FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


# --------------------------------------------------------------------------------------------------
# Model definitions
# --------------------------------------------------------------------------------------------------


class MLP(nn.Module):
    """Linear -> GELU -> Linear -> ReLU -> Linear."""

    def __init__(self, d_in: int = 256, d_hidden: int = 512, d_out: int = 256) -> None:
        super().__init__()
        self.fc1 = nn.Linear(d_in, d_hidden)
        self.act1 = nn.GELU()
        self.fc2 = nn.Linear(d_hidden, d_hidden)
        self.act2 = nn.ReLU()
        self.fc3 = nn.Linear(d_hidden, d_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc3(self.act2(self.fc2(self.act1(self.fc1(x)))))


class TransformerBlock(nn.Module):
    """A GPT-2 style pre-norm block with causal self-attention, written out op by op."""

    mask: torch.Tensor  # [max_seq, max_seq] lower-triangular ones, a registered buffer

    def __init__(self, d_model: int = 128, n_heads: int = 4, max_seq: int = 16) -> None:
        super().__init__()
        if d_model % n_heads != 0:
            raise ValueError(f"d_model={d_model} is not divisible by n_heads={n_heads}")
        self.n_heads = n_heads
        self.head_dim = d_model // n_heads
        self.ln1 = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.ln2 = nn.LayerNorm(d_model)
        self.fc1 = nn.Linear(d_model, 4 * d_model)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(4 * d_model, d_model)
        self.register_buffer("mask", torch.tril(torch.ones(max_seq, max_seq)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q = q.view(b, t, self.n_heads, self.head_dim).transpose(1, 2)
        k = k.view(b, t, self.n_heads, self.head_dim).transpose(1, 2)
        v = v.view(b, t, self.n_heads, self.head_dim).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(self.head_dim))
        att = att.masked_fill(self.mask[:t, :t] == 0, float("-inf"))
        att = torch.softmax(att, dim=-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, c)
        x = x + self.proj(y)
        x = x + self.fc2(self.act(self.fc1(self.ln2(x))))
        return x


class ResNetBlock(nn.Module):
    """conv3x3 -> BN -> ReLU -> conv3x3 -> BN, plus the identity, then ReLU."""

    def __init__(self, channels: int = 16) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.relu = nn.ReLU()
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + x)


class ElementwiseChain(nn.Module):
    """Six elementwise ops on two same-shaped inputs: mul, add, sigmoid, mul, sub, tanh."""

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.tanh(torch.sigmoid(x * 1.5 + y) * x - 0.25)


class Softmax(nn.Module):
    """``torch.softmax`` over the last dimension."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x, dim=-1)


# --------------------------------------------------------------------------------------------------
# Deterministic initialisation
# --------------------------------------------------------------------------------------------------


def _uniform(shape: torch.Size, bound: float, gen: torch.Generator) -> torch.Tensor:
    return (torch.rand(shape, generator=gen) * 2.0 - 1.0) * bound


def _init_from(module: nn.Module, gen: torch.Generator) -> None:
    """Overwrite every parameter and running stat from ``gen``, in module registration order."""
    with torch.no_grad():
        for sub in module.modules():
            if isinstance(sub, (nn.Linear, nn.Conv2d)):
                bound = 1.0 / math.sqrt(sub.weight[0].numel())
                sub.weight.copy_(_uniform(sub.weight.shape, bound, gen))
                if sub.bias is not None:
                    sub.bias.copy_(_uniform(sub.bias.shape, bound, gen))
            elif isinstance(sub, (nn.LayerNorm, nn.BatchNorm2d)):
                if sub.weight is not None:
                    sub.weight.copy_(1.0 + 0.1 * torch.randn(sub.weight.shape, generator=gen))
                if sub.bias is not None:
                    sub.bias.copy_(0.1 * torch.randn(sub.bias.shape, generator=gen))
                if isinstance(sub, nn.BatchNorm2d):
                    assert sub.running_mean is not None and sub.running_var is not None
                    sub.running_mean.copy_(0.2 * torch.randn(sub.running_mean.shape, generator=gen))
                    sub.running_var.copy_(0.5 + torch.rand(sub.running_var.shape, generator=gen))


# --------------------------------------------------------------------------------------------------
# Registry
# --------------------------------------------------------------------------------------------------

_Shapes = tuple[tuple[int, ...], ...]
_Factory = Callable[[int, int | None], tuple[nn.Module, _Shapes]]


@dataclass(frozen=True)
class BuiltinSpec:
    """One built-in model: how to build it, its default sizes and a one-line summary."""

    name: str
    summary: str
    build: _Factory  # (batch, seq) -> (module, input shapes)
    default_batch: int
    default_seq: int | None = None  # None: the model has no sequence dimension


def _mlp(batch: int, seq: int | None) -> tuple[nn.Module, _Shapes]:
    return MLP(), ((batch, 256),)


def _transformer(batch: int, seq: int | None) -> tuple[nn.Module, _Shapes]:
    assert seq is not None
    return TransformerBlock(d_model=128, n_heads=4, max_seq=seq), ((batch, seq, 128),)


def _resnet(batch: int, seq: int | None) -> tuple[nn.Module, _Shapes]:
    return ResNetBlock(16), ((batch, 16, 16, 16),)


def _elementwise(batch: int, seq: int | None) -> tuple[nn.Module, _Shapes]:
    return ElementwiseChain(), ((batch, 1024), (batch, 1024))


def _softmax(batch: int, seq: int | None) -> tuple[nn.Module, _Shapes]:
    return Softmax(), ((batch, 1024),)


def _layernorm(batch: int, seq: int | None) -> tuple[nn.Module, _Shapes]:
    return nn.LayerNorm(1024), ((batch, 1024),)


_SPECS: dict[str, BuiltinSpec] = {
    s.name: s
    for s in (
        BuiltinSpec("mlp", "Linear-GELU-Linear-ReLU-Linear, 256->512->512->256", _mlp, 32),
        BuiltinSpec(
            "transformer-block",
            "GPT-2 style block, d_model=128, 4 heads, causal attention",
            _transformer,
            2,
            16,
        ),
        BuiltinSpec("resnet-block", "conv3x3-BN-ReLU-conv3x3-BN + identity, ReLU; 16 channels", _resnet, 2),
        BuiltinSpec("elementwise-chain", "tanh(sigmoid(x*1.5 + y)*x - 0.25), two inputs", _elementwise, 1024),
        BuiltinSpec("softmax", "softmax over the last dimension", _softmax, 256),
        BuiltinSpec("layernorm", "LayerNorm(1024) with non-trivial weight and bias", _layernorm, 256),
    )
}

if tuple(_SPECS) != BUILTIN_NAMES:  # names.py lists them for the command line, without torch
    raise ImportError(f"tools/models/names.py lists {BUILTIN_NAMES}, builtins.py defines {tuple(_SPECS)}")


def _spec(name: str) -> BuiltinSpec:
    spec = _SPECS.get(name)
    if spec is None:
        close = difflib.get_close_matches(name, BUILTIN_NAMES, n=3, cutoff=0.5)
        hint = f" Did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
        raise ValueError(f"unknown builtin model {name!r}.{hint} Available: {', '.join(BUILTIN_NAMES)}")
    return spec


def _resolve_sizes(spec: BuiltinSpec, batch: int | None, seq: int | None) -> tuple[int, int | None]:
    batch = spec.default_batch if batch is None else batch
    if batch < 1:
        raise ValueError(f"batch must be >= 1, got {batch}")
    if seq is not None and spec.default_seq is None:
        raise ValueError(f"builtin model {spec.name!r} has no sequence dimension; do not pass seq")
    seq = spec.default_seq if seq is None else seq
    if seq is not None and seq < 1:
        raise ValueError(f"seq must be >= 1, got {seq}")
    return batch, seq


def describe(name: str) -> str:
    """One line naming the model, its default input shapes and what it computes."""
    spec = _spec(name)
    batch, seq = _resolve_sizes(spec, None, None)
    with torch.device("meta"):
        _, shapes = spec.build(batch, seq)
    inputs = ", ".join("[" + ", ".join(str(d) for d in s) + "]" for s in shapes)
    return f"{spec.name}: {spec.summary}; inputs {inputs}"


def builtin(
    name: str,
    *,
    dtype: torch.dtype = torch.float32,
    batch: int | None = None,
    seq: int | None = None,
    seed: int = 0,
) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """Build the built-in model ``name`` in eval mode, with example inputs of ``dtype``."""
    spec = _spec(name)
    if dtype not in _FLOAT_DTYPES:
        raise ValueError(f"dtype must be a floating type ({', '.join(map(str, _FLOAT_DTYPES))}), got {dtype}")
    batch, seq = _resolve_sizes(spec, batch, seq)
    gen = torch.Generator().manual_seed(seed)
    # Constructors draw default inits from the global RNG; fork it so callers' RNG state is untouched.
    with torch.random.fork_rng(devices=[]):
        module, shapes = spec.build(batch, seq)
    _init_from(module, gen)
    inputs = tuple(torch.randn(shape, generator=gen) for shape in shapes)
    module = module.to(dtype).eval()
    inputs = tuple(t.to(dtype) if t.is_floating_point() else t for t in inputs)
    logger.debug("built %s (dtype=%s, batch=%d, seq=%s, seed=%d)", name, dtype, batch, seq, seed)
    return module, inputs
