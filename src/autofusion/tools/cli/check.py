"""`autofusion check MODEL`: each fused kernel against the unfused reference, on the same inputs.

Exit status: 0 when every kernel is within tolerance, 1 (a finding) when any is over it, 2 for a bad
MODEL or option and for a model that runs eagerly (nothing to check).
"""

from __future__ import annotations

import argparse

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from autofusion.events import to_jsonl
from autofusion.tools.cli import common
from autofusion.tools.cli import options as cli_options
from autofusion.tools.cli.common import EXIT_FINDING, EXIT_OK, UsageError
from autofusion.tools.cli.explain import compute_ops

NAME = "check"


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser(
        NAME,
        parents=[common.log_parent(), common.model_parent(), common.target_parent(), common.fusion_parent()],
        help="run each fused kernel against the unfused reference",
        description="Per fused kernel: cosine similarity, max absolute, max relative and scaled "
        "error (max|fused-ref|/max|ref|) against the reference runtime on the same inputs. "
        "Exit status 1 when any kernel is over tolerance.",
    )
    p.add_argument(
        "--rtol", type=float, help="largest scaled error (default per dtype: fp32 1e-5, fp16 1e-2, bf16 2e-2)"
    )
    p.add_argument("--min-cosine", type=float,
                   help="smallest cosine similarity (default fp32 0.99999, fp16 and bf16 0.999)")  # fmt: skip
    p.add_argument("--json", action="store_true", help="one JSON object per kernel, one per line")
    return p


def run(args: argparse.Namespace, console: Console) -> int:
    from autofusion.tools.diagnose.precision import check_model

    model, inputs = cli_options.load_model(args)
    checks, cm = check_model(model, inputs, args.rtol, args.min_cosine, **cli_options.fusion_options(args))
    if cm.compiled is None:
        raise UsageError(f"the model runs eagerly, nothing was fused: {cm.stats.get('eager_fallback')}")
    flagged = [c for c in checks if c.flagged]
    if args.json:
        console.file.write(to_jsonl(c.as_dict() for c in checks))
        return EXIT_FINDING if flagged else EXIT_OK
    t = Table(title=f"fused kernels vs the unfused reference ({escape(args.model)})")
    t.add_column("kernel", no_wrap=True)
    t.add_column("ops")
    for col in ("dtype", "cosine", "max abs", "max rel", "scaled", "rtol", "status"):
        t.add_column(col, no_wrap=True)
    for c in checks:
        status = "[red]FLAGGED[/]" if c.flagged else ("[yellow]skipped[/]" if c.note else "[green]ok[/]")
        t.add_row(
            c.kernel,
            " ".join(compute_ops(c.ops)),
            c.dtype,
            f"{c.cosine:.7f}",
            f"{c.max_abs:.3g}",
            f"{c.max_rel:.3g}",
            f"{c.scaled:.3g}",
            f"{c.rtol:g}",
            status,
        )
    common.print_table(console, t)
    for c in checks:
        if c.note:
            console.print(f"{c.kernel}: {escape(c.note)}")
    if flagged:
        console.print(
            f"[red]{len(flagged)} of {len(checks)} fused kernels over tolerance[/]: "
            + ", ".join(c.kernel for c in flagged)
            + ". `autofusion bisect` finds the merge that made each; `--disable NODE` refuses it."
        )
        return EXIT_FINDING
    console.print(f"all {len(checks)} fused kernels within tolerance")
    return EXIT_OK
