"""Capture a torch model as functional ATen with torch.export, then convert it to IR.

In: an `nn.Module` (or a plain function, wrapped) and example tensors. Out: `Captured`, holding the
IR conversion, how to bind each graph input on every call (a user argument, or a parameter/buffer
looked up by name in the live module on every call, so a weight assigned anew, a
`load_state_dict(..., assign=True)` or an in-place update is seen) and the output pytree spec.

Capture uses torch.export: strict mode (Dynamo) first, non-strict tracing when Dynamo refuses the
code. Export keeps high-level ops (linear, layer_norm, softmax, gelu, conv, batch_norm, sdpa) whole;
`run_decompositions` then lowers only the ops we have no converter for, so anything left without a
converter is an op with no decomposition, which runs as an extern ATen call.
"""

from __future__ import annotations

import functools
import logging
import operator
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx.traceback as fx_traceback
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind, OutputKind

from autofusion.errors import FrontendError
from autofusion.frontend.source import Captured
from autofusion.frontend.torch import symbols
from autofusion.frontend.torch.context import CONVERTERS
from autofusion.frontend.torch.fx_to_ir import convert_graph
from autofusion.frontend.torch.live import LiveTensor
from autofusion.frontend.torch.mutation import Mutation, inplace_updates
from autofusion.frontend.torch.pytree import Node, call_tree, flatten, holds_objects
from autofusion.frontend.torch.pytree import rebuild as rebuild_tree
from autofusion.frontend.torch.wrap import CallModule, FunctionModule, leaf_names
from autofusion.ir.graph import InputRole
from autofusion.ir.symbolic import SymInt

log = logging.getLogger(__name__)


@functools.cache
def decomposition_table() -> dict[Any, Callable[..., Any]]:
    """torch's default decompositions minus every op we convert ourselves (so it stays whole)."""
    table = torch.export.default_decompositions()
    keep = [op for op in list(table.keys()) if op.name().split("::")[-1].split(".")[0] in CONVERTERS]
    for op in keep:
        del table[op]
    return dict(table)


def needs_decomposition(ep: ExportedProgram) -> bool:
    """False when every call is already a pure op we convert: then run_decompositions (0.15-0.5 s of
    graph-independent work per capture) could only return the same graph."""
    for node in ep.graph.nodes:
        if node.op != "call_function" or node.target is operator.getitem:
            continue
        target = node.target
        if not isinstance(target, torch._ops.OpOverload) or target._schema.is_mutable:
            return True
        ns, name = target._schema.name.split("::")
        if ns != "aten" or name not in CONVERTERS:
            return True
    return False


def export_program(
    module: torch.nn.Module, inputs: Sequence[torch.Tensor], mode: str,
    module_for: Callable[[bool], torch.nn.Module] | None = None, dynamic_shapes: Any = None,
) -> tuple[ExportedProgram, str]:  # fmt: skip
    """Export with `mode` in {"auto", "strict", "non-strict"}. "auto" tries non-strict first
    (torch.export's own default; 3-8x faster to trace than Dynamo here: 34 against 286 ms for a 6-op
    chain, 153 against 561 ms for transformer-block, measured on a loaded 2-core machine), then strict.
    `module_for(strict)`, when given, is the module to export for each try (default: `module`).
    `dynamic_shapes`: torch.export's (per input, {dim: Dim}); the graph's sizes are then symbolic."""
    args = tuple(inputs)
    errors: list[str] = []
    tries = {"auto": (False, True), "strict": (True,), "non-strict": (False,)}[mode]
    for strict in tries:
        target = module if module_for is None else module_for(strict)
        try:
            # preserve_node_meta keeps `node.meta["custom"]` (super_kernel_scope marks) in non-strict export.
            with torch.no_grad(), warnings.catch_warnings(), fx_traceback.preserve_node_meta():
                # torch's own pytree deprecation chatter; says nothing about the user's model.
                warnings.filterwarnings("ignore", category=FutureWarning, message=".*LeafSpec.*")
                # super_kernel_scope pushes and pops its scope stack while Dynamo traces; nothing leaks.
                warnings.filterwarnings(
                    "ignore", message=r"(?s).*side effects.*autofusion_dot_.*scope.*_STACK"
                )
                ep = torch.export.export(target, args, strict=strict, dynamic_shapes=dynamic_shapes)
                if needs_decomposition(ep):
                    ep = ep.run_decompositions(decomposition_table())
            return ep, "strict" if strict else "non-strict"
        except Exception as e:  # export raises many types; each is reported
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            errors.append(f"{'strict' if strict else 'non-strict'} export: {type(e).__name__}: {first}")
            log.info("capture with %s export failed: %s", "strict" if strict else "non-strict", first)
            log.debug("export traceback", exc_info=True)
    raise FrontendError("could not capture the model: " + "; ".join(errors))


_MUTATION_KINDS = (OutputKind.USER_INPUT_MUTATION, OutputKind.BUFFER_MUTATION)


def _distinct(inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """The example tensors with every one that shares storage with an earlier one cloned: the graph is
    traced for distinct inputs (calls whose updated inputs share memory run eagerly: `mutation.overlap`)."""
    seen: set[int] = set()
    out = []
    for t in inputs:
        ptr = t.untyped_storage().data_ptr() if t.numel() else None
        if ptr is not None and ptr in seen:
            t = t.clone()
        elif ptr is not None:
            seen.add(ptr)
        out.append(t)
    return out


def _symbol_names(
    ep: ExportedProgram, user_names: list[str], dims: dict[int, dict[int, str]], optional: bool = False
) -> dict[str, str]:
    """torch's symbol (`s33`) of each named dim of the user inputs -> its name (`optional`: a dim the
    model fixes is left out, else refused)."""
    placeholders = {n.name: n for n in ep.graph.nodes if n.op == "placeholder"}
    out: dict[str, str] = {}
    for i, pname in enumerate(user_names):
        val = placeholders[pname].meta.get("val")
        for d, name in dims.get(i, {}).items():
            s = val.shape[d] if isinstance(val, torch.Tensor) else None
            if not isinstance(s, torch.SymInt) or not s.node.expr.is_Symbol:
                if optional and (not isinstance(s, torch.SymInt) or s.node.expr.is_number):
                    continue
                raise FrontendError(f"input {i} dim {d} ({name!r}) was not exported as a symbol of its own")
            out.setdefault(s.node.expr.name, name)
    return out


def _range_guards(ep: ExportedProgram, names: dict[str, str], inputs: Sequence[torch.Tensor],
                  user_names: list[str], dims: dict[int, dict[int, str]]) -> None:  # fmt: skip
    """The range export allows each named dim as comparisons of its SymInt (recorded as guards while a
    symbolic capture records them: `frontend/torch/symbolic.py`)."""
    hints = {name: int(inputs[i].shape[d]) for i, per in dims.items() for d, name in per.items()}
    for sym, vr in ep.range_constraints.items():
        name = names.get(getattr(sym, "name", ""))
        if name is None:
            continue
        s = SymInt.symbol(name, hints[name])
        # Each comparison records its guard (both hold for the hint export traced); an unbounded end
        # (torch's int_oo) is no Integer.
        low = int(vr.lower) if getattr(vr.lower, "is_Integer", False) else None
        high = int(vr.upper) if getattr(vr.upper, "is_Integer", False) else None
        if (low is not None and not s >= low) or (high is not None and not s <= high):
            raise FrontendError(f"dim {name!r} = {hints[name]} is outside the range export allows it")


def capture(
    model: Any, inputs: Sequence[torch.Tensor], mode: str = "auto", name: str = "forward",
    layout: Node | None = None, dims: dict[int, dict[int, str]] | None = None, optional_dims: bool = False,
) -> Captured:  # fmt: skip
    """Capture `model` called as `layout` describes (default: with `inputs` as positional arguments);
    `inputs` are the call's tensors in the layout's leaf order (`frontend/torch/pytree.py`).
    `dims` (input position -> dim -> name): those dims are exported symbolic (sizes 2 and up) and the
    IR's sizes are `ir.symbolic.SymInt`s of those names (the inputs are taken as contiguous);
    `optional_dims`: a dim the model fixes stays a plain size instead of being refused."""
    module = model if isinstance(model, torch.nn.Module) else FunctionModule(model)
    layout = layout if layout is not None else flatten(call_tree(inputs, {})).node
    call = CallModule(module, layout, leaf_names(module, layout))
    if holds_objects(layout):
        # Dynamo would replay what the model does to an argument object on the copy it traces, where
        # nothing can see it; non-strict tracing finds such changes (`CallModule.run`).
        if mode == "strict":
            raise FrontendError("a call with objects holding tensors is captured with non-strict export; "
                                "strict export cannot check what the model changes on them")  # fmt: skip
        mode = "non-strict"
    dynamic_shapes = None
    if dims:
        # AUTO: dynamic where the model lets it be, within the range it allows (a position table caps
        # a sequence at 512): the range is taken as guards below, a dim the model fixes is refused.
        auto = torch.export.Dim.AUTO
        dynamic_shapes = tuple({d: auto for d in dims[i]} if i in dims else None for i in range(len(inputs)))
    ep, used = export_program(module, _distinct(inputs), mode, call.exported, dynamic_shapes)
    sig = ep.graph_signature
    bad = [
        o for o in sig.output_specs if o.kind is not OutputKind.USER_OUTPUT and o.kind not in _MUTATION_KINDS
    ]
    if bad:
        kinds = sorted({o.kind.name.lower() for o in bad})
        raise FrontendError(f"the model's graph has outputs of kind {', '.join(kinds)}; inference graphs "
                            "return values and update inputs or buffers only")  # fmt: skip
    n_mut = sum(1 for o in sig.output_specs if o.kind in _MUTATION_KINDS)
    if any(o.kind in _MUTATION_KINDS for o in sig.output_specs[n_mut:]):
        raise FrontendError("the exported graph lists input updates after its outputs")
    buffer_placeholder = {s.target: s.arg.name for s in sig.input_specs if s.kind is InputKind.BUFFER}
    # output node name -> the placeholder it updates
    mutated = {
        o.arg.name: o.target if o.kind is OutputKind.USER_INPUT_MUTATION else buffer_placeholder[o.target]
        for o in sig.output_specs[:n_mut]
    }
    inplace = set(inplace_updates(ep.graph_module, mutated)) if mutated else set()
    written = set(mutated.values())

    live: dict[str, torch.Tensor] = dict(module.named_parameters(remove_duplicate=False))
    live.update(dict(module.named_buffers(remove_duplicate=False)))
    roles: dict[str, InputRole] = {}
    constants: dict[str, torch.Tensor] = {}
    bound: dict[str, tuple[str, Any]] = {}
    user_names: list[str] = []
    for spec in sig.input_specs:
        pname = spec.arg.name
        if spec.kind is InputKind.USER_INPUT:
            roles[pname] = InputRole.USER
            user_names.append(pname)
        elif spec.kind in (InputKind.PARAMETER, InputKind.BUFFER):
            roles[pname] = InputRole.PARAM if spec.kind is InputKind.PARAMETER else InputRole.BUFFER
            if pname in written:  # state the graph updates is no weight: no pass may treat it as constant
                roles[pname] = InputRole.USER
            if spec.target in live:
                ref = LiveTensor(module, spec.target, spec.kind is InputKind.BUFFER)
                bound[pname] = ("live", ref)
            else:
                tensor = (
                    ep.state_dict[spec.target] if spec.target in ep.state_dict else ep.constants[spec.target]
                )
                bound[pname] = ("bound", tensor if pname in written else tensor.detach())
        elif spec.kind is InputKind.CONSTANT_TENSOR:
            constants[pname] = ep.constants[spec.target].detach()
        else:
            raise FrontendError(f"unsupported graph input kind {spec.kind.name} ({pname})")
    if len(user_names) != len(inputs):
        raise FrontendError(f"export produced {len(user_names)} user inputs for {len(inputs)} given tensors")

    # Non-strict export lists every parameter and buffer, used or not (num_batches_tracked, a causal mask
    # the forward never reads); an unused one would only be bound and carried on every call.
    for node in list(ep.graph_module.graph.nodes):
        if (
            node.op == "placeholder"
            and not node.users
            and roles.get(node.name) in (InputRole.PARAM, InputRole.BUFFER)
        ):
            ep.graph_module.graph.erase_node(node)
            del roles[node.name], bound[node.name]
    if dims:
        names = _symbol_names(ep, user_names, dims, optional_dims)
        _range_guards(ep, names, inputs, user_names, dims)
        with symbols.naming(names):
            conversion = convert_graph(ep.graph_module, roles, constants, name, None)
    else:
        strides = {n: tuple(t.stride()) for n, t in zip(user_names, inputs, strict=True)}
        conversion = convert_graph(ep.graph_module, roles, constants, name, strides)
    sources: list[tuple[str, Any]] = []
    for pname in conversion.input_names:
        sources.append(bound[pname] if pname in bound else ("user", user_names.index(pname)))
    mutations = []
    for k, o in enumerate(sig.output_specs[:n_mut]):
        kind, index = conversion.output_leaves[k]
        ph = mutated[o.arg.name]
        if kind != "value":
            raise FrontendError(f"the new value of {ph} is not a tensor the graph computes")
        target = bound[ph] if ph in bound else ("user", user_names.index(ph))
        mutations.append(Mutation(index, target, ph in inplace))
    for m in mutations:
        what = f"input {m.target[1]}" if m.target[0] == "user" else getattr(m.target[1], "target", "a buffer")
        log.info("%s updates %s %s", name, what, "in place" if m.inplace else "by a copy after the graph")
    result = call.result if used == "non-strict" else None
    out_spec = ep.call_spec.out_spec
    # A partial, not a closure: a saved package (`autofusion.package`) pickles it.
    rebuild = None if result is None else functools.partial(rebuild_tree, result)
    return Captured(conversion, sources, out_spec, used, tuple(mutations), rebuild)
