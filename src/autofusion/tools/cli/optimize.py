"""``autofusion optimize MODEL``: compile a model, print what fusion did; optionally check, time, export it.

MODEL is ``builtin:NAME``, a path to an ``.onnx`` file, or ``package.module:factory`` where ``factory()``
returns ``(module, example_inputs)``. ONNX models get random inputs of their declared shapes (symbolic
dims set with ``--dim NAME=SIZE``). The summary table shows ops before and after rewriting, kernels per
run, estimated memory traffic before and after fusion, estimated and measured latency, and fallbacks;
``--json`` prints the compiled object's ``.stats`` with the measurements added instead.

Exit status: 0 on success, 1 when ``--check`` finds a result that differs, 2 for usage errors and for
models that cannot be read or compiled (the message says why; no traceback), including a model that
ran eagerly instead of compiled (the table's "ran eagerly" row and ``eager_fallback`` say why).
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

from autofusion.tools.cli.main import _TOLERANCE, UsageError, median_ms, relative_error
from autofusion.tools.models.loader import ort_run as _ort_run
from autofusion.tools.models.loader import ort_session as _ort_session

logger = logging.getLogger(__name__)


def add_optimize_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "optimize",
        help="compile one model (builtin:NAME, a .onnx file or package.module:factory) and report on it",
        description="Compile a model with autofusion and print what fusion did. MODEL is builtin:NAME, "
        "a path "
        "to an .onnx file, or package.module:factory (factory() returns (module, example_inputs)).",
    )
    p.add_argument("model", metavar="MODEL")
    p.add_argument("--target", default="cpu", help="hardware profile: cpu, ascend910b, h200 or a YAML path")
    p.add_argument("--json", action="store_true", help="print the stats as JSON instead of the table")
    p.add_argument(
        "--check",
        action="store_true",
        help="compare with onnxruntime (ONNX models; the reference runtime when it is not installed) "
        "or eager PyTorch (torch models)",
    )
    p.add_argument(
        "--bench", action="store_true", help="time against onnxruntime (ONNX) or eager PyTorch, side by side"
    )
    p.add_argument("--repeat", type=int, default=20, metavar="N", help="timed runs (median; default 20)")
    p.add_argument(
        "--export", metavar="PATH", help="write the optimised graph as ONNX, fused kernels as functions"
    )
    p.add_argument("--export-plain", metavar="PATH", help="write the rewritten, unfused graph as plain ONNX")
    p.add_argument("--report", metavar="HTML", help="write the HTML report (as `autofusion report`) to this path")
    p.add_argument(
        "--dim",
        metavar="NAME=SIZE",
        action="append",
        default=[],
        help="size of a symbolic input dim of an ONNX model (repeatable)",
    )
    from autofusion.tools.cli.main import _add_fusion_options

    _add_fusion_options(p)  # --rules, --config, --blacklist, --disable ... as on `demo`


@dataclass
class Loaded:
    kind: str  # "torch" or "onnx"
    label: str
    compiled: Any
    inputs: list[Any]
    module: Any = None  # the torch module (torch models)
    onnx_path: Path | None = None
    measurements: dict[str, Any] = field(default_factory=dict)


def _parse_dims(specs: list[str]) -> dict[str, int]:
    from autofusion.tools.models.loader import parse_dims

    try:
        return parse_dims(specs)
    except ValueError as e:
        raise UsageError(str(e)) from None


def load(spec: str, options: dict[str, Any], dims: dict[str, int]) -> Loaded:
    """MODEL through the loader every tool shares (tools/tools/models/loader.py), compiled with `options`."""
    import torch

    import autofusion
    from autofusion.errors import CompilerError
    from autofusion.tools.models.loader import is_onnx_spec, load_model

    try:
        module, inputs = load_model(spec, dims)
    except CompilerError:
        raise  # a model file that cannot be read: reported like a failed compile (exit 2, no usage text)
    except ValueError as e:
        raise UsageError(str(e)) from None
    if not spec.startswith("builtin:") and is_onnx_spec(spec):
        cm = autofusion.compile(module, inputs, **options)
        return Loaded("onnx", spec, cm, list(inputs), onnx_path=Path(spec))
    with torch.no_grad():
        cm = autofusion.compile(module, tuple(inputs), **options)
    return Loaded("torch", spec, cm, list(inputs), module=module)


def tolerance(loaded: Loaded) -> float:
    """The demo's relative tolerance for the model's lowest-precision floating input."""
    import torch

    halves = [t for t in loaded.inputs if t.dtype in (torch.float16, torch.bfloat16)]
    return _TOLERANCE[str(halves[0].dtype).removeprefix("torch.")] if halves else _TOLERANCE["float32"]


def check(loaded: Loaded) -> tuple[float, str]:
    """(relative error, what it was compared with)."""
    import torch

    out = loaded.compiled(*loaded.inputs)
    if loaded.kind == "torch":
        with torch.no_grad():
            return relative_error(out, loaded.module(*loaded.inputs)), "eager PyTorch"
    sess = _ort_session(loaded.onnx_path)
    if sess is not None:
        return relative_error(out, _ort_run(sess, loaded.inputs)), "onnxruntime"
    from autofusion.ir.interpret import run_graph

    ref = run_graph(loaded.compiled.graph, loaded.inputs)
    return relative_error(out, ref[0] if len(ref) == 1 else tuple(ref)), "reference runtime"


def bench(loaded: Loaded, repeat: int) -> dict[str, float]:
    fns: dict[str, Any] = {"autofusion": loaded.compiled}
    if loaded.kind == "torch":
        fns["eager PyTorch"] = loaded.module
    else:
        sess = _ort_session(loaded.onnx_path)
        if sess is not None:
            feeds = {i.name: t.numpy() for i, t in zip(sess.get_inputs(), loaded.inputs, strict=False)}
            fns["onnxruntime"] = lambda *_: sess.run(None, feeds)
    times = median_ms(list(fns.values()), loaded.inputs, repeat)
    return dict(zip(fns, times, strict=False))


def export(loaded: Loaded, path: str, plain: bool) -> None:
    from autofusion.export.onnx import export_graph, export_plan, save

    cg = loaded.compiled.last
    if cg is None or isinstance(cg, str) or cg.program is None:
        raise UsageError("nothing to export: the model did not compile to a plan")
    pairs = zip(cg.graph.inputs, cg.captured.bindings, strict=True)
    weights = {gi.name: v for gi, (k, v) in pairs if k == "bound"}
    names, opset = None, 0
    if loaded.kind == "onnx":
        from autofusion.frontend.onnx.loader import default_opset

        names = [o.name for o in loaded.compiled.model.graph.output]
        opset = default_opset(loaded.compiled.model)
    plan = cg.program.plan
    if plain:
        model = export_graph(plan.graph, names, weights, opset)
    else:
        model = export_plan(plan, names, weights, opset)
    save(model, path)


def _mib(n: Any) -> str:
    return "-" if n is None else f"{n / 2**20:.2f} MiB"


def summary_table(loaded: Loaded, stats: dict[str, Any]) -> Table:
    cg = loaded.compiled.last
    after = (
        len(cg.program.plan.graph.nodes)
        if cg is not None and not isinstance(cg, str) and cg.program
        else None
    )
    m = loaded.measurements
    table = Table(title=f"autofusion optimize {loaded.label} (target {stats.get('target', 'cpu')})")
    table.add_column("", no_wrap=True)
    table.add_column("value", justify="right")
    rows: list[tuple[str, str]] = [
        ("IR ops imported", str(stats.get("ops", "-"))),
        ("IR ops after rewriting", "-" if after is None else str(after)),
        ("kernels per run (fused + library)", str(stats.get("kernels", "-"))),
        ("fused kernels", str(stats.get("fused_kernels", "-"))),
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


def cmd_optimize(args: argparse.Namespace, console: Console) -> int:
    from autofusion.errors import CompilerError

    if args.repeat < 1:
        raise UsageError("--repeat must be >= 1")
    dims = _parse_dims(args.dim)
    try:
        from autofusion.tools.cli.main import _fusion_overrides

        loaded = load(args.model, {"target": args.target, **_fusion_overrides(args)}, dims)
        loaded.measurements["measured_ms"] = median_ms([loaded.compiled], loaded.inputs, args.repeat)[0]
        if args.check:
            err, against = check(loaded)
            loaded.measurements.update(
                check_error=err, check_against=against, check_tolerance=tolerance(loaded)
            )
        if args.bench:
            times = bench(loaded, args.repeat)
            loaded.measurements["measured_ms"] = times.pop("autofusion")
            loaded.measurements["baseline_ms"] = times
        if args.export:
            export(loaded, args.export, plain=False)
        if args.export_plain:
            export(loaded, args.export_plain, plain=True)
        if args.report:
            from autofusion.tools.diagnose.report import collect, render_html

            source = loaded.module if loaded.kind == "torch" else loaded.onnx_path
            options = {"target": args.target, **_fusion_overrides(args)}
            data = collect(source, loaded.inputs, args.model, options, runs=args.repeat)
            Path(args.report).write_text(render_html(data))
    except CompilerError as e:
        if args.json:
            console.print_json(json.dumps({"model": args.model, "error": str(e)}))
        else:
            console.print(f"[red]autofusion: error:[/red] {escape(str(e))}", highlight=False)
        return 2
    stats = dict(loaded.compiled.stats)
    stats["target"] = args.target
    failed = (
        "check_error" in loaded.measurements
        and not loaded.measurements["check_error"] <= loaded.measurements["check_tolerance"]
    )
    status = 2 if stats.get("eager_fallback") else 1 if failed else 0
    if args.json:
        out = {"model": args.model, **stats, **loaded.measurements}
        if "check_error" in out and not math.isfinite(out["check_error"]):
            out["check_error"] = str(out["check_error"])
        console.print_json(json.dumps(out, default=str))
        return status
    console.print(summary_table(loaded, stats))
    for reason, n in stats.get("fallbacks", {}).items():
        console.print(f"  fallback {n}x {escape(reason)}", highlight=False)
    if stats.get("eager_fallback"):
        console.print(f"[red]autofusion: error:[/red] {escape(args.model)} ran eagerly, not compiled: "
                      f"{escape(str(stats['eager_fallback']))}", highlight=False)  # fmt: skip
    for path in filter(None, (args.export, args.export_plain, args.report)):
        console.print(f"wrote {escape(path)}", highlight=False)
    return status
