"""Linear + GELU as one oneDNN call: the GEMM with the activation as its eltwise post-op.

In: a linear's sizes (M rows, K, N, dtype) and its activation ("gelu": erf, or "gelu_tanh"); per call,
its tensors. Out: `PostOpChooser`, which says per shape whether the fused call is taken (what
passes/linear_post_op.py asks). The call itself, `act(x @ w.T + b)` through ATen's
`torch.ops.mkldnn._linear_pointwise(x, packed_w, b, "gelu", [], algorithm)` on a weight packed once per
parameter version (`library.FOLDS`), is runtime/library.py's `post_op_linear` (linear_act runs it),
re-exported here as `fused`.

Why: the plan otherwise runs the linear (a packed or plain GEMM) and then GELU over its result, a second
pass over the hidden activation (ConvNeXt's MLP: 4x the block's width, the largest tensor of the block).
The post-op applies GELU to each output block while it is in registers. Measured on the 2-core AVX-512
VM under heavy load (2026-12-02, interleaved medians, fp32): ConvNeXt-T's four MLP shapes ran the fused
call in about half the time of the packed linear + ATen GELU; erf results equal ATen's bit for bit
(tanh within 5e-7).

The choice is measured per (M, K, N, dtype, act) on this machine: the fused call against the best of
what the plan does otherwise, bounded below by the plain GEMM alone (a GEMM-epilogue kernel's GELU is
nearly free, so the fused call must beat the GEMM without any activation there); it is taken when it
is at most MARGIN of that. The result is cached (namespace `layouts`, keyed with the torch version,
thread count and CPU features) only when the machine was quiet (hw/busy.py); a disturbed measurement
(implausibly slow) declines, and is not stored. `Options.linear_route` forced to "onednn" takes the
fused call without measuring; forced to "plain" or "mkl" never takes it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from autofusion.cache import Cache, as_cache
from autofusion.hw.busy import machine_busy, observed
from autofusion.hw.isa import features_digest

# The fused call lives with the operator that makes it (runtime/library.py's linear_act).
from autofusion.runtime.library import GELU_ALGORITHM as ALGORITHM
from autofusion.runtime.library import POST_OP_CALLS as CALLS
from autofusion.runtime.library import post_op_available as available
from autofusion.runtime.library import post_op_linear as fused
from autofusion.runtime.library import post_op_takes as takes
from autofusion.runtime.route_timing import best_times

log = logging.getLogger("autofusion.runtime")

MARGIN = 0.95  # the fused call must take at most this share of the unfused plan's time
MEASURE_BUDGET_S = 0.15  # compile time spent timing one shape (roughly)
MIN_PLAUSIBLE_FLOPS = 2e9  # as runtime/prepack.py: slower than this means the timing was disturbed


def measure(m: int, k: int, n: int, dtype: torch.dtype, act: str) -> dict[str, float] | None:
    """Best seconds of the fused call and of each unfused alternative for one [m, k] x [n, k]^T linear
    with `act` (None: the timing was disturbed)."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(m, k, generator=gen).to(dtype)
    w = (torch.randn(n, k, generator=gen) / max(1, k) ** 0.5).to(dtype)
    b = torch.randn(n, generator=gen).to(dtype)
    approximate = "tanh" if act == "gelu_tanh" else "none"
    algorithm = ALGORITHM[act]
    with torch.no_grad():
        packed = torch.ops.mkldnn._reorder_linear_weight(w, m)
        fns: dict[str, Callable[[], torch.Tensor]] = {
            "fused": lambda: torch.ops.mkldnn._linear_pointwise(x, packed, b, "gelu", [], algorithm),
            "packed_then_gelu": lambda: F.gelu(
                torch.ops.mkldnn._linear_pointwise(x, packed, b, "none", [], ""), approximate=approximate
            ),
            "plain_then_gelu": lambda: F.gelu(F.linear(x, w, b), approximate=approximate),
            "plain_alone": lambda: F.linear(x, w, b),
        }
        best = observed(lambda: best_times(fns, time.perf_counter, MEASURE_BUDGET_S))
    if 2 * m * k * n / best["plain_alone"] < MIN_PLAUSIBLE_FLOPS and 2 * m * k * n > 1e8:
        return None
    return best


def verdict(best: dict[str, float]) -> str | None:
    """None when the fused call wins by MARGIN over every unfused alternative, else why not."""
    others = {r: t for r, t in best.items() if r != "fused"}
    rival = min(others, key=lambda r: others[r])
    if best["fused"] <= MARGIN * others[rival]:
        return None
    return (f"the fused call ({best['fused'] * 1e6:.0f} us) is not {1 / MARGIN - 1:.0%} faster than "
            f"{rival} ({others[rival] * 1e6:.0f} us)")  # fmt: skip


class PostOpChooser:
    """Whether a linear + activation of given sizes runs as one fused call: None (yes) or why not.
    Measured once per process, per machine with a cache; `forced` is Options.linear_route."""

    def __init__(self, cache: Cache | str | None = None, forced: str = "auto") -> None:
        self.cache = as_cache(cache) if cache else None
        self.forced = forced
        self.memo: dict[tuple[int, int, int, torch.dtype, str], str | None] = {}

    def __call__(self, m: int, k: int, n: int, dtype: torch.dtype, act: str) -> str | None:
        if act not in ALGORITHM:
            return f"{act} is not a post-op of the fused linear"
        if not available(dtype):
            return f"oneDNN's fused linear takes fp32 and bf16 here, not {dtype}"
        if self.forced != "auto":
            return None if self.forced == "onednn" else f"linear_route={self.forced!r} forces another route"
        sig = (m, k, n, dtype, act)
        if sig in self.memo:
            return self.memo[sig]
        key = (f"linear_post_op {act} {m}x{k}x{n} {dtype}|torch {torch.__version__}"
               f"|{torch.get_num_threads()} threads|cpu {features_digest()}")  # fmt: skip
        hit = self.cache.get_json("layouts", key) if self.cache is not None else None
        if (
            isinstance(hit, dict)
            and "fused" in hit
            and all(isinstance(v, (int, float)) for v in hit.values())
        ):
            best = {str(r): float(v) for r, v in hit.items()}
        else:
            measured = measure(m, k, n, dtype, act)
            if measured is None:
                return "the machine was too busy to time it"
            best = measured
            busy, seen = machine_busy()
            if self.cache is not None and not busy:
                self.cache.put_json("layouts", key, best)
            elif busy:
                log.info("linear_post_op: %dx%dx%d timed under load (%s): decides this compile only",
                         m, k, n, seen)  # fmt: skip
        why = verdict(best)
        times = ", ".join(f"{r} {t * 1e6:.0f} us" for r, t in best.items())
        log.info("linear_post_op: linear %dx%dx%d %s + %s %s (%s)", m, k, n, dtype, act,
                 "fused" if why is None else "not fused", times)  # fmt: skip
        self.memo[sig] = why
        return why


__all__ = ["ALGORITHM", "CALLS", "PostOpChooser", "available", "fused", "measure", "takes", "verdict"]
