"""Fusion rules, exclusion lists and switches.

In: Options (rule files, blacklist, skip list, switches) and a graph. Out: the rewritten graph and the
groups the fusion solver must keep together (`apply.RuleResult`). Modules:
`loader` (rule files), `expr` (conditions), `opnames` (op-type spellings), `match` (pattern matching),
`library` (what library rules become), `apply` (the pass and its order), `lists` (blacklist and skip
list), `flags` (AUTOFUSE_FLAGS and fusion_config parsing).
"""

from __future__ import annotations

import dataclasses
import os
from functools import lru_cache
from pathlib import Path

from autofusion.config.flags import load_fusion_config, unknown_switches
from autofusion.config.options import Options
from autofusion.passes.manager import PASS_NAMES
from autofusion.passes.rewrite.lists import load_exclusions
from autofusion.passes.rewrite.loader import Rule, RuleFileError, load_rules

BUILTIN_RULES = Path(__file__).with_name("classify_rule.yaml")

__all__ = [
    "BUILTIN_RULES", "PASS_NAMES", "Rule", "RuleFileError", "all_rules", "known_switch_names",
    "settle_options",
]  # fmt: skip


@lru_cache(maxsize=64)
def _load_cached(path: str, mtime_ns: int, size: int) -> tuple[Rule, ...]:
    from autofusion.passes.rewrite.library import KNOWN

    return load_rules(path, KNOWN)


def _load(path: str | Path) -> tuple[Rule, ...]:
    p = str(path)
    try:
        st = os.stat(p)
    except OSError as e:
        raise RuleFileError(f"{p}:0: cannot read rule file: {e.strerror or e}") from None
    return _load_cached(p, st.st_mtime_ns, st.st_size)


def all_rules(rules_files: tuple[str, ...] = (), builtin: bool = True) -> tuple[Rule, ...]:
    """Built-in rules first, then each user file in order; a name defined twice is an error."""
    out: list[Rule] = []
    seen: dict[str, str] = {}
    for path in ([BUILTIN_RULES] if builtin else []) + list(rules_files):
        for r in _load(path):
            if r.name in seen:
                raise RuleFileError(f"{r.source}: rule {r.name!r} is already defined at {seen[r.name]}")
            seen[r.name] = r.source
            out.append(r)
    return tuple(out)


def known_switch_names(rules_files: tuple[str, ...] = ()) -> frozenset[str]:
    """Every name a switch may name: built-in and user rules, and the graph passes."""
    return frozenset(r.name for r in all_rules(rules_files)) | frozenset(PASS_NAMES)


def _stamp(path: str) -> tuple[str, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None  # the loader says why, with the file name
    return path, st.st_mtime_ns, st.st_size


# (options, stamps of the files they name) -> settled options. A compile settles its options more
# than once (CompiledModel, then the planner for each signature); this keeps that to one read of each
# file and one warning per unknown name, and re-reads a file when it changes.
_SETTLED: dict[tuple[Options, tuple[tuple[str, int, int] | None, ...]], Options] = {}


def settle_options(options: Options) -> Options:
    """Read the files `options` names (rule files, blacklist and skip list, fusion_config) and check them.

    Called when a compile starts, before anything is captured, so a bad file fails with file:line and
    nothing is half-applied. Returns `options` with fusion_config's "on" names added to `enabled_rules`
    and its "off" names to `disabled`. Names in `disabled` that are no rule or pass warn (they came from
    `GF_AUTOFUSION_DISABLE`, `--disable` or `Options(disabled=...)`). Files are read once per content.
    """
    files = [*options.rules_files, *options.blacklist, options.skip_node_names_cfg, options.fusion_config]
    stamps = tuple(_stamp(f) for f in files if f)
    found = _SETTLED.get((options, stamps))
    if found is None:
        found = _settle(options)
        if len(_SETTLED) > 512:  # a long-lived process making many option sets: start over
            _SETTLED.clear()
        _SETTLED[(options, stamps)] = _SETTLED[(found, stamps)] = found  # settling again is a no-op
    return found


def _settle(options: Options) -> Options:
    all_rules(options.rules_files, options.builtin_rules)
    if options.blacklist or options.skip_node_names_cfg:
        load_exclusions(options.blacklist, options.skip_node_names_cfg)
    known = known_switch_names(options.rules_files)
    unknown_switches(
        options.disabled, known, "disabled (GF_AUTOFUSION_DISABLE, --disable or Options.disabled)"
    )
    if not options.fusion_config:
        return options
    on, off = load_fusion_config(options.fusion_config)
    unknown_switches(on | off, known, options.fusion_config)
    return dataclasses.replace(
        options, disabled=options.disabled | off, enabled_rules=options.enabled_rules | on
    )
