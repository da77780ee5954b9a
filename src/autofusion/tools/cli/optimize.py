"""`autofusion optimize MODEL`: compile a model, print what fusion did; optionally check, time, export it.

MODEL is ``builtin:NAME``, a path to an ``.onnx`` file, or ``package.module:factory`` where ``factory()``
returns ``(module, example_inputs)``. ONNX models get random inputs of their declared shapes (symbolic
dims set with ``--dim NAME=SIZE``). The summary table shows ops before and after rewriting, fused kernels
and steps per run, estimated memory traffic before and after fusion, estimated and measured latency, and
fallbacks; ``--json`` prints the compiled object's ``.stats`` with the measurements added instead.

Exit status: 0 on success, 1 when ``--check`` finds a result that differs, 2 for usage errors and for
models that cannot be read or compiled (one line on stderr says why; with ``--json`` also a JSON
``{"model", "error"}`` on stdout), including a model that ran eagerly instead of compiled (the table's
"ran eagerly" row and ``eager_fallback`` say why).

``--save PATH`` writes the compiled model as a package (``autofusion.save``; weights copied unless
``--save-weights reference``), which ``autofusion.load(PATH)`` runs in another process without a compiler.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from autofusion.tools.cli import common
from autofusion.tools.cli import options as cli_options
from autofusion.tools.cli.common import EXIT_FINDING, EXIT_OK, EXIT_USAGE, UsageError
from autofusion.tools.diagnose.compare import baseline, median_ms, model_tolerance, relative_error

NAME = "optimize"


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser(
        NAME,
        parents=[
            common.log_parent(),
            common.model_parent(),
            common.target_parent(),
            common.repeat_parent(20, "timed runs (median)"),
            common.fusion_parent(),
        ],
        help="compile one model (builtin:NAME, a .onnx file or package.module:factory) and report on it",
        description="Compile a model with autofusion and print what fusion did. MODEL is builtin:NAME, "
        "a path to an .onnx file, or package.module:factory (factory() returns (module, example_inputs)).",
    )
    p.add_argument("--json", action="store_true", help="print the stats as JSON instead of the table")
    p.add_argument(
        "--check",
        action="store_true",
        help="compare with onnxruntime (ONNX models; the reference runtime when it is not "
        "installed) or eager PyTorch (torch models)",
    )
    p.add_argument(
        "--bench", action="store_true", help="time against onnxruntime (ONNX) or eager PyTorch, side by side"
    )
    p.add_argument(
        "--export", metavar="PATH", help="write the optimised graph as ONNX, fused kernels as functions"
    )
    p.add_argument("--export-plain", metavar="PATH", help="write the rewritten, unfused graph as plain ONNX")
    p.add_argument(
        "--report", metavar="HTML", help="write the HTML report (as `autofusion report`) to this path"
    )
    p.add_argument("--save", metavar="PATH",
                   help="write the compiled model as a package (autofusion.load(PATH) runs it)")  # fmt: skip
    p.add_argument("--save-weights", choices=("copy", "reference"), default="copy",
                   help="with --save: store the weights in the package (copy, default) or only their names "
                   "(reference: load(PATH, model=m) binds them from the model)")  # fmt: skip
    return p


@dataclass
class Loaded:
    kind: str  # "torch" or "onnx"
    label: str
    source: Any  # the torch module, or the .onnx path
    compiled: Any
    inputs: list[Any]
    measurements: dict[str, Any] = field(default_factory=dict)


def load(args: argparse.Namespace, options: dict[str, Any]) -> Loaded:
    """MODEL through the loader every tool shares, compiled with `options`."""
    import torch

    from autofusion import api
    from autofusion.tools.diagnose.compare import is_onnx_model

    model, inputs = cli_options.load_model(args)
    with torch.no_grad():
        cm = api.compile(model, tuple(inputs), **options)
    kind = "onnx" if is_onnx_model(model) else "torch"
    return Loaded(kind, args.model, model, cm, list(inputs))


def check(loaded: Loaded) -> tuple[float, str]:
    """(relative error, what it was compared with)."""
    import torch

    ref = baseline(loaded.source, loaded.compiled.graph)
    with torch.no_grad():
        out = loaded.compiled(*loaded.inputs)
        return relative_error(out, ref.run(*loaded.inputs)), ref.name


def bench(loaded: Loaded, repeat: int) -> dict[str, float]:
    ref = baseline(loaded.source, loaded.compiled.graph)
    times = median_ms([loaded.compiled, ref.run], loaded.inputs, repeat)
    return {"autofusion": times[0], ref.name: times[1]}


def export(loaded: Loaded, path: str, plain: bool) -> None:
    from autofusion.export.onnx import export_graph, export_plan, save

    cg = loaded.compiled.compiled
    if cg is None or cg.program is None:
        raise UsageError("nothing to export: the model did not compile to a plan")
    weights = cg.plan_weights()  # parameters, buffers and, with freezing, what was folded from them
    names, opset = None, 0
    if loaded.kind == "onnx":
        from autofusion.frontend.onnx.loader import default_opset

        names = [o.name for o in loaded.compiled.model.graph.output]
        opset = default_opset(loaded.compiled.model)
    symbolic = getattr(loaded.compiled.source, "symbolic_graph", None)
    graph = symbolic() if symbolic is not None else None
    if graph is not None:
        # Symbolic input dims: the graph planned with its sizes symbolic (the hints for the cost model),
        # so the file keeps the dynamic axes and computes its shapes at run time.
        from autofusion.compiler import plan_graph
        from autofusion.errors import ExportError

        try:
            splan = plan_graph(graph, loaded.compiled.options)
            sym = (
                export_graph(splan.graph, names, {}, opset) if plain else export_plan(splan, names, {}, opset)
            )
            save(sym, path)
            return
        except ExportError as e:
            logging.getLogger("autofusion.export").warning(
                "%s: the export keeps the sizes it was compiled for, not its dynamic axes: %s",
                loaded.label,
                e,
            )
    plan = cg.program.plan
    model = (
        export_graph(plan.graph, names, weights, opset) if plain else export_plan(plan, names, weights, opset)
    )
    save(model, path)


def _mib(n: Any) -> str:
    return "-" if n is None else f"{n / 2**20:.2f} MiB"


def summary_table(loaded: Loaded, stats: dict[str, Any]) -> Table:
    cg = loaded.compiled.compiled
    after = len(cg.program.plan.graph.nodes) if cg is not None and cg.program else None
    m = loaded.measurements
    target = escape(str(stats.get("target", "cpu")))
    table = Table(title=f"autofusion optimize {escape(loaded.label)} (target {target})")
    table.add_column("")
    table.add_column("value", justify="right", no_wrap=True)
    rows: list[tuple[str, str]] = [
        ("IR ops imported", str(stats.get("ops", "-"))),
        ("IR ops after rewriting", "-" if after is None else str(after)),
        (common.FUSED_KERNELS, str(stats.get("fused_kernels", "-"))),
        (f"{common.STEPS_PER_RUN} ({common.STEPS_MEANING})", str(stats.get("kernels", "-"))),
        ("extern calls", str(stats.get("extern_calls", "-"))),
        ("memory traffic before (est.)", _mib(stats.get("bytes_before"))),
        ("memory traffic after (est.)", _mib(stats.get("bytes_after"))),
        (
            "fused kernels latency (est.)",
            "-" if stats.get("estimated_us") is None else f"{stats['estimated_us'] / 1e3:.3f} ms",
        ),
        ("measured latency (median)", "-" if "measured_ms" not in m else f"{m['measured_ms']:.3f} ms"),
    ]
    for name, ms in m.get("baseline_ms", {}).items():
        rows.append((f"{name} (median)", f"{ms:.3f} ms  ({ms / m['measured_ms']:.2f}x)"))
    if "check_error" in m:
        ok = m["check_error"] <= m["check_tolerance"]
        colour = "green" if ok else "red"
        rows.append(
            (f"check vs {m['check_against']}", f"[{colour}]{m['check_error']:.3g} rel. error[/{colour}]")
        )
    rows.append(("fallbacks", str(sum(stats.get("fallbacks", {}).values()))))
    eager = stats.get("eager_fallback")
    rows.append(("ran eagerly", f"[red]yes: {escape(str(eager))}[/red]" if eager else "no"))
    for label, value in rows:
        table.add_row(label, value)
    return table


def run(args: argparse.Namespace, console: Console) -> int:
    from autofusion.errors import CompilerError

    options = cli_options.fusion_options(args)
    try:
        loaded = load(args, options)
        loaded.measurements["measured_ms"] = median_ms([loaded.compiled], loaded.inputs, args.repeat)[0]
        if args.check:
            err, against = check(loaded)
            loaded.measurements.update(
                check_error=err, check_against=against, check_tolerance=model_tolerance(loaded.inputs)
            )
        if args.bench:
            times = bench(loaded, args.repeat)
            loaded.measurements["measured_ms"] = times.pop("autofusion")
            loaded.measurements["baseline_ms"] = times
        if args.export:
            export(loaded, args.export, plain=False)
        if args.export_plain:
            export(loaded, args.export_plain, plain=True)
        if args.save:
            from autofusion.package import save

            save(loaded.compiled, args.save, weights=args.save_weights)
        if args.report:
            from autofusion.tools.diagnose.report import collect, render_html

            data = collect(loaded.source, loaded.inputs, args.model, options, runs=args.repeat)
            Path(args.report).write_text(render_html(data))
    except (CompilerError, UsageError) as e:
        if args.json:
            console.print_json(json.dumps({"model": args.model, "error": str(e)}))
        raise UsageError(str(e)) from None
    stats = dict(loaded.compiled.stats)
    stats["target"] = args.target
    failed = (
        "check_error" in loaded.measurements
        and not loaded.measurements["check_error"] <= loaded.measurements["check_tolerance"]
    )
    status = EXIT_USAGE if stats.get("eager_fallback") else EXIT_FINDING if failed else EXIT_OK
    if args.json:
        out = {"model": args.model, **stats, **loaded.measurements}
        if "check_error" in out and not math.isfinite(out["check_error"]):
            out["check_error"] = str(out["check_error"])
        console.print_json(json.dumps(out, default=str))
    else:
        common.print_table(console, summary_table(loaded, stats))
        for reason, n in stats.get("fallbacks", {}).items():
            console.print(f"  fallback {n}x {escape(reason)}")
        for path in filter(None, (args.export, args.export_plain, args.report, args.save)):
            console.print(f"wrote {escape(path)}")
    if stats.get("eager_fallback"):
        common.error(common.make_console(stderr=True), NAME,
                     f"{args.model} ran eagerly, not compiled: {stats['eager_fallback']}")  # fmt: skip
    return status
