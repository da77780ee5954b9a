"""The DFX subcommands: `explain`, `check`, `bisect` and `report`.

Each is a pair, as in tools/cli/main.py: `add_<name>_parser(subparsers)` and `cmd_<name>(args,
console) -> int`. They share the MODEL argument (`builtin:NAME`, an `.onnx` path with `--dim NAME=SIZE`
for symbolic dims, or `package.module:factory`; tools/models/loader.py), `--target`, and the disable list
(`--disable NAME` or `--disable-file FILE`, one name per line, `#` comments; `autofusion bisect
--write-disable FILE` writes one). A name is a rule or pass name when it is one (the names
GF_AUTOFUSION_DISABLE takes: Options.disabled), otherwise a node name (Options.disable_fusion, NF2100);
`node:NAME`, `rule:NAME` and `pass:NAME` say which explicitly.

Exit status: 0 fine, 1 when `check` flags a group or `bisect` finds a culprit, 2 for usage errors.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from autofusion.events import Event, to_jsonl


class ToolUsageError(Exception):
    """Bad MODEL or option; the caller reports it like argparse does (exit status 2)."""


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "model", metavar="MODEL", help="builtin:NAME, a path to an .onnx file, or package.module:factory"
    )
    p.add_argument(
        "--dim",
        metavar="NAME=SIZE",
        action="append",
        default=[],
        help="size of a symbolic input dim of an ONNX model (repeatable)",
    )
    p.add_argument("--target", default="cpu", help="hardware profile: cpu, ascend910b, h200 or a YAML path")
    p.add_argument(
        "--disable",
        action="append",
        default=[],
        metavar="NAME",
        help="turn off this rule or pass, or refuse merges of this node (repeatable; NF2100)",
    )
    p.add_argument(
        "--disable-file",
        metavar="FILE",
        help="a disable list: one rule, pass or node name per line (node:NAME forces a node), # comments",
    )


def read_disable_file(path: str) -> list[str]:
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise ToolUsageError(f"--disable-file {path}: {e.strerror or e}") from e
    names = []
    for line in text.splitlines():
        name = line.split("#", 1)[0].strip()
        if name:
            names.append(name)
    return names


SWITCH_PREFIXES = ("rule:", "pass:")


def switch_names(rules_files: tuple[str, ...] | None = None) -> frozenset[str]:
    """Rule and pass names (what GF_AUTOFUSION_DISABLE and fusion_config take), user rule files included
    (`rules_files`, default: those the environment names)."""
    from autofusion.config import Options
    from autofusion.passes.rewrite import known_switch_names

    return known_switch_names(Options.from_env().rules_files if rules_files is None else rules_files)


def split_disable(
    names: list[str], rules_files: tuple[str, ...] | None = None
) -> tuple[list[str], list[str]]:
    """(rule and pass names for Options.disabled, node names for Options.disable_fusion). A plain name
    that is a rule or pass name is one; `node:NAME` is always a node; `rule:`/`pass:` must be known."""
    known = switch_names(rules_files)
    switches: list[str] = []
    nodes: list[str] = []
    for name in names:
        if name.startswith("node:"):
            nodes.append(name.removeprefix("node:"))
        elif name.startswith(SWITCH_PREFIXES):
            bare = name.split(":", 1)[1]
            if bare not in known:
                raise ToolUsageError(
                    f"disable list: {name!r} names no rule or pass; known: {', '.join(sorted(known))}"
                )
            switches.append(bare)
        elif name in known:
            switches.append(name)
        else:
            nodes.append(name)
    return list(dict.fromkeys(switches)), list(dict.fromkeys(nodes))


def disable_entries(switches: list[str], nodes: list[str]) -> list[str]:
    """The lines `split_disable` reads back as these switches and nodes (a node named like a rule gets
    `node:`)."""
    known = switch_names()
    return list(switches) + [f"node:{n}" if n in known or ":" in n else n for n in nodes]


def write_disable_file(path: str, switches: list[str], nodes: list[str], why: str) -> None:
    lines = [
        "# autofusion disable list: rule and pass names are turned off (Options.disabled, as in",
        "# GF_AUTOFUSION_DISABLE); other names are nodes whose merges are refused (NF2100)",
        f"# {why}",
        *disable_entries(switches, nodes),
    ]
    Path(path).write_text("\n".join(lines) + "\n")


def dump_json(obj: Any) -> str:
    return json.dumps(obj, indent=1, sort_keys=True, default=str)


def tool_options(args: argparse.Namespace) -> dict[str, Any]:
    names = list(args.disable)
    if getattr(args, "disable_file", None):
        names += read_disable_file(args.disable_file)
    switches, nodes = split_disable(names)
    options: dict[str, Any] = {"target": args.target, "disable_fusion": tuple(nodes)}
    if switches:  # added to what the environment turns off (GF_AUTOFUSION_DISABLE), not instead of it
        from autofusion.config import Options

        options["disabled"] = Options.from_env().disabled | frozenset(switches)
    return options


def load(args: argparse.Namespace) -> tuple[Any, tuple[Any, ...]]:
    from autofusion.errors import CompilerError
    from autofusion.tools.models.loader import load_model, parse_dims

    try:
        return load_model(args.model, parse_dims(args.dim))
    except (ValueError, CompilerError) as e:
        raise ToolUsageError(str(e)) from None


def compile_model(model: Any, inputs: tuple[Any, ...], **options: Any) -> Any:
    import torch

    import autofusion

    with torch.no_grad():
        cm = autofusion.compile(model, inputs, **options)
    if "eager_fallback" in cm.stats:
        raise ToolUsageError(f"the model runs eagerly, nothing was fused: {cm.stats['eager_fallback']}")
    return cm


# ---- explain -------------------------------------------------------------------------------------


def add_explain_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "explain",
        help="print every fusion decision with its reason and numbers",
        description="Compile MODEL and print each fusion candidate the solver considered "
        "(accepted or rejected, NF code, rule, bytes and microseconds saved, on-chip budget), "
        "then the kernels.",
    )
    _common(p)
    p.add_argument("--json", action="store_true", help="JSON lines: every event, one per line")
    p.add_argument("--rejected", action="store_true", help="only the rejected candidates")
    p.add_argument(
        "--code", action="append", default=[], metavar="NFxxxx", help="only these codes (repeatable)"
    )
    p.add_argument("--node", metavar="NAME", help="only candidates with this node on either side")
    p.set_defaults(func=cmd_explain)


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


def _us(v: float | None) -> str:
    return "-" if v is None else f"{v:+.2f}"


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.0f}%"


def decisions_table(events: list[Event]) -> Table:
    t = Table(title="fusion decisions (solver order)", show_lines=False)
    for col, just in (
        ("#", "right"),
        ("kind", "left"),
        ("first", "left"),
        ("second", "left"),
        ("verdict", "left"),
        ("rule", "left"),
        ("shared B", "right"),
        ("saved B", "right"),
        ("saved µs", "right"),
        ("budget", "right"),
        ("reason", "left"),
    ):
        t.add_column(col, justify=just)  # type: ignore[arg-type]  # "left"/"right": rich's JustifyMethod
    for e in events:
        if e["event"] == "fusion.recompute":
            t.add_row(
                str(e["seq"]),
                "recompute",
                escape(e["node"]),
                escape(e["consumers"]),
                "[green]recomputed[/]",
                e["rule"],
                "-",
                "-",
                "-",
                "-",
                "",
            )
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
                _us(e["us_saved"]),
                _pct(e["budget_used"]),
                escape(e["reason"]),
            )
    return t


def compute_ops(ops: list[str]) -> list[str]:
    """The ops that do work, once each, in order (views and literals fold into index arithmetic)."""
    from autofusion.plan.schedule import NO_TRAFFIC

    return list(dict.fromkeys(op for op in ops if op not in NO_TRAFFIC)) or ["copy"]


def kernels_table(events: list[Event]) -> Table:
    t = Table(title="kernels")
    t.add_column("kernel", no_wrap=True)
    for col in ("ops", "bytes", "est. µs", "tile", "budget"):
        t.add_column(col)
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
                _pct(e["budget_used"]),
            )
    return t


def cmd_explain(args: argparse.Namespace, console: Console) -> int:
    model, inputs = load(args)
    cm = compile_model(model, inputs, **tool_options(args))
    events = select(cm.events, args.rejected, args.code, args.node)
    if args.json:
        console.file.write(to_jsonl(events))
        return 0
    plan: Event = next((e for e in events if e["event"] == "runtime.plan"), {})
    cands = [e for e in cm.events if e["event"] == "fusion.candidate"]
    merged = sum(1 for e in cands if e["accepted"])
    console.print(
        f"[bold]{escape(args.model)}[/]: {len(cands)} candidates, {merged} merged, "
        f"{len(cands) - merged} rejected; {plan.get('kernels', 0)} fused kernels + "
        f"{len(plan.get('library_ops', []))} library ops per run; est. traffic "
        f"{plan.get('bytes_before', 0)} -> {plan.get('bytes_after', 0)} bytes"
    )
    console.print(decisions_table(events))
    console.print(kernels_table(events))
    return 0


# ---- check ---------------------------------------------------------------------------------------


def add_check_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "check",
        help="run each fused kernel against the unfused reference",
        description="Per fused kernel: cosine similarity, max absolute, max relative and scaled "
        "error (max|fused-ref|/max|ref|) against the reference runtime on the same inputs. "
        "Exit status 1 when any kernel is over tolerance.",
    )
    _common(p)
    p.add_argument(
        "--rtol", type=float, help="largest scaled error (default per dtype: fp32 1e-5, fp16 1e-2)"
    )
    p.add_argument(
        "--min-cosine", type=float, help="smallest cosine similarity (default fp32 0.99999, fp16 0.999)"
    )
    p.add_argument("--json", action="store_true", help="one JSON object per kernel, one per line")
    p.set_defaults(func=cmd_check)


def cmd_check(args: argparse.Namespace, console: Console) -> int:
    from autofusion.tools.diagnose.precision import check_model

    model, inputs = load(args)
    checks, cm = check_model(model, inputs, args.rtol, args.min_cosine, **tool_options(args))
    if cm.compiled is None:
        raise ToolUsageError(f"the model runs eagerly, nothing was fused: {cm.stats.get('eager_fallback')}")
    flagged = [c for c in checks if c.flagged]
    if args.json:
        console.file.write(to_jsonl(c.as_dict() for c in checks))
        return 1 if flagged else 0
    t = Table(title=f"fused kernels vs the unfused reference ({escape(args.model)})")
    t.add_column("kernel", no_wrap=True)
    for col in ("ops", "dtype", "cosine", "max abs", "max rel", "scaled", "rtol", "status"):
        t.add_column(col)
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
    console.print(t)
    for c in checks:
        if c.note:
            console.print(f"{c.kernel}: {escape(c.note)}")
    if flagged:
        console.print(
            f"[red]{len(flagged)} of {len(checks)} fused kernels over tolerance[/]: "
            + ", ".join(c.kernel for c in flagged)
            + ". `autofusion bisect` finds the merge that made each; `--disable NODE` refuses it."
        )
        return 1
    console.print(f"all {len(checks)} fused kernels within tolerance")
    return 0


# ---- bisect --------------------------------------------------------------------------------------


def add_bisect_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "bisect",
        help="find the rule, pass or fusion merge that breaks the tolerance (or slows the model)",
        description="First the fusion rules and graph passes that changed the model: when turning "
        "them all off repairs it, a binary search (stable order) names the one at fault. Otherwise a "
        "binary search over the solver's accepted merges (solver order): the model "
        "with the first k merges is compiled and checked against eager (--rtol) or timed "
        "against no merge at all (--slower). Prints the culprit with its numbers and "
        "a checked disable list. Exit status 1 when a culprit is found.",
    )
    _common(p)
    how = p.add_mutually_exclusive_group()
    how.add_argument(
        "--rtol", type=float, help="largest max|out-eager|/max|eager| (default: 1e-5 fp32, 1e-2 half)"
    )
    how.add_argument("--slower", action="store_true", help="find the first merge that makes the model slower")
    p.add_argument(
        "--margin", type=float, default=0.05, help="--slower: time over the no-merge time (0.05: 5%%)"
    )
    p.add_argument("--repeat", type=int, default=20, help="--slower: timed runs per trial (fastest counts)")
    p.add_argument(
        "--all", action="store_true", help="after a culprit, disable it and search again until clean"
    )
    p.add_argument("--max-culprits", type=int, default=8, help="--all: stop after this many culprits")
    p.add_argument(
        "--write-disable", metavar="FILE", help="write the disable list there (for --disable-file)"
    )
    p.add_argument("--json", action="store_true", help="print the result as one JSON object")
    p.set_defaults(func=cmd_bisect)


def cmd_bisect(args: argparse.Namespace, console: Console) -> int:
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    from autofusion.errors import FrontendError
    from autofusion.tools.diagnose.bisect import bisect_all

    model, inputs = load(args)
    mode = "slower" if args.slower else "rtol"
    if mode == "rtol":
        half = any(
            getattr(t, "dtype", None) in (torch_dtype("float16"), torch_dtype("bfloat16")) for t in inputs
        )
        threshold = args.rtol if args.rtol is not None else (1e-2 if half else 1e-5)
    else:
        threshold = args.margin
    columns = (SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True, disable=args.json) as bar:
        task = bar.add_task("bisecting rules, passes and fusion merges ...")

        def progress(msg: str) -> None:
            bar.update(task, description=f"bisecting: {msg}")
            if not args.json:
                console.print(f"  {escape(msg)}", highlight=False)

        try:
            results = bisect_all(
                model,
                inputs,
                max_culprits=args.max_culprits if args.all else 1,
                mode=mode,
                threshold=threshold,
                options=tool_options(args),
                repeat=args.repeat,
                progress=progress,
            )
        except FrontendError as e:
            raise ToolUsageError(f"the model cannot be captured, so nothing is fused: {e}") from None
    found = [r for r in results if r.found]
    switches = list(dict.fromkeys(n for r in found if r.kind != "merge" for n in r.disable))
    nodes = list(dict.fromkeys(n for r in found if r.kind == "merge" for n in r.disable))
    if args.write_disable and (switches or nodes):
        write_disable_file(args.write_disable, switches, nodes, "; ".join(_why(r) for r in found))
    if args.json:
        payload: Any = [_as_json(r) for r in results] if args.all else _as_json(results[0])
        console.file.write(dump_json(payload) + "\n")
        return 1 if found else 0
    if not found:
        console.print(results[0].message)
        return 0
    for r in found:
        if r.kind == "merge":
            _print_culprit(console, r, mode)
        else:
            _print_switch(console, r, mode)
    last = results[-1]
    if not last.found and len(found) >= 1:
        console.print(f"with the {len(switches) + len(nodes)} names above disabled: {last.message}")
    if args.write_disable:
        console.print(f"disable list written to {escape(args.write_disable)}; pass it as --disable-file")
    return 1


def _as_json(r: Any) -> dict[str, Any]:
    from dataclasses import asdict

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
        f"{_us(c['us_saved'])} µs, {c['bytes_saved']} B; budget used {_pct(c['budget_used'])}"
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


def torch_dtype(name: str) -> Any:
    import torch

    return getattr(torch, name)


# ---- report --------------------------------------------------------------------------------------


def add_report_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "report",
        help="write an HTML report: pictures, kernels, metrics, roofline, decisions",
        description="Compile MODEL fused and unfused, time every step, and write one "
        "self-contained HTML file (graphs before/after, kernel table, metrics, improvement "
        "ratio, roofline, every fusion decision).",
    )
    _common(p)
    p.add_argument(
        "--out", default="report.html", metavar="FILE", help="where to write it (default report.html)"
    )
    p.add_argument("--runs", type=int, default=20, help="timed runs per step and model (median)")
    p.add_argument("--json", metavar="FILE", help="also write the report's data as JSON (pictures left out)")
    p.set_defaults(func=cmd_report)


def cmd_report(args: argparse.Namespace, console: Console) -> int:
    from autofusion.tools.diagnose.report import collect, render_html

    if args.runs < 1:
        raise ToolUsageError("--runs must be >= 1")
    model, inputs = load(args)
    baseline = None
    if isinstance(model, Path):  # an ONNX file: timed against onnxruntime (else our reference runtime)
        import autofusion
        from autofusion.tools.models.loader import onnx_reference

        baseline = onnx_reference(model) or (
            "reference runtime",
            autofusion.compile(model, inputs, fusion=False, target=args.target),
        )
    with console.status(f"compiling and timing {args.model} (fused and unfused) ..."):
        try:
            data = collect(model, inputs, args.model, tool_options(args), runs=args.runs, baseline=baseline)
        except ValueError as e:
            raise ToolUsageError(str(e)) from None
    Path(args.out).write_text(render_html(data))
    if args.json:
        Path(args.json).write_text(
            dump_json({k: v for k, v in data.items() if not k.startswith("svg_")}) + "\n"
        )
    console.print(
        f"wrote {escape(args.out)}: {len(data['kernels'])} fused kernels, improvement ratio "
        f"{100 * data['ratio']:+.1f} % (negative: fusion saves time)"
    )
    return 0


# ---- registration (check, bisect and report are added below as they are written) -------------------

DFX_SUBCOMMANDS: tuple[Any, ...] = (
    add_explain_parser,
    add_check_parser,
    add_bisect_parser,
    add_report_parser,
)
