"""ONNX models with symbolic input dims: converted once, instantiated per size.

A model whose inputs have symbolic dims (`batch`, `seq`, or unnamed unknown dims) is converted once
with those dims as `ir.symbolic.SymInt`s: ints holding the first call's sizes (the hints) that also
remember the symbol. Sizes computed from them (IR types, Reshape/Expand targets, Slice bounds and
the folded Shape arithmetic of exporters: `symbolic_fold.py`) stay expressions of the symbols, and
every comparison the conversion made on them is recorded as a guard (`ir.symbolic.Guards`). A
ConstantOfShape or Range of a symbolic size is kept as IR (`full`, `arange`) instead of being folded
into a constant of the hint's size. That converted graph is the `Template`; a call with other sizes
binds the symbols and, when every guard holds for them, instantiates the template: each node added
again with its sizes evaluated and its types inferred anew, checked against the template's evaluated
types (an extern is typed again by running its implementation on meta tensors of the new sizes; what
follows from it is inferred, not checked). ONNX is not read again.

What makes a size fall back to a conversion of its own (correct, as before, only slower):
- a symbol of size 0 or 1 (or a hint of 0 or 1): such dims broadcast and squeeze, and converters
  test for them with plain ints as well as through SymInts, so they get their own conversion;
- dims of one name given different sizes;
- a guard that fails (a decision taken for the hints that these sizes would take otherwise);
- an instantiation whose re-inferred types disagree with the template's (a size fixed to the hint
  somewhere the SymInt did not reach: numpy, torch, `int()`);
- the template itself being untrusted: the first instantiation for new sizes is compared, node by
  node, with a real conversion at those sizes (where the nodes differ, as a kept Range does from a
  folded one, by the results of both on the same random inputs, run by the reference interpreter);
  a difference (a size fixed to the hint that type inference could not see) disables the template
  for the model, logged at INFO.

What this does not prove: a converter that reads a size as a plain int (`int(d)`) and decides on it
(`if n % 2`) records no guard; the check conversion covers one other size, the type checks the
rest only where the decision shows in a type. `stats["onnx_symbolic"]` says what happened.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
import torch
from onnx import numpy_helper

from autofusion.errors import ShapeInferenceError
from autofusion.frontend.driver import Conversion, drive
from autofusion.frontend.onnx.context import OnnxCtx, Val, dtype_of, unsupported
from autofusion.frontend.onnx.convert import _Walk
from autofusion.frontend.onnx.loader import graph_inputs, input_dims
from autofusion.frontend.onnx.shape_inputs import NeedsInputValues
from autofusion.frontend.torch.context import TV
from autofusion.ir.dtypes import DType
from autofusion.ir.graph import Graph, GraphBuilder, InputRole, Node
from autofusion.ir.interpret import fill_template, random_inputs, resolve_target, run_graph
from autofusion.ir.symbolic import Guards, SymInt, evaluate, guard_text
from autofusion.ir.types import TensorType

log = logging.getLogger("autofusion.frontend")


class NotSymbolic(Exception):
    """The template cannot be made or used for these sizes (the reason is the message)."""


def symbol_names(model: onnx.ModelProto) -> dict[str, list[str | None]]:
    """Per user input: each dim's symbol name (None for a static dim); unnamed unknown dims are named
    `<input>_dim<k>`. Empty when every input is static or some input's rank is unknown."""
    out: dict[str, list[str | None]] = {}
    for vi in graph_inputs(model):
        if not vi.type.HasField("tensor_type") or not vi.type.tensor_type.HasField("shape"):
            return {}
        dims = input_dims(vi)
        out[vi.name] = [None if isinstance(d, int) else (d or f"{vi.name}_dim{k}")
                        for k, d in enumerate(dims)]  # fmt: skip
    return out if any(n is not None for names in out.values() for n in names) else {}


class _SymbolicWalk(_Walk):
    """The ONNX walk with symbolic input dims (SymInts holding the hints)."""

    def __init__(self, model: onnx.ModelProto, label: str, names: dict[str, list[str | None]],
                 hints: Mapping[str, int]) -> None:  # fmt: skip
        # ONNX shape inference runs on the model as declared: symbolic values get no expected type.
        super().__init__(model, label, {})
        self.names, self.hints = names, hints

    def begin(self) -> list[str]:
        names = []
        for vi in graph_inputs(self.model):
            dims = input_dims(vi)
            shape: list[int] = []
            for d, s in zip(dims, self.names[vi.name], strict=True):
                shape.append(SymInt.symbol(s, self.hints[s]) if s is not None else int(d or 0))
            t = TensorType(dtype_of(vi.type.tensor_type.elem_type, f"input {vi.name!r}"), tuple(shape))
            vid = self.b.add_input(t, vi.name, InputRole.USER)
            self.env[vi.name] = Val(t, tv=TV(vid, t))
            names.append(vi.name)
        for init in self.model.graph.initializer:  # as `_Walk.begin` reads them
            dtype = dtype_of(init.data_type, f"initializer {init.name!r}")
            arr = numpy_helper.to_array(init)
            if dtype.is_half and arr.dtype != np.float16:
                arr = arr.astype(np.float32)
            self.env[init.name] = Val(TensorType(dtype, tuple(int(d) for d in init.dims)), const=arr)
        return names

    def _foldable(self, node: onnx.NodeProto, ins: list[Val | None]) -> bool:
        # A ConstantOfShape or Range of a symbolic size becomes IR (full, arange) of that size rather
        # than a constant of the hint's size.
        sym = any(v is not None and v.sym is not None for v in ins)
        return not (sym and node.op_type in _SIZED)

    def _converter(self, node: onnx.NodeProto) -> Any:
        if node.op_type == "Range" and node.domain in ("", "ai.onnx"):
            return _range
        return super()._converter(node)


_SIZED = frozenset({"ConstantOfShape", "Range"})


def _range(ctx: OnnxCtx) -> TV:
    """Range of integer scalars known at import (here: with a symbolic limit) as the IR's arange."""
    vals = [ctx.ints(i, name) for i, name in enumerate(("start", "limit", "delta"))]
    if any(v is None or len(v) != 1 for v in vals):
        raise unsupported("Range of non-scalar inputs")
    dt = ctx.type(0).dtype
    if not dt.is_int:
        raise unsupported(f"Range of {dt.short} values with a symbolic size")
    start, limit, delta = (v[0] for v in vals if v is not None)
    return ctx.add("arange", (), {"start": start, "end": limit, "step": delta, "dtype": dt})


def _extern_types(node: Node, types: Sequence[TensorType]) -> tuple[TensorType, ...]:
    """An extern's output types for these input types, from its torch implementation run on meta
    tensors (as the conversion typed it)."""
    metas = [torch.empty(t.shape, dtype=t.dtype.to_torch(), device="meta") for t in types]
    args, kwargs = node.attr("args"), dict(node.attr("kwargs") or ())
    try:
        out = resolve_target(node.attr("target"))(
            *fill_template(tuple(args), metas), **{k: fill_template(v, metas) for k, v in kwargs.items()}
        )
    except Exception as e:  # noqa: BLE001 - the implementation refuses these sizes: convert for them
        raise NotSymbolic(f"extern {node.name!r} fails on meta tensors of these sizes: {e}") from None
    leaves = [t for t in torch.utils._pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]
    return tuple(TensorType(DType.from_torch(t.dtype), tuple(int(d) for d in t.shape)) for t in leaves)


def _eval_type(t: TensorType, env: Mapping[str, int]) -> TensorType:
    return TensorType(t.dtype, evaluate(t.shape, env))


def _eval_attr(value: Any, env: Mapping[str, int]) -> Any:
    def other(x: Any) -> Any:
        return _eval_type(x, env) if isinstance(x, TensorType) else x

    return evaluate(value, env, other)


@dataclass
class Template:
    """A conversion with symbolic sizes, its guards, and where each symbol is read from."""

    conversion: Conversion
    guards: Guards
    names: dict[str, list[str | None]]  # per input, per dim: the symbol (None: static)
    hints: dict[str, int]
    trusted: bool = False  # an instantiation for other sizes matched a real conversion
    instantiated: int = 0

    @property
    def graph(self) -> Graph:
        return self.conversion.graph

    def bind(self, shapes: Mapping[str, Sequence[int]]) -> dict[str, int]:
        """The symbols' sizes in a call (NotSymbolic when the template does not apply to them)."""
        env: dict[str, int] = {}
        for name, dims in self.names.items():
            shape = shapes[name]
            if len(shape) != len(dims):
                raise NotSymbolic(f"input {name!r} has rank {len(shape)}, the model {len(dims)}")
            for sym, n in zip(dims, shape, strict=True):
                if sym is None:
                    continue
                if env.setdefault(sym, int(n)) != int(n):
                    raise NotSymbolic(f"dims named {sym!r} have sizes {env[sym]} and {n}")
        for sym, n in env.items():
            if n < 2:
                raise NotSymbolic(f"{sym} = {n}: sizes 0 and 1 are converted for themselves")
        failing = self.guards.failing(env)
        if failing is not None:
            raise NotSymbolic(f"the guard {guard_text(failing)} (for {self.hints}) fails")
        return env

    def instantiate(self, env: Mapping[str, int]) -> Conversion:
        """The template's graph for these sizes (NotSymbolic when a re-inferred type disagrees)."""
        g = self.graph
        b = GraphBuilder(g.name)
        ids: dict[int, int] = {}
        # Values whose type here is not the template's evaluated one: an extern's outputs typed again
        # from its implementation, and what follows from them; their types are inferred, not checked.
        retyped: set[int] = set()
        try:
            for gi in g.inputs:
                ids[gi.value.id] = b.add_input(_eval_type(gi.value.type, env), gi.name, gi.role)
            for node in g.nodes:
                b.scope = node.scope
                outs = tuple(_eval_type(v.type, env) for v in node.outputs)
                if node.op == "const":
                    tensor = g.constants[node.attr("name")]
                    if tuple(tensor.shape) != outs[0].shape:
                        raise NotSymbolic(f"constant {node.attr('name')!r} holds values of the hint sizes")
                    new: tuple[int, ...] = (b.add_constant(node.attr("name"), tensor, outs[0]),)
                else:
                    attrs = {k: _eval_attr(v, env) for k, v in node.attrs}
                    follows = any(i in retyped for i in node.inputs)
                    if node.op == "extern":  # typed from its implementation, at these sizes
                        typed = _extern_types(node, [b.type_of(ids[i]) for i in node.inputs])[: len(outs)]
                        follows |= typed != outs
                        outs = typed
                        attrs["out_types"] = outs
                    new = b.add_node(node.op, [ids[i] for i in node.inputs], attrs, name=node.name,
                                     loc=node.loc, out_types=None if follows else outs)  # fmt: skip
                    if follows:
                        retyped.update(v.id for v in node.outputs)
                for v, nid in zip(node.outputs, new, strict=True):
                    ids[v.id] = nid
        except ShapeInferenceError as e:
            raise NotSymbolic(f"a size was fixed to the hint during conversion ({e})") from None
        c = self.conversion
        graph = b.build([ids[o] for o in g.outputs])
        self.instantiated += 1
        return Conversion(graph, list(c.input_names), list(c.output_leaves), list(c.output_names),
                          c.lowered.copy(), c.fallbacks.copy())  # fmt: skip


def make_template(model: onnx.ModelProto, label: str, shapes: Mapping[str, Sequence[int]]) -> Template:
    """Convert `model` once with symbolic input dims, the sizes of `shapes` as hints (NotSymbolic when
    the model's dims cannot be made symbolic: see the module docstring)."""
    names = symbol_names(model)
    if not names:
        raise NotSymbolic("no symbolic input dims")
    hints: dict[str, int] = {}
    for name, dims in names.items():
        shape = shapes[name]
        if len(shape) != len(dims):
            raise NotSymbolic(f"input {name!r} has rank {len(shape)}, the model {len(dims)}")
        for sym, n in zip(dims, shape, strict=True):
            if sym is not None and hints.setdefault(sym, int(n)) != int(n):
                raise NotSymbolic(f"dims named {sym!r} have sizes {hints[sym]} and {n}")
    if any(n < 2 for n in hints.values()):
        raise NotSymbolic("a hint of size 0 or 1 (sizes 0 and 1 are converted for themselves)")
    guards = Guards()
    with guards.recording():
        conversion = drive(_SymbolicWalk(model, label, names, hints))
    return Template(conversion, guards, names, hints)


def difference(a: Graph, b: Graph, ca: Mapping[str, Any], cb: Mapping[str, Any]) -> str | None:
    """Where two graphs differ (None: equal node for node, constants included)."""
    if [(i.name, i.value) for i in a.inputs] != [(i.name, i.value) for i in b.inputs]:
        return "inputs"
    if len(a.nodes) != len(b.nodes):
        return f"{len(a.nodes)} nodes, a conversion {len(b.nodes)}"
    for x, y in zip(a.nodes, b.nodes, strict=True):
        if (x.op, x.inputs, x.outputs, x.attrs) != (y.op, y.inputs, y.outputs, y.attrs):
            what = "types" if x.outputs != y.outputs else "attributes" if x.attrs != y.attrs else "inputs"
            return f"node {x.name!r} ({x.op}): its {what} differ"
    if a.outputs != b.outputs:
        return "outputs"
    if set(ca) != set(cb) or any(not torch.equal(ca[k], cb[k]) for k in ca):
        return "constants"
    return None


def different_results(a: Graph, b: Graph, why: str) -> str | None:
    """Where graphs of the same inputs and output types that differ in their nodes (`why`) give
    different results on the same random inputs (run by the reference interpreter); None: the same."""
    ta, tb = a.value_types(), b.value_types()
    if [ta[o] for o in a.outputs] != [tb[o] for o in b.outputs]:
        return f"{why}; output types differ"
    inputs = random_inputs(a)
    try:
        ra, rb = run_graph(a, inputs), run_graph(b, inputs)
    except Exception as e:  # noqa: BLE001 - a graph that cannot run here is not shown equal
        return f"{why}; running them failed: {e}"
    for k, (x, y) in enumerate(zip(ra, rb, strict=True)):
        same = x.shape == y.shape and torch.allclose(x.double(), y.double(), 1e-5, 1e-6, equal_nan=True)
        if not same:
            return f"{why}; output {k} differs"
    return None


@dataclass
class SymbolicSource:
    """The template of one ONNX model and what became of it (what `OnnxSource` asks per signature)."""

    model: onnx.ModelProto
    label: str
    template: Template | None = None
    off: str | None = None  # why the template is not used (None: it is, or not made yet)
    conversions: int = 0  # real ONNX -> IR conversions (the template's included)
    fallbacks: dict[str, int] = field(default_factory=dict)  # why a signature was converted for itself
    # The symbols' sizes of the last conversion when it instantiated the template (None: converted for
    # its own sizes); a plan of the template is then reused for them (`autofusion.reuse`).
    last_env: dict[str, int] | None = None

    def conversion(
        self, shapes: Mapping[str, Sequence[int]], convert: Callable[[], Conversion]
    ) -> Conversion:
        """The graph for `shapes`: the template's instantiation where it applies, else `convert()`."""
        self.last_env = None
        try:
            return self._instantiate(shapes, convert)
        except NotSymbolic as e:
            reason = str(e)
        self.fallbacks[reason] = self.fallbacks.get(reason, 0) + 1
        log.info("%s: converted for %s: %s", self.label, dict(shapes), reason)
        self.conversions += 1
        return convert()

    def _instantiate(
        self, shapes: Mapping[str, Sequence[int]], convert: Callable[[], Conversion]
    ) -> Conversion:
        if self.off is not None:
            raise NotSymbolic(self.off)
        if self.template is None:
            try:
                self.conversions += 1
                self.template = make_template(self.model, self.label, shapes)
            except NotSymbolic as e:
                if "size 0 or 1" not in str(e):  # a later call may give a hint
                    self.off = str(e)
                raise
            except NeedsInputValues:
                raise  # the source binds those inputs' values and converts per value instead
            except Exception as e:  # noqa: BLE001 - any failure of the symbolic walk: convert per shape
                self.off = f"the symbolic conversion failed: {type(e).__name__}: {e}"
                raise NotSymbolic(self.off) from None
            log.info("%s: converted once with symbolic dims %s (hints; %d guards)",
                     self.label, self.template.hints, len(self.template.guards))  # fmt: skip
        t = self.template
        env = t.bind(shapes)
        try:
            conv = t.instantiate(env)
        except NotSymbolic:
            if not t.trusted:
                self.off = "the template's types do not hold for other sizes"
            raise
        if not t.trusted and env != t.hints:
            # Once per model: a real conversion at these sizes must give the same graph.
            self.conversions += 1
            real = convert()
            diff = difference(conv.graph, real.graph, conv.graph.constants, real.graph.constants)
            if diff is not None:  # another graph (a Range kept as arange, not folded): same results?
                diff = different_results(conv.graph, real.graph, diff)
            if diff is not None:
                self.off = f"an instantiation differed from a conversion at {env}: {diff}"
                log.info("%s: symbolic dims off: %s", self.label, self.off)
                return real
            t.trusted = True
        self.last_env = dict(env)
        return conv

    def stats(self) -> dict[str, Any]:
        t = self.template
        return {
            "onnx_symbolic": {
                "on": self.off is None and t is not None,
                "why_off": self.off,
                "symbols": {} if t is None else dict(t.hints),
                "guards": 0 if t is None else len(t.guards),
                "trusted": t is not None and t.trusted,
                "conversions": self.conversions,
                "instantiations": 0 if t is None else t.instantiated,
                "converted_for_themselves": dict(self.fallbacks),
            }
        }
