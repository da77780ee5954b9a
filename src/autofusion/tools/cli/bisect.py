"""`autofusion bisect MODEL`: the rule, pass or fusion merge that breaks the tolerance (or slows the model).

Exit status: 0 when nothing is at fault, 1 (a finding) when a culprit is found, 2 for a bad MODEL or
option and for a model that cannot be captured (nothing is fused).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from typing import Any

from rich.console import Console
from rich.markup import escape

from autofusion.tools.cli import common
from autofusion.tools.cli import options as cli_options
from autofusion.tools.cli.common import EXIT_FINDING, EXIT_OK, UsageError
from autofusion.tools.cli.disable import write_disable_file
from autofusion.tools.cli.explain import pct, us

NAME = "bisect"


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser(
        NAME,
        parents=[
            common.log_parent(),
            common.model_parent(),
            common.target_parent(),
            common.repeat_parent(20, "--slower: timed runs per trial (the fastest counts)"),
            common.fusion_parent(),
        ],
        help="find the rule, pass or fusion merge that breaks the tolerance (or slows the model)",
        description="First the fusion rules and graph passes that changed the model: when turning "
        "them all off repairs it, a binary search (stable order) names the one at fault. Otherwise a "
        "binary search over the solver's accepted merges (solver order): the model "
        "with the first k merges is compiled and checked against eager (--rtol) or timed "
        "against no merge at all (--slower). Prints the culprit with its numbers and "
        "a checked disable list. Exit status 1 when a culprit is found.",
    )
    how = p.add_mutually_exclusive_group()
    how.add_argument(
        "--rtol",
        type=float,
        help="largest max|out-eager|/max|eager| (default: 1e-5 fp32, 1e-2 fp16, 2e-2 bf16)",
    )
    how.add_argument("--slower", action="store_true", help="find the first merge that makes the model slower")
    p.add_argument(
        "--margin", type=float, default=0.05, help="--slower: time over the no-merge time (0.05: 5%%)"
    )
    p.add_argument(
        "--all", action="store_true", help="after a culprit, disable it and search again until clean"
    )
    p.add_argument("--max-culprits", type=common.positive_int, default=8,
                   help="--all: stop after this many culprits")  # fmt: skip
    p.add_argument(
        "--write-disable", metavar="FILE", help="write the disable list there (for --disable-file)"
    )
    p.add_argument("--json", action="store_true", help="print the result as one JSON object")
    return p


def run(args: argparse.Namespace, console: Console) -> int:
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    from autofusion.errors import FrontendError
    from autofusion.tools.diagnose.bisect import bisect_all
    from autofusion.tools.diagnose.compare import model_tolerance

    model, inputs = cli_options.load_model(args)
    options = cli_options.fusion_options(args)
    mode = "slower" if args.slower else "rtol"
    if mode == "rtol":
        threshold = args.rtol if args.rtol is not None else model_tolerance(inputs)
    else:
        threshold = args.margin
    columns = (SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True, disable=args.json) as bar:
        task = bar.add_task("bisecting rules, passes and fusion merges ...")

        def progress(msg: str) -> None:
            bar.update(task, description=f"bisecting: {msg}")
            if not args.json:
                console.print(f"  {escape(msg)}")

        try:
            results = bisect_all(
                model,
                inputs,
                max_culprits=args.max_culprits if args.all else 1,
                mode=mode,
                threshold=threshold,
                options=options,
                repeat=args.repeat,
                progress=progress,
            )
        except FrontendError as e:
            raise UsageError(f"the model cannot be captured, so nothing is fused: {e}") from None
    found = [r for r in results if r.found]
    switches = list(dict.fromkeys(n for r in found if r.kind != "merge" for n in r.disable))
    nodes = list(dict.fromkeys(n for r in found if r.kind == "merge" for n in r.disable))
    if args.write_disable and (switches or nodes):
        write_disable_file(args.write_disable, switches, nodes, "; ".join(_why(r) for r in found))
    if args.json:
        payload: Any = [_as_json(r) for r in results] if args.all else _as_json(results[0])
        console.file.write(json.dumps(payload, indent=1, sort_keys=True, default=str) + "\n")
        return EXIT_FINDING if found else EXIT_OK
    if not found:
        console.print(results[0].message)
        return EXIT_OK
    for r in found:
        if r.kind == "merge":
            _print_culprit(console, r, mode)
        else:
            _print_switch(console, r, mode)
    last = results[-1]
    if not last.found:
        console.print(f"with the {len(switches) + len(nodes)} names above disabled: {last.message}")
    if args.write_disable:
        console.print(f"disable list written to {escape(args.write_disable)}; pass it as --disable-file")
    return EXIT_FINDING


def _as_json(r: Any) -> dict[str, Any]:
    return {**asdict(r), "found": r.found}


def _why(r: Any) -> str:
    if r.kind != "merge":
        return f"{r.kind} {r.switch}"
    return f"merge {r.index} of {r.total_merges}: {r.culprit['line']}"


def _print_switch(console: Console, r: Any, mode: str) -> None:
    unit, fmt = ("ms", ".3f") if mode == "slower" else ("relative error", ".3g")
    k = r.switches.index(r.switch) + 1
    console.print(
        f"[bold red]first bad {r.kind}: {escape(r.switch)}[/] ({k} of {len(r.switches)} rules/passes "
        f"that changed the model: {escape(', '.join(r.switches))})"
    )
    before = "-" if r.before is None else format(r.before, fmt)
    after = "-" if r.after is None else format(r.after, fmt)
    ahead = f" (and the {k - 1} ahead of it)" if k > 1 else ""
    console.print(f"  {unit}: {after} with it on, {before} with it{ahead} off")
    value = "-" if r.disable_value is None else format(r.disable_value, fmt)
    verdict = (
        f"checked: {unit} {value} with only it off"
        if r.disable_verified
        else f"helps ({unit} {value} with only it off) but something else is also at fault; "
        "--all goes on from here"
    )
    console.print(f"  disable list: {escape(r.switch)} ({verdict})")


def _print_culprit(console: Console, r: Any, mode: str) -> None:
    c = r.culprit
    assert c is not None and r.index is not None
    unit, fmt = ("ms", ".3f") if mode == "slower" else ("relative error", ".3g")
    console.print(f"[bold red]first bad merge: {r.index} of {r.total_merges}[/] (solver order)")
    console.print(f"  {escape(c['line'])}")
    console.print(
        f"  rule: {c['rule']}; kind: {c['kind']}; bytes shared {c['bytes_shared']}; est. saved "
        f"{us(c['us_saved'])} µs, {c['bytes_saved']} B; budget used {pct(c['budget_used'])}"
    )
    console.print(f"  sides: {escape(', '.join(c['first_nodes']))} | {escape(', '.join(c['second_nodes']))}")
    if r.kernel:
        console.print(f"  makes kernel {r.kernel}")
    if r.switches_off:
        console.print(
            f"  found with {escape(', '.join(r.switches_off))} off (with them on the model is bad even "
            "with no merge; --all comes back for them)"
        )
    limit = f"> {r.threshold:g}" if mode == "rtol" else f"> no-merge time x {1 + r.threshold:g}"
    console.print(
        f"  {unit}: {format(r.before, fmt)} with {r.index - 1} merges, "
        f"{format(r.after, fmt)} with {r.index} ({limit})"
    )
    if r.disable:
        value = "-" if r.disable_value is None else format(r.disable_value, fmt)
        verdict = (
            f"checked: {unit} {value} with every other merge on"
            if r.disable_verified
            else f"helps most ({unit} {value}) but another merge is also at fault; --all goes on from here"
        )
        console.print(f"  disable list: {escape(', '.join(r.disable))} ({verdict})")
