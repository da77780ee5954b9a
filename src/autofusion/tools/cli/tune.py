"""`autofusion tune MODEL...`: search the plan's switches by measurement and keep the result.

MODEL is as for `optimize` (several may be given). The search (`autofusion.tools.tune.search`) starts
from the default plan, tries each switch, keeps a change only when it measured faster by more than
the noise, and stores a tuning record for the graph on this machine: in the cache directory (where
`compile` finds it by default), or in `--record PATH` (a JSON lines file; `compile(..., tuning=PATH)`
reads it). `--ray auto|ADDRESS` runs the evaluations on the Ray cluster's nodes of this machine's
fingerprint (`autofusion.tools.tune.distributed`; `--ray-label` prints the resource they offer).

With `--json`, one JSON line per model: `model`, `default_ms`, `tuned_ms` (both measured side by side
at the end of that model's run), `speedup`, `record` (where it was stored), `overrides`,
`decisions`, `rejected`, `candidates`, `timed`, `seconds`; with several models, a last line
`{"models": [...], "geomean_speedup": ...}`.

Exit status: 0, or 2 when a model cannot be read or compiled, or Ray cannot be used.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from autofusion.tools.cli import common
from autofusion.tools.cli import options as cli_options
from autofusion.tools.cli.common import EXIT_OK, UsageError

NAME = "tune"


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser(
        NAME,
        parents=[common.log_parent(), common.fusion_parent()],
        help="search fusion switches by measurement on this machine and store a tuning record",
        description="Tune models: conv layouts (all chains and per chain), the linears' library route, "
        "GEMMs in or out of SuperKernels, kernel threads, tile parameters, each fusion rule, pass, "
        "SuperKernel mode, freezing and size limit are tried from the default plan; a change is kept only "
        "when measured faster than the noise. The record is stored where autofusion.compile finds it.",
    )
    p.add_argument("models", metavar="MODEL", nargs="*", help=common.MODEL_FORMS)
    p.add_argument("--dim", metavar="NAME=SIZE", action="append", default=[],
                   help="size of a symbolic input dim of an ONNX model (repeatable)")  # fmt: skip
    p.add_argument("--budget", type=float, default=60.0, metavar="SECONDS", help="search time per model")
    p.add_argument("--rounds", type=common.positive_int, default=9, help="alternating rounds per comparison")
    p.add_argument("--rtol", type=float, metavar="R",
                   help="relative error a candidate may have against the reference (default: that of the "
                   "model's lowest-precision input type, 1e-5 for float32)")  # fmt: skip
    p.add_argument("--record", metavar="PATH", help="store records in this JSON lines file, not the cache")
    p.add_argument("--ray", metavar="auto|ADDRESS", help="evaluate on a Ray cluster (auto: running or local)")
    p.add_argument(
        "--ray-label", action="store_true", help="print the Ray resource this machine's nodes offer"
    )
    p.add_argument("--json", action="store_true", help="one JSON line per model")
    return p


def run(args: argparse.Namespace, console: Console) -> int:
    if args.ray_label:
        from autofusion.tools.tune.distributed import machine_resource

        print(machine_resource())
        return EXIT_OK
    if not args.models:
        raise UsageError("give at least one MODEL")
    if args.budget <= 0:
        raise UsageError("--budget must be > 0 seconds")
    units = 0
    if args.ray:
        from autofusion.tools.tune.distributed import RayUnavailable, connect

        try:
            units = connect(args.ray)
        except (RayUnavailable, ConnectionError, ValueError) as e:
            raise UsageError(f"--ray {args.ray}: {e}") from None
    outs = [tune_one(args, spec, units, console) for spec in args.models]
    if args.json and len(outs) > 1:
        speedups = [o["speedup"] for o in outs]
        geomean = math.exp(sum(math.log(s) for s in speedups) / len(speedups))
        print(json.dumps({"models": outs, "geomean_speedup": round(geomean, 4)}))
    return EXIT_OK


def tune_one(args: argparse.Namespace, spec: str, units: int, console: Console) -> dict[str, Any]:
    import torch

    from autofusion import tuning
    from autofusion.cache import Cache
    from autofusion.config import Options
    from autofusion.errors import CompilerError
    from autofusion.tools.tune.search import DefaultPlanWrong, Tuner

    options = cli_options.fusion_options(args)
    args.model = spec  # what the shared loader reads
    model, inputs = cli_options.load_model(args)
    try:
        with torch.no_grad():
            tuner = Tuner(model, inputs, options, budget_s=args.budget, rounds=args.rounds, rtol=args.rtol)
            mapper = None
            if units:
                from autofusion.tools.tune.distributed import ray_mapper

                mapper = ray_mapper(tuner.problem, units)
            with Progress(TextColumn("{task.description}"), BarColumn(), TimeRemainingColumn(),
                          console=common.make_console(stderr=True), transient=True) as bar:  # fmt: skip
                task = bar.add_task(f"tuning {spec}", total=args.budget)

                def progress(label: str, k: int, n: int) -> None:
                    spent = min(args.budget - tuner.left(), args.budget)
                    bar.update(task, completed=spent, description=f"{spec} [{k + 1}/{n}] {label}")

                result = tuner.run(progress, mapper)
    except (CompilerError, DefaultPlanWrong) as e:
        raise UsageError(f"{spec}: {e}") from None
    record = tuner.record
    assert record is not None  # run() made it
    if args.record:
        where = tuning.store(record, Path(args.record))
    else:
        where = tuning.store(record, Cache(Options.from_env(**options).cache_dir))
    out = {
        "model": spec, "default_ms": round(result.default_ms, 4), "tuned_ms": round(result.tuned_ms, 4),
        "speedup": round(result.speedup, 4), "record": where, "overrides": record.overrides,
        "decisions": [{"option": d.option, "value": d.value, "gain": d.gain} for d in result.decisions],
        "rejected": [{"knob": k, "why": w} for k, w in result.rejected],
        "candidates": result.candidates, "timed": result.timed, "seconds": round(result.seconds, 2),
    }  # fmt: skip
    if args.json:
        print(json.dumps(out))
        return out
    table = Table(title=f"autofusion tune {escape(spec)}")
    for col in ("decision", "gain"):
        table.add_column(col)
    for d in result.decisions:
        table.add_row(escape(f"{d.option}={d.value}"), f"x{d.gain:.3f}")
    if not result.decisions:
        table.add_row("(the default plan was fastest)", "-")
    common.print_table(console, table)
    console.print(f"default {result.default_ms:.3f} ms, tuned {result.tuned_ms:.3f} ms "
                  f"(x{result.speedup:.3f}); {result.candidates} candidates, {result.timed} timed, "
                  f"{len(result.rejected)} dropped, {result.seconds:.1f} s")  # fmt: skip
    console.print(f"record: {escape(where)}")
    for label, why in result.rejected:
        console.print(f"dropped {escape(label)}: {escape(why)}")
    return out
