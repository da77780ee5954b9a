"""Prepacked GEMM weights for the library linear route: which library runs `x @ w.T + b` fastest here.

In: a linear's sizes (M rows, K, N, dtype) and, per call, its tensors. Out: the route (`plain`: ATen's
`F.linear`, MKL's GEMM on the weight as the module holds it; `mkl`: MKL's packed GEMM,
`_mkl_reorder_linear_weight` + `_mkl_linear`, fp32 only; `onednn`: oneDNN's blocked weight,
`_reorder_linear_weight` + `_linear_pointwise`) and `linear(x, w, b, route)`, which packs `w` once per
parameter version (`library.FOLDS`, keyed by the weight's identity and `_version`) and calls the route.

The route is chosen by measurement, per shape and dtype, on this machine: all three timed interleaved,
best of several rounds (a clear loser leaves the race early: runtime/route_timing.py), a packed route
taken only when it beats plain by `MARGIN`; the result is kept in
the disk cache (namespace `layouts`, keyed with the torch version, thread count and CPU features), so a
shape is timed once per machine and later compiles make the same choice. On a busy machine (other
processes hold the cores, `hw.busy`) the wall clock ranks the routes by how each copes with losing a
thread mid-call, not by how fast each multiplies: the routes are then timed on one thread in that
thread's CPU time. Measured on the 2-core Intel Xeon (AVX-512) at a load of 10-12 (2026-12-02): wall
clock at 2 threads put oneDNN 1.1-2x ahead of plain at every BERT/GPT-2 shape, and the noise flipped
the stored choice between runs, while one thread's CPU time put MKL's packed GEMM 5-25 % ahead of
plain and oneDNN 3-10 % behind MKL at all of them (2-thread CPU time with sleeping OpenMP waits gave
the same order; Inductor with freezing runs MKL's packed GEMM there too). `Options.linear_route` forces
one route instead (`RouteChooser.forced`; what `autofusion tune` tries). A disturbed measurement
(implausibly slow) keeps `plain` and is not stored. Measured on the 2-core AVX-512 development VM under
load (2026-12-01, interleaved medians, fp32, M=128/1024, K=384..3072, N=768..3072): oneDNN's packed
weight ran 1.8-3.8x faster than plain F.linear at every shape (single-threaded, quieter: 2.2-2.4x, 227
against 100 GFLOP/s at 128x768x768), MKL's packed GEMM within noise of plain; bf16 1.1-2x for oneDNN at
most shapes (MKL packing takes fp32 only).
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
from autofusion.ir.graph import Graph, InputRole, Node
from autofusion.ir.types import TensorType
from autofusion.runtime.library import FOLDS
from autofusion.runtime.route_timing import best_times

log = logging.getLogger("autofusion.runtime")

ROUTES = ("plain", "mkl", "onednn")
MARGIN = 0.95  # a packed route must take at most this share of plain's time (MKL packed: 0.92-0.95)
# MKL's packed GEMM runs plain's own MKL kernels with the weight's panels packed once instead of per call,
# so it has no way to lose beyond noise; its only cost is the packed copy's memory. A short measurement
# under load put it at 0.958 of plain at qwen2's down projection (1024x1408x512), which MARGIN refused,
# while 11 interleaved rounds on one thread put it at 0.88 (Inductor with freezing runs it there).
MKL_MARGIN = 0.99
MEASURE_BUDGET_S = 0.15  # compile time spent timing one linear shape (roughly)
MIN_PLAUSIBLE_FLOPS = 2e9  # any CPU with a vector unit multiplies faster; slower means disturbed
# fp32 FLOP/s one core cannot reach (two 512-bit FMA units at 4 GHz make 256 G): more in one thread's
# CPU time means the work ran on other threads, and that clock did not see it.
MAX_CORE_FLOPS = 2e12

Chooser = Callable[[int, int, int, torch.dtype], str]


def available(route: str, dtype: torch.dtype) -> bool:
    if route == "plain":
        return True
    if route == "mkl":
        return dtype == torch.float32 and torch._C.has_mkl and hasattr(torch.ops.mkl, "_mkl_linear")
    return (
        route == "onednn"
        and dtype in (torch.float32, torch.bfloat16)
        and torch.backends.mkldnn.is_available()
        and hasattr(torch.ops.mkldnn, "_linear_pointwise")
    )


def _pack(w: torch.Tensor, route: str, m: int) -> torch.Tensor:
    w = w.contiguous()
    if route == "mkl":
        return torch.ops.mkl._mkl_reorder_linear_weight(w, m)
    return torch.ops.mkldnn._reorder_linear_weight(w, m)


def _run(
    x: torch.Tensor, packed: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, route: str, m: int
) -> torch.Tensor:
    """x [m, k] @ w.T + b on the packed weight (MKL's call also takes the unpacked one)."""
    if route == "mkl":
        return torch.ops.mkl._mkl_linear(x, packed, w, b, m)
    return torch.ops.mkldnn._linear_pointwise(x, packed, b, "none", [], "")


def linear(
    x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, route: str, transposed: bool = False
) -> torch.Tensor:
    """`F.linear(x, w, b)` (with `transposed`, `x @ w + b`: `w` is [k, n], as `addmm`/`mm` take it)
    through `route`, the weight packed once per version of `w`. Falls back to the plain call for inputs
    the packed route was not made for (another dtype, a non-dense x)."""
    wn = w.t() if transposed else w
    if route == "plain" or x.dim() < 2 or not x.is_contiguous() or x.dtype != w.dtype \
            or (b is not None and (b.dtype != w.dtype or b.shape != (wn.shape[0],))):  # fmt: skip
        return F.linear(x, wn, b)
    k = x.shape[-1]
    m = x.numel() // k if k else 0
    if m == 0:
        return F.linear(x, wn, b)
    # One entry per weight (its id in the tag): the copy packed for an older version is dropped.
    tag = ("prepack", route, m, transposed, id(w))
    # [0]: a packed weight a package stored comes with the bytes it lies in (`packed_blob.rebuild`).
    packed = FOLDS.get(tag, [w], lambda: (_pack(wn, route, m),), single=True)[0]
    y = _run(x.reshape(m, k), packed, wn, b, route, m)
    return y.reshape(*x.shape[:-1], wn.shape[0])


def measure(m: int, k: int, n: int, dtype: torch.dtype) -> dict[str, float] | None:
    """Best time of each available route for one [m, k] x [n, k]^T product (None: disturbed): wall
    clock on every thread, or on a busy machine one thread's CPU time."""
    busy, seen = machine_busy()
    if busy:
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            best = observed(lambda: _measure(m, k, n, dtype, time.thread_time))
        finally:
            torch.set_num_threads(threads)
        flops = 2 * m * k * n / max(min(best.values()), 1e-12)
        if flops <= MAX_CORE_FLOPS:
            log.info("prepack: linear %dx%dx%d %s timed on one thread in CPU time (%s)", m, k, n, dtype, seen)
            return best
        log.info("prepack: linear %dx%dx%d %s: one thread's CPU time missed the work (%.0f GFLOP/s); "
                 "timed by the wall clock", m, k, n, dtype, flops / 1e9)  # fmt: skip
    best = observed(lambda: _measure(m, k, n, dtype, time.perf_counter))
    if 2 * m * k * n / best["plain"] < MIN_PLAUSIBLE_FLOPS and 2 * m * k * n > 1e8:
        return None
    return best


def _measure(m: int, k: int, n: int, dtype: torch.dtype, clock: Callable[[], float]) -> dict[str, float]:
    """Best time of each available route by `clock`, the routes interleaved."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(m, k, generator=gen).to(dtype)
    w = torch.randn(n, k, generator=gen).to(dtype)
    b = torch.randn(n, generator=gen).to(dtype)
    fns: dict[str, Callable[[], torch.Tensor]] = {"plain": lambda: F.linear(x, w, b)}
    with torch.no_grad():
        for route in ROUTES[1:]:
            if not available(route, dtype):
                continue
            try:
                packed = _pack(w, route, m)
                _run(x, packed, w, b, route, m)
            except RuntimeError as e:  # a build without this route's kernels for the dtype
                log.debug("prepack: %s unavailable for %s: %s", route, dtype, e)
                continue
            fns[route] = lambda p=packed, r=route: _run(x, p, w, b, r, m)  # type: ignore[misc]
        # The packed routes ran once above (the pack's check): not run untimed again.
        return best_times(fns, clock, MEASURE_BUDGET_S, warmed=set(fns) - {"plain"})


def pick(best: dict[str, float]) -> str:
    """The fastest route, when it beats plain by its margin (MKL_MARGIN for MKL's packed GEMM, MARGIN
    for oneDNN); else plain."""
    route = min(best, key=lambda r: best[r])
    margin = MKL_MARGIN if route == "mkl" else MARGIN
    return route if route != "plain" and best[route] <= margin * best["plain"] else "plain"


class RouteChooser:
    """Chooses a route per (m, k, n, dtype): measured once per process, and per machine with a cache.
    `forced` (Options.linear_route, one of ROUTES) takes that route without measuring wherever it is
    available for the dtype, plain elsewhere; "auto" measures."""

    def __init__(self, cache: Cache | str | None = None, forced: str = "auto") -> None:
        if forced != "auto" and forced not in ROUTES:
            raise ValueError(f"linear route {forced!r}: choose auto or one of {', '.join(ROUTES)}")
        self.cache = as_cache(cache) if cache else None
        self.forced = forced
        self.memo: dict[tuple[int, int, int, torch.dtype], str] = {}

    def __call__(self, m: int, k: int, n: int, dtype: torch.dtype) -> str:
        sig = (m, k, n, dtype)
        if sig in self.memo:
            return self.memo[sig]
        if self.forced != "auto":
            route = self.forced if available(self.forced, dtype) else "plain"
            log.info("prepack: linear %dx%dx%d %s runs %s (linear_route=%r)", m, k, n, dtype, route,
                     self.forced)  # fmt: skip
            self.memo[sig] = route
            return route
        if not any(available(r, dtype) for r in ROUTES[1:]):
            self.memo[sig] = "plain"
            return "plain"
        key = (f"linear {m}x{k}x{n} {dtype}|torch {torch.__version__}|{torch.get_num_threads()} threads"
               f"|cpu {features_digest()}")  # fmt: skip
        hit = self.cache.get_json("layouts", key) if self.cache is not None else None
        if (
            isinstance(hit, dict)
            and all(isinstance(v, (int, float)) for v in hit.values())
            and "plain" in hit
        ):
            best = {r: float(v) for r, v in hit.items() if r in ROUTES}
        else:
            measured = measure(m, k, n, dtype)
            if measured is None:
                log.info("prepack: linear %dx%dx%d %s stays plain: the machine was too busy to time it",
                         m, k, n, dtype)  # fmt: skip
                return "plain"
            best = measured
            if self.cache is not None:
                self.cache.put_json("layouts", key, best)
        route = pick(best)
        times = ", ".join(f"{r} {t * 1e6:.0f} us" for r, t in best.items())
        log.info("prepack: linear %dx%dx%d %s runs %s (%s)", m, k, n, dtype, route, times)
        self.memo[sig] = route
        return route


def _operands(node: Node) -> tuple[int, int, int | None, bool] | None:
    """Input positions of x, the weight and the bias (None: absent), and whether the weight is [k, n];
    None for a node this route does not take. The rules' linear externs (`linear_act`,
    `linear_residual`) keep their own library call: the compiled plan runs the same code as the
    reference runtime there."""
    if node.op == "linear":
        return 0, 1, 2 if node.attr("has_bias") else None, False
    if node.op == "addmm" and node.attr("beta") == 1.0 and node.attr("alpha") == 1.0:
        return 1, 2, 0, True
    if node.op in ("mm", "matmul"):  # matmul: x [..., k] @ w [k, n] (ONNX MatMul on a weight)
        return 0, 1, None, True
    return None


def _is_weight(graph: Graph, vid: int) -> bool:
    """A parameter or buffer input, or a constant (an ONNX initializer): the same tensor every call,
    so its packed copy is made once per version."""
    if any(gi.value.id == vid and gi.role is not InputRole.USER for gi in graph.inputs):
        return True
    return any(n.op == "const" and n.outputs[0].id == vid for n in graph.nodes)


def packed_call(
    node: Node, graph: Graph, types: dict[int, TensorType], choose: Chooser | None
) -> tuple[Callable[[list[torch.Tensor]], torch.Tensor], str] | None:
    """A linear whose weight is a parameter or a constant (`linear`, or `addmm`/`mm`/`matmul` on a
    [k, n] weight), as a call on its prepacked weight, when `choose` picks a packed route for its
    shape; None to run the node as it is."""
    ops = _operands(node) if choose is not None else None
    if ops is None or choose is None:
        return None
    x_at, w_at, b_at, transposed = ops
    w_id = node.inputs[w_at]
    if not _is_weight(graph, w_id):
        return None
    x, w = types[node.inputs[x_at]], types[w_id]
    if w.rank != 2 or x.rank < 2 or x.dtype != w.dtype or not x.is_contiguous or not w.is_contiguous:
        return None
    k, n = (w.shape[0], w.shape[1]) if transposed else (w.shape[1], w.shape[0])
    if b_at is not None and types[node.inputs[b_at]].shape != (n,):
        return None  # a bias of another shape (addmm's may be a full matrix)
    dtype = x.dtype.to_torch()
    if dtype not in (torch.float32, torch.bfloat16) or x.numel == 0 or k == 0:
        return None
    route = choose(x.numel // k, k, n, dtype)
    if route == "plain":
        return None

    def call(xs: list[torch.Tensor]) -> torch.Tensor:
        return linear(xs[x_at], xs[w_at], None if b_at is None else xs[b_at], route, transposed)

    return call, route
