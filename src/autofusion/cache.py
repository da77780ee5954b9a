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
  least recently used whole entries go, never one being written or whose lock is held.
- `get_json` treats a missing, unreadable or foreign record as absent (logged at DEBUG).
- Entries of the layout before namespaces (kernels in `root/<key[:2]>/<key>/`, `root/hw/cpu-*.json`,
  `root/conv_layouts.json`) are moved into their namespaces once, when a process first opens the root.
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
from typing import Any

from filelock import FileLock, Timeout

log = logging.getLogger(__name__)

NAMESPACES = ("kernels", "hw", "layouts")
DEFAULT_MAX_MB = 2048
DEFAULT_LOCK_TIMEOUT_S = 600.0
# No dots (suffixes tell entries from locks) and no dashes (`.tmp-<name>-*` names its entry).
_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_]{2,127}")
_SUFFIXES = ("", ".json", ".failed")


@dataclass(frozen=True)
class NamespaceInfo:
    """What one namespace holds: whole entries and their bytes (locks and temporaries not counted)."""

    entries: int
    bytes: int


@dataclass(frozen=True)
class _Entry:
    path: Path
    name: str  # the lock's name: the entry's file name less its suffix
    bytes: int
    used: float  # mtime: the last write or read


class Cache:
    """A cache root. Cheap to create; the first one per root and process migrates the old layout."""

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
        lock = FileLock(shard / f"{name}.lock", timeout=wait)
        try:
            lock.acquire()
            held = True
        except Timeout:
            log.warning("waited %.0f s for the cache lock of %s/%s; going on without it", wait, ns, name)
            held = False
        try:
            yield held
        finally:
            if held:
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
        self.evict(keep=self.entry_dir(ns, name))
        return True

    def keep_failed(self, tmp: Path, ns: str, name: str) -> Path:
        """Keep a failed build's directory as `<name>.failed/` (replacing an older one)."""
        failed = self.failed_dir(ns, name)
        _remove(failed)
        os.rename(tmp, failed)
        return failed

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
        self.evict(keep=path)
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

    def _record_path(self, ns: str, key: str) -> Path:
        name = hashlib.sha256(key.encode()).hexdigest()
        return self.shard(ns, name) / f"{name}.json"

    # ---- size ----

    def info(self) -> dict[str, NamespaceInfo]:
        """Entries and bytes per namespace (every known namespace, empty ones included)."""
        out = {ns: NamespaceInfo(0, 0) for ns in NAMESPACES}
        for ns in NAMESPACES:
            found = list(self._entries(ns))
            out[ns] = NamespaceInfo(len(found), sum(e.bytes for e in found))
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
        return evicted

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
        lock = FileLock(self.shard(ns, entry.name) / f"{entry.name}.lock", timeout=0)
        try:
            lock.acquire()
        except Timeout:
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
        lock = FileLock(path, timeout=0)
        try:
            lock.acquire()
        except Timeout:
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


def _migrate_once(cache: Cache) -> None:
    """Move entries of the layout before namespaces into them, once per root and process."""
    try:
        root = cache.root.resolve()
    except OSError:
        return
    with _migrated_lock:
        if root in _migrated:
            return
        _migrated.add(root)
    legacy_shards = [p for p in _dirs(root) if _LEGACY_SHARD.fullmatch(p.name)]
    legacy_hw = list((root / "hw").glob("cpu-*.json"))
    legacy_layouts = root / "conv_layouts.json"
    if not (legacy_shards or legacy_hw or legacy_layouts.exists()):
        return
    try:
        with FileLock(root / ".migrate.lock", timeout=0):
            _migrate(cache, legacy_shards, legacy_hw, legacy_layouts)
    except Timeout:
        pass  # another process is moving them right now
    except OSError as e:
        log.info("could not move old cache entries in %s into namespaces (%s); they are rebuilt", root, e)


def _migrate(cache: Cache, shards: list[Path], hw: list[Path], layouts: Path) -> None:
    moved = 0
    for shard in shards:
        for p in _children(shard):
            if p.is_dir() and _LEGACY_KEY.fullmatch(p.name) and (p / "meta.json").is_file():
                target = cache.entry_dir("kernels", p.name)
                target.parent.mkdir(parents=True, exist_ok=True)
                try:
                    os.rename(p, target)
                    moved += 1
                except OSError:
                    _remove(p)  # already there
            elif p.name.startswith((".tmp-", ".trash-")) or p.name.endswith((".lock", ".failed")):
                _rmtree(p)
        with contextlib.suppress(OSError):
            shard.rmdir()  # anything we did not recognise stays, and so does the shard
    for path in hw:
        with contextlib.suppress(OSError, ValueError):
            record = json.loads(path.read_bytes())
            if isinstance(record, dict) and isinstance(record.get("key"), str):
                moved += cache.put_json("hw", "cpu " + record["key"], record)
        _rmtree(path)
    if layouts.exists():
        with contextlib.suppress(OSError, ValueError):
            table = json.loads(layouts.read_bytes())
            for sig, timing in (table if isinstance(table, dict) else {}).items():
                moved += cache.put_json("layouts", str(sig), timing)
        _rmtree(layouts)
    log.info("moved %d entries of %s into the namespaced cache layout", moved, cache.root)
