"""The SuperKernel scope of an IR node (`Scope`: a mark and its `SuperKernelOptions`) and the option parser.

In: the scope mark and option text `autofusion.super_kernel_scope` (frontend/torch/scope.py) records in
an fx node's meta, in the real system's `key=value:key=value` form. Out: a frozen `Scope`, parsed once
where the frontend reads the meta (`Scope.from_meta`) and carried by each IR node as `Node.scope`.

Semantics follow `aclskScopeBegin/End` and torchair's `super_kernel(scope, options)`:
- the same name is the same scope; nested scopes give a mark set ("outer/inner"), and ops with
  exactly the same mark set are grouped;
- `None` marks ops that must not be fused, and "no fuse" wins over any enclosing scope;
- names are at most 255 characters; options unknown to us warn and are ignored.
"""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass, field, fields, replace
from functools import lru_cache

from autofusion.errors import InputMismatchError

log = logging.getLogger("autofusion.superkernel")

SCOPE_KEY = "autofusion_super_kernel_scope"
OPTIONS_KEY = "autofusion_super_kernel_options"
NO_FUSE = "<no-fuse>"
MAX_NAME = 255  # aclskScopeBegin's limit


@dataclass(frozen=True)
class SuperKernelOptions:
    """The options of one SuperKernel scope (defaults as the real JIT path's, where they apply).

    On the CPU target a SuperKernel is one OpenMP parallel region; options without a CPU meaning are
    accepted (so a scope written for Ascend parses) and recorded, and say so in `cpu_effect`.
    """

    early_start: int = 1  # 0: every kernel waits for all earlier ones; 1/2: only for its producers
    debug_sync_all: int = 0  # 1: a barrier after every kernel (bisecting a race)
    split_mode: int = 4  # per-core code copies on Ascend; no CPU effect
    preload_code: str = "per-func"  # ICache preload on Ascend; no CPU effect
    func_align: int = 512  # no CPU effect
    stream_fusion: int = 0  # no CPU effect (one stream)
    feed_sync_all: int = 0  # no CPU effect
    debug_dcci_all: int = 0  # no CPU effect (caches are coherent)
    profiling: int = 0  # no CPU effect yet
    strict_scope_check: int = 0  # 1: a scope that must split raises FusionError instead of logging why

    @property
    def sync_all(self) -> bool:
        """Barrier after every kernel instead of only where data flows."""
        return self.early_start == 0 or self.debug_sync_all == 1


_CHOICES: dict[str, tuple[str, ...] | range] = {
    "early_start": range(0, 3), "debug_sync_all": range(0, 2), "split_mode": range(1, 65),
    "preload_code": ("max", "none", "per-func"), "stream_fusion": range(0, 2), "feed_sync_all": range(0, 2),
    "debug_dcci_all": range(0, 2), "profiling": range(0, 2), "strict_scope_check": range(0, 2),
}  # fmt: skip
_NO_CPU_EFFECT = {"split_mode", "preload_code", "func_align", "stream_fusion", "feed_sync_all",
                  "debug_dcci_all", "profiling"}  # fmt: skip


def parse_options(text: str, where: str = "super_kernel_scope", stacklevel: int = 2) -> SuperKernelOptions:
    """Parse `key=value:key=value`. Unknown keys warn (UserWarning) and are ignored; a bad value for
    a known key raises InputMismatchError naming the key and what it accepts."""
    opts = SuperKernelOptions()
    if not text:
        return opts
    known = {f.name: f for f in fields(SuperKernelOptions)}
    changes: dict[str, object] = {}
    for item in text.split(":"):
        if not item.strip():
            continue
        key, sep, raw = item.partition("=")
        key = key.strip()
        attr = key.replace("-", "_")
        if not sep or attr not in known:
            what = f"unknown option {key!r}" if sep else f"option {item!r} has no '=value'"
            warnings.warn(f"{where}: {what} ignored; known: "
                          f"{', '.join(sorted(k.replace('_', '-') for k in known))}",
                          UserWarning, stacklevel=stacklevel)  # fmt: skip
            continue
        default = getattr(opts, attr)
        value: object = raw.strip()
        if isinstance(default, int):
            try:
                value = int(raw)
            except ValueError:
                raise InputMismatchError(f"{where}: option {key}={raw!r} is not an integer") from None
        allowed = _CHOICES.get(attr)
        if attr == "func_align" and isinstance(value, int) and (value < 0 or (value and value & (value - 1))):
            raise InputMismatchError(f"{where}: func-align={value} must be 0 or a power of 2")
        if allowed is not None and value not in allowed:
            shown = (
                f"{allowed.start}..{allowed.stop - 1}" if isinstance(allowed, range) else ", ".join(allowed)
            )
            raise InputMismatchError(f"{where}: option {key}={raw!r} is out of range ({shown})")
        if attr in _NO_CPU_EFFECT:
            log.info("%s: option %s=%s is recorded; it has no effect on the CPU target", where, key, value)
        changes[attr] = value
    return replace(opts, **changes)  # type: ignore[arg-type]  # each value was parsed as its field's type


def format_options(opts: SuperKernelOptions) -> str:
    """The canonical `key=value:...` text of the non-default options ("" when all are default)."""
    base = SuperKernelOptions()
    parts = [f"{f.name.replace('_', '-')}={getattr(opts, f.name)}" for f in fields(opts)
             if getattr(opts, f.name) != getattr(base, f.name)]  # fmt: skip
    return ":".join(parts)


@dataclass(frozen=True)
class Scope:
    """Where an IR node sits among the user's SuperKernel scopes.

    `name`: "" outside any scope, the names joined by "/" when nested, NO_FUSE when any enclosing
    scope is None. `options`: the innermost scope's options (defaults outside any scope). Kernels and
    SuperKernels group by `name` only; the options travel with it."""

    name: str = ""
    options: SuperKernelOptions = field(default_factory=SuperKernelOptions)

    @property
    def no_fuse(self) -> bool:
        """The user marked the op `super_kernel_scope(None)`: it is never fused."""
        return self.name == NO_FUSE

    def __str__(self) -> str:
        text = format_options(self.options)
        return f"{self.name}|{text}" if text else self.name

    @staticmethod
    def from_meta(meta: dict[str, object]) -> Scope:
        """The scope recorded on an fx node's meta; `NO_SCOPE` outside any scope."""
        custom = meta.get("custom")
        if not isinstance(custom, dict):
            return NO_SCOPE
        return _parsed(str(custom.get(SCOPE_KEY, "")), str(custom.get(OPTIONS_KEY, "")))


NO_SCOPE = Scope()


@lru_cache(maxsize=256)
def _parsed(name: str, text: str) -> Scope:
    # The text is canonical (super_kernel_scope wrote it through format_options), so parsing cannot
    # warn or fail here; the cache keeps it to one parse per scope, not one per fx node.
    return Scope(name, parse_options(text, f"super_kernel_scope({name!r})")) if name or text else NO_SCOPE
