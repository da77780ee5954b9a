"""Layout passes: transposes that cancel or fold into their consumer, and channels-last convolutions.

`eliminate_transposes` (pass `layout_transpose_eliminate`), in one forward sweep:
    permute(x, identity)              -> x
    permute(permute(x, p), q)         -> permute(x, p[q]), or x when that is the identity
    mm(a, permute(w, (1, 0)))         -> linear(a, w)                 (x @ w.T is linear's own form)
    addmm(b, a, permute(w, (1, 0)))   -> linear(a, w, b)   when alpha = beta = 1 and b is [n]
    linear(a, permute(w, (1, 0)))     -> mm(a, w) / addmm(b, a, w)  for 2-D a
Every other transpose stays a `permute` view: a fused kernel folds it into its index arithmetic and
torch's matmuls read a transposed operand in place, so neither copies it.

`choose_channels_last` (pass `channels_last`, seed 002 section 3.3): a 2-D convolution runs on
NHWC (channels-last) data when that is measured to pay on this machine, counting the conversions
it needs: the input into NHWC unless it comes from a channels-last convolution, and the output back
for consumers that index NCHW (fused kernels). The conv node gets `channels_last=true`; the
reference runtime then runs it on NHWC copies and returns the (logically equal) NHWC-strided
result. A convolution whose output is a graph output keeps NCHW, so callers get eager's strides.
The timings come from a `ConvTimer`; the default one times torch on this CPU per shape (cached).
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from autofusion.ir.graph import Graph, Node
from autofusion.ir.types import TensorType
from autofusion.passes.rebuild import Emitter, rebuild

log = logging.getLogger("autofusion.passes")


# ---- transposes ----------------------------------------------------------------------------------


def _permute_of(e: Emitter, vid: int) -> tuple[int, tuple[int, ...]] | None:
    node = e.producer(vid)
    if node is None or node.op != "permute":
        return None
    return node.inputs[0], tuple(node.attr("dims"))


def _transposed_weight(e: Emitter, vid: int) -> int | None:
    p = _permute_of(e, vid)
    return p[0] if p is not None and p[1] == (1, 0) else None


def _transpose_rewrite(e: Emitter, node: Node, ins: list[int]) -> Sequence[int] | None:
    if node.op == "permute":
        dims = tuple(node.attr("dims"))
        inner = _permute_of(e, ins[0])
        src = ins[0]
        if inner is not None:
            src, dims = inner[0], tuple(inner[1][d] for d in dims)
        if dims == tuple(range(len(dims))):
            return (src,)
        return (e("permute", [src], {"dims": dims}),) if inner is not None else None
    if node.op == "mm":
        w = _transposed_weight(e, ins[1])
        return None if w is None else (e("linear", [ins[0], w], {"has_bias": False}),)
    if node.op == "addmm":
        w = _transposed_weight(e, ins[2])
        bias_ok = e.type_of(ins[0]).shape == (node.out.type.shape[1],)
        if w is None or not bias_ok or node.attr("alpha") != 1 or node.attr("beta") != 1:
            return None
        return (e("linear", [ins[1], w, ins[0]], {"has_bias": True}),)
    if node.op == "linear" and e.type_of(ins[0]).rank == 2:
        w = _transposed_weight(e, ins[1])
        if w is None:
            return None
        if node.attr("has_bias"):
            return (e("addmm", [ins[2], ins[0], w]),)
        return (e("mm", [ins[0], w]),)
    return None


def _candidates(graph: Graph) -> bool:
    """Cheap superset test: a permute of a permute, an identity permute, or a matmul reading one."""
    permutes = {n.out.id for n in graph.nodes if n.op == "permute"}
    for n in graph.nodes:
        if n.op == "permute" and (n.inputs[0] in permutes or tuple(n.attr("dims")) == tuple(range(len(n.attr("dims"))))):
            return True
        if n.op in ("mm", "addmm", "linear") and any(i in permutes for i in n.inputs):
            return True
    return False


def eliminate_transposes(graph: Graph) -> Graph:
    if not _candidates(graph):
        return graph
    changed = False

    def rewrite(e: Emitter, node: Node, ins: list[int]) -> Sequence[int] | None:
        nonlocal changed
        out = _transpose_rewrite(e, node, ins)
        changed |= out is not None
        return out

    out = rebuild(graph, rewrite)
    return out if changed else graph


# ---- channels-last convolutions ------------------------------------------------------------------


@dataclass(frozen=True)
class ConvTiming:
    """Seconds per call on this machine for one convolution signature."""

    contiguous_s: float  # conv on NCHW input and weight
    channels_last_s: float  # conv on NHWC input, weight converted to NHWC each call (it is an input)
    to_nhwc_s: float  # converting the input NCHW -> NHWC
    to_nchw_s: float  # converting the output NHWC -> NCHW


ConvTimer = Callable[[Node, TensorType, TensorType], ConvTiming]
# Channels-last must measure at least 20 % faster, conversions included. Per-conv timings undersell
# what the whole plan pays (benchmarks/bench_passes.py, 2-core CPU: fp16 16->16 3x3 convs measure
# 0.84-0.89x NCHW with conversions, yet the resnet-block as a whole ran 0.95-1.10x with NHWC convs).
MARGIN = 0.8
MEASURE_BUDGET_S = 0.2  # compile time spent timing one convolution signature (roughly)


@functools.lru_cache(maxsize=256)
def _measure(x: TensorType, w: TensorType, attrs: tuple[tuple[str, Any], ...]) -> ConvTiming:
    import torch

    a = dict(attrs)
    cl = torch.channels_last
    gen = torch.Generator().manual_seed(0)
    xt = torch.randn(x.shape, generator=gen).to(x.dtype.to_torch())
    wt = torch.randn(w.shape, generator=gen).to(w.dtype.to_torch())

    def conv(inp: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return torch.convolution(inp, weight, None, list(a["stride"]), list(a["padding"]), list(a["dilation"]),
                                 False, list(a["output_padding"]), a["groups"])  # fmt: skip

    x_cl = xt.contiguous(memory_format=cl)
    y_cl = conv(x_cl, wt.contiguous(memory_format=cl))
    fns = {
        "contiguous_s": lambda: conv(xt, wt),
        "channels_last_s": lambda: conv(x_cl, wt.contiguous(memory_format=cl)),
        "to_nhwc_s": lambda: xt.contiguous(memory_format=cl),
        "to_nchw_s": lambda: y_cl.contiguous(),
    }
    best = dict.fromkeys(fns, float("inf"))
    with torch.no_grad():
        first = 0.0
        for k, f in fns.items():  # warm-up call, timed to size the measurement
            t0 = time.perf_counter()
            f()
            best[k] = time.perf_counter() - t0
            first += best[k]
        # About MEASURE_BUDGET_S per signature: large or slow (fp16 on CPU) convs get fewer rounds.
        rounds = max(1, min(5, int(MEASURE_BUDGET_S / max(first, 1e-9))))
        calls = 3 if first < 1e-3 else 1
        for _ in range(rounds):  # interleaved rounds, best of each: robust to other processes' load
            for k, f in fns.items():
                t0 = time.perf_counter()
                for _ in range(calls):
                    f()
                best[k] = min(best[k], (time.perf_counter() - t0) / calls)
    return ConvTiming(**best)


def measure_conv(node: Node, x: TensorType, w: TensorType) -> ConvTiming:
    """Time one convolution both ways with torch on this CPU (cached per signature for the process)."""
    attrs = tuple((k, v) for k, v in node.attrs if k not in ("has_bias", "channels_last"))
    return _measure(x.contiguous(), w.contiguous(), attrs)


def _eligible(node: Node, types: dict[int, TensorType]) -> str | None:
    """Why this node cannot run channels-last, or None when it can."""
    if node.op != "conv":
        return "not a convolution"
    x = types[node.inputs[0]]
    if x.rank != 4:
        return f"{x.rank - 2}-d convolution (channels_last is a 4-d memory format)"
    if node.attr("transposed"):
        return "transposed convolution"
    if not x.dtype.is_float:
        return f"{x.dtype.short} input"
    return None


def choose_channels_last(graph: Graph, timer: ConvTimer | None = None) -> Graph:
    timer = timer or measure_conv  # looked up per call, so tests can substitute the measurement
    types = graph.value_types()
    users = graph.users()
    outputs = set(graph.outputs)
    chosen: set[int] = set()  # value ids produced by a channels-last convolution
    picked: dict[str, bool] = {}
    for node in graph.nodes:
        if node.op != "conv":
            continue
        why = _eligible(node, types)
        if why is None and node.out.id in outputs:
            why = "its output is a graph output (callers get NCHW strides, as from eager)"
        if why is not None:
            log.info("channels_last: %s stays NCHW: %s", node.name, why)
            continue
        t = timer(node, types[node.inputs[0]], types[node.inputs[1]])
        convert_in = 0.0 if node.inputs[0] in chosen else t.to_nhwc_s
        consumers = users.get(node.out.id, [])
        convert_out = (
            0.0 if consumers and all(_eligible(u, types) is None for u in consumers) else t.to_nchw_s
        )
        cost = t.channels_last_s + convert_in + convert_out
        pays = cost < MARGIN * t.contiguous_s
        detail = (f"NHWC {t.channels_last_s * 1e6:.1f} us + conversions {(convert_in + convert_out) * 1e6:.1f} us "
                  f"vs NCHW {t.contiguous_s * 1e6:.1f} us")  # fmt: skip
        log.info("channels_last: %s %s: %s", node.name, "runs NHWC" if pays else "stays NCHW, NHWC does not pay",
                 detail)  # fmt: skip
        picked[node.name] = pays
        if pays:
            chosen.add(node.out.id)
    if not any(picked.values()):
        return graph

    def rewrite(e: Emitter, node: Node, ins: list[int]) -> Sequence[int] | None:
        if node.op == "conv" and picked.get(node.name):
            return e.b.add_node(
                "conv", ins, {**dict(node.attrs), "channels_last": True}, name=node.name, loc=node.loc
            )
        return None

    return rebuild(graph, rewrite)
