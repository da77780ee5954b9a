"""ONNX control flow: If, Loop and Scan, their subgraphs converted by this same frontend and compiled.

Each branch or body is made a model of its own (`OnnxBody`): its formal inputs (a Loop's iteration
number, condition and carried values; a Scan's states and the slices of its scan inputs), then every
value it reads from the enclosing graph (outer scope, found through nested subgraphs too). Outer values
known at import become initializers of that model (integers and small tensors: `EMBED_MAX_ELEMENTS`),
so they fold and fuse there as in the main graph; the others (weights among them) are extra inputs,
which the extern node passes. The body is converted once per input
signature (the main graph's static shapes give it its types at import) and compiled once, with the
options of the graph around it (`frontend/subgraph.py`).

- If with a condition known at import: the branch taken is converted and its IR copied into the main
  graph (it fuses with what is around it); outputs known at import stay known. Otherwise one extern
  runs the branch the condition picks, on the host.
- Loop: the body runs while the trip count and the condition allow, carried values passed from one
  iteration to the next; scan outputs are stacked along a new first axis. Their length must be known
  at import (a trip count known at import and a condition that cannot stop it) or declared by the
  model's types (checked when it runs). A body whose iteration number feeds a shape (a Slice at
  [i, i + 1)) is converted and compiled once per iteration number.
- Scan: scan_input_axes / scan_input_directions / scan_output_axes / scan_output_directions, the
  states carried from one iteration to the next.

A carried value or Scan state must keep its type from one iteration to the next, and If branches must
give the same types: the main graph's types are static. What this does not take raises
`UnsupportedOpError` with the reason (the driver names the node).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np
import onnx
import torch
from onnx import helper, numpy_helper

from autofusion.errors import FrontendError, ModelFileError, UnsupportedOpError
from autofusion.frontend.driver import Conversion
from autofusion.frontend.onnx.context import OnnxCtx, Result, Val, array_type, norm_axis, numpy_dtype, onnx_op
from autofusion.frontend.onnx.shape_inputs import NeedsInputValues
from autofusion.frontend.subgraph import SubgraphHost, SubgraphKey, register_target
from autofusion.frontend.torch.context import TV, unsupported
from autofusion.ir.dtypes import DType
from autofusion.ir.graph import Arg, Graph
from autofusion.ir.onnx_dtypes import onnx_elem_type
from autofusion.ir.types import TensorType

ModelConverter = Callable[[onnx.ModelProto, str], Conversion]
_CONVERT: list[ModelConverter] = []  # convert.convert_model, set by convert.py (which imports this module)


def use_model_converter(fn: ModelConverter) -> None:
    _CONVERT[:] = [fn]


# ---- subgraphs ------------------------------------------------------------------------------------


def _names_used(graph: onnx.GraphProto) -> list[str]:
    """Names `graph` reads that it does not define (inputs, initializers, node outputs), in first-use
    order, nested subgraphs included: the outer-scope values it captures."""
    defined = {i.name for i in graph.input} | {t.name for t in graph.initializer}
    defined |= {t.values.name for t in graph.sparse_initializer}
    free: dict[str, None] = {}

    def use(name: str) -> None:
        if name and name not in defined:
            free.setdefault(name)

    for node in graph.node:
        for name in node.input:
            use(name)
        for a in node.attribute:
            for sub in [a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs):
                for name in _names_used(sub):
                    use(name)
        defined.update(o for o in node.output if o)
    for out in graph.output:
        use(out.name)
    return list(free)


def _value_info(name: str, t: TensorType) -> onnx.ValueInfoProto:
    elem = onnx_elem_type(t.dtype)
    if elem is None:
        raise unsupported(f"a subgraph input of type {t}")
    return helper.make_tensor_value_info(name, elem, list(t.shape))


# Outer values known at import that a subgraph gets as initializers (so they fold there: shapes, axes,
# scalars); larger float tensors (weights) are passed as inputs, stored once in the main graph rather
# than in every conversion of the body.
EMBED_MAX_ELEMENTS = 4096


def _embeds(t: TensorType) -> bool:
    if t.dtype is DType.bfloat16:  # (held as fp32 at import)
        return False
    return not t.dtype.is_float or t.numel <= EMBED_MAX_ELEMENTS


class OnnxBody(SubgraphHost):
    """One ONNX subgraph as a model: formal inputs first, then the outer values it reads at run time.

    `fixed`: formal inputs (by position) whose values are baked into the model rather than passed, with
    the value to convert for at import (a Loop body whose iteration number feeds a shape: it is then
    converted and compiled once per iteration number, `run(tensors, (i,))`)."""

    def __init__(
        self, ctx: OnnxCtx, attr: str, formal: Sequence[TensorType], fixed: dict[int, Any] | None = None
    ) -> None:
        super().__init__(f"{attr} of {ctx.loc or ctx.node.op_type}")
        body: onnx.GraphProto = ctx.attr(attr)
        if len(body.input) != len(formal):
            raise unsupported(f"{attr} takes {len(body.input)} inputs, the node gives it {len(formal)}")
        for vi in body.output:
            kind = vi.type.WhichOneof("value")
            if kind not in (None, "tensor_type"):
                raise unsupported(f"{attr} output {vi.name!r} is not a tensor (its type is {kind})")
        graph = onnx.GraphProto()
        graph.CopyFrom(body)
        del graph.input[:]
        graph.input.extend(_value_info(i.name, t) for i, t in zip(body.input, formal, strict=True))
        del graph.value_info[:]  # the body's own may carry symbolic dims; inference recomputes them
        self.captured: list[TV] = []  # the outer values passed at run time, in input order
        types = list(formal)
        for name in _names_used(body):
            val = ctx.scope.get(name)
            if val is None:
                raise unsupported(f"{attr} reads {name!r}, which the enclosing graph does not define")
            if val.const is not None and _embeds(val.type):
                arr = np.asarray(val.const).astype(numpy_dtype(val.type.dtype), copy=False)
                graph.initializer.append(numpy_helper.from_array(arr, name))
                continue
            tv = ctx.materialise(val, name)
            self.captured.append(tv)
            types.append(tv.type)
            graph.input.append(_value_info(name, tv.type))
        self.fixed = tuple(sorted(fixed or {}))
        self._graph = graph
        self._opset = ctx.opset
        self._conversions: dict[tuple[tuple[TensorType, ...], tuple[Any, ...]], Conversion] = {}
        self.types = tuple(types)  # every input's, the fixed ones' included
        self.conversion = self.convert(self.types, tuple((fixed or {})[k] for k in self.fixed))

    def convert(self, types: tuple[TensorType, ...], values: tuple[Any, ...] = ()) -> Conversion:
        """The body converted for inputs of these types and the fixed inputs' values (kept per both)."""
        conv = self._conversions.get((types, values))
        if conv is None:
            graph = onnx.GraphProto()
            graph.CopyFrom(self._graph)
            for vi, t in zip(graph.input, types, strict=True):
                vi.CopyFrom(_value_info(vi.name, t))
            for k, v in zip(self.fixed, values, strict=True):
                arr = np.asarray(v, dtype=numpy_dtype(types[k].dtype)).reshape(types[k].shape)
                graph.initializer.append(numpy_helper.from_array(arr, graph.input[k].name))
            passed = [vi for k, vi in enumerate(graph.input) if k not in self.fixed]
            del graph.input[:]
            graph.input.extend(passed)
            model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", self._opset)])
            try:
                conv = _CONVERT[0](model, self.label)
            except (FrontendError, ModelFileError) as e:
                raise UnsupportedOpError(f"its {self.label.split(' of ')[0]}: {e}") from None
            except NeedsInputValues as e:
                # The body's own inputs give a shape (a Loop's iteration number): the caller may
                # specialise the body on them (`_loop_body`); the outer model's source cannot bind them.
                raise UnsupportedOpError(
                    f"its {self.label.split(' of ')[0]}: the values of its input(s) {', '.join(e.names)} "
                    "give shapes"
                ) from None
            self._conversions[(types, values)] = conv
        return conv

    @property
    def graph(self) -> Graph:
        return self.conversion.graph

    def input_id(self, k: int) -> int | None:
        """The graph input value of formal input `k` (None when it is fixed)."""
        if k in self.fixed:
            return None
        return self.graph.inputs[k - sum(1 for f in self.fixed if f < k)].value.id

    @property
    def out_types(self) -> list[TensorType]:
        g = self.graph
        types = g.value_types()
        return [types[o] for o in g.outputs]

    def subgraph(self, key: SubgraphKey) -> Graph:
        signature, values = key
        passed = iter(TensorType(DType.from_torch(dt), shape) for shape, dt in signature)
        types = tuple(t if k in self.fixed else next(passed) for k, t in enumerate(self.types))
        return self.convert(types, values).graph


# ---- building the main graph's nodes -------------------------------------------------------------


def _inline(ctx: OnnxCtx, graph: Graph, inputs: Sequence[TV]) -> list[Result]:
    """`graph`'s nodes copied into the graph being built, `inputs` for its inputs; outputs computed from
    nothing but literals stay values known at import."""
    ids = {gi.value.id: tv.id for gi, tv in zip(graph.inputs, inputs, strict=True)}
    producer = {v.id: n for n in graph.nodes for v in n.outputs}
    out: list[Result] = []
    for vid in graph.outputs:
        known = _known(producer.get(vid), graph)
        if known is not None:
            out.append(known)
    if len(out) == len(graph.outputs):
        return out  # nothing to copy
    for node in graph.nodes:
        new = ctx.b.copy(node, [ids[i] for i in node.inputs], graph.constants)
        ids.update((v.id, n) for v, n in zip(node.outputs, new, strict=True))
    results: list[Result] = []
    for vid in graph.outputs:
        known = _known(producer.get(vid), graph)
        results.append(known if known is not None else TV(ids[vid], ctx.b.type_of(ids[vid])))
    return results


def _known(node: Any, graph: Graph) -> np.ndarray | None:
    if node is None or node.inputs or node.out.type.dtype is DType.bfloat16:
        return None
    t = node.out.type
    if node.op == "full":
        return np.full(t.shape, node.attr("value"), dtype=numpy_dtype(t.dtype))
    if node.op == "const":
        return np.asarray(graph.constants[node.attr("name")].numpy())
    return None


# Loops and Scans whose trip count is known at import are unrolled into the main graph (each step's
# body copied in, so it fuses with its neighbours) when trip count x body nodes is at most this;
# longer ones run as one extern calling the compiled body per step.
UNROLL_NODES = 400


def _as_tv(ctx: OnnxCtx, r: Result, name: str) -> TV:
    if isinstance(r, TV):
        return r
    assert r is not None
    arr = np.asarray(r)
    return ctx.materialise(Val(array_type(arr), const=arr), name)


def _unrolls(body: OnnxBody, length: int) -> bool:
    return length > 0 and length * max(len(body.graph.nodes), 1) <= UNROLL_NODES


def _stack(ctx: OnnxCtx, parts: Sequence[TV], axis: int) -> TV:
    """`parts` (one shape) stacked along a new axis `axis`."""
    t = parts[0].type
    shape = (*t.shape[:axis], 1, *t.shape[axis:])
    rows = [ctx.reshape(p, shape) for p in parts]
    return rows[0] if len(rows) == 1 else ctx.add("concat", rows, {"dim": axis})


def _extern(
    ctx: OnnxCtx,
    target: str,
    literals: tuple[Any, ...],
    tensors: Iterable[Any],
    out_types: Sequence[TensorType],
) -> list[TV]:
    """One extern node calling `target(*literals, *tensors)`; `tensors` holds TVs, None and tuples of
    them (each tuple passed as one tuple argument)."""
    ins: list[int] = []

    def slot(x: Any) -> Any:
        if isinstance(x, tuple):
            return tuple(slot(y) for y in x)
        if x is None:
            return None
        if x.id not in ins:
            ins.append(x.id)
        return Arg(ins.index(x.id))

    args = literals + tuple(slot(x) for x in tensors)
    ids = ctx.b.add_node(
        "extern",
        ins,
        {
            "target": target,
            "args": args,
            "kwargs": (),
            "out_types": tuple(out_types),
            "reason": f"{ctx.node.op_type}: its subgraphs run as graphs of their own",
        },
        name=ctx.name,
        loc=ctx.loc,
    )
    return [TV(i, ctx.b.type_of(i)) for i in ids]


def _check_declared(got: torch.Tensor, want: TensorType, what: str) -> torch.Tensor:
    if tuple(got.shape) != want.shape:
        raise RuntimeError(f"{what} has shape {list(got.shape)}, the model declares {list(want.shape)}")
    return got


# ---- If -------------------------------------------------------------------------------------------


@onnx_op("If")
def _if(ctx: OnnxCtx) -> list[Result]:
    cond = ctx.const(0)
    if cond is not None:
        taken = OnnxBody(ctx, "then_branch" if bool(np.asarray(cond).reshape(-1)[0]) else "else_branch", [])
        return _inline(ctx, taken.graph, taken.captured)
    if ctx.type(0).numel != 1:
        raise unsupported(f"an If condition of shape {list(ctx.type(0).shape)}")
    then, other = OnnxBody(ctx, "then_branch", []), OnnxBody(ctx, "else_branch", [])
    if then.out_types != other.out_types:
        raise unsupported(
            f"the branches give different types ({', '.join(map(str, then.out_types))} / "
            f"{', '.join(map(str, other.out_types))}); autofusion's graphs have static types"
        )
    return list(
        _extern(
            ctx, IF_TARGET, (then, other), (ctx.tensor(0), tuple(then.captured), tuple(other.captured)),
            then.out_types,
        )
    )  # fmt: skip


def _run_if(
    then: OnnxBody, other: OnnxBody, cond: torch.Tensor, then_in: tuple[torch.Tensor, ...],
    other_in: tuple[torch.Tensor, ...],
) -> tuple[torch.Tensor, ...]:  # fmt: skip
    if bool(cond.reshape(-1)[0]):
        return tuple(then.run(then_in))
    return tuple(other.run(other_in))


IF_TARGET = register_target("autofusion_onnx.If.default", _run_if)


# ---- Loop -----------------------------------------------------------------------------------------


def _always_true(graph: Graph, cond_in: int | None) -> bool:
    """Whether a body graph's condition output (its first) is the literal True, or its condition input
    (value `cond_in`) passed through."""
    vid = graph.outputs[0]
    if vid == cond_in:
        return True
    for n in graph.nodes:
        if n.op == "full" and n.outputs[0].id == vid:
            return bool(n.attr("value"))
    return False


def _loop_body(ctx: OnnxCtx, formal: list[TensorType]) -> OnnxBody:
    try:
        return OnnxBody(ctx, "body", formal)
    except UnsupportedOpError as e:
        reason = e
    # The iteration number may feed a shape (a Slice at i): then the body is specialised on it.
    try:
        return OnnxBody(ctx, "body", formal, fixed={0: 0})
    except UnsupportedOpError:
        raise reason from None


def _loop_steps(body: OnnxBody, n_trip: int, n_c: int, check_cond: bool) -> list[Graph] | None:
    """The body graph of each of `n_trip` steps, each converted for the carried types the step before
    gives (and its iteration number, for a specialised body), or None when some step's condition may
    be False or its scan outputs change type (then the loop is not unrolled)."""
    carried = list(body.types[2 : 2 + n_c])
    rest = body.types[2 + n_c :]
    graphs: list[Graph] = []
    scan_types: list[TensorType] | None = None
    for i in range(n_trip):
        types = (*body.types[:2], *carried, *rest)
        try:
            graph = body.convert(types, (i,) if body.fixed else ()).graph
        except UnsupportedOpError:
            return None
        outs = [graph.value_types()[o] for o in graph.outputs]
        cond_in = graph.inputs[0 if body.fixed else 1].value.id
        if check_cond and not _always_true(graph, cond_in):
            return None
        if scan_types is not None and outs[1 + n_c :] != scan_types:
            return None
        scan_types, carried = outs[1 + n_c :], outs[1 : 1 + n_c]
        graphs.append(graph)
    return graphs


def _unroll_loop(ctx: OnnxCtx, body: OnnxBody, graphs: list[Graph], n_c: int) -> list[Result]:
    values = [ctx.tensor(i) for i in range(2, ctx.n_inputs)]
    steps: list[list[TV]] = []
    true = ctx.scalar(True, DType.bool)
    for i, graph in enumerate(graphs):
        head = [true] if body.fixed else [ctx.scalar(i, DType.int64), true]
        outs = _inline(ctx, graph, [*head, *values, *body.captured])
        values = [_as_tv(ctx, r, f"{ctx.name}_carried") for r in outs[1 : 1 + n_c]]
        if not steps:
            steps = [[] for _ in outs[1 + n_c :]]
        for k, r in enumerate(outs[1 + n_c :]):
            steps[k].append(_as_tv(ctx, r, f"{ctx.name}_step"))
    return [*values, *(_stack(ctx, p, 0) for p in steps)]


@onnx_op("Loop")
def _loop(ctx: OnnxCtx) -> list[Result]:
    carried = [ctx.type(i) for i in range(2, ctx.n_inputs)]
    scalar = [TensorType(DType.int64, ()), TensorType(DType.bool, ())]
    for i, what in ((0, "trip count"), (1, "condition")):
        if ctx.has(i) and ctx.type(i).numel != 1:
            raise unsupported(f"a Loop {what} of shape {list(ctx.type(i).shape)}")
    body = _loop_body(ctx, scalar + carried)
    outs = body.out_types
    n_c = len(carried)
    if len(outs) < 1 + n_c:
        raise unsupported(f"the body gives {len(outs)} outputs for {n_c} carried values and a condition")
    if outs[0].numel != 1 or outs[0].dtype is not DType.bool:
        raise unsupported(f"the body's condition output is {outs[0]}")
    trip = ctx.const(0) if ctx.has(0) else None
    cond = ctx.const(1) if ctx.has(1) else None
    # The first condition: given and known at import, absent (True; the body's is then ignored), or
    # known only at run time (None).
    first = bool(np.asarray(cond).reshape(-1)[0]) if cond is not None else None if ctx.has(1) else True
    n_trip = None if trip is None else int(np.asarray(trip).reshape(-1)[0])
    if n_trip is not None and first and 0 < n_trip * max(len(body.graph.nodes), 1) <= UNROLL_NODES:
        # Unrolled, each step converted for its own carried types: they may change from step to step.
        graphs = _loop_steps(body, n_trip, n_c, check_cond=ctx.has(1))
        if graphs is not None:
            return _unroll_loop(ctx, body, graphs, n_c)
    if outs[1 : 1 + n_c] != carried:
        raise unsupported(
            f"carried values change type in the body ({', '.join(map(str, carried))} -> "
            f"{', '.join(map(str, outs[1 : 1 + n_c]))}); autofusion's graphs have static types"
        )
    length: int | None = None
    if n_trip is not None and first is not None:
        if not first:
            length = 0
        elif not ctx.has(1) or (not body.fixed and _always_true(body.graph, body.input_id(1))):
            # (a specialised body's condition may differ from one iteration number to the next)
            length = n_trip
    out_types = list(carried)
    for k, t in enumerate(outs[1 + n_c :]):
        if length is not None:
            out_types.append(TensorType(t.dtype, (max(length, 0), *t.shape)))
            continue
        declared = ctx.out_type(n_c + k)
        if declared is None or declared.shape[1:] != t.shape or declared.dtype != t.dtype:
            raise unsupported(
                f"scan output {k} has a length that depends on values known only at run time "
                "(and the model declares no static shape for it)"
            )
        out_types.append(declared)
    tensors = (
        ctx.tensor(0) if ctx.has(0) else None,
        ctx.tensor(1) if ctx.has(1) else None,
        tuple(ctx.tensor(i) for i in range(2, ctx.n_inputs)),
        tuple(body.captured),
    )
    return list(_extern(ctx, LOOP_TARGET, (body, tuple(out_types)), tensors, out_types))


def _run_loop(
    body: OnnxBody, out_types: tuple[TensorType, ...], trip: torch.Tensor | None, cond: torch.Tensor | None,
    carried: tuple[torch.Tensor, ...], captured: tuple[torch.Tensor, ...],
) -> tuple[torch.Tensor, ...]:  # fmt: skip
    limit = None if trip is None else int(trip.reshape(-1)[0])
    go = True if cond is None else bool(cond.reshape(-1)[0])
    values = list(carried)
    n_c = len(values)
    scans: list[list[torch.Tensor]] = [[] for _ in out_types[n_c:]]
    i = 0
    while go and (limit is None or i < limit):
        if body.fixed:  # specialised on the iteration number
            outs = body.run([torch.tensor(go), *values, *captured], (i,))
        else:
            outs = body.run([torch.tensor(i, dtype=torch.int64), torch.tensor(go), *values, *captured])
        if cond is not None:  # without a condition input the body's condition is ignored (a for loop)
            go = bool(outs[0].reshape(-1)[0])
        values = outs[1 : 1 + n_c]
        for k, s in enumerate(scans):
            s.append(outs[1 + n_c + k])
        i += 1
    results: list[torch.Tensor] = []
    for k, (v, t) in enumerate(zip(values, out_types, strict=False)):
        if v.dtype != t.dtype.to_torch():
            raise RuntimeError(f"Loop carried value {k} became {v.dtype} in the body, the model has {t}")
        results.append(_check_declared(v, t, f"Loop carried value {k} (after {i} iterations)"))
    for k, (s, t) in enumerate(zip(scans, out_types[n_c:], strict=True)):
        got = torch.stack(s) if s else torch.empty((0, *t.shape[1:]), dtype=t.dtype.to_torch())
        results.append(_check_declared(got, t, f"Loop scan output {k} (after {i} iterations)"))
    return tuple(results)


LOOP_TARGET = register_target("autofusion_onnx.Loop.default", _run_loop)


# ---- Scan -----------------------------------------------------------------------------------------


def _ints(ctx: OnnxCtx, key: str, n: int, default: int) -> list[int]:
    got = [int(x) for x in ctx.attr(key, [default] * n)]
    if len(got) != n:
        raise unsupported(f"{key} has {len(got)} entries for {n} scan values")
    return got


@onnx_op("Scan")
def _scan(ctx: OnnxCtx) -> list[Result]:
    n_scan = int(ctx.attr("num_scan_inputs"))
    n_state = ctx.n_inputs - n_scan
    if n_state < 0 or not all(ctx.has(i) for i in range(ctx.n_inputs)):
        raise unsupported("a Scan with missing inputs")
    states = [ctx.type(i) for i in range(n_state)]
    scanned = [ctx.type(n_state + j) for j in range(n_scan)]
    given = _ints(ctx, "scan_input_axes", n_scan, 0)
    in_axes = [norm_axis(a, t.rank) for a, t in zip(given, scanned, strict=True)]
    in_dirs = _ints(ctx, "scan_input_directions", n_scan, 0)
    lengths = {t.shape[a] for t, a in zip(scanned, in_axes, strict=True)}
    if len(lengths) > 1:
        raise unsupported(f"scan inputs of different lengths {sorted(lengths)}")
    length = lengths.pop() if lengths else 0
    slices = [
        TensorType(t.dtype, (*t.shape[:a], *t.shape[a + 1 :])) for t, a in zip(scanned, in_axes, strict=True)
    ]
    body = OnnxBody(ctx, "body", states + slices)
    outs = body.out_types
    if outs[:n_state] != states:
        raise unsupported(
            f"states change type in the body ({', '.join(map(str, states))} -> "
            f"{', '.join(map(str, outs[:n_state]))}); autofusion's graphs have static types"
        )
    elems = outs[n_state:]
    given = _ints(ctx, "scan_output_axes", len(elems), 0)
    out_axes = [norm_axis(a, t.rank + 1) for a, t in zip(given, elems, strict=True)]
    out_dirs = _ints(ctx, "scan_output_directions", len(elems), 0)
    out_types = list(states)
    for t, a in zip(elems, out_axes, strict=True):
        out_types.append(TensorType(t.dtype, (*t.shape[:a], length, *t.shape[a:])))
    if _unrolls(body, length):
        values: list[TV] = [ctx.tensor(i) for i in range(n_state)]
        xs = [ctx.tensor(n_state + j) for j in range(n_scan)]
        steps: list[list[TV]] = [[] for _ in elems]
        for step in range(length):
            cuts = [ctx.add("select", (x,), {"dim": a, "index": length - 1 - step if d else step})
                      for x, a, d in zip(xs, in_axes, in_dirs, strict=True)]  # fmt: skip
            outs_t = _inline(ctx, body.graph, [*values, *cuts, *body.captured])
            values = [_as_tv(ctx, r, f"{ctx.name}_state") for r in outs_t[:n_state]]
            for k, r in enumerate(outs_t[n_state:]):
                steps[k].append(_as_tv(ctx, r, f"{ctx.name}_step"))
        stacked = [
            _stack(ctx, p[::-1] if d else p, a) for p, a, d in zip(steps, out_axes, out_dirs, strict=True)
        ]
        return [*values, *stacked]
    spec = (tuple(in_axes), tuple(in_dirs), tuple(out_axes), tuple(out_dirs), length, tuple(out_types))
    tensors = (
        tuple(ctx.tensor(i) for i in range(n_state)),
        tuple(ctx.tensor(n_state + j) for j in range(n_scan)),
        tuple(body.captured),
    )
    return list(_extern(ctx, SCAN_TARGET, (body, spec), tensors, out_types))


def _run_scan(
    body: OnnxBody, spec: tuple[Any, ...], states: tuple[torch.Tensor, ...],
    scanned: tuple[torch.Tensor, ...], captured: tuple[torch.Tensor, ...],
) -> tuple[torch.Tensor, ...]:  # fmt: skip
    in_axes, in_dirs, out_axes, out_dirs, length, out_types = spec
    values = list(states)
    n_s = len(values)
    elems: list[list[torch.Tensor]] = [[] for _ in out_axes]
    for t in range(length):
        slices = [
            x.select(a, length - 1 - t if d else t) for x, a, d in zip(scanned, in_axes, in_dirs, strict=True)
        ]
        outs = body.run([*values, *slices, *captured])
        values = outs[:n_s]
        for k, e in enumerate(elems):
            e.append(outs[n_s + k])
    results: list[torch.Tensor] = list(values)
    for e, a, d, t in zip(elems, out_axes, out_dirs, out_types[n_s:], strict=True):
        if not e:
            results.append(torch.empty(t.shape, dtype=t.dtype.to_torch()))
            continue
        results.append(torch.stack(e[::-1] if d else e, dim=a))
    return tuple(results)


SCAN_TARGET = register_target("autofusion_onnx.Scan.default", _run_scan)
