"""Options: one typed, frozen set of compiler settings; the only module that reads the environment.

`Options.from_env(**overrides)` starts from the defaults, applies the environment variables users of
CANN and torch know (as later issues add them), then explicit keyword overrides, which win.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
from dataclasses import dataclass, field
from typing import Any

from autofusion.errors import InputMismatchError

CAPTURE_MODES = ("auto", "strict", "non-strict")
SUPER_KERNEL_MODES = ("auto", "on", "off")


@dataclass(frozen=True)
class Options:
    capture: str = field(
        default="auto",
        metadata={"help": "torch.export mode: 'strict' (Dynamo), 'non-strict', or 'auto' (non-strict, then strict)"},
    )
    verify: bool = field(default=True, metadata={"help": "run the IR verifier after every stage"})
    cache_dir: str = field(
        default="", metadata={"help": "where compiled artefacts are cached (env AUTOFUSION_CACHE_DIR; "
                                      "default $XDG_CACHE_HOME/autofusion or ~/.cache/autofusion)"}
    )
    fusion: bool = field(default=True, metadata={"help": "fuse and generate kernels (False: reference runtime only)"})
    target: str = field(default="cpu", metadata={"help": "hardware profile: cpu, ascend910b, h200 or a YAML path"})
    max_fusion_size: int = field(default=64, metadata={"help": "most IR nodes in one fused kernel (NF1010)"})
    max_inputs: int = field(default=16, metadata={"help": "most input buffers of one fused kernel (NF1007)"})
    recomputation_threshold: int = field(
        default=1, metadata={"help": "recompute a cheap pointwise producer in up to this many consumer kernels "
                                     "instead of writing it out (CANN semantics; 1 = always materialise)"})
    cxx: str = field(default="g++", metadata={"help": "C++ compiler for generated kernels (env CXX)"})
    disabled: frozenset[str] = field(default=frozenset(), metadata={"help": "names of rules and passes turned off"})
    rules_files: tuple[str, ...] = field(
        default=(), metadata={"help": "user fusion-rule YAML files, applied with the built-in classify_rule.yaml "
                                      "(env AUTOFUSION_RULES, paths separated by the OS path separator)"})
    builtin_rules: bool = field(default=True, metadata={"help": "apply the built-in classify_rule.yaml rules"})
    enabled_rules: frozenset[str] = field(
        default=frozenset(),
        metadata={"help": 'rules that ship off (`enabled: false`) switched on; fusion_config "on" adds here'},
    )
    blacklist: tuple[str, ...] = field(
        default=(), metadata={"help": "blacklist.txt files: op types never fused (env AUTOFUSION_BLACKLIST)"})
    skip_node_names_cfg: str = field(
        default="", metadata={"help": ".ini with [ByNodeName]/[ByNodeType]: nodes kept out of fusion "
                                      "(AUTOFUSE_DFX_FLAGS=--skip_node_names_cfg=FILE)"})
    fusion_config: str = field(
        default="", metadata={"help": 'JSON {"fusion_config": {"<rule or pass>": "on"|"off"}}; "off" names join '
                                      "`disabled` (env AUTOFUSION_FUSION_CONFIG)"})
    fusion_kinds: frozenset[str] = field(
        default=frozenset({"reduce", "concat", "slice", "split", "transpose", "gather", "matmul", "conv"}),
        metadata={"help": "optional fusion kinds that are on (AUTOFUSE_FLAGS --autofuse_enable_pass / "
                          "--autofuse_disable_pass); elementwise and broadcast fusion are always on"})
    # -- debugging and observability (issue 5; autofusion.dfx) --
    disable_fusion: tuple[str, ...] = field(
        default=(), metadata={"help": "node names whose merges the solver refuses (NF2100); `autofusion bisect` "
                                      "writes such a list"})
    max_merges: int = field(
        default=-1, metadata={"help": "accept only the first N merges in solver order, refuse the rest (NF2101); "
                                      "-1 = no limit. Used by `autofusion bisect`"})
    debug_dir: str = field(
        default="", metadata={"help": "dump every stage's IR and every build's source, compile.sh and compiler "
                                      "output under DIR/autofuse_compile_debug (env AUTOFUSE_DFX_FLAGS="
                                      "'--codegen_compile_debug=true;--debug_dir=DIR'); empty = off"})
    torch_compile_debug_dir: str = field(
        default="", metadata={"help": "write one directory per kernel (source, SVG, benchmark.py) under "
                                      "DIR/run_<time>-pid_<pid> (env TORCH_COMPILE_DEBUG=1: "
                                      "./torch_compile_debug, or TORCH_COMPILE_DEBUG_DIR); empty = off"})
    super_kernel: str = field(
        default="auto", metadata={"help": "run each plan as SuperKernels, one compiled entry per scope: 'on', 'off', or "
                                          "'auto' (on where the profile's dispatch overhead is a noticeable share of "
                                          "the estimated kernel time)"})
    poison: bool = field(
        default=False,
        metadata={"help": "fill every buffer a generated kernel writes (outputs, scratch, the SuperKernel "
                          "arena) with NaN (integers 0x5A.., bools True) before each run, so an element a "
                          "kernel leaves unwritten shows (env AUTOFUSION_POISON=1)"})

    def __post_init__(self) -> None:
        if self.max_merges < -1:
            raise ValueError(f"max_merges must be -1 (no limit) or >= 0, got {self.max_merges}")
        if self.max_fusion_size < 1 or self.max_inputs < 1:
            raise ValueError("max_fusion_size and max_inputs must be >= 1")
        object.__setattr__(self, "disable_fusion", tuple(self.disable_fusion))  # lists would break hashing
        if self.super_kernel not in SUPER_KERNEL_MODES:
            raise ValueError(f"super_kernel={self.super_kernel!r}; choose one of {', '.join(SUPER_KERNEL_MODES)}")
        if self.capture not in CAPTURE_MODES:
            raise ValueError(f"capture={self.capture!r}; choose one of {', '.join(CAPTURE_MODES)}")
        # Tuples and sets given as lists or strings by callers are normalised (the dataclass is frozen).
        for name in ("rules_files", "blacklist"):
            v = getattr(self, name)
            if isinstance(v, (str, os.PathLike)):
                object.__setattr__(self, name, (str(v),))
            elif not isinstance(v, tuple):
                object.__setattr__(self, name, tuple(str(x) for x in v))
        for name in ("disabled", "fusion_kinds", "enabled_rules"):
            v = getattr(self, name)
            if isinstance(v, str):
                v = [x.strip() for x in v.split(",") if x.strip()]
            if not isinstance(v, frozenset):
                object.__setattr__(self, name, frozenset(v))
        from autofusion.rules.flags import FUSION_KINDS, load_fusion_config, unknown_switches

        bad_kinds = sorted(self.fusion_kinds - set(FUSION_KINDS))
        if bad_kinds:
            raise ValueError(f"fusion_kinds: unknown {bad_kinds}; known: {', '.join(FUSION_KINDS)}")
        # Rule files and lists are read (and cached) now, so a bad file fails here with file:line,
        # before anything is compiled: nothing is half-applied.
        from autofusion.rules import all_rules, known_switch_names
        from autofusion.rules.lists import load_exclusions

        all_rules(self.rules_files, self.builtin_rules)
        if self.blacklist or self.skip_node_names_cfg:
            load_exclusions(self.blacklist, self.skip_node_names_cfg)
        if self.fusion_config:
            _on, off = load_fusion_config(self.fusion_config)
            unknown_switches(_on | off, known_switch_names(self.rules_files), self.fusion_config)
            object.__setattr__(self, "disabled", self.disabled | off)
            object.__setattr__(self, "enabled_rules", self.enabled_rules | _on)

    @staticmethod
    def names() -> list[str]:
        return [f.name for f in dataclasses.fields(Options)]

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None, **overrides: Any) -> Options:
        env = dict(os.environ) if env is None else env
        values: dict[str, Any] = {}
        if env.get("AUTOFUSION_CACHE_DIR"):
            values["cache_dir"] = env["AUTOFUSION_CACHE_DIR"]
        else:
            base = env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
            values["cache_dir"] = os.path.join(base, "autofusion")
        if env.get("CXX"):
            values["cxx"] = env["CXX"]
        if env.get("AUTOFUSION_POISON", "").strip():
            values["poison"] = _flag("AUTOFUSION_POISON", env["AUTOFUSION_POISON"])
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
        unknown = [k for k in overrides if k not in cls.names()]
        if unknown:
            hints = {k: difflib.get_close_matches(k, cls.names(), n=1) for k in unknown}
            detail = ", ".join(f"{k!r}" + (f" (did you mean {h[0]!r}?)" if h else "") for k, h in hints.items())
            raise InputMismatchError(f"unknown option(s) {detail}; known: {', '.join(cls.names())}")
        values.update(overrides)
        return cls(**values)

    def enabled(self, name: str) -> bool:
        """Is the rule or pass `name` switched on?"""
        return self.fusion and name not in self.disabled

    def help(self) -> dict[str, str]:
        return {f.name: f.metadata.get("help", "") for f in dataclasses.fields(self)}


def _flag(name: str, text: str) -> bool:
    value = text.strip().lower()
    if value in ("1", "true", "on", "yes"):
        return True
    if value in ("0", "false", "off", "no"):
        return False
    raise ValueError(f"{name}={text!r}: expected 1/0 (or true/false, on/off, yes/no)")


def _fusion_env(env: dict[str, str]) -> dict[str, Any]:
    """The fusion switches users of CANN know (seed 001, reference notes §2), as Options values.

    GF_AUTOFUSION_DEBUG=1: all fusion off (every op runs on its own). GF_AUTOFUSION_DISABLE="a,b": rules
    or passes off. AUTOFUSE_FLAGS: --enable_autofuse, --autofuse_enable_pass/--autofuse_disable_pass,
    --max_fusion_size, --recomputation_threshold (invalid values warn and keep the default).
    AUTOFUSION_RULES / AUTOFUSION_BLACKLIST (path lists),
    AUTOFUSION_FUSION_CONFIG (a JSON path).
    """
    from autofusion.rules.flags import parse_autofuse_flags, parse_name_list, unknown_switches

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
        names = parse_name_list(env["GF_AUTOFUSION_DISABLE"])
        from autofusion.rules import known_switch_names

        unknown_switches(names, known_switch_names(values.get("rules_files", ())), "GF_AUTOFUSION_DISABLE")
        values["disabled"] = names
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
            raise ValueError(f"AUTOFUSE_DFX_FLAGS: {item!r} is not of the form --key=value (entries split by ';')")
        if key in DFX_FLAGS_IGNORED:
            continue
        if key not in DFX_FLAGS:
            close = difflib.get_close_matches(key, list(DFX_FLAGS) + sorted(DFX_FLAGS_IGNORED), n=1)
            hint = f" (did you mean --{close[0]}?)" if close else ""
            raise ValueError(f"AUTOFUSE_DFX_FLAGS: unknown key --{key}{hint}; known: "
                             + ", ".join(f"--{k}" for k in DFX_FLAGS))
        allowed = DFX_FLAGS[key]
        if allowed is not None and value.lower() not in allowed:
            raise ValueError(f"AUTOFUSE_DFX_FLAGS: --{key}={value}: expected one of {', '.join(allowed)}")
        out[key] = value.lower() if allowed is not None else value
    return out
