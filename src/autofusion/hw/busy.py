"""Whether other processes hold the CPU now, measured rather than read off the load average.

The 1-minute load average counts this process's own threads too, and for a minute after they ran: a
process that has just run a model on every core (a benchmark, a server compiling its next model) sees
a load above the core count while nothing else runs, and measurements that need a quiet machine were
skipped for that reason alone. Here the CPU time the whole machine spent over a short window
(/proc/stat) minus the CPU time this process spent (all its threads, including OpenMP workers still
spinning after a parallel region, and the children it waited for: a compiler it ran) is what others
used. Where /proc/stat cannot be read the load average is the fallback. Nothing here reads the
environment.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

PROC_STAT = Path("/proc/stat")
WINDOW_S = 0.1  # 10 clock ticks at the usual 100 Hz: a resolution of about 0.1 core per core
OTHERS_MAX_CORES = 0.5  # more than half a core used by others: too noisy to time anything
REUSE_S = 1.0  # one sample serves the checks of one compile (a check per convolution signature)

_last: tuple[float, bool, float] | None = None  # (when, busy, what was measured)
T = TypeVar("T")


def _machine_busy_seconds() -> float:
    """CPU seconds every core together spent on anything but idle and I/O wait since boot."""
    fields = PROC_STAT.read_text().split("\n", 1)[0].split()
    if fields[0] != "cpu":
        raise OSError("unexpected /proc/stat")
    ticks = [int(v) for v in fields[1:9]]  # user nice system idle iowait irq softirq steal
    busy = sum(ticks) - ticks[3] - ticks[4]
    return busy / os.sysconf("SC_CLK_TCK")


def _own_seconds() -> float:
    """CPU seconds of this process (all its threads) and of the children it has waited for (a compiler
    it ran): work this process caused is not others'."""
    t = os.times()
    return time.process_time() + t.children_user + t.children_system


def others_cores(window_s: float = WINDOW_S) -> float | None:
    """Cores other processes kept busy on average over the next `window_s` seconds (None: unknown)."""
    return others_cores_during(lambda: time.sleep(window_s))[1]


def others_cores_during(fn: Callable[[], T]) -> tuple[T, float | None]:
    """fn()'s result, and the cores other processes kept busy on average while it ran (None: unknown).
    What fn itself spends, on all of this process's threads and in the children it waits for, is not
    counted."""
    try:
        m0, s0, t0 = _machine_busy_seconds(), _own_seconds(), time.monotonic()
    except (OSError, ValueError, IndexError):
        return fn(), None
    result = fn()
    try:
        m1, s1, t1 = _machine_busy_seconds(), _own_seconds(), time.monotonic()
    except (OSError, ValueError, IndexError):
        return result, None
    return result, max(0.0, (m1 - m0) - (s1 - s0)) / max(t1 - t0, 1e-9)


def observed(fn: Callable[[], T]) -> T:
    """fn()'s result; the cores other processes used while it ran become the sample machine_busy
    reuses for REUSE_S, so the checks after a compile's own work (planning, a timing) need no sleeping
    window of their own (each cost WINDOW_S, up to a few per compile). A child fn starts and does not
    wait for counts as others'. While fn keeps every core busy, the scheduler still gives another
    process its fair share (a whole core's demand gets 2/3 of one against two busy threads on two
    cores), above OTHERS_MAX_CORES: the verdict stands. A window shorter than WINDOW_S is not kept."""
    global _last
    start = time.monotonic()
    result, others = others_cores_during(fn)
    end = time.monotonic()
    if others is not None and end - start >= WINDOW_S:  # a shorter one is below /proc/stat's resolution
        _last = (end, others > OTHERS_MAX_CORES, others)
    return result


def machine_busy() -> tuple[bool, str]:
    """(busy, what was seen): busy when other processes use more than OTHERS_MAX_CORES of the CPU, or,
    where that cannot be measured, when the load average exceeds the core count. One sample is reused
    for REUSE_S seconds."""
    global _last
    now = time.monotonic()
    if _last is not None and now - _last[0] < REUSE_S:
        return _last[1], _describe(_last[2])
    others = others_cores()
    if others is not None:
        _last = (now, others > OTHERS_MAX_CORES, others)
        return _last[1], _describe(others)
    try:
        load = os.getloadavg()[0]
    except OSError:  # no load average either: the timings' own repeat checks still apply
        return False, "load unknown"
    return load > (os.cpu_count() or 1), f"load average {load:.1f}"


def _describe(others: float) -> str:
    return f"other processes use {others:.1f} cores"
