"""The package is a strict stack: each layer imports only layers below it, and no modules import each
other in a circle. Every import counts, function-level and TYPE_CHECKING ones included, because a
cycle hidden inside a function is still a cycle in the design.

The layers, bottom to top, are the tree the README's "How it is built" section shows.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import autofusion

PACKAGE = Path(autofusion.__file__).parent

# Bottom to top. A module belongs to the first entry that equals it or is a package above it.
LAYERS: list[tuple[str, ...]] = [
    ("autofusion._version", "autofusion.errors", "autofusion.events", "autofusion.cache"),
    ("autofusion.config",),
    ("autofusion.hw",),
    ("autofusion.ir",),
    ("autofusion.frontend",),
    ("autofusion.passes",),
    ("autofusion.kernel",),
    ("autofusion.fusion",),
    ("autofusion.plan",),
    ("autofusion.codegen",),
    ("autofusion.runtime",),
    ("autofusion.export",),
    ("autofusion.dfx",),
    (
        "autofusion.compiler",
        "autofusion.signatures",
        "autofusion.tuning",
        "autofusion.reuse",
        "autofusion.network_layout",
    ),
    ("autofusion.api", "autofusion.backend"),
    ("autofusion.package",),
    ("autofusion.tools",),
    ("autofusion", "autofusion.__main__"),
]

# Cycles inside one layer that are still to be removed: (module, module it imports) -> why it is allowed.
KNOWN_CYCLES: dict[tuple[str, str], str] = {
    (
        "autofusion.ir.graph",
        "autofusion.ir.printer",
    ): "str(graph) is the printer's text; the printer reads Graph",
}


def _modules() -> dict[str, Path]:
    out = {}
    for p in PACKAGE.rglob("*.py"):
        parts = ("autofusion", *p.relative_to(PACKAGE).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = p
    return out


MODULES = _modules()


def _imports(name: str, path: Path) -> set[str]:
    """Every autofusion module `name` imports (the most specific module each import names)."""
    is_pkg = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_pkg else name.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            targets = [f"{mod}.{a.name}" if f"{mod}.{a.name}" in MODULES else mod for a in node.names]
        else:
            continue
        for t in targets:
            while t and t not in MODULES:
                t = t.rpartition(".")[0]
            if t.startswith("autofusion") and t != name:
                found.add(t)
    return found


def layer_of(module: str) -> int:
    best = -1
    best_len = -1
    for i, names in enumerate(LAYERS):
        for n in names:
            if (module == n or module.startswith(n + ".")) and len(n) > best_len:
                best, best_len = i, len(n)
    assert best >= 0, f"{module} is in no layer; add it to LAYERS"
    return best


GRAPH = {m: _imports(m, p) for m, p in MODULES.items()}


def test_every_module_has_a_layer() -> None:
    for m in MODULES:
        layer_of(m)


def test_no_upward_import() -> None:
    bad = [
        f"{m} (layer {LAYERS[layer_of(m)][0]}) imports {t} (layer {LAYERS[layer_of(t)][0]})"
        for m, ts in sorted(GRAPH.items())
        for t in sorted(ts)
        if layer_of(t) > layer_of(m) and not (t == "autofusion" and m.startswith("autofusion."))
    ]
    # A submodule importing the root package is upward too (the root re-exports the whole API).
    bad += [
        f"{m} imports the root package autofusion"
        for m, ts in sorted(GRAPH.items())
        if "autofusion" in ts and m not in LAYERS[-1]
    ]
    assert not bad, "upward imports:\n" + "\n".join(bad)


def _cycles() -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    edges = defaultdict(set)
    for m, ts in GRAPH.items():
        for t in ts:
            # A package's __init__ re-exporting its own submodules is not a cycle in the design.
            if (m, t) not in KNOWN_CYCLES and not t.startswith(m + "."):
                edges[m].add(t)

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for m in sorted(MODULES):
        if m not in index:
            visit(m)
    return out


def test_no_import_cycle() -> None:
    cycles = _cycles()
    assert not cycles, "modules importing each other in a circle:\n" + "\n".join(
        " <-> ".join(c) for c in cycles
    )


def test_known_cycles_are_still_needed() -> None:
    for (m, t), why in KNOWN_CYCLES.items():
        assert t in GRAPH.get(m, set()), f"KNOWN_CYCLES entry {m} -> {t} ({why}) no longer exists; remove it"
