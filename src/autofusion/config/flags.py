"""Switch strings and files: CANN's `AUTOFUSE_FLAGS` / `AUTOFUSE_DFX_FLAGS` and the AOE-style
`fusion_config` JSON. Pure parsing: `autofusion.config` reads the environment and calls these.

`AUTOFUSE_FLAGS` (CANN's syntax): `;`-separated `--key=value` items, list values
comma-separated, tokens without exactly one '=' ignored with a warning, an invalid value warns and
keeps the default,
a kind in both enable and disable lists ends up disabled with a warning.
"""

from __future__ import annotations

import difflib
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autofusion.errors import RuleFileError

log = logging.getLogger("autofusion.config")

# CANN's optional fusion kinds (autofuse_enable_pass / autofuse_disable_pass).
FUSION_KINDS = ("reduce", "concat", "slice", "split", "transpose", "gather", "matmul", "conv")


@dataclass
class FlagValues:
    """What AUTOFUSE_FLAGS set (per Options field) and the warnings parsing gave."""

    values: dict[str, Any] = field(default_factory=dict)  # Options field -> value
    warnings: list[str] = field(default_factory=list)


def _warn(out: FlagValues, msg: str) -> None:
    out.warnings.append(msg)
    log.warning("%s", msg)


def _bool(v: str) -> bool | None:
    return {"true": True, "1": True, "false": False, "0": False}.get(v.strip().lower())


def _kinds(v: str, key: str, out: FlagValues) -> list[str] | None:
    items = [x.strip() for x in v.split(",") if x.strip()]
    bad = [x for x in items if x not in FUSION_KINDS]
    if bad:
        hint = difflib.get_close_matches(bad[0], FUSION_KINDS, n=1)
        _warn(
            out,
            f"AUTOFUSE_FLAGS {key}: unknown kind {bad[0]!r}"
            + (f" (did you mean {hint[0]!r}?)" if hint else "")
            + f"; known: {', '.join(FUSION_KINDS)}; keeping the default",
        )
        return None
    return items


def parse_autofuse_flags(text: str, var: str = "AUTOFUSE_FLAGS") -> FlagValues:
    out = FlagValues()
    enable: list[str] | None = None
    disable: list[str] | None = None
    for token in text.split(";"):
        token = token.strip()
        if not token:
            continue
        if token.count("=") != 1:
            # CANN skips such a token; we skip it too, but say so: a dropped flag must not go unnoticed.
            _warn(out, f"{var}: {token!r} is not a --key=value item; ignored")
            continue
        key, value = (s.strip() for s in token.split("="))
        name = key.lstrip("-")
        if name == "enable_autofuse":
            b = _bool(value)
            if b is None:
                _warn(out, f"{var} --enable_autofuse={value!r} is not true/false; keeping the default")
            else:
                out.values["fusion"] = b
        elif name == "autofuse_enable_pass":
            enable = _kinds(value, key, out)
        elif name == "autofuse_disable_pass":
            disable = _kinds(value, key, out)
        elif name == "max_fusion_size":
            if value.isdigit():
                n = int(value)
                if n == 0:
                    out.values["fusion"] = False  # CANN: 0 = no fusion
                else:
                    out.values["max_fusion_size"] = n
            else:
                _warn(
                    out,
                    f"{var} --max_fusion_size={value!r} is not a non-negative integer; keeping the default",
                )
        elif name == "recomputation_threshold":
            if value.isdigit() and int(value) <= 255:
                out.values["recomputation_threshold"] = int(value)
            else:
                _warn(out, f"{var} --recomputation_threshold={value!r} is not in 0..255; keeping the default")
        elif name == "skip_node_names_cfg":
            out.values["skip_node_names_cfg"] = value
        else:
            _warn(out, f"{var}: {key} is not supported here; ignored")
    kinds = set(FUSION_KINDS) if enable is None else set(enable)
    if disable:
        both = sorted(set(disable) & set(enable or []))
        if both:
            _warn(
                out,
                f"{var}: {', '.join(both)} given to both --autofuse_enable_pass and --autofuse_disable_pass; "
                "disabled",
            )
        kinds -= set(disable)
    if enable is not None or disable:
        out.values["fusion_kinds"] = frozenset(kinds)
    return out


def parse_name_list(text: str) -> frozenset[str]:
    return frozenset(x.strip() for x in text.split(",") if x.strip())


def load_fusion_config(path: str | Path) -> tuple[frozenset[str], frozenset[str]]:
    """(names switched on, names switched off) from {"fusion_config": {"name": "on"|"off", ...}}."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise RuleFileError(f"{p}:0: cannot read fusion_config: {e.strerror or e}") from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise RuleFileError(f"{p}:{e.lineno}: JSON syntax error: {e.msg}") from None
    table = doc.get("fusion_config") if isinstance(doc, dict) else None
    if not isinstance(table, dict):
        raise RuleFileError(f'{p}:1: expected {{"fusion_config": {{"<rule or pass>": "on"|"off"}}}}')
    on, off = set(), set()
    lines = text.splitlines()
    for name, value in table.items():
        v = value if isinstance(value, bool) else str(value).strip().lower()
        if v in ("on", True, "true", "1", "enable", "enabled"):
            on.add(name)
        elif v in ("off", False, "false", "0", "disable", "disabled"):
            off.add(name)
        else:
            line = next((i for i, ln in enumerate(lines, 1) if f'"{name}"' in ln), 1)
            raise RuleFileError(f'{p}:{line}: switch {name!r} must be "on" or "off", got {value!r}')
    return frozenset(on), frozenset(off)


def unknown_switches(names: frozenset[str], known: frozenset[str], where: str) -> list[str]:
    """Warn (and return the warnings) for names that are neither a rule nor a pass."""
    msgs = []
    for n in sorted(names - known):
        hint = difflib.get_close_matches(n, sorted(known), n=1)
        msg = f"{where}: {n!r} is not a rule or pass name" + (f" (did you mean {hint[0]!r}?)" if hint else "")
        log.warning("%s", msg)
        msgs.append(msg)
    return msgs
