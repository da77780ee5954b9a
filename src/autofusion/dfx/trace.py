"""What the pipeline reports at each stage: events, INFO summaries, and the dumps Options ask for.

In: `Options` (debug_dir, torch_compile_debug_dir) and, from `compiler.compile_graph`, the graph after
each stage, the plan, and the build. Out: `Trace.events` (event records, kept on the `Program`), one
INFO line per channel and graph, `AUTOFUSE_DFX_FLAGS` dumps (dump.py) and `TORCH_COMPILE_DEBUG`
directories (debug_dir.py). Observing never changes what is compiled, and a failed dump never fails a compile.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from autofusion.config import Options
from autofusion.dfx.dump import Dumper
from autofusion.events import BuildEvent, EventRecord, RewritePassEvent, channel, to_jsonl
from autofusion.ir.graph import Graph
from autofusion.ir.symbolic import unrecorded
from autofusion.plan.events import fusion_summary, plan_events
from autofusion.plan.schedule import Plan


class Trace:
    def __init__(self, options: Options, graph_name: str) -> None:
        self.options = options
        self.graph_name = graph_name
        self.events: list[EventRecord] = []
        self.dumper = None
        if options.debug_dir:
            import autofusion.dfx.onnx_dump  # noqa: F401  (registers the .onnx and .pbtxt dump formats)

            self.dumper = Dumper(options.debug_dir, graph_name)
        self._last_nodes: int | None = None
        self._rewrites: list[str] = []

    def stage(self, name: str, graph: Graph) -> None:
        """A graph after a stage (AfterCapture, AfterDce, AfterDecompose ...)."""
        n = len(graph.nodes)
        if self._last_nodes is not None:
            self.events.append(RewritePassEvent(self.graph_name, name, self._last_nodes, n))
            self._rewrites.append(f"{name.removeprefix('After')} {self._last_nodes}->{n}")
        self._last_nodes = n
        if self.dumper is not None:
            self.dumper.stage(name, graph)

    def plan(self, plan: Plan) -> None:
        if self._rewrites:
            channel("rewrite").info("rewrite %s: %s nodes", self.graph_name, ", ".join(self._rewrites))
        with unrecorded():  # reports read sizes but decide nothing: no guards of a plan made once
            self.events += plan_events(plan)
            channel("fusion").info("%s", fusion_summary(plan))
        if self.dumper is not None:
            self.dumper.stage("AfterFusion", plan.graph, plan)
            self.dumper.stage("FinalPlan", plan.graph, plan)

    def build(self, source: str, stats: dict[str, Any], entry_dir: Path | None, error: str | None) -> None:
        self.events.append(
            BuildEvent(self.graph_name, len(source), stats.get("cache_hit"), stats.get("compile_s"), error)
        )
        how = (
            f"failed: {error.splitlines()[0]}"
            if error
            else (
                "cache hit" if stats.get("cache_hit") else f"compiled in {stats.get('compile_s', 0.0):.2f} s"
            )
        )
        channel("codegen").info(
            "codegen %s: %d kernels in one translation unit, %s",
            self.graph_name,
            stats.get("fused_kernels", 0),
            how,
        )
        if self.dumper is not None:
            self.dumper.build(source, entry_dir, error)

    def finish(self, program: Any) -> None:
        """After the executor exists: the runtime summary, the event dump, TORCH_COMPILE_DEBUG dirs."""
        plan = program.plan
        ops = len(plan.steps) - len(plan.kernels)
        mode = (
            "reference runtime (no library)"
            if program.library is None and plan.kernels
            else "generated kernels"
        )
        channel("runtime").info(
            "runtime %s: %d kernel calls + %d library ops per run, %s",
            self.graph_name,
            len(plan.kernels),
            ops,
            mode,
        )
        if self.dumper is not None:
            self.dumper.events(to_jsonl(self.events))
        if self.options.torch_compile_debug_dir:
            from autofusion.dfx.debug_dir import write_debug_dirs

            try:
                write_debug_dirs(program, self.options.torch_compile_debug_dir, self.options.cxx)
            except OSError as e:
                logging.getLogger("autofusion.codegen").warning(
                    "TORCH_COMPILE_DEBUG output not written: %s", e
                )
