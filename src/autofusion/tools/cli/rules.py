"""`autofusion rules`: check rule files and list every rule in the order it is tried.

Exit status: 0, or 2 when a rule file (or another option file or variable) is bad: file:line and what
is wrong, on stderr.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from autofusion.tools.cli import common
from autofusion.tools.cli import options as cli_options
from autofusion.tools.cli.common import EXIT_OK, UsageError

NAME = "rules"


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    return sub.add_parser(
        NAME,
        parents=[common.log_parent(), common.fusion_parent()],
        help="check rule files and list every rule in the order it is tried",
        description="Load the built-in classify_rule.yaml and the given rule files (a bad file exits 2 with "
        "file:line and what is wrong) and list the rules: order, name, priority, steps, what they become, "
        "source.",
    )


def run(args: argparse.Namespace, console: Console) -> int:
    from autofusion.config import Options
    from autofusion.errors import RuleFileError
    from autofusion.passes.rewrite import all_rules, settle_options
    from autofusion.passes.rewrite.apply import rule_order

    overrides = cli_options.fusion_options(args)
    try:
        options = settle_options(Options.from_env(**overrides))  # fusion_config's on/off included
        rules = rule_order(all_rules(options.rules_files, options.builtin_rules))
    except RuleFileError as exc:
        raise UsageError(str(exc)) from None
    table = Table(title="fusion rules, in the order they are tried")
    for column in ("#", "name", "priority", "steps", "becomes", "on", "source"):
        table.add_column(column, no_wrap=column in ("#", "priority", "on"))
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
    common.print_table(console, table)
    return EXIT_OK
