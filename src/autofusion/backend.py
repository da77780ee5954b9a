"""The `torch.compile(model, backend="autofusion")` entry (registered as a torch_dynamo_backends entry point).

In: the FX graph Dynamo captured and its example inputs. Out: a callable Dynamo installs in place of
the graph. Dynamo's graph is re-exported to functional ATen (non-strict: Dynamo already did the
capture), converted to IR and run by our runtime. What we cannot take (autograd, a failed capture)
runs Dynamo's graph eagerly, with the reason logged once (Dynamo calls the backend once per graph).

Symbolic shapes (`dynamic=None` after a size changed, or `dynamic=True`): the graph takes its sizes
as SymInt inputs and its tensors may be of any size Dynamo's guards allow. Each concrete call
signature gets a program of its own (`Specialized`, kept in a `signatures.SignatureCache`, at most
`max_signatures`), made the way the direct API's `dynamic=` makes one: the tensor dims Dynamo traced
as symbols are exported once as symbolic dims (the size inputs read off those dims, the other
scalars and `.item()` floats fixed per family of calls), that capture planned once
(`autofusion.reuse`), and each signature the instantiation of both where the recorded guards hold
(a real capture checks the first other size once, and a run against the reference interpreter the
plan's). Where that cannot be (no
symbolic tensor dim, a size of 0 or 1, a non-contiguous input, a failed symbolic capture, an
instantiation that disagrees, `plan_reuse=False`) the signature is captured and planned for itself,
its sizes and scalars baked in, the reason counted in the stats. Plans of shapes with the same loop
structure render the same C++ source and so share one built library.

How many graphs Dynamo hands over is Dynamo's choice, made before any backend is asked, and the
backend leaves Dynamo's config alone (torch.compile hides a backend's `backend_ctx_ctor`, so no
setting could be scoped to these frames). With `dynamic=None` (automatic dynamic shapes) the first
call is traced static and each later retrace makes the dims seen changing symbolic; a dim traced at
size 0 or 1 stays that size in its graph. Shapes where batch 1 comes first and seq changes before
batch give three graphs: static, seq-symbolic at batch 1, both symbolic. `dynamic=True` traces
symbolic from the first call: two graphs (batch 1, and the rest).

Plans are shared across those graphs (`shared_plans`). A graph Dynamo traced with fixed sizes is
planned through a symbolic capture all the same, every dim of 2 and up of its inputs (not of the
module's state) a symbol where the model lets it be (`dynamo_dims.static_dims`); each family's
symbolic capture is printed with its size symbols at canonical values and that fingerprint (with
the options) keys one `reuse.PlanReuse`, so a later graph of the same computation instantiates the
plan an earlier one made instead of planning again. What stays per graph: Dynamo's guards (a guard
that fails sends the call to another graph, or a retrace: a Python branch on a size is another
graph, whose capture prints otherwise and is planned for itself), the graph's own symbolic capture
and its export guards (the capture is what each call is bound to; only the plan, a function of the
printed graph, is shared), and each program's executor (its parameter fold, made from the call's
own tensors, so two models of one structure never share weights). A static graph's hot path
compares its inputs' shapes too, so its plan never runs for sizes Dynamo did not guard.

The callable returned always says what it is: `autofusion_graph` (the `CompiledGraph` of the last
signature, or None when it runs eagerly) and `autofusion_stats()` (the graph's stats, or
{"eager_fallback": reason}; a specialised graph adds the signature counts, `dynamo_symbolic` and
`plan_reuse`).
"""

from __future__ import annotations

import dataclasses
import logging
import operator
import threading
import time
import weakref
from collections.abc import Callable, Hashable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import torch
from torch.fx.experimental.symbolic_shapes import optimization_hint

from autofusion.api import CompiledGraph, signature_of
from autofusion.config import Options
from autofusion.errors import FrontendError
from autofusion.frontend.source import Captured
from autofusion.frontend.torch.capture import capture
from autofusion.frontend.torch.dynamo_dims import Family, SizeBound, static_dims, symbolic_dims
from autofusion.frontend.torch.mutation import SharedInputMemory, mutated_positions
from autofusion.ir.graph import InputRole
from autofusion.passes.rewrite import settle_options
from autofusion.signatures import SignatureCache

if TYPE_CHECKING:
    from autofusion.frontend.torch.symbolic import TorchTemplate
    from autofusion.reuse import PlanReuse

log = logging.getLogger(__name__)


# Graph inputs other than tensors that a specialisation bakes in: Dynamo's symbolic sizes and scalars.
SCALARS = (int, float, bool, torch.SymInt, torch.SymFloat, torch.SymBool)


def _has_symbols(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and any(not isinstance(n, int) for n in (*t.shape, *t.stride()))


def is_symbolic(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> bool:
    """Does the graph take symbolic sizes or scalars (then it is specialised per call signature)?
    Dynamo lifts every symbolic size to an input; the placeholders' own example values are read too,
    so a graph traced with symbolic sizes is never planned once as if its sizes were fixed."""
    if any(isinstance(t, SCALARS) or _has_symbols(t) for t in example_inputs):
        return True
    return any(
        n.op == "placeholder" and _has_symbols(n.meta.get("example_value", n.meta.get("val")))
        for n in gm.graph.nodes
    )


def eager_reason(example_inputs: Sequence[Any]) -> str | None:
    """Why this graph must run eagerly, or None when we can compile it."""
    for i, t in enumerate(example_inputs):
        if isinstance(t, SCALARS):
            continue
        if not isinstance(t, torch.Tensor):
            return f"input {i} is a {type(t).__name__}; compiled graphs take tensors, sizes and scalars"
        if t.device.type != "cpu":
            return f"input {i} is on {t.device}; the autofusion backend runs on the CPU"
    needs_grad = any(isinstance(t, torch.Tensor) and t.requires_grad for t in example_inputs)
    if torch.is_grad_enabled() and needs_grad:
        return ("the graph needs autograd (grad mode is on and an input or parameter requires grad); "
                "autofusion compiles inference graphs: run under torch.no_grad() or "
                "torch.inference_mode()")  # fmt: skip
    return None


def _module_state(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> set[int]:
    """Positions of the inputs that are the module's parameters and buffers: Dynamo passes them as graph
    inputs (its placeholder's source names the module attribute it read)."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    out: set[int] = set()
    for i, (node, t) in enumerate(zip(placeholders, example_inputs, strict=False)):
        arg = node.meta.get("grapharg")
        source = getattr(getattr(arg, "source", None), "name", "")
        name = source() if callable(source) else str(source)
        if isinstance(t, torch.nn.Parameter) or "._parameters[" in name or "._buffers[" in name:
            out.add(i)
    return out


def mark_parameters(captured: Captured, positions: set[int]) -> Captured:
    """`captured` with the graph inputs bound to the caller's tensors at `positions` marked as parameters
    (PARAM/BUFFER roles), so freezing folds what is computed from them. They are still read from the
    call's arguments every time; the fold's version guard sees a replaced or changed one."""
    graph = captured.conversion.graph
    inputs = list(graph.inputs)
    changed = False
    # A buffer the graph updates is not a constant: it keeps its USER role (nothing folds it).
    updated = set(mutated_positions(captured.mutations, captured.sources))
    for pos, (kind, v) in enumerate(captured.sources):
        if kind == "user" and v in positions and pos not in updated and inputs[pos].role is InputRole.USER:
            inputs[pos] = dataclasses.replace(inputs[pos], role=InputRole.PARAM)
            changed = True
    if not changed:
        return captured
    conversion = dataclasses.replace(captured.conversion, graph=graph.replace(inputs=tuple(inputs)))
    return dataclasses.replace(captured, conversion=conversion)


def _shared_memory_eager(call: Callable[..., Any], forward: Callable[..., Any]) -> Callable[..., Any]:
    def run(*args: Any) -> Any:
        try:
            return call(*args)
        except SharedInputMemory as e:
            log.warning("autofusion backend: running this call eagerly: %s", e)
            return forward(*args)

    return run


def autofusion_backend(
    gm: torch.fx.GraphModule, example_inputs: Sequence[Any], **kwargs: Any
) -> Callable[..., Any]:
    options = settle_options(Options.from_env(**(kwargs.get("options") or {})))
    reason = eager_reason(example_inputs)
    if reason is None and is_symbolic(gm, example_inputs):
        return Specialized(gm, example_inputs, options)
    if reason is None and _plan_symbolically(example_inputs, options):
        # A graph of fixed sizes, planned as the family its later retraces may be (`static_dims`).
        return Specialized(gm, example_inputs, options, traced_static=True)
    if reason is None:
        try:
            captured = capture(gm, list(example_inputs), "non-strict", "forward")
            compiled = CompiledGraph(mark_parameters(captured, _module_state(gm, example_inputs)), options)
        except FrontendError as e:
            reason = str(e)
    if reason is not None:
        log.warning("autofusion backend: running this graph eagerly: %s", reason)
        return _eager(gm, reason)

    # Dynamo calls what we return directly: hand it the compiled graph's own call (no wrapper of
    # ours between Dynamo's guards and the executor), unless the graph updates its inputs: a call
    # whose updated input shares memory with another runs Dynamo's graph instead.
    run = (
        compiled.call if not compiled.captured.mutations else _shared_memory_eager(compiled.call, gm.forward)
    )
    run.autofusion_graph = compiled  # type: ignore[attr-defined]  # for tests and reports, as above
    run.autofusion_stats = compiled.stats  # type: ignore[attr-defined]
    return run


def _plan_symbolically(example_inputs: Sequence[Any], options: Options) -> bool:
    """Is a graph Dynamo traced with fixed sizes planned through a symbolic capture (its plan shared
    with later graphs of the same computation)? With plan reuse and fusion on (without fusion there is
    no plan to share), tensors only, all contiguous (the symbolic capture takes contiguous inputs), and
    some dim of 2 or more to make symbolic; else it is planned for its sizes, as before."""
    if not (options.plan_reuse and options.fusion):
        return False
    tensors = [t for t in example_inputs if isinstance(t, torch.Tensor)]
    if len(tensors) != len(example_inputs) or not all(t.is_contiguous() for t in tensors):
        return False
    return any(int(n) >= 2 for t in tensors for n in t.shape)


@dataclasses.dataclass(eq=False)
class SharedPlans:
    """The plans of one computation, shared by every Dynamo graph whose symbolic capture prints alike
    (`reuse.fingerprint`): a model's static first graph and its retraces as sizes change."""

    reuse: PlanReuse
    key: str
    hints: dict[str, int]  # the sizes of the capture that first gave this key
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)


# By fingerprint, while some graph holds them (a `Specialized` keeps its own alive).
_SHARED: weakref.WeakValueDictionary[str, SharedPlans] = weakref.WeakValueDictionary()
_SHARED_LOCK = threading.Lock()


def shared_plans(template: TorchTemplate, options: Options) -> SharedPlans:
    """The shared plans of the computation `template` captured (made on first sight). Its graph is
    printed with every size symbol at a canonical value, so captures of other sizes print alike where
    every size is a symbol; a size a capture fixed to its hint prints as that hint and keeps it apart.
    A capture printing as one made at other sizes is trusted as the real capture of those sizes would
    be (`symbolic.trust_check` compares printed graphs the same way)."""
    from autofusion.ir.symbolic import substitute
    from autofusion.reuse import PlanReuse, fingerprint

    graph = template.captured.conversion.graph
    canonical = {name: 1_000_003 + 1_009 * k for k, name in enumerate(sorted(template.hints))}
    key = fingerprint(substitute(graph, canonical), options)
    with _SHARED_LOCK:
        found = _SHARED.get(key)
        if found is None:
            found = _SHARED[key] = SharedPlans(PlanReuse(), key, dict(template.hints))
    if found.hints != template.hints and not template.trusted:
        template.trusted = True
        log.info("autofusion backend: the capture for %s prints as the one for %s: trusted",
                 template.hints, found.hints)  # fmt: skip
    return found


def _eager(gm: torch.fx.GraphModule, reason: str) -> Callable[..., Any]:
    forward = gm.forward

    def eager(*args: Any) -> Any:
        return forward(*args)

    # Attributes on a function, read by tests and reports (mypy types no attributes on functions).
    eager.autofusion_graph = None  # type: ignore[attr-defined]
    eager.autofusion_stats = lambda: {"eager_fallback": reason}  # type: ignore[attr-defined]
    return eager


def _item_inputs(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> list[int]:
    """Inputs that are Python floats Dynamo passes as 0-d tensors (`dynamic=True` does not specialise
    floats: a LayerNorm's eps arrives so) and the graph only reads with `.item()`. A specialisation
    bakes their value in as it does sizes; exported as tensors, `.item()` would be data-dependent."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if len(placeholders) != len(example_inputs):
        return []
    return [
        i
        for i, (n, v) in enumerate(zip(placeholders, example_inputs, strict=True))
        if isinstance(v, torch.Tensor) and v.dim() == 0 and n.users and all(_is_item(u) for u in n.users)
    ]


def _is_item(node: torch.fx.Node) -> bool:
    return (node.op == "call_method" and node.target == "item") or (
        node.op == "call_function" and node.target in (torch.ops.aten.item.default, torch.Tensor.item)
    )


def _with_items(gm: torch.fx.GraphModule, values: dict[int, Any]) -> torch.fx.GraphModule:
    """A copy of `gm` whose `.item()` reads of the inputs in `values` are those Python values."""
    if not values:
        return gm
    graph = torch.fx.Graph()
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    out = graph.graph_copy(gm.graph, env)
    graph.output(out)
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    for i, value in values.items():
        for item in list(placeholders[i].users):

            def swap(a: torch.fx.Node, it: torch.fx.Node = item, v: Any = value) -> Any:
                return v if a is it else a

            for user in list(item.users):
                user.args = torch.fx.node.map_arg(user.args, swap)
                user.kwargs = torch.fx.node.map_arg(user.kwargs, swap)
            graph.erase_node(item)
    return torch.fx.GraphModule(gm, graph)


class _Bound(torch.nn.Module):
    """Dynamo's graph with one call's scalars (sizes) fixed, taking only its tensors: what torch.export
    captures for that signature. The graph is a submodule, so its own parameters stay parameters."""

    def __init__(self, gm: torch.fx.GraphModule, scalars: dict[int, Any], arity: int) -> None:
        super().__init__()
        self.gm, self.scalars, self.arity = gm, scalars, arity

    def forward(self, *tensors: torch.Tensor) -> Any:
        it = iter(tensors)
        return self.gm(*(self.scalars[i] if i in self.scalars else next(it) for i in range(self.arity)))


def _hint(value: Any) -> Any:
    """A symbolic value's example value (None when Dynamo gave none), without adding a guard."""
    if isinstance(value, torch.SymInt):
        return optimization_hint(value, fallback=None) if value.node.has_hint() else None
    if isinstance(value, (torch.SymFloat, torch.SymBool)):
        return value.node.hint
    return value


def _concrete(example_inputs: Sequence[Any]) -> list[Any] | None:
    """The example inputs with every symbolic size and scalar replaced by its hint (a tensor of
    symbolic shape by an empty one of the hinted shape and strides): the first signature, planned
    when the backend is called. None when some value has no hint (then the first call plans)."""
    out: list[Any] = []
    for v in example_inputs:
        if isinstance(v, torch.Tensor):
            if all(isinstance(n, int) for n in (*v.shape, *v.stride())):
                out.append(v)
                continue
            shape, stride = [_hint(n) for n in v.shape], [_hint(n) for n in v.stride()]
            if None in shape or None in stride:
                return None
            out.append(torch.empty_strided(shape, stride, dtype=v.dtype, device=v.device))
        else:
            h = _hint(v)
            if h is None:
                return None
            out.append(h)
    return out


def _watched(
    gm: torch.fx.GraphModule, example_inputs: Sequence[Any], scalar_pos: list[int], item_pos: list[int]
) -> list[int]:
    """The tensor inputs whose sizes or strides Dynamo traced as symbolic: the only ones whose shape
    may change between calls of this graph (Dynamo's guards check every static size, stride and
    dtype before it calls us, as they do for a graph planned once). All tensors when the
    placeholders do not line up with the inputs."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    tensors = [i for i in range(len(example_inputs)) if i not in scalar_pos and i not in item_pos]
    if len(placeholders) != len(example_inputs):
        return tensors
    out = []
    for i in tensors:
        meta = placeholders[i].meta.get("example_value", placeholders[i].meta.get("val"))
        if not isinstance(meta, torch.Tensor) or _has_symbols(meta) or _has_symbols(example_inputs[i]):
            out.append(i)
    return out


class _Hot(NamedTuple):
    """The last call's facts the hot path compares (`Specialized._hot_of`), and its compiled call."""

    scalars: tuple[Any, ...]
    types: list[type]
    items: tuple[Any, ...]
    watched: tuple[tuple[int, torch.Size, torch.dtype, tuple[int, ...]], ...]
    call: Callable[..., Any]


def _picker(positions: Sequence[int]) -> Callable[[Sequence[Any]], tuple[Any, ...]]:
    """args -> the tuple of args at `positions` (`operator.itemgetter`, which gives a bare value for
    one position and wants at least one)."""
    if not positions:
        return lambda args: ()
    if len(positions) == 1:
        (i,) = positions
        return lambda args: (args[i],)
    return operator.itemgetter(*positions)


class Specialized:
    """A Dynamo graph with symbolic sizes: a program per concrete call signature, each an instantiation
    of one symbolic capture and plan where it can be (`_instantiated`), else captured and planned for
    itself (`_for_itself`).

    The key is each tensor's shape, dtype and canonical strides (`api.signature_of`) plus the value and
    type of each scalar input: every fact a plan was made for, so a call differing in any of them
    plans anew instead of running a plan made for other sizes. Dynamo's own guards (which sizes may
    change at all) run before this callable does. The hot path (the same signature as the last call)
    compares only what Dynamo's guards leave free: the scalars, the baked floats and the tensors
    traced with symbolic sizes."""

    def __init__(self, gm: torch.fx.GraphModule, example_inputs: Sequence[Any], options: Options,
                 traced_static: bool = False) -> None:  # fmt: skip
        self.gm, self.options = gm, options
        self.traced_static = traced_static  # Dynamo traced fixed sizes (`static_dims`)
        self.arity = len(example_inputs)
        self.scalar_pos = [i for i, v in enumerate(example_inputs) if isinstance(v, SCALARS)]
        self.tensor_pos = [i for i in range(self.arity) if i not in self.scalar_pos]  # what the plan takes
        self.item_pos = _item_inputs(gm, example_inputs)
        state = _module_state(gm, example_inputs)  # freezing folds what is computed from them
        # Dynamo's guards fix a static graph's sizes; its hot path still compares its inputs' (a few
        # hundred ns), so a plan is never run for sizes other than its own.
        self.watch = (
            [i for i in self.tensor_pos if i not in state] if traced_static
            else _watched(gm, example_inputs, self.scalar_pos, self.item_pos)
        )  # fmt: skip
        self.param_pos = {k for k, i in enumerate(self.tensor_pos) if i in state}
        self.cache: SignatureCache[CompiledGraph | str] = SignatureCache(
            options.max_signatures, "torch.compile graph", self._describe
        )
        self.last: CompiledGraph | str | None = None
        self._lock = threading.Lock()
        # One symbolic capture per family of calls and one plan reused for its signatures; a str: why
        # each signature is captured and planned for itself.
        found = (
            (static_dims(example_inputs, self.tensor_pos, state), {}) if traced_static
            else symbolic_dims(gm, example_inputs, self.scalar_pos, self.tensor_pos)
        )  # fmt: skip
        self.symbolic: tuple[dict[int, dict[int, str]], dict[int, tuple[int, int]]] | str = (
            found if options.plan_reuse else "plan reuse is off (the plan_reuse option)"
        )
        self.families: dict[Hashable, Family] = {}
        # The plans this graph's families share with other graphs of the same computation (kept alive
        # here), and what this graph's signatures cost them.
        self.shared: list[SharedPlans] = []
        self.reuse_counts = {"planned": 0, "reused": 0, "checked": 0, "templates": 0, "from_other_graphs": 0}
        self.instantiation_s: list[float] = []  # how long each reused program took to make
        self.captures = 0  # torch.export captures (symbolic ones included)
        self.instantiated = 0  # signatures whose capture was a family's, instantiated
        self.for_themselves: dict[str, int] = {}  # why a signature was captured for itself
        # Built once: the hot path picks the scalars and the plan's tensors out of a call in C.
        self._pick_scalars = _picker(self.scalar_pos)
        self._pick_tensors = _picker(self.tensor_pos)
        # The last call's exact facts (`_hot_of`) and its compiled call: the common case is the same
        # shapes again.
        self._hot: _Hot | None = None
        first = _concrete(example_inputs)
        if first is not None:
            # Outside Dynamo's tracing context: torch.export would otherwise take Dynamo's symbolic
            # guards (written over Dynamo's `L[...]` sources) into the program it returns, and
            # retracing that program (decompositions, functionalised mutations) fails on them.
            with torch._guards.tracing(None):
                self._entry(first)

    @property
    def autofusion_graph(self) -> CompiledGraph | None:
        return self.last if isinstance(self.last, CompiledGraph) else None

    def autofusion_stats(self) -> dict[str, Any]:
        last = self.last
        out = (last.stats() if isinstance(last, CompiledGraph)
               else {"eager_fallback": last} if isinstance(last, str) else {})  # fmt: skip
        symbolic = {
            "on": not isinstance(self.symbolic, str),
            "why_off": self.symbolic if isinstance(self.symbolic, str) else None,
            "families": len(self.families),
            "templates": sum(1 for f in self.families.values() if f.template is not None),
            "families_off": sorted(f.off for f in self.families.values() if f.off is not None),
            "captures": self.captures,
            "instantiations": self.instantiated,
            "captured_for_themselves": dict(self.for_themselves),
        }
        return {**out, **self.cache.stats(), "dynamo_symbolic": symbolic, **self._reuse_stats()}

    def _reuse_stats(self) -> dict[str, Any]:
        """`plan_reuse` (as `reuse.PlanReuse.stats`): this graph's counts, and what its shared plans say."""
        if not self.shared:
            return {}
        merged: dict[str, Any] = {"off": [], "planned_again": {}, "trusted": False, "guards": 0,
                                  "cost_verdicts": 0}  # fmt: skip
        for sp in self.shared:
            st = sp.reuse.stats()["plan_reuse"]
            merged["off"] += st["off"]
            merged["trusted"] = merged["trusted"] or st["trusted"]
            merged["guards"] += st["guards"]
            merged["cost_verdicts"] += st["cost_verdicts"]
            for why, n in st["planned_again"].items():
                merged["planned_again"][why] = merged["planned_again"].get(why, 0) + n
        merged["off"] = sorted(merged["off"])
        last = self.instantiation_s[-1] if self.instantiation_s else 0.0
        counts = {**self.reuse_counts, **merged, "shared_with": len(self.shared), "last_s": last}
        return {"plan_reuse": counts}

    def _key(self, args: Sequence[Any]) -> Hashable:
        scalars = tuple((i, type(args[i]), args[i]) for i in self.scalar_pos)
        items = tuple((i, args[i].dtype, args[i].item()) for i in self.item_pos)
        return scalars + items, signature_of([args[i] for i in self.tensor_pos])

    @staticmethod
    def _describe(key: Hashable) -> str:
        assert isinstance(key, tuple)
        scalars, sig = key
        shapes = ", ".join(f"{str(d).removeprefix('torch.')}{list(s)}" for s, d, _ in sig)
        return shapes + "".join(f", arg{i}={v!r}" for i, _, v in scalars)

    def _hot_of(self, args: Sequence[Any], call: Callable[..., Any]) -> _Hot:
        """What the hot path compares, taken from a call: every scalar (value and type: 1, 1.0 and
        True are equal but baked in differently) and baked float, and the exact shape, dtype and
        strides of each tensor Dynamo lets change (`watch`)."""
        scalars = self._pick_scalars(args)
        return _Hot(
            scalars,
            list(map(type, scalars)),
            tuple(args[i].item() for i in self.item_pos),
            tuple((i, args[i].shape, args[i].dtype, args[i].stride()) for i in self.watch),
            call,
        )

    def _entry(self, args: Sequence[Any]) -> CompiledGraph | str:
        key = self._key(args)
        with self._lock:
            entry = self.cache.get(key)
            if entry is None:
                entry = self._instantiated(args, key) or self._for_itself(args, key)
                self.cache.put(key, entry)
            self.last = entry
            return entry

    def _for_itself(self, args: Sequence[Any], key: Hashable) -> CompiledGraph | str:
        """The signature of `args` captured and planned for its own sizes and scalars (or why it runs
        eagerly)."""
        self.captures += 1
        scalars = {i: args[i] for i in self.scalar_pos}
        # Fresh tensor objects: torch.export honours `mark_dynamic` marks on the caller's tensors and
        # would refuse the sizes this capture bakes in.
        tensors = [args[i].detach() for i in self.tensor_pos]
        gm = _with_items(self.gm, {i: args[i].item() for i in self.item_pos})
        bound = _Bound(gm, scalars, self.arity)
        try:
            captured = capture(bound, tensors, "non-strict", "forward")
            return CompiledGraph(mark_parameters(captured, self.param_pos), self.options)
        except FrontendError as e:
            log.warning("autofusion backend: running this graph eagerly for %s: %s", self._describe(key), e)
            return str(e)

    def _instantiated(self, args: Sequence[Any], key: Hashable) -> CompiledGraph | None:
        """The signature of `args` as an instantiation of its family's symbolic capture, its program
        from the family's plan where that plan's guards hold (`autofusion.reuse`); None (the reason
        counted and logged) where it is captured for itself."""
        from autofusion.frontend.torch.symbolic import NotSymbolic  # capture time only

        if isinstance(self.symbolic, str):
            return None
        try:
            return self._from_family(args)
        except NotSymbolic as e:
            why = str(e)
        except FrontendError as e:
            why = f"the instantiation failed: {e}"
        self.for_themselves[why] = self.for_themselves.get(why, 0) + 1
        log.info("autofusion backend: %s captured for itself: %s", self._describe(key), why)
        return None

    def _from_family(self, args: Sequence[Any]) -> CompiledGraph:
        from autofusion.frontend.torch.symbolic import NotSymbolic, make_template, trust_check

        assert not isinstance(self.symbolic, str)
        dims, sizes = self.symbolic
        for i, (k, d) in sizes.items():
            v = args[i]
            if type(v) is not int or v != args[self.tensor_pos[k]].shape[d]:
                raise NotSymbolic(f"size input {i} is {v!r}, not the size of the dim it was traced as")
        fixed = {i: args[i] for i in self.scalar_pos if i not in sizes}
        items = {i: args[i].item() for i in self.item_pos}
        dtypes = tuple(args[i].dtype for i in self.tensor_pos)
        family_key = (tuple((i, type(v), v) for i, v in fixed.items()), tuple(items.items()), dtypes)
        family = self.families.get(family_key)
        if family is None:
            bound = SizeBound(_with_items(self.gm, items), sizes, fixed, self.arity)
            family = self.families[family_key] = Family(bound)
        if family.off is not None:
            raise NotSymbolic(family.off)
        tensors = [args[i].detach() for i in self.tensor_pos]
        if not all(t.is_contiguous() for t in tensors):
            raise NotSymbolic("an input is not contiguous (the symbolic capture takes contiguous inputs)")

        def real_capture(dims: dict[int, dict[int, str]] | None = None) -> Captured:
            self.captures += 1
            captured = capture(family.bound, tensors, "non-strict", "forward", None, dims,
                               optional_dims=self.traced_static)  # fmt: skip
            return mark_parameters(captured, self.param_pos)

        if family.template is None:
            try:
                family.template = make_template(real_capture, dims, tensors)
            except FrontendError as e:
                family.off = f"the symbolic capture failed: {e}"
                raise NotSymbolic(family.off) from None
            log.info("autofusion backend: captured once with symbolic dims %s (hints; %d guards)",
                     family.template.hints, len(family.template.guards))  # fmt: skip
            if self.options.fusion:
                family.shared = shared_plans(family.template, self.options)
                if family.shared not in self.shared:
                    self.shared.append(family.shared)
        t = family.template
        env = t.bind(tensors)
        captured = t.instantiate(env)
        if not t.trusted and env != t.hints:
            # Once per family: a real capture of these sizes must give the same graph (or results).
            real = real_capture()
            why, _ = trust_check(t, captured, real, tensors)
            if why is not None:
                family.off = f"an instantiation for {env} differs from a capture of those sizes: {why}"
                log.info("autofusion backend: symbolic dims off: %s", family.off)
                return CompiledGraph(real, self.options)
        self.instantiated += 1
        program = None
        if self.options.fusion:
            program = self._program(family.shared, t, env, captured)
        return CompiledGraph(captured, self.options, program)

    def _program(self, shared: SharedPlans, t: TorchTemplate, env: dict[str, int], captured: Captured) -> Any:
        """The program for `env` from the plans shared by every graph of this computation, counted."""
        r = shared.reuse
        with shared.lock:
            before = (r.planned, r.reused, r.checked, sum(len(ts) for _, ts in r.templates.values()))
            t0 = time.perf_counter()
            program = r.program(t.captured.conversion.graph, env, captured.conversion.graph, self.options,
                                shared.key)  # fmt: skip
            took = time.perf_counter() - t0
            after = (r.planned, r.reused, r.checked, sum(len(ts) for _, ts in r.templates.values()))
            kind = r.last_kind
            first = r.templates[shared.key][0]
        for name, b, a in zip(("planned", "reused", "checked", "templates"), before, after, strict=True):
            self.reuse_counts[name] += a - b
        if kind in ("reuse", "checked", "hints"):
            self.instantiation_s.append(took)
            if first is not t.captured.conversion.graph:  # a plan another graph's capture made
                self.reuse_counts["from_other_graphs"] += 1
        return program

    def __call__(self, *args: Any) -> Any:
        hot = self._hot
        if hot is not None:
            # The facts `_hot_of` takes, compared without building them, the cheapest first: this
            # runs on every call, after Dynamo's own guards.
            scalars = self._pick_scalars(args)
            if scalars == hot.scalars and list(map(type, scalars)) == hot.types:
                for i, shape, dtype, stride in hot.watched:
                    t = args[i]
                    if t.shape != shape or t.dtype is not dtype or t.stride() != stride:
                        break
                else:
                    if not hot.items or tuple(args[i].item() for i in self.item_pos) == hot.items:
                        try:
                            return hot.call(*self._pick_tensors(args))
                        except SharedInputMemory as e:
                            return self._shared(e, args)
        entry = self._entry(args)
        if isinstance(entry, str):
            self._hot = None
            return self.gm.forward(*args)
        self._hot = self._hot_of(args, entry.call)
        try:
            return entry.call(*self._pick_tensors(args))
        except SharedInputMemory as e:
            return self._shared(e, args)

    def _shared(self, e: SharedInputMemory, args: Sequence[Any]) -> Any:
        """A call whose updated input shares memory with another input runs Dynamo's graph."""
        log.warning("autofusion backend: running this call eagerly: %s", e)
        return self.gm.forward(*args)
