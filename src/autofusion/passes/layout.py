"""Layout passes: transposes that cancel or fold into their consumer, and channels-last convolutions.

`eliminate_transposes` (pass `layout_transpose_eliminate`), in one forward sweep:
    permute(x, identity)              -> x
    permute(permute(x, p), q)         -> permute(x, p[q]), or x when that is the identity
    mm(a, permute(w, (1, 0)))         -> linear(a, w)                 (x @ w.T is linear's own form)
    addmm(b, a, permute(w, (1, 0)))   -> linear(a, w, b)   when alpha = beta = 1 and b is [n]
    linear(a, permute(w, (1, 0)))     -> mm(a, w) / addmm(b, a, w)  for 2-D a
Every other transpose stays a `permute` view: a fused kernel folds it into its index arithmetic and
torch's matmuls read a transposed operand in place, so neither copies it.

`choose_layouts` (pass `channels_last`, run after the fusion rules): the route and memory layout of each
chain of 2-d convolutions. A chain is a connected group of convolutions (`conv` nodes and the rules'
`conv_bn_act` calls, whose BN, activation and residual add are already folded in) where one feeds
another's input or residual directly. Each chain runs one of runtime/library.py's routes: `aten` (NCHW,
as eager), `aten_cl` (torch's convolution on channels-last buffers), `onednn` (oneDNN's fused
convolution through ATen on channels-last buffers, weights prepacked in its blocked layout, activation
and residual as post-ops), `dnnl` (the same oneDNN convolutions called directly, their primitives
created once: runtime/dnnl_route.py), or any other route that list holds. The chain is timed as a unit
in every route (passes/layout_timing.py: its conv_bn_act calls in plan order with their real data flow,
absorbed paddings, and the conversions at its edges - an input from outside converted to NHWC, a result
read by something outside converted back, except by a `permute(0, 2, 3, 1)`, which reads a channels-last
buffer contiguously), and runs the fastest (routes tied with it: the first of PREFERRED); a channels-last
route must beat NCHW by MARGIN. Inside a
chain results stay channels-last: the convolutions become conv_bn_act calls whose declared type has NHWC
strides, so the generated kernels reading them index those strides
directly (no copy); a result that is a graph output is handed back NCHW, as eager's.
`Options.conv_layout` (every chain) and `conv_chain_layouts` (one chain, named by one of its
convolutions) force a layout instead of measuring (what `autofusion tune` searches).
Chains are timed only when the machine is quiet, and kept per chain signature in the cache's
"layouts" namespace (passes/layout_timing.py); a chain whose timing was taken under load stays NCHW
and nothing is cached, so a quiet compile measures again. Each chain's decision (every route's chain
time, why the winner won and why each other route lost) is a `layout.chain` event.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from autofusion.events import EventRecord, LayoutChainEvent, RouteTime
from autofusion.ir.analysis import uses
from autofusion.ir.catalog import VIEWS
from autofusion.ir.dtypes import DType
from autofusion.ir.graph import Arg, Graph, Node
from autofusion.ir.types import TensorType
from autofusion.passes import layout_timing
from autofusion.passes.layout_timing import (
    ChainConv,
    ChainEdge,
    ChainSpec,
    ChainTimer,
    ChainTiming,
    timer_for,
)

__all__ = ["choose_layouts", "conv_chains", "eliminate_transposes", "timer_for"]
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


# passes/rewrite/library.py's NAMESPACE spelled out: importing it would import passes.rewrite, which
# imports passes.manager, which imports this module (a cycle).
CONV_TARGET = "autofusion_rules.conv_bn_act.default"
# A channels-last route must measure at least 5 % faster than NCHW over the whole chain, conversions
# included (timing noise on a shared machine is about that size).
MARGIN = 0.95
# Channels-last routes within TIE of the fastest one count as tied, and the first of PREFERRED among them
# runs: a fixed order instead of whichever won this measurement (two compiles of one model on one
# machine flipped between oneDNN's two routes). `dnnl` first: its convolutions run inside SuperKernel
# entries with no per-call dispatch, which the chain timing (one library call per convolution) charges.
TIE = 0.03
PREFERRED = ("dnnl", "onednn", "aten_cl")


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


def choose_layouts(
    graph: Graph,
    timer: ChainTimer | None = None,
    mkldnn: bool = True,
    origin: list[int] | None = None,
    layout: str = "auto",
    chain_layouts: Sequence[str] = (),
    events: list[EventRecord] | None = None,
) -> Graph:
    """Pass `channels_last`: pick each chain's convolution route by the chain's measured time in each
    route (module doc). `mkldnn=False` leaves oneDNN's route out; `origin` receives, when the graph
    changes, each new node's index in `graph` (so node-indexed plans made before can be carried
    over). `layout` (Options.conv_layout) and `chain_layouts` (Options.conv_chain_layouts) force a
    chain's layout instead of measuring: "nchw", "channels_last" or "blocked" (oneDNN; channels_last
    where a chain cannot take oneDNN: fp16, or mkldnn=False). `events` receives one
    `layout.chain` record per chain (what `autofusion explain` shows)."""
    timer = timer or layout_timing.measure_chain  # looked up per call, so tests can substitute it
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
    chains = [sorted(chain) for chain in _chains(convs, prod)]
    named = {graph.nodes[k].name for chain in chains for k in chain}
    for entry in chain_layouts:
        if entry.partition("=")[0] not in named:
            log.info("layout: conv_chain_layouts entry %r names no routable convolution of %s", entry,
                     graph.name)  # fmt: skip
    for chain in chains:
        half = any(types[convs[k].x].dtype == DType.float16 for k in chain)
        left_out = {}
        if not mkldnn:
            left_out["onednn"] = left_out["dnnl"] = "left out: mkldnn=False"
        elif half:
            left_out["onednn"] = left_out["dnnl"] = (
                "left out: fp16 input (oneDNN's routes take fp32 and bf16)"
            )
        forced = _forced_layout(graph, chain, layout, chain_layouts)
        if forced != "auto":
            route, decision = _forced_route(forced, left_out)
        else:
            spec = _chain_spec(graph, chain, convs, types, prod, users, outputs, elided)
            route, decision = _decide(spec, timer(spec), left_out)
        first = graph.nodes[chain[0]].name
        log.info(
            "layout: chain of %d conv(s) [%s] runs %s (%s: %s)",
            len(chain),
            first,
            route,
            decision[0],
            decision[1],
        )
        if events is not None:
            events.append(LayoutChainEvent(graph.name, first, len(chain), route, *decision))
        if route == "aten":
            continue
        for k in chain:
            picked[k] = (route, not _hands_back(graph, k, set(chain), users, outputs))
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


Decision = tuple[str, str, tuple[RouteTime, ...]]  # how it was decided, why, each route's time


def _forced_route(forced: str, left_out: dict[str, str]) -> tuple[str, Decision]:
    route = LAYOUT_ROUTES[forced]
    why = f"forced: conv_layout {forced}"
    if route in left_out:
        why += f" ({route} {left_out[route]}: aten_cl instead)"
        route = "aten_cl"
    return route, ("forced", why, (RouteTime(route, None, True, why),))


def _decide(spec: ChainSpec, t: ChainTiming, left_out: dict[str, str]) -> tuple[str, Decision]:
    """The route a chain runs by its measured times, and the decision's record: every route's chain
    time, and a reason for each route not taken."""
    ms = {r: (s * 1e3 if math.isfinite(s) else None) for r, s in t.route_s.items()}
    note = f" ({t.note})" if t.note else ""
    base = t.route_s.get("aten", math.inf)
    if not t.reliable or not math.isfinite(base):
        # Timings taken under load say nothing about the layouts (ChainTiming.reliable): today's route.
        why = f"not measured on a quiet machine{note}: NCHW, as eager"
        times = tuple(
            RouteTime(r, ms.get(r), r == "aten", "chosen: " + why if r == "aten" else "not measured")
            for r in dict.fromkeys(("aten", *t.route_s, *layout_timing.measured_routes()))
        )
        return "aten", ("unmeasured", why, times)
    runnable = {r: s for r, s in t.route_s.items() if math.isfinite(s) and r not in left_out}
    fastest = min(runnable, key=lambda r: runnable[r])
    best = fastest
    if fastest != "aten":
        # (a tied route must clear NCHW's margin itself, or the fastest decides alone)
        near = (1 + TIE) * runnable[fastest]
        close = [r for r in PREFERRED if r in runnable and (runnable[r] <= near or r in t.tied)]
        tied = [r for r in close if runnable[r] < MARGIN * base]
        best = tied[0] if tied else fastest
    margin = best != "aten" and runnable[best] >= MARGIN * base
    if margin:
        best = "aten"
        why = (
            f"the fastest, {fastest} ({runnable[fastest] * 1e3:.3f} ms), is not {1 / MARGIN - 1:.0%} faster "
            f"than NCHW ({base * 1e3:.3f} ms): NCHW"
        )
    elif best == "aten":
        why = f"NCHW is the fastest ({base * 1e3:.3f} ms)"
    elif best != fastest:
        how = "not told apart from" if best in t.tied else f"within {TIE:.0%} of"
        why = (
            f"{runnable[best] * 1e3:.3f} ms, {how} the fastest, {fastest} "
            f"({runnable[fastest] * 1e3:.3f} ms), and first in the order ties take; "
            f"{base / runnable[best]:.2f}x faster than NCHW"
        )
    else:
        why = f"the fastest: {runnable[best] * 1e3:.3f} ms, {base / runnable[best]:.2f}x faster than NCHW"
    rows: list[RouteTime] = []
    for r, s in t.route_s.items():
        if r == best:
            reason = "chosen: " + why
        elif r in left_out:
            reason = left_out[r]
        elif not math.isfinite(s):
            reason = "cannot run this chain"
        elif margin and r == fastest:
            reason = (
                f"{base / s:.3f}x NCHW's speed: under the {1 / MARGIN - 1:.0%} margin a layout change needs"
            )
        elif r == fastest and r != best and best != "aten":
            reason = f"the fastest, but tied with {best}, which ties take first"
        else:
            reason = f"slower: {s / runnable[best]:.2f}x the chosen route's time"
        rows.append(RouteTime(r, ms[r], r == best, reason))
    return best, ("measured", why + note, tuple(rows))


def _chain_spec(
    graph: Graph,
    chain: list[int],
    convs: dict[int, ConvSpec],
    types: dict[int, TensorType],
    prod: dict[int, int],
    users: Any,
    outputs: set[int],
    elided: set[int],
) -> ChainSpec:
    """The chain (node indices in plan order) as the measurement runs it: each member's configuration
    and data flow, the chain's outside inputs, and which results leave it."""
    pos = {k: i for i, k in enumerate(chain)}
    inputs: list[tuple[tuple[int, ...], bool]] = []
    index_of: dict[int, int] = {}

    def source(v: int) -> int:
        p = prod.get(v)
        if p is not None and p in pos:
            return pos[p]
        if v not in index_of:
            t = types[v]
            index_of[v] = len(inputs)
            inputs.append(
                (t.shape, t.rank == 4 and not t.is_contiguous and t.strides == _nhwc_strides(t.shape))
            )
        return -1 - index_of[v]

    members = set(chain)
    out: list[ChainConv] = []
    edges: list[ChainEdge] = []
    for k in chain:
        c = convs[k]
        node = graph.nodes[k]
        v = node.out.id
        # Readers outside the chain (a padding every reader of which absorbs it is no reader: it goes);
        # a torch op reading only this result reads it in its layout (an edge, timed with the chain).
        outside = [
            graph.nodes[u] for u in users.get(v, ())
            if u not in elided and (u not in members or v not in (convs[u].x, convs[u].other))
        ]  # fmt: skip
        as_is = [
            u
            for u in outside
            if u.op == "extern" and u.attr("target") != CONV_TARGET and set(u.inputs) == {v}
        ]
        edges += [ChainEdge(len(out), str(u.attr("target")), tuple(u.attr("args")), tuple(u.attr("kwargs")))
                  for u in as_is]  # fmt: skip
        read_outside = v in outputs or any(
            not (u.op == "permute" and tuple(u.attr("dims")) == _TO_NHWC_READ)
            for u in outside
            if not any(u is a for a in as_is)
        )
        x = source(c.x)
        other = None if c.other is None else source(c.other)
        out.append(
            ChainConv(
                node.name,
                x,
                other,
                types[c.x].shape,
                types[c.w].shape,
                node.out.type.shape,
                c.stride,
                c.padding,
                c.dilation,
                c.groups,
                c.act,
                tuple(c.pre_pad),
                _hands_back(graph, k, members, users, outputs),
                read_outside,
            )
        )
    return ChainSpec(types[convs[chain[0]].x].dtype, tuple(inputs), tuple(out), tuple(edges))


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
