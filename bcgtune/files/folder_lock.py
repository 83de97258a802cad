"""A lock on a folder that one bcgtune process at a time may work in: a lock file in it,
held with flock(2) for as long as the work lasts and stamped with its holder (pid, host,
since when, command), so that another process is told who holds it.

Two users: the SGLang answer cache (adapters/sglang/answer_cache.py), whose lock is waited
for a bounded time while another bcgtune asks SGLang, and tune's state folder
(`hold_folder`), which another tune refuses at once: a tune runs for minutes, and two on
one folder would measure on the same device at the same time and leave the last writer's
state. A lock whose recorded holder is a process of this machine that no longer exists (the
lock lives on in a process that inherited it) is taken over. Within one process the lock is
re-entrant: a command that holds its folder may call a service that takes it too.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import socket
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import IO, Any, TypeVar

LOCK_POLL_S = 0.2


class FolderLocked(Exception):
    """Another process holds the lock; `holder` is what it recorded (None: nothing readable)."""

    def __init__(self, path: Path, holder: Mapping[str, Any] | None, waited: float):
        self.path, self.holder, self.waited = path, holder, waited
        super().__init__(f"{holder_text(holder)} holds {path}")


def take_lock(
    path: Path,
    limit: float,
    on_wait: Callable[[str], None] | None = None,
    *,
    name: str = "the lock",
    waiting_for: str = "another bcgtune",
    hint: str = "",
) -> IO[bytes] | None:
    """The lock file at `path`, opened, locked and stamped with this process; None where no
    lock can be held (no fcntl, a folder that cannot hold the file: nothing is locked then).
    Waits at most `limit` seconds for another holder, then raises FolderLocked. `on_wait`
    is told, once, that it waits (for `waiting_for`, with `hint` after), and when the lock
    (`name`) of a holder that is gone is taken over."""
    try:
        import fcntl
    except ImportError:
        return None
    deadline = time.monotonic() + limit
    told = False
    while True:
        try:
            fh = open(path, "a+b")  # noqa: SIM115 (held by the caller)
        except OSError:
            return None
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = read_holder(path)
            fh.close()
            if holder is not None and holder_gone(holder):
                if on_wait is not None:
                    on_wait(f"bcgtune: taking over {name}: its holder, {holder_text(holder)}, is gone")
                with contextlib.suppress(OSError):
                    os.unlink(path)  # the next open makes a fresh lock file
                continue
            if time.monotonic() >= deadline:
                raise FolderLocked(path, holder, limit) from None
            if not told and on_wait is not None:
                on_wait(
                    f"bcgtune: waiting up to {limit:g} s for {waiting_for}: {holder_text(holder)} holds {path}"
                    + (f" ({hint})" if hint else "")
                )
                told = True
            time.sleep(min(LOCK_POLL_S, max(0.0, deadline - time.monotonic())))
            continue
        # the file may have been replaced by a process taking over a stale lock meanwhile
        try:
            same = os.fstat(fh.fileno()).st_ino == os.stat(path).st_ino
        except OSError:
            same = False
        if not same:
            fh.close()
            continue
        with contextlib.suppress(OSError):
            fh.seek(0)
            fh.truncate()
            fh.write(json.dumps(holder_record()).encode("utf-8"))
            fh.flush()
        return fh


def release_lock(fh: IO[bytes] | None) -> None:
    """Unlock and close what take_lock returned (its stamp emptied first)."""
    if fh is None:
        return
    import fcntl

    with contextlib.suppress(OSError):
        fh.seek(0)
        fh.truncate()
    with contextlib.suppress(OSError):
        fcntl.flock(fh.fileno(), fcntl.LOCK_UN)
    fh.close()


# ---- a folder held for a whole piece of work -------------------------------------------------
_HELD: dict[str, int] = {}  # this process's folder locks: real path -> depth


@contextlib.contextmanager
def folder_held(folder: str | os.PathLike[str], lock_name: str, what: str) -> Iterator[None]:
    """Hold `folder` (created when missing, and removed again when the block wrote nothing
    into it) for the block: its lock file `lock_name` is taken at once, else an InputError
    names the holder; `what` says whose folder it is. Re-entrant in one process."""
    from bcgtune.errors import InputError

    real = os.path.realpath(folder)
    if _HELD.get(real):
        _HELD[real] += 1
        try:
            yield
        finally:
            _HELD[real] -= 1
        return
    made = not os.path.lexists(real)
    try:
        Path(real).mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(f"cannot make the folder: {exc.strerror or exc}", str(folder)) from None
    try:
        fh = take_lock(Path(real) / lock_name, 0.0, name=f"the {what}'s lock")
    except FolderLocked as exc:
        raise InputError(
            f"in use by another bcgtune: {holder_text(exc.holder)} works in this {what}; wait for it to finish, "
            "or give another folder",
            str(folder),
        ) from None
    _HELD[real] = 1
    try:
        yield
    finally:
        _HELD.pop(real, None)
        release_lock(fh)
        if made:  # a folder made for work that then wrote nothing (refused input) is not left behind
            with contextlib.suppress(OSError):
                if os.listdir(real) == [lock_name]:
                    os.unlink(os.path.join(real, lock_name))
                    os.rmdir(real)


F = TypeVar("F", bound=Callable[..., Any])


def hold_folder(folder_of: Callable[..., str | os.PathLike[str]], lock_name: str, what: str) -> Callable[[F], F]:
    """A decorator: the function runs holding the folder `folder_of(*args, **kwargs)` names
    (folder_held)."""

    def wrap(fn: F) -> F:
        @functools.wraps(fn)
        def call(*args: Any, **kwargs: Any) -> Any:
            with folder_held(folder_of(*args, **kwargs), lock_name, what):
                return fn(*args, **kwargs)

        return call  # type: ignore[return-value]

    return wrap


# ---- who holds a lock ------------------------------------------------------------------------
def holder_record() -> dict[str, Any]:
    """What a lock holder writes into the lock file: its pid, host, start time and command."""
    return {"pid": os.getpid(), "host": socket.gethostname(), "since": time.time(), "argv": sys.argv[:6]}


def read_holder(path: Path) -> dict[str, Any] | None:
    """The holder recorded in a lock file (None: none recorded, or not readable)."""
    try:
        with open(path, "rb") as fh:
            doc = json.loads(fh.read(4096).decode("utf-8"))
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    if not (isinstance(doc, dict) and isinstance(doc.get("pid"), int) and isinstance(doc.get("host"), str)):
        return None
    return doc


def holder_gone(holder: Mapping[str, Any]) -> bool:
    """The recorded holder is a process of this machine that no longer exists."""
    if holder.get("host") != socket.gethostname():
        return False
    pid = holder.get("pid")
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # exists, another user's
        return False
    return False


def holder_text(holder: Mapping[str, Any] | None) -> str:
    """'pid 123 on host h since 2026-12-02 01:05 (4 min ago)', or that none is recorded."""
    if holder is None:
        return "a process that recorded no pid (an older bcgtune?)"
    since = holder.get("since")
    when = ""
    if isinstance(since, (int, float)):
        when = f" since {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(since))} ({age_text(time.time() - since)})"
    return f"pid {holder.get('pid')} on host {holder.get('host')}{when}"


def age_text(seconds: float) -> str:
    """'12 s ago', '5 min ago', '3 h ago', '2 days ago'."""
    s = max(0.0, seconds)
    if s < 90:
        return f"{s:.0f} s ago"
    if s < 5400:
        return f"{s / 60:.0f} min ago"
    if s < 172800:
        return f"{s / 3600:.0f} h ago"
    return f"{s / 86400:.0f} days ago"
