"""``autofusion cache info`` and ``autofusion cache clear [--namespace NS]``: show or empty the disk cache.

The cache is the one the options name (``AUTOFUSION_CACHE_DIR``, else ``$XDG_CACHE_HOME/autofusion`` or
``~/.cache/autofusion``), or ``--cache-dir``. ``info`` prints entries and bytes per namespace; ``clear``
removes entries (all, or one namespace's), keeping those another process is writing right now.
"""

from __future__ import annotations

import argparse

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from autofusion.cache import LEGACY, NAMESPACES, Cache
from autofusion.config import Options
from autofusion.tools.cli import common
from autofusion.tools.cli.common import UsageError

NAME = "cache"

_WHAT = {
    "kernels": "built kernel libraries",
    "hw": "cpu measurements",
    "layouts": "convolution layout timings",
    "tuning": "tuning records (autofusion tune)",
    LEGACY: "what older versions wrote (read when needed; `clear` removes it)",
}


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser(
        NAME,
        parents=[common.log_parent()],
        help="show or clear the disk cache (built kernels, cpu measurements, conv timings)",
        description="Show what the disk cache holds, or empty it. Entries are rebuilt or measured "
        "again when next needed.",
    )
    actions = p.add_subparsers(dest="cache_command", metavar="ACTION", required=True)
    info = actions.add_parser("info", help="entries and bytes per namespace", description="Entries and bytes "
                              "per namespace, the cache directory and its size cap.")  # fmt: skip
    clear = actions.add_parser("clear", help="remove cached entries", description="Remove cached entries "
                               "(entries another process is writing stay).")  # fmt: skip
    clear.add_argument("--namespace", choices=NAMESPACES, help="clear only this namespace (default: all)")
    for q in (info, clear):
        q.add_argument("--cache-dir", metavar="DIR", help="the cache directory (default: as the options say)")
    return p


def run(args: argparse.Namespace, console: Console) -> int:
    try:
        options = Options.from_env(**({"cache_dir": args.cache_dir} if args.cache_dir else {}))
    except ValueError as e:  # a bad environment variable: a usage error (stderr, exit status 2)
        raise UsageError(str(e)) from None
    if not options.cache_dir:
        raise UsageError("no cache directory: set AUTOFUSION_CACHE_DIR or pass --cache-dir")
    cache = Cache(options.cache_dir, max_bytes=options.cache_max_mb << 20)
    if args.cache_command == "clear":
        before = cache.info()
        removed, kept = cache.clear(args.namespace)
        after = cache.info()
        freed = sum(info.bytes for info in before.values()) - sum(info.bytes for info in after.values())
        where = f"{cache.root}" + (f" ({args.namespace})" if args.namespace else "")
        console.print(f"removed {removed} entries ({_mib(freed)}) from {escape(where)}", highlight=False)
        if kept:
            console.print(f"kept {kept} entries another process is writing", highlight=False)
        return 0
    found = cache.info()
    cap = f"{options.cache_max_mb} MiB" if options.cache_max_mb else "none"
    # The directory on its own line: as the table's title it would be cut to the table's width.
    console.print(f"cache {escape(str(cache.root))} (cap {cap})", highlight=False, soft_wrap=True)
    table = Table()
    table.add_column("namespace")
    table.add_column("holds")
    table.add_column("entries", justify="right")
    table.add_column("size", justify="right")
    for ns in found:
        table.add_row(ns, _WHAT.get(ns, ""), str(found[ns].entries), _mib(found[ns].bytes))
    table.add_row("total", "", str(sum(i.entries for i in found.values())),
                  _mib(sum(i.bytes for i in found.values())))  # fmt: skip
    console.print(table)
    return 0


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB"
