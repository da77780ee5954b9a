"""The IR verifier: checks a graph's invariants and, on a fault, shows the IR around it.

In: a `Graph`. Out: nothing, or an `IRVerifyError` whose message holds the failing node, what is
wrong, and about ten lines of printed IR on either side with the fault marked.
"""

from __future__ import annotations

from autofusion.errors import IRVerifyError, ShapeInferenceError
from autofusion.ir.graph import Graph
from autofusion.ir.ops import get_op, infer_types
from autofusion.ir.printer import graph_lines
from autofusion.ir.types import TensorType

CONTEXT_LINES = 10
# Ops that may read or write an opaque dtype (complex, wide unsigned, ...): they hand values to torch.
CARRIES_OPAQUE = frozenset({"extern", "const"})


def _fault(graph: Graph, line_index: int, message: str) -> IRVerifyError:
    lines = graph_lines(graph, show_loc=True)
    lo, hi = max(0, line_index - CONTEXT_LINES), min(len(lines), line_index + CONTEXT_LINES + 1)
    shown = []
    for i in range(lo, hi):
        mark = ">>" if i == line_index else "  "
        shown.append(f"{mark} {lines[i]}")
    return IRVerifyError(f"{message}\n" + "\n".join(shown))


def verify(graph: Graph) -> None:
    defined: dict[int, TensorType] = {}
    # Printed lines: header, one per input, ") {", then one per node.
    first_node_line = len(graph.inputs) + 2
    for k, gi in enumerate(graph.inputs):
        if gi.value.id in defined:
            raise _fault(graph, 1 + k, f"input {gi.name} redefines value %{gi.value.id}")
        defined[gi.value.id] = gi.value.type
    names: set[str] = set()
    for k, node in enumerate(graph.nodes):
        line = first_node_line + k
        where = f"node {node.name!r} ({node.op})" + (f" from {node.loc}" if node.loc else "")
        opdef = get_op(node.op)  # Node.op is an Op, and every Op has an OpDef
        if node.name in names:
            raise _fault(graph, line, f"{where}: duplicate node name")
        names.add(node.name)
        for i in node.inputs:
            if i not in defined:
                raise _fault(graph, line, f"{where}: uses %{i} before it is defined (or never defined)")
        problem = opdef.check_arity(len(node.inputs)) or opdef.check_attrs(dict(node.attrs))
        if problem:
            raise _fault(graph, line, f"{where}: {problem}")
        try:
            inferred = infer_types(node.op, tuple(defined[i] for i in node.inputs), dict(node.attrs))
        except ShapeInferenceError as e:
            raise _fault(graph, line, f"{where}: {e}") from None
        if node.op not in CARRIES_OPAQUE:
            opaque = [t for t in (*(defined[i] for i in node.inputs), *(v.type for v in node.outputs))
                      if t.dtype.is_opaque]  # fmt: skip
            if opaque:
                message = f"{where}: computes on {opaque[0]}, a type only extern calls may take"
                raise _fault(graph, line, message)
        declared = tuple(v.type for v in node.outputs)
        if inferred != declared:
            raise _fault(
                graph, line,
                f"{where}: declares {', '.join(map(str, declared))} "
                f"but its op infers {', '.join(map(str, inferred))}",
            )  # fmt: skip
        for v in node.outputs:
            if v.id in defined:
                raise _fault(graph, line, f"{where}: redefines value %{v.id}")
            defined[v.id] = v.type
        if node.op == "const" and node.attr("name") not in graph.constants:
            raise _fault(graph, line, f"{where}: constant {node.attr('name')!r} missing from graph.constants")
    for o in graph.outputs:
        if o not in defined:
            raise _fault(graph, first_node_line + len(graph.nodes), f"graph output %{o} is never defined")
