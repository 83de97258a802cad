"""Calibration: measured prefill times and graph memory of one model on one GPU under one
prefill runner, the input of the time objective. Pure numpy: no torch, no printing.

Two runners, as SGLang names its prefill graph backends (cuda_graph_config.py):
  * breakable (SGLang's default on CUDA): the forward is a chain of captured segments with
    attention run eagerly between them on the real rows only. A batch of n tokens from r
    requests replayed in bucket b costs segments(b) + breaks(n, r); run eagerly it costs
    eager(n, r). segments(b) is measured on a grid of buckets (`rows`), breaks and eager on
    a mix of (n, r) batches (`batches`).
  * full: one whole-forward graph per bucket over one request; a batch costs graph(b)
    replayed, eager(n) not (`rows` hold both; no break cost).

On-disk forms (all read by `load_calibration`):
  * JSON, `format_version` 2, written by `bcgtune calibrate` / `save_calibration`:
      {"format_version": 2, "kind": "bcgtune.calibration", "tool_version", "created",
       "runner": "breakable" | "full",
       "rows": [{"tokens", "graph_ms"[, "eager_ms"]}, ...],       (eager_ms: full only)
       "batches": {"tokens": [...], "requests": [...], "eager_ms": [...], "breaks_ms": [...]}
                  | null,                                          (breakable only)
       "memory": {"pool_gib", "per_graph_gib", "pool_by_tokens": {"tokens", "gib"}} | null,
       "meta": {"gpu": ..., "software": ..., "model": ..., "engine": ...}}
  * JSON `format_version` 1 (earlier bcgtune, whole-forward graphs): read as runner full.
  * CSV with the header `tokens,eager_ms,graph_ms`: runner full.
The JSON is validated by the pydantic models below through bcgtune.core.schema.validate
(errors name the file and the field); every value, read or measured, stays within the
schema's bounds (token counts within SGLang's int32 sizes, finite times below a day).

Between measured rows times are linearly interpolated; beyond them linearly extrapolated
from the two nearest rows (clipped at 0 ms: a time is never negative). A batch (n, r) of the
breakable runner takes its measured value when that pair was measured; otherwise it is
interpolated in n over the measured batches with the same r, inside the span of n they
cover, and elsewhere read from the curve over all measured batches (the mean where several
r share an n; linear beyond its ends, clipped at 0), never extrapolated from one r alone.
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, Optional

import numpy as np
import pydantic
from pydantic import Field

from bcgtune.core.schema import Document, GiB, Milliseconds, Tokens, validate
from bcgtune.errors import InputError
from bcgtune.fileio import csv_rows

FORMAT_VERSION = 2
READ_VERSIONS = (1, 2)
CALIBRATION_KIND = "bcgtune.calibration"
RUNNERS = ("breakable", "full")
Runner = Literal["breakable", "full"]
DEFAULT_RUNNER = "breakable"  # SGLang's default prefill backend on CUDA (cuda_graph_config.py)


def _interp_extrap(x, xs: np.ndarray, ys: np.ndarray) -> np.ndarray:
    """Linear interpolation between rows, linear extrapolation beyond them."""
    x = np.asarray(x, dtype=np.float64)
    if xs.size == 1:
        return np.full(x.shape, float(ys[0]))
    out = np.interp(x, xs, ys)
    lo = x < xs[0]
    hi = x > xs[-1]
    if lo.any():
        slope = (ys[1] - ys[0]) / (xs[1] - xs[0])
        out = np.where(lo, ys[0] + slope * (x - xs[0]), out)
    if hi.any():
        slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])
        out = np.where(hi, ys[-1] + slope * (x - xs[-1]), out)
    return np.maximum(out, 0.0)


@dataclass
class BatchTimes:
    """Measured batches of the breakable runner: n tokens from r requests, eager time and
    break time (everything a replay costs beyond its bucket's segments)."""

    tokens: np.ndarray
    requests: np.ndarray
    eager_ms: np.ndarray
    breaks_ms: np.ndarray

    def __post_init__(self) -> None:
        self.tokens = np.asarray(self.tokens, dtype=np.int64)
        self.requests = np.asarray(self.requests, dtype=np.int64)
        self.eager_ms = np.asarray(self.eager_ms, dtype=np.float64)
        self.breaks_ms = np.asarray(self.breaks_ms, dtype=np.float64)
        if self.tokens.ndim == 1 and self.tokens.shape == self.requests.shape:
            order = np.lexsort((self.requests, self.tokens))
            for name in ("tokens", "requests", "eager_ms", "breaks_ms"):
                arr = getattr(self, name)
                if arr.shape == order.shape:
                    setattr(self, name, arr[order])

    def validate(self, where: str | None) -> None:
        """Equal columns, each value within its schema bound, every (tokens, requests)
        pair possible and measured once."""
        t, r = self.tokens, self.requests
        if t.ndim != 1 or t.size == 0:
            raise InputError("calibration batches are empty", where)
        if not (t.shape == r.shape == self.eager_ms.shape == self.breaks_ms.shape):
            raise InputError("calibration batches columns tokens/requests/eager_ms/breaks_ms differ in length", where)
        _check_column(Tokens, t, "batches.tokens", where)
        if (r < 1).any() or (r > t).any():
            i = int(np.argmax((r < 1) | (r > t)))
            raise InputError(f"batches: {int(t[i])} tokens cannot hold {int(r[i])} requests", where)
        dup = (np.diff(t) == 0) & (np.diff(r) == 0)
        if dup.any():
            i = int(np.argmax(dup))
            raise InputError(f"batches: ({int(t[i])} tokens, {int(r[i])} requests) measured twice", where)
        _check_column(Milliseconds, self.eager_ms, "batches.eager_ms", where)
        _check_column(Milliseconds, self.breaks_ms, "batches.breaks_ms", where)

    def lookup(self, column: str, n, r) -> np.ndarray:
        """`column` at batches (n, r): measured, else interpolated as the module says."""
        ys = getattr(self, column)
        shape = np.broadcast_shapes(np.shape(n), np.shape(r))
        n = np.broadcast_to(np.asarray(n, dtype=np.float64), shape).ravel()
        r = np.broadcast_to(np.asarray(r, dtype=np.int64), shape).ravel()
        out = np.empty(n.shape, dtype=np.float64)
        t = self.tokens.astype(np.float64)
        ux, inv = np.unique(self.tokens, return_inverse=True)
        all_y = np.bincount(inv, weights=ys) / np.bincount(inv)
        out[:] = _interp_extrap(n, ux.astype(np.float64), all_y)
        for rv in np.unique(r):
            mine = self.requests == rv
            if not mine.any():
                continue
            tm, ym = t[mine], ys[mine]
            # this r's own curve inside the span it was measured on (a single point: that
            # point); never extrapolated: beyond its span the all-r curve holds
            inside = (r == rv) & (n >= tm[0]) & (n <= tm[-1])
            if inside.any():
                out[inside] = np.interp(n[inside], tm, ym)
        return out.reshape(shape)


def _check_column(item: Any, values: np.ndarray, name: str, where: str | None) -> None:
    """Every value of a column within its schema type (bcgtune.core.schema: token counts
    within SGLang's int32 sizes, finite times below a day, sizes below a petabyte)."""
    validate(list[item], values.tolist(), where, prefix=(name,))


@dataclass
class Calibration:
    tokens: np.ndarray  # measured bucket sizes, ascending, int64
    eager_ms: np.ndarray | None  # full runner: eager time at each size (one request); breakable: None
    graph_ms: np.ndarray  # full: whole-forward replay of a bucket of that size; breakable: its segments alone
    pool_gib: float | None = None  # memory of the first (largest) graph's pool
    per_graph_gib: float | None = None  # typical extra memory per further graph
    pool_by_tokens: tuple[np.ndarray, np.ndarray] | None = None  # (tokens, GiB) when that bucket is the largest
    meta: dict = field(default_factory=dict)
    runner: str = "full"
    batches: BatchTimes | None = None  # breakable: measured (n, r) batches

    def __post_init__(self) -> None:
        self.tokens = np.asarray(self.tokens, dtype=np.int64)
        if self.eager_ms is not None:
            self.eager_ms = np.asarray(self.eager_ms, dtype=np.float64)
        self.graph_ms = np.asarray(self.graph_ms, dtype=np.float64)
        if self.pool_by_tokens is not None:
            t, g = self.pool_by_tokens
            t = np.asarray(t, dtype=np.int64)
            g = np.asarray(g, dtype=np.float64)
            order = np.argsort(t, kind="stable")
            self.pool_by_tokens = (t[order], g[order])

    # ---- checks ---------------------------------------------------------------------
    def validate(self, where: str | None = None) -> Calibration:
        """The calibration as the time objective needs it: rows, the runner's own table,
        memory; every value within its schema bound."""
        validate(Runner, self.runner, where, prefix=("runner",))
        self._check_rows(where)
        self._check_runner_table(where)
        self._check_memory(where)
        return self

    def _check_rows(self, where: str | None) -> None:
        t, g = self.tokens, self.graph_ms
        if t.ndim != 1 or t.size == 0:
            raise InputError("calibration has no rows", where)
        if t.shape != g.shape:
            raise InputError("calibration columns tokens/graph_ms differ in length", where)
        _check_column(Tokens, t, "tokens", where)
        if (np.diff(t) <= 0).any():
            raise InputError("calibration tokens must be distinct and ascending", where)
        _check_column(Milliseconds, g, "graph_ms", where)

    def _check_runner_table(self, where: str | None) -> None:
        """full: eager time on every row, no batches; breakable: its batches table."""
        if self.runner == "full":
            if self.eager_ms is None or self.eager_ms.shape != self.tokens.shape:
                raise InputError("a full-runner calibration needs eager_ms on every row", where)
            _check_column(Milliseconds, self.eager_ms, "eager_ms", where)
            if self.batches is not None:
                raise InputError("a full-runner calibration has no batches table", where)
        elif self.batches is None:
            raise InputError("a breakable-runner calibration needs its batches table", where)
        else:
            self.batches.validate(where)

    def _check_memory(self, where: str | None) -> None:
        sizes = {"pool_gib": self.pool_gib, "per_graph_gib": self.per_graph_gib}
        validate(_Memory, {k: v if v is None else float(v) for k, v in sizes.items()}, where, prefix=("memory",))
        if self.pool_by_tokens is not None:
            pt, pg = self.pool_by_tokens
            if pt.shape != pg.shape or pt.size == 0:
                raise InputError("memory.pool_by_tokens tokens and gib differ in length or are empty", where)
            _check_column(Tokens, pt, "memory.pool_by_tokens.tokens", where)
            if (np.diff(pt) <= 0).any():
                raise InputError("memory.pool_by_tokens tokens must be distinct and ascending", where)
            _check_column(GiB, pg, "memory.pool_by_tokens.gib", where)

    # ---- the model the optimizer uses -----------------------------------------------
    def _eager_column(self) -> np.ndarray:
        """The full runner's eager time per row (validate guarantees it there)."""
        if self.eager_ms is None:
            raise InputError(f"a {self.runner}-runner calibration has no eager time per row")
        return self.eager_ms

    def eager_time(self, n, requests=1) -> np.ndarray:
        """Eager prefill time (ms) of a batch of n forward tokens from `requests` requests
        (the full runner measured one request per batch and ignores it)."""
        if self.runner == "full" or self.batches is None:
            return _interp_extrap(n, self.tokens.astype(np.float64), self._eager_column())
        return self.batches.lookup("eager_ms", n, requests)

    def break_time(self, n, requests=1) -> np.ndarray:
        """What a replay of a batch (n tokens, `requests` requests) costs beyond its bucket's
        segments: the eager breaks on the real rows (0 for the full runner). Independent of
        the bucket, which is what keeps the time objective's DP exact."""
        if self.runner == "full" or self.batches is None:
            return np.zeros(np.shape(n), dtype=np.float64)
        return self.batches.lookup("breaks_ms", n, requests)

    def graph_time(self, b) -> np.ndarray:
        """Replay time (ms) of the graph captured for bucket b (padding included): the whole
        forward (full runner) or its segments alone (breakable)."""
        return _interp_extrap(b, self.tokens.astype(np.float64), self.graph_ms)

    def candidate_tokens(self) -> np.ndarray:
        """The measured sizes the time objective may pick buckets among: every row but the
        sizes added to a grid only to be priced (`calibrate --grid ... --sizes LIST`, recorded
        as meta `sizes_added`: a list to compare, such as the one a server runs now). Picking
        among one-off sizes would favour whichever measured low by noise."""
        added = self.meta.get("sizes_added") if isinstance(self.meta, dict) else None
        if not added or not isinstance(added, list):
            return self.tokens.astype(np.int64)
        keep = ~np.isin(
            self.tokens,
            np.asarray([a for a in added if isinstance(a, int) and not isinstance(a, bool) and 0 < a < 2**31], dtype=np.int64),
        )
        if not keep.any():  # only added sizes: they are all there is to pick among
            return self.tokens.astype(np.int64)
        return self.tokens[keep].astype(np.int64)

    @property
    def has_memory(self) -> bool:
        return self.pool_gib is not None or self.pool_by_tokens is not None

    def pool_gib_at(self, b: int) -> float:
        """Pool size (GiB) when bucket b is the largest graph."""
        if self.pool_by_tokens is not None:
            pt, pg = self.pool_by_tokens
            return float(_interp_extrap(b, pt.astype(np.float64), pg))
        if self.pool_gib is None:
            raise InputError("calibration has no graph memory data (rerun bcgtune calibrate on a GPU)")
        return float(self.pool_gib)

    def graph_memory_gib(self, buckets: list[int]) -> float:
        """Memory of a bucket list captured largest first into one pool:
        pool(max bucket) + (k - 1) * per_graph."""
        if not self.has_memory:
            raise InputError("calibration has no graph memory data (rerun bcgtune calibrate on a GPU)")
        bl = [int(b) for b in buckets]
        if not bl:
            return 0.0
        per = self.per_graph_gib or 0.0
        return self.pool_gib_at(max(bl)) + (len(bl) - 1) * per

    # ---- serialisation --------------------------------------------------------------
    def to_json_obj(self) -> dict[str, Any]:
        from bcgtune.core.document import document_header

        memory: dict[str, Any] | None = None
        if self.has_memory or self.per_graph_gib is not None:
            memory = {"pool_gib": self.pool_gib, "per_graph_gib": self.per_graph_gib, "pool_by_tokens": None}
            if self.pool_by_tokens is not None:
                memory["pool_by_tokens"] = {
                    "tokens": self.pool_by_tokens[0].tolist(),
                    "gib": [round(float(x), 6) for x in self.pool_by_tokens[1]],
                }
        rows = []
        for i, (t, g) in enumerate(zip(self.tokens, self.graph_ms)):
            row = {"tokens": int(t), "graph_ms": round(float(g), 4)}
            if self.runner == "full":
                row["eager_ms"] = round(float(self._eager_column()[i]), 4)
            rows.append(row)
        batches = None
        if self.batches is not None:
            bt = self.batches
            batches = {
                "tokens": bt.tokens.tolist(),
                "requests": bt.requests.tolist(),
                "eager_ms": [round(float(x), 4) for x in bt.eager_ms],
                "breaks_ms": [round(float(x), 4) for x in bt.breaks_ms],
            }
        return {
            **document_header(CALIBRATION_KIND, FORMAT_VERSION),
            "runner": self.runner,
            "rows": rows,
            "batches": batches,
            "memory": memory,
            "meta": self.meta,
        }


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


def load_calibration(path) -> Calibration:
    """Read a calibration JSON (from `bcgtune calibrate`) or a `tokens,eager_ms,graph_ms` CSV.
    Errors name the file and the line or field."""
    from bcgtune.fileio import decode_text, display_path, read_input

    what = "calibration (JSON from bcgtune calibrate, or a tokens,eager_ms,graph_ms CSV)"
    path = display_path(str(path))
    text = decode_text(read_input(path, what, limit=256 << 20), path, what)
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
    """A table stored as columns: every column as long as the others."""

    @pydantic.model_validator(mode="after")
    def _same_length(self):
        names = list(type(self).model_fields)
        if len({len(getattr(self, n)) for n in names}) > 1:
            raise ValueError(f"columns {'/'.join(names)} differ in length")
        return self


class _BatchColumns(_Columns):
    tokens: list[Tokens]
    requests: list[Tokens]
    eager_ms: list[Milliseconds]
    breaks_ms: list[Milliseconds]


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


def _format_version(obj: Any, path: str) -> int:
    """The document's format_version when this bcgtune reads it; a calibration of another
    version is refused with the versions it reads (other documents by check_header)."""
    from bcgtune.core.document import check_header

    version = obj.get("format_version") if isinstance(obj, dict) else None
    if isinstance(version, bool) or version not in READ_VERSIONS:
        if isinstance(obj, dict) and obj.get("kind") in (None, CALIBRATION_KIND):
            raise InputError(
                f"unsupported calibration format_version {str(version)[:20]!r} "
                f"(this bcgtune reads {' and '.join(map(str, READ_VERSIONS))}); rerun bcgtune calibrate",
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
    doc = validate(_BreakableDocument if runner == "breakable" else _FullDocument, obj, path)
    meta = dict(doc.meta or {})
    for key in ("tool_version", "created"):
        if key in obj:
            meta.setdefault(key, obj[key])
    meta.setdefault("format_version", version)
    return _calibration_from(doc, runner, meta)


def _calibration_from(doc: _FullDocument | _BreakableDocument, runner: str, meta: dict) -> Calibration:
    """The validated document as a Calibration, rows sorted by tokens."""
    rows: list[_FullRow | _SegmentRow] = sorted(doc.rows, key=lambda row: row.tokens)
    eager = np.asarray([row.eager_ms for row in rows if isinstance(row, _FullRow)], dtype=np.float64)
    batches = None
    if isinstance(doc, _BreakableDocument):
        b = doc.batches
        batches = BatchTimes(np.asarray(b.tokens), np.asarray(b.requests), np.asarray(b.eager_ms), np.asarray(b.breaks_ms))
    mem = doc.memory or _Memory()
    pbt = None
    if mem.pool_by_tokens is not None:
        pbt = (np.asarray(mem.pool_by_tokens.tokens, dtype=np.int64), np.asarray(mem.pool_by_tokens.gib, dtype=np.float64))
    return Calibration(
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
        try:
            tok = int(tok_s)
        except ValueError:
            raise InputError(f"field tokens {tok_s!r} is not an integer", f"{path}:{lineno}") from None
        if tok <= 0:
            raise InputError(f"field tokens must be positive, got {tok}", f"{path}:{lineno}")
        vals = []
        for name, cell in (("eager_ms", row[1]), ("graph_ms", row[2])):
            c = cell.strip()
            try:
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
