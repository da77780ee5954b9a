"""hw/busy.py: other processes' CPU use, measured over a short window, without this process's own."""

from __future__ import annotations

import subprocess
import sys
import time
from types import SimpleNamespace

import pytest

from autofusion.hw import busy


def test_this_process_time_is_subtracted(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    # A fake /proc/stat whose busy ticks grow by 150 (1.5 s at 100 Hz) over the window while this process
    # spends 1.0 s of CPU: others used 0.5 s of a 0.5 s window, i.e. one core. Deterministic, so it holds
    # under a parallel test run too.
    stat = tmp_path / "stat"
    ticks = iter([1000, 1150])
    own = iter([10.0, 11.0])
    clock = iter([100.0, 100.5])

    def read_text() -> str:
        user = next(ticks)
        return f"cpu  {user} 0 0 5000 7 0 0 0 0 0\ncpu0 ...\n"

    monkeypatch.setattr(busy, "PROC_STAT", stat)
    monkeypatch.setattr(type(stat), "read_text", lambda self, *a, **k: read_text())
    monkeypatch.setattr(busy.os, "sysconf", lambda name: 100)
    monkeypatch.setattr(busy.time, "process_time", lambda: next(own))
    monkeypatch.setattr(busy.time, "monotonic", lambda: next(clock))
    monkeypatch.setattr(busy.time, "sleep", lambda s: None)
    assert busy.others_cores(0.5) == pytest.approx(1.0)


@pytest.mark.skipif(not busy.PROC_STAT.exists(), reason="no /proc/stat on this system")
def test_another_process_spinning_counts() -> None:
    code = "import time\nend = time.time() + 3\nwhile time.time() < end: pass"
    spinner = subprocess.Popen([sys.executable, "-c", code])
    try:
        time.sleep(0.3)
        theirs = busy.others_cores(0.5)
    finally:
        spinner.kill()
        spinner.wait()
    # A whole spinning process, even sharing the cores with other work, holds more than half a core.
    assert theirs is not None and theirs > busy.OTHERS_MAX_CORES, theirs


def test_unreadable_proc_stat_falls_back_to_the_load_average(
    monkeypatch: pytest.MonkeyPatch, tmp_path
) -> None:
    monkeypatch.setattr(busy, "PROC_STAT", tmp_path / "missing")
    monkeypatch.setattr(busy, "_last", None)
    assert busy.others_cores(0.01) is None
    is_busy, seen = busy.machine_busy()
    assert isinstance(is_busy, bool) and ("load" in seen)


def _fake_stat(monkeypatch: pytest.MonkeyPatch, tmp_path, ticks: list[int]) -> None:
    """/proc/stat's busy ticks (100 Hz) read in turn from `ticks`."""
    stat = tmp_path / "stat"
    seq = iter(ticks)
    monkeypatch.setattr(busy, "PROC_STAT", stat)
    monkeypatch.setattr(type(stat), "read_text", lambda self, *a, **k: f"cpu  {next(seq)} 0 0 5000 7 0 0 0\n")
    monkeypatch.setattr(busy.os, "sysconf", lambda name: 100)


def test_a_waited_child_is_this_process_work(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    """A compiler this process ran and waited for (1.0 s of CPU in 1.0 s) is not others' use: the
    machine's 1.2 busy seconds less it leave 0.2 cores to others."""
    _fake_stat(monkeypatch, tmp_path, [1000, 1120])
    times = iter([SimpleNamespace(children_user=0.0, children_system=0.0),
                  SimpleNamespace(children_user=0.9, children_system=0.1)])  # fmt: skip
    monkeypatch.setattr(busy.os, "times", lambda: next(times))
    monkeypatch.setattr(busy.time, "process_time", lambda: 5.0)
    clock = iter([10.0, 11.0])
    monkeypatch.setattr(busy.time, "monotonic", lambda: next(clock))
    assert busy.others_cores_during(lambda: None)[1] == pytest.approx(0.2)


def test_observed_work_is_the_next_sample(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    """The window of observed work (others used 1.5 cores over it) answers machine_busy without a
    sleeping window of its own, for REUSE_S."""
    _fake_stat(monkeypatch, tmp_path, [1000, 1150 + 30])  # 30 ticks are this process's 0.3 s
    own = iter([1.0, 1.3])
    monkeypatch.setattr(busy.time, "process_time", lambda: next(own))
    clock = iter([50.0, 50.0, 51.0, 51.0, 51.5])
    monkeypatch.setattr(busy.time, "monotonic", lambda: next(clock))

    def no_sleep(s: float) -> None:
        raise AssertionError("machine_busy slept for a sample of its own")

    monkeypatch.setattr(busy.time, "sleep", no_sleep)
    monkeypatch.setattr(busy, "_last", None)
    assert busy.observed(lambda: 42) == 42
    assert busy.machine_busy() == (True, "other processes use 1.5 cores")


def test_a_short_observed_window_is_not_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under WINDOW_S the ticks of /proc/stat cannot tell: the sample before it stays."""
    monkeypatch.setattr(busy, "_last", (1e12, False, 0.0))
    busy.observed(lambda: None)
    assert busy._last == (1e12, False, 0.0)
