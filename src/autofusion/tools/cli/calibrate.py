"""`autofusion calibrate`: fit the cost model to this machine and say how well it then predicts.

Times micro-kernels (dispatch, bandwidth per cache level, per-op compute cost by op class and dtype,
spill cost: tools/calibrate/micro.py), stores the fitted parameters in the cache keyed by this machine's
fingerprint (where every later `compile` with that cache finds them: the cpu profile marks them
"calibrated"), then plans benchmark cases with them and reports the Spearman rank correlation of
estimated vs measured kernel times and how often the model's fuse/no-fuse verdict on sampled merge
candidates agrees with measuring both (tools/calibrate/accuracy.py).

`--quick` measures fewer micro-kernels (fp32 weights only) and three small cases (seconds with a warm
build cache); `--kernels N` caps the benchmark cases, `--candidates N` the merges sampled per case;
`--no-store` fits and reports without storing; `--clear` forgets this machine's calibration.
With `--json`, the last line is one JSON object: `rank_correlation`, `verdict_agreement`,
`verdict_agreement_strict` (ties not excused), `kernels`, `candidates`, `ties`, `model_fuse` and
`measured_fuse` (candidates each would fuse), `parameters`, `stored`,
`machine`, `load_per_cpu` (a busy machine times less reliably), `seconds`.

Exit status: 0, or 2 when there is no cache directory to store in.
"""

from __future__ import annotations

import argparse
import json
import math
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from autofusion.tools.cli import common
from autofusion.tools.cli.common import EXIT_OK, UsageError

NAME = "calibrate"
TARGETS = {"rank_correlation": 0.8, "verdict_agreement": 0.9}


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser(
        NAME,
        parents=[common.log_parent()],
        help="fit the cost model's parameters on this machine and report its accuracy",
        description="Fit dispatch, bandwidth per cache level, per-op compute and spill costs from "
        "micro-kernels, store them for this machine, and report how well the model then ranks kernel "
        "times and predicts fuse/no-fuse verdicts.",
    )
    p.add_argument("--quick", action="store_true", help="fewer micro-kernels and three small cases")
    p.add_argument("--kernels", type=common.positive_int, metavar="N", help="at most N benchmark cases")
    p.add_argument("--candidates", type=int, metavar="N", help="merge candidates sampled per case")
    p.add_argument("--no-store", action="store_true", help="fit and report, but do not store")
    p.add_argument("--clear", action="store_true", help="forget this machine's calibration and exit")
    p.add_argument("--cache-dir", metavar="DIR", help="cache directory (default: AUTOFUSION_CACHE_DIR)")
    p.add_argument("--json", action="store_true", help="end with one JSON line of the results")
    return p


def run(args: argparse.Namespace, console: Console) -> int:
    from autofusion.cache import Cache
    from autofusion.config import Options
    from autofusion.hw import calibration
    from autofusion.tools.calibrate import calibrate

    where = args.cache_dir or Options.from_env().cache_dir
    if not where:
        raise UsageError(
            "no cache directory to store the calibration in (set AUTOFUSION_CACHE_DIR or --cache-dir)"
        )
    if args.candidates is not None and args.candidates < 0:
        raise UsageError("--candidates must be >= 0")
    cache = Cache(where)
    if args.clear:
        calibration.clear_calibration(cache)
        console.print(f"calibration of this machine cleared in {escape(str(cache.root))}")
        return EXIT_OK
    with common.make_console(stderr=True).status("calibrating (micro-kernels, then benchmark cases)"):
        result = calibrate(cache, quick=args.quick, kernels=args.kernels, candidates=args.candidates,
                           store=not args.no_store)  # fmt: skip
    summary = result.summary()
    if not args.json:
        _print(console, result, summary)
    else:
        print(json.dumps(summary))
    return EXIT_OK


def _fmt(x: float | None) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.3f}"


def _print(console: Console, result: Any, summary: dict[str, Any]) -> None:
    params = Table(title="calibrated parameters")
    params.add_column("parameter")
    params.add_column("value", justify="right")
    p = result.parameters
    params.add_row("dispatch (one kernel call)", f"{p['dispatch_overhead_s'] * 1e6:.2f} us")
    params.add_row("memory bandwidth", f"{p['memory_bandwidth'] / 1e9:.1f} GB/s")
    for level, bw in p["cache_bandwidth"].items():
        params.add_row(f"{level} bandwidth (all cores)", f"{bw / 1e9:.1f} GB/s")
    params.add_row("fp32 add/mul rate", f"{p['compute_rate'] / 1e9:.1f} G/s")
    for key, w in p["op_weights"].items():
        params.add_row(f"op weight {key}", f"{w:.2f} adds")
    params.add_row("spill (value x element)", f"{p['spill_s'] * 1e12:.2f} ps")
    common.print_table(console, params)
    acc = Table(title="model accuracy on this machine")
    for col in ("measure", "value", "target", "over"):
        acc.add_column(col)
    rows = (("rank_correlation", "rank correlation (Spearman)", f"{summary['kernels']} kernels"),
            ("verdict_agreement", "fuse/no-fuse agreement",
             f"{summary['candidates']} candidates, {summary['ties']} ties"))  # fmt: skip
    for key, label, over in rows:
        value = summary[key]
        ok = value is not None and value >= TARGETS[key]
        acc.add_row(label, f"[{'green' if ok else 'red'}]{_fmt(value)}[/]", f">= {TARGETS[key]}", over)
    acc.add_row("agreement, ties not excused", _fmt(summary["verdict_agreement_strict"]), "", "")
    n = summary["candidates"]
    acc.add_row("candidates fused: model / measured", f"{summary['model_fuse']} / {summary['measured_fuse']}",
                "", f"of {n}")  # fmt: skip
    common.print_table(console, acc)
    wrong = [v for v in result.verdicts if not v.agrees]
    for v in wrong:
        verdict = "fuse" if v.model_fuse else "no"
        console.print(f"disagrees: {escape(v.case)}: {escape(v.pair)}: model {verdict} "
                      f"(net {v.net_s * 1e6:.2f} us), measured {v.unfused_s * 1e6:.2f} us unfused vs "
                      f"{v.fused_s * 1e6:.2f} us fused")  # fmt: skip
    console.print(f"stored: {escape(summary['stored'] or '(not stored: --no-store)')}")
    busy = summary["load_per_cpu"]
    note = " (a busy machine: timings are less reliable)" if busy > 1 else ""
    console.print(f"{summary['seconds']:.1f} s; load {busy:.2f} per CPU{note}")
