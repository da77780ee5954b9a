"""GEMM + epilogue fusion, A/B in one process: each case compiled twice (the fused GEMM + epilogue
kernels off, `disabled=["gemm_epilogue"]`, and on, the default), the two run alternately, medians.

Cases: linear + tanh-GELU [128, 768] x [768, 3072]; GPT-2 and BERT from `transformers` with small
configs (2 layers, hidden 768, sequence 128, batch 1, random init). Prints per case the two medians,
their ratio (off / on: above 1 the fused kernels win) and which GEMMs fused or why not.

    PYTHONPATH=src python benchmarks/bench_gemm_epilogue.py [--rounds 30] [--cases linear,gpt2,bert]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

import autofusion


def _linear_gelu() -> tuple[Any, list[torch.Tensor]]:
    lin = torch.nn.Linear(768, 3072).eval()

    def fn(x: torch.Tensor) -> torch.Tensor:
        return F.gelu(lin(x), approximate="tanh")

    return fn, [torch.randn(128, 768)]


def _hf(kind: str) -> tuple[Any, list[torch.Tensor]]:
    import transformers as tf

    if kind == "gpt2":
        cfg = tf.GPT2Config(n_layer=2, n_embd=768, n_head=12, n_positions=128, vocab_size=1000)
        model = tf.GPT2Model(cfg)
    else:
        cfg = tf.BertConfig(num_hidden_layers=2, hidden_size=768, num_attention_heads=12,
                            intermediate_size=3072, vocab_size=1000, max_position_embeddings=128)  # fmt: skip
        model = tf.BertModel(cfg)
    model.eval()
    ids = torch.randint(0, 1000, (1, 128))

    def fn(x: torch.Tensor) -> torch.Tensor:
        return model(input_ids=x).last_hidden_state

    return fn, [ids]


CASES: dict[str, Callable[[], tuple[Any, list[torch.Tensor]]]] = {
    "linear_gelu": _linear_gelu,
    "gpt2": lambda: _hf("gpt2"),
    "bert": lambda: _hf("bert"),
}


def _time(fn: Callable[[], Any], reps: int) -> float:
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t0) / reps


def run(name: str, rounds: int, reps: int, extra: dict[str, Any]) -> None:
    torch.manual_seed(0)
    fn, inputs = CASES[name]()
    off = autofusion.compile(fn, inputs, disabled=["gemm_epilogue"], **extra)
    on = autofusion.compile(fn, inputs, **extra)
    with torch.no_grad():
        ref = fn(*inputs)
        for cm in (off, on):
            torch.testing.assert_close(cm(*inputs), ref, atol=1e-4, rtol=1e-4)
        ta, tb = [], []
        for _ in range(rounds):
            ta.append(_time(lambda: off(*inputs), reps))
            tb.append(_time(lambda: on(*inputs), reps))
        eager = statistics.median(_time(lambda: fn(*inputs), reps) for _ in range(max(3, rounds // 4)))
    a, b = statistics.median(ta), statistics.median(tb)
    decisions = [d for d in on.decisions if d["kind"] == "gemm_epilogue"]
    fused = sum(1 for d in decisions if d["accepted"])
    print(f"{name:12s} {extra or ''} off {a * 1e3:8.3f} ms  on {b * 1e3:8.3f} ms  off/on {a / b:5.3f}  "
          f"eager {eager * 1e3:8.3f} ms  GEMMs fused {fused}/{len(decisions)}  "
          f"super_kernel={on.stats['super_kernel']['on']}")  # fmt: skip
    for d in decisions:
        if not d["accepted"]:
            print(f"    no: {d['first']} -> {d['second']}: [{d['code']}] {d['reason'][:150]}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--rules", choices=("on", "off", "both"), default="both", help="the built-in rules")
    args = ap.parse_args()
    settings = {"on": [{}], "off": [{"builtin_rules": False}], "both": [{}, {"builtin_rules": False}]}
    for name in args.cases.split(","):
        for extra in settings[args.rules]:
            run(name, args.rounds, args.reps, extra)


if __name__ == "__main__":
    main()
