"""Hardware profiles: the numbers the cost model and the tiler plan against.

In: a built-in name (`cpu`, `ascend910b`, `h200`: `profiles/*.yaml`) or a path to a user YAML file, plus
overrides. Out: a frozen `HardwareProfile`. Invariants:
- sizes, rates and counts are positive; `alignment` and `vector_bytes` are powers of two;
- `budget_bytes` = int(on_chip_bytes * budget_fraction) is what a fused kernel's live tiles may occupy
  (at most 80 % of UB / shared memory / per-core L2);
- `source` says, for every field with a value, whether it is "datasheet", "measured", "default" or
  "override", so reports can show how much of a plan rests on guesses;
- `peak_flops` and `source` are read-only mappings, so a profile is hashable and safe to share.
The cpu YAML lists under `measured:` what `measure.py` fills in on first use (cached per machine in
the cache, `cache_dir`). This module never reads the environment: callers pass paths and overrides in.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib.resources
import logging
import math
import numbers
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autofusion.cache import Cache
from autofusion.errors import CompilerError
from autofusion.hw import calibration as hw_calibration
from autofusion.hw import measure as hw_measure

if TYPE_CHECKING:
    import yaml

log = logging.getLogger(__name__)

BUILTIN_PROFILES = ("cpu", "ascend910b", "h200")
KINDS = ("cpu", "npu", "gpu")
SOURCES = ("datasheet", "measured", "calibrated", "default", "override")
# Keys of `peak_flops`: fp16/bf16 are the matrix unit's dense rate where there is one, fp32 the vector rate.
DTYPE_NAMES = ("fp64", "fp32", "tf32", "fp16", "bf16", "fp8", "int8")
# Classes of elementwise ops the cost model weighs (fusion/terms.py maps each IR op to one), and the cache
# levels `cache_bandwidth` may name.
OP_CLASSES = ("arith", "div", "transcendental", "trig", "exp_nonpos")
CACHE_LEVELS = ("l1", "l2", "l3")

_INT_FIELDS = {"on_chip_bytes", "cores", "vector_bytes", "alignment", "l1_bytes", "l2_bytes", "l3_bytes",
               "vector_registers"}  # fmt: skip
_FLOAT_FIELDS = {"memory_bandwidth", "datasheet_bandwidth", "dispatch_overhead_s", "budget_fraction",
                 "compute_rate", "spill_s"}  # fmt: skip
_POW2_FIELDS = {"vector_bytes", "alignment"}
_OPTIONAL = {"datasheet_bandwidth", "l1_bytes", "l2_bytes", "l3_bytes", "vector_registers", "compute_rate",
             "spill_s", "op_weights", "cache_bandwidth"}  # fmt: skip
_REQUIRED_IN_YAML = ("kind", "memory_bandwidth", "dispatch_overhead_s", "on_chip_bytes", "cores",
                     "vector_bytes", "alignment", "peak_flops")  # fmt: skip


class ProfileError(CompilerError, ValueError):
    """A profile name, file or override is invalid; the message names the file, the key and its line."""


class _Bad(Exception):
    """One value failed its check; `sub` is the nested key (peak_flops.fp32) when there is one."""

    def __init__(self, message: str, sub: str | None = None):
        super().__init__(message)
        self.sub = sub


class _FrozenDict(dict[str, Any]):
    """A dict that refuses mutation, so a frozen profile stays frozen; hashes, pickles and copies."""

    def _readonly(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError("HardwareProfile mappings are read-only; make a new profile with dataclasses.replace")

    # One raiser stands in for every mutating method, whatever its signature.
    __setitem__ = __delitem__ = clear = pop = popitem = setdefault = update = __ior__ = _readonly  # type: ignore[assignment]

    def __hash__(self) -> int:  # type: ignore[override]  # dict is unhashable; a frozen one may hash
        return hash(tuple(sorted(self.items())))

    def __reduce__(self) -> tuple[Any, ...]:
        return (_FrozenDict, (dict(self),))


@dataclass(frozen=True, kw_only=True)
class HardwareProfile:
    """What one device offers the planner. Bandwidths in bytes/s, sizes in bytes, times in seconds."""

    name: str
    kind: str  # "cpu" | "npu" | "gpu"
    memory_bandwidth: float  # achievable copy bandwidth (read + write bytes/s): what the cost model uses
    datasheet_bandwidth: float | None = None  # the vendor's peak, for reports only
    dispatch_overhead_s: float  # per kernel launch / per op call
    on_chip_bytes: int  # per core: Ascend UB, GPU shared memory per SM, CPU L2 per core
    budget_fraction: float = 0.8  # live tile bytes <= this share of on_chip_bytes
    cores: int  # AI cores / SMs / CPUs this process may use
    vector_bytes: int  # bytes one vector instruction (or one GPU thread's load) moves
    alignment: int  # preferred buffer/tile alignment in bytes
    peak_flops: Mapping[str, float]  # dtype name (DTYPE_NAMES) -> FLOP/s
    l1_bytes: int | None = None
    l2_bytes: int | None = None
    l3_bytes: int | None = None
    # The cost model's finer terms (fusion/terms.py); each falls back to a rule over the fields above when
    # absent. `autofusion calibrate` fits them on the host (hw/calibration.py).
    vector_registers: int | None = None  # registers a kernel's loop body keeps values in before spilling
    compute_rate: float | None = None  # fp32 add/mul per second over all cores (default: peak_flops fp32)
    op_weights: Mapping[str, float] | None = None  # "class" or "class.dtype" -> cost in fp32 adds
    cache_bandwidth: Mapping[str, float] | None = None  # "l1"/"l2"/"l3" -> bytes/s, all cores
    spill_s: float | None = None  # seconds per spilled value and element (a store and a reload)
    source: Mapping[str, str] = field(default_factory=dict)  # field -> one of SOURCES

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):  # `source` comes last, after every value is checked
            try:
                object.__setattr__(self, f.name, _check(f.name, getattr(self, f.name)))
            except _Bad as e:
                key = f"{f.name}.{e.sub}" if e.sub else f.name
                raise ProfileError(f"hardware profile {self.name!r}: {key}: {e}") from None
        known = {k: self.source.get(k, "default") for k in VALUE_FIELDS if getattr(self, k) is not None}
        object.__setattr__(self, "source", _FrozenDict(known))

    @property
    def budget_bytes(self) -> int:
        """Bytes a fused kernel's live tiles may occupy per core."""
        return int(self.on_chip_bytes * self.budget_fraction)

    def describe(self) -> str:
        bandwidth = f"{_si(self.memory_bandwidth)}B/s copy"
        if self.datasheet_bandwidth is not None:
            bandwidth += f" (datasheet {_si(self.datasheet_bandwidth)}B/s)"
        flops = ", ".join(f"{k} {_si(v)}FLOP/s" for k, v in self.peak_flops.items())
        text = (
            f"{self.name} ({self.kind}): {self.cores} cores, {bandwidth}, "
            f"dispatch {self.dispatch_overhead_s * 1e6:.1f} us, on-chip {_binary(self.on_chip_bytes)}/core "
            f"(tile budget {_binary(self.budget_bytes)} = {self.budget_fraction:.0%}), "
            f"vector {self.vector_bytes} B, align {self.alignment} B, {flops}"
        )
        for kind in ("measured", "calibrated", "override"):
            names = [k for k, v in self.source.items() if v == kind]
            if names:
                text += f"; {kind}: {', '.join(names)}"
        return text

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON/YAML-ready values (mappings become dicts)."""
        values = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        return {k: dict(v) if isinstance(v, Mapping) else v for k, v in values.items()}


# Fields that carry a number, and so a `source` entry: all but name, kind and source.
VALUE_FIELDS = tuple(
    f.name for f in dataclasses.fields(HardwareProfile) if f.name not in ("name", "kind", "source")
)


def load_profile(
    name_or_path: str | Path,
    *,
    cache_dir: Cache | Path | None = None,
    overrides: Mapping[str, Any] | None = None,
    measure: bool = True,
) -> HardwareProfile:
    """Load a built-in profile by name, or a user YAML file by path.

    Fields the YAML lists under `measured:` (the cpu profile) are measured on first use and cached as JSON
    in the cache (`cache_dir`: a `Cache` or its root), keyed by machine, and a stored calibration of this
    machine (`autofusion calibrate`, hw/calibration.py) is laid over them; `measure=False` or no cache_dir
    keeps the YAML defaults.
    `overrides` replace any field (a mapping replaces the whole mapping) and are marked "override".
    Raises ProfileError (a ValueError) naming the file, the key and its line.
    """
    where, text = _resolve(name_or_path)
    values, sources, measured = _parse(where, text)
    if measured and measure and cache_dir is not None:
        found = hw_measure.cached_cpu_measurement(cache_dir)  # positive numbers only
        for key in (k for k in measured if k in found):
            values[key], sources[key] = _check(key, found[key]), "measured"
        # `autofusion calibrate`'s fit of this machine, when there is one (never measured here).
        for key, value in hw_calibration.cached_calibration(cache_dir).items():
            try:
                values[key], sources[key] = _check(key, value), "calibrated"
            except _Bad as e:
                log.warning("ignoring calibrated %s: %s", key, e)
    for key, value in (overrides or {}).items():
        if key not in ("name", "kind", *VALUE_FIELDS):
            raise ProfileError(f"override {key!r}: unknown profile field{_hint(key, VALUE_FIELDS)}")
        try:
            values[key] = _check(key, value)
        except _Bad as e:
            raise ProfileError(f"override {key}{'.' + e.sub if e.sub else ''}: {e}") from None
        if key in VALUE_FIELDS:
            sources[key] = "override"
    profile = HardwareProfile(**values, source=sources)
    log.debug("hardware profile from %s: %s", where, profile.describe())
    return profile


# ---- reading YAML ----


def _resolve(name_or_path: str | Path) -> tuple[str, str]:
    """(where, text): `where` is the file name used in error messages."""
    text = str(name_or_path)
    if text.lower() in BUILTIN_PROFILES:
        resource = importlib.resources.files("autofusion.hw") / "profiles" / f"{text.lower()}.yaml"
        return str(resource), resource.read_text(encoding="utf-8")
    path = Path(text).expanduser()
    if isinstance(name_or_path, Path) or path.suffix in (".yaml", ".yml") or "/" in text or path.exists():
        if not path.is_file():
            raise ProfileError(f"hardware profile file {text} does not exist")
        return str(path), path.read_text(encoding="utf-8")
    raise ProfileError(
        f"unknown hardware profile {text!r}{_hint(text, BUILTIN_PROFILES)}; "
        f"known: {', '.join(BUILTIN_PROFILES)}, or a path to a .yaml file"
    )


def _parse(where: str, text: str) -> tuple[dict[str, Any], dict[str, str], tuple[str, ...]]:
    """Checked field values, their sources, and the fields to measure; errors name `where` and the line."""
    import yaml  # here, not at the top: a loaded package unpickles its profile and never parses one

    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ProfileError(f"{where}: not valid YAML: {e}") from None
    if not isinstance(root, yaml.MappingNode) or not isinstance(data, dict):
        raise ProfileError(f"{where}: expected a mapping of profile fields at the top level")
    lines = _key_lines(where, root)
    allowed = ("name", "kind", *VALUE_FIELDS, "source", "measured")
    values: dict[str, Any] = {"name": Path(where).stem}
    sources: dict[str, str] = {}
    measured: tuple[str, ...] = ()
    for key, value in data.items():
        if key not in allowed:
            at, hint = f"{where}:{lines.get((str(key),), '?')}", _hint(str(key), allowed)
            raise ProfileError(f"{at}: unknown key {key!r}{hint}; known: {', '.join(allowed)}")
        try:
            if key == "measured":
                measured = _check("measured", value)
            elif key == "source":
                sources = dict(_check("source", value))
            else:
                values[key] = _check(key, value)
        except _Bad as e:
            line = lines.get((key, e.sub or ""), lines.get((key,), "?"))
            name = f"{key}.{e.sub}" if e.sub else key
            raise ProfileError(f"{where}:{line}: key {name!r}: {e}") from None
    missing = [k for k in _REQUIRED_IN_YAML if k not in values]
    if missing:
        raise ProfileError(f"{where}: missing key(s) {', '.join(map(repr, missing))}")
    if measured and values["kind"] != "cpu":
        line = lines.get(("measured",), "?")
        raise ProfileError(f"{where}:{line}: key 'measured': only a 'cpu' profile can be measured here")
    return values, sources, measured


def _key_lines(where: str, root: yaml.MappingNode) -> dict[tuple[str, ...], int | str]:
    """1-based line of every top-level key and of each key one level down; rejects duplicate keys."""
    import yaml

    lines: dict[tuple[str, ...], int | str] = {}

    def walk(node: yaml.MappingNode, prefix: tuple[str, ...]) -> None:
        for key_node, value_node in node.value:
            path = (*prefix, str(key_node.value))
            line = key_node.start_mark.line + 1
            if path in lines:
                first = f"first on line {lines[path]}"
                raise ProfileError(f"{where}:{line}: key {'.'.join(path)!r} appears twice ({first})")
            lines[path] = line
            if not prefix and isinstance(value_node, yaml.MappingNode):
                walk(value_node, path)

    walk(root, ())
    return lines


# ---- checking values ----


def _check(name: str, value: Any) -> Any:
    """The value normalised (ints, floats, read-only mappings), or _Bad with what is wrong."""
    if value is None:
        if name in _OPTIONAL:
            return None
        raise _Bad("is required")
    if name == "name":
        if not isinstance(value, str) or not value.strip():
            raise _Bad(f"expected a non-empty string, got {value!r}")
        return value
    if name == "kind":
        return _one_of(value, KINDS)
    if name in _INT_FIELDS:
        number = int(_number(value, integer=True))
        if name in _POW2_FIELDS and number & (number - 1):
            raise _Bad(f"must be a power of two, got {number}")
        return number
    if name in _FLOAT_FIELDS:
        rate = _number(value)
        if name == "budget_fraction" and rate > 1:
            raise _Bad(f"must be in (0, 1], got {rate}")
        return rate
    if name == "peak_flops":
        return _FrozenDict(_mapping(value, DTYPE_NAMES, lambda k, v: _number(v)))
    if name == "op_weights":
        keys = (*OP_CLASSES, *(f"{c}.{d}" for c in OP_CLASSES for d in DTYPE_NAMES))
        return _FrozenDict(_mapping(value, keys, lambda k, v: _number(v)))
    if name == "cache_bandwidth":
        return _FrozenDict(_mapping(value, CACHE_LEVELS, lambda k, v: _number(v)))
    if name == "source":
        return _FrozenDict(_mapping(value, VALUE_FIELDS, lambda k, v: _one_of(v, SOURCES)))
    if name == "measured":
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise _Bad(f"expected a list of field names, got {value!r}")
        unknown = [v for v in value if v not in VALUE_FIELDS]
        if unknown:
            raise _Bad(f"unknown field {unknown[0]!r}{_hint(unknown[0], VALUE_FIELDS)}")
        return tuple(value)
    raise _Bad("is not a profile field")


def _number(value: Any, integer: bool = False) -> float:
    if isinstance(value, str):  # YAML 1.1 reads `4.8e12` (no dot before e, no sign) as a string
        try:
            value = float(value.replace("_", ""))
        except ValueError:
            raise _Bad(f"expected a number, got {value!r}") from None
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise _Bad(f"expected a number, got {type(value).__name__} {value!r}")
    if not math.isfinite(value) or value <= 0:
        raise _Bad(f"must be a positive number, got {value:g}")
    if integer and not float(value).is_integer():
        raise _Bad(f"expected a whole number, got {value!r}")
    return float(value)


def _mapping(value: Any, keys: tuple[str, ...], check: Any) -> dict[str, Any]:
    if not isinstance(value, Mapping):
        raise _Bad(f"expected a mapping, got {type(value).__name__} {value!r}")
    out = {}
    for key, item in value.items():
        if key not in keys:
            raise _Bad(f"unknown key {key!r}{_hint(str(key), keys)}; known: {', '.join(keys)}", sub=str(key))
        try:
            out[key] = check(key, item)
        except _Bad as e:
            raise _Bad(str(e), sub=str(key)) from None
    return out


def _one_of(value: Any, choices: tuple[str, ...]) -> Any:
    if value not in choices:
        raise _Bad(f"expected one of {', '.join(choices)}, got {value!r}")
    return value


# ---- formatting ----


# torch / IR spellings of dtype names, so `float32:` under peak_flops gets a useful hint
_ALIASES = {"float64": "fp64", "float32": "fp32", "float16": "fp16", "half": "fp16", "bfloat16": "bf16",
            "f64": "fp64", "f32": "fp32", "f16": "fp16", "float": "fp32"}  # fmt: skip


def _hint(word: str, choices: tuple[str, ...]) -> str:
    close = difflib.get_close_matches(word, choices, n=1)
    if _ALIASES.get(word) in choices:
        close = [_ALIASES[word]]
    return f" (did you mean {close[0]!r}?)" if close else ""


def _si(x: float) -> str:
    """4.3e12 -> "4.3 T", to be followed by a unit ("B/s", "FLOP/s")."""
    for scale, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if x >= scale:
            return f"{x / scale:.3g} {prefix}"
    return f"{x:.3g} "


def _binary(n: int) -> str:
    """233472 -> "228 KiB"."""
    for scale, unit in ((1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
        if n >= scale:
            return f"{n / scale:.4g} {unit}"
    return f"{n} B"
