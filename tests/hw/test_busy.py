"""hw/busy.py: other processes' CPU use, measured over a short window, without this process's own."""

from __future__ import annotations

import subprocess
import sys
import time

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
