"""A cache of SGLang's answers in the user cache directory, so that asking SGLang again
about the same launch takes milliseconds instead of the seconds of importing it.

An entry is one JSON file named by the hash of everything its answer depends on (the
question, the launch's flags, the GPU it was asked for, the model config's content, the
runner file's content, the SGLang installation and bcgtune's own probe code). It also
records the size and modification time of every SGLang source file the answering process
imported: an entry whose files changed since is stale and asked again. Writes go to a
temporary file renamed into place (a reader never sees half an entry); a corrupt or foreign
entry is ignored and replaced; the oldest entries are evicted beyond MAX_ENTRIES. While one
bcgtune process asks SGLang, others that need an answer wait on a lock file and then read
what it wrote instead of starting SGLang a second time. The wait is bounded
($BCGTUNE_LOCK_TIMEOUT, 330 s by default) and says who holds the lock (pid, host, since
when); a lock whose recorded holder no longer exists is taken over.

Location: $BCGTUNE_CACHE_DIR, else $XDG_CACHE_HOME/bcgtune, else ~/.cache/bcgtune (the
answers live in its `sglang-answers` folder).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bcgtune.files.folder_lock import FolderLocked, age_text, holder_text, release_lock, take_lock
from bcgtune.files.folder_lock import read_holder as read_holder  # the lock's holder, as the cache's users read it

CACHE_ENV = "BCGTUNE_CACHE_DIR"
FORMAT_VERSION = 1
KIND = "bcgtune.sglang-answer"
MAX_ENTRIES = 512
# An entry larger than this is not one of ours.
MAX_ENTRY_BYTES = 4 * 2**20

FileStamp = tuple[str, int, int]  # path, size, mtime in ns


def cache_root() -> Path:
    """The bcgtune cache folder (BCGTUNE_CACHE_DIR, else the XDG user cache directory)."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg and Path(xdg).is_absolute() else Path("~/.cache").expanduser()
    return base / "bcgtune"


def key_of(parts: Mapping[str, Any]) -> str:
    """The entry name for a question: a hash of its parts in a canonical JSON form."""
    text = json.dumps(parts, sort_keys=True, separators=(",", ":"), ensure_ascii=True, default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def file_digest(path: str | os.PathLike[str]) -> str | None:
    """sha256 of a file's content (None when it cannot be read)."""
    h = hashlib.sha256()
    try:
        with open(path, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
    except OSError:
        return None
    return h.hexdigest()


def stamp_files(paths: Sequence[str]) -> list[FileStamp]:
    """(path, size, mtime_ns) of each file that exists."""
    out = []
    for p in sorted(set(paths)):
        try:
            st = os.stat(p)
        except OSError:
            continue
        out.append((p, st.st_size, st.st_mtime_ns))
    return out


def stamps_current(stamps: Sequence[Sequence[Any]]) -> bool:
    """Every recorded file still has its size and modification time."""
    for entry in stamps:
        if not (isinstance(entry, (list, tuple)) and len(entry) == 3):
            return False
        path, size, mtime = entry
        try:
            st = os.stat(path)
        except (OSError, TypeError, ValueError):
            return False
        if st.st_size != size or st.st_mtime_ns != mtime:
            return False
    return True


@dataclass(frozen=True)
class CachedAnswer:
    answer: dict[str, Any]
    created: float  # seconds since the epoch

    @property
    def created_text(self) -> str:
        """When SGLang gave this answer, and its age."""
        return f"{time.strftime('%Y-%m-%d %H:%M', time.localtime(self.created))}, {age_text(time.time() - self.created)}"


class AnswerCache:
    """The answers folder; `None` root means cache_root()/sglang-answers."""

    def __init__(self, root: Path | None = None, *, max_entries: int = MAX_ENTRIES):
        self.root = root if root is not None else cache_root() / "sglang-answers"
        self.max_entries = max_entries

    def _path(self, key: str) -> Path:
        return self.root / f"{key}.json"

    def get(self, key: str) -> CachedAnswer | None:
        """The entry for `key`, or None: absent, unreadable, corrupt, foreign or stale."""
        path = self._path(key)
        try:
            if path.stat().st_size > MAX_ENTRY_BYTES:
                return None
            doc = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError, RecursionError, UnicodeDecodeError):
            return None
        if not (
            isinstance(doc, dict)
            and doc.get("kind") == KIND
            and doc.get("format_version") == FORMAT_VERSION
            and doc.get("key") == key
            and isinstance(doc.get("answer"), dict)
            and isinstance(doc.get("created"), (int, float))
            and isinstance(doc.get("files"), list)
        ):
            return None
        if not stamps_current(doc["files"]):
            return None
        with contextlib.suppress(OSError):
            os.utime(path)  # recently used: evicted last
        return CachedAnswer(doc["answer"], float(doc["created"]))

    def put(self, key: str, answer: Mapping[str, Any], files: Sequence[FileStamp], parts: Mapping[str, Any]) -> bool:
        """Store an answer (atomically); False when the cache folder is not writable (the
        answer is then simply not cached)."""
        doc = {
            "kind": KIND,
            "format_version": FORMAT_VERSION,
            "key": key,
            "created": time.time(),
            "question": parts,
            "files": [list(f) for f in files],
            "answer": answer,
        }
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.root, prefix=f".{key[:16]}.", suffix=".tmp")
            try:
                with os.fdopen(fd, "w", encoding="utf-8") as fh:
                    json.dump(doc, fh, default=str)
                os.replace(tmp, self._path(key))
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise
        except OSError:
            return False
        self.evict()
        return True

    def evict(self) -> None:
        """Remove the least recently used entries beyond max_entries, and temporary files
        older than an hour (left by a process that was killed while writing)."""
        try:
            entries = list(os.scandir(self.root))
        except OSError:
            return
        now = time.time()
        answers = []
        for e in entries:
            try:
                st = e.stat()
            except OSError:
                continue
            if e.name.endswith(".tmp") and now - st.st_mtime > 3600:
                with contextlib.suppress(OSError):
                    os.unlink(e.path)
            elif e.name.endswith(".json"):
                answers.append((st.st_mtime, e.path))
        answers.sort()
        for _, path in answers[: max(0, len(answers) - self.max_entries)]:
            with contextlib.suppress(OSError):
                os.unlink(path)

    @property
    def lock_path(self) -> Path:
        return self.root / LOCK_NAME

    @contextlib.contextmanager
    def asking(self, on_wait: Callable[[str], None] | None = None, timeout: float | None = None) -> Iterator[None]:
        """Held while this process asks SGLang: another bcgtune asking at the same time
        waits here (`on_wait` is told who holds the lock), then finds the answers this one
        wrote. The wait is bounded (`timeout`, else $BCGTUNE_LOCK_TIMEOUT, else
        DEFAULT_LOCK_TIMEOUT_S): past it CacheLocked says who holds the lock. A lock whose
        recorded holder is a process of this machine that no longer exists (the lock lives
        on in a process that inherited it) is taken over (files/folder_lock.py). Without a
        writable folder or without fcntl (not POSIX), nothing is locked."""
        limit = lock_timeout(timeout)
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError:
            yield
            return
        try:
            fh = take_lock(
                self.lock_path,
                limit,
                on_wait,
                name="the answer cache lock",
                waiting_for="another bcgtune asking SGLang",
                hint=f"{LOCK_TIMEOUT_ENV} sets the wait",
            )
        except FolderLocked as exc:
            raise CacheLocked(f"{LOCKED_BY} {holder_text(exc.holder)} ({self.lock_path}); waited {limit:g} s") from None
        try:
            yield
        finally:
            release_lock(fh)


LOCK_NAME = ".asking.lock"
LOCK_TIMEOUT_ENV = "BCGTUNE_LOCK_TIMEOUT"
# A holder asks SGLang for at most the probe's own limit (300 s by default): waiting a little
# longer than that covers one whole question of another bcgtune.
DEFAULT_LOCK_TIMEOUT_S = 330.0
# how the reason for a missing answer starts when the lock was not obtained
LOCKED_BY = "the SGLang answer cache is locked by another bcgtune:"


class CacheLocked(Exception):
    """Another process held the answer cache's lock for longer than the wait allowed; the
    message says who (pid, host, since when) and how long this one waited."""


def lock_timeout(given: float | None = None) -> float:
    """The seconds to wait for the lock: `given`, else $BCGTUNE_LOCK_TIMEOUT, else
    DEFAULT_LOCK_TIMEOUT_S."""

    if given is not None:
        return max(0.0, float(given))
    return env_seconds(LOCK_TIMEOUT_ENV, DEFAULT_LOCK_TIMEOUT_S, zero_allowed=True)


def env_seconds(var: str, default: float, *, zero_allowed: bool) -> float:
    """A number of seconds from the environment variable `var` (`default` when unset or
    empty); anything else than a finite number (positive, or zero when `zero_allowed`) is an
    InputError naming the variable."""
    from bcgtune.errors import InputError

    text = os.environ.get(var, "").strip()
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        raise InputError(f"must be a number of seconds, not {text[:40]!r}", var) from None
    if not (0 <= value if zero_allowed else 0 < value) or value == float("inf"):
        raise InputError(f"must be {'zero or ' if zero_allowed else ''}a positive number of seconds", var)
    return value
