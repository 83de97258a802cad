"""Trace files: reading and writing a PrefillTrace.

Forms (all readable by `load_trace`, every value checked against
bcgtune.core.schema's bounds):
  * JSON, `format_version` 1 (written by `save_trace`):
      {"format_version": 1, "kind": "bcgtune.prefill-trace", "tool_version": ...,
       "created": ISO-8601, "origin": "sglang-log" | "simulation" | "histogram" | ...,
       "sources": [{"path", "xxh128", "bytes", ...}], "parse_stats": {...},
       "captures": [...], "meta": {...},
       "histogram": {"sizes": [...], "counts": [...]},
       "groups": [{"settings": {...}, "rank_chunk", "sources": [...], "histogram": {...},
                   "mix": {"tokens", "requests", "counts", "requests_known"}, ...}],
       "batches": {"forward_tokens": [...], "<column>": [...], ...} | null}
    A trace from logs groups its batches by server configuration (core/trace/groups.py);
    `batches: null` with groups is a histogram-only trace: counts per size and request
    mixes per group, enough to price every list, without per-batch columns.
  * CSV with a `size` column (also `tokens`, `num_tokens`, `forward_tokens`) and an optional
    `count` (or `batches`) column, in any order; without a count each row is one batch;
  * a JSON array of forward sizes, one per batch;
  * plain text, one forward size per line (blank lines and `#` comments skipped);
  * binary (`.npz`, written by `save_trace` for a name ending in .npz): a zip archive of
    numpy arrays, `document.npy` (the JSON document above as UTF-8 bytes, `batches: null`)
    and one `batches.<column>.npy` per per-batch column, each in the narrowest integer type
    that holds its values and deflated; read back into the columns' own types. A trace of
    millions of batches is a few bytes per batch and loads at the speed of numpy.
"""

from __future__ import annotations

import io
import json
import re
import zipfile
import zlib
from collections.abc import Iterator
from typing import IO, Annotated, Any, Optional

import numpy as np
import pydantic

from bcgtune.core.document import check_header
from bcgtune.core.schema import BATCHES_MAX, DP_RANKS_MAX, TOKENS_MAX, BatchCount, Document, Tokens, validate
from bcgtune.core.trace.groups import MAX_GROUPS, TraceGroup, histogram_of
from bcgtune.core.trace.prefill_trace import (
    BATCH_COLUMNS,
    FORMAT_VERSION,
    TRACE_KIND,
    PrefillTrace,
    _column_to_json,
)
from bcgtune.errors import InputError, quote
from bcgtune.fileio import check_zip_directory, csv_rows, text_blocks

# A trace file larger than this is not a trace (a JSON trace of a million batches with every
# per-batch column is ~150 MB).
MAX_TRACE_BYTES = 512 << 20


# A trace written under a name that says no form (`-o trace`) is binary from this many
# per-batch rows: its JSON text would take seconds to write and read, its binary form a
# fraction of one (benchmarks/RESULTS.md).
AUTO_BINARY_BATCHES = 100_000


def trace_form(trace: PrefillTrace, path: str) -> tuple[str, bool]:
    """(the form save_trace writes `trace` in at `path`: "binary", "csv" or "json", whether
    the name left the choice to the trace): .npz binary, .csv (.csv.gz) CSV, .json and any
    other .gz JSON; a name without one of these suffixes is binary for per-batch columns of
    AUTO_BINARY_BATCHES batches or more, else JSON (load_trace reads either by its bytes)."""
    name = str(path).lower()
    if is_binary_trace_name(name):
        return "binary", False
    if name.removesuffix(".gz").endswith(".csv"):
        return "csv", False
    if name.endswith((".json", ".gz")):
        return "json", False
    big = trace.batches is not None and trace.n_batches >= AUTO_BINARY_BATCHES
    return ("binary" if big else "json"), True


def save_trace(trace: PrefillTrace, path: str) -> None:
    """Write atomically in trace_form's form: `size,count` CSV, the binary form, or versioned
    JSON (the per-batch columns streamed a slice at a time: memory stays near the columns'
    own); gzip-compressed when the name ends in .gz (.csv.gz, .json.gz)."""
    from bcgtune.fileio import atomic_write_chunks, atomic_write_text

    form, _ = trace_form(trace, path)
    if form == "binary":
        save_binary_trace(trace, path)
    elif form == "csv":
        atomic_write_text(path, trace.to_csv())
    else:
        atomic_write_chunks(path, (s.encode("utf-8") for s in json_text_chunks(trace)))


_COLUMN_SLICE = 1 << 16


def _document_text(trace: PrefillTrace) -> str:
    """The trace's JSON document, compact, with `batches` null (the columns are written on
    their own: a slice at a time as JSON text, or as arrays of the binary form)."""
    batches = trace.batches
    trace.batches = None
    try:
        return json.dumps(trace.to_json_obj(), separators=(",", ":"))
    finally:
        trace.batches = batches


def json_text_chunks(trace: PrefillTrace) -> Iterator[str]:
    """The trace's JSON document (the text `json.dumps(to_json_obj())` gives, compact) in
    pieces: the per-batch columns are turned into text a slice at a time, never into one
    Python list each."""
    compact = (",", ":")
    batches = trace.batches
    head = _document_text(trace)
    if batches is None:
        yield head + "\n"
        return
    tail = '"batches":null}'
    assert head.endswith(tail)  # batches is the document's last key
    yield head[: -len("null}")] + "{"
    for i, (name, col) in enumerate(batches.items()):
        yield ("," if i else "") + json.dumps(name) + ":["
        for start in range(0, len(col), _COLUMN_SLICE):
            text = json.dumps(_column_to_json(col[start : start + _COLUMN_SLICE]), separators=compact)
            yield ("," if start else "") + text[1:-1]
        yield "]"
    yield "}}\n"


# ---- the binary form ------------------------------------------------------------------
ZIP_MAGIC = b"PK\x03\x04"


def is_binary_trace_name(path: str) -> bool:
    """A name save_trace writes in the binary form."""
    return str(path).lower().endswith(".npz")


NPZ_DOCUMENT = "document.npy"
_NPZ_COLUMN = "batches.{}.npy"
# what the columns of a binary trace may hold once read into their declared types (a zip's
# members can claim sizes far beyond their compressed bytes): 2 GiB, about 15 million batches
# with every column and more with fewer; each column must also hold exactly one row per
# batch its document counts
MAX_BINARY_COLUMN_BYTES = 2 << 30
# a binary trace holds its document and one member per column: an archive that lists more
# (its directory is read whole before any member) is not one
MAX_BINARY_MEMBERS = 1024
MAX_BINARY_DIRECTORY_BYTES = 1 << 20
_ZIP_TIME = (1980, 1, 1, 0, 0, 0)  # the same trace gives the same bytes


def _narrow(col: np.ndarray) -> np.ndarray:
    """An integer column in the narrowest signed type that holds its values (it is read
    back into its declared type); float columns as they are."""
    if col.dtype.kind != "i" or col.size == 0:
        return col
    lo, hi = int(col.min()), int(col.max())
    for t in (np.int8, np.int16, np.int32):
        info = np.iinfo(t)
        if info.min <= lo and hi <= info.max:
            return col.astype(t)
    return col


def save_binary_trace(trace: PrefillTrace, path: str) -> None:
    """The binary form (module docstring), written atomically."""
    from bcgtune.fileio import atomic_write_with

    batches = trace.batches
    head = _document_text(trace).encode("utf-8")

    def member(zf: zipfile.ZipFile, name: str, arr: np.ndarray) -> None:
        info = zipfile.ZipInfo(name, date_time=_ZIP_TIME)
        info.compress_type = zipfile.ZIP_DEFLATED
        # level 1: fast; the narrowed columns are most of the saving (Python 3.13 names it
        # compress_level, earlier ones _compresslevel)
        setattr(info, "compress_level" if hasattr(info, "compress_level") else "_compresslevel", 1)
        with zf.open(info, "w", force_zip64=True) as fh:
            np.lib.format.write_array(fh, np.ascontiguousarray(arr), allow_pickle=False)

    def write(fh) -> None:
        with zipfile.ZipFile(fh, "w", allowZip64=True) as zf:
            member(zf, NPZ_DOCUMENT, np.frombuffer(head, np.uint8))
            for name, col in (batches or {}).items():
                member(zf, _NPZ_COLUMN.format(name), _narrow(np.asarray(col, BATCH_COLUMNS[name])))

    atomic_write_with(path, write)


def _npy_header(fh, where: str, member: str) -> tuple[tuple[int, ...], np.dtype]:
    try:
        version = np.lib.format.read_magic(fh)
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(fh)
        elif version == (2, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(fh)
        else:
            raise ValueError(f"unsupported .npy version {version}")
    except (ValueError, OSError, EOFError, zipfile.BadZipFile) as exc:
        raise InputError(f"{member}: not a numpy array ({str(exc)[:120]})", where) from None
    if fortran or dtype.hasobject or len(shape) != 1:
        raise InputError(f"{member}: must be a one-dimensional array of numbers", where)
    return shape, dtype


def _read_member(
    zf: zipfile.ZipFile, info: zipfile.ZipInfo, where: str, budget: list[int], rows: int | None = None, itemsize: int = 1
) -> np.ndarray:
    """One member's array: its header checked before its data is read: `rows` rows when
    given (a column has one per batch the document counts), and its size once read into its
    declared type (`itemsize` bytes a row) within what is left of the budget. A member that
    claims more is refused from its header, whatever its deflated bytes would expand to."""
    name = info.filename
    try:
        with zf.open(info) as fh:
            (n,), dtype = _npy_header(fh, where, name)
            if dtype.kind not in "iuf" or dtype.itemsize > 8:
                raise InputError(f"{name}: holds {dtype}, not integers or floats", where)
            nbytes = n * dtype.itemsize
            if rows is not None and n != rows:
                loc = name.removesuffix(".npy")
                raise InputError(f"{loc}: has {n:,} rows, the histogram counts {rows:,} batches", where)
            if n * max(itemsize, dtype.itemsize) > budget[0]:
                raise InputError(f"{name}: {nbytes >> 20:,} MiB is more than a trace may hold", where)
            budget[0] -= n * max(itemsize, dtype.itemsize)
            arr = np.empty(n, dtype)  # read in place, a piece at a time: the data is held once
            view = arr.data.cast("B")
            got = 0
            while got < nbytes:
                k = fh.readinto(view[got : got + (16 << 20)])  # type: ignore[attr-defined]
                if not k:
                    break
                got += k
    except (zipfile.BadZipFile, OSError, EOFError, zlib.error) as exc:
        raise InputError(f"{name}: cannot read ({str(exc)[:120]})", where) from None
    if got != nbytes:
        raise InputError(f"{name}: ends early ({got:,} of {nbytes:,} bytes)", where)
    return arr


def _binary_columns(zf: zipfile.ZipFile, where: str, n_batches: int, budget: list[int]) -> dict[str, np.ndarray] | None:
    """The per-batch columns of a binary trace, in their declared types, each checked as the
    JSON form's are; None when it holds none."""
    out: dict[str, np.ndarray] = {}
    for info in zf.infolist():
        name = info.filename
        if not (name.startswith("batches.") and name.endswith(".npy")):
            continue
        col = name[len("batches.") : -len(".npy")]
        if col not in BATCH_COLUMNS:
            continue  # columns from a newer writer are left out, not fatal
        dtype = np.dtype(BATCH_COLUMNS[col])
        arr = _read_member(zf, info, where, budget, rows=n_batches, itemsize=dtype.itemsize)
        loc = f"batches.{col}"
        if dtype.kind == "f":
            arr = arr.astype(dtype)
            if np.isinf(arr).any():
                raise InputError(f"{loc}[{int(np.flatnonzero(np.isinf(arr))[0])}]: must be finite (NaN when absent)", where)
        else:
            if arr.dtype.kind == "f":
                raise InputError(f"{loc}: holds floats, must hold integers", where)
            lo, hi = (1, TOKENS_MAX) if col == "forward_tokens" else _COLUMN_BOUNDS[str(dtype)]
            if arr.size:
                if arr.dtype.kind == "i" or lo > 0:
                    bad = np.flatnonzero((arr < lo) | (arr > hi))
                else:  # unsigned: never below a negative bound (numpy refuses to compare them)
                    bad = np.flatnonzero(arr > hi)
                if bad.size:
                    raise InputError(f"{loc}[{int(bad[0])}]: must be within {lo}..{hi}, got {arr[bad[0]]}", where)
            arr = arr.astype(dtype)
        out[col] = arr
    return out or None


def _load_binary_trace(fh: IO[bytes], where: str) -> PrefillTrace:
    """The binary form (module docstring), from `fh` at its start: its document checked as
    a JSON trace is, and its columns against it (one row per batch the histogram counts, the
    histogram that of forward_tokens)."""
    src = fh
    if not fh.seekable():  # a pipe: held in memory, within what a trace file may be
        data = fh.read(MAX_TRACE_BYTES + 1)
        if len(data) > MAX_TRACE_BYTES:
            raise InputError(f"larger than {MAX_TRACE_BYTES >> 20} MiB: not a trace", where)
        src = io.BytesIO(data)
    check_zip_directory(src, where, "binary trace", max_members=MAX_BINARY_MEMBERS, max_bytes=MAX_BINARY_DIRECTORY_BYTES)
    try:
        zf = zipfile.ZipFile(src)
    except (zipfile.BadZipFile, OSError, EOFError, ValueError) as exc:
        raise InputError(f"not a binary trace: {str(exc)[:120]}", where) from None
    with zf:
        infos = {i.filename: i for i in zf.infolist()}
        if NPZ_DOCUMENT not in infos:
            raise InputError(f"not a bcgtune binary trace: no {NPZ_DOCUMENT} in the archive", where)
        budget = [MAX_TRACE_BYTES]
        head = _read_member(zf, infos[NPZ_DOCUMENT], where, budget)
        if head.dtype != np.uint8:
            raise InputError(f"{NPZ_DOCUMENT}: must hold bytes", where)
        try:
            text = head.tobytes().decode("utf-8")
        except UnicodeDecodeError:
            raise InputError(f"{NPZ_DOCUMENT}: not UTF-8 text", where) from None
        budget = [MAX_BINARY_COLUMN_BYTES]
        trace = _parse_json_trace(text, where, binary=True)
        n = int(trace.counts.sum())
        cols = _binary_columns(zf, where, n, budget)
    if cols is not None:
        if "forward_tokens" not in cols:
            raise InputError("batches need a forward_tokens column", where)
        sizes, counts = np.unique(cols["forward_tokens"], return_counts=True)
        if not (np.array_equal(sizes, trace.sizes) and np.array_equal(counts, trace.counts)):
            raise InputError("batches.forward_tokens does not give the document's histogram", where)
        _check_decode_votes(trace.meta, cols, where)
        col = cols.get("group")
        if col is not None and trace.groups and col.size and (col.min() < 0 or col.max() >= len(trace.groups)):
            raise InputError(f"batches.group: must be within 0..{len(trace.groups) - 1}", where)
        trace.batches = cols
    return trace


def _starts_zip(fh: IO[bytes]) -> bool:
    """Whether an input opened at its start begins as a zip archive, looked at without
    taking its bytes (a pipe is peeked at, a file read and put back)."""
    try:
        peek = getattr(fh, "peek", None)
        if peek is not None:
            return peek(4)[:4] == ZIP_MAGIC
        if fh.seekable():
            head = fh.read(4)
            fh.seek(0)
            return head == ZIP_MAGIC
    except (OSError, ValueError, EOFError, zlib.error):
        return False  # the text reader says what is wrong with it
    return False


# What only an SGLang server log holds, looked for at the start of a text given as a trace that
# is not a JSON document (a JSON trace quotes malformed prefill lines among its parse figures)
_LOG_MARKS = (  # in lower case
    "prefill batch",
    "new fill batch",
    "decode batch",
    "server_args=",
    "max_total_num_tokens=",
    "cuda graph begin",
    "kv cache is allocated",
    "memory pool end",
    "load weight",
)
_LOG_SNIFF = 1 << 16


def _looks_like_a_log(head: str) -> bool:
    """Whether the start of a text given as a trace holds what only a server log holds,
    outside the comments a one-size-per-line trace may carry (`# ...`)."""
    text = "\n".join(line.split("#", 1)[0] for line in head.lower().splitlines())
    return any(mark in text for mark in _LOG_MARKS)


def load_trace(path: str, where: str | None = None) -> PrefillTrace:
    """Read a JSON trace, a binary (.npz) trace, a CSV, a JSON array of sizes or a
    one-size-per-line file. Errors name the file (and the line or field), or `where` when
    given (a copy of standard input is named `<stdin>`)."""
    from bcgtune.fileio import display_path, open_binary

    where = where or display_path(path)
    fh = open_binary(path)  # opened once: a named pipe or stdin is read by whichever reader its first bytes call for
    try:
        trace = _load_binary_trace(fh, where) if _starts_zip(fh) else _load_text_trace(fh, where)
    finally:
        if path != "-":
            fh.close()
    trace.validate(where)
    if not trace.sources:
        trace.sources = [{"path": where}]
    return trace


def _load_text_trace(fh: IO[bytes], where: str) -> PrefillTrace:
    """A JSON trace, a JSON array of sizes, a CSV or a one-size-per-line file."""
    from bcgtune.fileio import decode_text, read_stream

    what = "trace (JSON trace, binary .npz trace, size,count CSV or one size per line)"
    text = decode_text(read_stream(fh, where, what, limit=MAX_TRACE_BYTES), where, what)
    first_char = re.search(r"\S", text)
    stripped = text[first_char.start() : first_char.start() + _LOG_SNIFF] if first_char else ""  # its start, not a copy
    if not stripped:
        raise InputError("trace is empty", where)
    if not stripped.startswith("{") and _looks_like_a_log(stripped):
        raise InputError(
            "an SGLang server log, not a trace: `bcgtune trace --log FILE -o trace.json` makes a trace of it "
            "(drift and tune read logs directly with --log)",
            where,
        )
    if stripped.startswith("{"):
        return _parse_json_trace(text, where)
    if stripped.startswith("["):
        return _parse_json_list(text, where)
    first = stripped.partition("\n")[0].splitlines()[0].strip().lower().replace(" ", "")
    if "," in first or first.startswith(_SIZE_COLUMNS):
        return _parse_csv_trace(text, where)
    return _parse_plain_trace(text, where)


# ---- the JSON document ----------------------------------------------------------------
class _Histogram(Document):
    sizes: list[Tokens]
    counts: list[BatchCount]


# a chunk as SGLang logs it: a token count, or -1 (0) for chunked prefill off
_Chunk = Annotated[int, pydantic.Field(strict=True, ge=-1, le=TOKENS_MAX)]


class _StartupLine(Document):
    model_config = pydantic.ConfigDict(extra="allow")
    chunked_prefill_size: Optional[_Chunk] = None
    max_prefill_tokens: Optional[Tokens] = None


class _WorkloadResolved(Document):
    model_config = pydantic.ConfigDict(extra="allow")
    chunked_prefill_size: Optional[_Chunk] = None


class _WorkloadMeta(Document):
    model_config = pydantic.ConfigDict(extra="allow")
    name: Optional[str] = None
    resolved: Optional[_WorkloadResolved] = None


class _DecodeVotes(Document):
    """Ranks that decoded during another rank's prefill step (simulated DP attention):
    their rows vote and pad with the step (bcgtune.core.plan.step_grouping)."""

    step: list[Annotated[int, pydantic.Field(strict=True, ge=0, le=2**62)]]
    rank: list[Annotated[int, pydantic.Field(strict=True, ge=0, le=DP_RANKS_MAX - 1)]]
    rows: list[Tokens]


class _DPAttentionMeta(Document):
    model_config = pydantic.ConfigDict(extra="allow")
    ranks: Annotated[int, pydantic.Field(strict=True, ge=1, le=DP_RANKS_MAX)]
    decode_votes: Optional[_DecodeVotes] = None


class _TraceMeta(Document):
    """The meta keys bcgtune reads back from a trace file, typed; others pass through."""

    model_config = pydantic.ConfigDict(extra="allow")
    startup: list[_StartupLine] = []
    workload: Optional[_WorkloadMeta] = None
    ranks: list[str] = []
    dp_attention: Optional[_DPAttentionMeta] = None


class _CaptureLine(Document):
    """A capture line as the log parser recorded it (only what is read back is typed)."""

    model_config = pydantic.ConfigDict(extra="allow")
    kind: Optional[str] = None
    phase: Optional[str] = None
    backend: Optional[str] = None
    buckets: Optional[list[Tokens]] = None
    elided: bool = False
    source: Optional[int] = None
    line: Optional[int] = None


_Count = Annotated[int, pydantic.Field(strict=True, ge=0, le=BATCHES_MAX)]


def _setting(value: Any) -> Any:
    """A launch setting as a log states it: text (at most 400 characters), true or false,
    an integer within int32, or null; one message for whatever else."""
    ok = (
        value is None
        or isinstance(value, bool)
        or (isinstance(value, str) and len(value) <= 400)
        or (isinstance(value, int) and -(2**31) <= value <= 2**31 - 1)
    )
    if not ok:
        raise ValueError(
            f"must be text (at most 400 characters), true, false, an integer within int32 or null, got {quote(value)}"
        )
    return value


_Setting = Annotated[Any, pydantic.AfterValidator(_setting)]


class _MixDoc(Document):
    tokens: list[Tokens]
    requests: list[Annotated[int, pydantic.Field(strict=True, ge=1, le=TOKENS_MAX)]]
    counts: list[BatchCount]
    requests_known: bool = True


class _GroupDoc(Document):
    settings: dict[Annotated[str, pydantic.Field(max_length=64)], _Setting] = {}
    rank_chunk: Optional[Annotated[int, pydantic.Field(strict=True, ge=-1, le=TOKENS_MAX)]] = None
    sources: list[Annotated[int, pydantic.Field(strict=True, ge=0, le=2**31 - 1)]] = []
    histogram: _Histogram
    mix: _MixDoc
    graph: dict[Annotated[str, pydantic.Field(max_length=32)], _Count] = {}
    saturated: dict[Annotated[str, pydantic.Field(max_length=32)], _Count] = {}
    settings_given: bool = False  # given (`trace --launch`) for logs that state none, not logged


class _TraceDocument(Document):
    origin: str = "histogram"
    sources: list[dict[str, Any]] = []
    parse_stats: dict[str, Any] = {}
    captures: list[_CaptureLine] = []
    meta: _TraceMeta = _TraceMeta()
    histogram: _Histogram
    groups: list[_GroupDoc] = []
    batches: Optional[dict[str, Any]] = None


def _parse_json_trace(text: str, where: str, binary: bool = False) -> PrefillTrace:
    from bcgtune.fileio import parse_json

    obj = check_header(parse_json(text, where), TRACE_KIND, FORMAT_VERSION, "prefill trace", where)
    doc = validate(_TraceDocument, obj, where)
    if binary and doc.batches is not None:
        raise InputError(f"{NPZ_DOCUMENT}: batches must be null (the columns are the archive's arrays)", where)
    hist = doc.histogram
    if len(hist.sizes) != len(hist.counts):
        raise InputError("histogram.sizes and histogram.counts differ in length", where)
    sizes = np.asarray(hist.sizes, dtype=np.int64)
    counts = np.asarray(hist.counts, dtype=np.int64)
    order = np.argsort(sizes, kind="stable")
    sizes, counts = sizes[order], counts[order]
    if (np.diff(sizes) == 0).any():
        raise InputError("histogram.sizes holds a size twice", where)
    batches = _batch_columns(doc.batches, where) if doc.batches else None
    meta = doc.meta.model_dump(exclude_unset=True)
    if not binary:  # a binary trace's columns are read after its document, and checked then
        _check_decode_votes(meta, batches, where)
    groups = _groups(doc.groups, len(doc.sources), sizes, counts, where)
    if batches is not None and groups:
        col = batches.get("group")
        if col is not None and col.size and (col.min() < 0 or col.max() >= len(groups)):
            raise InputError(f"batches.group: must be within 0..{len(groups) - 1}", where)
    return PrefillTrace(
        sizes=sizes,
        counts=counts,
        batches=batches,
        origin=doc.origin,
        sources=doc.sources,
        parse_stats=doc.parse_stats,
        captures=[c.model_dump(exclude_unset=True) for c in doc.captures],
        meta=meta,
        groups=groups,
    )


def _check_decode_votes(meta: dict[str, Any], batches: dict[str, np.ndarray] | None, where: str) -> None:
    """meta.dp_attention.decode_votes, each a (step, rank, rows) of a rank decoding during a
    simulated step: equal lengths, ranks below meta.dp_attention.ranks, steps the batches
    hold, one vote per (step, rank), and never a rank that prefills in that step."""
    from bcgtune.core.plan.step_grouping import dp_index

    dpa = meta.get("dp_attention") or {}
    votes = dpa.get("decode_votes")
    if not votes:
        return
    loc = "meta.dp_attention.decode_votes"
    step, rank, rows = (np.asarray(votes.get(k, []), dtype=np.int64) for k in ("step", "rank", "rows"))
    if not (step.size == rank.size == rows.size):
        raise InputError(f"{loc}: step, rank and rows differ in length", where)
    if rank.size and int(rank.max()) >= dpa["ranks"]:
        raise InputError(f"{loc}.rank: rank {int(rank.max())} is not below meta.dp_attention.ranks ({dpa['ranks']})", where)
    col = None if batches is None else batches.get("step")
    if col is None:
        if step.size:
            raise InputError(f"{loc}: votes of simulated steps need the batches' step column", where)
        return
    known = np.unique(col[col >= 0])
    unknown = step[~np.isin(step, known)]
    if unknown.size:
        raise InputError(f"{loc}.step: step {int(unknown[0])} is no step of the trace's batches", where)
    pairs = np.stack([step, rank], axis=1)
    uniq, counts = np.unique(pairs, axis=0, return_counts=True)
    if (counts > 1).any():
        s0, r0 = uniq[int(np.argmax(counts > 1))]
        raise InputError(f"{loc}: rank {int(r0)} votes twice in step {int(s0)}", where)
    tags = list(meta.get("ranks") or [])
    rank_col = batches.get("rank") if batches is not None else None
    if rank_col is None or not tags:
        return
    dp_of_tag = np.array([-1 if (d := dp_index(t)) is None else d for t in tags] + [-1], dtype=np.int64)
    rc = np.asarray(rank_col, dtype=np.int64)
    dp = dp_of_tag[np.where((rc >= 0) & (rc < len(tags)), rc, len(tags))]
    prefill = {(int(a), int(b)) for a, b in zip(col.tolist(), dp.tolist()) if a >= 0 and b >= 0}
    both = next(((int(a), int(b)) for a, b in pairs.tolist() if (a, b) in prefill), None)
    if both is not None:
        raise InputError(f"{loc}: rank {both[1]} both prefills and decodes in step {both[0]}", where)


def _groups(docs: list[_GroupDoc], n_sources: int, sizes: np.ndarray, counts: np.ndarray, where: str) -> list[TraceGroup]:
    """The groups of a trace file, each checked: lengths, a mix that holds its batches,
    sources that exist, at least one batch; together they add up to the histogram."""
    if len(docs) > MAX_GROUPS:
        raise InputError(f"groups: at most {MAX_GROUPS} server configurations, got {len(docs)}", where)
    out = []
    for i, d in enumerate(docs):
        loc = f"groups[{i}]"
        h, m = d.histogram, d.mix
        if len(h.sizes) != len(h.counts):
            raise InputError(f"{loc}.histogram: sizes and counts differ in length", where)
        if not (len(m.tokens) == len(m.requests) == len(m.counts)):
            raise InputError(f"{loc}.mix: tokens, requests and counts differ in length", where)
        if not h.counts or sum(h.counts) == 0:
            raise InputError(f"{loc}: an empty group (no batches)", where)
        bad = next((s for s in d.sources if s >= n_sources), None)
        if bad is not None:
            raise InputError(f"{loc}.sources: source {bad} does not exist ({n_sources} sources)", where)
        g_sizes, g_counts = histogram_of(np.asarray(h.sizes, np.int64), np.asarray(h.counts, np.int64))
        tokens, requests, mcounts = (np.asarray(x, np.int64) for x in (m.tokens, m.requests, m.counts))
        if (requests > tokens).any():
            raise InputError(f"{loc}.mix: a batch cannot hold more requests than tokens", where)
        mix_sizes, mix_counts = histogram_of(tokens, mcounts)
        if tokens.size and not (np.array_equal(mix_sizes, g_sizes) and np.array_equal(mix_counts, g_counts)):
            raise InputError(f"{loc}.mix: does not add up to the group's histogram", where)
        out.append(
            TraceGroup(
                settings=dict(d.settings), rank_chunk=d.rank_chunk, sources=list(d.sources), sizes=g_sizes,
                counts=g_counts, mix_tokens=tokens, mix_requests=requests, mix_counts=mcounts,
                requests_known=m.requests_known, graph=dict(d.graph), saturated=dict(d.saturated), given=d.settings_given,
            )
        )  # fmt: skip
    if out:
        all_sizes, all_counts = histogram_of(np.concatenate([g.sizes for g in out]), np.concatenate([g.counts for g in out]))
        if not (np.array_equal(all_sizes, sizes) and np.array_equal(all_counts, counts)):
            raise InputError("groups: do not add up to the trace's histogram", where)
    return out


_COLUMN_BOUNDS = {"int64": (-(2**62), 2**62), "int32": (-(2**31), 2**31 - 1), "int8": (-1, 1)}


def _batch_columns(raw: dict[str, Any], where: str) -> dict[str, np.ndarray]:
    """Per-batch columns, each checked with numpy (they may hold millions of values):
    integers (or null for float columns) within the column's range, equal lengths."""
    out: dict[str, np.ndarray] = {}
    n = None
    for name, values in raw.items():
        if name not in BATCH_COLUMNS:
            continue  # columns from a newer writer are left out, not fatal
        loc = f"batches.{name}"
        if not isinstance(values, list):
            raise InputError(f"{loc}: must be a list", where)
        dtype = BATCH_COLUMNS[name]
        if dtype.startswith("float"):
            bad = next(
                (i for i, v in enumerate(values) if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)))),
                None,
            )
            if bad is not None:
                raise InputError(f"{loc}[{bad}]: must be a number or null, got {quote(values[bad])}", where)
            arr = np.array([np.nan if v is None else float(v) for v in values], dtype=dtype)
        else:
            bad = next((i for i, v in enumerate(values) if isinstance(v, bool) or not isinstance(v, int)), None)
            if bad is not None:
                raise InputError(f"{loc}[{bad}]: must be an integer, got {quote(values[bad])}", where)
            lo, hi = _COLUMN_BOUNDS[dtype]
            if name == "forward_tokens":
                lo, hi = 1, TOKENS_MAX
            bad = next((i for i, v in enumerate(values) if not lo <= v <= hi), None)
            if bad is not None:
                raise InputError(f"{loc}[{bad}]: must be within {lo}..{hi}, got {str(values[bad])[:40]}", where)
            arr = np.asarray(values, dtype=dtype)
        if n is None:
            n = arr.size
        elif arr.size != n:
            raise InputError(f"{loc}: has {arr.size} rows, other columns {n}", where)
        out[name] = arr
    return out


def _parse_json_list(text: str, where: str) -> PrefillTrace:
    """A JSON array of forward sizes, one per batch."""
    from bcgtune.fileio import parse_json

    values = validate(list[Tokens], parse_json(text, where), where, prefix=("sizes",))
    if not values:
        raise InputError("trace is empty: no sizes", where)
    return PrefillTrace.from_sizes(values, origin="sizes")


def _parse_int(token: str, where: str, what: str) -> int:
    """An integer cell ('12' or '12.0', in the digits 0-9); its bounds are checked for a
    block of rows at once."""
    t = token.strip()
    if not t.isascii():  # int() also reads '１' and '٣'
        raise InputError(f"{what}: {t[:40]!r} is not an integer", where)
    try:
        return int(t)
    except ValueError:
        pass
    try:
        f = float(t)
    except ValueError:
        raise InputError(f"{what}: {t[:40]!r} is not an integer", where) from None
    if not f.is_integer():
        raise InputError(f"{what}: {t[:40]!r} is not an integer", where)
    return int(f)


def _check_column(values: list[int], lines: list[int], where: str, what: str, bound, top: int) -> None:
    """Every value within 1..top, checked vectorized; the first one out of bounds is
    reported through the schema (one mechanism, one wording) with its line."""
    bad = (
        next((i for i, v in enumerate(values) if not 1 <= v <= top), None)
        if values and (min(values) < 1 or max(values) > top)
        else None
    )
    if bad is not None:
        validate(bound, values[bad], f"{where}:{lines[bad]}", prefix=(what,))


# rows of a text trace parsed into Python numbers before they are counted into its histogram:
# memory stays near the text's own (a list of every row took 30-50 bytes a byte of text)
_BLOCK_ROWS = 1 << 18


class _TextRows:
    """The rows of a CSV or one-size-per-line trace, counted into a histogram a block at a
    time: each block's values checked (with their lines) and reduced to (size, count) pairs,
    the pairs merged as they grow. Memory: one block, and the distinct sizes."""

    def __init__(self, where: str, size_name: str, count_name: str | None):
        self.where, self.size_name, self.count_name = where, size_name, count_name
        self.sizes: list[int] = []
        self.counts: list[int] = []
        self.lines: list[int] = []
        self.parts: list[tuple[np.ndarray, np.ndarray]] = []
        self.held = 0  # pairs in parts
        self.rows = 0

    def add(self, size: int, count: int | None, line: int) -> None:
        self.sizes.append(size)
        if count is not None:
            self.counts.append(count)
        self.lines.append(line)
        if len(self.sizes) >= _BLOCK_ROWS:
            self._count_block()

    def _count_block(self) -> None:
        if not self.sizes:
            return
        _check_column(self.sizes, self.lines, self.where, self.size_name, Tokens, TOKENS_MAX)
        if self.count_name is not None:
            _check_column(self.counts, self.lines, self.where, self.count_name, BatchCount, BATCHES_MAX)
        arr = np.asarray(self.sizes, dtype=np.int64)
        w = np.ones(arr.size, np.int64) if self.count_name is None else np.asarray(self.counts, dtype=np.int64)
        self.parts.append(histogram_of(arr, w))
        self.held += self.parts[-1][0].size
        self.rows += arr.size
        self.sizes, self.counts, self.lines = [], [], []
        if len(self.parts) > 1 and self.held > 2 * self.parts[0][0].size:  # merged as they double
            self._merge()

    def _merge(self) -> None:
        sizes, counts = histogram_of(np.concatenate([p[0] for p in self.parts]), np.concatenate([p[1] for p in self.parts]))
        self.parts, self.held = [(sizes, counts)], sizes.size

    def trace(self, origin: str, empty: str) -> PrefillTrace:
        self._count_block()
        if not self.rows:
            raise InputError(empty, self.where)
        self._merge()
        sizes, counts = self.parts[0]
        return PrefillTrace(sizes=sizes.astype(np.int64), counts=counts.astype(np.int64), origin=origin)


_SIZE_COLUMNS = ("size", "tokens", "num_tokens", "forward_tokens")
_COUNT_COLUMNS = ("count", "batches")


def _parse_csv_trace(text: str, where: str) -> PrefillTrace:
    """`size,count` rows (columns found by name, in any order, others ignored; `tokens` is
    taken for `size`; without a count column each row is one batch)."""
    header: list[str] | None = None
    si = ci = None
    rows: _TextRows | None = None
    for lineno, row in csv_rows(text, where):
        if header is None:
            header = [h.strip().lower() for h in row]
            si = next((header.index(c) for c in _SIZE_COLUMNS if c in header), None)
            ci = next((header.index(c) for c in _COUNT_COLUMNS if c in header), None)
            if si is None:
                raise InputError(
                    f"CSV header needs a 'size' column (as in 'size,count'), got {','.join(row)[:60]!r}",
                    f"{where}:{lineno}",
                )
            need = max(si, ci if ci is not None else 0) + 1
            rows = _TextRows(where, header[si], None if ci is None else header[ci])
            continue
        if len(row) < need:
            raise InputError(f"expected {need} columns as in the header, got {len(row)}", f"{where}:{lineno}")
        assert si is not None and rows is not None  # the header was read above
        size = _parse_int(row[si], f"{where}:{lineno}", header[si])
        rows.add(size, None if ci is None else _parse_int(row[ci], f"{where}:{lineno}", header[ci]), lineno)
    if rows is None:
        raise InputError("trace is empty: CSV has no rows", where)
    return rows.trace("histogram", "trace is empty: CSV has no rows")


def _parse_plain_trace(text: str, where: str) -> PrefillTrace:
    rows = _TextRows(where, "size", None)
    lineno = 0
    for block in text_blocks(text):
        for line in block.splitlines():
            lineno += 1
            s = line.split("#", 1)[0].strip()
            if s:
                rows.add(_parse_int(s, f"{where}:{lineno}", "size"), None, lineno)
    return rows.trace("sizes", "trace is empty: no sizes")
