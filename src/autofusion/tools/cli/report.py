"""`autofusion report MODEL`: one self-contained HTML file on what fusion did and what it bought.

Exit status: 0, or 2 for a bad MODEL or option and for a model that runs eagerly (nothing to report).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from autofusion.tools.cli import common
from autofusion.tools.cli import options as cli_options
from autofusion.tools.cli.common import EXIT_OK, UsageError

NAME = "report"


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser(
        NAME,
        parents=[
            common.log_parent(),
            common.model_parent(),
            common.target_parent(),
            common.repeat_parent(20, "timed runs per step and model (median)"),
            common.fusion_parent(),
        ],
        help="write an HTML report: speedup, pictures, kernels, metrics, roofline, decisions",
        description="Compile MODEL fused and unfused, time the whole model and every step, and write one "
        "self-contained HTML file (the measured whole-model speedup first, then graphs before/after, "
        "kernel table, metrics, roofline, every fusion decision).",
    )
    p.add_argument(
        "--out", default="report.html", metavar="FILE", help="where to write it (default report.html)"
    )
    p.add_argument("--json", metavar="FILE", help="also write the report's data as JSON (pictures left out)")
    return p


def run(args: argparse.Namespace, console: Console) -> int:
    from autofusion.tools.diagnose.report import collect, render_html

    model, inputs = cli_options.load_model(args)
    options = cli_options.fusion_options(args)
    with console.status(f"compiling and timing {args.model} (fused and unfused) ..."):
        try:
            data = collect(model, inputs, args.model, options, runs=args.repeat)
        except ValueError as e:
            raise UsageError(str(e)) from None
    Path(args.out).write_text(render_html(data))
    if args.json:
        data_only = {k: v for k, v in data.items() if not k.startswith("svg_")}
        Path(args.json).write_text(json.dumps(data_only, indent=1, sort_keys=True, default=str) + "\n")
    console.print(
        f"wrote {escape(args.out)}: {common.kernel_counts(data['stats'])}; whole model "
        f"{data['speedup']:.2f}x the speed of the unfused plan "
        f"(improvement ratio {100 * data['ratio']:+.1f} %, "
        "negative: fusion saves time)"
    )
    return EXIT_OK
