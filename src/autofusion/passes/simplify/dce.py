"""Dead-node elimination: drop nodes none of whose outputs reach a graph output.

In: a graph. Out: the graph without them (inputs and constants stay, so the calling convention holds).
Every IR op is pure after export's functionalisation, externs included, so nothing is kept for side
effects. One backward sweep over the topological order: O(nodes + edges).
"""

from __future__ import annotations

from autofusion.ir.graph import Graph


def eliminate_dead_nodes(graph: Graph) -> Graph:
    live = set(graph.outputs)
    keep = []
    for node in reversed(graph.nodes):
        if any(v.id in live for v in node.outputs):
            keep.append(node)
            live.update(node.inputs)
    if len(keep) == len(graph.nodes):
        return graph
    used_consts = {n.attr("name") for n in keep if n.op == "const"}
    constants = {k: v for k, v in graph.constants.items() if k in used_consts}
    return graph.replace(nodes=tuple(reversed(keep)), constants=constants)
