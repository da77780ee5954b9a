"""CPU instruction-set features: what this machine has, and what a compiler's macros say a build may use.

In: /proc/cpuinfo (`flags` on x86, `Features` on Arm), and the predefined macros of a compiler run with
the build's flags (`codegen/cpp/build.py` runs it; this module only reads the text). Out: feature names in
one spelling, the kernel's /proc/cpuinfo one (`avx2`, `avx512f`, `sse4_1`, `asimd`), so that a feature a
build was made for can be checked on another machine without a compiler there.

Why macros: `-march=native` (or any -m flag) resolves to a set of ISA extensions the compiler may emit
instructions of; GCC and Clang announce each as a macro (`__AVX2__`, `__SSE4_1__`, `__ARM_FEATURE_SVE`).
A library is safe on a machine exactly when that machine has every one of them. Macros with no
/proc/cpuinfo counterpart on the building machine (`__CRC32__`, implied by SSE4.2; features a hypervisor
hides from cpuinfo) cannot be checked anywhere and are left out of the required set.
"""

from __future__ import annotations

import functools
import hashlib
import re
from collections.abc import Iterable
from pathlib import Path

CPUINFO = Path("/proc/cpuinfo")

# Macro stem (without the underscores around it) -> the /proc/cpuinfo flag, where the two spellings
# differ by more than case and underscores.
_X86_ALIASES = {
    "SSE3": "pni",
    "PCLMUL": "pclmulqdq",
    "LZCNT": "abm",
    "ABM": "abm",
    "RDRND": "rdrand",
    "LAHF_SAHF": "lahf_lm",
    "PRFCHW": "3dnowprefetch",
    "BMI": "bmi1",
    "SHA": "sha_ni",
    "SHSTK": "user_shstk",
}
# Arm: `__ARM_FEATURE_<X>` and `__ARM_NEON` -> the `Features` names of /proc/cpuinfo.
_ARM_ALIASES = {
    "NEON": "asimd",
    "FMA": "asimd",
    "SVE": "sve",
    "SVE2": "sve2",
    "DOTPROD": "asimddp",
    "FP16_VECTOR_ARITHMETIC": "asimdhp",
    "BF16_VECTOR_ARITHMETIC": "bf16",
    "MATMUL_INT8": "i8mm",
    "SHA2": "sha2",
    "SHA3": "sha3",
    "AES": "aes",
    "CRC32": "crc32",
    "ATOMICS": "atomics",
}
_MACRO = re.compile(r"#define __([A-Z0-9_]+?)__ 1$")
_ARM_MACRO = re.compile(r"#define __ARM_(?:FEATURE_)?([A-Z0-9_]+) 1$")


def canonical(name: str) -> str:
    """One spelling for comparisons: lower case, no underscores or dots (`sse4_1`, `SSE4.1` -> `sse41`)."""
    return re.sub(r"[_.\-]", "", name.lower())


def parse_cpuinfo(text: str) -> frozenset[str]:
    """The feature flags of the first processor block of /proc/cpuinfo text."""
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip().lower() in ("flags", "features"):
            return frozenset(value.split())
    return frozenset()


@functools.lru_cache(maxsize=1)
def host_features() -> frozenset[str]:
    """This machine's CPU feature flags (empty where /proc/cpuinfo cannot be read)."""
    try:
        return parse_cpuinfo(CPUINFO.read_text(errors="replace"))
    except OSError:
        return frozenset()


@functools.lru_cache(maxsize=1)
def host_model() -> str:
    """This machine's CPU model name ("" where /proc/cpuinfo does not say), for messages."""
    try:
        text = CPUINFO.read_text(errors="replace")
    except OSError:
        return ""
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip().lower() in ("model name", "hardware"):
            return " ".join(value.split())
    return ""


def macro_features(macros: str) -> frozenset[str]:
    """The ISA extensions a compiler's predefined macros (`cxx -dM -E` output) announce, as macro stems
    in canonical spelling (x86: `__AVX2__` -> `avx2`; Arm: `__ARM_FEATURE_SVE` -> `sve`)."""
    out: set[str] = set()
    for line in macros.splitlines():
        line = line.strip()
        arm = _ARM_MACRO.match(line)
        if arm is not None:
            out.add("arm:" + arm.group(1))
            continue
        m = _MACRO.match(line)
        if m is not None:
            out.add(m.group(1))
    return frozenset(out)


def required_features(announced: Iterable[str], host: Iterable[str]) -> tuple[str, ...]:
    """The cpuinfo flags, of the building machine's `host` flags, that a build announcing the macro
    stems `announced` (`macro_features`) may use: what a machine must have to run it. Sorted."""
    by_canon = {canonical(f): f for f in host}
    out: set[str] = set()
    for stem in announced:
        if stem.startswith("arm:"):
            flag = _ARM_ALIASES.get(stem[4:])
            if flag is not None and canonical(flag) in by_canon:
                out.add(by_canon[canonical(flag)])
            continue
        name = _X86_ALIASES.get(stem, stem)
        hit = by_canon.get(canonical(name))
        if hit is not None:
            out.add(hit)
    return tuple(sorted(out))


def features_digest(features: Iterable[str] | None = None) -> str:
    """A short stable digest of a feature set (default: this machine's), for cache keys of records that
    depend on the CPU (measurements, timings): machines of one model name may differ in features."""
    text = " ".join(sorted(host_features() if features is None else features))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def missing_features(required: Iterable[str], host: Iterable[str] | None = None) -> list[str]:
    """The features in `required` that `host` (default: this machine) lacks, sorted."""
    have = {canonical(f) for f in (host_features() if host is None else host)}
    return sorted(f for f in required if canonical(f) not in have)
