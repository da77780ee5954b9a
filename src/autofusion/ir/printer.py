"""A stable text form of graphs, used by golden tests, errors, dumps and reports.

Values are renumbered in definition order, attributes are sorted and floats printed with `repr`, so
the text depends only on the graph's structure: two equal graphs print identically.
"""

from __future__ import annotations

from typing import Any

from autofusion.ir.dtypes import DType
from autofusion.ir.graph import Graph, InputRole, Node
from autofusion.ir.types import TensorType


def format_attr(v: Any) -> str:
    if v is None:
        return "none"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, DType):
        return v.short
    if isinstance(v, TensorType):
        return str(v)
    if isinstance(v, float):
        return repr(v)
    if isinstance(v, str):
        return '"' + v.replace('"', '\\"') + '"'
    if isinstance(v, tuple):
        if v and all(isinstance(x, tuple) and len(x) == 2 and isinstance(x[0], str) for x in v):
            return "{" + ", ".join(f"{k}={format_attr(x)}" for k, x in v) + "}"
        return "[" + ", ".join(format_attr(x) for x in v) + "]"
    return repr(v)


class _Names:
    def __init__(self) -> None:
        self._ids: dict[int, int] = {}

    def define(self, vid: int) -> str:
        self._ids[vid] = len(self._ids)
        return self(vid)

    def __call__(self, vid: int) -> str:
        return f"%{self._ids[vid]}" if vid in self._ids else f"%?{vid}"


def format_node(node: Node, names: _Names, show_loc: bool = False) -> str:
    outs = ", ".join(f"{names.define(v.id)}: {v.type}" for v in node.outputs)
    args = ", ".join(names(i) for i in node.inputs)
    attrs = ", ".join(f"{k}={format_attr(v)}" for k, v in node.attrs)
    text = f"{outs} = {node.op}({args})"
    if attrs:
        text += " {" + attrs + "}"
    if show_loc and node.loc:
        text += f"  # {node.loc}"
    return text


def graph_lines(graph: Graph, show_loc: bool = False) -> list[str]:
    """One line per input, node and the return; the verifier points into this list."""
    names = _Names()
    lines = [f"graph {graph.name}("]
    for gi in graph.inputs:
        role = "" if gi.role is InputRole.USER else f" {gi.role.value}"
        lines.append(f"    {names.define(gi.value.id)}: {gi.value.type}{role} {format_attr(gi.name)},")
    lines.append(") {")
    for n in graph.nodes:
        lines.append("  " + format_node(n, names, show_loc))
    lines.append("  return (" + ", ".join(names(o) for o in graph.outputs) + ")")
    lines.append("}")
    return lines


def print_graph(graph: Graph, show_loc: bool = False) -> str:
    return "\n".join(graph_lines(graph, show_loc)) + "\n"
