"""Model zoo for benchmarks and tests: `transformers` architectures, random init, small configs, no downloads.

    from zoo import NAMES, build            # benchmarks/ on sys.path
    module, inputs = build("gpt2", batch=1)  # nn.Module in eval mode, a tuple of input tensors
    module(*inputs)                          # one tensor, or a tuple of tensors for "llama_decode"

("llama_decode_static" takes (ids, a transformers StaticCache) instead: see `StaticDecodeStep`.)

Each model keeps its class's default config except for the size fields: 2 layers (CNNs: one block per
stage), hidden sizes 384-768, vocabulary 32000 (the embedding is one gather at any size; a smaller
table keeps the ONNX files and each contender's copy of the weights small), sequence 128, images
224x224, audio 1 s at 16 kHz. `tiny=True` shrinks every size much further (hidden 32-64, 1 layer,
sequence 16, images 32-64) for tests that must run in seconds; the architecture is the same.

Every model is wrapped in a module taking positional tensors and returning tensors (`Positional`,
`DecodeStep`), so every contender - eager, torch.compile, torch.export, torch.onnx.export, OpenVINO,
autofusion - is handed the same plain function. The weights come from `torch.manual_seed(seed)` and
the inputs from a generator of the same seed, so another process rebuilding a model with the same
arguments gets the same weights and inputs (the OpenVINO contender relies on it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import transformers as hf
from torch import nn
from transformers.cache_utils import StaticLayer

SEQ, TINY_SEQ = 128, 16
VOCAB, TINY_VOCAB = 32000, 1000
IMAGE, TINY_IMAGE = 224, 32
PAST = 128  # the decode step's KV cache length (TINY_SEQ when tiny)


class Positional(nn.Module):
    """A `transformers` model as a function of one positional tensor, returning one tensor: the model
    takes `arg` as a keyword and returns a ModelOutput, from which `output` is taken. `fixed` are
    keyword arguments passed on every call (use_cache=False: no cache objects among the outputs)."""

    def __init__(self, model: nn.Module, arg: str, output: str, **fixed: Any) -> None:
        super().__init__()
        self.model, self.arg, self.output, self.fixed = model, arg, output, fixed

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return getattr(self.model(**{self.arg: x}, **self.fixed), self.output)


class DecodeStep(nn.Module):
    """One decode step of a decoder-only model: one new token per sequence against a KV cache of `past`
    positions. The cache comes in as tensors, (keys, values) per layer, each [batch, kv_heads, past,
    head_dim]; out come the new token's hidden state [batch, 1, hidden] and its keys and values per
    layer, [batch, kv_heads, 1, head_dim], which the caller appends to its cache. The cache is passed
    as inputs and the new rows returned, rather than written into a static cache in place, because the
    compilers measured here are handed functions without input mutation."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, ids: torch.Tensor, *cache: torch.Tensor) -> tuple[torch.Tensor, ...]:
        past = hf.DynamicCache(config=self.model.config)
        # The layers take the tensors as they are: DynamicCache's own update (and its constructor from
        # pairs) concatenates them onto an empty 1-D tensor, a cat OpenVINO cannot convert.
        for i, layer in enumerate(past.layers):
            layer.lazy_initialization(cache[2 * i], cache[2 * i + 1])
            layer.keys, layer.values = cache[2 * i], cache[2 * i + 1]
        hidden = self.model(input_ids=ids, cache=past, use_cache=True).last_hidden_state
        new: list[torch.Tensor] = []
        for layer in past.layers:  # update() appended this step's keys and values at the end
            new += [layer.keys[:, :, -1:], layer.values[:, :, -1:]]
        return (hidden, *new)


class _PinnedLayer(StaticLayer):
    """A StaticLayer whose write position stays where it is: `update` writes the new rows at the
    current length as transformers' does, then takes the length back, so every call of a timed loop
    is the same decode step (one token against `PAST` cached ones) instead of walking off the end of
    the cache. The compiled work is a real StaticCache step's (the in-place row write, attention over
    the whole static cache with its mask) plus one in-place subtraction on a 0-d tensor."""

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        out = super().update(key_states, value_states, *args, **kwargs)
        self.cumulative_length.sub_(key_states.shape[-2])
        return out


class StaticDecodeStep(nn.Module):
    """One decode step on transformers' own StaticCache, updated in place, as a user of
    `generate(cache_implementation="static")` or a hand-written loop over `StaticCache` runs it: called
    as (ids, cache), returns the new token's hidden state. For contenders that take an object holding
    tensors and mutate it (eager, torch.compile, autofusion); the exporters (ONNX, OpenVINO) refuse it."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, ids: torch.Tensor, cache: Any) -> torch.Tensor:
        return self.model(input_ids=ids, cache=cache).last_hidden_state


def static_cache(cfg: Any, batch: int, past: int, g: torch.Generator) -> Any:
    """A StaticCache of `past + 1` positions whose first `past` hold random keys and values, its layers
    pinned at `past` (`_PinnedLayer`)."""
    cache = hf.StaticCache(config=cfg, max_cache_len=past + 1)
    shape = (batch, cfg.num_key_value_heads, past, cfg.head_dim)
    for layer in cache.layers:
        k, v = torch.randn(*shape, generator=g), torch.randn(*shape, generator=g)
        layer.lazy_initialization(k, v)
        layer.keys[:, :, :past] = k
        layer.values[:, :, :past] = v
        layer.cumulative_length.fill_(past)
        layer.__class__ = _PinnedLayer
    return cache


@dataclass(frozen=True)
class Entry:
    kind: str  # "text", "vision", "audio", "decode" or "decode_static": what the inputs are
    make: Callable[[bool], nn.Module]  # tiny -> the wrapped model (random init)
    about: str  # what the config changes from the class's defaults
    batches: tuple[int, ...] | None = None  # the batch sizes it is meant for (None: any)


def _text(cls: Any, config: Callable[[bool], Any], **kw: Any) -> Callable[[bool], nn.Module]:
    return lambda tiny: Positional(cls(config(tiny), **kw), "input_ids", "last_hidden_state", use_cache=False)


def _plain(
    cls: Any, config: Callable[[bool], Any], arg: str, out: str, **kw: Any
) -> Callable[[bool], nn.Module]:
    return lambda tiny: Positional(cls(config(tiny), **kw), arg, out)


def _h(tiny: bool, full: int, small: int = 64) -> int:
    return small if tiny else full


def _if(tiny: bool, **fields: Any) -> dict[str, Any]:
    """Config fields that only the tiny variant sets."""
    return fields if tiny else {}


def _image(tiny: bool) -> int:
    return TINY_IMAGE if tiny else IMAGE


def _layers(tiny: bool) -> int:
    return 1 if tiny else 2


def _decoder(cls: Any, tiny: bool, **kw: Any) -> Any:
    """LLaMA-family sizes (LLaMA, Qwen2, the decode step): hidden 512, 8 heads of 64, FFN 1408."""
    h, heads = _h(tiny, 512), 2 if tiny else 8
    return cls(
        hidden_size=h,
        intermediate_size=_h(tiny, 1408, 128),
        num_hidden_layers=_layers(tiny),
        num_attention_heads=heads,
        head_dim=h // heads,
        vocab_size=_h(tiny, VOCAB, TINY_VOCAB),
        max_position_embeddings=2 * SEQ + 1,
        **kw,
    )


def _llama(tiny: bool) -> Any:
    return _decoder(hf.LlamaConfig, tiny)


def _qwen2(tiny: bool) -> Any:  # grouped-query attention: 2 key/value heads for 8 query heads
    return _decoder(hf.Qwen2Config, tiny, num_key_value_heads=1 if tiny else 2)


def _gpt2(tiny: bool) -> Any:
    vocab = _h(tiny, VOCAB, TINY_VOCAB)  # its special tokens are the last entry, as in the default vocabulary
    return hf.GPT2Config(
        n_embd=_h(tiny, 768),
        n_layer=_layers(tiny),
        n_head=2 if tiny else 12,
        vocab_size=vocab,
        bos_token_id=vocab - 1,
        eos_token_id=vocab - 1,
    )


def _phi(tiny: bool) -> Any:
    return hf.PhiConfig(
        hidden_size=_h(tiny, 512),
        intermediate_size=_h(tiny, 2048, 128),
        num_hidden_layers=_layers(tiny),
        num_attention_heads=2 if tiny else 8,
        vocab_size=_h(tiny, VOCAB, TINY_VOCAB),
    )


def _bert(tiny: bool, cls: Any = hf.BertConfig) -> Any:
    return cls(
        hidden_size=_h(tiny, 768),
        intermediate_size=_h(tiny, 3072, 128),
        num_hidden_layers=_layers(tiny),
        num_attention_heads=2 if tiny else 12,
        vocab_size=_h(tiny, VOCAB, TINY_VOCAB),
    )


def _albert(tiny: bool) -> Any:
    return _bert(tiny, hf.AlbertConfig)


def _t5(tiny: bool) -> Any:
    return hf.T5Config(
        d_model=_h(tiny, 512),
        d_ff=_h(tiny, 2048, 128),
        d_kv=32 if tiny else 64,
        num_heads=2 if tiny else 8,
        num_layers=_layers(tiny),
        vocab_size=_h(tiny, VOCAB, TINY_VOCAB),
    )


def _vit(tiny: bool) -> Any:
    return hf.ViTConfig(
        hidden_size=_h(tiny, 768),
        intermediate_size=_h(tiny, 3072, 128),
        num_hidden_layers=_layers(tiny),
        num_attention_heads=2 if tiny else 12,
        image_size=_image(tiny),
    )


def _resnet(tiny: bool) -> Any:
    return hf.ResNetConfig(
        depths=[1, 1, 1, 1], **_if(tiny, hidden_sizes=[16, 32, 64, 128], embedding_size=16)
    )


def _convnext(tiny: bool) -> Any:
    return hf.ConvNextConfig(
        depths=[1, 1, 1, 1], image_size=_image(tiny), **_if(tiny, hidden_sizes=[16, 32, 64, 128])
    )


def _mobilenet_v2(tiny: bool) -> Any:
    return hf.MobileNetV2Config(image_size=_image(tiny), depth_multiplier=0.25 if tiny else 1.0)


def _swin(tiny: bool) -> Any:
    if tiny:  # two stages: with four, the last stage's 1x1 map is smaller than any window
        return hf.SwinConfig(
            depths=[2, 2], num_heads=[1, 2], embed_dim=16, window_size=2, image_size=TINY_IMAGE
        )
    return hf.SwinConfig(depths=[2, 2, 2, 2], image_size=IMAGE)


def _efficientnet(tiny: bool) -> Any:  # B0: the defaults are B7's
    return hf.EfficientNetConfig(
        width_coefficient=0.25 if tiny else 1.0,
        depth_coefficient=1.0,
        image_size=_image(tiny),
        hidden_dim=_h(tiny, 1280, 320),
    )


def _wav2vec2(tiny: bool) -> Any:
    return hf.Wav2Vec2Config(
        hidden_size=_h(tiny, 768),
        intermediate_size=_h(tiny, 3072, 128),
        num_hidden_layers=_layers(tiny),
        num_attention_heads=2 if tiny else 12,
        **_if(tiny, conv_dim=[32] * 7, num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=2),
    )


def _decode(tiny: bool) -> nn.Module:
    return DecodeStep(hf.LlamaModel(_llama(tiny)))


def _decode_static(tiny: bool) -> nn.Module:
    return StaticDecodeStep(hf.LlamaModel(_llama(tiny)))


ZOO: dict[str, Entry] = {
    "gpt2": Entry("text", _text(hf.GPT2Model, _gpt2), "2 layers, hidden 768, 12 heads"),
    "llama": Entry("text", _text(hf.LlamaModel, _llama), "2 layers, hidden 512, 8 heads, FFN 1408"),
    "qwen2": Entry(
        "text", _text(hf.Qwen2Model, _qwen2), "2 layers, hidden 512, 8 heads, 2 KV heads, FFN 1408"
    ),
    "phi": Entry("text", _text(hf.PhiModel, _phi), "2 layers, hidden 512, 8 heads, FFN 2048"),
    "bert": Entry("text", _text(hf.BertModel, _bert, add_pooling_layer=False), "2 layers, hidden 768"),
    "albert": Entry("text", _text(hf.AlbertModel, _albert, add_pooling_layer=False), "2 layers, hidden 768"),
    "t5_encoder": Entry("text", _text(hf.T5EncoderModel, _t5), "2 layers, d_model 512, FFN 2048"),
    "vit": Entry(
        "vision",
        _plain(hf.ViTModel, _vit, "pixel_values", "last_hidden_state", add_pooling_layer=False),
        "2 layers, hidden 768, 224x224, patch 16",
    ),
    "resnet": Entry(
        "vision",
        _plain(hf.ResNetModel, _resnet, "pixel_values", "pooler_output"),
        "ResNet-50 widths, one bottleneck per stage",
    ),
    "convnext": Entry(
        "vision",
        _plain(hf.ConvNextModel, _convnext, "pixel_values", "pooler_output"),
        "ConvNeXt-T widths, one block per stage",
    ),
    "mobilenet_v2": Entry(
        "vision",
        _plain(hf.MobileNetV2Model, _mobilenet_v2, "pixel_values", "pooler_output"),
        "MobileNetV2 1.0 (the default config)",
    ),
    "swin": Entry(
        "vision",
        _plain(hf.SwinModel, _swin, "pixel_values", "pooler_output"),
        "Swin-T widths, two blocks per stage (one shifted)",
    ),
    "efficientnet": Entry(
        "vision",
        _plain(hf.EfficientNetModel, _efficientnet, "pixel_values", "pooler_output"),
        "EfficientNet-B0 (width and depth 1.0, 224x224)",
    ),
    "wav2vec2": Entry(
        "audio",
        _plain(hf.Wav2Vec2Model, _wav2vec2, "input_values", "last_hidden_state"),
        "2 layers, hidden 768, 1 s of 16 kHz audio",
    ),
    "llama_decode": Entry(
        "decode", _decode, "the llama model, one new token against a 128-token KV cache", batches=(1,)
    ),
    "llama_decode_static": Entry(
        "decode_static",
        _decode_static,
        "the llama model, one new token written into a 129-slot StaticCache holding 128",
        batches=(1,),
    ),
}
NAMES = list(ZOO)


def inputs_for(name: str, module: nn.Module, batch: int, tiny: bool, g: torch.Generator) -> tuple[Any, ...]:
    entry = ZOO[name]
    seq = TINY_SEQ if tiny else SEQ
    cfg: Any = module.model.config  # the wrapped transformers model's
    if entry.kind == "text":
        return (torch.randint(0, cfg.vocab_size, (batch, seq), generator=g),)
    if entry.kind == "vision":
        size = _image(tiny)
        return (torch.randn(batch, 3, size, size, generator=g),)
    if entry.kind == "audio":
        return (torch.randn(batch, 1600 if tiny else 16000, generator=g),)
    if entry.kind == "decode_static":
        ids = torch.randint(0, cfg.vocab_size, (batch, 1), generator=g)
        return (ids, static_cache(cfg, batch, TINY_SEQ if tiny else PAST, g))
    assert entry.kind == "decode"
    shape = (batch, cfg.num_key_value_heads, TINY_SEQ if tiny else PAST, cfg.head_dim)
    cache = [torch.randn(*shape, generator=g) for _ in range(2 * cfg.num_hidden_layers)]
    return (torch.randint(0, cfg.vocab_size, (batch, 1), generator=g), *cache)


def build(name: str, batch: int = 1, tiny: bool = False, seed: int = 0) -> tuple[nn.Module, tuple[Any, ...]]:
    """The model `name` of the zoo in eval mode, without gradients, and its inputs for `batch`."""
    if name not in ZOO:
        raise KeyError(f"unknown model {name!r}; the zoo has {', '.join(NAMES)}")
    torch.manual_seed(seed)
    module = ZOO[name].make(tiny).eval().requires_grad_(False)
    g = torch.Generator().manual_seed(seed)
    if ZOO[name].kind == "vision":
        calibrate_batch_norms(module, inputs_for(name, module, 4, tiny, g))
    return module, inputs_for(name, module, batch, tiny, g)


def calibrate_batch_norms(module: nn.Module, inputs: tuple[torch.Tensor, ...]) -> None:
    """Give every BatchNorm scale 1 and shift 0, and set its running statistics to those of its input
    on `inputs` (one forward pass, BatchNorms alone in training mode). Random weights with the default
    initialisation shrink the activations layer by layer (MobileNetV2's output was ~1e-28; EfficientNet
    draws its BatchNorm scales from N(0, 0.02), and its output was 0.0), which makes the result check
    vacuous and can slow arithmetic down; calibrated statistics keep every layer's output near unit
    scale, as a trained network's do."""
    norms = [m for m in module.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    if not norms:
        return
    saved = [m.momentum for m in norms]
    for m in norms:
        if m.affine:
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)
        m.momentum = 1.0  # the running statistics become this batch's
        m.train()
    with torch.no_grad():
        module(*inputs)
    for m, momentum in zip(norms, saved, strict=True):
        m.momentum = momentum
        m.eval()
