"""What every subcommand shares: exit codes, errors, parent parsers, options from arguments, output.

Exit codes (the README's table):
- 0 ok;
- 1 a finding: a result differs from its reference (demo, optimize --check, check), bisect names a
  culprit, demo ran a model eagerly;
- 2 a usage or model error: a bad argument or MODEL, an unreadable model or option file (rule file,
  fusion_config, disable list, hardware profile), a bad environment variable (AUTOFUSION_RULES,
  AUTOFUSE_DFX_FLAGS, ...), a model that runs eagerly where the command needs it compiled. One line on
  stderr names the file and line or the variable; never a traceback;
- 3 an internal error (a bug): one line and a hint on stderr, the traceback only with -v.

Options are spelt once, in the parent parsers below, so `--disable` or `--repeat` mean the same on every
subcommand that takes them. Nothing here imports torch: `autofusion --help` stays fast.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

# The counts every tool prints, re-exported for the subcommands (the report uses them too).
from autofusion.tools.diagnose.counts import FUSED_KERNELS as FUSED_KERNELS
from autofusion.tools.diagnose.counts import STEPS_MEANING as STEPS_MEANING
from autofusion.tools.diagnose.counts import STEPS_PER_RUN as STEPS_PER_RUN
from autofusion.tools.diagnose.counts import kernel_counts as kernel_counts

EXIT_OK = 0
EXIT_FINDING = 1
EXIT_USAGE = 2
EXIT_INTERNAL = 3

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
MODEL_FORMS = "builtin:NAME, a path to an .onnx file, or package.module:factory"


class UsageError(Exception):
    """A bad argument, model, option file or environment variable: exit status 2, the message on stderr."""


# ---- parent parsers --------------------------------------------------------------------------------


def add_log_options(p: argparse.ArgumentParser, top: bool) -> None:
    """-v / --log-level, before the subcommand (`top`) and after it. After it the default is SUPPRESS,
    so a subcommand that is not given them keeps what was given before it."""
    default = "WARNING" if top else argparse.SUPPRESS
    p.add_argument("-v", "--verbose", dest="log_level", action="store_const", const="DEBUG", default=default,
                   help="debug logging, and the traceback of an internal error")  # fmt: skip
    p.add_argument("--log-level", dest="log_level", type=str.upper, choices=LOG_LEVELS, default=default,
                   help="logging level (default: WARNING); logs go to stderr")  # fmt: skip


def log_parent() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False)
    add_log_options(p, top=False)
    return p


def model_parent() -> argparse.ArgumentParser:
    """MODEL and --dim (sizes of symbolic dims of an ONNX model)."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("model", metavar="MODEL", help=MODEL_FORMS)
    p.add_argument("--dim", metavar="NAME=SIZE", action="append", default=[],
                   help="size of a symbolic input dim of an ONNX model (repeatable)")  # fmt: skip
    return p


def target_parent() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--target", default="cpu", help="hardware profile: cpu, ascend910b, h200 or a YAML path")
    return p


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


class _Deprecated(argparse.Action):
    """A hidden old spelling: stores into the new option's dest and says which spelling to use."""

    def __init__(self, *args: Any, new: str = "", **kwargs: Any) -> None:
        self.new = new
        super().__init__(*args, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:  # fmt: skip
        sys.stderr.write(f"autofusion: warning: {option_string} is deprecated; use {self.new}\n")
        setattr(namespace, self.dest, values)


def repeat_parent(default: int = 20, what: str = "timed runs (median)") -> argparse.ArgumentParser:
    """--repeat N, the count of timed runs everywhere (`--runs` is its old spelling on `report`)."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument(
        "--repeat", type=positive_int, default=default, metavar="N", help=f"{what}; default {default}"
    )
    p.add_argument("--runs", dest="repeat", type=positive_int, action=_Deprecated, new="--repeat",
                   help=argparse.SUPPRESS)  # fmt: skip
    return p


def fusion_parent() -> argparse.ArgumentParser:
    """Rule files, lists and switches (the same as Options fields and their environment variables)."""
    p = argparse.ArgumentParser(add_help=False)
    g = p.add_argument_group("fusion rules and switches")
    g.add_argument(
        "--rules",
        action="append",
        default=[],
        metavar="FILE",
        help="a fusion_rules YAML file, applied with the built-in classify_rule.yaml (repeatable)",
    )
    g.add_argument("--no-builtin-rules", action="store_true", help="do not apply the built-in rules")
    g.add_argument("--no-freeze", action="store_true",
                   help="read parameters on every call instead of folding parameter-only work once per "
                   "parameter version (AUTOFUSION_FREEZE=0)")  # fmt: skip
    g.add_argument(
        "--blacklist",
        action="append",
        default=[],
        metavar="FILE",
        help="a blacklist.txt of op types never fused (repeatable)",
    )
    g.add_argument(
        "--skip-node-names-cfg",
        default="",
        metavar="FILE",
        help="an .ini with [ByNodeName]/[ByNodeType]: nodes kept out of fusion",
    )
    g.add_argument(
        "--fusion-config",
        "--config",
        dest="fusion_config",
        default="",
        metavar="FILE",
        help='a JSON {"fusion_config": {"<rule or pass>": "on"|"off"}}',
    )
    g.add_argument(
        "--disable",
        action="append",
        default=[],
        metavar="NAMES",
        help="comma-separated rule or pass names to turn off, added to GF_AUTOFUSION_DISABLE; "
        "other names are nodes whose merges are refused (NF2100); node:NAME, rule:NAME and "
        "pass:NAME say which (repeatable)",
    )
    g.add_argument("--disable-file", default="", metavar="FILE",
                   help="a disable list, one name per line as --disable takes them, # comments "
                   "(`autofusion bisect --write-disable` writes one)")  # fmt: skip
    return p


# ---- output --------------------------------------------------------------------------------------------

_UNLIMITED = 10_000  # a pipe with no COLUMNS: lines as long as they are, for logs and grep


def make_console(stderr: bool = False) -> Console:
    """A console as wide as the terminal, or COLUMNS; unlimited for a pipe without COLUMNS."""
    columns = shutil.get_terminal_size((0, 0)).columns  # COLUMNS first, then the terminal
    return Console(stderr=stderr, width=columns if columns > 0 else _UNLIMITED, highlight=False)


def error(console: Console, command: str, message: str) -> None:
    console.print(f"[red]autofusion {command}: error:[/red] {escape(message)}", soft_wrap=True)


def print_table(console: Console, table: Table) -> None:
    """The table, fitted to the console without cutting a word or number: columns marked no_wrap keep
    their width, the others wrap between words; a table that cannot fit so is printed as one block of
    `column: value` lines per row instead."""
    if _fit(table, console.width):
        console.print(table)
        return
    if table.title:
        console.print(table.title, style="bold")
    headers = [str(c.header) for c in table.columns]
    for n, row in enumerate(zip(*(list(c.cells) for c in table.columns), strict=True), 1):
        console.print(f"{n}.")
        for header, cell in zip(headers, row, strict=True):
            console.print(Text.assemble(f"   {header or 'item'}: ", _text(cell)))


def _text(cell: Any) -> Text:
    return Text.from_markup(cell) if isinstance(cell, str) else Text(str(cell))


def _fit(table: Table, width: int) -> bool:
    """Fix each column's width so the table fits `width` (True), or say it cannot (False)."""
    cols = table.columns
    extra = 3 * len(cols) + 1  # one space of padding either side of each cell, and the rules between
    natural, least = [], []
    for c in cols:
        texts = [_text(x) for x in [c.header, *c.cells]]
        natural.append(max(t.cell_len for t in texts))
        words = [len(w) for t in texts for w in t.plain.split()] or [0]
        least.append(natural[-1] if c.no_wrap else max(words))
    if sum(natural) + extra <= width:
        return True
    if sum(least) + extra > width:
        return False
    spare = width - extra - sum(least)
    for c, lo, hi in zip(cols, least, natural, strict=True):
        grow = min(spare, hi - lo)
        c.width, spare = lo + grow, spare - grow
    return True
