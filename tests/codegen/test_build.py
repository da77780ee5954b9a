"""autofusion.codegen.cpp.build: compile C++ into a cached shared library, load it with ctypes.

Wrapper "compilers" (shell scripts that log each invocation, then run g++ or misbehave) show when
the real compiler ran, failed or hung.
"""

from __future__ import annotations

import ctypes
import dataclasses
import hashlib
import json
import logging
import multiprocessing
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from autofusion.codegen.cpp.build import BuiltLibrary, CompilerConfig, build, cache_key, load
from autofusion.errors import BuildError

GXX = shutil.which("g++")
pytestmark = pytest.mark.skipif(GXX is None, reason="needs g++")

ADD = 'extern "C" int add(int a, int b) { return a + b; }\n'


def _script(path: Path, body: str) -> str:
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return str(path)


def _wrapper(tmp_path: Path, before_compile: str = "", version: str = "wrapped") -> tuple[str, Path]:
    """A compiler that appends its arguments to a log file, then runs g++."""
    calls = tmp_path / "calls.log"
    body = (
        f'echo "$*" >> {calls}\n'
        f'if [ "$1" = "--version" ]; then echo "{version} $({GXX} --version | head -n 1)"; exit 0; fi\n'
        f'{before_compile}\nexec {GXX} "$@"\n'
    )
    return _script(tmp_path / "cxx-wrapper", body), calls


def _compiles(calls: Path) -> list[str]:
    lines = calls.read_text().splitlines() if calls.exists() else []
    # `--version` and the predefined-macro query (`build.resolved_features`) compile nothing.
    return [ln for ln in lines if ln != "--version" and " -dM -E " not in ln]


def test_build_load_and_call(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="autofusion.codegen.cpp.build")
    lib = build(ADD, CompilerConfig(), tmp_path / "cache", name="adder")
    assert isinstance(lib, BuiltLibrary) and not lib.cache_hit and lib.compile_s > 0
    assert lib.entry_dir == tmp_path / "cache" / "kernels" / lib.key[:2] / lib.key
    assert lib.path == lib.entry_dir / "adder.so"
    names = {p.name for p in lib.entry_dir.iterdir()}
    assert names == {"adder.cpp", "adder.so", "compile.sh", "compiler_output.txt", "meta.json"}
    meta = json.loads((lib.entry_dir / "meta.json").read_text())
    assert meta["key"] == lib.key and meta["flags"] == list(CompilerConfig().flags)
    assert meta["compiler_version"].startswith("g++") and len(meta["so_sha256"]) == 64
    assert not [p for p in lib.entry_dir.parent.iterdir() if p.name.startswith(".tmp-")]

    dll = load(lib)
    assert dll.add(2, 3) == 5 and dll.add(-7, 4) == -3
    assert load(lib) is dll
    assert any(
        r.levelno == logging.INFO and r.getMessage().startswith("compiled adder in ") for r in caplog.records
    )
    assert any(r.levelno == logging.DEBUG and "-o adder.so" in r.getMessage() for r in caplog.records)


def test_second_build_is_a_hit_without_running_the_compiler(tmp_path: Path) -> None:
    cxx, calls = _wrapper(tmp_path)
    config = CompilerConfig(cxx=cxx)
    first = build(ADD, config, tmp_path / "cache")
    assert not first.cache_hit and len(_compiles(calls)) == 1
    log_before = calls.read_text()

    t0 = time.perf_counter()
    second = build(ADD, config, tmp_path / "cache")
    hit_s = time.perf_counter() - t0
    assert second.cache_hit and second.compile_s == 0.0
    assert (second.path, second.key) == (first.path, first.key)
    assert calls.read_text() == log_before  # neither a compile nor another `--version`
    assert hit_s < 0.25, f"cache hit took {hit_s * 1e3:.1f} ms"
    assert load(second).add(20, 22) == 42


def test_key_depends_on_source_flags_and_compiler_version(tmp_path: Path) -> None:
    config = CompilerConfig()
    key = cache_key(ADD, config)
    assert key == cache_key(ADD, CompilerConfig()) and len(key) == 64
    assert key != cache_key(ADD + "\n", config)
    assert key != cache_key(ADD, dataclasses.replace(config, flags=(*config.flags, "-DEXTRA")))
    assert key != cache_key(ADD, dataclasses.replace(config, flags=("-O2", *config.flags[1:])))
    assert cache_key(ADD, dataclasses.replace(config, timeout_s=5.0)) == key
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a, _ = _wrapper(tmp_path / "a", version="one")
    b, _ = _wrapper(tmp_path / "b", version="two")
    assert cache_key(ADD, CompilerConfig(cxx=a)) != cache_key(ADD, CompilerConfig(cxx=b))


@pytest.mark.parametrize("damage", ["truncate_so", "delete_meta", "garbage_meta", "delete_so"])
def test_corrupt_entry_is_rebuilt(tmp_path: Path, damage: str, caplog: pytest.LogCaptureFixture) -> None:
    cxx, calls = _wrapper(tmp_path)
    config = CompilerConfig(cxx=cxx)
    lib = build(ADD, config, tmp_path / "cache")
    if damage == "truncate_so":
        with open(lib.path, "r+b") as f:
            f.truncate(100)
    elif damage == "delete_meta":
        (lib.entry_dir / "meta.json").unlink()
    elif damage == "garbage_meta":
        (lib.entry_dir / "meta.json").write_text("{not json")
    else:
        lib.path.unlink()

    with caplog.at_level(logging.WARNING, logger="autofusion.codegen.cpp.build"):
        again = build(ADD, config, tmp_path / "cache")
    assert not again.cache_hit and len(_compiles(calls)) == 2
    assert any("corrupt" in r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)
    assert load(again).add(1, 2) == 3
    assert build(ADD, config, tmp_path / "cache").cache_hit


def test_library_that_fails_to_load_is_removed(tmp_path: Path) -> None:
    cxx, _calls = _wrapper(tmp_path)
    config = CompilerConfig(cxx=cxx)
    src = ADD + "// load test\n"
    lib = build(src, config, tmp_path / "cache")
    # Garbage whose sha256 matches meta.json: only dlopen can tell it is broken.
    lib.path.write_bytes(b"not an ELF file")
    meta = json.loads((lib.entry_dir / "meta.json").read_text())
    meta["so_sha256"] = hashlib.sha256(b"not an ELF file").hexdigest()
    (lib.entry_dir / "meta.json").write_text(json.dumps(meta))
    assert build(src, config, tmp_path / "cache").cache_hit

    with pytest.raises(BuildError, match="corrupt") as info:
        load(lib)
    assert "dlopen" in info.value.command
    assert not lib.entry_dir.exists()
    again = build(src, config, tmp_path / "cache")
    assert not again.cache_hit and load(again).add(3, 4) == 7


def test_compiler_error_raises_build_error_with_stderr_and_command(tmp_path: Path) -> None:
    cxx = _script(
        tmp_path / "broken-cxx",
        'if [ "$1" = "--version" ]; then echo "broken 1.0"; exit 0; fi\n'
        'echo "kernel.cpp:1:5: error: expected something here" >&2\nexit 1\n',
    )
    with pytest.raises(BuildError) as info:
        build(ADD, CompilerConfig(cxx=cxx), tmp_path / "cache")
    err = info.value
    assert "expected something here" in str(err) and "exit status 1" in str(err)
    assert "expected something here" in err.stderr
    assert "broken-cxx" in err.command and "kernel.cpp" in err.command
    assert Path(err.source_path).read_text() == ADD  # the failed build is kept for inspection
    key = cache_key(ADD, CompilerConfig(cxx=cxx))
    assert not (tmp_path / "cache" / "kernels" / key[:2] / key).exists()
    assert (tmp_path / "cache" / "kernels" / key[:2] / f"{key}.failed" / "compile.sh").is_file()


def test_missing_compiler_raises_build_error(tmp_path: Path) -> None:
    missing = str(tmp_path / "no-such-g++")
    with pytest.raises(BuildError, match="no-such-g") as info:
        build(ADD, CompilerConfig(cxx=missing), tmp_path / "cache")
    assert missing in info.value.command


def test_timeout_kills_the_compiler_and_raises(tmp_path: Path) -> None:
    pidfile = tmp_path / "sleep.pid"
    cxx = _script(
        tmp_path / "slow-cxx",
        'if [ "$1" = "--version" ]; then echo "slow 1.0"; exit 0; fi\n'
        f"sleep 30 &\necho $! > {pidfile}\nwait\n",
    )
    t0 = time.perf_counter()
    with pytest.raises(BuildError, match="timed out after 1 s") as info:
        build(ADD, CompilerConfig(cxx=cxx, timeout_s=1.0), tmp_path / "cache")
    assert time.perf_counter() - t0 < 10
    assert "slow-cxx" in info.value.command
    pid = int(pidfile.read_text())
    for _ in range(50):  # the grandchild died with the process group (it may linger as a zombie)
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            break
        if state == "Z":
            break
        time.sleep(0.05)
    else:
        pytest.fail(f"the compiler's child {pid} is still running")


def test_two_processes_compile_once(tmp_path: Path) -> None:
    cxx, calls = _wrapper(tmp_path, before_compile="sleep 1")  # widen the race window
    config = CompilerConfig(cxx=cxx)
    cache = tmp_path / "cache"
    src = ADD + "// concurrent\n"
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=build, args=(src, config, cache)) for _ in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0, 0]
    assert len(_compiles(calls)) == 1, calls.read_text()
    lib = build(src, config, cache)
    assert lib.cache_hit and load(lib).add(5, 6) == 11
    assert not [p for p in lib.entry_dir.parent.iterdir() if p.name.startswith((".tmp-", ".trash-"))]


def test_compile_sh_rebuilds_the_library(tmp_path: Path) -> None:
    lib = build(ADD + "// compile.sh\n", CompilerConfig(), tmp_path / "cache")
    script = lib.entry_dir / "compile.sh"
    assert os.access(script, os.X_OK)
    lib.path.unlink()
    subprocess.run([str(script)], cwd=tmp_path, check=True, capture_output=True, timeout=60)
    assert lib.path.exists()
    assert ctypes.CDLL(str(lib.path)).add(4, 5) == 9


def test_name_must_be_a_plain_stem(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="plain file stem"):
        build(ADD, CompilerConfig(), tmp_path, name="../evil")


def test_compiler_that_writes_no_library_raises(tmp_path: Path) -> None:
    cxx = _script(tmp_path / "lazy-cxx", 'if [ "$1" = "--version" ]; then echo "lazy 1.0"; fi\nexit 0\n')
    with pytest.raises(BuildError, match=r"wrote no kernel\.so"):
        build(ADD, CompilerConfig(cxx=cxx), tmp_path / "cache")


def test_stale_temporary_directories_are_cleaned(tmp_path: Path) -> None:
    key = cache_key(ADD, CompilerConfig())
    stale = tmp_path / "cache" / "kernels" / key[:2] / f".tmp-{key}-killed"
    stale.mkdir(parents=True)
    (stale / "kernel.cpp").write_text(ADD)
    assert not build(ADD, CompilerConfig(), tmp_path / "cache").cache_hit
    assert not stale.exists()


def test_losing_the_rename_race_uses_the_winners_entry(tmp_path: Path) -> None:
    cxx, calls = _wrapper(tmp_path)
    config = CompilerConfig(cxx=cxx)
    first = build(ADD, config, tmp_path / "cache")
    saved = tmp_path / "saved-entry"
    shutil.copytree(first.entry_dir, saved)
    shutil.rmtree(first.entry_dir)
    # A process outside our lock (say, on a file system without flock) finishes while we compile.
    _wrapper(tmp_path, before_compile=f"cp -r {saved} {first.entry_dir}")
    second = build(ADD, config, tmp_path / "cache")
    assert second.cache_hit and len(_compiles(calls)) == 2
    assert second.path == first.path and load(second).add(1, 1) == 2
    assert not [p for p in first.entry_dir.parent.iterdir() if p.name.startswith(".tmp-")]
