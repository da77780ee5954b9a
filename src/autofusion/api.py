"""`autofusion.compile`: the user-facing compiled callable, one class over every kind of model.

In: a model (an nn.Module or function, or an ONNX model: a path, a ModelProto or its bytes) and,
optionally, example inputs. Out: a `CompiledModel`, called like the model. What is compiled is a
`Source` (`frontend/source.py`): `TorchSource` here, `OnnxSource` in `frontend/onnx/source.py`. Each
distinct input signature is captured (or converted) and compiled once and cached (at most
`max_signatures`, least recently used dropped first: `signatures.SignatureCache`); `dynamic=` says which
dims may change (`signatures.ShapeContract`). `.last`, `.graph`, `.stats`, `.events` and `.decisions`
describe the most recently used signature.

Torch models: inference only. When grad mode is on and an input requires grad, the call runs the
original model eagerly so autograd keeps working. A model that cannot be captured also runs eagerly.
Either way the reason is logged once at WARNING and kept in `.stats["eager_fallback"]` while the last
call ran eagerly. Signatures are shapes, dtypes and strides; strides count only where they address
different elements (`ir.types.strides_match`): strides of size-1 dims and of empty tensors carry no
meaning, so they neither split the cache nor make a call miss its compiled graph.

ONNX models have no eager route (a model that cannot be converted is an error) and are keyed by shapes
and dtypes; see `frontend/onnx/source.py`.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import threading
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch.utils import _pytree as pytree

from autofusion.config import Options
from autofusion.errors import FrontendError, InputMismatchError
from autofusion.frontend.source import Captured, SignatureChanged, Source, as_tensor, value_key
from autofusion.frontend.subgraph import (
    CompiledSubgraph,
    SubgraphCompiler,
    attach_compiler,
    reference_compiler,
)
from autofusion.frontend.torch.live import fetcher
from autofusion.frontend.torch.mutation import (
    SharedInputMemory,
    mutated_positions,
    overlap,
    returned_inputs,
    write_back,
)
from autofusion.frontend.torch.pytree import Node, call_tree, flatten, plain_result
from autofusion.ir.graph import Graph
from autofusion.ir.interpret import run_graph
from autofusion.ir.types import strides_match
from autofusion.runtime.buffers import owned, storages
from autofusion.runtime.program import Program
from autofusion.runtime.stamp import Stamp
from autofusion.signatures import ShapeContract, SignatureCache

if TYPE_CHECKING:  # a loaded package runs without the torch frontend's capture
    from autofusion.frontend.torch.symbolic import SymbolicTorch

log = logging.getLogger(__name__)


# The compiler and the torch frontend's capture load on first use: a loaded package (`autofusion.load`)
# runs its saved plans without them, and importing them costs more than loading and running the plan.
# Module-level functions, so tests can replace them (`monkeypatch.setattr(autofusion.api, "capture", ...)`).
def compile_graph(graph: Graph, options: Options) -> Program:
    """`autofusion.compiler.compile_graph`, imported on first use."""
    from autofusion.compiler import compile_graph as compile_now

    return compile_now(graph, options)


def capture(
    model: Any, inputs: Sequence[torch.Tensor], mode: str = "auto", name: str = "forward",
    layout: Node | None = None, dims: dict[int, dict[int, str]] | None = None,
) -> Captured:  # fmt: skip
    """`autofusion.frontend.torch.capture.capture`, imported on first use."""
    from autofusion.frontend.torch.capture import capture as capture_now

    return capture_now(model, inputs, mode, name, layout, dims)


# Per input: shape, dtype, and canonical strides (or the layout of a tensor without strides).
Signature = tuple[tuple[tuple[int, ...], torch.dtype, tuple[int, ...] | torch.layout], ...]
# The hot path's key: shape, dtype and the caller's exact strides (only dense inputs ever take that path).
ExactSignature = tuple[tuple[tuple[int, ...], torch.dtype, tuple[int, ...]], ...]


def canonical_strides(shape: Sequence[int], strides: Sequence[int]) -> tuple[int, ...]:
    """`strides` with every stride that addresses nothing (size-1 dims, empty tensors) set to 0."""
    if 0 in shape:
        return (0,) * len(shape)
    return tuple(0 if n == 1 else s for n, s in zip(shape, strides, strict=True))


def signature_of(inputs: Sequence[torch.Tensor]) -> Signature:
    """Shapes, dtypes and strides (a sparse or other non-strided tensor has none: its layout stands in)."""
    return tuple((tuple(t.shape), t.dtype, canonical_strides(t.shape, t.stride()) if t.layout is torch.strided
                  else t.layout) for t in inputs)  # fmt: skip


def _layout_reason(inputs: Sequence[torch.Tensor]) -> str | None:
    for k, t in enumerate(inputs):
        if t.layout is not torch.strided:
            return f"input {k} has layout {t.layout}; compiled graphs take dense (strided) tensors"
    return None


GRAD_REASON = (
    "an input requires grad and grad mode is on; autofusion compiles inference graphs, so this "
    "call runs eagerly. Use torch.no_grad() or torch.inference_mode() to run the compiled graph."
)


PARAM_GRAD_REASON = (
    "grad mode is on and the model's parameters require grad; the compiled graph computes "
    "inference results without autograd history (backward() on them fails). Use "
    "torch.no_grad() or torch.inference_mode() for inference, or train the model eagerly."
)


def subgraph_compiler(options: Options) -> SubgraphCompiler:
    """How the subgraphs control-flow externs run (If branches, Loop bodies: `frontend/subgraph.py`) are
    compiled: as the graph around them, with the same options, each once per input signature."""

    def compile_subgraph(graph: Graph) -> CompiledSubgraph:
        if not options.fusion:
            return reference_compiler(graph)
        program = compile_graph(graph, options)
        lock = threading.Lock()  # the executor reuses intermediate buffers across calls

        def run(xs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
            with lock:
                return program.executor.run(xs)

        return CompiledSubgraph(run, lambda: program.executor.generated_calls)

    return compile_subgraph


class CompiledGraph:
    """One captured signature: the IR, its fused program, how to bind inputs and rebuild outputs."""

    def __init__(self, captured: Captured, options: Options, program: Program | None = None) -> None:
        """`program`: one compiled before (a loaded package's, `autofusion.package`); else compiled here."""
        self.captured = captured
        attach_compiler(captured.conversion.graph, subgraph_compiler(options))
        self.program: Program | None = program
        if program is None and options.fusion:
            self.program = compile_graph(captured.conversion.graph, options)
        self._lock = threading.Lock()  # the executor reuses intermediate buffers across calls
        # (the call's tensors, its containers) -> the result; set by _make_call with `call`.
        self.run_with: Callable[[Sequence[torch.Tensor], Sequence[Any]], Any]
        self.call: Callable[..., Any] = self._make_call()

    @property
    def graph(self) -> Graph:
        return self.captured.conversion.graph

    def run(self, user: Sequence[torch.Tensor]) -> Any:
        return self.call(*user)

    def bind(self, user: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """The graph's inputs for one call: the user's tensors and the model's parameters and buffers."""
        return [user[v] if kind == "user" else v for kind, v in self.captured.bindings]

    def plan_weights(self) -> dict[str, torch.Tensor]:
        """The plan graph's inputs other than the caller's, by name, as they are now: the parameters and
        buffers and, with freezing, the values folded from them (what an export binds as weights)."""
        assert self.program is not None, "nothing was compiled (fusion is off)"
        bindings = self.captured.bindings
        # The folded values are computed from parameters and buffers alone: no caller tensor is read.
        values = self.program.plan_inputs([v if kind == "bound" else torch.empty(0) for kind, v in bindings])
        kinds = [kind for kind, _ in bindings] + ["bound"] * (len(values) - len(bindings))
        inputs = self.program.plan.graph.inputs
        return {gi.name: t for gi, t, kind in zip(inputs, values, kinds, strict=True) if kind == "bound"}

    @property
    def generated_calls(self) -> int:
        """Calls into generated code since this signature compiled (0: nothing generated ran)."""
        return self.program.executor.generated_calls if self.program is not None else 0

    def _make_call(self) -> Callable[..., Any]:
        """The per-call path as one closure over precomputed pieces: where the caller's tensors go
        among the bound parameters, the executor's run, and how outputs are rebuilt (a plain
        tensor or tuple/list needs no pytree work). Built once per signature."""
        sources = self.captured.sources
        template: list[Any] = [v if kind == "bound" else None for kind, v in sources]
        fill = [(pos, v) for pos, (kind, v) in enumerate(sources) if kind == "user"]
        # Parameters and buffers are looked up in the live module on every call (one generated
        # function of dict reads, `live.fetcher`): a weight assigned anew must be what the graph reads.
        live_pos = [pos for pos, (kind, _) in enumerate(sources) if kind == "live"]
        fetch = fetcher([v for kind, v in sources if kind == "live"])
        direct = all(kind == "user" and v == pos for pos, (kind, v) in enumerate(sources))
        graph = self.graph
        # Every input but the caller's is fixed between calls unless the model changes: one `Stamp`
        # over them per call tells the executor whether it may skip its per-parameter work.
        fixed = [pos for pos, (kind, _) in enumerate(sources) if kind != "user"]
        make_steady = getattr(self.program.executor, "steady", None) if self.program is not None else None
        steady = make_steady(fixed) if make_steady is not None and fixed else None
        stamp = Stamp(fixed)
        if self.program is not None:
            execute = self.program.executor.run
        else:  # the reference runtime returns constants themselves: hand out copies (`buffers.owned`)
            consts, every = storages(graph.constants.values()), list(range(len(graph.outputs)))

            def execute(a: Sequence[torch.Tensor]) -> list[torch.Tensor]:
                return owned(run_graph(graph, a), consts, every)

        lock = self._lock
        conversion, spec = self.captured.conversion, self.captured.out_spec
        n_mut = len(self.captured.mutations)
        user_leaves = conversion.output_leaves[n_mut:]
        values_only = all(kind == "value" and x == i + n_mut for i, (kind, x) in enumerate(user_leaves))
        n_out = len(user_leaves)
        structured = self.captured.rebuild
        # A result that is the graph's values themselves (a Dynamo graph's tuple, one tensor) is made
        # without walking its tree on every call.
        plain = plain_result(structured, n_out) if structured is not None and values_only else None
        rebuild: Callable[[list[torch.Tensor], Sequence[Any]], Any]
        if plain is torch.Tensor:

            def rebuild(values: list[torch.Tensor], containers: Sequence[Any]) -> Any:
                return values[n_mut]
        elif plain is not None:
            seq = plain

            def rebuild(values: list[torch.Tensor], containers: Sequence[Any]) -> Any:
                return seq(values[n_mut:] if n_mut else values)
        elif structured is not None:

            def rebuild(values: list[torch.Tensor], containers: Sequence[Any]) -> Any:
                return structured(conversion.leaves(values)[n_mut:], containers)
        elif values_only and spec.is_leaf() and n_out == 1:

            def rebuild(values: list[torch.Tensor], containers: Sequence[Any]) -> Any:
                return values[n_mut]
        elif (
            values_only
            and spec.type in (tuple, list)
            and spec.num_children == n_out
            and spec.num_leaves == n_out
        ):
            kind = spec.type

            def rebuild(values: list[torch.Tensor], containers: Sequence[Any]) -> Any:
                return kind(values[n_mut:] if n_mut else values)
        else:

            def rebuild(values: list[torch.Tensor], containers: Sequence[Any]) -> Any:
                return pytree.tree_unflatten(conversion.leaves(values)[n_mut:], spec)

        update = write_back(self.captured.mutations) if n_mut else None
        mutated = mutated_positions(self.captured.mutations, sources)
        # A result that is an updated input (`x.add_(1); return x`) is the caller's tensor, as in eager.
        returned = returned_inputs(self.captured.mutations, user_leaves, graph.outputs)

        def run(user: Sequence[torch.Tensor], containers: Sequence[Any]) -> Any:
            if direct:
                args: list[torch.Tensor] = user if isinstance(user, list) else [*user]
            else:
                args = template.copy()
                for pos, i in fill:
                    args[pos] = user[i]
                if live_pos:
                    # Unchecked: a call the stamp finds unchanged has the very tensors of a checked one.
                    for pos, t in zip(
                        live_pos, fetch() if steady is None else fetch.unchecked(), strict=True
                    ):
                        args[pos] = t
            with lock:
                same = steady is not None and stamp.same(args)
                if steady is not None and not same and live_pos:
                    for pos, t in zip(live_pos, fetch.check([args[pos] for pos in live_pos]), strict=True):
                        args[pos] = t
                if update is not None:
                    why = overlap(args, mutated)
                    if why is not None:
                        raise SharedInputMemory(why)
                if steady is None:
                    values = execute(args)
                else:
                    # Stamped before the run: an update the call writes into a buffer is a change.
                    if not same:
                        stamp.take(args)
                    try:
                        values = steady(args, same)
                    except BaseException:
                        stamp.clear()
                        raise
                if update is None:
                    return rebuild(values, containers)
                update(user, values)  # under the lock: a buffer's update is part of the call
            for out, get in returned:
                values[out] = get(user)
            return rebuild(values, containers)

        self.run_with = run  # (the call's tensors, its containers) -> the result

        def call(*user: torch.Tensor) -> Any:
            return run(user, ())

        return call

    def stats(self) -> dict[str, Any]:
        conv = self.captured.conversion
        g = self.graph
        externs = [n for n in g.nodes if n.op == "extern"]
        return {
            "ops": len(g.nodes),
            "extern_calls": len(externs),
            "op_counts": g.op_counts(),
            "lowered": dict(conv.lowered),
            "fallbacks": {f"{t} # reason: {r}": n for (t, r), n in sorted(conv.fallbacks.items())},
            "capture": self.captured.capture_mode,
            **(
                self.program.stats
                if self.program is not None
                else {"kernels": len(g.nodes), "fused_kernels": 0}
            ),
            "kernel_steps": len(self.program.plan.kernels) if self.program is not None else 0,
            "generated_calls": self.generated_calls,
        }


def model_name(model: Any) -> str:
    """What messages call a torch model: its class, or the function's name."""
    return (
        type(model).__name__ if isinstance(model, torch.nn.Module) else getattr(model, "__name__", "forward")
    )


_model_name = model_name  # the name tools knew it by


@dataclass(frozen=True)
class Structured:
    """A torch call that is more than positional tensors (`frontend/torch/pytree.py`)."""

    tensors: list[torch.Tensor]
    layout: Node  # hashable: equal for calls with the same structure and constants
    containers: list[Any]  # the call's containers, for a result that returns one of them


@dataclass(frozen=True)
class StructuredSignature:
    """A call's signature: its tree layout and the source's signature of its tensors."""

    layout: Node
    tensors: Hashable  # the source's signature of the call's tensors


class TorchSource:
    """An nn.Module or function, captured with torch.export once per signature
    (`frontend/torch/capture.py`)."""

    # Dims declared dynamic (input position -> dim -> name), set by `CompiledModel` from its
    # `dynamic=`: those are captured once with symbolic sizes (`frontend/torch/symbolic.py`). Class
    # defaults: a loaded package's source (`package/loading.py`) does not run this __init__.
    dims: dict[int, dict[int, str]] | None = None
    _symbolic: SymbolicTorch | None = None

    @property
    def symbolic(self) -> SymbolicTorch:
        if self._symbolic is None:
            from autofusion.frontend.torch.symbolic import SymbolicTorch  # capture time only

            self._symbolic = SymbolicTorch()
        return self._symbolic

    def __init__(self, model: Any, mode: str = "auto") -> None:
        if not callable(model):
            raise InputMismatchError(
                f"autofusion.compile needs an nn.Module or a function, got {type(model).__name__}"
            )
        self.model = model
        self.mode = mode
        self.name = model_name(model)
        self.input_names: list[str] = []
        self.arity: int | None = None  # fixed by the example inputs or the first compiled call

    @property
    def eager(self) -> Callable[..., Any] | None:
        return self.model

    def inputs(self, args: Sequence[Any]) -> list[torch.Tensor]:
        if self.arity is not None and len(args) != self.arity:
            raise InputMismatchError(f"expected {self.arity} input tensor(s), got {len(args)}")
        return [as_tensor(x, i) for i, x in enumerate(args)]

    def signature(self, inputs: Sequence[torch.Tensor]) -> Signature:
        return signature_of(inputs)

    def structure(self, args: Sequence[Any], kwargs: dict[str, Any]) -> Structured:
        """A call with keywords, constants or objects holding tensors: its tensors (CPU, as for a
        positional call) and its layout; the layout is part of the signature."""
        flat = flatten(call_tree(args, kwargs))
        tensors = [as_tensor(t, i) for i, t in enumerate(flat.tensors)]
        return Structured(tensors, flat.node, flat.containers)

    def signature_text(self, signature: Hashable) -> str:
        if isinstance(signature, StructuredSignature):
            signature = signature.tensors
        assert isinstance(signature, tuple)
        return ", ".join(f"{str(d).removeprefix('torch.')}{list(s)}" for s, d, _ in signature)

    def capture(self, inputs: Sequence[torch.Tensor] | None, signature: Hashable) -> Captured:
        assert inputs is not None, "a torch model is captured from tensors"
        why = _layout_reason(inputs)
        if why is not None:
            raise FrontendError(why)
        layout = signature.layout if isinstance(signature, StructuredSignature) else None
        self.symbolic.last_env = None
        from autofusion.frontend.torch.symbolic import NotSymbolic  # capture time only

        if self.dims and layout is None:
            try:
                return self._from_template(inputs)
            except NotSymbolic as e:
                why = str(e)
                self.symbolic.for_themselves[why] = self.symbolic.for_themselves.get(why, 0) + 1
                log.info(
                    "autofusion: %s: captured for %s: %s", self.name, [list(t.shape) for t in inputs], why
                )
        self.symbolic.captures += 1
        # Fresh tensor objects: torch.export honours `mark_dynamic` marks on the caller's tensors and
        # refuses a model that specialises a marked dim; each signature is captured for its sizes.
        return capture(self.model, [t.detach() for t in inputs], self.mode, self.name, layout)

    def _from_template(self, inputs: Sequence[torch.Tensor]) -> Captured:
        """The capture for `inputs` from the template (made at the first call), NotSymbolic where it
        does not apply."""
        from autofusion.frontend.torch.symbolic import NotSymbolic, make_template, trust_check

        sym, dims = self.symbolic, self.dims
        assert dims is not None
        if sym.off is not None:
            raise NotSymbolic(sym.off)
        if not all(t.is_contiguous() for t in inputs):
            raise NotSymbolic("an input is not contiguous (the template takes contiguous inputs)")
        tensors = [t.detach() for t in inputs]
        if sym.template is None:

            def symbolic_capture(dims: dict[int, dict[int, str]]) -> Captured:
                return capture(self.model, tensors, self.mode, self.name, None, dims)

            try:
                sym.captures += 1
                sym.template = make_template(symbolic_capture, dims, tensors)
            except NotSymbolic:
                raise  # sizes 0/1 at the first call: a later call may make the template
            except FrontendError as e:
                sym.off = f"the symbolic capture failed: {e}"
                raise NotSymbolic(sym.off) from None
            log.info("autofusion: %s: captured once with symbolic dims %s (hints; %d guards)", self.name,
                     sym.template.hints, len(sym.template.guards))  # fmt: skip
        t = sym.template
        env = t.bind(inputs)
        captured = t.instantiate(env)
        if not t.trusted and env != t.hints:
            # Once per model: a real capture at these sizes must give the same graph.
            sym.captures += 1
            real = capture(self.model, tensors, self.mode, self.name)
            why, other_graph = trust_check(t, captured, real, tensors)
            if why is not None:
                sym.off = f"an instantiation for {env} differs from a capture of those sizes: {why}"
                log.info("autofusion: %s: symbolic dims off: %s", self.name, sym.off)
                return real
            if other_graph:
                log.info("autofusion: %s: the instantiation for %s is another graph than a capture of those "
                         "sizes, with the same results", self.name, env)  # fmt: skip
        sym.last_env = env
        return captured

    def symbolic_capture(self) -> tuple[Graph, dict[str, int]] | None:
        """The symbolic graph the last capture instantiated and the names' sizes it took, or None when
        that capture was made for its own sizes (`autofusion.reuse` plans the symbolic graph once)."""
        sym = self.symbolic
        if sym.last_env is None or sym.template is None:
            return None
        return sym.template.captured.conversion.graph, dict(sym.last_env)

    def source_stats(self) -> dict[str, Any]:
        return self.symbolic.stats() if self.dims else {}

    def initial_signature(self) -> Hashable | None:
        return None

    def keyed(self, inputs: Sequence[torch.Tensor]) -> tuple[int, ...]:
        return ()  # torch.export specialises on no tensor's values

    def eager_reason(self, inputs: Sequence[torch.Tensor]) -> str | None:
        return GRAD_REASON if torch.is_grad_enabled() and any(t.requires_grad for t in inputs) else None

    def accepted(self, inputs: Sequence[torch.Tensor]) -> None:
        self.arity = len(inputs)

    def caution(self) -> str | None:
        if torch.is_grad_enabled() and isinstance(self.model, torch.nn.Module) \
                and any(p.requires_grad for p in self.model.parameters()):  # fmt: skip
            return PARAM_GRAD_REASON
        return None

    def not_compiled(self) -> str:
        return "nothing compiled yet: call the model once or pass example_inputs"


class CompiledModel:
    """The callable `autofusion.compile` returns: one compiled graph per input signature of a `Source`."""

    def __init__(
        self,
        model: Any,
        options: Options,
        example_inputs: Sequence[Any] | None = None,
        dynamic: Any = None,
        example_kwargs: dict[str, Any] | None = None,
        source: Source | None = None,
        settled: bool = False,
    ) -> None:
        """`source`: what to compile from, where the caller made it (a loaded package's); else the
        `Source` for `model`. `settled`: `options` were settled before (a loaded package's: its rule
        files are read again only when a new signature compiles, `compiler.plan_frozen`)."""
        self.source: Source = source if source is not None else source_for(model, options)
        if settled:
            self.options = options
        else:
            from autofusion.passes.rewrite import settle_options  # reads the rule files: compile time only

            self.options = settle_options(options)
        self.model = self.source.model  # the nn.Module or function, or the checked ModelProto
        self._cache: SignatureCache[CompiledGraph | str] = SignatureCache(
            options.max_signatures, self.source.name, self.source.signature_text
        )
        self.contract = ShapeContract(dynamic, self.source.input_names or positional_names(self.model))
        self._last: CompiledGraph | str | None = None
        self._reuse: Any = None  # `autofusion.reuse.PlanReuse`, made when a symbolic graph is planned
        self._warned: set[str] = set()
        self._eager_call: str | None = None  # why the last call ran eagerly (None: it ran compiled)
        self._lock = threading.RLock()  # the cache, for callers on several threads
        # The last compiled signature and its call, checked first on every call (the common case:
        # the same shapes again) before the general path builds a signature key.
        # With (position, value_key) of each input whose values the signature holds (`Source.keyed`).
        self._hot: tuple[ExactSignature, Callable[..., Any], tuple[tuple[int, Any], ...]] | None = None
        structure = self._structure(example_inputs or (), example_kwargs or {})
        if structure is not None and self.contract.active:
            raise InputMismatchError("dynamic= names positional tensors; these example inputs pass keywords, "
                                     "constants or objects")  # fmt: skip
        if structure is not None:
            key = StructuredSignature(structure.layout, self.source.signature(structure.tensors))
            self._entry(structure.tensors, key)
        elif example_inputs is not None:
            inputs = self.source.inputs(example_inputs)
            self.contract.fix([t.shape for t in inputs])
            self.source.accepted(inputs)
            self._entry(inputs, self.source.signature(inputs))
        else:
            sig = self.source.initial_signature()
            if sig is not None:
                # SignatureChanged: it needs the values of a call's inputs; compiled at the first call.
                with contextlib.suppress(SignatureChanged):
                    self._entry(None, sig)

    # -- introspection -------------------------------------------------------------------------
    @property
    def last(self) -> CompiledGraph | str | None:
        """What the most recently used signature became: its `CompiledGraph`, the reason it runs eagerly
        (a str), or None before the first call (and with no example inputs)."""
        return self._last

    @property
    def compiled(self) -> CompiledGraph | None:
        """The last signature's compiled graph (None before the first call or when it runs eagerly).
        Its `.program` holds the plan, events and executor; `.captured` how inputs are bound."""
        return self._last if isinstance(self._last, CompiledGraph) else None

    @property
    def graph(self) -> Graph:
        """The IR graph of the last signature, as captured (before passes: `compiled.program.plan.graph`)."""
        if isinstance(self._last, CompiledGraph):
            return self._last.graph
        if self._last is None:
            raise RuntimeError(self.source.not_compiled())
        raise RuntimeError(f"this signature runs eagerly, there is no graph: {self._last}")

    @property
    def stats(self) -> dict[str, Any]:
        """Counts for the last signature (ops, externs, kernels, fallbacks, generated calls) plus
        `signatures` (how many are cached), `signatures_planned` (how many were captured and planned,
        dropped ones included), `signature_hits`, `signatures_evicted` and `eager_fallback` (why the
        last call ran eagerly)."""
        if isinstance(self._last, CompiledGraph):
            out = self._last.stats()
        elif self._last is None:
            out = {"ops": 0, "extern_calls": 0}
        else:
            out = {"ops": 0, "extern_calls": 0, "eager_fallback": self._last}
        if self._eager_call is not None:
            out["eager_fallback"] = self._eager_call
        out.update(self._cache.stats())
        source_stats = getattr(self.source, "source_stats", None)  # ONNX: symbolic dims
        if source_stats is not None:
            out.update(source_stats())
        if self._reuse is not None:
            out.update(self._reuse.stats())
        return out

    @property
    def events(self) -> list[dict[str, Any]]:
        """Every structured event of the last signature's compile (autofusion.events), in order."""
        if isinstance(self._last, CompiledGraph) and self._last.program is not None:
            return list(self._last.program.events)
        return []

    @property
    def decisions(self) -> list[dict[str, Any]]:
        """The fusion decisions (accepted and rejected, with NF code, rule and numbers), solver order."""
        return [e for e in self.events if e["event"] in ("fusion.candidate", "fusion.recompute")]

    @property
    def input_names(self) -> list[str]:
        """The caller's inputs by name, in call order: the last compiled graph's (FX placeholder names for
        a torch model), else those the source declares (an ONNX model's graph inputs)."""
        cg = self.compiled
        if cg is None:
            return list(self.source.input_names)
        names = cg.captured.conversion.input_names
        users = sorted((v, names[pos]) for pos, (kind, v) in enumerate(cg.captured.sources) if kind == "user")
        return [n for _, n in users]

    def entries(self) -> list[tuple[Hashable, CompiledGraph | str]]:
        """Every cached signature and what it became (its `CompiledGraph`, or why it runs eagerly),
        least recently used first (what `autofusion.save` writes)."""
        return self._cache.items()

    def adopt(self, signature: Hashable, entry: CompiledGraph) -> None:
        """Keep `entry`, compiled elsewhere (a loaded package's), as the plan of `signature`; it becomes
        the last used one."""
        with self._lock:
            self._cache.put(signature, entry)
            self._last = entry

    # -- calling -----------------------------------------------------------------------------
    def _entry(self, inputs: Sequence[torch.Tensor] | None, sig: Hashable) -> CompiledGraph | str:
        with self._lock:
            entry = self._cache.get(sig)
            if entry is None:
                entry, sig = self._compile(inputs, sig)
                self._cache.put(sig, entry)
            self._last = entry
            return entry

    def _compile(
        self, inputs: Sequence[torch.Tensor] | None, sig: Hashable
    ) -> tuple[CompiledGraph | str, Hashable]:
        """The compiled graph for `sig`, and the signature it is for: a source that learns at capture
        that its signature must hold more (`SignatureChanged`) gives it again, with those inputs' values."""
        retries = len(inputs or ())  # each change binds at least one input more
        if isinstance(self.source, TorchSource) and self.source.dims is None:
            self.source.dims = self._dynamic_dims()
        while True:
            try:
                captured = self.source.capture(inputs, sig)
                return CompiledGraph(captured, self.options, self._reused_program(captured)), sig
            except SignatureChanged:
                if inputs is None or isinstance(sig, StructuredSignature) or retries == 0:
                    raise
                retries -= 1
                sig = self.source.signature(inputs)
            except FrontendError as e:
                if self.source.eager is None:
                    raise
                log.warning("autofusion: running %s eagerly for inputs %s: %s", self.source.name,
                            self.source.signature_text(sig), e)  # fmt: skip
                return str(e), sig

    def _dynamic_dims(self) -> dict[int, dict[int, str]]:
        """The dims `dynamic=` declares (fixed by now), named (an unnamed one after its place), for a
        symbolic capture; empty without a contract or with plan reuse off."""
        c = self.contract
        if not c.active or c.reference is None or not self.options.plan_reuse or not self.options.fusion:
            return {}
        return {pos: {d: spec.name or f"input{pos}_dim{d}" for d, spec in dims.items()}
                for pos, dims in c.dims.items() if dims}  # fmt: skip

    def _reused_program(self, captured: Captured) -> Program | None:
        """The program of a capture that instantiated the source's symbolic graph, from that graph's one
        plan where its guards hold (`autofusion.reuse`); None: compiled for itself as usual."""
        find = getattr(self.source, "symbolic_capture", None)
        found = find() if find is not None and self.options.fusion and self.options.plan_reuse else None
        if found is None:
            return None
        if self._reuse is None:
            from autofusion.reuse import PlanReuse  # the compiler: compile time only

            self._reuse = PlanReuse()
        return self._reuse.program(found[0], found[1], captured.conversion.graph, self.options)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        hot = self._hot
        if hot is not None and not kwargs and len(args) == len(hot[0]):
            for x, (shape, dtype, stride) in zip(args, hot[0], strict=True):
                if type(x) is not torch.Tensor or x.shape != shape or x.dtype != dtype \
                        or (x.stride() != stride and not strides_match(shape, x.stride(), stride)) \
                        or not x.is_cpu or (x.requires_grad and torch.is_grad_enabled()):  # fmt: skip
                    break
            else:
                # An input the graph was specialised on (a shape given as a tensor) must hold its value.
                if not hot[2] or all(value_key(args[p]) == v for p, v in hot[2]):
                    try:
                        return hot[1](*args)
                    except SharedInputMemory as e:
                        return self._eager_shared(str(e), args, kwargs)
        source = self.source
        structure = self._structure(args, kwargs)
        inputs = source.inputs(args) if structure is None else structure.tensors
        why = source.eager_reason(inputs)
        if why is not None:
            assert source.eager is not None, f"{source.name} has an eager reason but no eager route"
            self._warn_once(f"autofusion: {source.name}: {why}")
            self._eager_call, self._hot = why, None  # the next call takes this path again
            return source.eager(*args, **kwargs)
        self._eager_call = None
        if self.contract.active:  # the hot path above only takes signatures that passed this check
            if structure is not None:
                raise InputMismatchError("dynamic= names positional tensors; this call passes "
                                         "keywords, constants or objects")  # fmt: skip
            shapes = [t.shape for t in inputs]
            self.contract.fix(shapes)
            self.contract.check(shapes)
        sig = source.signature(inputs)
        entry = self._entry(inputs, sig if structure is None else StructuredSignature(structure.layout, sig))
        if isinstance(entry, str):
            self._hot = None
            assert source.eager is not None
            return source.eager(*args, **kwargs)
        if structure is None:
            source.accepted(inputs)
        caution = source.caution()
        if caution is not None:
            self._warn_once(f"autofusion: {source.name}: {caution}")
        # The hot check compares exact strides first: the caller's own, not the canonical key's.
        self._hot = None if structure is not None else (
            tuple((tuple(t.shape), t.dtype, tuple(t.stride())) for t in inputs), entry.call,
            tuple((p, value_key(inputs[p])) for p in source.keyed(inputs)))  # fmt: skip
        try:
            return entry.run_with(inputs, () if structure is None else structure.containers)
        except SharedInputMemory as e:
            return self._eager_shared(str(e), args, kwargs)

    def _structure(self, args: Sequence[Any], kwargs: dict[str, Any]) -> Structured | None:
        """The call's structure when it is more than positional tensors (torch models only), else None."""
        if not kwargs and all(isinstance(x, (torch.Tensor, np.ndarray)) for x in args):
            return None
        if not isinstance(self.source, TorchSource):
            raise InputMismatchError(f"{self.source.name} takes positional tensors only"
                                     + (f"; got keyword(s) {sorted(kwargs)}" if kwargs else ""))  # fmt: skip
        return self.source.structure(args, kwargs)

    def _eager_shared(self, why: str, args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
        assert self.source.eager is not None, "only torch graphs update their inputs"
        self._warn_once(f"autofusion: {self.source.name}: {why}")
        self._eager_call, self._hot = why, None
        return self.source.eager(*args, **kwargs)

    def _warn_once(self, message: str) -> None:
        if message not in self._warned:
            self._warned.add(message)
            log.warning(message)


CompiledOnnxModel = CompiledModel  # one class for every source; the old name of its ONNX use


def is_onnx_source(model: Any) -> bool:
    """True for what `autofusion.compile` reads as an ONNX model: a path, a ModelProto or its bytes."""
    from autofusion.frontend.onnx.source import is_onnx_source as is_onnx  # imports onnx: only when asked

    return is_onnx(model)


def source_for(model: Any, options: Options) -> Source:
    """The `Source` for what `autofusion.compile` was given."""
    if is_onnx_source(model):
        from autofusion.frontend.onnx.source import OnnxSource

        return OnnxSource(model)
    return TorchSource(model, options.capture)


def positional_names(model: Any) -> list[str]:
    """The names of a torch model's positional parameters (what `dynamic=` may name); [] when unknown."""
    fn = model.forward if isinstance(model, torch.nn.Module) else model
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # builtins and some C callables have no signature
        return []
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return [p.name for p in params if p.kind in kinds]


def compile(
    model: Any,
    example_inputs: Sequence[Any] | None = None,
    kwargs: dict[str, Any] | None = None,
    *,
    dynamic: Any = None,
    **options: Any,
) -> Any:
    """Compile `model` for inference: an nn.Module or function, or an ONNX model (a path, a ModelProto
    or its bytes; see `autofusion.frontend.onnx.source`). With `example_inputs` (positional) and/or
    `kwargs` (keyword arguments of a torch model), compiles for that call now; other signatures
    compile on first use (each is planned for its own shapes and kept, at most `max_signatures` of
    them). `dynamic` says which dims may change (`signatures.ShapeContract`):
    None or True any, False none, or `{"x": {0: "batch"}}` / torch.export Dims for those dims only (a
    call changing another dim raises InputMismatchError). Options: see `autofusion.config.Options`."""
    return CompiledModel(model, Options.from_env(**options), example_inputs, dynamic, kwargs)
