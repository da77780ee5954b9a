"""Measure the host CPU for the `cpu` hardware profile, and cache the result per machine.

In: nothing (`measure_cpu`), or the cache (`cached_cpu_measurement`: an `autofusion.cache.Cache` or its root).
Out: a dict of HardwareProfile field -> value, holding only what could be found on this machine:
- memory_bandwidth: read + write bytes/s of torch `dst.copy_(src)` on 64 MiB of float32, the median of up to
  5 runs. torch's copy is multi-threaded, like the OpenMP code we generate, so this is the achievable rate.
- dispatch_overhead_s: median per-call time of `torch.add(a, b, out=c)` on 1-element tensors (2000 calls,
  timed in batches of 100 so the timer's own cost stays out).
- cores: CPUs this process may run on (`os.sched_getaffinity`).
- l1_bytes (L1 data), l2_bytes, l3_bytes from /sys/devices/system/cpu/cpu0/cache (sysconf as a fallback),
  and on_chip_bytes = L2 per physical core (an L2 shared by a cluster of cores is divided among them).
- vector_bytes from /proc/cpuinfo flags: 32 with AVX2 (also with AVX-512: GCC's -march=native keeps 256-bit
  vectors on most such parts), 16 with SSE2 or NEON.
- vector_registers: 32 with AVX-512 (zmm0-31; -march=native also gives 256-bit code all 32) or on AArch64,
  else 16 (x86-64 ymm/xmm).
Fields it cannot find are left out, and the profile keeps its YAML default for them.

Time: the measurement stays under about 1 s (MEASURE_BUDGET_S); each timed loop stops at its deadline after at
least one sample. The cache keeps one JSON record per machine key (CPU model, usable CPUs, torch version) in
its "hw" namespace, written atomically, so concurrent processes never read half a record; a missing,
corrupt or foreign record is measured again and rewritten. Nothing here reads the environment.

Load: bandwidth measured while other processes hold the CPU comes out low (6.4 to 40 GB/s copy bandwidth
in the caches of the 2-core development VM), and would stay cached. The record says whether the machine
was quiet while it was measured (`quiet`: other processes used at most busy.OTHERS_MAX_CORES, from
/proc/stat minus this process's own time; `others_cores`), with one WARNING per process when it was
not. Such a record is used, and measured again by a later call that finds the machine quiet
(busy.machine_busy); each process looks at most every RECHECK_S, since under a parallel test run the
workers load each other and would otherwise measure on every compile. A record without `quiet` (none
is written since version 3) counts as quiet.
"""

from __future__ import annotations

import importlib.metadata
import logging
import math
import os
import platform
import time
from pathlib import Path
from typing import Any

from autofusion.cache import Cache, as_cache
from autofusion.hw.busy import OTHERS_MAX_CORES, machine_busy, others_cores_during
from autofusion.hw.isa import features_digest

log = logging.getLogger(__name__)

CACHE_VERSION = 3  # 2: vector_registers; 3: `quiet` (records before it may have been measured under load)
MEASURE_BUDGET_S = 1.0
COPY_BYTES = 64 << 20
COPY_RUNS = 5
DISPATCH_CALLS = 2000
DISPATCH_BATCH = 100
SYS_CPU = Path("/sys/devices/system/cpu")
CPUINFO = Path("/proc/cpuinfo")
RECHECK_S = 600.0  # a process looks again at a busy measurement (is the machine quiet now?) this often

_next_recheck: dict[str, float] = {}  # machine key -> when this process may next look again
_warned: set[str] = set()  # machine keys this process has warned about


def measure_cpu(*, budget_s: float = MEASURE_BUDGET_S) -> dict[str, int | float]:
    """Measure this machine now (no cache). See the module docstring for what each field means."""
    start = time.perf_counter()
    out: dict[str, int | float] = {"cores": available_cores()}
    out.update(cache_sizes())
    vector = vector_bytes()
    if vector is not None:
        out["vector_bytes"] = vector
    registers = vector_registers()
    if registers is not None:
        out["vector_registers"] = registers
    import torch  # only here: reading a cached measurement must not pay for importing torch

    out["memory_bandwidth"] = _copy_bandwidth(torch, deadline=start + 0.65 * budget_s)
    out["dispatch_overhead_s"] = _dispatch_overhead(torch, deadline=start + budget_s)
    log.info("measured the cpu in %.2f s: %s", time.perf_counter() - start, out)
    return out


def cached_cpu_measurement(cache: Cache | str | os.PathLike[str]) -> dict[str, int | float]:
    """measure_cpu() once per machine: later calls (and processes) read the cache's record for it. A
    record measured while other processes held the CPU (`quiet: false`) is used, and measured again by
    the first later call that finds the machine quiet; each process looks at most every RECHECK_S."""
    cache = as_cache(cache)
    key = machine_key()
    record = cache.get_json("hw", "cpu " + key)
    cached = _check_record(record, key)
    if cached is not None:
        if _measured_quiet(record) or not _recheck_due(key):
            return cached
        busy, seen = machine_busy()
        if busy:
            _warn_once(key, f"the cached cpu profile was measured on a busy machine and {seen} now: it stays "
                            f"in use until a compile finds the machine quiet")  # fmt: skip
            return cached
        log.info("the cached cpu profile was measured on a busy machine; measuring it again (%s now)", seen)
    start = time.perf_counter()
    values, others = others_cores_during(measure_cpu)
    quiet = others <= OTHERS_MAX_CORES if others is not None else not machine_busy()[0]
    record = {"version": CACHE_VERSION, "key": key, "measured_at": time.time(),
              "seconds": round(time.perf_counter() - start, 3), "values": values, "quiet": quiet,
              "others_cores": None if others is None else round(others, 2)}  # fmt: skip
    if not quiet:
        _recheck_due(key)  # measured just now: not again from this process before RECHECK_S
        seen = "unknown" if others is None else f"{others:.1f}"
        _warn_once(key, f"measured the cpu profile while other processes used {seen} cores: its figures "
                        f"may be off; a later compile on a quiet machine measures again")  # fmt: skip
    cache.put_json("hw", "cpu " + key, record)  # a read-only cache only costs a re-measurement next time
    return values


def _measured_quiet(record: Any) -> bool:
    return not isinstance(record, dict) or record.get("quiet", True) is not False


def _recheck_due(key: str) -> bool:
    """Whether this process may look again (is the machine quiet?) at a busy measurement of `key`; it
    then may not for RECHECK_S. A parallel test run's workers load each other: they must not measure
    on every compile."""
    now = time.monotonic()
    if now < _next_recheck.get(key, -math.inf):
        return False
    _next_recheck[key] = now + RECHECK_S
    return True


def _warn_once(key: str, message: str) -> None:
    if key not in _warned:
        _warned.add(key)
        log.warning(message)


def machine_key() -> str:
    """What the measurement depends on: CPU model and features (a model name such as "AMD EPYC" covers
    several generations), usable CPU count and torch version."""
    return (f"{cpu_model()}|{platform.machine()}|features={features_digest()}|cpus={available_cores()}"
            f"|torch={_torch_version()}")  # fmt: skip


def cpu_model() -> str:
    info = _cpuinfo()
    for field in ("model name", "Hardware", "cpu model", "CPU part"):
        if info.get(field):
            return info[field]
    return platform.processor() or platform.machine() or "unknown"


def available_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


def cache_sizes(root: Path = SYS_CPU) -> dict[str, int]:
    """l1_bytes (data), l2_bytes, l3_bytes and on_chip_bytes (L2 per physical core), as far as known."""
    out: dict[str, int] = {}
    l2_sharers = 1
    for index in sorted((root / "cpu0" / "cache").glob("index*")):
        try:
            level, kind = int(_read(index / "level")), _read(index / "type")
            size = _parse_size(_read(index / "size"))
        except (OSError, ValueError):
            continue
        key = {1: "l1_bytes", 2: "l2_bytes", 3: "l3_bytes"}.get(level)
        if key is None or kind == "Instruction" or size <= 0:
            continue
        out[key] = size
        if level == 2:
            l2_sharers = _physical_cores(root, index / "shared_cpu_list")
    if not out:
        out = _sysconf_cache_sizes()
    if "l2_bytes" in out:
        out["on_chip_bytes"] = out["l2_bytes"] // max(l2_sharers, 1)
    return out


def vector_bytes() -> int | None:
    flags = set((_cpuinfo().get("flags") or _cpuinfo().get("Features") or "").split())
    if "avx2" in flags:
        return 32
    if "sse2" in flags or "asimd" in flags:
        return 16
    return None


def vector_registers() -> int | None:
    flags = set((_cpuinfo().get("flags") or _cpuinfo().get("Features") or "").split())
    if "avx512f" in flags or "asimd" in flags:
        return 32
    if "sse2" in flags:
        return 16
    return None


# ---- timing ----


def _copy_bandwidth(torch: Any, deadline: float) -> float:
    src = torch.ones(COPY_BYTES // 4, dtype=torch.float32)  # written once, so no page faults while timing
    dst = torch.empty_like(src)
    dst.copy_(src)  # faults in dst's pages
    rates: list[float] = []
    for _ in range(COPY_RUNS):
        t0 = time.perf_counter()
        dst.copy_(src)
        rates.append(2 * src.nbytes / (time.perf_counter() - t0))
        if time.perf_counter() > deadline:
            break
    import statistics  # here: measuring is rare, and `import autofusion.hw` should not pay for it

    return statistics.median(rates)


def _dispatch_overhead(torch: Any, deadline: float) -> float:
    a, b, c = torch.ones(1), torch.ones(1), torch.empty(1)
    add = torch.add
    for _ in range(DISPATCH_BATCH):  # warm-up: first calls resolve the kernel
        add(a, b, out=c)
    per_call: list[float] = []
    for _ in range(DISPATCH_CALLS // DISPATCH_BATCH):
        t0 = time.perf_counter()
        for _ in range(DISPATCH_BATCH):
            add(a, b, out=c)
        per_call.append((time.perf_counter() - t0) / DISPATCH_BATCH)
        if time.perf_counter() > deadline:
            break
    import statistics

    return statistics.median(per_call)


# ---- reading the system ----


def _read(path: Path) -> str:
    return path.read_text().strip()


def _parse_size(text: str) -> int:
    """sysfs cache sizes: "48K", "2048K", "32M"."""
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:].upper(), 1)
    return int(text.rstrip("KkMmGgB") or "0") * scale


def _parse_cpu_list(text: str) -> set[int]:
    """Parse a sysfs CPU list: "0-3,8-11" -> {0, 1, 2, 3, 8, 9, 10, 11}."""
    cpus: set[int] = set()
    for part in filter(None, text.split(",")):
        lo, _, hi = part.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return cpus


def _physical_cores(root: Path, shared_cpu_list: Path) -> int:
    """How many physical cores share a cache (SMT siblings count once)."""
    try:
        cpus = _parse_cpu_list(_read(shared_cpu_list))
    except (OSError, ValueError):
        return 1
    try:
        topology = [root / f"cpu{c}" / "topology" for c in cpus]
        return len({(_read(t / "physical_package_id"), _read(t / "core_id")) for t in topology}) or 1
    except OSError:
        return max(len(cpus), 1)


def _sysconf_cache_sizes() -> dict[str, int]:
    out = {}
    for key, name in (("l1_bytes", "SC_LEVEL1_DCACHE_SIZE"), ("l2_bytes", "SC_LEVEL2_CACHE_SIZE"),
                      ("l3_bytes", "SC_LEVEL3_CACHE_SIZE")):  # fmt: skip
        try:
            size = os.sysconf(name) if name in os.sysconf_names else 0
        except (OSError, ValueError):
            size = 0
        if size > 0:
            out[key] = size
    return out


def _cpuinfo() -> dict[str, str]:
    """The first value of each field in /proc/cpuinfo (empty off Linux)."""
    info: dict[str, str] = {}
    try:
        text = CPUINFO.read_text(errors="replace")
    except OSError:
        return info
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() not in info:
            info[key.strip()] = value.strip()
    return info


def _torch_version() -> str:
    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        import torch

        return str(torch.__version__)


# ---- the cache record ----


def _check_record(record: Any, key: str) -> dict[str, int | float] | None:
    """The values of a cached record, or None (measure again) when it is absent or not to be trusted."""
    if record is None:
        return None
    if not isinstance(record, dict):
        record = {}
    values = record.get("values")
    if record.get("version") != CACHE_VERSION or record.get("key") != key or not isinstance(values, dict):
        log.info("the cached cpu measurement is for another machine or version; measuring again")
        return None
    if not all(_positive_number(v) for v in values.values()):
        log.warning("ignoring a cached cpu measurement with non-positive values; measuring again")
        return None
    return values


def _positive_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0
