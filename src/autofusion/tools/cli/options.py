"""Options, the model and its compile, from a subcommand's arguments (the parent parsers in `common`).

Every check of user input happens here, before any work: a bad rule file, list, fusion_config, disable
list or environment variable, or a MODEL that cannot be loaded, is a `UsageError` naming it (exit 2).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from autofusion.tools.cli.common import UsageError
from autofusion.tools.cli.disable import read_disable_file, split_disable


def fusion_options(args: argparse.Namespace) -> dict[str, Any]:
    """Options overrides from the command line (only the flags given, so the environment still applies),
    checked: a bad rule file, list, fusion_config or environment variable is a UsageError naming it."""
    from autofusion.config import Options
    from autofusion.errors import CompilerError
    from autofusion.passes.rewrite import settle_options

    out: dict[str, Any] = {}
    if getattr(args, "target", None):
        out["target"] = args.target
    if getattr(args, "rules", None):
        out["rules_files"] = tuple(args.rules)
    if getattr(args, "no_builtin_rules", False):
        out["builtin_rules"] = False
    if getattr(args, "no_freeze", False):
        out["freeze"] = False
    if getattr(args, "blacklist", None):
        out["blacklist"] = tuple(args.blacklist)
    if getattr(args, "skip_node_names_cfg", ""):
        out["skip_node_names_cfg"] = args.skip_node_names_cfg
    if getattr(args, "fusion_config", ""):
        out["fusion_config"] = args.fusion_config
    names = [n.strip() for item in getattr(args, "disable", []) for n in item.split(",") if n.strip()]
    if getattr(args, "disable_file", ""):
        names += read_disable_file(args.disable_file)
    try:
        if names:
            switches, nodes = split_disable(names, out.get("rules_files"))
            if switches:  # added to what the environment turns off (GF_AUTOFUSION_DISABLE), not instead of it
                out["disabled"] = Options.from_env().disabled | frozenset(switches)
            if nodes:
                out["disable_fusion"] = tuple(nodes)
        settle_options(Options.from_env(**out))  # a bad file or variable stops here, with file:line
    except (CompilerError, ValueError) as exc:  # config raises ValueError for a bad environment variable
        raise UsageError(str(exc)) from None
    return out


def load_model(args: argparse.Namespace) -> tuple[Any, tuple[Any, ...]]:
    """MODEL (and --dim) through the loader every tool shares; a bad one is a UsageError."""
    from autofusion.errors import CompilerError
    from autofusion.tools.models.loader import load_model as load
    from autofusion.tools.models.loader import parse_dims

    try:
        return load(args.model, parse_dims(args.dim))
    except (ValueError, CompilerError) as e:
        raise UsageError(str(e)) from None


def compile_model(model: Any, inputs: Sequence[Any], options: dict[str, Any]) -> Any:
    """`autofusion.compile`, for tools that need a fused plan: a model that runs eagerly is a UsageError."""
    import torch

    from autofusion import api

    with torch.no_grad():
        cm = api.compile(model, tuple(inputs), **options)
    if cm.compiled is None or cm.compiled.program is None:
        raise UsageError(f"the model runs eagerly, nothing was fused: {cm.stats.get('eager_fallback')}")
    return cm
