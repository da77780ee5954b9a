"""Build generated C++ into a shared library with the system compiler, cache it on disk, load it.

In: C++ source text, a `CompilerConfig` (compiler, flags, timeout; callers take it from `Options`,
this module never reads the environment) and the cache (`autofusion.cache.Cache`, or its root
directory). Out: a `BuiltLibrary` (the .so path, its cache key, whether it was a hit) and, via `load`,
a `ctypes.CDLL`.

Cache entry: the directory `kernels/<key[:2]>/<key>/` of the cache holds `<name>.cpp`, `<name>.so`,
`compile.sh` (reruns the exact command), `compiler_output.txt` and `meta.json` (written last). The key
hashes the source, the flags, the compiler's version line and the target machine (architecture, plus
the host CPU model and feature flags when a flag says `native`, so a cache shared between hosts never
hands out a library built for other instructions).

Invariants:
- An entry appears only whole: it is built in a temporary directory inside the shard and moved into
  place with one rename (`Cache.commit_dir`). A hit needs `meta.json` and a .so whose sha256 matches
  it; anything else is corrupt, logged at WARNING, removed and rebuilt.
- Misses take the key's cache lock, so concurrent processes compile a key once; the others wait and
  then hit. The hit path takes no lock: one read of meta.json, one sha256 of the .so, one touch.
- A failed build raises `BuildError` (source path, command, stderr) and keeps its directory as
  `<key>.failed/` for inspection; `compile.sh` there reproduces the failure.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import json
import logging
import os
import platform
import re
import shlex
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from autofusion.cache import Cache, as_cache
from autofusion.errors import BuildError
from autofusion.hw.isa import host_features, macro_features, required_features

log = logging.getLogger(__name__)

_FORMAT = "autofusion-cpp-build-1"  # bump when the layout or meta.json changes
_NS = "kernels"
# A process waiting for another to compile the same key waits for that compile's timeout and then some.
_LOCK_MARGIN_S = 60.0
_VERSION_TIMEOUT_S = 30.0
_NAME_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")

# -ffp-contract=off: each IR op rounds on its own, as in eager (g++ would otherwise fuse a * b + c into one
# rounding, and turn -(a * b + c) into fnmsub, which gives +0 where eager gives -0); af_math.h asks for
# fused multiply-adds explicitly where it wants them.
# -mprefer-vector-width=512: with -march=native on an AVX-512 CPU GCC 12 still vectorises with 256-bit
# vectors by default; ATen's kernels use 512-bit ones, and af_math.h's functions measured 1.1-1.5x faster
# per element with them (bench_math.py, Intel Xeon).  Without AVX-512 the flag changes nothing.
DEFAULT_FLAGS: tuple[str, ...] = (
    "-O3", "-march=native", "-fopenmp", "-std=c++17", "-shared", "-fPIC",
    "-fno-math-errno", "-fno-trapping-math", "-ffp-contract=off", "-mprefer-vector-width=512",
)  # fmt: skip


@dataclass(frozen=True)
class CompilerConfig:
    """Which compiler to run, with which flags, for how long at most."""

    cxx: str = "g++"
    flags: tuple[str, ...] = DEFAULT_FLAGS
    timeout_s: float = 120.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "flags", tuple(self.flags))  # a list would break hashing
        if not self.cxx:
            raise ValueError("CompilerConfig.cxx is empty")
        if self.timeout_s <= 0:
            raise ValueError(f"CompilerConfig.timeout_s must be positive, got {self.timeout_s}")


@dataclass(frozen=True)
class BuiltLibrary:
    """A built shared library in the cache. `compile_s` is the time this call spent in the compiler
    (0.0 on a cache hit; meta.json keeps the original compile time)."""

    path: Path
    key: str
    cache_hit: bool
    compile_s: float
    entry_dir: Path
    cache: Cache = field(repr=False, compare=False)


@functools.cache
def compiler_version(cxx: str) -> str:
    """The first line of `cxx --version`, run once per compiler path and process."""
    argv = [cxx, "--version"]
    try:
        r = subprocess.run(
            argv,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            errors="replace",
            timeout=_VERSION_TIMEOUT_S,
        )
    except (OSError, subprocess.SubprocessError) as e:
        raise BuildError(f"C++ compiler {cxx!r} cannot be run: {e}", command=shlex.join(argv)) from e
    lines = r.stdout.strip().splitlines()
    if r.returncode != 0 or not lines:
        raise BuildError(
            f"`{shlex.join(argv)}` failed (exit status {r.returncode}); is {cxx!r} a C++ compiler?",
            command=shlex.join(argv),
            stderr=r.stderr,
        )
    return lines[0].strip()


@functools.lru_cache(maxsize=1)
def _host_cpu() -> str:
    """CPU model and feature flags of this host (first processor of /proc/cpuinfo, read once)."""
    keep = ("model name", "flags", "features", "cpu implementer", "cpu part", "isa")
    found: list[str] = []
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if not line.strip():
                    break  # end of the first processor's block
                if line.split(":", 1)[0].strip().lower() in keep:
                    found.append(" ".join(line.split()))
    except OSError:
        pass
    return "\n".join(found) or platform.processor()


# Flags that do not change what instructions the compiler may emit (and that `-E` would not take).
_NOT_FOR_MACROS = ("-shared", "-fPIC", "-o")


@functools.cache
def _announced(cxx: str, flags: tuple[str, ...], timeout_s: float) -> frozenset[str] | None:
    """The ISA macros `cxx` predefines under `flags` (`hw/isa.macro_features`), asked once per process;
    None when the compiler does not answer (then `resolved_features` assumes every host feature)."""
    keep = [f for f in flags if f not in _NOT_FOR_MACROS]
    argv = [cxx, *keep, "-dM", "-E", "-x", "c++", os.devnull]
    rc, out, _, timed_out = _run(argv, Path(tempfile.gettempdir()), min(timeout_s, _VERSION_TIMEOUT_S))
    if rc != 0 or timed_out:
        log.debug("`%s` failed (exit status %s%s): assuming the library may use every CPU feature here",
                  shlex.join(argv), rc, ", timed out" if timed_out else "")  # fmt: skip
        return None
    return macro_features(out)


def resolved_features(config: CompilerConfig) -> tuple[str, ...]:
    """The CPU features (this machine's /proc/cpuinfo names) a library built with `config` may use: what
    `-march=native` or the -m flags resolve to here, as the compiler announces them. A machine must have
    every one to load the library (`hw/isa.missing_features`). Runs the compiler once per process."""
    announced = _announced(config.cxx, config.flags, config.timeout_s)
    host = host_features()
    return tuple(sorted(host)) if announced is None else required_features(announced, host)


def cache_key(source: str, config: CompilerConfig) -> str:
    """sha256 over the source, the flags, the compiler version and the target machine: its architecture,
    the CPU features the flags resolve to (`resolved_features`), and with a `native` flag the CPU model
    too (-mtune=native tunes for it). A cache shared between machines then never hands out a library
    built for instructions another machine lacks."""
    target = platform.machine() + "\nfeatures " + " ".join(resolved_features(config))
    if any("native" in f for f in config.flags):
        target += "\n" + _host_cpu()
    h = hashlib.sha256()
    for part in (_FORMAT, source, json.dumps(list(config.flags)), compiler_version(config.cxx), target):
        data = part.encode()
        h.update(len(data).to_bytes(8, "little"))
        h.update(data)
    return h.hexdigest()


def build(
    source: str, config: CompilerConfig, cache: Cache | str | os.PathLike[str], name: str = "kernel"
) -> BuiltLibrary:
    """Compile `source` into `<name>.so`, or return the cached library built from the same inputs."""
    if not _NAME_RE.fullmatch(name):
        raise ValueError(f"library name {name!r} must be a plain file stem (letters, digits, _ . -)")
    cache = as_cache(cache)
    key = cache_key(source, config)
    entry = cache.entry_dir(_NS, key)
    so, _ = _validate(entry, key)
    if so is not None:
        cache.touch(entry)
        return BuiltLibrary(so, key, True, 0.0, entry, cache)
    try:
        with cache.lock(_NS, key, timeout_s=config.timeout_s + _LOCK_MARGIN_S) as locked:
            so, why = _validate(entry, key)  # another process may have built it while we waited
            if so is None and not why and cache.adopt_legacy(_NS, key):  # built by an older version
                so, why = _validate(entry, key)
            if so is not None:
                cache.touch(entry)
                return BuiltLibrary(so, key, True, 0.0, entry, cache)
            if why:
                log.warning("cache entry %s is corrupt (%s); removing it and rebuilding", entry, why)
                cache.remove(_NS, key)
            return _compile(source, config, cache, key, name, clean_stale=locked)
    except OSError as e:  # unwritable cache directory, disk full, ...
        raise BuildError(f"cannot build {name} in cache directory {cache.root}: {e}", stderr=str(e)) from e


def install(cache: Cache | str | os.PathLike[str], key: str, files: dict[str, bytes]) -> BuiltLibrary:
    """Put a library built elsewhere (a saved package's: its .so and meta.json, by file name) into the
    cache under its key, unless a sound entry is already there; no compiler runs. `BuildError` when
    `files` do not make a sound entry (the sha256 in meta.json decides)."""
    cache = as_cache(cache)
    entry = cache.entry_dir(_NS, key)
    so, why = _validate(entry, key)
    try:
        if so is None and not why:
            # No entry: write one and rename it into place, no lock needed (the rename is atomic, and
            # a process that lost the race finds the winner's entry). Only repairing takes the lock.
            _write_entry(cache, key, files, cache.new_dir(_NS, key))
            so, _ = _validate(entry, key)
    except OSError as e:
        raise BuildError(f"cannot install library {key} in cache directory {cache.root}: {e}") from e
    if so is None:
        try:
            with cache.lock(_NS, key):
                so, why = _validate(entry, key)
                if so is None:
                    if why:
                        log.warning("cache entry %s is corrupt (%s); replacing it", entry, why)
                        cache.remove(_NS, key)
                    _write_entry(cache, key, files, cache.new_dir(_NS, key))
                    so, why = _validate(entry, key)
                    if so is None:
                        cache.remove(_NS, key)
                        raise BuildError(f"the library {key} does not make a sound cache entry: {why}")
        except OSError as e:
            raise BuildError(f"cannot install library {key} in cache directory {cache.root}: {e}") from e
    cache.touch(entry)
    return BuiltLibrary(so, key, True, 0.0, entry, cache)


def _write_entry(cache: Cache, key: str, files: dict[str, bytes], tmp: Path) -> None:
    """Fill the temporary directory `tmp` with `files` and rename it into place as `key`'s entry
    (dropped when an entry is there already: the caller validates whichever is)."""
    try:
        for name, data in files.items():
            if not _NAME_RE.fullmatch(name):
                raise BuildError(f"library file name {name!r} is not a plain file name")
            (tmp / name).write_bytes(data)
        committed = cache.commit_dir(tmp, _NS, key)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if not committed:
        shutil.rmtree(tmp, ignore_errors=True)


_handles: dict[Path, ctypes.CDLL] = {}
_handles_lock = threading.Lock()


def load(lib: BuiltLibrary) -> ctypes.CDLL:
    """dlopen the library (once per path and process). A library that fails to load is treated as a
    corrupt cache entry: it is removed and `BuildError` says so; building again recompiles it."""
    with _handles_lock:
        handle = _handles.get(lib.path)
        if handle is not None:
            return handle
        try:
            handle = ctypes.CDLL(str(lib.path))
        except OSError as e:
            with contextlib.suppress(OSError), lib.cache.lock(_NS, lib.key):
                lib.cache.remove(_NS, lib.key)
            log.warning("cannot load %s (%s); removed the cache entry as corrupt", lib.path, e)
            raise BuildError(
                f"cannot load {lib.path}: {e}; the cache entry was removed as corrupt, "
                "build again to recompile it",
                source_path=str(lib.path.with_suffix(".cpp")),
                command=f"dlopen {lib.path}",
                stderr=str(e),
            ) from e
        _handles[lib.path] = handle
        return handle


# ---- internals ----


def _sha256_file(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()  # libraries are small; one read is fastest


def _validate(entry: Path, key: str) -> tuple[Path | None, str]:
    """(the .so, "") for a sound entry; (None, "") when there is none; (None, why) when it is corrupt."""
    try:
        meta = json.loads((entry / "meta.json").read_text())
        so = entry / Path(meta["library"]).name
        digest = _sha256_file(so)
    except FileNotFoundError:
        return None, ("meta.json or the library is missing" if entry.exists() else "")
    except (OSError, ValueError, KeyError, TypeError) as e:
        return None, f"unreadable: {e}"
    if meta.get("key") != key:
        return None, "meta.json names another key"
    if digest != meta.get("so_sha256"):
        return None, "the library's sha256 does not match meta.json"
    return so, ""


def _compile(
    source: str, config: CompilerConfig, cache: Cache, key: str, name: str, clean_stale: bool
) -> BuiltLibrary:
    entry = cache.entry_dir(_NS, key)
    tmp = cache.new_dir(_NS, key, clean_stale=clean_stale)  # stale: left by a killed process
    try:
        (tmp / f"{name}.cpp").write_text(source)
        cxx = os.path.abspath(config.cxx) if os.sep in config.cxx else config.cxx  # we run in tmp
        argv = [cxx, f"{name}.cpp", *config.flags, "-o", f"{name}.so"]
        cmd = shlex.join(argv)
        script = tmp / "compile.sh"
        script.write_text(
            f"#!/bin/sh\n# Rebuilds {name}.so from {name}.cpp with the exact command autofusion ran.\n"
            f'cd "$(dirname "$0")" || exit 1\nexec {cmd}\n'
        )
        script.chmod(0o755)
        log.debug("compiling %s in %s: %s", name, entry, cmd)
        t0 = time.perf_counter()
        rc, out, err, timed_out = _run(argv, tmp, config.timeout_s)
        secs = time.perf_counter() - t0
        (tmp / "compiler_output.txt").write_text(out + err)
        so = tmp / f"{name}.so"
        if timed_out or rc != 0 or not so.is_file():
            _fail(cache.keep_failed(tmp, _NS, key), name, cmd, err, config, rc, timed_out)
        meta = {
            "format": _FORMAT, "key": key, "name": name, "library": so.name, "source": f"{name}.cpp",
            "compiler": config.cxx, "compiler_version": compiler_version(config.cxx),
            "flags": list(config.flags), "so_sha256": _sha256_file(so), "compile_s": round(secs, 4),
            "machine": platform.machine(), "features": list(resolved_features(config)),
        }  # fmt: skip
        (tmp / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
        if not cache.commit_dir(tmp, _NS, key):  # a process outside our lock (or its timeout) won the race
            theirs, _ = _validate(entry, key)
            if theirs is not None:
                log.debug("another process built %s first; using its entry", entry)
                shutil.rmtree(tmp, ignore_errors=True)
                return BuiltLibrary(theirs, key, True, 0.0, entry, cache)
            cache.remove(_NS, key)
            if not cache.commit_dir(tmp, _NS, key):
                raise OSError(f"cannot move the build into {entry}: another entry keeps appearing there")
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    log.info("compiled %s in %.2f s", name, secs)
    return BuiltLibrary(entry / so.name, key, False, secs, entry, cache)


def _run(argv: list[str], cwd: Path, timeout_s: float) -> tuple[int, str, str, bool]:
    """Run the compiler in its own process group, so a timeout kills it and everything it started."""
    try:
        proc = subprocess.Popen(
            argv,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            errors="replace",
            start_new_session=True,
        )
    except OSError as e:
        raise BuildError(
            f"C++ compiler {argv[0]!r} cannot be run: {e}",
            source_path=str(cwd / argv[1]),
            command=shlex.join(argv),
            stderr=str(e),
        ) from e
    try:
        out, err = proc.communicate(timeout=timeout_s)
        return proc.returncode, out, err, False
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        try:
            out, err = proc.communicate(timeout=5.0)
        except subprocess.TimeoutExpired:  # a grandchild left the group and holds the pipes
            out, err = "", ""
        return proc.returncode if proc.returncode is not None else -9, out, err, True
    except BaseException:  # KeyboardInterrupt and the like: leave no compiler behind
        _kill_group(proc)
        proc.wait()
        raise


def _kill_group(proc: subprocess.Popen[str]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def _fail(
    failed: Path, name: str, cmd: str, err: str, config: CompilerConfig, rc: int, timed_out: bool
) -> None:
    """Raise `BuildError` pointing at the failed build, kept (by the caller) as `<key>.failed/`."""
    src = failed / f"{name}.cpp"
    if timed_out:
        what = f"{config.cxx} timed out after {config.timeout_s:g} s compiling {src} and was killed"
    elif rc != 0:
        what = f"{config.cxx} failed (exit status {rc}) compiling {src}"
    else:
        what = f"{config.cxx} exited 0 but wrote no {name}.so compiling {src}"
    lines = [ln for ln in err.splitlines() if ln.strip()]
    first = ([ln for ln in lines if "error" in ln.lower()] or lines)[:5]
    detail = "".join(f"\n  {ln}" for ln in first)
    where = f"full output in {failed / 'compiler_output.txt'}; rerun with {failed / 'compile.sh'}"
    raise BuildError(
        f"{what}:{detail}\n({where})" if first else f"{what} ({where})",
        source_path=str(src),
        command=f"cd {shlex.quote(str(failed))} && {cmd}",
        stderr=err,
    )
