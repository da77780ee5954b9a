"""Per-token latency of a LLaMA-style decode step with a static KV cache: autofusion against eager.

transformers' LlamaForCausalLM (random init, small config), batch 1, a `StaticCache` prefilled with
`--prompt` tokens, then one token per call. The compiled step updates the cache in place (no copy of
it per step; `frontend/torch/mutation.py`). Eager and compiled steps alternate, each on its own cache
(reset when full), and the table gives medians over `--rounds` rounds. `--inductor` adds
torch.compile's default backend. Timings on a shared machine are noisy: compare in one run only.

    python benchmarks/decode_step.py [--layers 2] [--hidden 256] [--rounds 200] [--inductor]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

import autofusion


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--cache-len", type=int, default=256)
    ap.add_argument("--prompt", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=200)
    ap.add_argument("--inductor", action="store_true")
    # torch's CPU sdpa took 35-60 ms per call on this step on a loaded 2-core machine (15 us alone, same
    # shapes), in eager and compiled runs alike: the default measures the matmul-softmax attention.
    ap.add_argument("--attn", default="eager", choices=["eager", "sdpa"])
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    import transformers

    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(num_hidden_layers=a.layers, hidden_size=a.hidden,
                                   intermediate_size=a.hidden * 4, num_attention_heads=a.heads,
                                   num_key_value_heads=a.kv_heads, vocab_size=1024,
                                   max_position_embeddings=a.cache_len,
                                   attn_implementation=a.attn)  # fmt: skip
    model = transformers.LlamaForCausalLM(cfg).eval()

    def prefilled() -> Any:
        cache = transformers.StaticCache(config=cfg, max_cache_len=a.cache_len)
        model(input_ids=torch.arange(a.prompt).view(1, -1), cache=cache)
        return cache

    tok = torch.tensor([[7]])
    with torch.no_grad():
        t0 = time.perf_counter()
        cm = autofusion.compile(model, kwargs={"input_ids": tok, "cache": prefilled()})
        print(f"autofusion compile {time.perf_counter() - t0:.1f} s; "
              f"stats: kernels {cm.stats.get('kernels')}, "
              f"eager_fallback {cm.stats.get('eager_fallback')}, "
              f"in place {sum(m.inplace for m in cm.compiled.captured.mutations)} of "
              f"{len(cm.compiled.captured.mutations)} updated tensors")  # fmt: skip
        steps: dict[str, Callable[..., Any]] = {"eager": model, "autofusion": cm}
        if a.inductor:
            steps["inductor"] = torch.compile(model)
        caches = {name: prefilled() for name in steps}
        times: dict[str, list[float]] = {name: [] for name in steps}
        for name, step in steps.items():  # warm up (inductor compiles here)
            step(input_ids=tok, cache=caches[name])
        for _ in range(a.rounds):
            for name, step in steps.items():
                cache = caches[name]
                if int(cache.layers[0].cumulative_length) >= a.cache_len - 1:
                    caches[name] = cache = prefilled()
                t = time.perf_counter()
                step(input_ids=tok, cache=cache)
                times[name].append(time.perf_counter() - t)
    base = statistics.median(times["eager"])
    print(f"{'':12} {'ms/token':>9} {'vs eager':>9}")
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"{name:12} {med * 1e3:9.3f} {base / med:8.2f}x")


if __name__ == "__main__":
    main()
