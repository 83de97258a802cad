"""Logs where they live: URLs (`http(s)://`, `s3://`, `gs://`, `file://`, any protocol
fsspec knows) opened through fsspec, read as a stream with the same bounds as a local file
(`.gz` decompressed), and folders or globs of logs listed. fsspec (and aiohttp for http,
s3fs for s3, gcsfs for gs) is imported only when a URL is given.

Errors are one line naming the URL: a missing object is bad input (exit 2), a protocol
whose package is not installed says which package, an unreachable server or a broken
connection is an outside failure (exit 3)."""

from __future__ import annotations

import gzip
import re
from typing import IO, Any

from bcgtune.adapters.sglang.log.rotation import LOG_SUFFIXES, is_log_name
from bcgtune.errors import ExternalError, InputError

_URL_RE = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
# A connection that makes no progress for this long is given up (seconds).
CONNECT_TIMEOUT_S = 30
READ_TIMEOUT_S = 120
_GLOB_CHARS = re.compile(r"[*?\[]")


def is_url(path: str) -> bool:
    return bool(_URL_RE.match(path))


# A zip archive of logs on this machine lists at most this many members (fsspec reads its
# whole directory into memory, one object per member, before any member is opened)
MAX_ARCHIVE_MEMBERS = 1 << 16
MAX_ARCHIVE_DIRECTORY_BYTES = 8 << 20


def _check_local_archive(url: str) -> None:
    """A `zip://member::file:///a.zip` URL: the local archive's directory bounded first."""
    import os

    from bcgtune.fileio import check_zip_directory, local_paths

    head, chained, rest = url.partition("::")
    if not chained or head.split("://", 1)[0].lower() != "zip":
        return
    for path in local_paths(rest):
        if os.path.isfile(path):
            try:
                with open(path, "rb") as fh:
                    check_zip_directory(
                        fh, url, "log archive", max_members=MAX_ARCHIVE_MEMBERS, max_bytes=MAX_ARCHIVE_DIRECTORY_BYTES
                    )
            except OSError:
                return  # fsspec says what is wrong with it


def _filesystem(url: str) -> tuple[Any, str]:
    """(fsspec filesystem, path within it); a one-line InputError when the protocol is
    unknown or its package is missing."""
    _check_local_archive(url)
    try:
        from fsspec.core import url_to_fs
        from fsspec.registry import known_implementations
    except ImportError:
        raise InputError("reading a URL needs fsspec: pip install 'bcgtune[remote]'", url) from None
    scheme = url.split("://", 1)[0].lower()
    kwargs: dict[str, Any] = {}
    if scheme in ("http", "https"):
        try:
            import aiohttp
        except ImportError:
            raise InputError("reading http(s) URLs needs aiohttp: pip install 'bcgtune[remote]'", url) from None
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=CONNECT_TIMEOUT_S, sock_read=READ_TIMEOUT_S)
        kwargs["client_kwargs"] = {"timeout": timeout}
    elif scheme == "ftp":
        kwargs["timeout"] = CONNECT_TIMEOUT_S  # ftplib waits forever by default
    try:
        return url_to_fs(url, **kwargs)
    except (ImportError, ValueError) as exc:
        known = known_implementations.get(scheme) or {}
        hint = str(exc) or known.get("err") or type(exc).__name__
        raise InputError(f"cannot read {scheme}:// URLs here: {_one_line(hint)}", url) from None
    except Exception as exc:  # backends connect or open here: ftp refused, a missing zip, hdfs without Java
        raise _failure(exc, url) from None


def _one_line(text: str, limit: int = 160) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _failure(exc: BaseException, url: str) -> Exception:
    """The error to raise for what opening or reading `url` raised."""
    if isinstance(exc, FileNotFoundError):
        return InputError("no such file", url)
    if isinstance(exc, IsADirectoryError):
        return InputError("is a folder, not a file", url)
    if isinstance(exc, PermissionError):
        return InputError("permission denied", url)
    if type(exc).__name__ in ("BadZipFile", "ReadError", "LargeZipFile"):  # zipfile's, tarfile's
        return InputError(f"cannot read the archive: {_one_line(str(exc) or type(exc).__name__)}", url)
    if isinstance(exc, (EOFError, gzip.BadGzipFile)) or type(exc).__name__ == "error":  # zlib.error
        return InputError(f"cannot read: {_one_line(str(exc) or 'corrupt .gz')}", url)
    what = _one_line(str(exc) or type(exc).__name__)
    return ExternalError(f"cannot reach or read: {what}", url)


class RemoteFile:
    """A URL opened for sequential reading: read(n), tell() (bytes of the stored object
    consumed, compressed for .gz), close(); every error is the one line of _failure."""

    def __init__(self, url: str):
        self.url = url
        fs, path = _filesystem(url)
        # kept while the file is read: an archive's filesystem (zip://, tar://) closes the
        # archive when it is collected, under the member being read
        self.fs = fs
        try:
            if fs.isdir(path):
                raise IsADirectoryError(path)
            # block_size=0 streams http without range requests (servers need not support them)
            opts = {"block_size": 0} if fs.protocol in ("http", "https") or "http" in fs.protocol else {}
            self.raw: IO[bytes] = fs.open(path, "rb", **opts)
        except InputError:
            raise
        except Exception as exc:  # fsspec backends raise their own classes (aiohttp, botocore, ...)
            raise _failure(exc, url) from None
        self.stream: IO[bytes] = gzip.GzipFile(fileobj=self.raw, mode="rb") if url.endswith(".gz") else self.raw  # type: ignore[assignment]

    def read(self, size: int) -> bytes:
        try:
            return self.stream.read(size)
        except Exception as exc:
            raise _failure(exc, self.url) from None

    def tell(self) -> int:
        try:
            return int(self.raw.tell())
        except Exception:
            return 0

    def close(self) -> None:
        try:
            self.stream.close()
            if self.stream is not self.raw:
                self.raw.close()
        except Exception:
            pass


def url_size(url: str) -> int | None:
    """Bytes of the stored object (compressed for .gz), or None when the store does not say."""
    try:
        fs, path = _filesystem(url)
        size = fs.size(path)
        return int(size) if size is not None else None
    except Exception:
        return None


def list_logs(location: str) -> list[str]:
    """The logs at `location`: a file or URL as it is; a glob (`logs/*.log.gz`,
    `s3://bucket/day/*.log`) or a folder (its files ending in LOG_SUFFIXES, recursively),
    sorted. A folder or glob that holds no log is bad input."""
    if not is_url(location):
        import os

        from bcgtune.fileio import input_files

        if not (_GLOB_CHARS.search(location) or os.path.isdir(location)):
            return [location]
        found = sorted(set(input_files(location)))
        if not _GLOB_CHARS.search(location):  # a folder: its logs and their rotated pieces
            found = [p for p in found if is_log_name(p)]
    else:
        fs, path = _filesystem(location)

        def url_of(p: str) -> str:  # a member of a chained URL (zip://*.log::file:///a.zip) keeps its chain
            head, chain, rest = location.partition("::")
            return f"{head.split('://', 1)[0]}://{p.lstrip('/')}::{rest}" if chain else fs.unstrip_protocol(p)

        try:
            if _GLOB_CHARS.search(path):
                found = sorted(url_of(p) for p in fs.glob(path) if not fs.isdir(p))
            elif fs.isdir(path):
                found = sorted(url_of(p) for p in fs.find(path) if is_log_name(p))
            else:
                return [location]
        except Exception as exc:
            raise _failure(exc, location) from None
    if not found:
        raise InputError(
            f"no log files there (files ending in {', '.join(LOG_SUFFIXES)}, or their rotated pieces such as .log.1; "
            "each may be .gz)",
            location,
        )
    return found
