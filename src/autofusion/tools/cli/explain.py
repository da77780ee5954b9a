"""`autofusion explain MODEL`: every fusion decision with its reason and numbers, then the kernels.

Exit status: 0, or 2 for a bad MODEL or option and for a model that runs eagerly (nothing to explain).
"""

from __future__ import annotations

import argparse

from rich.console import Console, JustifyMethod
from rich.markup import escape
from rich.table import Table

from autofusion.events import Event, to_jsonl
from autofusion.tools.cli import common
from autofusion.tools.cli import options as cli_options
from autofusion.tools.cli.common import EXIT_OK

NAME = "explain"


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser(
        NAME,
        parents=[common.log_parent(), common.model_parent(), common.target_parent(), common.fusion_parent()],
        help="print every fusion decision with its reason and numbers",
        description="Compile MODEL and print each fusion candidate the solver considered "
        "(accepted or rejected, NF code, rule, bytes and microseconds saved, on-chip budget), "
        "then the kernels.",
    )
    p.add_argument("--json", action="store_true", help="JSON lines: every event, one per line")
    p.add_argument("--rejected", action="store_true", help="only the rejected candidates")
    p.add_argument(
        "--code", action="append", default=[], metavar="NFxxxx", help="only these codes (repeatable)"
    )
    p.add_argument("--node", metavar="NAME", help="only candidates with this node on either side")
    return p


def select(events: list[Event], rejected: bool, codes: list[str], node: str | None) -> list[Event]:
    """The events `explain` shows: decisions filtered as asked (kernel and other events always)."""

    def keep(e: Event) -> bool:
        if e["event"] != "fusion.candidate":
            return e["event"] != "fusion.recompute" or not (rejected or codes or node)
        if rejected and e["accepted"]:
            return False
        if codes and e["code"] not in codes:
            return False
        return not node or node in e["first_nodes"] + e["second_nodes"]

    return [e for e in events if keep(e)]


def us(v: float | None) -> str:
    return "-" if v is None else f"{v:+.2f}"


def pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.0f}%"


def decisions_table(events: list[Event]) -> Table:
    t = Table(title="fusion decisions (solver order)", show_lines=False)
    columns: tuple[tuple[str, JustifyMethod, bool], ...] = (
        ("#", "right", True),
        ("kind", "left", True),
        ("first", "left", False),
        ("second", "left", False),
        ("verdict", "left", True),
        ("rule", "left", False),
        ("shared B", "right", True),
        ("saved B", "right", True),
        ("saved µs", "right", True),
        ("budget", "right", True),
        ("reason", "left", False),
    )
    for col, just, nowrap in columns:
        t.add_column(col, justify=just, no_wrap=nowrap)
    for e in events:
        if e["event"] == "fusion.recompute":
            t.add_row(str(e["seq"]), "recompute", escape(e["node"]), escape(e["consumers"]),
                      "[green]recomputed[/]", e["rule"], "-", "-", "-", "-", "")  # fmt: skip
        elif e["event"] == "fusion.candidate":
            verdict = "[green]fused[/]" if e["accepted"] else f"[red]{e['code']}[/]"
            t.add_row(
                str(e["seq"]),
                e["kind"],
                escape(e["first"]),
                escape(e["second"]),
                verdict,
                e["rule"],
                str(e["bytes_shared"]),
                "-" if e["bytes_saved"] is None else str(e["bytes_saved"]),
                us(e["us_saved"]),
                pct(e["budget_used"]),
                escape(e["reason"]),
            )
    return t


def compute_ops(ops: list[str]) -> list[str]:
    """The ops that do work, once each, in order (views and literals fold into index arithmetic)."""
    from autofusion.plan.schedule import NO_TRAFFIC

    return list(dict.fromkeys(op for op in ops if op not in NO_TRAFFIC)) or ["copy"]


def kernels_table(events: list[Event]) -> Table:
    t = Table(title=common.FUSED_KERNELS)
    t.add_column("kernel", no_wrap=True)
    t.add_column("ops")
    for col in ("bytes", "est. µs"):
        t.add_column(col, justify="right", no_wrap=True)
    t.add_column("tile")
    t.add_column("budget", justify="right", no_wrap=True)
    for e in events:
        if e["event"] == "codegen.kernel":
            tile = e["tile"]
            t.add_row(
                e["kernel"],
                " ".join(compute_ops(e["ops"])),
                str(e["bytes"]),
                f"{e['estimated_us']:.2f}",
                f"rows={tile['rows_per_block']} inner={tile['inner_block']}"
                + ("" if tile["persistent"] else " multi-pass"),
                pct(e["budget_used"]),
            )
    return t


def layouts_table(events: list[Event]) -> Table | None:
    """Each convolution chain's route: every route's measured time for the whole chain and why each
    was or was not taken (passes/layout.py), and the whole-network search's candidates
    (network_layout.py) under "whole network"; None when the model has no chain."""
    chains = [e for e in events if e["event"] == "layout.chain"]
    networks = [e for e in events if e["event"] == "layout.network"]
    if not chains and not networks:
        return None
    t = Table(title="convolution layouts (per chain, the whole chain timed in each route)")
    for col, just in (("chain", "left"), ("convs", "right"), ("route", "left"), ("chain ms", "right"),
                      ("verdict", "left"), ("reason", "left")):  # fmt: skip
        t.add_column(col, justify=just, no_wrap=col != "reason")  # type: ignore[arg-type]
    for e in networks:
        routes = e["routes"] or [{"route": e["layout"], "ms": None, "chosen": True, "reason": e["reason"]}]
        for i, r in enumerate(routes):
            t.add_row("whole network" if i == 0 else "", str(e["chains"]) + " chains" if i == 0 else "",
                      *_route_cells(r, e["how"]))  # fmt: skip
    for e in chains:
        for i, r in enumerate(e["routes"]):
            t.add_row(escape(e["chain"]) if i == 0 else "", str(e["convs"]) if i == 0 else "",
                      *_route_cells(r, e["how"]))  # fmt: skip
    return t


def _route_cells(r: Event, how: str) -> tuple[str, str, str, str]:
    ms = "-" if r["ms"] is None else f"{r['ms']:.3f}"
    return r["route"], ms, f"[green]{how}[/]" if r["chosen"] else "[red]no[/]", escape(r["reason"])


def run(args: argparse.Namespace, console: Console) -> int:
    model, inputs = cli_options.load_model(args)
    cm = cli_options.compile_model(model, inputs, cli_options.fusion_options(args))
    events = select(cm.events, args.rejected, args.code, args.node)
    if args.json:
        console.file.write(to_jsonl(events))
        return EXIT_OK
    stats = cm.stats
    cands = [e for e in cm.events if e["event"] == "fusion.candidate"]
    merged = sum(1 for e in cands if e["accepted"])
    console.print(
        f"[bold]{escape(args.model)}[/]: {len(cands)} candidates, {merged} merged, "
        f"{len(cands) - merged} rejected; {common.kernel_counts(stats)} ({common.STEPS_MEANING}); "
        f"est. traffic {stats.get('bytes_before', 0)} -> {stats.get('bytes_after', 0)} bytes"
    )
    tuned = stats.get("tuning")
    if tuned:
        taken = ", ".join(f"{d['option']}={d['value']} (x{d['gain']:.3f})" for d in tuned["decisions"])
        console.print(
            f"from tuning record {tuned['record']} ({tuned['default_ms']:.3f} -> {tuned['tuned_ms']:.3f} ms "
            f"when tuned): {escape(taken) or 'the default plan was fastest'}"
        )
    layouts = layouts_table(events)
    if layouts is not None:
        common.print_table(console, layouts)
    common.print_table(console, decisions_table(events))
    common.print_table(console, kernels_table(events))
    return EXIT_OK
