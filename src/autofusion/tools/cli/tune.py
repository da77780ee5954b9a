"""`autofusion tune MODEL`: search the plan's switches by measurement and keep the result.

MODEL is as for `optimize`. The search (`autofusion.tools.tune.search`) starts from the default plan,
tries each switch, keeps a change only when it measured faster by more than the noise, and stores a
tuning record for this graph on this machine: in the cache directory (where `compile` finds it by
default), or in `--record PATH` (a JSON lines file; `compile(..., tuning=PATH)` reads it).

With `--json` the last line of stdout is one JSON object: `model`, `default_ms`, `tuned_ms` (both
measured side by side at the end of this run), `speedup`, `record` (where it was stored),
`overrides`, `decisions`, `rejected`, `candidates`, `timed`, `seconds`.

Exit status: 0, or 2 when the model cannot be read or compiled.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

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
        parents=[common.log_parent(), common.model_parent(), common.fusion_parent()],
        help="search fusion switches by measurement on this machine and store a tuning record",
        description="Tune one model: each fusion rule, pass, SuperKernel mode, freezing and size limit is "
        "tried from the default plan; a change is kept only when measured faster than the noise. The "
        "record is stored where autofusion.compile finds it.",
    )
    p.add_argument("--budget", type=float, default=60.0, metavar="SECONDS", help="stop searching after this")
    p.add_argument("--rounds", type=common.positive_int, default=9, help="alternating rounds per comparison")
    p.add_argument("--record", metavar="PATH", help="store the record in this JSON lines file, not the cache")
    p.add_argument("--json", action="store_true", help="end with one JSON line of the result")
    return p


def run(args: argparse.Namespace, console: Console) -> int:
    import torch

    from autofusion import tuning
    from autofusion.cache import Cache
    from autofusion.config import Options
    from autofusion.errors import CompilerError
    from autofusion.tools.tune.search import Tuner

    options = cli_options.fusion_options(args)
    model, inputs = cli_options.load_model(args)
    if args.budget <= 0:
        raise UsageError("--budget must be > 0 seconds")
    try:
        with torch.no_grad():
            tuner = Tuner(model, inputs, options, budget_s=args.budget, rounds=args.rounds)
            with Progress(TextColumn("{task.description}"), BarColumn(), TimeRemainingColumn(),
                          console=common.make_console(stderr=True), transient=True) as bar:  # fmt: skip
                task = bar.add_task("tuning", total=args.budget)

                def progress(label: str, k: int, n: int) -> None:
                    spent = args.budget - tuner.left()
                    bar.update(task, completed=min(spent, args.budget), description=f"[{k + 1}/{n}] {label}")

                result = tuner.run(progress)
    except CompilerError as e:
        raise UsageError(str(e)) from None
    record = tuner.record
    assert record is not None  # run() made it
    if args.record:
        where = tuning.store(record, Path(args.record))
    else:
        where = tuning.store(record, Cache(Options.from_env(**options).cache_dir))
    result.record = where
    table = Table(title=f"autofusion tune {escape(args.model)}")
    for col in ("decision", "gain"):
        table.add_column(col)
    for d in result.decisions:
        table.add_row(escape(f"{d.option}={d.value}"), f"x{d.gain:.3f}")
    if not result.decisions:
        table.add_row("(the default plan was fastest)", "-")
    if not args.json:
        common.print_table(console, table)
        console.print(f"default {result.default_ms:.3f} ms, tuned {result.tuned_ms:.3f} ms "
                      f"(x{result.speedup:.3f}); {result.candidates} candidates, {result.timed} timed, "
                      f"{len(result.rejected)} dropped, {result.seconds:.1f} s")  # fmt: skip
        console.print(f"record: {escape(where)}")
        for label, why in result.rejected:
            console.print(f"dropped {escape(label)}: {escape(why)}")
    else:
        out = {
            "model": args.model, "default_ms": round(result.default_ms, 4),
            "tuned_ms": round(result.tuned_ms, 4),
            "speedup": round(result.speedup, 4), "record": where, "overrides": record.overrides,
            "decisions": [{"option": d.option, "value": d.value, "gain": d.gain} for d in result.decisions],
            "rejected": [{"knob": k, "why": w} for k, w in result.rejected],
            "candidates": result.candidates, "timed": result.timed, "seconds": round(result.seconds, 2),
        }  # fmt: skip
        print(json.dumps(out))
    return EXIT_OK
