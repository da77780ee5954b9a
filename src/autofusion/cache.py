"""The one disk cache: keyed entries in namespaces, written atomically, locked per key, capped in size.

In: a root directory (`Options.cache_dir`) and a size cap in bytes (`Options.cache_max_mb`; 0 = none).
Out: `Cache`, through which every module that keeps something on disk between runs goes; nothing else
writes under the root.

Layout: `root/<namespace>/<name[:2]>/` (a shard) holds the entries whose name starts with those two
characters. An entry is a directory `<name>/` (a built kernel library) or a file `<name>.json` (a small
record, written by `put_json`); next to it live `<name>.lock` (the per-name lock), `<name>.failed/` (a
failed build kept for inspection, evicted like an entry), `.tmp-<name>-*` (being written) and
`.trash-*` (being deleted). Namespaces: `NAMESPACES`.

Invariants:
- An entry appears only whole: it is written under a temporary name in its shard and renamed into
  place, so a reader sees the old entry, the new one or none, never half of one. Removal renames the
  entry to `.trash-*` first, for the same reason.
- `lock(ns, name)` is a `filelock.FileLock`: two processes building one name build it once (the second
  waits, then finds the entry). The lock goes with its holder's process, so a killed process leaves
  nothing that blocks; a holder that hangs is waited for `timeout_s` at most, then the caller goes on
  unlocked (told so by a False), and the atomic rename settles who wins.
- Reads touch the entry (its mtime is the last use). When a write takes the cache over its cap, the
  least recently used whole entries go, never one being written or whose lock is held. (The size is
  scanned now and then, not at every write: see `Cache._wrote`.)
- `get_json` treats a missing, unreadable or foreign record as absent (logged at DEBUG).
- The layout before namespaces (kernels in `root/<key[:2]>/<key>/`, `root/hw/cpu-*.json`,
  `root/conv_layouts.json`) stays valid and untouched, so an older autofusion sharing the root keeps
  working: its records are copied into their namespaces when a process first opens the root, and a
  kernel missing from "kernels" is adopted from there (hard links, no copy) by `adopt_legacy`. Only
  `clear()` of the whole cache removes it; the size cap does not count it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from filelock import FileLock

log = logging.getLogger(__name__)

NAMESPACES = ("kernels", "hw", "layouts", "tuning")
LEGACY = "old layout"  # the `info()` row for entries of the layout before namespaces
DEFAULT_MAX_MB = 2048
DEFAULT_LOCK_TIMEOUT_S = 600.0
RESCAN_S = 300.0  # how stale this process's idea of the cache's size may get before it scans again
# No dots (suffixes tell entries from locks) and no dashes (`.tmp-<name>-*` names its entry).
_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_]{2,127}")
_SUFFIXES = ("", ".json", ".failed")


# Per root: (bytes the last scan found plus what this process wrote since, when that scan ran).
_usage: dict[Path, tuple[int, float]] = {}
_usage_lock = threading.Lock()


@dataclass(frozen=True)
class NamespaceInfo:
    """What one namespace holds: whole entries and their bytes (locks and temporaries not counted)."""

    entries: int
    bytes: int


@dataclass(frozen=True)
class _Entry:
    """One file of a cache namespace, as eviction sees it."""

    path: Path
    name: str  # the lock's name: the entry's file name less its suffix
    bytes: int
    used: float  # mtime: the last write or read


class Cache:
    """A cache root. Cheap to create; the first one per root and process copies the records of the
    layout before namespaces (see the module docstring)."""

    def __init__(
        self, root: str | os.PathLike[str], max_bytes: int = DEFAULT_MAX_MB << 20,
        lock_timeout_s: float = DEFAULT_LOCK_TIMEOUT_S,
    ) -> None:  # fmt: skip
        if max_bytes < 0:
            raise ValueError(f"cache size cap must be >= 0 bytes (0 = no cap), got {max_bytes}")
        self.root = Path(root)
        self.max_bytes = max_bytes
        self.lock_timeout_s = lock_timeout_s
        _migrate_once(self)

    def __repr__(self) -> str:
        return f"Cache({str(self.root)!r}, max_bytes={self.max_bytes})"

    # ---- paths ----

    def shard(self, ns: str, name: str) -> Path:
        _check(ns, name)
        return self.root / ns / name[:2]

    def entry_dir(self, ns: str, name: str) -> Path:
        """Where the directory entry `name` lives (it may not exist)."""
        return self.shard(ns, name) / name

    def failed_dir(self, ns: str, name: str) -> Path:
        return self.shard(ns, name) / f"{name}.failed"

    # ---- locking ----

    @contextlib.contextmanager
    def lock(self, ns: str, name: str, timeout_s: float | None = None) -> Iterator[bool]:
        """Hold `name`'s lock. Yields True when held, False when `timeout_s` (default: the cache's)
        passed first: the caller then goes on without it, and the atomic rename decides."""
        shard = self.shard(ns, name)
        shard.mkdir(parents=True, exist_ok=True)
        wait = self.lock_timeout_s if timeout_s is None else timeout_s
        lock = _acquire(shard / f"{name}.lock", wait)
        if lock is None:
            log.warning("waited %.0f s for the cache lock of %s/%s; going on without it", wait, ns, name)
        try:
            yield lock is not None
        finally:
            if lock is not None:
                lock.release()

    # ---- directory entries ----

    def new_dir(self, ns: str, name: str, *, clean_stale: bool = False) -> Path:
        """A fresh temporary directory in `name`'s shard, to fill and then `commit_dir`. With
        `clean_stale` (only under `name`'s lock) temporaries a killed process left are removed first."""
        shard = self.shard(ns, name)
        shard.mkdir(parents=True, exist_ok=True)
        if clean_stale:
            for stale in shard.glob(f".tmp-{name}-*"):
                _rmtree(stale)
        return Path(tempfile.mkdtemp(prefix=f".tmp-{name}-", dir=shard))

    def commit_dir(self, tmp: Path, ns: str, name: str) -> bool:
        """Rename `tmp` into place as the entry `name`. False (and `tmp` left as it is) when an entry is
        already there: another process won; the caller checks it, then `remove`s and commits again,
        or drops `tmp`."""
        try:
            os.rename(tmp, self.entry_dir(ns, name))
        except OSError:
            if not self.entry_dir(ns, name).exists():
                raise
            return False
        entry = self.entry_dir(ns, name)
        self._wrote(entry, _size(entry))
        return True

    def keep_failed(self, tmp: Path, ns: str, name: str) -> Path:
        """Keep a failed build's directory as `<name>.failed/` (replacing an older one)."""
        failed = self.failed_dir(ns, name)
        _remove(failed)
        os.rename(tmp, failed)
        return failed

    def adopt_legacy(self, ns: str, name: str) -> bool:
        """Take the directory entry `name` from the layout before namespaces, if it is there: its files
        are hard-linked (copied where links fail) into a new entry, and the old one stays for older
        versions. Call under `name`'s lock; True when an entry was committed."""
        old = self.root / name[:2] / name
        if ns != "kernels" or not (old / "meta.json").is_file():
            return False
        tmp = self.new_dir(ns, name)
        try:
            for f in old.iterdir():
                if f.is_file():
                    try:
                        os.link(f, tmp / f.name)
                    except OSError:  # another file system, or links not allowed
                        shutil.copy2(f, tmp / f.name)
            if self.commit_dir(tmp, ns, name):
                log.debug("adopted %s from the cache layout before namespaces", old)
                return True
        except OSError as e:
            log.debug("could not adopt %s (%s); building it again", old, e)
        _rmtree(tmp)
        return False

    def remove(self, ns: str, name: str) -> None:
        """Take the entry `name` (directory or record) away in one rename, then delete it."""
        shard = self.shard(ns, name)
        _remove(shard / name)
        _remove(shard / f"{name}.json")

    def touch(self, path: Path) -> None:
        """Mark an entry used now (least recently used entries are evicted first)."""
        with contextlib.suppress(OSError):
            os.utime(path)

    # ---- records ----

    def put_json(self, ns: str, key: str, value: Any) -> bool:
        """Store `value` (JSON-serialisable) under the free-form `key`, atomically; False (logged) when
        the cache cannot be written, which only costs recomputing it next time."""
        path = self._record_path(ns, key)
        text = json.dumps({"key": key, "value": value}, indent=1, sort_keys=True) + "\n"
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            _write_atomic(path, text.encode())
        except OSError as e:
            log.warning("could not write cache record %s: %s", path, e)
            return False
        self._wrote(path, len(text))
        return True

    def get_json(self, ns: str, key: str) -> Any | None:
        """The value stored under `key`, or None when there is none or it is unreadable."""
        path = self._record_path(ns, key)
        try:
            record = json.loads(path.read_bytes())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as e:
            log.debug("cache record %s is unreadable (%s); treated as absent", path, e)
            return None
        if not isinstance(record, dict) or record.get("key") != key or "value" not in record:
            log.debug("cache record %s is not a record for its key; treated as absent", path)
            return None
        self.touch(path)
        return record["value"]

    def record_path(self, ns: str, key: str) -> Path:
        """Where `put_json(ns, key, ...)` stores its record (for messages that say where)."""
        return self._record_path(ns, key)

    def _record_path(self, ns: str, key: str) -> Path:
        name = hashlib.sha256(key.encode()).hexdigest()
        return self.shard(ns, name) / f"{name}.json"

    # ---- size ----

    def info(self) -> dict[str, NamespaceInfo]:
        """Entries and bytes per namespace (every known namespace, empty ones included), and under
        `LEGACY` those of the layout before namespaces when there are any."""
        out = {}
        for ns in NAMESPACES:
            found = list(self._entries(ns))
            out[ns] = NamespaceInfo(len(found), sum(e.bytes for e in found))
        old = _legacy_entries(self.root)
        if old:
            out[LEGACY] = NamespaceInfo(
                len(old), sum(_size(p) if p.is_dir() else p.stat().st_size for p in old)
            )
        return out

    def clear(self, namespace: str | None = None) -> tuple[int, int]:
        """Remove every entry (of one namespace, or all) and leftover temporaries; entries whose lock
        is held are being written and stay. Returns (entries removed, entries kept because in use)."""
        if namespace is not None and namespace not in NAMESPACES:
            raise ValueError(f"unknown cache namespace {namespace!r}; known: {', '.join(NAMESPACES)}")
        removed = kept = 0
        for ns in (namespace,) if namespace else NAMESPACES:
            for entry in list(self._entries(ns)):
                if self._remove_unlocked(ns, entry):
                    removed += 1
                else:
                    kept += 1
            for shard in _dirs(self.root / ns):
                for p in _children(shard):
                    if p.name.startswith(".trash-"):
                        _rmtree(p)
                    elif p.name.startswith(".tmp-"):
                        name = p.name[len(".tmp-") :].split("-", 1)[0].split(".", 1)[0]
                        if _NAME_RE.fullmatch(name):
                            self._remove_unlocked(ns, _Entry(p, name, 0, 0.0))
                    elif p.name.endswith(".lock"):
                        self._unlink_free_lock(p)
                with contextlib.suppress(OSError):
                    shard.rmdir()  # empty now
        if namespace is None:
            r, k = _clear_legacy(self.root)
            removed, kept = removed + r, kept + k
        return removed, kept

    def evict(self, keep: Path | None = None) -> int:
        """Remove least recently used entries until the cache is within its cap; `keep` (the entry
        just written) stays. Returns how many entries went."""
        if self.max_bytes <= 0:
            return 0
        entries = [(ns, e) for ns in NAMESPACES for e in self._entries(ns)]
        total = sum(e.bytes for _, e in entries)
        evicted = 0
        for ns, e in sorted(entries, key=lambda item: item[1].used):
            if total <= self.max_bytes:
                break
            if e.path == keep:
                continue
            if self._remove_unlocked(ns, e):
                total -= e.bytes
                evicted += 1
        if evicted:
            log.info("cache %s over its cap of %d MiB: evicted %d least recently used entries",
                     self.root, self.max_bytes >> 20, evicted)  # fmt: skip
        if total > self.max_bytes:
            log.debug(
                "cache %s still holds %d bytes (cap %d): the rest is in use", self.root, total, self.max_bytes
            )
        with _usage_lock:
            _usage[self.root] = (total, time.monotonic())
        return evicted

    def _wrote(self, path: Path, nbytes: int) -> None:
        """Evict if the write of `path` may have taken the cache over its cap. A full scan costs a
        stat per file (over a second for 16k kernels), so it runs on a process's first write, once
        this process's writes since the last scan could fill the room that scan found, and at least
        every RESCAN_S (other processes write too): the cap is kept to within that much."""
        if self.max_bytes <= 0:
            return
        with _usage_lock:
            found = _usage.get(self.root)
            if (
                found is not None
                and found[0] + nbytes <= self.max_bytes
                and time.monotonic() - found[1] < RESCAN_S
            ):
                _usage[self.root] = (found[0] + nbytes, found[1])
                return
        self.evict(keep=path)

    def _entries(self, ns: str) -> Iterator[_Entry]:
        for shard in _dirs(self.root / ns):
            for p in _children(shard):
                stem, dot, suffix = p.name.partition(".")
                if p.name.startswith(".") or f"{dot}{suffix}" not in _SUFFIXES:
                    continue  # temporaries, trash, locks, strangers
                try:
                    st = p.stat()
                except OSError:
                    continue  # removed meanwhile
                yield _Entry(p, stem, _size(p) if p.is_dir() else st.st_size, st.st_mtime)

    def _remove_unlocked(self, ns: str, entry: _Entry) -> bool:
        """Remove `entry` if nobody holds its lock (a holder is writing or repairing it)."""
        lock = _acquire(self.shard(ns, entry.name) / f"{entry.name}.lock", 0)
        if lock is None:
            return False
        try:
            _remove(entry.path)
            if not entry.path.name.startswith(".tmp-"):
                _unlink_held(lock)
        finally:
            lock.release()
        return True

    @staticmethod
    def _unlink_free_lock(path: Path) -> None:
        lock = _acquire(path, 0)
        if lock is None:
            return  # held: someone is building
        try:
            _unlink_held(lock)
        finally:
            lock.release()


def as_cache(where: Cache | str | os.PathLike[str]) -> Cache:
    """A Cache for `where` (a Cache as it is; a path gets the default cap)."""
    return where if isinstance(where, Cache) else Cache(where)


# ---- internals ----


def _check(ns: str, name: str) -> None:
    if ns not in NAMESPACES:
        raise ValueError(f"unknown cache namespace {ns!r}; known: {', '.join(NAMESPACES)}")
    if not _NAME_RE.fullmatch(name):
        raise ValueError(f"cache entry name {name!r} must be 3-128 letters, digits or _")


def _acquire(path: Path, timeout_s: float) -> FileLock | None:
    """The lock file `path`, held (None: `timeout_s` passed first). filelock is imported here, when a
    lock is first taken: a process that only reads the cache (loading a package) never imports it."""
    from filelock import FileLock, Timeout

    lock = FileLock(path, timeout=timeout_s)
    try:
        lock.acquire()
    except Timeout:
        return None
    return lock


def _unlink_held(lock: FileLock) -> None:
    """Delete the file of a lock we hold (its entry is gone). A waiter on this file and a newcomer on
    a fresh one could then both build; the loser's rename fails and it takes the winner's entry."""
    with contextlib.suppress(OSError):
        os.unlink(lock.lock_file)


def _dirs(parent: Path) -> list[Path]:
    return [p for p in _children(parent) if p.is_dir()]


def _children(parent: Path) -> list[Path]:
    try:
        return list(parent.iterdir())
    except OSError:  # missing (nothing cached yet) or unreadable
        return []


def _size(path: Path) -> int:
    total = 0
    for dirpath, _, files in os.walk(path):
        for f in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(dirpath, f)).st_size
    return total


def _write_atomic(path: Path, data: bytes) -> None:
    """Write `data` to a temporary file next to `path`, then rename it over `path`."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".tmp-{path.name}-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _remove(path: Path) -> None:
    """Take `path` out of the way in one rename, then delete it (readers never see half of it)."""
    trash = path.with_name(f".trash-{path.name}-{os.getpid()}-{time.monotonic_ns()}")
    try:
        os.rename(path, trash)
    except FileNotFoundError:
        return
    _rmtree(trash)


def _rmtree(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(OSError):
            path.unlink()


# ---- the layout before namespaces ----

_migrated: set[Path] = set()
_migrated_lock = threading.Lock()
_LEGACY_SHARD = re.compile(r"[0-9a-f]{2}")
_LEGACY_KEY = re.compile(r"[0-9a-f]{64}")
_LEGACY_TMP_AGE_S = 3600.0  # older builds gave up after their compile timeout (120 s by default)


def _migrate_once(cache: Cache) -> None:
    """Copy the records of the layout before namespaces into them (where absent), once per root and
    process. Nothing old is changed: an older version may still be using it."""
    try:
        root = cache.root.resolve()
    except OSError:
        return
    with _migrated_lock:
        if root in _migrated:
            return
        _migrated.add(root)
    for path in sorted((root / "hw").glob("cpu-*.json")):
        with contextlib.suppress(OSError, ValueError):
            record = json.loads(path.read_bytes())
            if isinstance(record, dict) and isinstance(record.get("key"), str):
                key = "cpu " + record["key"]  # the key autofusion.hw.measure stores it under
                if cache.get_json("hw", key) is None:
                    cache.put_json("hw", key, record)
    with contextlib.suppress(OSError, ValueError):
        table = json.loads((root / "conv_layouts.json").read_bytes())
        for sig, timing in (table if isinstance(table, dict) else {}).items():
            if cache.get_json("layouts", str(sig)) is None:
                cache.put_json("layouts", str(sig), timing)


def _legacy_shards(root: Path) -> list[Path]:
    return [p for p in _dirs(root) if _LEGACY_SHARD.fullmatch(p.name)]


def _legacy_entries(root: Path) -> list[Path]:
    found = [
        p
        for shard in _legacy_shards(root)
        for p in _children(shard)
        if _LEGACY_KEY.fullmatch(p.name.split(".")[0]) and not p.name.endswith(".lock")
    ]
    found += list((root / "hw").glob("cpu-*.json"))
    if (root / "conv_layouts.json").is_file():
        found.append(root / "conv_layouts.json")
    return found


def _clear_legacy(root: Path) -> tuple[int, int]:
    """Remove the layout before namespaces; entries whose lock an older version holds stay."""
    removed = kept = 0
    for shard in _legacy_shards(root):
        for p in _children(shard):
            key = p.name.split(".")[0]
            if p.name.startswith((".tmp-", ".trash-")):
                with contextlib.suppress(OSError):
                    if time.time() - p.stat().st_mtime > _LEGACY_TMP_AGE_S:
                        _rmtree(p)
            elif _LEGACY_KEY.fullmatch(key) and not p.name.endswith(".lock"):
                lock = _acquire(shard / f"{key}.lock", 0)  # older versions flock this file too
                if lock is None:
                    kept += 1
                    continue
                try:
                    _remove(p)
                    removed += 1
                finally:
                    lock.release()
        for p in _children(shard):
            if p.name.endswith(".lock"):
                Cache._unlink_free_lock(p)
        with contextlib.suppress(OSError):
            shard.rmdir()
    for p in [*(root / "hw").glob("cpu-*.json"), root / "conv_layouts.json"]:
        if p.exists():
            _rmtree(p)
            removed += 1
    return removed, kept
