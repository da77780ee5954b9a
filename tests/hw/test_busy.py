"""hw/busy.py: other processes' CPU use, measured over a short window, without this process's own."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest

from autofusion.hw import busy


def _spin(seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


@pytest.mark.skipif(not busy.PROC_STAT.exists(), reason="no /proc/stat on this system")
def test_own_threads_do_not_count_and_another_process_does() -> None:
    # This process keeps a core busy while sampling: none of it may count as "others" (a compile right
    # after running a model on every core is not a busy machine).
    t = threading.Thread(target=_spin, args=(0.6,))
    t.start()
    ours = busy.others_cores(0.3)
    t.join()
    # Another process spinning for the whole window counts as about one core.
    spinner = subprocess.Popen(
        [sys.executable, "-c", "import time\nend = time.time() + 3\nwhile time.time() < end: pass"]
    )
    try:
        time.sleep(0.3)
        theirs = busy.others_cores(0.5)
    finally:
        spinner.kill()
        spinner.wait()
    assert ours is not None and theirs is not None
    assert theirs > ours + 0.5, (ours, theirs)


def test_unreadable_proc_stat_falls_back_to_the_load_average(
    monkeypatch: pytest.MonkeyPatch, tmp_path
) -> None:
    monkeypatch.setattr(busy, "PROC_STAT", tmp_path / "missing")
    monkeypatch.setattr(busy, "_last", None)
    assert busy.others_cores(0.01) is None
    is_busy, seen = busy.machine_busy()
    assert isinstance(is_busy, bool) and ("load" in seen)
