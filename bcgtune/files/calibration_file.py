"""Calibration files: reading and writing what `bcgtune calibrate` measures
(bcgtune.core.plan.calibration.Calibration, which owns its JSON document and its checks).

On-disk forms (all read by `load_calibration`):
  * JSON, `format_version` 3, written by `bcgtune calibrate` / `save_calibration`:
      {"format_version": 3, "kind": "bcgtune.calibration", "tool_version", "created",
       "runner": "breakable" | "full", "rounds": R,
       "rows": [{"tokens", "graph_ms", "graph_rounds_ms": [R][, "eager_ms", "eager_rounds_ms"],
                 "session"}, ...],                                   (eager_*: full only)
       "batches": {"tokens": [...], "requests": [...], "eager_ms": [...], "breaks_ms": [...],
                   "eager_rounds_ms": [[R], ...], "breaks_rounds_ms": [[R], ...],
                   "eager_host_ms": [...] | null} | null,            (breakable only)
       "memory": {"pool_gib", "per_graph_gib", "pool_by_tokens": {"tokens", "gib"}} | null,
       "sessions": [{"kind": "calibration" | "extension", "created", "tool_version",
                     "rounds", "warmup", "sizes", "anchors", "scale_graph", "scale_eager"}],
       "engine_options": {...} | null,   (what `calibrate --extend` rebuilds the engine from)
       "meta": {"gpu": ..., "software": ..., "model": ..., "engine": ...}}
    A row's median equals the median of its rounds (a break time: the median of its paired
    differences, clipped at 0 ms; a round's difference may be negative). Rows added later
    by `calibrate --extend` carry the index of the session that measured them.
  * JSON `format_version` 4: as 3, plus "model_check" (null, or the time model checked against
    a replay of the trace: {"batches", "of", "every", "rounds", "ordered", "device", "created",
    "lists": [{"name", "buckets", "predicted_ms", "measured_ms", "round_totals_ms"}, ...]};
    bcgtune.core.plan.model_check). Format 3 reads as "model error not checked".
  * JSON `format_version` 2: as 3 without rounds, sessions or engine options.
  * JSON `format_version` 1 (earlier bcgtune, whole-forward graphs): read as runner full.
  * CSV with the header `tokens,eager_ms,graph_ms`: runner full.
The JSON is validated by the pydantic models below through bcgtune.core.schema.validate
(errors name the file and the field); every value, read or measured, stays within the
schema's bounds (token counts within SGLang's int32 sizes, finite times below a day).
"""

from __future__ import annotations

import io
import json
from typing import Annotated, Any, Literal, Optional

import numpy as np
import pydantic
from pydantic import Field

from bcgtune.core.plan.calibration import (
    CALIBRATION_KIND,
    FORMAT_VERSION,
    ROUNDS_MAX,
    BatchTimes,
    Calibration,
    Runner,
    SignedMilliseconds,
)
from bcgtune.core.schema import TOKENS_MAX, Document, GiB, Milliseconds, NonNegativeInt, Tokens, validate
from bcgtune.errors import InputError, quote
from bcgtune.fileio import csv_rows

READ_VERSIONS = (1, 2, 3, 4)


def save_calibration(cal: Calibration, path) -> None:
    """Atomic write: `tokens,eager_ms,graph_ms` CSV when the path ends in .csv, else JSON."""
    from bcgtune.fileio import atomic_write_text

    cal.validate(str(path))
    if str(path).lower().removesuffix(".gz").endswith(".csv"):
        if cal.runner != "full":
            raise InputError(
                "a breakable-runner calibration is written as JSON only "
                "(its per-batch table does not fit tokens,eager_ms,graph_ms)",
                str(path),
            )
        buf = io.StringIO()
        buf.write("tokens,eager_ms,graph_ms\n")
        for t, e, g in zip(cal.tokens, cal._eager_column(), cal.graph_ms):
            buf.write(f"{int(t)},{float(e):.4f},{float(g):.4f}\n")
        atomic_write_text(path, buf.getvalue())
    else:
        atomic_write_text(path, json.dumps(cal.to_json_obj(), indent=1) + "\n")


# A calibration measures at most a few thousand sizes (tens of kB to a few MB): a file larger,
# or a CSV of more sizes, is not one (and the bound keeps what reading it holds in memory small)
CALIBRATION_MAX_BYTES = 64 << 20
CALIBRATION_MAX_ROWS = 1 << 20


def load_calibration(path) -> Calibration:
    """Read a calibration JSON (from `bcgtune calibrate`) or a `tokens,eager_ms,graph_ms` CSV.
    Errors name the file and the line or field."""
    from bcgtune.fileio import decode_text, display_path, read_input

    what = "calibration (JSON from bcgtune calibrate, or a tokens,eager_ms,graph_ms CSV)"
    path = display_path(str(path))
    text = decode_text(read_input(path, what, limit=CALIBRATION_MAX_BYTES), path, what)
    if not text.strip():
        raise InputError("calibration file is empty", path)
    if text.lstrip().startswith("{"):
        cal = _parse_json(text, path)
    else:
        cal = _parse_csv(text, path)
    cal.validate(path)
    cal.meta.setdefault("source", path)
    return cal


# ---- the JSON document, as bcgtune.core.schema validates it ---------------------------
class _FullRow(Document):
    """A size of the full runner: eager time (one request) and whole-forward replay."""

    tokens: Tokens
    eager_ms: Milliseconds
    graph_ms: Milliseconds


class _SegmentRow(Document):
    """A bucket of the breakable runner: the replay time of its segments alone."""

    tokens: Tokens
    graph_ms: Milliseconds


class _Columns(Document):
    """A table stored as columns: every column as long as the others (an optional column
    left out or null is not compared)."""

    @pydantic.model_validator(mode="after")
    def _same_length(self):
        names = [n for n in type(self).model_fields if getattr(self, n) is not None]
        if len({len(getattr(self, n)) for n in names}) > 1:
            raise ValueError(f"columns {'/'.join(names)} differ in length")
        return self


class _BatchColumns(_Columns):
    tokens: list[Tokens]
    requests: list[Tokens]
    eager_ms: list[Milliseconds]
    breaks_ms: list[Milliseconds]


Rounds = Annotated[list[Milliseconds], Field(min_length=1, max_length=ROUNDS_MAX)]
SignedRounds = Annotated[list[SignedMilliseconds], Field(min_length=1, max_length=ROUNDS_MAX)]
RoundCount = Annotated[int, Field(strict=True, ge=1, le=ROUNDS_MAX)]
Scale = Annotated[float, Field(strict=True, gt=0, le=1e3, allow_inf_nan=False)]


class _FullRow3(_FullRow):
    """Format 3: a size of the full runner with each timed round's values."""

    eager_rounds_ms: Rounds
    graph_rounds_ms: Rounds
    session: NonNegativeInt = 0


class _SegmentRow3(_SegmentRow):
    """Format 3: a bucket of the breakable runner with each timed round's segment time."""

    graph_rounds_ms: Rounds
    session: NonNegativeInt = 0


class _BatchColumns3(_BatchColumns):
    eager_rounds_ms: list[Rounds]
    breaks_rounds_ms: list[SignedRounds]
    eager_host_ms: Optional[list[Milliseconds]] = None


class _Session(Document):
    """One run that measured rows: the calibration, or a `calibrate --extend` of it."""

    kind: Literal["calibration", "extension"]
    created: Optional[str] = None
    tool_version: Optional[str] = None
    rounds: RoundCount
    warmup: Optional[NonNegativeInt] = None
    sizes: list[Tokens] = []
    anchors: list[Tokens] = []
    scale_graph: Optional[Scale] = None
    scale_eager: Optional[Scale] = None


class _PoolByTokens(_Columns):
    tokens: list[Tokens]
    gib: list[GiB]


class _Memory(Document):
    pool_gib: Optional[GiB] = None
    per_graph_gib: Optional[GiB] = None
    pool_by_tokens: Optional[_PoolByTokens] = None


class _FullDocument(Document):
    """Format 1 (whole-forward graphs), and format 2 with runner full."""

    rows: Annotated[list[_FullRow], Field(min_length=1)]
    batches: None = None
    memory: Optional[_Memory] = None
    meta: Optional[dict[str, Any]] = None

    @pydantic.field_validator("batches", mode="before")
    @classmethod
    def _no_batches(cls, v):
        if v is not None:
            raise ValueError("belongs to a breakable-runner calibration (runner is full)")
        return v


class _BreakableDocument(Document):
    """Format 2 with runner breakable: segment replay per bucket, eager and break time per batch."""

    rows: Annotated[list[_SegmentRow], Field(min_length=1)]
    batches: _BatchColumns
    memory: Optional[_Memory] = None
    meta: Optional[dict[str, Any]] = None


class _ListCheck(Document):
    """One list of the model check: predicted and measured total on the replayed sample."""

    name: Annotated[str, Field(min_length=1, max_length=200)]
    buckets: Annotated[list[Tokens], Field(max_length=100_000)]
    predicted_ms: Milliseconds
    measured_ms: Milliseconds
    round_totals_ms: Annotated[list[Milliseconds], Field(max_length=ROUNDS_MAX)] = []
    bias: Optional[float] = None  # derived, written for readers; recomputed on load
    se: Optional[float] = None


class _ModelCheck(Document):
    """Format 4: the time model against a replay of the trace's batches in order."""

    batches: Annotated[int, Field(strict=True, ge=1, le=10**9)]
    of: Annotated[int, Field(strict=True, ge=1, le=10**12)]
    every: Annotated[int, Field(strict=True, ge=1, le=10**12)]
    rounds: RoundCount
    ordered: bool = True
    device: Optional[Annotated[str, Field(max_length=200)]] = None
    created: Optional[Annotated[str, Field(max_length=64)]] = None
    total_margin: Optional[float] = None  # derived, recomputed on load
    difference_margin: Optional[float] = None
    eager_margin: Optional[float] = None
    lists: Annotated[list[_ListCheck], Field(min_length=2, max_length=64)]


class _Rounds3(Document):
    """What format 3 adds to every document: the timed rounds, the sessions, the engine
    (and format 4 the model check)."""

    rounds: RoundCount
    sessions: Annotated[list[_Session], Field(min_length=1, max_length=10_000)]
    engine_options: Optional[dict[str, Any]] = None
    model_check: Optional[_ModelCheck] = None


class _FullDocument3(_FullDocument, _Rounds3):
    rows: Annotated[list[_FullRow3], Field(min_length=1)]  # type: ignore[assignment]


class _BreakableDocument3(_BreakableDocument, _Rounds3):
    rows: Annotated[list[_SegmentRow3], Field(min_length=1)]  # type: ignore[assignment]
    batches: _BatchColumns3


def _format_version(obj: Any, path: str) -> int:
    """The document's format_version when this bcgtune reads it; a calibration of another
    version is refused with the versions it reads (other documents by check_header)."""
    from bcgtune.core.document import check_header

    version = obj.get("format_version") if isinstance(obj, dict) else None
    if isinstance(version, bool) or version not in READ_VERSIONS:
        if isinstance(obj, dict) and obj.get("kind") in (None, CALIBRATION_KIND):
            raise InputError(
                f"unsupported calibration format_version {str(version)[:20]!r} "
                f"(this bcgtune reads {', '.join(map(str, READ_VERSIONS[:-1]))} and {READ_VERSIONS[-1]}); "
                "rerun bcgtune calibrate",
                path,
            )
        version = FORMAT_VERSION  # check_header names what else is wrong: not an object, another kind
    check_header(obj, CALIBRATION_KIND, version, "calibration", path)
    return int(version)


def _parse_json(text: str, path: str) -> Calibration:
    from bcgtune.fileio import parse_json

    obj = parse_json(text, path)
    version = _format_version(obj, path)
    # version 1: whole-forward graphs, the full runner
    runner = validate(Runner, obj.get("runner", "full"), path, prefix=("runner",)) if version >= 2 else "full"
    if version >= 3:
        model: type[Document] = _BreakableDocument3 if runner == "breakable" else _FullDocument3
    else:
        model = _BreakableDocument if runner == "breakable" else _FullDocument
    doc = validate(model, obj, path)
    meta = dict(doc.meta or {})
    for key in ("tool_version", "created"):
        if key in obj:
            meta.setdefault(key, obj[key])
    meta.setdefault("format_version", version)
    return _calibration_from(doc, runner, meta, path)


def _calibration_from(doc, runner: str, meta: dict, path: str) -> Calibration:
    """The validated document as a Calibration, rows sorted by tokens."""
    rows = sorted(doc.rows, key=lambda row: row.tokens)
    eager = np.asarray([row.eager_ms for row in rows if isinstance(row, _FullRow)], dtype=np.float64)
    v3 = isinstance(doc, _Rounds3)
    batches = None
    if isinstance(doc, _BreakableDocument):
        b = doc.batches
        batches = BatchTimes(np.asarray(b.tokens), np.asarray(b.requests), np.asarray(b.eager_ms), np.asarray(b.breaks_ms))
        if isinstance(b, _BatchColumns3):
            batches.eager_rounds = _round_matrix(b.eager_rounds_ms, "batches.eager_rounds_ms", path)
            batches.breaks_rounds = _round_matrix(b.breaks_rounds_ms, "batches.breaks_rounds_ms", path)
            batches.eager_host_ms = None if b.eager_host_ms is None else np.asarray(b.eager_host_ms, dtype=np.float64)
            batches.__post_init__()  # sorted with their batches
    mem = doc.memory or _Memory()
    pbt = None
    if mem.pool_by_tokens is not None:
        pbt = (np.asarray(mem.pool_by_tokens.tokens, dtype=np.int64), np.asarray(mem.pool_by_tokens.gib, dtype=np.float64))
    cal = Calibration(
        tokens=np.asarray([row.tokens for row in rows], dtype=np.int64),
        eager_ms=eager if runner == "full" else None,
        graph_ms=np.asarray([row.graph_ms for row in rows], dtype=np.float64),
        pool_gib=mem.pool_gib,
        per_graph_gib=mem.per_graph_gib,
        pool_by_tokens=pbt,
        meta=meta,
        runner=runner,
        batches=batches,
    )
    if v3:
        if any(len(row.graph_rounds_ms) != doc.rounds for row in rows):
            raise InputError(f"every row must keep {doc.rounds} rounds (the document's rounds)", path)
        cal.graph_rounds = _round_matrix([row.graph_rounds_ms for row in rows], "rows.graph_rounds_ms", path)
        if runner == "full":
            cal.eager_rounds = _round_matrix([row.eager_rounds_ms for row in rows], "rows.eager_rounds_ms", path)
        cal.row_session = np.asarray([row.session for row in rows], dtype=np.int64)
        cal.sessions = [s.model_dump() for s in doc.sessions]
        cal.engine_options = doc.engine_options
        if doc.model_check is not None:
            from bcgtune.core.plan.model_check import ModelCheck

            if meta.get("format_version", FORMAT_VERSION) < 4:
                raise InputError("model_check belongs to a format-4 calibration (this one says format 3)", path)
            cal.model_check = ModelCheck.from_json(doc.model_check.model_dump(), path)
    return cal


def _round_matrix(lists, name: str, where: str) -> np.ndarray:
    """Lists of rounds as a (values x rounds) matrix: every list as long as the others."""
    if len({len(x) for x in lists}) > 1:
        raise InputError(f"{name}: every value must keep as many rounds as the others", where)
    return np.asarray(lists, dtype=np.float64).reshape(len(lists), -1)


def _parse_csv(text: str, path: str) -> Calibration:
    header = None
    rows: dict[int, tuple[float, float, int]] = {}
    for lineno, row in csv_rows(text, path):
        if header is None:
            # columns found by name, in any order; other columns are ignored
            header = [h.strip().lower() for h in row]
            missing = [c for c in ("tokens", "eager_ms", "graph_ms") if c not in header]
            if missing:
                raise InputError(
                    f"CSV header needs columns tokens,eager_ms,graph_ms (missing {','.join(missing)}), got {','.join(row)!r}",
                    f"{path}:{lineno}",
                )
            cols = [header.index(c) for c in ("tokens", "eager_ms", "graph_ms")]
            continue
        if len(row) <= max(cols):
            raise InputError(f"expected {max(cols) + 1} columns as in the header, got {len(row)}", f"{path}:{lineno}")
        row = [row[i] for i in cols]
        tok_s = row[0].strip()
        if len(rows) >= CALIBRATION_MAX_ROWS:
            raise InputError(f"more than {CALIBRATION_MAX_ROWS:,} rows: not a calibration", f"{path}:{lineno}")
        try:
            if not tok_s.isascii():  # int() also reads '１'
                raise ValueError(tok_s)
            tok = int(tok_s)
        except ValueError:
            raise InputError(f"field tokens {quote(tok_s)} is not an integer", f"{path}:{lineno}") from None
        if not 1 <= tok <= TOKENS_MAX:
            raise InputError(f"field tokens must be within 1..{TOKENS_MAX:,}, got {quote(tok_s, 40)}", f"{path}:{lineno}")
        vals = []
        for name, cell in (("eager_ms", row[1]), ("graph_ms", row[2])):
            c = cell.strip()
            try:
                if not c.isascii():
                    raise ValueError(c)
                v = float(c)
            except ValueError:
                raise InputError(f"field {name} {c!r} is not a number", f"{path}:{lineno}") from None
            vals.append(validate(Milliseconds, v, f"{path}:{lineno}", prefix=(name,)))
        if tok in rows:
            raise InputError(f"tokens {tok} repeated (first on line {rows[tok][2]})", f"{path}:{lineno}")
        rows[tok] = (vals[0], vals[1], lineno)
    if header is None:
        raise InputError("calibration CSV has no header 'tokens,eager_ms,graph_ms'", path)
    if not rows:
        raise InputError("calibration CSV has no rows", path)
    toks = sorted(rows)
    return Calibration(
        tokens=np.asarray(toks, dtype=np.int64),
        eager_ms=np.asarray([rows[t][0] for t in toks]),
        graph_ms=np.asarray([rows[t][1] for t in toks]),
        meta={"format": "csv"},
        runner="full",
    )
