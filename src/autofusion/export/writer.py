"""The one IR -> ONNX writer: the walk over a graph (or a plan's steps), fused kernels as ONNX functions,
the dtype table and the model assembly. What differs between the files we write is a `Dialect`:

- `autofusion.export.onnx`: standard ONNX ops that onnxruntime runs (`autofusion optimize --export`);
- `autofusion.export.onnx_ir`: the IR's own ops in a custom domain, a picture for Netron (the debug dumps).

In: IR objects only (a `Graph`, optionally its `Plan`). Out: an `onnx.ModelProto`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from autofusion.errors import ExportError
from autofusion.ir.dtypes import DType
from autofusion.ir.graph import Graph, Node
from autofusion.ir.onnx_dtypes import onnx_elem_type
from autofusion.ir.symbolic import Expr, SymInt, contains_symbol
from autofusion.ir.types import TensorType
from autofusion.plan.schedule import KernelStep, Plan

Names = Callable[[int], str]


def elem_type(dtype: DType) -> int:
    """The ONNX element type of `dtype`; a clear error for a type ONNX has no counterpart of."""
    t = onnx_elem_type(dtype)
    if t is None:
        raise ExportError(f"dtype {dtype.name} has no ONNX element type")
    return t


def value_info(name: str, t: TensorType, strict: bool = True) -> onnx.ValueInfoProto:
    """`strict=False`: a type ONNX lacks (quantized, bit-packed) is written as UNDEFINED (for pictures).
    A symbolic dim (`ir.symbolic.SymInt`) is written as its symbol's name (dim_param), one computed
    from symbols as an unknown dim."""
    code = elem_type(t.dtype) if strict else onnx_elem_type(t.dtype)
    return helper.make_tensor_value_info(
        name, TensorProto.UNDEFINED if code is None else code, [dim_spec(d) for d in t.shape]
    )


def tensor_proto(value: Any, dtype: DType, name: str = "") -> TensorProto:
    """A TensorProto of `dtype` from a numpy array, torch tensor or Python scalar (bf16 included)."""
    if hasattr(value, "detach"):  # torch tensor
        value = value.detach().float().numpy() if dtype is DType.bfloat16 else value.detach().numpy()
    arr = np.asarray(value)
    if dtype is DType.bfloat16:
        return helper.make_tensor(
            name, TensorProto.BFLOAT16, arr.shape, arr.astype(np.float32).reshape(-1).tolist()
        )
    np_dtype = np.dtype("bool" if dtype is DType.bool else dtype.name)
    return numpy_helper.from_array(np.array(arr, dtype=np_dtype, order="C"), name)  # keeps 0-d as 0-d


class Sink:
    """Where written nodes go: a graph (constants may become initializers) or a function body."""

    def __init__(self, prefix: str, types: dict[int, TensorType], allow_initializers: bool) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[TensorProto] = []
        self.domains: set[str] = set()
        self.types = types
        self._prefix = prefix
        self._n = 0
        self._allow_init = allow_initializers
        # Symbol name -> (graph input name, dim) it is read from at run time (symbolic sizes: `ints`).
        self.symbols: dict[str, tuple[str, int]] = {}

    def fresh(self, hint: str = "t") -> str:
        self._n += 1
        return f"{self._prefix}{hint}_{self._n}"

    def append(self, proto: onnx.NodeProto) -> None:
        """A node built elsewhere (parsed back, or with attribute names that clash with `node`'s keywords)."""
        self.nodes.append(proto)
        if proto.domain not in ("", "ai.onnx"):
            self.domains.add(proto.domain)

    def node(
        self,
        op_type: str,
        inputs: list[str],
        outputs: list[str] | None = None,
        domain: str = "",
        **attrs: Any,
    ) -> str:
        """Append one node (`attrs` as `helper.make_node` takes them); returns its first output's name."""
        outs = outputs or [self.fresh(op_type.lower())]
        self.nodes.append(helper.make_node(op_type, inputs, outs, domain=domain or None, **attrs))
        if domain:
            self.domains.add(domain)
        return outs[0]

    def const(self, value: Any, dtype: DType, out: str | None = None) -> str:
        name = out or self.fresh("c")
        return self.node("Constant", [], [name], value=tensor_proto(value, dtype))

    def ints(self, values: Any) -> str:
        values = list(values)
        if any(isinstance(v, SymInt) for v in values):
            return symbolic_ints(self, values)
        return self.const(np.asarray(values, dtype=np.int64), DType.int64)

    def weight(self, tensor: Any, t: TensorType, out: str) -> str:
        if self._allow_init:
            self.initializers.append(tensor_proto(tensor, t.dtype, out))
            return out
        return self.const(tensor, t.dtype, out)


def opset_imports(default: int | None, domains: Iterable[str]) -> list[onnx.OperatorSetIdProto]:
    """The default domain at `default` (none when None), then each custom domain at version 1, sorted."""
    first = [] if default is None else [helper.make_opsetid("", default)]
    return first + [helper.make_opsetid(d, 1) for d in sorted(domains)]


class Dialect(Protocol):
    """How one kind of file spells the IR; `write` does the walk."""

    function_domain: str  # the domain fused-kernel functions and the nodes calling them live in
    prefix: str  # of the names the dialect makes up in the graph (helper constants, intermediate values)

    def names(self, graph: Graph) -> Names:
        """The ONNX name of each value of the graph."""
        ...

    def node(self, sink: Sink, graph: Graph, node: Node, ins: list[str], outs: list[str]) -> None:
        """Write one IR node, reading `ins` and defining `outs`."""
        ...

    def kernel(
        self, graph: Graph, step: KernelStep, types: dict[int, TensorType]
    ) -> tuple[onnx.FunctionProto, list[int]]:
        """One fused kernel as a function (see `function`), and the values its call node passes to it."""
        ...

    def call_name(self, step: KernelStep) -> str | None:
        """The name of the node calling `step`'s function (None: unnamed)."""
        ...

    def finish(
        self, graph: Graph, sink: Sink, name: Names, functions: list[onnx.FunctionProto]
    ) -> onnx.ModelProto:
        """The model around the written nodes: graph inputs and outputs, opsets, IR version."""
        ...


def function(
    dialect: Dialect,
    graph: Graph,
    step: KernelStep,
    nodes: Sequence[Node],
    inputs: Sequence[int],
    sink: Sink,
    name: Names,
    default_opset: int | None,
    doc: str,
) -> onnx.FunctionProto:
    """`nodes` written into `sink` as the body of function `step.name` of the dialect's domain."""
    for n in nodes:
        dialect.node(sink, graph, n, [name(i) for i in n.inputs], [name(v.id) for v in n.outputs])
    return helper.make_function(
        dialect.function_domain,
        step.name,
        [name(v) for v in inputs],
        [name(v) for v in step.outputs],
        sink.nodes,
        opset_imports=opset_imports(default_opset, sink.domains),
        doc_string=doc,
    )


def write(graph: Graph, plan: Plan | None, dialect: Dialect) -> onnx.ModelProto:
    """`graph` node by node, or `plan`'s steps (over `graph`) with each fused kernel as one function call."""
    types = graph.value_types()
    sink = Sink(dialect.prefix, types, allow_initializers=True)
    name = dialect.names(graph)
    sink.symbols = symbol_sources(graph, name)
    functions: list[onnx.FunctionProto] = []
    symbolic = bool(sink.symbols)
    if symbolic:
        for n in graph.nodes:
            check_symbolic(n, types)
    for item in graph.nodes if plan is None else plan.steps:
        if isinstance(item, KernelStep) and symbolic and _reads_symbols(graph, item):
            # A function body cannot read the graph inputs the symbolic sizes come from: the kernel's
            # nodes are written inline instead.
            for k in sorted(item.nodes):
                n = graph.nodes[k]
                dialect.node(sink, graph, n, [name(i) for i in n.inputs], [name(v.id) for v in n.outputs])
            continue
        if isinstance(item, KernelStep):
            fn, inputs = dialect.kernel(graph, item, types)
            functions.append(fn)
            sink.node(
                item.name,
                [name(v) for v in inputs],
                [name(v) for v in item.outputs],
                domain=dialect.function_domain,
                name=dialect.call_name(item),
            )
        else:
            node = item if isinstance(item, Node) else item.node
            dialect.node(
                sink, graph, node, [name(i) for i in node.inputs], [name(v.id) for v in node.outputs]
            )
    return dialect.finish(graph, sink, name, functions)


def assemble(
    graph_name: str,
    sink: Sink,
    inputs: Sequence[onnx.ValueInfoProto],
    outputs: Sequence[onnx.ValueInfoProto],
    opsets: Sequence[onnx.OperatorSetIdProto],
    functions: Sequence[onnx.FunctionProto],
    ir_version: int,
    inner: Sequence[onnx.ValueInfoProto] = (),
) -> onnx.ModelProto:
    """The ModelProto of the written nodes (`inner`: types of intermediate values, for viewers)."""
    g = helper.make_graph(
        sink.nodes,
        graph_name,
        list(inputs),
        list(outputs),
        initializer=sink.initializers,
        value_info=list(inner),
    )
    model = helper.make_model(
        g, opset_imports=list(opsets), functions=list(functions), producer_name="autofusion"
    )
    model.ir_version = ir_version
    return model


def dim_spec(d: int) -> int | str | None:
    """An ONNX dim: its size, a symbol's name, or None (unknown) for a size computed from symbols."""
    if isinstance(d, SymInt):
        return str(d.expr[1]) if d.expr[0] == "s" else None
    return int(d)


def symbol_sources(graph: Graph, name: Names) -> dict[str, tuple[str, int]]:
    """Each symbol of the graph's input dims and the first (input, dim) that holds it."""
    out: dict[str, tuple[str, int]] = {}
    for gi in graph.inputs:
        for k, d in enumerate(gi.value.type.shape):
            if isinstance(d, SymInt) and d.expr[0] == "s":
                out.setdefault(str(d.expr[1]), (name(gi.value.id), k))
    return out


# Ops whose writers pass every symbolic attribute through `Sink.ints` (computed at run time).
_SYMBOLIC_ATTRS_OK = frozenset({"full", "reshape", "expand", "slice"})


def check_symbolic(node: Node, types: dict[int, TensorType]) -> None:
    """ExportError for a node whose ONNX form would fix a symbolic size to its hint (its writer reads
    the size as a number), rather than writing a file that computes wrongly at other sizes."""
    ins = [types[i] for i in node.inputs]
    symbolic_in = any(contains_symbol(t.shape) for t in ins)
    why = None
    held = any(contains_symbol(v) for k, v in node.attrs if k != "out_types")
    if node.op not in _SYMBOLIC_ATTRS_OK and held:
        why = "its attributes hold symbolic sizes"
    elif node.op == "extern" and symbolic_in and not node.attr("onnx"):
        why = "a torch extern over symbolic sizes"
    elif node.op == "var" and symbolic_in:
        why = "its count of reduced elements is written as a number"
    elif node.op == "sdpa" and node.attr("is_causal") and symbolic_in:
        why = "its causal mask is written as a constant"
    elif node.op in ("layer_norm", "group_norm") and symbolic_in and not node.attr("has_weight"):
        why = "its default weight is written as a constant"
    if why is not None:
        raise ExportError(f"node {node.name!r} ({node.op}) cannot keep its dims symbolic in ONNX: {why}")


def _reads_symbols(graph: Graph, step: KernelStep) -> bool:
    return any(contains_symbol(v) for k in step.nodes for _, v in graph.nodes[k].attrs)


_ONNX_ARITH = {"add": "Add", "sub": "Sub", "mul": "Mul", "floordiv": "Div", "mod": "Mod"}


def symbolic_ints(sink: Sink, values: Sequence[int]) -> str:
    """A 1-D int64 tensor of `values` computed at run time where they are symbolic: each symbol read
    with Shape from the input that holds it, the expression in ONNX arithmetic (Div truncates, as
    floor division does for sizes, which are never negative), the parts concatenated."""
    parts: list[str] = []
    run: list[int] = []
    for v in values:
        if isinstance(v, SymInt):
            if run:
                parts.append(sink.const(np.asarray(run, dtype=np.int64), DType.int64))
                run = []
            parts.append(_expr_node(sink, v.expr))
        else:
            run.append(int(v))
    if run:
        parts.append(sink.const(np.asarray(run, dtype=np.int64), DType.int64))
    return parts[0] if len(parts) == 1 else sink.node("Concat", parts, axis=0)


def _expr_node(sink: Sink, expr: Expr) -> str:
    kind = expr[0]
    if kind == "c":
        return sink.const(np.asarray([int(expr[1])], dtype=np.int64), DType.int64)
    if kind == "s":
        where = sink.symbols.get(str(expr[1]))
        if where is None:
            raise ExportError(
                f"size {expr[1]!r} is symbolic but no graph input of this graph holds it (a fused "
                "kernel's function body cannot read it): export the plain graph instead"
            )
        return sink.node("Shape", [where[0]], start=where[1], end=where[1] + 1)
    return sink.node(_ONNX_ARITH[kind], [_expr_node(sink, expr[1]), _expr_node(sink, expr[2])])


__all__ = [
    "Dialect",
    "Sink",
    "assemble",
    "dim_spec",
    "elem_type",
    "function",
    "opset_imports",
    "tensor_proto",
    "value_info",
    "write",
]
