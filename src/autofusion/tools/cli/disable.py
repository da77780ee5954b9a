"""Disable lists: the names `--disable` and `--disable-file` take; the file `bisect --write-disable` writes.

A name is a rule or pass name when it is one (the names GF_AUTOFUSION_DISABLE takes: Options.disabled),
otherwise a node name (Options.disable_fusion: its merges are refused, NF2100); `node:NAME`, `rule:NAME`
and `pass:NAME` say which explicitly. A file holds one name per line, `#` starts a comment.
"""

from __future__ import annotations

from pathlib import Path

from autofusion.tools.cli.common import UsageError

SWITCH_PREFIXES = ("rule:", "pass:")


def read_disable_file(path: str) -> list[str]:
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise UsageError(f"--disable-file {path}: {e.strerror or e}") from e
    names = []
    for line in text.splitlines():
        name = line.split("#", 1)[0].strip()
        if name:
            names.append(name)
    return names


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
                raise UsageError(
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
