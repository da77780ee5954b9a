"""The ``autofusion`` command line: the parser and the dispatch, nothing else.

Each subcommand is a module in this package with ``NAME``, ``add_parser(subparsers)`` and
``run(args, console) -> int``; ``SUBCOMMANDS`` lists them in the order ``--help`` shows them. To add one,
write the module and list it here. Shared options, exit codes and output helpers are in ``common``.

Exit status (``common``): 0 ok, 1 a finding, 2 a usage or model error (one line on stderr), 3 an
internal error (one line and a hint; the traceback with ``-v``). ``main`` returns it in every case,
``--help`` and argparse's own errors included.

Importing this module, and ``autofusion --help`` or ``autofusion SUBCOMMAND --help``, loads no torch:
subcommands import the compiler when they run.
"""

from __future__ import annotations

import argparse
import logging
import sys
import traceback
from collections.abc import Sequence

from autofusion._version import __version__
from autofusion.tools.cli import (
    bisect,
    cache,
    calibrate,
    check,
    common,
    demo,
    explain,
    optimize,
    report,
    rules,
    tune,
)
from autofusion.tools.cli.common import EXIT_INTERNAL, EXIT_USAGE, UsageError

SUBCOMMANDS = [demo, optimize, explain, check, bisect, report, rules, tune, calibrate, cache]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="autofusion", description="Automatic operator fusion for PyTorch and ONNX models.",
        epilog="exit status: 0 ok, 1 a finding (a result differs, bisect found a culprit), "
        "2 a usage or model error, 3 an internal error",
    )  # fmt: skip
    parser.add_argument("--version", action="version", version=f"autofusion {__version__}")
    common.add_log_options(parser, top=True)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module in SUBCOMMANDS:
        module.add_parser(sub).set_defaults(run=module.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version (0) and argparse's usage errors (2)
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    level = getattr(logging, args.log_level)
    logging.basicConfig(level=level, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger().setLevel(level)  # also when a host (pytest, an embedding app) has set up logging
    console = common.make_console()
    try:
        return int(args.run(args, console))
    except UsageError as exc:
        common.error(common.make_console(stderr=True), args.command, str(exc))
        return EXIT_USAGE
    except KeyboardInterrupt:
        common.make_console(stderr=True).print("[red]interrupted[/red]")
        return 130
    except Exception as exc:  # noqa: BLE001 - every other error: a message, and the traceback on request
        return _internal_error(args, exc)


def _internal_error(args: argparse.Namespace, exc: Exception) -> int:
    """A compiler error that escaped the command names what the model needs (exit 2); anything else is a
    bug (exit 3): one line and a hint, the traceback only at DEBUG."""
    from autofusion.errors import CompilerError

    err = common.make_console(stderr=True)
    if isinstance(exc, CompilerError):
        common.error(err, args.command, str(exc))
        code = EXIT_USAGE
    else:
        common.error(err, args.command, f"internal error: {type(exc).__name__}: {exc}")
        code = EXIT_INTERNAL
    if args.log_level == "DEBUG":
        sys.stderr.write("".join(traceback.format_exception(exc)))
    elif code == EXIT_INTERNAL:
        err.print("this is a bug in autofusion; run again with -v for the traceback and report it")
    return code


if __name__ == "__main__":
    sys.exit(main())
