"""Debug dumps (AUTOFUSE_DFX_FLAGS="--codegen_compile_debug=true;--debug_dir=DIR").

In: the graph after each pipeline stage, the final plan, each build. Out, under
`DIR/autofuse_compile_debug/graph_<NNN>_<name>/` (graphs numbered per process in compile order):

    00_AfterCapture.{ir.txt,onnx,pbtxt}  01_AfterDce.*  02_AfterDecompose.*  03_AfterFusion.*
    04_FinalPlan.* (+ .plan.txt)  events.jsonl  build/{graph.cpp, compile.sh, compiler_output.txt}

A format is one function `(graph, plan) -> text or bytes` registered with `register_format(suffix,
fn)`: every stage is written once per registered format (`plan` is None before fusion). The text IR
is registered here; onnx_dump.py registers `onnx` and `pbtxt` (`export.onnx_ir`: our IR ops in a custom
domain, fused kernels as ONNX functions; Netron opens them). A dump that fails is logged at WARNING and never
fails the compile.
"""

from __future__ import annotations

import itertools
import logging
import re
import shutil
from collections.abc import Callable
from pathlib import Path

from autofusion.ir.graph import Graph, Node
from autofusion.ir.printer import _Names, format_attr, format_node, graph_lines, print_graph
from autofusion.plan.schedule import KernelStep, Plan

log = logging.getLogger("autofusion.codegen")

Formatter = Callable[[Graph, Plan | None], str | bytes]
FORMATS: dict[str, Formatter] = {}
_GRAPH_COUNTER = itertools.count()


def register_format(suffix: str, fn: Formatter) -> None:
    """Write every stage also as `<stage>.<suffix>` (e.g. "onnx", "pbtxt")."""
    FORMATS[suffix] = fn


def text_ir(graph: Graph, plan: Plan | None) -> str:
    """The stable IR text; once fused, kernels appear as blocks around the nodes they compute."""
    return print_graph(graph, show_loc=True) if plan is None else fused_text(plan)


register_format("ir.txt", text_ir)


class _Renames(_Names):
    """Free nodes (views, literals) are copied into every kernel that reads them: define once."""

    def define(self, vid: int) -> str:
        return self(vid) if vid in self._ids else super().define(vid)


def fused_text(plan: Plan) -> str:
    """The plan as IR text: `kernel NAME { nodes }` blocks and the library ops, in run order."""
    g = plan.graph
    names = _Renames()
    head = graph_lines(g)[: len(g.inputs) + 2]  # "graph f(", the inputs, ") {"
    for gi in g.inputs:
        names.define(gi.value.id)
    lines = list(head)
    for step in plan.steps:
        if isinstance(step, KernelStep):
            t = step.tile
            lines.append(
                f"  kernel {step.name} {{  # tile rows_per_block={t.rows_per_block} "
                f"inner_block={t.inner_block} persistent={format_attr(t.persistent)}"
            )
            lines += ["    " + format_node(n, names, show_loc=True) for n in step.kernel.nodes]
            lines.append("  }")
        else:
            lines.append("  " + format_node(step.node, names, show_loc=True) + f"  # {step.reason}")
    lines.append("  return (" + ", ".join(names(o) for o in g.outputs) + ")")
    lines.append("}")
    return "\n".join(lines) + "\n"


def plan_text(plan: Plan) -> str:
    """The final plan: one line per step with its buffers, tile and estimate."""
    from autofusion.fusion.cost import estimate

    names = _Renames()
    for gi in plan.graph.inputs:
        names.define(gi.value.id)
    out = [f"plan {plan.graph.name} on {plan.profile.name}: {len(plan.steps)} steps"]
    for i, step in enumerate(plan.steps):
        if isinstance(step, KernelStep):
            for n in step.kernel.nodes:  # number the values the kernel defines
                for v in n.outputs:
                    names.define(v.id)
            e = estimate(step.kernel, plan.profile, step.tile)
            ins = ", ".join(names(v) for v in step.inputs)
            outs = ", ".join(names(v) for v in step.outputs)
            out.append(
                f"  {i:3d} kernel {step.name}({ins}) -> ({outs})  ops={[n.op for n in step.kernel.nodes]} "
                f"bytes={e.bytes} est_us={e.seconds * 1e6:.2f} live_bytes={step.tile.live_bytes}"
            )
        else:
            out.append(f"  {i:3d} op     {format_node(step.node, names)}  # {step.reason}")
    return "\n".join(out) + "\n"


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name)[:60] or "graph"


class Dumper:
    """Writes one compiled graph's stages and builds under its own numbered directory."""

    def __init__(self, root: str | Path, graph_name: str) -> None:
        self.dir = (
            Path(root) / "autofuse_compile_debug" / f"graph_{next(_GRAPH_COUNTER):03d}_{_safe(graph_name)}"
        )
        self.index = 0

    def _write(self, name: str, data: str | bytes) -> None:
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            path = self.dir / name
            if isinstance(data, bytes):
                path.write_bytes(data)
            else:
                path.write_text(data)
        except OSError as e:
            log.warning("debug dump %s not written: %s", self.dir / name, e)

    def stage(self, stage: str, graph: Graph, plan: Plan | None = None) -> None:
        for suffix, fn in FORMATS.items():
            try:
                data = fn(graph, plan)
            except Exception as e:  # noqa: BLE001 - a dump format never fails the compile
                log.warning("debug dump of %s as %s failed: %s: %s", stage, suffix, type(e).__name__, e)
                continue
            self._write(f"{self.index:02d}_{stage}.{suffix}", data)
        if plan is not None and stage == "FinalPlan":
            self._write(f"{self.index:02d}_{stage}.plan.txt", plan_text(plan))
        self.index += 1

    def events(self, text: str) -> None:
        self._write("events.jsonl", text)

    def build(self, source: str, entry_dir: Path | None, error: str | None = None) -> None:
        """The generated source, the build directory's compile.sh and compiler output (cache hit or not)."""
        target = self.dir / "build"
        try:
            target.mkdir(parents=True, exist_ok=True)
            (target / "graph.cpp").write_text(source)
            if entry_dir is not None and entry_dir.is_dir():
                for f in entry_dir.iterdir():
                    if f.name in ("compile.sh", "compiler_output.txt", "meta.json") or f.suffix == ".cpp":
                        shutil.copy2(f, target / f.name)
            if error:
                (target / "build_error.txt").write_text(error)
        except OSError as e:
            log.warning("debug dump of the build not written to %s: %s", target, e)


def node_line(node: Node) -> str:
    from autofusion.ir.interpret import format_node_plain

    return format_node_plain(node)
