"""Layout passes: transposes that cancel or fold into their consumer, and channels-last convolutions.

`eliminate_transposes` (pass `layout_transpose_eliminate`), in one forward sweep:
    permute(x, identity)              -> x
    permute(permute(x, p), q)         -> permute(x, p[q]), or x when that is the identity
    mm(a, permute(w, (1, 0)))         -> linear(a, w)                 (x @ w.T is linear's own form)
    addmm(b, a, permute(w, (1, 0)))   -> linear(a, w, b)   when alpha = beta = 1 and b is [n]
    linear(a, permute(w, (1, 0)))     -> mm(a, w) / addmm(b, a, w)  for 2-D a
Every other transpose stays a `permute` view: a fused kernel folds it into its index arithmetic and
torch's matmuls read a transposed operand in place, so neither copies it.

`choose_layouts` (pass `channels_last`, run after the fusion rules): the route and memory layout of
each chain of 2-d convolutions. A chain is a connected group of convolutions (`conv` nodes and the
rules' `conv_bn_act` calls, whose BN, activation and residual add are already folded in) where one
feeds another's input or residual directly. Each chain runs one of runtime/library.py's routes:
`aten` (NCHW, as eager), `aten_cl` (torch's convolution on channels-last buffers), `onednn`
(oneDNN's fused convolution on channels-last buffers, weights prepacked in its blocked layout,
activation and residual as post-ops) or `dnnl` (the same oneDNN convolutions called directly, their
primitives created once: runtime/dnnl_route.py). The chain's cost in a route is the sum of its
convolutions' times in that route (`ConvTimer`, each with its activation) plus the conversions the
route implies at the chain's edges: an input from outside converted to NHWC, and a result read by something
outside (a fused kernel indexing NCHW, a graph output) converted back - except a consumer that is a
`permute(0, 2, 3, 1)`, which reads a channels-last buffer contiguously. A channels-last route must
beat NCHW by MARGIN. Inside a chain results stay channels-last: the convolutions become conv_bn_act
calls whose declared type has NHWC strides, so the generated kernels reading them index those strides
directly (no copy); a result that is a graph output is handed back NCHW, as eager's.
`Options.conv_layout` (every chain) and `conv_chain_layouts` (one chain, named by one of its
convolutions) force a layout instead of measuring (what `autofusion tune` searches).
Timings are taken with torch on this CPU once per signature, only when the machine is quiet (other
processes using at most half a core, `hw/busy.py`, and each contender's second- and third-best
rounds agreeing within REPEAT_TOLERANCE); they are kept in the cache's "layouts" namespace
(`autofusion.cache`). A chain with a timing taken under load stays NCHW and nothing is cached, so a
quiet compile measures again.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from autofusion.cache import Cache, as_cache
from autofusion.hw.busy import machine_busy
from autofusion.hw.isa import features_digest
from autofusion.ir.analysis import uses
from autofusion.ir.catalog import VIEWS
from autofusion.ir.dtypes import DType
from autofusion.ir.graph import Arg, Graph, Node
from autofusion.ir.interpret import PY_TARGETS
from autofusion.ir.types import TensorType
from autofusion.passes.rebuild import Emitter, rebuild, rebuild_if_changed

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
        if n.op == "permute" and (
            n.inputs[0] in permutes or tuple(n.attr("dims")) == tuple(range(len(n.attr("dims"))))
        ):
            return True
        if n.op in ("mm", "addmm", "linear") and any(i in permutes for i in n.inputs):
            return True
    return False


def eliminate_transposes(graph: Graph) -> Graph:
    return rebuild_if_changed(graph, _transpose_rewrite) if _candidates(graph) else graph


# ---- convolution layouts, chosen per chain ---------------------------------------------------------


@dataclass(frozen=True)
class ConvTiming:
    """Seconds per call on this machine for one convolution signature, each route (conv + activation)."""

    aten_s: float  # torch.convolution on NCHW input and weight (+ the activation as a second pass)
    aten_cl_s: float  # torch.convolution on NHWC input, NHWC weights (converted once, as the library does)
    onednn_s: float  # oneDNN's fused convolution on NHWC input, prepacked weights (inf: unavailable)
    to_nhwc_s: float  # converting the input NCHW -> NHWC
    to_nchw_s: float  # converting the output NHWC -> NCHW
    # False when the timings are not to be trusted: the NCHW conv ran implausibly slowly (under
    # MIN_PLAUSIBLE_FLOPS), or a contender's second- and third-best rounds disagree by more than
    # REPEAT_TOLERANCE (other processes took the cores while it ran). Such timings decide this compile
    # only: they are never cached, so a later compile on a quieter machine measures again.
    reliable: bool = True
    dnnl_s: float = math.inf  # the same convolution through oneDNN directly (runtime/dnnl_route.py)

    def route_s(self, route: str) -> float:
        return {"aten": self.aten_s, "aten_cl": self.aten_cl_s, "onednn": self.onednn_s,
                "dnnl": self.dnnl_s}[route]  # fmt: skip


ConvTimer = Callable[["ConvSpec", TensorType, TensorType], ConvTiming]
ROUTES = ("aten", "aten_cl", "onednn", "dnnl")  # runtime/library.py's conv_bn_act routes
# passes/rewrite/library.py's NAMESPACE spelled out: importing it would import passes.rewrite, which
# imports passes.manager, which imports this module (a cycle).
CONV_TARGET = "autofusion_rules.conv_bn_act.default"
# A channels-last route must measure at least 5 % faster than NCHW over the whole chain, conversions
# included (timing noise on a shared machine is about that size).
MARGIN = 0.95
MEASURE_BUDGET_S = 0.15  # compile time spent timing one convolution signature (roughly)
SETTLE_S = 0.5  # at most this long warming up before timing
MIN_PLAUSIBLE_FLOPS = 1e9  # any CPU convolves faster than this; slower means the timings are disturbed
REPEAT_TOLERANCE = 1.3  # a contender's second-best round within this factor of its best: repeatable
MIN_ROUND_S = 2e-4  # each contender's share of a timed round, reached by calling it several times
ATTEMPTS = 3


def _conv_flops(x: TensorType, w: TensorType, a: dict[str, Any]) -> float:
    spatial = 1
    for i in range(2, x.rank):
        size = x.shape[i] + 2 * a["padding"][i - 2] - a["dilation"][i - 2] * (w.shape[i] - 1) - 1
        spatial *= max(0, size // a["stride"][i - 2] + 1)
    return 2.0 * x.shape[0] * w.shape[0] * spatial * w.shape[1] * w.shape[2] * w.shape[3]


Signature = tuple[TensorType, TensorType, tuple[tuple[str, Any], ...]]
_TIMINGS: dict[Signature, ConvTiming] = {}


def _measure(x: TensorType, w: TensorType, attrs: tuple[tuple[str, Any], ...]) -> ConvTiming:
    """The first of ATTEMPTS measurements that looks undisturbed; reliable ones are kept for the process."""
    key = (x, w, attrs)
    if key in _TIMINGS:
        return _TIMINGS[key]
    t = _measure_once(x, w, attrs)
    for _ in range(ATTEMPTS - 1):
        if t.reliable:
            break
        t = _measure_once(x, w, attrs)
    if t.reliable:
        _TIMINGS[key] = t
    return t


def _measure_once(x: TensorType, w: TensorType, attrs: tuple[tuple[str, Any], ...]) -> ConvTiming:
    import torch

    a = dict(attrs)
    flops = _conv_flops(x, w, a)
    cl = torch.channels_last
    gen = torch.Generator().manual_seed(0)
    dt = x.dtype.to_torch()
    xt = torch.randn(x.shape, generator=gen).to(dt)
    wt = torch.randn(w.shape, generator=gen).to(dt)
    bt = torch.randn(w.shape[0], generator=gen).to(dt)
    stride, padding, dilation = list(a["stride"]), list(a["padding"]), list(a["dilation"])
    groups, act = int(a["groups"]), str(a.get("act", "none"))

    def conv(inp: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        y = torch.convolution(inp, weight, bt, stride, padding, dilation, False, [0] * len(stride), groups)
        return y.relu_() if act != "none" else y  # the activation's pass over memory (any act costs ~so)

    x_cl, w_cl = xt.contiguous(memory_format=cl), wt.contiguous(memory_format=cl)
    y_cl = conv(x_cl, w_cl)
    fns: dict[str, Callable[[], object]] = {
        "aten_s": lambda: conv(xt, wt),
        "aten_cl_s": lambda: conv(x_cl, w_cl),
        "to_nhwc_s": lambda: xt.contiguous(memory_format=cl),
        "to_nchw_s": lambda: y_cl.contiguous(),
    }
    onednn = _onednn_call(x_cl, wt, bt, stride, padding, dilation, groups, act)
    if onednn is not None:
        fns["onednn_s"] = onednn
    dnnl = _dnnl_call(x_cl, wt, bt, stride, padding, dilation, groups, act)
    if dnnl is not None:
        fns["dnnl_s"] = dnnl
    rounds_of: dict[str, list[float]] = {k: [] for k in fns}
    with torch.no_grad():
        # Settle first: in a fresh process the first convolutions ran ~80 ms each for over a second
        # on the 2-core VM (then ~0.1 ms), so warm up until three calls in a row agree (at most
        # SETTLE_S). Then one untimed call of each contender, whose time sizes the measurement.
        recent: list[float] = []
        deadline = time.perf_counter() + SETTLE_S
        while time.perf_counter() < deadline:
            t0 = time.perf_counter()
            fns["aten_s"]()
            recent = [*recent, time.perf_counter() - t0][-3:]
            if len(recent) == 3 and max(recent) < 1.5 * min(recent):
                break
        steady = 0.0
        for k, f in fns.items():
            t0 = time.perf_counter()
            f()
            rounds_of[k].append(time.perf_counter() - t0)
            steady += rounds_of[k][-1]
        if flops / rounds_of["aten_s"][0] < MIN_PLAUSIBLE_FLOPS:
            return _timing(rounds_of, reliable=False)  # disturbed: no point timing more
        # About MEASURE_BUDGET_S per signature, and at least 4 interleaved rounds (best of each: robust
        # to other processes' load; the second- and third-best must agree, see ConvTiming.reliable).
        # Each contender is called often enough per round to take about MIN_ROUND_S: a layout
        # conversion of a small map takes a few us, where one call's timing is mostly timer and cache
        # noise (a 52-conv MobileNetV2 chain stayed NCHW because one such conversion's two best rounds
        # differed by more than REPEAT_TOLERANCE on a quiet machine).
        calls = {k: max(1, min(64, int(MIN_ROUND_S / max(v[0], 1e-7)))) for k, v in rounds_of.items()}
        steady = sum(calls[k] * v[0] for k, v in rounds_of.items())
        rounds = max(4, min(9, int(MEASURE_BUDGET_S / max(steady, 1e-9))))
        for _ in range(rounds):
            for k, f in fns.items():
                t0 = time.perf_counter()
                for _ in range(calls[k]):
                    f()
                rounds_of[k].append((time.perf_counter() - t0) / calls[k])
    best = min(rounds_of["aten_s"])
    plausible = flops / best >= MIN_PLAUSIBLE_FLOPS
    # The second- and third-best rounds must agree: one round that ran unusually fast (seen on a quiet
    # machine: a depthwise convolution at 382 us once, then 499-507 us) is not a disturbance.
    repeatable = all(sorted(v)[2] <= REPEAT_TOLERANCE * sorted(v)[1] for v in rounds_of.values())
    return _timing(rounds_of, reliable=plausible and repeatable)


def _onednn_call(x_cl: Any, w: Any, b: Any, stride: list[int], padding: list[int], dilation: list[int],
                 groups: int, act: str) -> Callable[[], object] | None:  # fmt: skip
    """oneDNN's fused convolution on prepacked weights, as the library calls it; None where unavailable."""
    import torch

    if not torch.backends.mkldnn.is_available() or x_cl.dtype not in (torch.float32, torch.bfloat16):
        return None
    attr = {"none": "none", "relu": "relu", "relu6": "hardtanh", "silu": "swish"}.get(act, "none")
    scalars = [0.0, 6.0] if act == "relu6" else []
    try:
        packed = torch.ops.mkldnn._reorder_convolution_weight(w, padding, stride, dilation, groups,
                                                              list(x_cl.shape))  # fmt: skip

        def call() -> object:
            return torch.ops.mkldnn._convolution_pointwise(
                x_cl, packed, b, padding, stride, dilation, groups, attr, scalars, ""
            )

        with torch.no_grad():
            call()
    except RuntimeError as e:
        log.info("layout: oneDNN declines a convolution (%s)", str(e).splitlines()[0])
        return None
    return call


def _dnnl_call(x_cl: Any, w: Any, b: Any, stride: list[int], padding: list[int], dilation: list[int],
               groups: int, act: str) -> Callable[[], object] | None:  # fmt: skip
    """The library's "dnnl" route, called as a plan calls it (its Python glue and primitive cache
    included; where oneDNN's library is missing that route runs "onednn", and so is timed); None when
    the library operators are not registered."""
    fn = PY_TARGETS.get(CONV_TARGET)
    if fn is None:
        return None

    def call() -> object:
        return fn(x_cl, w, b, None, None, None, None, None, 0.0, stride, padding, dilation, groups, act,
                  "dnnl", True)  # fmt: skip

    import torch

    try:
        with torch.no_grad():
            call()
    except RuntimeError as e:
        log.info("layout: the dnnl route declines a convolution (%s)", str(e).splitlines()[0])
        return None
    return call


def _timing(rounds_of: dict[str, list[float]], reliable: bool) -> ConvTiming:
    """Each contender's second-best round (its best while there are fewer than three)."""
    best = {k: sorted(v)[1] if len(v) >= 3 else min(v) for k, v in rounds_of.items()}
    return ConvTiming(best["aten_s"], best["aten_cl_s"], best.get("onednn_s", math.inf), best["to_nhwc_s"],
                      best["to_nchw_s"], reliable, best.get("dnnl_s", math.inf))  # fmt: skip


def _signature_attrs(c: ConvSpec) -> tuple[tuple[str, Any], ...]:
    return (("stride", c.stride), ("padding", c.padding), ("dilation", c.dilation), ("groups", c.groups),
            ("act", c.act))  # fmt: skip


UNMEASURED = ConvTiming(math.inf, math.inf, math.inf, math.inf, math.inf, reliable=False)


def measure_conv(node: ConvSpec, x: TensorType, w: TensorType) -> ConvTiming:
    """Time one convolution every route with torch on this CPU (kept per signature for the process);
    UNMEASURED when the machine is busy."""
    key = (x.contiguous(), w.contiguous(), _signature_attrs(node))
    if key in _TIMINGS:
        return _TIMINGS[key]
    busy, seen = machine_busy()
    if busy:
        log.info("layout: %s not timed: the machine is busy (%s)", node.name, seen)
        return UNMEASURED
    return _measure(*key)


class DiskCachedTimer:
    """`measure_conv` with its reliable results kept in the cache, one record per signature (the cache is
    per machine), so a signature is timed once, later compiles are fast and make the same choice. The
    key holds the torch version, thread count and CPU features, which change the timings."""

    def __init__(self, cache: Cache | str | os.PathLike[str]) -> None:
        self.cache = as_cache(cache)

    def __call__(self, node: ConvSpec, x: TensorType, w: TensorType) -> ConvTiming:
        import torch

        attrs = ",".join(f"{k}={v}" for k, v in _signature_attrs(node))
        key = (
            f"routes|{x.contiguous()}|{w.contiguous()}|{attrs}|torch {torch.__version__}"
            f"|{torch.get_num_threads()} threads|cpu {features_digest()}"
        )
        hit = self.cache.get_json("layouts", key)
        if isinstance(hit, list) and len(hit) == 6 and all(isinstance(v, (int, float)) for v in hit):
            v = [float(x) for x in hit]
            return ConvTiming(v[0], v[1], v[2], v[3], v[4], True, v[5])
        t = measure_conv(node, x, w)
        if not t.reliable:
            log.info("layout: timings of %s not cached: the machine was busy while measuring", node.name)
            return t  # measured again next time
        record = [t.aten_s, t.aten_cl_s, t.onednn_s if math.isfinite(t.onednn_s) else 1e9, t.to_nhwc_s,
                  t.to_nchw_s, t.dnnl_s if math.isfinite(t.dnnl_s) else 1e9]  # fmt: skip
        self.cache.put_json("layouts", key, record)
        return t


def timer_for(cache: Cache | str | None) -> ConvTimer:
    """The timer the pipeline uses: disk-cached in `cache` (a Cache or its root), else measured once
    per process."""
    return DiskCachedTimer(cache) if cache else measure_conv


@dataclass(frozen=True)
class ConvSpec:
    """A 2-d convolution the layout pass can route: a `conv` node or a `conv_bn_act` library call
    (after `_through_pad`: reading the input of a zero padding it absorbs)."""

    name: str
    x: int  # activation input
    other: int | None  # residual (conv_bn_act only)
    w: int
    stride: tuple[int, ...]
    padding: tuple[int, ...]
    dilation: tuple[int, ...]
    groups: int
    act: str
    # A zero padding of x before the convolution, in F.pad's order (w before, w after, h before, h
    # after): what an absorbed asymmetric `pad` leaves over once its symmetric part is in `padding`.
    pre_pad: tuple[int, ...] = ()


def _conv_of(node: Node) -> ConvSpec | None:
    if node.op == "conv":
        a = node.attr_dict
        if a["transposed"] or any(o != 0 for o in a["output_padding"]) or a.get("channels_last"):
            return None
        return ConvSpec(node.name, node.inputs[0], None, node.inputs[1], tuple(a["stride"]),
                        tuple(a["padding"]), tuple(a["dilation"]), int(a["groups"]), "none")  # fmt: skip
    if node.op == "extern" and node.attr("target") == CONV_TARGET:
        args = tuple(node.attr("args"))
        if len(args) not in (14, 16, 17) or not isinstance(args[0], Arg) or not isinstance(args[1], Arg):
            return None
        other = node.inputs[args[7].index] if isinstance(args[7], Arg) else None
        pre_pad = tuple(args[16] or ()) if len(args) == 17 else ()
        return ConvSpec(
            node.name,
            node.inputs[args[0].index],
            other,
            node.inputs[args[1].index],
            tuple(args[9]),
            tuple(args[10]),
            tuple(args[11]),
            int(args[12]),
            str(args[13]),
            pre_pad,
        )
    return None


def _eligible(node: Node, c: ConvSpec, types: dict[int, TensorType]) -> str | None:
    """Why this convolution cannot change layout, or None when it can."""
    x = types[c.x]
    if x.rank != 4:
        return f"{x.rank - 2}-d convolution (channels_last is a 4-d memory format)"
    if x.dtype not in (DType.float32, DType.bfloat16, DType.float16):
        return f"{x.dtype.short} input"
    if len(node.outputs) != 1:
        return "more than one output"
    return None


def _chains(convs: dict[int, ConvSpec], prod: dict[int, int]) -> list[list[int]]:
    """Connected groups of convolutions (node indices): one feeds another's input or residual directly."""
    parent = {k: k for k in convs}

    def find(k: int) -> int:
        while parent[k] != k:
            parent[k] = parent[parent[k]]
            k = parent[k]
        return k

    for k, c in convs.items():
        for v in (c.x, c.other):
            p = prod.get(v) if v is not None else None
            if p is not None and p in convs:
                parent[find(k)] = find(p)
    groups: dict[int, list[int]] = {}
    for k in convs:
        groups.setdefault(find(k), []).append(k)
    return list(groups.values())


_TO_NHWC_READ = (0, 2, 3, 1)  # a permute that reads NCHW as NHWC: contiguous on a channels-last buffer


# Options.conv_layout's names for the routes (the layouts they run in).
LAYOUT_ROUTES = {"nchw": "aten", "channels_last": "aten_cl", "blocked": "onednn", "dnnl": "dnnl"}


def _forced_layout(graph: Graph, chain: list[int], layout: str, chain_layouts: Sequence[str]) -> str:
    """The layout forced on `chain`: a `NODE=LAYOUT` entry naming one of its convolutions, else
    `layout` ("auto": none forced)."""
    names = {graph.nodes[k].name for k in chain}
    for entry in chain_layouts:
        node, _, forced = entry.partition("=")
        if node in names:
            return forced
    return layout


def conv_chains(graph: Graph) -> list[tuple[str, ...]]:
    """The chains of routable convolutions of `graph` (before or after this pass: a routed convolution
    keeps its name), each as its convolutions' names: what `conv_chain_layouts` entries name."""
    types = graph.value_types()
    prod = {o.id: k for k, n in enumerate(graph.nodes) for o in n.outputs}
    convs = {
        k: c
        for k, n in enumerate(graph.nodes)
        if (c := _conv_of(n)) is not None and _eligible(n, c, types) is None
    }
    return [tuple(graph.nodes[k].name for k in sorted(chain)) for chain in _chains(convs, prod)]


def choose_layouts(graph: Graph, timer: ConvTimer | None = None, mkldnn: bool = True,
                   origin: list[int] | None = None, layout: str = "auto",
                   chain_layouts: Sequence[str] = ()) -> Graph:  # fmt: skip
    """Pass `channels_last`: pick each chain's convolution route by its measured total (module doc).
    `mkldnn=False` leaves oneDNN's route out; `origin` receives, when the graph changes, each new
    node's index in `graph` (so node-indexed plans made before can be carried over). `layout`
    (Options.conv_layout) and `chain_layouts` (Options.conv_chain_layouts) force a chain's layout
    instead of measuring: "nchw", "channels_last" or "blocked" (oneDNN; channels_last where a chain
    cannot take oneDNN: fp16, or mkldnn=False)."""
    timer = timer or measure_conv  # looked up per call, so tests can substitute the measurement
    types = graph.value_types()
    users = uses(graph)
    outputs = set(graph.outputs)
    prod = {o.id: k for k, n in enumerate(graph.nodes) for o in n.outputs}
    convs: dict[int, ConvSpec] = {}
    for k, node in enumerate(graph.nodes):
        c = _conv_of(node)
        if c is None:
            continue
        why = _eligible(node, c, types)
        if why is not None:
            log.info("layout: %s stays NCHW: %s", node.name, why)
            continue
        convs[k] = c
    elided = _absorbed_pads(graph, convs, prod, users, outputs)
    raw = convs
    convs = {k: _through_pad(graph, c, prod, elided) for k, c in raw.items()}
    picked: dict[int, tuple[str, bool]] = {}  # node index -> (route, result channels-last)
    chains = _chains(convs, prod)
    named = {graph.nodes[k].name for chain in chains for k in chain}
    for entry in chain_layouts:
        if entry.partition("=")[0] not in named:
            log.info("layout: conv_chain_layouts entry %r names no routable convolution of %s", entry,
                     graph.name)  # fmt: skip
    for chain in chains:
        forced = _forced_layout(graph, chain, layout, chain_layouts)
        if forced != "auto":
            route = LAYOUT_ROUTES[forced]
            half = any(types[convs[k].x].dtype == DType.float16 for k in chain)
            if route in ("onednn", "dnnl") and (not mkldnn or half):
                route = "aten_cl"
            log.info("layout: chain of %d conv(s) [%s] runs %s (forced: %s)", len(chain),
                     graph.nodes[chain[0]].name, route, forced)  # fmt: skip
            if route != "aten":
                for k in chain:
                    picked[k] = (route, not _hands_back(graph, k, set(chain), users, outputs))
            continue
        timings: dict[int, ConvTiming] = {}
        for k in chain:
            c = convs[k]
            timings[k] = timer(c, _padded_input(types[c.x], c.pre_pad), types[c.w])
            if not timings[k].reliable:
                break  # the chain stays NCHW (below): no point timing the rest now
        names = ", ".join(graph.nodes[k].name for k in chain[:4]) + (", ..." if len(chain) > 4 else "")
        if not all(t.reliable for t in timings.values()):
            # Timings taken under load say nothing about the layouts (ConvTiming.reliable): today's route.
            log.info("layout: chain of %d conv(s) [%s] stays NCHW: not measured on a quiet machine",
                     len(chain), names)  # fmt: skip
            continue
        routes = [r for r in ROUTES if all(math.isfinite(t.route_s(r)) for t in timings.values())]
        if not mkldnn or any(types[convs[k].x].dtype == DType.float16 for k in chain):
            routes = [r for r in routes if r not in ("onednn", "dnnl")]
        cost = {r: _chain_cost(graph, chain, convs, timings, r, prod, users, outputs) for r in routes}
        best = min(cost, key=lambda r: cost[r])
        detail = ", ".join(f"{r} {cost[r] * 1e6:.1f} us" for r in routes)
        if best != "aten" and cost[best] >= MARGIN * cost["aten"]:
            best = "aten"
        log.info("layout: chain of %d conv(s) [%s] runs %s (%s, conversions included)", len(chain), names,
                 best, detail)  # fmt: skip
        if best == "aten":
            continue
        for k in chain:
            picked[k] = (best, not _hands_back(graph, k, set(chain), users, outputs))
    # An asymmetric padding goes into its readers only when every one of them runs channels-last
    # (there it saves the pad kernel's layout conversions); on the plain route it stays a `pad` node,
    # which fusion may merge with the elementwise work before it.
    for p in [p for p in elided if _pad_parts(graph.nodes[p], types)[1]]:  # type: ignore[index]
        readers = [k for k in convs if prod.get(raw[k].x) == p]
        if any(k not in picked for k in readers):
            elided.discard(p)
            for k in readers:
                convs[k] = raw[k]
    padded = {k for k in convs if convs[k] is not raw[k]}
    if not picked and not elided:
        return graph
    by_index = {id(graph.nodes[k]): k for k in (*picked, *padded)}
    gone = {id(graph.nodes[k]) for k in elided}

    def rewrite(e: Emitter, node: Node, ins: list[int]) -> Sequence[int] | None:
        if id(node) in gone:
            return (ins[0],)  # every reader absorbs this padding into its own: no node
        k = by_index.get(id(node))
        if k is None:
            return None
        route, cl = picked.get(k, ("aten", False))
        return (_routed(e, node, convs[k], ins, route, cl),)

    return rebuild(graph, rewrite, origin)


def _hands_back(graph: Graph, k: int, members: set[int], users: Any, outputs: set[int]) -> bool:
    """Whether convolution k's result must come back NCHW: it is a graph output, or a torch op outside
    the chain (an extern, a view) passes its layout on to a graph output. Callers get eager's strides."""
    out = graph.nodes[k].out.id
    if out in outputs:
        return True
    for u in users.get(out, ()):
        n = graph.nodes[u]
        passes_on = n.op == "extern" or n.op in VIEWS
        if u not in members and passes_on and any(o.id in outputs for o in n.outputs):
            return True
    return False


def _chain_cost(graph: Graph, chain: list[int], convs: dict[int, ConvSpec], timings: dict[int, ConvTiming],
                route: str, prod: dict[int, int], users: Any, outputs: set[int]) -> float:  # fmt: skip
    """The chain's convolutions in `route`, plus the conversions that route implies at its edges."""
    members = set(chain)
    total = 0.0
    for k in chain:
        t, c = timings[k], convs[k]
        total += t.route_s(route)
        if route == "aten":
            continue
        if prod.get(c.x) not in members:
            total += t.to_nhwc_s  # the chain's input comes in NCHW
        if c.other is not None and prod.get(c.other) not in members:
            total += t.to_nchw_s  # a residual of the output's size, converted likewise
        out = graph.nodes[k].out.id
        outside = [
            graph.nodes[u] for u in users.get(out, ())
            if u not in members or out not in (convs[u].x, convs[u].other)
        ]  # fmt: skip
        leaves = out in outputs or any(
            not (u.op == "permute" and tuple(u.attr("dims")) == _TO_NHWC_READ) for u in outside
        )
        if leaves:
            total += t.to_nchw_s  # read back as NCHW (a graph output, or a kernel's strided read)
    return total


def _routed(e: Emitter, node: Node, c: ConvSpec, ins: list[int], route: str, channels_last: bool) -> int:
    """`node` (convolution `c`) as a conv_bn_act call with `route`, its result channels-last when
    `channels_last`; a plain conv on the plain route stays a conv node (with any padding absorbed)."""
    t = node.out.type
    out = TensorType(t.dtype, t.shape, _nhwc_strides(t.shape)) if channels_last else t.contiguous()
    if node.op == "conv":
        a = node.attr_dict
        if route == "aten":
            return e.b.add_node("conv", ins, {**a, "padding": c.padding}, name=node.name, loc=node.loc)[0]
        tensors: list[int | None] = [ins[0], ins[1], ins[2] if a["has_bias"] else None] + [None] * 5
        literals: tuple[Any, ...] = (0.0, c.stride, c.padding, c.dilation, c.groups, "none")
    else:
        args = tuple(node.attr("args"))
        tensors = [ins[x.index] if isinstance(x, Arg) else None for x in args[:8]]
        literals = (args[8], c.stride, c.padding, c.dilation, c.groups, c.act)
    tail: tuple[Any, ...] = (tuple(c.pre_pad),) if c.pre_pad else ()
    return e.extern(CONV_TARGET, tensors, (*literals, route, channels_last, *tail), out,
                    reason="convolution route", name=node.name)  # fmt: skip


def _pad_parts(node: Node, types: Any) -> tuple[tuple[int, int], tuple[int, ...]] | None:
    """When `node` is a zero padding of a 4-d tensor's two spatial dims: its symmetric part (h, w), the
    same both sides of each (what a convolution's own padding does), and what is left over in F.pad's
    order (w before, w after, h before, h after), `()` for a symmetric padding. None for any other
    node."""
    if node.op != "pad" or node.attr("value") not in (0, 0.0) or types[node.inputs[0]].rank != 4:
        return None
    pads = tuple(node.attr("pads"))
    if len(pads) < 4 or any(p != 0 for p in pads[4:]) or any(p < 0 for p in pads[:4]):
        return None
    w_lo, w_hi, h_lo, h_hi = pads[:4]
    h, w = min(h_lo, h_hi), min(w_lo, w_hi)
    extra = (w_lo - w, w_hi - w, h_lo - h, h_hi - h)
    return (h, w), extra if any(extra) else ()


def _padded_input(x: TensorType, pre_pad: tuple[int, ...]) -> TensorType:
    """The type of x after `pre_pad` (what the convolution itself reads, so what is timed)."""
    if not pre_pad:
        return x
    n, c, h, w = x.shape
    return TensorType(x.dtype, (n, c, h + pre_pad[2] + pre_pad[3], w + pre_pad[0] + pre_pad[1]))


def _absorbed_pads(graph: Graph, convs: dict[int, ConvSpec], prod: dict[int, int], users: Any,
                   outputs: set[int]) -> set[int]:  # fmt: skip
    """Paddings every reader of which is a convolution taking it as its input: each absorbs it into
    its own padding (exactly the same values; one copy of the activations fewer, and a chain that
    is not broken by a kernel)."""
    types = graph.value_types()
    found: set[int] = set()
    for c in convs.values():
        p = prod.get(c.x)
        parts = _pad_parts(graph.nodes[p], types) if p is not None and p not in found else None
        if p is None or parts is None:
            continue
        v = graph.nodes[p].out.id
        readers = users.get(v, ())
        # (a reader padded first already would need the two paddings merged: not done)
        if v not in outputs and all(u in convs and convs[u].x == v and convs[u].other != v
                                    and not (parts[1] and convs[u].pre_pad) for u in readers):  # fmt: skip
            found.add(p)
    return found


def _through_pad(graph: Graph, c: ConvSpec, prod: dict[int, int], elided: set[int]) -> ConvSpec:
    p = prod.get(c.x)
    if p is None or p not in elided:
        return c
    pad = graph.nodes[p]
    parts = _pad_parts(pad, graph.value_types())
    assert parts is not None
    (h, w), extra = parts
    padding = (c.padding[0] + h, c.padding[1] + w)
    return dataclasses.replace(c, x=pad.inputs[0], padding=padding, pre_pad=extra or c.pre_pad)


def _nhwc_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    _, c, h, w = shape
    return (h * w * c, 1, w * c, c)
