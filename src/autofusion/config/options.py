"""Options: one typed, frozen set of compiler settings. Constructing one reads no file and no variable.

`Options.from_env(**overrides)` starts from the defaults, applies the environment variables users of
CANN and torch know (`config/env.py`), then explicit keyword overrides, which win. Rule files, lists
and `fusion_config` are read by `passes.rewrite.settle_options` when a compile starts.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any

from autofusion.cache import DEFAULT_MAX_MB
from autofusion.config.env import env_values
from autofusion.config.flags import FUSION_KINDS

CAPTURE_MODES = ("auto", "strict", "non-strict")
SUPER_KERNEL_MODES = ("auto", "on", "off")
# Convolution layouts a chain may be forced to (passes/layout.py): NCHW on ATen, channels-last on ATen,
# channels-last activations with oneDNN's blocked (prepacked) weights; "auto" measures.
CONV_LAYOUTS = ("auto", "nchw", "channels_last", "blocked", "dnnl")
LINEAR_ROUTES = ("auto", "plain", "mkl", "onednn")  # runtime/prepack.py's routes; "auto" measures


@dataclass(frozen=True)
class Options:
    """Every knob of a compile, with its default and help text (`metadata`)."""

    capture: str = field(
        default="auto",
        metadata={
            "help": "torch.export mode: 'strict' (Dynamo), 'non-strict', or 'auto' (non-strict, then strict)"
        },
    )
    verify: bool = field(default=True, metadata={"help": "run the IR verifier after every stage"})
    cache_dir: str = field(
        default="",
        metadata={
            "help": "where compiled artefacts are cached (env AUTOFUSION_CACHE_DIR; "
            "default $XDG_CACHE_HOME/autofusion or ~/.cache/autofusion; '' = none kept: "
            "a private directory removed at exit)"
        },
    )
    cache_max_mb: int = field(
        default=DEFAULT_MAX_MB,
        metadata={
            "help": "size cap of the cache in MiB: past it the least recently used entries are evicted "
            "(env AUTOFUSION_CACHE_MAX_MB; 0 = no cap). `autofusion cache info` shows what it "
            "holds, `autofusion cache clear` empties it"
        },
    )
    fusion: bool = field(
        default=True, metadata={"help": "fuse and generate kernels (False: reference runtime only)"}
    )
    target: str = field(
        default="cpu", metadata={"help": "hardware profile: cpu, ascend910b, h200 or a YAML path"}
    )
    max_fusion_size: int = field(default=64, metadata={"help": "most IR nodes in one fused kernel (NF1010)"})
    max_inputs: int = field(default=16, metadata={"help": "most input buffers of one fused kernel (NF1007)"})
    recomputation_threshold: int = field(
        default=1,
        metadata={
            "help": "recompute a cheap pointwise producer in up to this many consumer kernels "
            "instead of writing it out (CANN semantics; 1 = always materialise)"
        },
    )
    cxx: str = field(default="g++", metadata={"help": "C++ compiler for generated kernels (env CXX)"})
    disabled: frozenset[str] = field(
        default=frozenset(), metadata={"help": "names of rules and passes turned off"}
    )
    rules_files: tuple[str, ...] = field(
        default=(),
        metadata={
            "help": "user fusion-rule YAML files, applied with the built-in classify_rule.yaml "
            "(env AUTOFUSION_RULES, paths separated by the OS path separator)"
        },
    )
    builtin_rules: bool = field(
        default=True, metadata={"help": "apply the built-in classify_rule.yaml rules"}
    )
    enabled_rules: frozenset[str] = field(
        default=frozenset(),
        metadata={"help": 'rules that ship off (`enabled: false`) switched on; fusion_config "on" adds here'},
    )
    blacklist: tuple[str, ...] = field(
        default=(), metadata={"help": "blacklist.txt files: op types never fused (env AUTOFUSION_BLACKLIST)"}
    )
    skip_node_names_cfg: str = field(
        default="",
        metadata={
            "help": ".ini with [ByNodeName]/[ByNodeType]: nodes kept out of fusion "
            "(AUTOFUSE_DFX_FLAGS=--skip_node_names_cfg=FILE)"
        },
    )
    fusion_config: str = field(
        default="",
        metadata={
            "help": 'JSON {"fusion_config": {"<rule or pass>": "on"|"off"}}; "off" names join '
            "`disabled` (env AUTOFUSION_FUSION_CONFIG)"
        },
    )
    fusion_kinds: frozenset[str] = field(
        default=frozenset({"reduce", "concat", "slice", "split", "transpose", "gather", "matmul", "conv"}),
        metadata={
            "help": "optional fusion kinds that are on (AUTOFUSE_FLAGS --autofuse_enable_pass / "
            "--autofuse_disable_pass); elementwise and broadcast fusion are always on"
        },
    )
    # -- debugging and observability (autofusion.dfx, tools/diagnose) --
    disable_fusion: tuple[str, ...] = field(
        default=(),
        metadata={
            "help": "node names whose merges the solver refuses (NF2100); `autofusion bisect` "
            "writes such a list"
        },
    )
    max_merges: int = field(
        default=-1,
        metadata={
            "help": "accept only the first N merges in solver order, refuse the rest (NF2101); "
            "-1 = no limit. Used by `autofusion bisect`"
        },
    )
    debug_dir: str = field(
        default="",
        metadata={
            "help": "dump every stage's IR and every build's source, compile.sh and compiler "
            "output under DIR/autofuse_compile_debug (env AUTOFUSE_DFX_FLAGS="
            "'--codegen_compile_debug=true;--debug_dir=DIR'); empty = off"
        },
    )
    torch_compile_debug_dir: str = field(
        default="",
        metadata={
            "help": "write one directory per kernel (source, SVG, benchmark.py) under "
            "DIR/run_<time>-pid_<pid> (env TORCH_COMPILE_DEBUG=1: "
            "./torch_compile_debug, or TORCH_COMPILE_DEBUG_DIR); empty = off"
        },
    )
    super_kernel: str = field(
        default="auto",
        metadata={
            "help": "run each plan as SuperKernels, one compiled entry per scope: 'on', 'off', or "
            "'auto' (on where the profile's dispatch overhead is a noticeable share of "
            "the estimated kernel time)"
        },
    )
    freeze: bool = field(
        default=True,
        metadata={
            "help": "treat parameters and buffers as constants under a version guard: parameter-only "
            "subgraphs (concatenated or cast weights, masks from buffers) are computed once and again "
            "only when a parameter is replaced or changed in place; linear weights are prepacked "
            "where that measured faster (env AUTOFUSION_FREEZE=0 turns it off)"
        },
    )
    # -- knobs `autofusion tune` searches beyond the switches above (0 / "auto" = the compiler decides) --
    tile_rows_per_block: int = field(
        default=0,
        metadata={
            "help": "rows each thread takes at a time in reduction kernels that run as rows "
            "(kernel/tile.py); 0 = chosen by the tiler from the on-chip budget and the core count"
        },
    )
    tile_inner_block: int = field(
        default=0,
        metadata={
            "help": "elements per parallel block of pointwise kernels, and outputs per column block of "
            "reductions run as columns (kernel/tile.py); 0 = chosen by the tiler"
        },
    )
    kernel_threads: int = field(
        default=0,
        metadata={
            "help": "OpenMP threads of each generated kernel's and SuperKernel's parallel region "
            "(a num_threads clause in the source); library calls keep torch's thread count; "
            "0 = OpenMP's default (the process's thread count)"
        },
    )
    conv_layout: str = field(
        default="auto",
        metadata={
            "help": "memory layout of every chain of 2-d convolutions (pass channels_last): 'nchw' "
            "(ATen, as eager), 'channels_last' (ATen on NHWC buffers), 'blocked' (oneDNN, NHWC "
            "activations, blocked prepacked weights; fp16 takes channels_last), 'dnnl' (the same oneDNN "
            "convolutions called directly, primitives created once; 'blocked' where oneDNN's library "
            "is not installed), or 'auto' (measured)"
        },
    )
    conv_chain_layouts: tuple[str, ...] = field(
        default=(),
        metadata={
            "help": "per-chain conv layouts, 'NODE=LAYOUT' entries: the chain holding the conv node "
            "NODE (a name `autofusion explain` shows) takes LAYOUT (as conv_layout), before conv_layout"
        },
    )
    layout_search: bool = field(
        default=False,
        metadata={
            "help": "also time the whole program with every conv chain in each forced layout and take "
            "the fastest (autofusion/network_layout.py; graphs with 2+ conv chains, quiet machine, "
            "cached per graph and machine); off by default: the first compile pays one extra compile "
            "per layout (ConvNeXt: 6-7 s), and `autofusion tune` tries the same forced layouts"
        },
    )
    linear_route: str = field(
        default="auto",
        metadata={
            "help": "library route of linears on a parameter weight (with freeze): 'plain' (ATen's "
            "F.linear), 'mkl' (MKL packed, fp32), 'onednn' (oneDNN blocked weight, fp32/bf16), or "
            "'auto' (measured per shape); a route a dtype lacks runs plain"
        },
    )
    super_kernel_gemm: bool = field(
        default=True,
        metadata={
            "help": "SuperKernel entries call linears and bmms themselves (BLAS sgemm); False splits "
            "each scope at them, so they run through torch between entries"
        },
    )
    max_signatures: int = field(
        default=64,
        metadata={
            "help": "most input signatures (shapes, dtypes, strides) one compiled model or graph keeps "
            "plans for; past it the least recently used plan is dropped (and planned again if called)"
        },
    )
    plan_reuse: bool = field(
        default=True,
        metadata={
            "help": "a model with symbolic sizes is planned once and the plan's decisions reused for "
            "other sizes where its guards hold (autofusion.reuse); False plans every size for itself"
        },
    )
    poison: bool = field(
        default=False,
        metadata={
            "help": "fill every buffer a generated kernel writes (outputs, scratch, the SuperKernel "
            "arena) with NaN (integers 0x5A.., bools True) before each run, so an element a "
            "kernel leaves unwritten shows (env AUTOFUSION_POISON=1)"
        },
    )

    tuning: str = field(
        default="auto",
        metadata={
            "help": "apply a tuning record (`autofusion tune`) made for this graph on this machine: "
            "'auto' (from the cache directory), 'off', or a path to a record file "
            "(env AUTOFUSION_TUNING)"
        },
    )

    def _check_plain_types(self) -> None:
        # A value of the wrong kind (a dict for a file path, "3" for a count) would otherwise fail far
        # from here, or be read as something else; paths may be given as os.PathLike.
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if f.type == "str" and isinstance(v, os.PathLike):
                object.__setattr__(self, f.name, os.fspath(v))
            elif f.type == "str" and not isinstance(v, str):
                raise TypeError(f"option {f.name} must be a string, got {type(v).__name__} {v!r}")
            elif f.type == "int" and (isinstance(v, bool) or not isinstance(v, int)):
                raise TypeError(f"option {f.name} must be an integer, got {type(v).__name__} {v!r}")
            elif f.type == "bool" and not isinstance(v, bool):
                raise TypeError(f"option {f.name} must be True or False, got {type(v).__name__} {v!r}")

    def __post_init__(self) -> None:
        self._check_plain_types()
        if self.max_merges < -1:
            raise ValueError(f"max_merges must be -1 (no limit) or >= 0, got {self.max_merges}")
        if self.cache_max_mb < 0:
            raise ValueError(f"cache_max_mb must be >= 0 (0 = no cap), got {self.cache_max_mb}")
        if self.max_signatures < 1:
            raise ValueError(f"max_signatures must be >= 1, got {self.max_signatures}")
        if self.max_fusion_size < 1 or self.max_inputs < 1:
            raise ValueError("max_fusion_size and max_inputs must be >= 1")
        object.__setattr__(self, "disable_fusion", tuple(self.disable_fusion))  # lists would break hashing
        if self.super_kernel not in SUPER_KERNEL_MODES:
            raise ValueError(
                f"super_kernel={self.super_kernel!r}; choose one of {', '.join(SUPER_KERNEL_MODES)}"
            )
        for name in ("tile_rows_per_block", "tile_inner_block", "kernel_threads"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0 (0 = compiler's choice), got {getattr(self, name)}")
        if self.conv_layout not in CONV_LAYOUTS:
            raise ValueError(f"conv_layout={self.conv_layout!r}; choose one of {', '.join(CONV_LAYOUTS)}")
        if self.linear_route not in LINEAR_ROUTES:
            raise ValueError(f"linear_route={self.linear_route!r}; choose one of {', '.join(LINEAR_ROUTES)}")
        chains = self.conv_chain_layouts
        chains = (chains,) if isinstance(chains, str) else tuple(chains)
        object.__setattr__(self, "conv_chain_layouts", chains)
        for entry in self.conv_chain_layouts:
            node, _, layout = str(entry).partition("=")
            if not node or layout not in CONV_LAYOUTS[1:]:
                raise ValueError(
                    f"conv_chain_layouts entry {entry!r}: expected NODE=LAYOUT with LAYOUT one of "
                    f"{', '.join(CONV_LAYOUTS[1:])}"
                )
        if self.tuning not in ("auto", "off") and not os.path.isfile(self.tuning):
            raise ValueError(f"tuning={self.tuning!r}: not 'auto', 'off' or an existing record file")
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
        bad_kinds = sorted(self.fusion_kinds - set(FUSION_KINDS))
        if bad_kinds:
            raise ValueError(f"fusion_kinds: unknown {bad_kinds}; known: {', '.join(FUSION_KINDS)}")

    @staticmethod
    def names() -> list[str]:
        return [f.name for f in dataclasses.fields(Options)]

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None, **overrides: Any) -> Options:
        """Defaults, then the environment (`config/env.py`, the one module that reads it), then overrides."""
        return cls(**env_values(env, overrides, cls.names()))

    def enabled(self, name: str) -> bool:
        """Is the rule or pass `name` switched on?"""
        return self.fusion and name not in self.disabled

    def help(self) -> dict[str, str]:
        return {f.name: f.metadata.get("help", "") for f in dataclasses.fields(self)}
