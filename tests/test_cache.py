"""autofusion.cache: atomic writes, per-key locks, the size cap, info/clear, the old layout, and its users."""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import shutil
import signal
import time
from pathlib import Path

import pytest
from filelock import FileLock

from autofusion.cache import LEGACY, NAMESPACES, Cache, NamespaceInfo

KEY = "a" * 64


def _entry(cache: Cache, name: str, size: int, used: float) -> Path:
    """A directory entry of `size` bytes, last used at `used` (seconds since the epoch)."""
    with cache.lock("kernels", name):
        tmp = cache.new_dir("kernels", name)
        (tmp / "blob").write_bytes(b"x" * size)
        assert cache.commit_dir(tmp, "kernels", name)
    entry = cache.entry_dir("kernels", name)
    os.utime(entry, (used, used))
    return entry


# ---- records and atomic writes ----


def test_json_record_round_trip_and_touch(tmp_path: Path) -> None:
    cache = Cache(tmp_path)
    assert cache.get_json("hw", "cpu x") is None
    assert cache.put_json("hw", "cpu x", {"cores": 4})
    (path,) = (tmp_path / "hw").glob("*/*.json")
    os.utime(path, (1000.0, 1000.0))
    assert cache.get_json("hw", "cpu x") == {"cores": 4}
    assert path.stat().st_mtime > 1000.0  # a read counts as a use
    assert cache.get_json("hw", "cpu y") is None and cache.get_json("layouts", "cpu x") is None


@pytest.mark.parametrize("content", ["{not json", "[1, 2]", '{"key": "other", "value": 1}', '{"key": "k"}'])
def test_corrupt_or_foreign_record_is_absent(
    tmp_path: Path, content: str, caplog: pytest.LogCaptureFixture
) -> None:
    cache = Cache(tmp_path)
    cache.put_json("layouts", "k", [1.0, 2.0, 3.0, 4.0])
    (path,) = (tmp_path / "layouts").glob("*/*.json")
    path.write_text(content)
    with caplog.at_level(logging.DEBUG, logger="autofusion.cache"):
        assert cache.get_json("layouts", "k") is None
    assert any(r.levelno == logging.DEBUG and str(path) in r.getMessage() for r in caplog.records)
    assert cache.put_json("layouts", "k", 5) and cache.get_json("layouts", "k") == 5  # rewritten


def test_failed_rename_keeps_the_old_record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = Cache(tmp_path)
    cache.put_json("hw", "k", "old")

    def broken(src: str, dst: str) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", broken)
    assert not cache.put_json("hw", "k", "new")
    monkeypatch.undo()
    assert cache.get_json("hw", "k") == "old"
    assert [p.name.endswith(".json") for p in (tmp_path / "hw").rglob("*") if p.is_file()] == [True]


def _crash_before_rename(root: str) -> None:
    os.replace = lambda src, dst: os._exit(3)  # type: ignore[assignment]  # the process dies mid-write
    Cache(root).put_json("hw", "k", "new " * 10000)


def _crash_before_commit(root: str) -> None:
    cache = Cache(root)
    with cache.lock("kernels", KEY):
        tmp = cache.new_dir("kernels", KEY)
        (tmp / "kernel.so").write_bytes(b"half")
        os._exit(3)


def test_a_crash_mid_write_leaves_no_partial_entry(tmp_path: Path) -> None:
    cache = Cache(tmp_path)
    cache.put_json("hw", "k", "old")
    ctx = multiprocessing.get_context("spawn")
    for target in (_crash_before_rename, _crash_before_commit):
        p = ctx.Process(target=target, args=(str(tmp_path),))
        p.start()
        p.join(60)
        assert p.exitcode == 3
    assert cache.get_json("hw", "k") == "old"  # the half-written file never had the record's name
    assert not cache.entry_dir("kernels", KEY).exists()
    assert cache.info()["hw"].entries == 1 and cache.info()["kernels"] == NamespaceInfo(0, 0)
    leftovers = [p for p in tmp_path.rglob(".tmp-*")]
    assert len(leftovers) == 2
    with cache.lock("kernels", KEY) as locked:  # the killed holder left no lock behind
        assert locked
        cache.new_dir("kernels", KEY, clean_stale=True)
    cache.clear()
    assert not list(tmp_path.rglob(".tmp-*")) and cache.get_json("hw", "k") is None


# ---- locks ----


def _build_once(root: str, log_path: str) -> None:
    cache = Cache(root)
    with cache.lock("kernels", KEY):
        if cache.entry_dir("kernels", KEY).exists():
            return
        with open(log_path, "a") as f:
            f.write(f"{os.getpid()}\n")
        time.sleep(0.5)  # widen the race window
        tmp = cache.new_dir("kernels", KEY, clean_stale=True)
        (tmp / "kernel.so").write_bytes(b"lib")
        assert cache.commit_dir(tmp, "kernels", KEY)


def test_two_processes_build_one_key_once(tmp_path: Path) -> None:
    log_path = tmp_path / "builds.log"
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_build_once, args=(str(tmp_path / "c"), str(log_path))) for _ in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0, 0]
    assert len(log_path.read_text().splitlines()) == 1
    assert (Cache(tmp_path / "c").entry_dir("kernels", KEY) / "kernel.so").read_bytes() == b"lib"


def _hold_lock(root: str, ready: str, seconds: float) -> None:
    with Cache(root).lock("kernels", KEY):
        Path(ready).touch()
        time.sleep(seconds)


def test_lock_of_a_killed_process_does_not_block(tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    p = multiprocessing.get_context("spawn").Process(target=_hold_lock, args=(str(tmp_path), str(ready), 60))
    p.start()
    for _ in range(600):
        if ready.exists():
            break
        time.sleep(0.05)
    assert ready.exists()
    with Cache(tmp_path).lock("kernels", KEY, timeout_s=0) as locked:
        assert not locked  # held by a live process
    os.kill(p.pid, signal.SIGKILL)
    p.join(10)
    t0 = time.perf_counter()
    with Cache(tmp_path).lock("kernels", KEY, timeout_s=30) as locked:
        assert locked
    assert time.perf_counter() - t0 < 5


def test_a_lock_held_too_long_is_given_up(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    cache = Cache(tmp_path)
    shard = cache.shard("kernels", KEY)
    shard.mkdir(parents=True)
    holder = FileLock(shard / f"{KEY}.lock")  # another holder (a second fd conflicts like a process)
    with holder, caplog.at_level(logging.WARNING, logger="autofusion.cache"):
        t0 = time.perf_counter()
        with cache.lock("kernels", KEY, timeout_s=0.3) as locked:
            assert not locked
        assert 0.25 < time.perf_counter() - t0 < 5
    assert "going on without it" in caplog.text


# ---- the size cap ----


def test_eviction_keeps_the_cap_and_recently_used_entries(tmp_path: Path) -> None:
    cache = Cache(tmp_path, max_bytes=3500)
    a = _entry(cache, "aaa", 1000, 100.0)
    b = _entry(cache, "bbb", 1000, 200.0)
    c = _entry(cache, "ccc", 1000, 300.0)
    cache.touch(a)  # read now: the most recently used
    d = _entry(cache, "ddd", 1000, 400.0)
    assert not b.exists() and a.exists() and c.exists() and d.exists()
    assert cache.info()["kernels"] == NamespaceInfo(3, 3000)
    cache.put_json("hw", "k", "x" * 600)  # the oldest entry, c (300.0), goes to make room
    assert not c.exists() and a.exists() and d.exists() and cache.get_json("hw", "k") is not None


def test_eviction_never_takes_a_locked_entry(tmp_path: Path) -> None:
    cache = Cache(tmp_path, max_bytes=2500)
    a = _entry(cache, "aaa", 1000, 100.0)
    b = _entry(cache, "bbb", 1000, 200.0)
    with FileLock(cache.shard("kernels", "aaa") / "aaa.lock"):  # someone is repairing a
        _entry(cache, "ccc", 1000, time.time())
    assert a.exists() and not b.exists()


def test_the_size_is_scanned_only_when_the_cap_may_be_reached(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = Cache(tmp_path, max_bytes=1 << 20)
    scans: list[str] = []
    real = Cache._entries
    monkeypatch.setattr(Cache, "_entries", lambda self, ns: scans.append(ns) or real(self, ns))
    for i in range(5):
        cache.put_json("hw", f"k{i}", i)  # tiny: the first write's scan says there is room for all
    assert len(scans) == len(NAMESPACES)
    cache.put_json("hw", "big", "x" * (1 << 20))  # could reach the cap: scanned (and evicted) again
    assert len(scans) == 2 * len(NAMESPACES)


def test_no_cap_keeps_everything(tmp_path: Path) -> None:
    cache = Cache(tmp_path, max_bytes=0)
    for i in range(3):
        _entry(cache, f"e{i}x", 10_000, 100.0 + i)
    assert cache.info()["kernels"].entries == 3
    with pytest.raises(ValueError, match=">= 0"):
        Cache(tmp_path, max_bytes=-1)


# ---- info and clear ----


def test_info_and_clear(tmp_path: Path) -> None:
    cache = Cache(tmp_path, max_bytes=0)
    assert cache.info() == {ns: NamespaceInfo(0, 0) for ns in NAMESPACES}
    _entry(cache, "aaa", 100, 100.0)
    _entry(cache, "bbb", 50, 100.0)
    cache.put_json("hw", "k", 1)
    cache.put_json("layouts", "k", 2)
    info = cache.info()
    assert info["kernels"] == NamespaceInfo(2, 150) and info["hw"].entries == info["layouts"].entries == 1
    assert cache.clear("hw") == (1, 0)
    assert cache.info()["hw"].entries == 0 and cache.get_json("layouts", "k") == 2
    with FileLock(cache.shard("kernels", "aaa") / "aaa.lock"):  # being written: it stays
        assert cache.clear() == (2, 1)
    assert cache.info()["kernels"] == NamespaceInfo(1, 100)
    assert cache.clear() == (1, 0)
    assert not [p for p in tmp_path.rglob("*") if p.is_file()]
    with pytest.raises(ValueError, match="unknown cache namespace 'kernel'"):
        cache.clear("kernel")


def test_bad_names_are_refused(tmp_path: Path) -> None:
    cache = Cache(tmp_path)
    for ns, name in (("kernels", "../up"), ("kernels", "a.b"), ("elsewhere", KEY)):
        with pytest.raises(ValueError):
            cache.entry_dir(ns, name)


# ---- the layout before namespaces ----


def test_old_layout_stays_valid_and_is_adopted(tmp_path: Path) -> None:
    from autofusion.codegen.cpp.build import CompilerConfig, build, load

    if shutil.which("g++") is None:
        pytest.skip("needs g++")
    src = 'extern "C" int add(int a, int b) { return a + b; }\n'
    built = build(src, CompilerConfig(), tmp_path / "new")
    old_root = tmp_path / "old"
    old = old_root / built.key[:2] / built.key  # where versions before namespaces kept it
    old.parent.mkdir(parents=True)
    shutil.copytree(built.entry_dir, old)
    (old_root / "conv_layouts.json").write_text(json.dumps({"sig": [1.0, 2.0, 3.0, 4.0]}))
    cache = Cache(old_root)
    assert cache.get_json("layouts", "sig") == [1.0, 2.0, 3.0, 4.0]
    old_bytes = sum(f.stat().st_size for f in old_root.rglob("*") if f.is_file() and "layouts" not in f.parts)
    assert cache.info()[LEGACY] == NamespaceInfo(2, old_bytes)
    again = build(src, CompilerConfig(), cache)
    assert again.cache_hit and again.entry_dir == cache.entry_dir("kernels", built.key)
    assert load(again).add(2, 3) == 5
    assert (old / "meta.json").is_file() and (old_root / "conv_layouts.json").is_file()  # older versions
    assert cache.clear() == (4, 0)  # kernel, record, and the two old entries
    assert not [p for p in old_root.rglob("*") if p.is_file()]


# ---- the three users ----


@pytest.mark.measured_hardware  # the cpu measurement is one of the three
def test_the_three_users_hit_the_cache_on_a_second_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from autofusion.compiler import compile_graph
    from autofusion.config import Options
    from autofusion.hw import measure
    from autofusion.ir import DType, GraphBuilder, InputRole, TensorType
    from autofusion.passes import layout_timing

    F32 = DType.float32
    calls: list[str] = []
    real = measure.measure_cpu
    monkeypatch.setattr(measure, "measure_cpu", lambda **kw: calls.append("cpu") or real(budget_s=0.05))

    def fake_chain(spec: layout_timing.ChainSpec) -> layout_timing.ChainTiming:
        calls.append("conv")
        return layout_timing.ChainTiming({"aten": 100e-6, "aten_cl": 90e-6, "onednn": 95e-6})

    monkeypatch.setattr(layout_timing, "measure_chain", fake_chain)
    b = GraphBuilder("convs")
    x = b.add_input(TensorType(F32, (2, 4, 6, 6)), "x")
    w = b.add_input(TensorType(F32, (4, 4, 3, 3)), "w", InputRole.PARAM)
    conv = {"stride": (1, 1), "padding": (1, 1), "dilation": (1, 1), "transposed": False,
            "output_padding": (0, 0), "groups": 1, "has_bias": False}  # fmt: skip
    y = b.add("conv", [b.add("exp", [b.add("relu", [x])]), w], conv)
    graph = b.build([b.add("sigmoid", [b.add("neg", [y])])])
    options = Options(cache_dir=str(tmp_path))
    first = compile_graph(graph, options)
    assert calls == ["cpu", "conv"] and first.stats["cache_hit"] is False
    again = compile_graph(graph, options)
    assert calls == ["cpu", "conv"] and again.stats["cache_hit"] is True
    info = Cache(tmp_path).info()
    # One entry per namespace a compile writes ("tuning" holds only what `autofusion tune` stores).
    assert all(info[ns].entries == (ns != "tuning") for ns in NAMESPACES), info


# ---- options and the command line ----


def test_cap_option_from_the_environment_reaches_the_cache(tmp_path: Path) -> None:
    from autofusion.compiler import cache_for
    from autofusion.config import Options

    assert Options().cache_max_mb == 2048
    options = Options.from_env({"AUTOFUSION_CACHE_DIR": str(tmp_path), "AUTOFUSION_CACHE_MAX_MB": "7"})
    assert options.cache_max_mb == 7 and cache_for(options).max_bytes == 7 << 20
    assert Options.from_env({"AUTOFUSION_CACHE_MAX_MB": "0"}).cache_max_mb == 0
    for bad in ("-1", "lots", "1.5"):
        with pytest.raises(ValueError, match="AUTOFUSION_CACHE_MAX_MB"):
            Options.from_env({"AUTOFUSION_CACHE_MAX_MB": bad})
    with pytest.raises(ValueError, match="cache_max_mb"):
        Options(cache_max_mb=-3)
    assert "AUTOFUSION_CACHE_MAX_MB" in Options().help()["cache_max_mb"]


def test_cli_cache_info_and_clear(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from autofusion.tools.cli.main import main

    monkeypatch.setenv("COLUMNS", "200")
    cache = Cache(tmp_path)
    _entry(cache, "aaa", 3 << 20, 100.0)
    cache.put_json("hw", "k", 1)
    assert main(["cache", "info", "--cache-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert str(tmp_path) in out and "cap 2048 MiB" in out
    rows = {
        cells[1]: cells[3:5]
        for ln in out.splitlines()
        if len(cells := [c.strip() for c in ln.split("│")]) > 4
    }
    assert (
        rows["kernels"] == ["1", "3.0 MiB"] and rows["hw"][0] == "1" and rows["layouts"] == ["0", "0.0 MiB"]
    )
    assert main(["cache", "clear", "--namespace", "hw", "--cache-dir", str(tmp_path)]) == 0
    assert "removed 1 entries" in capsys.readouterr().out
    assert cache.info()["hw"].entries == 0 and cache.info()["kernels"].entries == 1
    monkeypatch.setenv("AUTOFUSION_CACHE_DIR", str(tmp_path))
    assert main(["cache", "clear"]) == 0
    assert "removed 1 entries (3.0 MiB)" in capsys.readouterr().out
    monkeypatch.setenv("AUTOFUSION_CACHE_MAX_MB", "many")
    assert main(["cache", "info"]) == 2
    assert "AUTOFUSION_CACHE_MAX_MB" in capsys.readouterr().err
    assert main(["cache", "clear", "--namespace", "nope"]) == 2  # argparse's usage error, returned


def test_no_cache_dir_builds_outside_the_working_directory(tmp_path: Path, monkeypatch) -> None:
    """Options(cache_dir="") keeps nothing: kernels go to a private directory, not ./kernels."""
    import torch

    from autofusion.api import CompiledModel
    from autofusion.config import Options

    monkeypatch.chdir(tmp_path)
    x = torch.randn(100)
    m = CompiledModel(lambda a: torch.relu(a) * 2 + 1, Options(), [x])
    assert torch.equal(m(x), torch.relu(x) * 2 + 1)
    assert m.stats["kernels"] >= 1 and m.stats.get("eager_fallback") is None
    assert list(tmp_path.iterdir()) == []
