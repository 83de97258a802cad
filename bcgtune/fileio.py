"""File helpers shared by every command: atomic writes and tolerant opening of inputs."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import IO, Iterator

from bcgtune.errors import InputError


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write `data` to `path` via a temp file in the same folder + fsync + rename, so a
    reader never sees a torn file and an interrupted run leaves the old file intact."""
    path = Path(path)
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise InputError("output folder does not exist", str(parent))
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        if path.exists():
            try:
                os.chmod(tmp, path.stat().st_mode & 0o777)
            except OSError:
                pass
        else:
            os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | os.PathLike, obj) -> None:
    atomic_write_text(path, json.dumps(obj, indent=1, sort_keys=False) + "\n")


def loads_json(text: str, where: str):
    """json.loads with the error as a one-line InputError naming the file, line and column."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}", where) from None


def check_versioned(obj, kind: str, version: int, what: str, where: str) -> dict:
    """A bcgtune JSON document: an object whose `kind` (if present) and `format_version`
    match. Returns it."""
    if not isinstance(obj, dict):
        raise InputError(f"{what} JSON must be an object", where)
    if obj.get("kind") not in (None, kind):
        raise InputError(f"not a {what} (kind {obj.get('kind')!r})", where)
    got = obj.get("format_version")
    if got != version:
        raise InputError(f"unsupported format_version {got!r} (this bcgtune reads {version})", where)
    return obj


def open_binary(path: str) -> IO[bytes]:
    """Open a log/trace input for reading bytes: `-` is stdin, `.gz` is decompressed.
    Errors name the file."""
    if path == "-":
        return sys.stdin.buffer
    p = Path(path)
    if not p.exists():
        raise InputError("no such file", path)
    if p.is_dir():
        raise InputError("is a folder, not a file", path)
    try:
        fh = open(p, "rb")
    except OSError as exc:
        raise InputError(f"cannot read: {exc.strerror}", path) from None
    if path.endswith(".gz"):
        return gzip.GzipFile(fileobj=fh, mode="rb")  # type: ignore[return-value]
    head = fh.read(2)
    fh.seek(0)
    if head == b"\x1f\x8b":
        return gzip.GzipFile(fileobj=fh, mode="rb")  # type: ignore[return-value]
    return fh


class HashingReader(io.RawIOBase):
    """Wraps a binary stream, hashing (sha256) and counting the bytes as they are read,
    so a source's digest costs no second pass over a large file."""

    def __init__(self, raw: IO[bytes]):
        self._raw = raw
        self.sha256 = hashlib.sha256()
        self.nbytes = 0

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        data = self._raw.read(len(b))
        n = len(data)
        b[:n] = data
        self.sha256.update(data)
        self.nbytes += n
        return n

    def close(self) -> None:
        try:
            if self._raw is not sys.stdin.buffer:
                self._raw.close()
        finally:
            super().close()


def iter_byte_lines(path: str) -> tuple[Iterator[bytes], HashingReader]:
    """Stream the physical lines of `path` as bytes, split on b"\\n" only (a lone "\\r" from
    a progress bar does not start a new line, so line numbers match an editor's), with a
    reader that exposes sha256/bytes once the iterator is exhausted. Memory stays flat."""
    raw = open_binary(path)
    reader = HashingReader(raw)
    buffered = io.BufferedReader(reader, buffer_size=1 << 20)

    def gen() -> Iterator[bytes]:
        try:
            try:
                yield from buffered
            except (OSError, EOFError, gzip.BadGzipFile) as exc:
                raise InputError(f"cannot read: {exc}", path) from None
        finally:
            buffered.close()

    return gen(), reader


def sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()
