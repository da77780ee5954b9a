"""The ``autofusion`` command line: argv in, a rich report on stdout and an exit status out.

Each subcommand is a pair of functions: ``_add_<name>_parser(subparsers)`` declares its arguments and
``cmd_<name>(args, console) -> int`` runs it. To add one, write the pair and list the first in
``_SUBCOMMANDS``. Global options (``--log-level``) are handled once in ``main``.

Exit status: 0 on success, 1 when a result is wrong (a compiled output differs from eager) or a model
``demo`` was asked to compile ran eagerly instead, 2 for usage errors (argparse's convention).
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from autofusion.tools.cli.cache import add_cache_parser
from autofusion.tools.cli.dfx import DFX_SUBCOMMANDS, ToolUsageError

logger = logging.getLogger(__name__)

_LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
_DTYPES = ("float32", "float16", "bfloat16")
# max |out - ref| / max |ref| allowed, per dtype
_TOLERANCE = {"float32": 1e-5, "float16": 1e-2, "bfloat16": 1e-2}
_WARMUP = 3


class UsageError(Exception):
    """A subcommand rejected its arguments; ``main`` reports it the way argparse does (exit status 2)."""


# --------------------------------------------------------------------------------------------------
# Helpers shared by subcommands
# --------------------------------------------------------------------------------------------------


def _flatten(obj: Any) -> list[Any]:
    """Leaves of a (nested) tensor / tuple / list / dict output, in a stable order."""
    if isinstance(obj, (tuple, list)):
        return [leaf for item in obj for leaf in _flatten(item)]
    if isinstance(obj, dict):
        return [leaf for key in sorted(obj, key=str) for leaf in _flatten(obj[key])]
    return [obj]


def relative_error(out: Any, ref: Any) -> float:
    """max |out - ref| / max |ref| over all tensor leaves; ``inf`` when structure, shape or dtype differ.

    Positions where both sides hold the same non-finite value (e.g. -inf) count as equal; a NaN on only
    one side, or anywhere in ``out`` where ``ref`` is finite, makes the error infinite.
    """
    import torch

    outs, refs = _flatten(out), _flatten(ref)
    if len(outs) != len(refs):
        return float("inf")
    worst = 0.0
    for o, r in zip(outs, refs, strict=True):
        if not isinstance(r, torch.Tensor):
            if o != r:
                return float("inf")
            continue
        if not isinstance(o, torch.Tensor) or o.shape != r.shape or o.dtype != r.dtype:
            return float("inf")
        if r.numel() == 0:
            continue
        o64, r64 = o.detach().double(), r.detach().double()
        same = (o64 == r64) | (o64.isnan() & r64.isnan())
        if not torch.isfinite(r64[~same]).all() or not torch.isfinite(o64[~same]).all():
            return float("inf")
        finite_ref = r64[torch.isfinite(r64)]
        scale = finite_ref.abs().max().item() if finite_ref.numel() else 0.0
        err = (o64 - r64)[~same].abs().max().item() if (~same).any() else 0.0
        worst = max(worst, err / scale if scale > 0 else err)
    return worst


def median_ms(fns: Sequence[Callable[..., Any]], inputs: Sequence[Any], repeat: int,
              warmup: int = _WARMUP) -> list[float]:  # fmt: skip
    """Median wall time of each ``fn(*inputs)`` in milliseconds, under ``torch.no_grad()``.

    The functions take turns within every round, so a noisy neighbour or a frequency change hits all
    of them alike instead of whichever happened to be measured first.
    """
    import torch

    times: list[list[float]] = [[] for _ in fns]
    with torch.no_grad():
        for fn in fns:
            for _ in range(warmup):
                fn(*inputs)
        for _ in range(repeat):
            for k, fn in enumerate(fns):
                start = time.perf_counter()
                fn(*inputs)
                times[k].append((time.perf_counter() - start) * 1e3)
    return [statistics.median(t) for t in times]


# --------------------------------------------------------------------------------------------------
# demo
# --------------------------------------------------------------------------------------------------


@dataclass
class DemoRow:
    """What ``demo`` found for one model; ``None`` fields were not measured because a step failed."""

    model: str
    ops: int | None = None
    extern_calls: int | None = None
    kernels: int | None = None  # calls per run: fused kernels + library ops
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


def _add_demo_parser(sub: argparse._SubParsersAction) -> None:
    from autofusion.tools.models import BUILTIN_NAMES

    p = sub.add_parser(
        "demo",
        help="compile the built-in models, check them against eager PyTorch and time them",
        description="Compile each built-in model with autofusion.compile and with "
        'torch.compile(backend="autofusion"), check both against eager, and time eager vs autofusion.',
    )
    p.add_argument(
        "--model",
        dest="models",
        metavar="NAME",
        action="extend",
        nargs="+",
        help=f"built-in model(s) to run (default: all of {', '.join(BUILTIN_NAMES)})",
    )
    p.add_argument("--dtype", choices=_DTYPES, default="float32", help="dtype of weights and inputs")
    p.add_argument("--repeat", type=int, default=20, metavar="N", help="timed runs per model (median)")
    _add_fusion_options(p)
    p.set_defaults(func=cmd_demo)


def _add_fusion_options(p: argparse.ArgumentParser) -> None:
    """Rule files, lists and switches (the same as Options fields and their environment variables)."""
    g = p.add_argument_group("fusion rules and switches")
    g.add_argument("--rules", action="append", default=[], metavar="FILE",
                   help="a fusion_rules YAML file, applied with the built-in classify_rule.yaml (repeatable)")
    g.add_argument("--no-builtin-rules", action="store_true", help="do not apply the built-in rules")
    g.add_argument("--blacklist", action="append", default=[], metavar="FILE",
                   help="a blacklist.txt of op types never fused (repeatable)")
    g.add_argument("--skip-node-names-cfg", default="", metavar="FILE",
                   help="an .ini with [ByNodeName]/[ByNodeType]: nodes kept out of fusion")
    g.add_argument("--fusion-config", "--config", dest="fusion_config", default="", metavar="FILE",
                   help='a JSON {"fusion_config": {"<rule or pass>": "on"|"off"}}')
    g.add_argument("--disable", default="", metavar="NAMES", help="comma-separated rules or passes to turn off")
    g.add_argument("--disable-file", default="", metavar="FILE",
                   help="a disable list (`autofusion bisect --write-disable`): rule and pass names turn "
                   "them off, other names are nodes whose merges are refused (NF2100)")


def _fusion_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """Options overrides from the command line; only the flags given, so the environment still applies."""
    out: dict[str, Any] = {}
    if getattr(args, "rules", None):
        out["rules_files"] = tuple(args.rules)
    if getattr(args, "no_builtin_rules", False):
        out["builtin_rules"] = False
    if getattr(args, "blacklist", None):
        out["blacklist"] = tuple(args.blacklist)
    if getattr(args, "skip_node_names_cfg", ""):
        out["skip_node_names_cfg"] = args.skip_node_names_cfg
    if getattr(args, "fusion_config", ""):
        out["fusion_config"] = args.fusion_config
    if getattr(args, "disable", ""):
        out["disabled"] = frozenset(x.strip() for x in args.disable.split(",") if x.strip())
    if getattr(args, "disable_file", ""):
        from autofusion.config import Options
        from autofusion.tools.cli.dfx import read_disable_file, split_disable

        switches, nodes = split_disable(read_disable_file(args.disable_file), out.get("rules_files"))
        if switches:
            out["disabled"] = out.get("disabled", Options.from_env().disabled) | frozenset(switches)
        out["disable_fusion"] = tuple(nodes)
    return out


def _add_rules_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "rules",
        help="check rule files and list every rule in the order it is tried",
        description="Load the built-in classify_rule.yaml and the given rule files (a bad file exits 2 with "
        "file:line and what is wrong) and list the rules: order, name, priority, steps, what they become, "
        "source.",
    )
    _add_fusion_options(p)
    p.set_defaults(func=cmd_rules)


def cmd_rules(args: argparse.Namespace, console: Console) -> int:
    from autofusion.config import Options
    from autofusion.passes.rewrite import RuleFileError, all_rules
    from autofusion.passes.rewrite.apply import rule_order

    try:
        options = Options.from_env(**_fusion_overrides(args))
        rules = rule_order(all_rules(options.rules_files, options.builtin_rules))
    except RuleFileError as exc:
        raise UsageError(str(exc)) from None
    table = Table(title="fusion rules, in the order they are tried")
    for column in ("#", "name", "priority", "steps", "becomes", "on", "source"):
        table.add_column(column)
    for i, r in enumerate(rules, 1):
        steps = " -> ".join(n.op_text for n in r.nodes)
        on = (
            "yes"
            if options.fusion
            and r.name not in options.disabled
            and (r.enabled or r.name in options.enabled_rules)
            else "no"
        )
        path, _, line = r.source.rpartition(":")
        source = escape(f"{Path(path).name}:{line}")
        table.add_row(str(i), r.name, str(r.priority), escape(steps), r.becomes, on, source)
    console.print(table)
    return 0


def _run_demo_model(
    name: str, dtype_name: str, repeat: int, options: dict[str, Any] | None = None
) -> DemoRow:
    import torch

    import autofusion
    from autofusion.tools.models import builtin

    row = DemoRow(name)
    model, inputs = builtin(name, dtype=getattr(torch, dtype_name))
    with torch.no_grad():
        # Eager CPU kernels can differ between the first call in a process and later ones (tanh over
        # 1M elements: 5.2e-5 relative, eager against eager); compare with a settled second call.
        model(*inputs)
        ref = model(*inputs)

    try:
        with torch.no_grad():
            cm = autofusion.compile(model, inputs, **(options or {}))
            row.api_error = relative_error(cm(*inputs), ref)
        stats = getattr(cm, "stats", None) or {}
        if stats.get("eager_fallback"):
            row.eager.append(f"autofusion.compile: {stats['eager_fallback']}")
        row.ops = stats["ops"] if "ops" in stats else len(cm.graph.nodes)
        row.extern_calls = stats.get("extern_calls")
        row.kernels = stats.get("kernels")
        row.fused_kernels = stats.get("fused_kernels")
    except Exception as exc:  # the demo reports every failure and moves on to the next model
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
        except Exception as exc:  # noqa: BLE001 - recorded in the row's failures; the survey goes on
            row.failures.append(f"timing autofusion.compile: {type(exc).__name__}: {exc}")
    return row


def _recording_backend(graphs: list[Any]) -> Callable[..., Any]:
    """The autofusion backend, keeping each callable it hands Dynamo (to see which ran eagerly)."""

    def backend(gm: Any, example_inputs: Any, **kwargs: Any) -> Any:
        from autofusion.backend import autofusion_backend

        fn = autofusion_backend(gm, example_inputs, **kwargs)
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


def _demo_table(rows: list[DemoRow], dtype_name: str, repeat: int) -> Table:
    tol = _TOLERANCE[dtype_name]
    table = Table(title=f"autofusion demo ({dtype_name}, median of {repeat} runs, rel. tol {tol:g})")
    table.add_column("model", no_wrap=True)
    for column in ("ops", "externs", "kernels", "fused"):
        table.add_column(column, justify="right")
    table.add_column("equal", no_wrap=True)
    table.add_column("compiled", no_wrap=True)
    for column in ("eager ms", "autofusion ms", "speedup"):
        table.add_column(column, justify="right")
    for row in rows:
        speedup = None
        if row.eager_ms is not None and row.autofusion_ms:
            speedup = row.eager_ms / row.autofusion_ms
        table.add_row(
            row.model,
            _fmt(row.ops),
            _fmt(row.extern_calls),
            _fmt(row.kernels),
            _fmt(row.fused_kernels),
            _equal_cell(row, tol),
            _compiled_cell(row),
            _fmt(row.eager_ms, ".3f"),
            _fmt(row.autofusion_ms, ".3f"),
            "-" if speedup is None else f"{speedup:.2f}x",
        )
    return table


def cmd_demo(args: argparse.Namespace, console: Console) -> int:
    """Run the demo; 1 when any compiled result differs from eager or a model ran eagerly, else 0."""
    from autofusion.tools.models import BUILTIN_NAMES, builtin

    if args.repeat < 1:
        raise UsageError("--repeat must be >= 1")
    names = list(dict.fromkeys(args.models or BUILTIN_NAMES))
    for name in names:
        if name not in BUILTIN_NAMES:
            try:
                builtin(name)
            except ValueError as exc:
                raise UsageError(str(exc)) from None
    tol = _TOLERANCE[args.dtype]
    from autofusion.config import Options
    from autofusion.passes.rewrite import RuleFileError, settle_options

    overrides = _fusion_overrides(args)
    try:
        settle_options(Options.from_env(**overrides))  # a bad rule file or list stops here, with file:line
    except RuleFileError as exc:
        raise UsageError(str(exc)) from None
    rows = []
    for name in names:
        with console.status(f"compiling and timing {name} ..."):
            rows.append(_run_demo_model(name, args.dtype, args.repeat, overrides))
    console.print(_demo_table(rows, args.dtype, args.repeat))

    for row in rows:
        for failure in row.failures:
            console.print(f"[red]{row.model}[/red]: {escape(failure)}", highlight=False)
        for label, err in (("autofusion.compile", row.api_error), ("torch.compile", row.dynamo_error)):
            if err is not None and err > tol:
                console.print(f"[red]{row.model}[/red]: {label} relative error {err:.3g} > {tol:g}")
        for reason in row.eager:
            console.print(f"[red]{row.model}[/red]: ran eagerly: {escape(reason)}", highlight=False)
    return 0 if all(row.equal(tol) and not row.eager for row in rows) else 1


# --------------------------------------------------------------------------------------------------
# Entry point
# --------------------------------------------------------------------------------------------------

def _add_optimize_parser(sub: argparse._SubParsersAction) -> None:
    # cli_optimize imports this module's helpers, so it is loaded only once this module is complete.
    from autofusion.tools.cli.optimize import add_optimize_parser, cmd_optimize

    add_optimize_parser(sub)
    sub.choices["optimize"].set_defaults(func=cmd_optimize)


_SUBCOMMANDS: tuple[Callable[[argparse._SubParsersAction], None], ...] = (
    _add_demo_parser,
    _add_rules_parser,
    _add_optimize_parser,
    *DFX_SUBCOMMANDS,
    add_cache_parser,
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="autofusion", description="Automatic operator fusion for PyTorch and ONNX models."
    )
    parser.add_argument(
        "--log-level",
        default="WARNING",
        type=str.upper,
        choices=_LOG_LEVELS,
        help="logging level (default: WARNING); logs go to stderr",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for add in _SUBCOMMANDS:
        add(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=getattr(logging, args.log_level),
        stream=sys.stderr,
        format="%(levelname)s %(name)s: %(message)s",
    )
    # Pipes and CI logs get rich's 80 columns by default, too narrow for the tables.
    console = Console(width=None if sys.stdout.isatty() else 120)
    try:
        return int(args.func(args, console))
    except (UsageError, ToolUsageError) as exc:
        parser.error(str(exc))  # exits with status 2
    except KeyboardInterrupt:
        console.print("[red]interrupted[/red]")
        return 130


if __name__ == "__main__":
    # Run through the imported module, so that subcommand modules importing from `autofusion.tools.cli.main`
    # (UsageError included) see the same classes as `main` (under -m this file is `__main__`).
    from autofusion.tools.cli.main import main as _main

    sys.exit(_main())
