"""Files in and out, for every command: bounded reading of inputs (stdin, .gz, binary and
oversized files refused with one line), JSON and TOML decoding that cannot crash, the
output-path guard that runs before any work, and atomic writes.

Every reader decompresses a `.gz` input and every writer compresses a `.gz` output, so what
bcgtune writes as `t.json.gz` it reads back.

Outputs never hurt inputs: `check_outputs` refuses, before a command starts working, an
output path that is empty, a folder, a device or other non-regular file, a file the user may
not write, in a folder that does not exist or cannot be written, or that resolves to one of
the run's inputs. Writes go to a temp file in the same folder and are renamed over the
target, so a reader never sees a torn file and an interrupted run leaves the old file
intact; the rename never replaces anything but a regular file the user may write.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import re
import stat
import sys
import tempfile
import zlib
from pathlib import Path
from typing import IO, Any, Callable, Iterable, Mapping

from bcgtune.errors import ExternalError, InputError

# A trace, calibration or profile larger than this is not one (a 1M-batch JSON trace with
# every per-batch column is ~150 MB).
MAX_DOCUMENT_BYTES = 1 << 30
SNIFF_BYTES = 64 << 10
# Values (numbers, strings, ...) a JSON document may hold: parsed, each costs 30-40 bytes, so
# this bounds a parse near 1.5 GiB (a per-batch JSON trace of about 2 million batches; larger
# traces are written in the binary form, trace -o t.npz)
MAX_JSON_VALUES = 1 << 25
_READ_ERRORS = (OSError, EOFError, gzip.BadGzipFile, zlib.error)


def path_kind(path: str | os.PathLike) -> str | None:
    """'file', 'folder' or 'other' for what `path` names, None when nothing is there or the
    name cannot be one (too long, a NUL byte): never raises."""
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        return None
    return "file" if stat.S_ISREG(mode) else "folder" if stat.S_ISDIR(mode) else "other"


def display_path(path: str) -> str:
    return "<stdin>" if path == "-" else str(path)


def _stdin_buffer(where: str) -> IO[bytes]:
    stream = sys.stdin
    buf = getattr(stream, "buffer", None) if stream is not None else None
    if buf is None or buf.closed:
        raise InputError("standard input is closed", where)
    return buf


def open_binary(path: str) -> IO[bytes]:
    """Open an input for reading bytes: `-` is stdin, gzip is decompressed (by the `.gz`
    suffix or the magic bytes). Errors name the file."""
    if path == "-":
        return _stdin_buffer("<stdin>")
    if path == "":
        raise InputError("empty file name", "''")
    p = Path(path)
    try:
        st = p.stat()
    except FileNotFoundError:
        raise InputError(
            "no such file" + (" (URLs are read for server logs only)" if _URL_RE.match(path) else ""), path
        ) from None
    except OSError as exc:
        raise InputError(f"cannot read: {exc.strerror}", path) from None
    if stat.S_ISDIR(st.st_mode):
        raise InputError("is a folder, not a file", path)
    try:
        fh = open(p, "rb")
    except OSError as exc:
        raise InputError(f"cannot read: {exc.strerror}", path) from None
    try:
        if path.endswith(".gz"):
            return gzip.GzipFile(fileobj=fh, mode="rb")  # type: ignore[return-value]
        if stat.S_ISREG(st.st_mode):  # pipes and devices cannot seek back: no sniffing
            head = fh.read(2)
            fh.seek(0)
            if head == b"\x1f\x8b":
                return gzip.GzipFile(fileobj=fh, mode="rb")  # type: ignore[return-value]
        return fh
    except OSError as exc:
        fh.close()
        raise InputError(f"cannot read: {_reason(exc)}", path) from None


def _reason(exc: BaseException) -> str:
    if isinstance(exc, EOFError):
        return "compressed data ends early (truncated .gz)"
    if isinstance(exc, (gzip.BadGzipFile, zlib.error)):
        return f"corrupt .gz ({exc})"
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc) or type(exc).__name__


def read_input(path: str, what: str, limit: int = MAX_DOCUMENT_BYTES) -> bytes:
    """The bytes of an input document (`-` for stdin, .gz decompressed), refused when it is
    binary (NUL bytes in its first 64 KiB) or larger than `limit` after decompression:
    neither is read to the end."""
    where = display_path(path)
    fh = open_binary(path)
    try:
        return read_stream(fh, where, what, limit)
    finally:
        if path != "-":
            fh.close()


def read_stream(fh: IO[bytes], where: str, what: str, limit: int = MAX_DOCUMENT_BYTES) -> bytes:
    """read_input of an input already open (its errors name `where`); `fh` is left open."""
    try:
        chunks = []
        total = 0
        first = True
        while True:
            block = fh.read(SNIFF_BYTES if first else 1 << 20)
            if not block:
                break
            if first and b"\x00" in block:
                raise InputError(f"binary data, not a {what}", where)
            first = False
            total += len(block)
            if total > limit:
                raise InputError(f"larger than {limit >> 20} MiB: not a {what}", where)
            chunks.append(block)
        return b"".join(chunks)
    except _READ_ERRORS as exc:
        raise InputError(f"cannot read: {_reason(exc)}", where) from None


def keep_input(path: str, dest: str | os.PathLike, what: str, limit: int = MAX_DOCUMENT_BYTES) -> str:
    """The bytes of input `path` as they come (compressed or not; `-` is stdin, or a named
    pipe), at most `limit`, written atomically to `dest`, which is returned: an input that
    can be read once, kept as a file for a reader that needs one (its hash, a second reader,
    a resumed run). More than `limit` is refused (nothing is left at `dest` then)."""
    where = display_path(path)
    if path == "-":
        src = _stdin_buffer(where)
    else:
        try:
            src = open(path, "rb")  # noqa: SIM115 (closed below)
        except FileNotFoundError:
            raise InputError("no such file", where) from None
        except OSError as exc:
            raise InputError(f"cannot read: {exc.strerror}", where) from None

    def chunks() -> Iterable[bytes]:
        total = 0
        while True:
            try:
                block = src.read(1 << 20)
            except _READ_ERRORS as exc:
                raise InputError(f"cannot read: {_reason(exc)}", where) from None
            if not block:
                return
            if not total and b"\x00" in block[:SNIFF_BYTES] and not block.startswith((b"PK\x03\x04", b"\x1f\x8b")):
                raise InputError(f"binary data, not a {what}", where)  # neither text, a zip nor gzip: not read on
            total += len(block)
            if total > limit:
                raise InputError(f"larger than {limit >> 20} MiB: not a {what}", where)
            yield block

    try:
        atomic_write_chunks(dest, chunks())
    finally:
        if path != "-":
            src.close()
    return str(dest)


def decode_text(data: bytes, where: str, what: str) -> str:
    """UTF-8 text (a BOM from spreadsheet exports is dropped), or one line naming the byte."""
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise InputError(f"not UTF-8 text (byte {exc.start}): not a {what}", where) from None


def text_blocks(text: str, block: int = 1 << 22) -> Iterable[str]:
    """`text` in pieces of about `block` characters, each ending just after a "\n" (the last
    excepted): the lines found in the pieces, by splitlines() or by "\n", are those found
    in the whole text, and no list of every line is ever made (memory: one piece)."""
    pos, n = 0, len(text)
    while pos < n:
        cut = text.find("\n", min(pos + block, n))
        end = n if cut < 0 else cut + 1
        yield text[pos:end]
        pos = end


def text_lines(text: str) -> Iterable[str]:
    """The lines of `text` with their ends, as iterating io.StringIO(text) gives them (split
    after each "\n"), a piece at a time (text_blocks)."""
    for piece in text_blocks(text):
        lines = piece.split("\n")
        yield from (line + "\n" for line in lines[:-1])
        if lines[-1]:
            yield lines[-1]


def csv_rows(text: str, where: str):
    """(line number, cells) of a CSV text, skipping blank and `#` comment lines; a malformed
    CSV (a stray quote, a bare carriage return) is one InputError naming the file. Rows come
    one at a time (text_lines)."""
    import csv

    reader = csv.reader(text_lines(text))
    try:
        for row in reader:
            if not row or not "".join(row).strip() or row[0].lstrip().startswith("#"):
                continue
            yield reader.line_num, row
    except csv.Error as exc:
        raise InputError(f"invalid CSV near line {reader.line_num}: {exc}", where) from None


def _refuse_constant(name: str):
    raise ValueError(f"{name} is not a number JSON allows")


def parse_json(text: str, where: str, max_values: int | None = None) -> Any:
    """json.loads with every failure as one line: syntax (line and column), NaN/Infinity
    literals, integers too long to convert, nesting too deep; and a document of more than
    `max_values` values (MAX_JSON_VALUES; counted by its commas before it is parsed, since
    each value costs 30-40 bytes of memory once parsed, against 2-8 of text) refused."""
    limit = MAX_JSON_VALUES if max_values is None else max_values
    if len(text) > limit and text.count(",") >= limit:
        raise InputError(f"more than {limit:,} values: larger than this document may be", where)
    try:
        return json.loads(text, parse_constant=_refuse_constant)
    except json.JSONDecodeError as exc:
        raise InputError(f"invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}", where) from None
    except RecursionError:
        raise InputError("invalid JSON: nested too deeply", where) from None
    except ValueError as exc:
        raise InputError(f"invalid JSON: {str(exc)[:120]}", where) from None


def parse_toml(data: bytes | str, where: str) -> dict[str, Any]:
    """A TOML document as a dict, every failure one line (not UTF-8, syntax, nesting)."""
    import tomllib

    text = data if isinstance(data, str) else decode_text(data, where, "TOML file")
    try:
        doc = tomllib.loads(text)
        nul = _nul_key(doc)
        if nul is not None:  # a path or an argument with a NUL: no file system or exec takes it
            raise InputError(f"{nul}: holds a NUL character (\\u0000)", where)
        return doc
    except tomllib.TOMLDecodeError as exc:
        raise InputError(f"invalid TOML: {str(exc)[:160]}", where) from None
    except RecursionError:
        raise InputError("invalid TOML: nested too deeply", where) from None
    except ValueError as exc:
        raise InputError(f"invalid TOML: {str(exc)[:160]}", where) from None


TOML_MAX_BYTES = 16 << 20  # a workload (a profile: files/profile_file.PROFILE_MAX_BYTES)


def _nul_key(value: Any, key: str = "") -> str | None:
    """The first key (`[server].model`, `list[2]`) whose string holds a NUL, else None."""
    if isinstance(value, str):
        return key if "\x00" in value else None
    if isinstance(value, dict):
        items: Iterable[tuple[str, Any]] = ((f"[{k}]" if not key else f"{key}.{k}", v) for k, v in value.items())
    elif isinstance(value, list):
        items = ((f"{key}[{i}]", v) for i, v in enumerate(value))
    else:
        return None
    for k, v in items:
        if "\x00" in k:
            return k.replace("\x00", "\\u0000")
        found = _nul_key(v, k)
        if found is not None:
            return found
    return None


def read_toml(path: str, what: str = "TOML file") -> dict[str, Any]:
    return parse_toml(read_input(path, what, limit=TOML_MAX_BYTES), display_path(path))


def check_zip_directory(fh: IO[bytes], where: str, what: str, *, max_members: int, max_bytes: int) -> None:
    """Refuse a zip archive whose central directory lists more than `max_members` members or
    takes more than `max_bytes`, from its end record alone: zipfile (and fsspec's zip://)
    reads the whole directory into memory, one object per member, before anything else.
    `fh` is seekable; it is left at its start. An archive without an end record passes (the
    zip reader refuses it)."""
    try:
        end = fh.seek(0, os.SEEK_END)
        size = min(end, _ZIP_TAIL_BYTES)
        fh.seek(end - size)
        tail = fh.read(size)
        fh.seek(0)
    except (OSError, ValueError):
        return
    i = tail.rfind(b"PK\x05\x06")
    if i < 0 or len(tail) < i + 22:
        return
    members, nbytes = int.from_bytes(tail[i + 10 : i + 12], "little"), int.from_bytes(tail[i + 12 : i + 16], "little")
    j = i - 20 - 56  # a zip64 end record lies right before its locator, right before the end record
    if (members == 0xFFFF or nbytes == 0xFFFFFFFF) and j >= 0 and tail[j : j + 4] == b"PK\x06\x06":
        members, nbytes = int.from_bytes(tail[j + 32 : j + 40], "little"), int.from_bytes(tail[j + 40 : j + 48], "little")
    if members > max_members or nbytes > max_bytes:
        raise InputError(
            f"its zip directory lists {members:,} members in {nbytes:,} bytes: not a {what} "
            f"(at most {max_members:,} members in {max_bytes >> 20} MiB)",
            where,
        )


# the end of a zip archive that holds its end record (at most 22 bytes and a 64 KiB comment)
# and the zip64 end record and locator before it
_ZIP_TAIL_BYTES = 22 + 65535 + 20 + 56


# --------------------------------------------------------------------------- outputs
def _regular_or_absent(real: str, where: str) -> bool:
    """True when `real` exists (and is a regular file); False when absent; refuses the rest."""
    try:
        st = os.stat(real)
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise InputError(f"cannot use as output: {exc.strerror}", where) from None
    if stat.S_ISDIR(st.st_mode):
        raise InputError("is a folder, not a file", where)
    if not stat.S_ISREG(st.st_mode):
        raise InputError("is not a regular file (a device, pipe or socket): refusing to replace it", where)
    if not os.access(real, os.W_OK):  # a rename would replace it all the same: refused, as `>` and cp refuse it
        raise InputError("is not writable by you (permission denied): refusing to replace it", where)
    return True


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.realpath(a) == os.path.realpath(b)


def check_output(path: str, where: str, inputs: Iterable[str] = ()) -> None:
    """Refuse `path` as an output before any work starts (see the module docstring)."""
    if not str(path).strip():
        raise InputError("empty output path", where)
    real = os.path.realpath(path)
    exists = _regular_or_absent(real, f"{where} {path}")
    parent = os.path.dirname(real) or "."
    if not os.path.isdir(parent):
        raise InputError("output folder does not exist", f"{where} {path}")
    for inp in inputs:
        if not inp or inp == "-":
            continue
        if real == os.path.realpath(inp) or (exists and os.path.exists(inp) and _same_file(real, inp)):
            raise InputError("is also an input of this run: refusing to overwrite it", f"{where} {path}")
    try:
        fd, probe = tempfile.mkstemp(prefix=".bcgtune-probe-", dir=parent)
    except OSError as exc:
        raise InputError(f"cannot write in {parent}: {exc.strerror}", f"{where} {path}") from None
    os.close(fd)
    os.unlink(probe)


_URL_RE = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
_GLOB_CHARS = re.compile(r"[*?\[]")
# fsspec's names for this machine's own files
_LOCAL_PROTOCOLS = ("file", "local")


def local_paths(value: str) -> list[str]:
    """The paths on this machine that an input value names, as a reader would open them:
    the value itself; the path of a `file://` or `local://` URL; and every local part of a
    chained fsspec URL (`zip://member::file:///a.zip` reads /a.zip, `simplecache::file:///x.log`
    reads /x.log). Other URLs (http, s3, ...) name nothing here. No I/O."""
    if value in ("", "-"):
        return []
    out = []
    for part in value.split("::") if "::" in value else [value]:
        if not _URL_RE.match(part):
            if part is not value and (":" in part or "/" not in part):  # a bare protocol name in a chain
                continue
            out.append(part)
            continue
        scheme, rest = part.split("://", 1)
        if scheme.lower() in _LOCAL_PROTOCOLS:
            out.append(rest)
    return out


def input_files(value: str, suffixes: tuple[str, ...] | None = None) -> list[str]:
    """The existing regular files an input value expands to, as a reader of folders and globs
    expands it (see local_paths for URLs): a file as it is, a glob to the files it matches, a
    folder to the files under it (those ending in `suffixes` when given). Never raises."""
    import glob

    found: list[str] = []
    for path in local_paths(value):
        try:
            if _GLOB_CHARS.search(path):
                found += [p for p in glob.glob(path, recursive=True) if os.path.isfile(p)]
                if os.path.isfile(path):  # a name with [ or * in it
                    found.append(path)
            elif os.path.isdir(path):
                found += [
                    os.path.join(root, f)
                    for root, _, files in os.walk(path)
                    for f in files
                    if suffixes is None or f.endswith(suffixes)
                ]
            elif os.path.isfile(path):
                found.append(path)
        except (OSError, ValueError):
            continue
    return found


def check_outputs(outputs: Mapping[str, str | None], inputs: Iterable[str] = ()) -> None:
    """`check_output` for each named output (flag -> path, None = not asked), and no two
    outputs of one run may be the same file."""
    inputs = [str(i) for i in inputs if i]
    seen: dict[str, str] = {}
    for where, path in outputs.items():
        if path is None:
            continue
        check_output(str(path), where, inputs)
        real = os.path.realpath(path)
        if real in seen:
            raise InputError(f"same file as {seen[real]}", f"{where} {path}")
        seen[real] = where


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write `data` via a temp file in the target's folder + fsync + rename (gzip-compressed
    when the name ends in .gz). A symbolic link is followed (its target is replaced, the link
    stays); anything but a regular file is refused."""
    atomic_write_chunks(path, (data,))


def atomic_write_chunks(path: str | os.PathLike, chunks: Iterable[bytes]) -> None:
    """atomic_write_bytes of the concatenated `chunks`, written as they come (a large
    document need not be held whole in memory)."""

    def write(fh: IO[bytes]) -> None:
        if str(path).lower().endswith(".gz"):
            with gzip.GzipFile(fileobj=fh, mode="wb", mtime=0) as gz:
                for chunk in chunks:
                    gz.write(chunk)
        else:
            for chunk in chunks:
                fh.write(chunk)

    atomic_write_with(path, write)


def atomic_write_with(path: str | os.PathLike, write: Callable[[IO[bytes]], None]) -> None:
    """Atomic write of what `write` puts into the (seekable) temp file it is given: temp file
    in the target's folder + fsync + rename; a symbolic link is followed, anything but a
    regular file is refused, and a failed or interrupted write leaves the target as it was."""
    where = str(path)
    real = os.path.realpath(path)
    existed = _regular_or_absent(real, where)
    parent = os.path.dirname(real) or "."
    if not os.path.isdir(parent):
        raise InputError("output folder does not exist", where)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(real)}.", suffix=".tmp", dir=parent)
    except OSError as exc:
        raise InputError(f"cannot write in {parent}: {exc.strerror}", where) from None
    try:
        _hold(fd)
        _remove_stale_temps(real, tmp)
        with os.fdopen(fd, "w+b") as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        mode = (os.stat(real).st_mode & 0o777) if existed else 0o644
        os.chmod(tmp, mode)
        os.replace(tmp, real)
    except OSError as exc:
        _unlink_quietly(tmp)
        raise ExternalError(f"cannot write: {exc.strerror or exc}", where) from None
    except BaseException:
        _unlink_quietly(tmp)
        raise


def _hold(fd: int) -> None:
    """Lock a temp file while it is written: a lock nobody holds marks one a killed write left."""
    import fcntl

    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        pass  # a file system without locks: such temps are then never taken for stale


def _remove_stale_temps(real: str, mine: str) -> list[str]:
    """Remove the temp files of `real` that earlier writes left when they were killed
    (`.NAME.XXXXXXXX.tmp` beside it, not locked by a running write), naming each on stderr."""
    import fcntl
    import glob

    parent, base = os.path.split(real)
    removed = []
    for cand in glob.glob(os.path.join(glob.escape(parent), f".{glob.escape(base)}.{'[a-z0-9_]' * 8}.tmp")):
        if cand == mine or path_kind(cand) != "file":
            continue
        try:
            fd = os.open(cand, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            continue  # a write in progress holds it (or locks do not work here): leave it
        else:
            try:
                os.unlink(cand)
                removed.append(cand)
            except OSError:
                pass
        finally:
            os.close(fd)
    for cand in removed:
        try:
            sys.stderr.write(f"bcgtune: removed {cand}, left by an interrupted write of {real}\n")
        except (OSError, ValueError, AttributeError):
            pass
    return removed


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | os.PathLike, obj, *, indent: int | None = 1) -> None:
    sep = None if indent is not None else (",", ":")
    atomic_write_text(path, json.dumps(obj, indent=indent, separators=sep) + "\n")


# --------------------------------------------------------------------------- hashing
def sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def log_digest() -> Any:
    """A running hash of a log's bytes: XXH3-128, whose hexdigest is what `xxh128sum`
    prints. A log's identity in a trace (two traces of one log are told apart from two
    logs), not a seal against tampering: it runs at memory speed, where sha256 alone cost
    twice what `grep` takes to read the log."""
    import xxhash

    return xxhash.xxh3_128()
