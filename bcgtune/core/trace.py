"""PrefillTrace: a workload's prefill forward sizes, the input of every optimizer.

A trace is at heart a histogram of forward token counts (`sizes`, `counts`). Traces parsed
from logs or simulated also carry compact per-batch columns (numpy arrays of equal length)
and provenance (sources with sha256, parse statistics, captured buckets, simulation
parameters). Pure data: no printing, no flags, no torch/sglang.

On-disk forms (all readable by `load_trace`):
  * JSON, `format_version` 1 (written by `save_trace`):
      {"format_version": 1, "kind": "bcgtune.prefill-trace", "tool_version": ...,
       "created": ISO-8601, "origin": "sglang-log" | "simulation" | "histogram" | ...,
       "sources": [{"path", "sha256", "bytes", ...}], "parse_stats": {...},
       "captures": [...], "meta": {...},
       "histogram": {"sizes": [...], "counts": [...]},
       "batches": {"forward_tokens": [...], "<column>": [...], ...} | null}
  * CSV with the header `size,count` (one row per distinct size);
  * plain text, one forward size per line (blank lines and `#` comments skipped).
"""

from __future__ import annotations

import csv
import datetime as _dt
import io
import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from bcgtune.errors import InputError

FORMAT_VERSION = 1
TRACE_KIND = "bcgtune.prefill-trace"

# Per-batch columns a trace may carry, with their numpy dtype. Flags use -1 for "unknown".
BATCH_COLUMNS: dict[str, str] = {
    "forward_tokens": "int64",  # tokens in the forward pass: what picks the bucket
    "new_seq": "int64",
    "new_token": "int64",
    "cached_token": "int64",
    "running_req": "int64",
    "queue_req": "int64",
    "replay_token": "int64",
    "graph": "int8",  # 1 replayed, 0 eager, -1 unknown (line carried no flag)
    "images": "int8",  # 1 batch carries image inputs, 0 not, -1 unknown
    "source": "int32",  # index into `sources`
    "line": "int64",  # 1-based physical line of the record in its source
    "timestamp": "float64",  # seconds since epoch (or since midnight for time-only prefixes); NaN if absent
    "rank": "int32",  # index into meta["ranks"] (e.g. "TP0", "DP7 TP7"); -1 if none
    "time_s": "float64",  # simulated start time of the batch
}


@dataclass
class PrefillTrace:
    sizes: np.ndarray  # distinct forward sizes, ascending, int64, > 0
    counts: np.ndarray  # batches per size, int64, > 0
    batches: dict[str, np.ndarray] | None = None
    origin: str = "histogram"
    sources: list[dict[str, Any]] = field(default_factory=list)
    parse_stats: dict[str, Any] = field(default_factory=dict)
    captures: list[dict[str, Any]] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)

    # ---- construction -------------------------------------------------------------
    @classmethod
    def from_sizes(cls, forward_tokens, **kw) -> "PrefillTrace":
        """Histogram from per-batch forward sizes (any iterable of ints)."""
        arr = np.asarray(forward_tokens, dtype=np.int64)
        if arr.ndim != 1:
            raise InputError("forward sizes must be a flat list")
        sizes, counts = np.unique(arr, return_counts=True) if arr.size else (arr, arr)
        return cls(sizes=sizes.astype(np.int64), counts=counts.astype(np.int64), **kw)

    @classmethod
    def from_batches(cls, batches: dict[str, Any], **kw) -> "PrefillTrace":
        cols = {}
        n = None
        for name, values in batches.items():
            if name not in BATCH_COLUMNS:
                raise InputError(f"unknown batch column {name!r}")
            arr = np.asarray(values, dtype=BATCH_COLUMNS[name])
            if n is None:
                n = len(arr)
            elif len(arr) != n:
                raise InputError(f"batch column {name!r} has {len(arr)} rows, expected {n}")
            cols[name] = arr
        if "forward_tokens" not in cols:
            raise InputError("batches need a forward_tokens column")
        t = cls.from_sizes(cols["forward_tokens"], **kw)
        t.batches = cols
        return t

    # ---- views --------------------------------------------------------------------
    @property
    def n_batches(self) -> int:
        return int(self.counts.sum())

    @property
    def n_tokens(self) -> int:
        return int((self.sizes * self.counts).sum())

    def percentile(self, q: float) -> int:
        """Nearest-rank percentile of the per-batch forward size."""
        if self.n_batches == 0:
            raise InputError("trace is empty")
        cum = np.cumsum(self.counts)
        rank = max(1, int(np.ceil(q / 100.0 * cum[-1])))
        return int(self.sizes[np.searchsorted(cum, rank)])

    def validate(self, where: str | None = None) -> "PrefillTrace":
        s, c = self.sizes, self.counts
        if s.size == 0:
            raise InputError("trace is empty: no prefill batches", where)
        if s.shape != c.shape:
            raise InputError("histogram sizes and counts differ in length", where)
        if (s <= 0).any():
            raise InputError(f"forward size must be positive, got {int(s[s <= 0][0])}", where)
        if (c <= 0).any():
            raise InputError(f"count must be positive, got {int(c[c <= 0][0])}", where)
        if (np.diff(s) <= 0).any():
            raise InputError("histogram sizes must be distinct and ascending", where)
        return self

    # ---- serialisation ------------------------------------------------------------
    def to_json_obj(self) -> dict[str, Any]:
        from bcgtune import __version__

        return {
            "format_version": FORMAT_VERSION,
            "kind": TRACE_KIND,
            "tool": "bcgtune",
            "tool_version": __version__,
            "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "origin": self.origin,
            "sources": self.sources,
            "parse_stats": self.parse_stats,
            "captures": self.captures,
            "meta": self.meta,
            "summary": {
                "batches": self.n_batches,
                "distinct_sizes": int(self.sizes.size),
                "tokens": self.n_tokens,
            },
            "histogram": {"sizes": self.sizes.tolist(), "counts": self.counts.tolist()},
            "batches": None
            if self.batches is None
            else {k: _column_to_json(v) for k, v in self.batches.items()},
        }

    def to_csv(self) -> str:
        buf = io.StringIO()
        buf.write("size,count\n")
        for s, c in zip(self.sizes.tolist(), self.counts.tolist()):
            buf.write(f"{s},{c}\n")
        return buf.getvalue()


def _column_to_json(arr: np.ndarray) -> list:
    if arr.dtype.kind == "f":
        return [None if np.isnan(x) else round(float(x), 3) for x in arr.tolist()]
    return arr.tolist()


def save_trace(trace: PrefillTrace, path: str) -> None:
    """Write atomically: `size,count` CSV when `path` ends in .csv, else versioned JSON."""
    from bcgtune.fileio import atomic_write_text

    if str(path).lower().endswith(".csv"):
        atomic_write_text(path, trace.to_csv())
    else:
        atomic_write_text(path, json.dumps(trace.to_json_obj(), separators=(",", ":")) + "\n")


def load_trace(path: str) -> PrefillTrace:
    """Read a JSON trace, a `size,count` CSV, or a plain one-size-per-line file.
    Errors name the file (and line or field)."""
    from bcgtune.fileio import open_binary

    fh = open_binary(path)
    try:
        data = fh.read()
    except OSError as exc:
        raise InputError(f"cannot read: {exc}", path) from None
    finally:
        if path != "-":
            fh.close()
    try:
        text = data.decode("utf-8-sig")  # a BOM from spreadsheet exports is dropped
    except UnicodeDecodeError:
        raise InputError("not a text file (expected a JSON trace, size,count CSV or one size per line)", path) from None
    stripped = text.lstrip()
    if not stripped:
        raise InputError("trace is empty", path)
    if stripped.startswith("{"):
        trace = _parse_json_trace(text, path)
    elif stripped.startswith("["):
        trace = _parse_json_list(text, path)
    else:
        first = stripped.splitlines()[0].strip().lower().replace(" ", "")
        if "," in first or first.startswith(_SIZE_COLUMNS):
            trace = _parse_csv_trace(text, path)
        else:
            trace = _parse_plain_trace(text, path)
    trace.validate(path)
    if not trace.sources:
        trace.sources = [{"path": path}]
    return trace


def _parse_json_trace(text: str, path: str) -> PrefillTrace:
    from bcgtune.fileio import check_versioned, loads_json

    obj = check_versioned(loads_json(text, path), TRACE_KIND, FORMAT_VERSION, "prefill trace", path)
    hist = obj.get("histogram")
    if not isinstance(hist, dict) or "sizes" not in hist or "counts" not in hist:
        raise InputError("missing field histogram.sizes / histogram.counts", path)
    sizes = _int_array(hist["sizes"], path, "histogram.sizes")
    counts = _int_array(hist["counts"], path, "histogram.counts")
    if sizes.shape != counts.shape:
        raise InputError("histogram.sizes and histogram.counts differ in length", path)
    order = np.argsort(sizes, kind="stable")
    sizes, counts = sizes[order], counts[order]
    batches = None
    raw_batches = obj.get("batches")
    if raw_batches:
        if not isinstance(raw_batches, dict):
            raise InputError("field batches must be an object of columns", path)
        batches = {}
        for name, values in raw_batches.items():
            if name not in BATCH_COLUMNS:
                continue  # columns from a newer writer are kept out, not fatal
            if not isinstance(values, list):
                raise InputError(f"batches.{name} must be a list", path)
            dtype = BATCH_COLUMNS[name]
            if dtype.startswith("float"):
                batches[name] = np.array([np.nan if v is None else v for v in values], dtype=dtype)
            else:
                batches[name] = _int_array(values, path, f"batches.{name}", dtype=dtype)
    return PrefillTrace(
        sizes=sizes,
        counts=counts,
        batches=batches,
        origin=str(obj.get("origin", "histogram")),
        sources=list(obj.get("sources") or []),
        parse_stats=dict(obj.get("parse_stats") or {}),
        captures=list(obj.get("captures") or []),
        meta=dict(obj.get("meta") or {}),
    )


def _int_array(values, path: str, fieldname: str, dtype: str = "int64") -> np.ndarray:
    if not isinstance(values, list):
        raise InputError(f"field {fieldname} must be a list", path)
    for v in values:
        if isinstance(v, bool) or not isinstance(v, int):
            raise InputError(f"field {fieldname} holds a non-integer value {v!r}", path)
    return np.asarray(values, dtype=dtype)


def _parse_int(token: str, path: str, lineno: int, what: str) -> int:
    t = token.strip()
    try:
        v = int(t)
    except ValueError:
        try:
            f = float(t)
        except ValueError:
            raise InputError(f"{what} {t!r} is not an integer", f"{path}:{lineno}") from None
        if not f.is_integer():
            raise InputError(f"{what} {t!r} is not an integer", f"{path}:{lineno}") from None
        v = int(f)
    if v <= 0:
        raise InputError(f"{what} must be positive, got {v}", f"{path}:{lineno}")
    return v


_SIZE_COLUMNS = ("size", "tokens", "num_tokens", "forward_tokens")
_COUNT_COLUMNS = ("count", "batches")


def _parse_csv_trace(text: str, path: str) -> PrefillTrace:
    """`size,count` rows (columns found by name, in any order, others ignored; `tokens` is
    taken for `size`; without a count column each row is one batch)."""
    rows = csv.reader(io.StringIO(text))
    header = None
    si = ci = None
    acc: dict[int, int] = {}
    for lineno, row in enumerate(rows, start=1):
        if not row or not "".join(row).strip() or row[0].lstrip().startswith("#"):
            continue
        if header is None:
            header = [h.strip().lower() for h in row]
            si = next((header.index(c) for c in _SIZE_COLUMNS if c in header), None)
            ci = next((header.index(c) for c in _COUNT_COLUMNS if c in header), None)
            if si is None:
                raise InputError(
                    f"CSV header needs a 'size' column (as in 'size,count'), got {','.join(row)!r}", f"{path}:{lineno}"
                )
            continue
        need = max(si, ci if ci is not None else 0) + 1
        if len(row) < need:
            raise InputError(f"expected {need} columns as in the header, got {len(row)}", f"{path}:{lineno}")
        size = _parse_int(row[si], path, lineno, header[si])
        count = _parse_int(row[ci], path, lineno, header[ci]) if ci is not None else 1
        acc[size] = acc.get(size, 0) + count
    if not acc:
        raise InputError("trace is empty: CSV has no rows", path)
    sizes = np.array(sorted(acc), dtype=np.int64)
    counts = np.array([acc[s] for s in sizes.tolist()], dtype=np.int64)
    return PrefillTrace(sizes=sizes, counts=counts, origin="histogram")


def _parse_json_list(text: str, path: str) -> PrefillTrace:
    """A JSON array of forward sizes, one per batch."""
    from bcgtune.fileio import loads_json

    obj = loads_json(text, path)
    if not obj:
        raise InputError("trace is empty: no sizes", path)
    return PrefillTrace.from_sizes(_int_array(obj, path, "sizes"), origin="sizes")


def _parse_plain_trace(text: str, path: str) -> PrefillTrace:
    values = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        s = line.split("#", 1)[0].strip()
        if not s:
            continue
        values.append(_parse_int(s, path, lineno, "size"))
    if not values:
        raise InputError("trace is empty: no sizes", path)
    return PrefillTrace.from_sizes(values, origin="sizes")
