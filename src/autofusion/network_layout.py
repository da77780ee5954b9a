"""The whole-network layout candidate: every convolution chain in one layout, timed as the whole program.

In: a captured graph, its Options (conv_layout "auto") and a way to compile it (the compiler's
`compile_graph`). Out: the Options to compile it with: conv_layout left "auto" (each chain by its own
timing, passes/layout.py) or one forced layout, whichever ran the whole program fastest here; and the
decision as a `layout.network` event (`autofusion explain` shows it beside the chains' own).

Why: the layout pass times each chain of convolutions alone, with the conversions at its edges, but
the kernels between chains read what the chains write, and their speed depends on that layout, which a
chain's own timing cannot see. ConvNeXt's chains are one or two 7x7 depthwise convolutions separated by
LayerNorm kernels and Linear steps: per-chain timing picked a layout 1.28x slower than the best forced
one in one of two runs. Here the program itself is compiled with each forced layout (LAYOUTS) besides
"auto" and run end to end on the same inputs, rounds alternating (the order rotates), each candidate's
second-best round its time; a forced layout replaces "auto" only when it is at least MARGIN faster.

Run only for graphs with at least MIN_CHAINS convolution chains (one chain: its own timing already
covers it), when the machine is quiet (hw/busy.py), and each candidate's rounds must repeat within
REPEAT_TOLERANCE; a disturbed search decides nothing (auto, as before) and is not stored. The choice
is cached per graph and machine in the cache's "layouts" namespace, so a later compile takes it
without timing. Forced layouts (Options.conv_layout, conv_chain_layouts) skip the search.

Opt-in (`Options.layout_search`): measured quiet on the 2-core Xeon, the candidates' compiles took
ConvNeXt's cold compile from ~1.8 s to 8.2 s (batch 1) and 13.5 s (batch 8), 1.1-2.0x Inductor's,
for a time within noise of the per-chain choice; `autofusion tune` tries the same forced layouts.
"""

from __future__ import annotations

import contextvars
import dataclasses
import functools
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from autofusion.cache import Cache
from autofusion.config import Options
from autofusion.events import LayoutNetworkEvent, RouteTime
from autofusion.hw.busy import machine_busy
from autofusion.ir.graph import Graph, InputRole
from autofusion.ir.interpret import random_inputs
from autofusion.passes.layout import conv_chains
from autofusion.tuning import graph_hash, machine_fingerprint

log = logging.getLogger("autofusion.passes")

LAYOUTS = ("nchw", "channels_last", "blocked", "dnnl")  # Options.conv_layout's forced values
MIN_CHAINS = 2
MARGIN = 0.97  # a forced layout must run the whole program in at most this share of auto's time
ROUNDS = 7
BUDGET_S = 2.0  # timing rounds stop early (at least 3) once this is spent
REPEAT_TOLERANCE = 1.3

Timer = Callable[[dict[str, Callable[[], Any]]], dict[str, float] | None]
# Set while the candidates compile: their own compile must not search again.
_searching: contextvars.ContextVar[bool] = contextvars.ContextVar("af_network_layout", default=False)


def _inputs(graph: Graph) -> list[torch.Tensor]:
    """Inputs of the real shapes, tame values: weights small, 1-d parameters (norm scales, BN
    statistics) positive, so no layer overflows or takes a square root of a negative variance."""
    xs = random_inputs(graph, seed=0)
    out = []
    for gi, x in zip(graph.inputs, xs, strict=True):
        if gi.role is not InputRole.USER and x.is_floating_point():
            x = x.abs() + 0.5 if x.dim() <= 1 else x * 0.05
        out.append(x)
    return out


def time_rounds(runs: dict[str, Callable[[], Any]]) -> dict[str, float] | None:
    """Seconds per run of each candidate (its second-best round), or None when the rounds disagree."""
    for run in runs.values():
        run()  # first calls fold and pack weights
    order = list(runs)
    times: dict[str, list[float]] = {r: [] for r in runs}
    start = time.perf_counter()
    for i in range(ROUNDS):
        for r in order[i % len(order) :] + order[: i % len(order)]:
            t0 = time.perf_counter()
            runs[r]()
            times[r].append(time.perf_counter() - t0)
        if i >= 2 and time.perf_counter() - start > BUDGET_S:
            break
    ranked = {r: sorted(v) for r, v in times.items()}
    if any(v[2] > REPEAT_TOLERANCE * v[1] for v in ranked.values()):
        return None
    return {r: v[1] for r, v in ranked.items()}


def _key(graph: Graph) -> str:
    return (f"network|{graph_hash(graph)}|{machine_fingerprint()}|torch {torch.__version__}"
            f"|{torch.get_num_threads()} threads")  # fmt: skip


def choose(
    graph: Graph,
    options: Options,
    compile_fn: Callable[[Graph, Options], Any],
    cache: Cache | None,
    timer: Timer | None = None,
) -> tuple[Options, LayoutNetworkEvent | None]:
    """`options` with the conv_layout the whole-network search picked (module doc), and the decision as
    a `layout.network` event (None where the search does not apply: off, forced, under MIN_CHAINS)."""
    if not options.layout_search:
        return options, None
    if options.conv_layout != "auto" or options.conv_chain_layouts or _searching.get():
        return options, None
    chains = len(conv_chains(graph))
    if chains < MIN_CHAINS:
        return options, None
    decided = functools.partial(_decided, options, graph.name, chains)
    if not all(isinstance(d, int) for gi in graph.inputs for d in gi.value.type.shape):
        return decided("auto", "not searched", "a plan for many sizes: no one size to time")
    key = _key(graph)
    hit = cache.get_json("layouts", key) if cache is not None else None
    if isinstance(hit, dict) and hit.get("layout") in ("auto", *LAYOUTS):
        return decided(str(hit["layout"]), "cached", "cached", _route_times(hit.get("ms", {}), hit["layout"]))
    busy, seen = machine_busy()
    if busy and timer is None:
        return decided("auto", "not searched", f"the machine is busy ({seen})")
    token = _searching.set(True)
    try:
        runs = _candidates(graph, options, compile_fn)
        with torch.no_grad():
            times = (timer or time_rounds)(runs)
    except Exception as e:  # noqa: BLE001 - a candidate that fails to compile or run: auto, as before
        why = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        log.warning("network layout of %s not searched: %s", graph.name, why)
        return decided("auto", "not searched", f"a candidate failed ({why})")
    finally:
        _searching.reset(token)
    if times is None or "auto" not in times:
        return decided("auto", "not searched", "the timings disagree (another process took the cores)")
    best = min(times, key=lambda r: times[r])
    layout = best if best != "auto" and times[best] <= MARGIN * times["auto"] else "auto"
    ms = {r: s * 1e3 for r, s in times.items()}
    if cache is not None:
        cache.put_json("layouts", key, {"layout": layout, "ms": ms})
    shown = ", ".join(f"{r} {t:.2f} ms" for r, t in ms.items())
    return decided(layout, "measured", f"measured over {chains} chains: {shown}", _route_times(ms, layout))


def _route_times(ms: Any, layout: str) -> tuple[RouteTime, ...]:
    """Each candidate's time and why it was or was not taken (a forced layout needs MARGIN over auto)."""
    if not isinstance(ms, dict) or "auto" not in ms:
        return ()
    auto = float(ms["auto"])
    out = []
    for route, t in ms.items():
        if route == layout:
            why = "taken" if route == "auto" else f"{t / auto:.3f}x auto's time"
        elif route == "auto":
            why = f"a forced layout ran at most {MARGIN}x its time"
        else:
            why = f"{float(t) / auto:.3f}x auto's time, {MARGIN}x needed"
        out.append(RouteTime(str(route), float(t), route == layout, why))
    return tuple(out)


def _decided(
    options: Options,
    name: str,
    chains: int,
    layout: str,
    how: str,
    why: str,
    routes: tuple[RouteTime, ...] = (),
) -> tuple[Options, LayoutNetworkEvent]:
    log.info("network layout of %s: %s (%s: %s)", name, layout if layout != "auto" else "auto, per chain",
             how, why)  # fmt: skip
    chosen = options if layout == "auto" else dataclasses.replace(options, conv_layout=layout)
    return chosen, LayoutNetworkEvent(name, chains, layout, how, why, routes)


def _candidates(
    graph: Graph, options: Options, compile_fn: Callable[[Graph, Options], Any]
) -> dict[str, Callable[[], Any]]:
    xs = _inputs(graph)
    runs: dict[str, Callable[[], Any]] = {}
    for layout in ("auto", *LAYOUTS):
        program = compile_fn(graph, dataclasses.replace(options, conv_layout=layout))
        if program.stats.get("build_error"):
            continue  # it would run the reference runtime: not a candidate
        runs[layout] = functools.partial(program.executor.run, xs)
    return runs


__all__: Sequence[str] = ("LAYOUTS", "choose", "time_rounds")
