"""The one module that reads the environment: CANN's and torch's variables as Options values.

In: `os.environ` (or a given dict). Out: keyword values for `Options`, then the `Options` itself
(`env_values`; `Options.from_env` builds the Options). Parsing of the flag strings lives in
`config/flags.py`; names of rules and passes a variable switches off are checked when a compile
starts (`passes.rewrite.settle_options`), where the rule files are known.
"""

from __future__ import annotations

import difflib
import os
from typing import Any

from autofusion.config.flags import parse_autofuse_flags, parse_name_list
from autofusion.errors import InputMismatchError


def env_values(env: dict[str, str] | None, overrides: dict[str, Any], names: list[str]) -> dict[str, Any]:
    """Options field values: defaults the environment sets, then `overrides` (checked against `names`)."""
    env = dict(os.environ) if env is None else env
    values: dict[str, Any] = {}
    if env.get("AUTOFUSION_CACHE_DIR"):
        values["cache_dir"] = env["AUTOFUSION_CACHE_DIR"]
    else:
        base = env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        values["cache_dir"] = os.path.join(base, "autofusion")
    if env.get("AUTOFUSION_CACHE_MAX_MB", "").strip():
        values["cache_max_mb"] = _megabytes("AUTOFUSION_CACHE_MAX_MB", env["AUTOFUSION_CACHE_MAX_MB"])
    if env.get("CXX"):
        values["cxx"] = env["CXX"]
    if env.get("AUTOFUSION_POISON", "").strip():
        values["poison"] = _flag("AUTOFUSION_POISON", env["AUTOFUSION_POISON"])
    if env.get("AUTOFUSION_FREEZE", "").strip():
        values["freeze"] = _flag("AUTOFUSION_FREEZE", env["AUTOFUSION_FREEZE"])
    if env.get("AUTOFUSION_TUNING", "").strip():
        values["tuning"] = env["AUTOFUSION_TUNING"].strip()
    values.update(_fusion_env(env))
    if env.get("AUTOFUSE_DFX_FLAGS"):
        dfx = parse_dfx_flags(env["AUTOFUSE_DFX_FLAGS"])
        if dfx.get("codegen_compile_debug", "false") == "true":
            values["debug_dir"] = dfx.get("debug_dir") or os.getcwd()
        if dfx.get("skip_node_names_cfg"):
            values["skip_node_names_cfg"] = dfx["skip_node_names_cfg"]
    if env.get("TORCH_COMPILE_DEBUG", "0") not in ("", "0"):
        base = env.get("TORCH_COMPILE_DEBUG_DIR") or os.getcwd()
        values["torch_compile_debug_dir"] = os.path.join(base, "torch_compile_debug")
    unknown = [k for k in overrides if k not in names]
    if unknown:
        hints = {k: difflib.get_close_matches(k, names, n=1) for k in unknown}
        detail = ", ".join(f"{k!r}" + (f" (did you mean {h[0]!r}?)" if h else "") for k, h in hints.items())
        raise InputMismatchError(f"unknown option(s) {detail}; known: {', '.join(names)}")
    values.update(overrides)
    return values


def _flag(name: str, text: str) -> bool:
    value = text.strip().lower()
    if value in ("1", "true", "on", "yes"):
        return True
    if value in ("0", "false", "off", "no"):
        return False
    raise ValueError(f"{name}={text!r}: expected 1/0 (or true/false, on/off, yes/no)")


def _megabytes(name: str, text: str) -> int:
    try:
        value = int(text.strip())
    except ValueError:
        value = -1
    if value < 0:
        raise ValueError(f"{name}={text!r}: expected a whole number of MiB, 0 for no cap")
    return value


def _fusion_env(env: dict[str, str]) -> dict[str, Any]:
    """The fusion switches users of CANN know (their syntax: `config/flags.py`), as Options values.

    GF_AUTOFUSION_DEBUG=1: all fusion off (every op runs on its own). GF_AUTOFUSION_DISABLE="a,b": rules
    or passes off. AUTOFUSE_FLAGS: --enable_autofuse, --autofuse_enable_pass/--autofuse_disable_pass,
    --max_fusion_size, --recomputation_threshold (invalid values warn and keep the default).
    AUTOFUSION_RULES / AUTOFUSION_BLACKLIST (path lists),
    AUTOFUSION_FUSION_CONFIG (a JSON path).
    """
    values: dict[str, Any] = {}
    if env.get("AUTOFUSE_FLAGS"):
        values.update(parse_autofuse_flags(env["AUTOFUSE_FLAGS"]).values)
    if env.get("AUTOFUSION_RULES"):
        values["rules_files"] = tuple(p for p in env["AUTOFUSION_RULES"].split(os.pathsep) if p)
    if env.get("AUTOFUSION_BLACKLIST"):
        values["blacklist"] = tuple(p for p in env["AUTOFUSION_BLACKLIST"].split(os.pathsep) if p)
    if env.get("AUTOFUSION_FUSION_CONFIG"):
        values["fusion_config"] = env["AUTOFUSION_FUSION_CONFIG"]
    if env.get("GF_AUTOFUSION_DISABLE"):
        # Unknown names warn when a compile starts (`passes.rewrite.settle_options`), where rules are known.
        values["disabled"] = parse_name_list(env["GF_AUTOFUSION_DISABLE"])
    debug = env.get("GF_AUTOFUSION_DEBUG", "").strip().lower()
    if debug in ("1", "true", "on", "yes"):
        values["fusion"] = False
    return values


# AUTOFUSE_DFX_FLAGS keys we act on, and CANN keys we accept without acting on them (they tune CANN's
# Ascend tiling solver and kernel replacement, which have no counterpart here).
DFX_FLAGS = {"codegen_compile_debug": ("true", "false"), "debug_dir": None, "skip_node_names_cfg": None}
DFX_FLAGS_IGNORED = frozenset({
    "replace_kernel", "autofuse_att_algorithm", "att_accuracy_level", "att_enable_small_shape_strategy",
    "att_enable_multicore_ub_tradeoff", "att_ub_threshold", "att_corenum_threshold", "att_profiling",
    "autofuse_enable_tiling_cache", "autofuse_pgo_algo", "autofuse_pgo_step_max", "autofuse_pgo_topn",
    "disable_lifting", "subgraph_recover",
})  # fmt: skip


def parse_dfx_flags(text: str) -> dict[str, str]:
    """`--key=value;--key=value` (CANN's AUTOFUSE_DFX_FLAGS syntax) -> {key: value}.

    Known keys are checked (`codegen_compile_debug` takes true/false); CANN's tiling keys are accepted
    and ignored; anything else is an error that names the entry and suggests the closest key."""
    out: dict[str, str] = {}
    for raw in text.split(";"):
        item = raw.strip()
        if not item:
            continue
        key, sep, value = item.removeprefix("--").partition("=")
        key, value = key.strip(), value.strip()
        if not item.startswith("--") or not sep or not key:
            raise ValueError(
                f"AUTOFUSE_DFX_FLAGS: {item!r} is not of the form --key=value (entries split by ';')"
            )
        if key in DFX_FLAGS_IGNORED:
            continue
        if key not in DFX_FLAGS:
            close = difflib.get_close_matches(key, list(DFX_FLAGS) + sorted(DFX_FLAGS_IGNORED), n=1)
            hint = f" (did you mean --{close[0]}?)" if close else ""
            raise ValueError(
                f"AUTOFUSE_DFX_FLAGS: unknown key --{key}{hint}; known: "
                + ", ".join(f"--{k}" for k in DFX_FLAGS)
            )
        allowed = DFX_FLAGS[key]
        if allowed is not None and value.lower() not in allowed:
            raise ValueError(f"AUTOFUSE_DFX_FLAGS: --{key}={value}: expected one of {', '.join(allowed)}")
        out[key] = value.lower() if allowed is not None else value
    return out
