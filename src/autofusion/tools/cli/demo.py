"""`autofusion demo`: compile the built-in models both ways, check them against eager PyTorch, time them.

Exit status: 0 when every model compiled and matches eager; 1 (a finding) when a compiled result
differs from eager or a model ran eagerly instead of compiled; 2 for usage errors.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from autofusion.tools.cli import common
from autofusion.tools.cli import options as cli_options
from autofusion.tools.cli.common import EXIT_FINDING, EXIT_OK, UsageError
from autofusion.tools.diagnose.compare import TOLERANCES, median_ms, relative_error
from autofusion.tools.models.names import BUILTIN_NAMES

logger = logging.getLogger(__name__)

NAME = "demo"
DTYPES = ("float32", "float16", "bfloat16")


@dataclass
class DemoRow:
    """What ``demo`` found for one model; ``None`` fields were not measured because a step failed."""

    model: str
    ops: int | None = None
    extern_calls: int | None = None
    steps: int | None = None  # steps per run: fused kernels + library and view ops
    fused_kernels: int | None = None
    api_error: float | None = None
    dynamo_error: float | None = None
    eager_ms: float | None = None
    autofusion_ms: float | None = None
    failures: list[str] = field(default_factory=list)
    # Routes that ran the model eagerly instead of compiled, and why ("autofusion.compile: reason").
    eager: list[str] = field(default_factory=list)

    def equal(self, tol: float) -> bool:
        return (
            not self.failures
            and self.api_error is not None
            and self.dynamo_error is not None
            and self.api_error <= tol
            and self.dynamo_error <= tol
        )


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser(
        NAME,
        parents=[
            common.log_parent(),
            common.repeat_parent(20, "timed runs per model (median)"),
            common.fusion_parent(),
        ],
        help="compile the built-in models, check them against eager PyTorch and time them",
        description="Compile each built-in model with autofusion.compile and with "
        'torch.compile(backend="autofusion"), check both against eager, and time eager vs autofusion.',
    )
    p.add_argument("--model", dest="models", metavar="NAME", action="extend", nargs="+",
                   help=f"built-in model(s) to run (default: all of {', '.join(BUILTIN_NAMES)})")  # fmt: skip
    p.add_argument("--dtype", choices=DTYPES, default="float32", help="dtype of weights and inputs")
    return p


def run(args: argparse.Namespace, console: Console) -> int:
    from autofusion.tools.models import builtin

    names = list(dict.fromkeys(args.models or BUILTIN_NAMES))
    for name in names:
        if name not in BUILTIN_NAMES:
            try:
                builtin(name)
            except ValueError as exc:
                raise UsageError(str(exc)) from None
    tol = TOLERANCES[args.dtype].rtol
    overrides = cli_options.fusion_options(args)
    rows = []
    for name in names:
        with console.status(f"compiling and timing {name} ..."):
            rows.append(_run_model(name, args.dtype, args.repeat, overrides))
    common.print_table(console, _table(rows, args.dtype, args.repeat))

    for row in rows:
        for failure in row.failures:
            console.print(f"[red]{row.model}[/red]: {escape(failure)}")
        for label, err in (("autofusion.compile", row.api_error), ("torch.compile", row.dynamo_error)):
            if err is not None and err > tol:
                console.print(f"[red]{row.model}[/red]: {label} relative error {err:.3g} > {tol:g}")
        for reason in row.eager:
            console.print(f"[red]{row.model}[/red]: ran eagerly: {escape(reason)}")
    return EXIT_OK if all(row.equal(tol) and not row.eager for row in rows) else EXIT_FINDING


def _run_model(name: str, dtype_name: str, repeat: int, options: dict[str, Any]) -> DemoRow:
    import torch

    from autofusion import api
    from autofusion.tools.models import builtin

    row = DemoRow(name)
    model, inputs = builtin(name, dtype=getattr(torch, dtype_name))
    with torch.no_grad():
        # Eager CPU kernels can differ between the first call in a process and later ones (tanh over
        # 1M elements: 5.2e-5 relative, eager against eager); compare with a settled second call.
        model(*inputs)
        ref = model(*inputs)

    cm: Any = None
    try:
        with torch.no_grad():
            cm = api.compile(model, inputs, **options)
            row.api_error = relative_error(cm(*inputs), ref)
        stats = getattr(cm, "stats", None) or {}
        if stats.get("eager_fallback"):
            row.eager.append(f"autofusion.compile: {stats['eager_fallback']}")
        row.ops = stats["ops"] if "ops" in stats else len(cm.graph.nodes)
        row.extern_calls = stats.get("extern_calls")
        row.steps = stats.get("kernels")
        row.fused_kernels = stats.get("fused_kernels")
    except Exception as exc:
        logger.debug("autofusion.compile failed on %s", name, exc_info=True)
        row.failures.append(f"autofusion.compile: {type(exc).__name__}: {exc}")
        cm = None

    try:
        torch._dynamo.reset()
        graphs: list[Any] = []
        compiled = torch.compile(model, backend=_recording_backend(graphs))
        with torch.no_grad():
            row.dynamo_error = relative_error(compiled(*inputs), ref)
        row.eager += _dynamo_eager(graphs)
    except Exception as exc:
        logger.debug('torch.compile(backend="autofusion") failed on %s', name, exc_info=True)
        row.failures.append(f'torch.compile(backend="autofusion"): {type(exc).__name__}: {exc}')

    if cm is None:
        (row.eager_ms,) = median_ms([model], inputs, repeat)
    else:
        try:
            row.eager_ms, row.autofusion_ms = median_ms([model, cm], inputs, repeat)
        except Exception as exc:  # noqa: BLE001 - reported in the table, and the next model runs
            row.failures.append(f"timing autofusion.compile: {type(exc).__name__}: {exc}")
    return row


def _recording_backend(graphs: list[Any]) -> Callable[..., Any]:
    """The autofusion backend, keeping each callable it hands Dynamo (to see which ran eagerly)."""

    def backend(gm: Any, example_inputs: Any, **kwargs: Any) -> Any:
        from autofusion import backend as af_backend

        fn = af_backend.autofusion_backend(gm, example_inputs, **kwargs)
        graphs.append(fn)
        return fn

    return backend


def _dynamo_eager(graphs: list[Any]) -> list[str]:
    """Why the torch.compile route ran (part of) the model eagerly; [] when every graph compiled."""
    if not graphs:
        return ["torch.compile: no graph reached the autofusion backend (Dynamo ran the model eagerly)"]
    return [f"torch.compile: {fn.autofusion_stats()['eager_fallback']}" for fn in graphs
            if getattr(fn, "autofusion_graph", None) is None]  # fmt: skip


def _fmt(value: float | int | None, spec: str = "") -> str:
    return "-" if value is None else format(value, spec)


def _equal_cell(row: DemoRow, tol: float) -> str:
    if row.equal(tol):
        return "[green]yes[/green]"
    bad = []
    if row.api_error is None or row.api_error > tol:
        bad.append("api")
    if row.dynamo_error is None or row.dynamo_error > tol:
        bad.append("torch.compile")
    return f"[red]no ({', '.join(bad)})[/red]"


def _compiled_cell(row: DemoRow) -> str:
    """'yes', or which routes ran the model eagerly."""
    if not row.eager:
        return "[green]yes[/green]"
    routes = sorted({e.split(":", 1)[0].replace("autofusion.compile", "api") for e in row.eager})
    return f"[red]eager ({', '.join(routes)})[/red]"


def _table(rows: list[DemoRow], dtype_name: str, repeat: int) -> Table:
    tol = TOLERANCES[dtype_name].rtol
    table = Table(title=f"autofusion demo ({dtype_name}, median of {repeat} runs, rel. tol {tol:g}; "
                  f"steps: {common.STEPS_MEANING})")  # fmt: skip
    table.add_column("model", no_wrap=True)
    for column in ("ops", "externs", common.FUSED_KERNELS, common.STEPS_PER_RUN):
        table.add_column(column, justify="right", no_wrap=True)
    table.add_column("equal")
    table.add_column("compiled")
    for column in ("eager ms", "autofusion ms", "speedup"):
        table.add_column(column, justify="right", no_wrap=True)
    for row in rows:
        speedup = None
        if row.eager_ms is not None and row.autofusion_ms:
            speedup = row.eager_ms / row.autofusion_ms
        table.add_row(
            row.model,
            _fmt(row.ops),
            _fmt(row.extern_calls),
            _fmt(row.fused_kernels),
            _fmt(row.steps),
            _equal_cell(row, tol),
            _compiled_cell(row),
            _fmt(row.eager_ms, ".3f"),
            _fmt(row.autofusion_ms, ".3f"),
            "-" if speedup is None else f"{speedup:.2f}x",
        )
    return table
