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

Between measured rows times are linearly interpolated; beyond them linearly extrapolated
from the two nearest rows (clipped at 0 ms: a time is never negative). A batch (n, r) of the
breakable runner takes its measured value when that pair was measured; otherwise it is
interpolated in n over the measured batches with the same r, inside the span of n they
cover, and elsewhere read from the curve over all measured batches (the mean where several
r share an n; linear beyond its ends, clipped at 0), never extrapolated from one r alone.
"""

from __future__ import annotations

import csv
import io
import json
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from bcgtune.core.schema import MS_MAX, TOKENS_MAX
from bcgtune.errors import InputError

FORMAT_VERSION = 2
READ_VERSIONS = (1, 2)
CALIBRATION_KIND = "bcgtune.calibration"
RUNNERS = ("breakable", "full")
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
        t, r = self.tokens, self.requests
        if t.ndim != 1 or t.size == 0:
            raise InputError("calibration batches are empty", where)
        if not (t.shape == r.shape == self.eager_ms.shape == self.breaks_ms.shape):
            raise InputError("calibration batches columns tokens/requests/eager_ms/breaks_ms differ in length", where)
        if (t <= 0).any() or (t > MAX_TOKENS).any():
            raise InputError(f"batches.tokens must be in 1..{MAX_TOKENS}", where)
        if (r < 1).any() or (r > t).any():
            i = int(np.argmax((r < 1) | (r > t)))
            raise InputError(f"batches: {int(t[i])} tokens cannot hold {int(r[i])} requests", where)
        dup = (np.diff(t) == 0) & (np.diff(r) == 0)
        if dup.any():
            i = int(np.argmax(dup))
            raise InputError(f"batches: ({int(t[i])} tokens, {int(r[i])} requests) measured twice", where)
        for name in ("eager_ms", "breaks_ms"):
            arr = getattr(self, name)
            bad = ~np.isfinite(arr) | (arr < 0) | (arr > MAX_MS)
            if bad.any():
                i = int(np.argmax(bad))
                raise InputError(f"batches.{name} at {int(t[i])} tokens must be a time in 0..{MAX_MS:g} ms, got {arr[i]}", where)

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


# Bounds for values read from files: token counts within SGLang's int32 sizes, times
# below a day.
MAX_TOKENS = TOKENS_MAX
MAX_MS = MS_MAX


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
        t, g = self.tokens, self.graph_ms
        if self.runner not in RUNNERS:
            raise InputError(f"runner must be one of {', '.join(RUNNERS)}, got {str(self.runner)[:40]!r}", where)
        if t.ndim != 1 or t.size == 0:
            raise InputError("calibration has no rows", where)
        if t.shape != g.shape:
            raise InputError("calibration columns tokens/graph_ms differ in length", where)
        if (t <= 0).any() or (t > MAX_TOKENS).any():
            bad = t[(t <= 0) | (t > MAX_TOKENS)][0]
            raise InputError(f"tokens must be in 1..{MAX_TOKENS}, got {int(bad)}", where)
        if (np.diff(t) <= 0).any():
            raise InputError("calibration tokens must be distinct and ascending", where)
        cols = [("graph_ms", g)]
        if self.runner == "full":
            if self.eager_ms is None or self.eager_ms.shape != t.shape:
                raise InputError("a full-runner calibration needs eager_ms on every row", where)
            cols.append(("eager_ms", self.eager_ms))
            if self.batches is not None:
                raise InputError("a full-runner calibration has no batches table", where)
        else:
            if self.batches is None:
                raise InputError("a breakable-runner calibration needs its batches table", where)
            self.batches.validate(where)
        for name, arr in cols:
            bad = ~np.isfinite(arr) | (arr < 0) | (arr > MAX_MS)
            if bad.any():
                i = int(np.argmax(bad))
                raise InputError(f"{name} at tokens={int(t[i])} must be a time in 0..{MAX_MS:g} ms, got {arr[i]}", where)
        for name, v in (("pool_gib", self.pool_gib), ("per_graph_gib", self.per_graph_gib)):
            if v is not None and (not math.isfinite(v) or v < 0 or v > 1e6):
                raise InputError(f"{name} must be a finite size in 0..1e6 GiB, got {v}", where)
        if self.pool_by_tokens is not None:
            pt, pg = self.pool_by_tokens
            if pt.shape != pg.shape or pt.size == 0:
                raise InputError("memory.pool_by_tokens tokens and gib differ in length or are empty", where)
            if (np.diff(pt) <= 0).any() or (pt <= 0).any() or (pt > MAX_TOKENS).any():
                raise InputError("memory.pool_by_tokens tokens must be positive, distinct and ascending", where)
            if (~np.isfinite(pg) | (pg < 0) | (pg > 1e6)).any():
                raise InputError("memory.pool_by_tokens gib must be finite sizes >= 0", where)
        return self

    # ---- the model the optimizer uses -----------------------------------------------
    def eager_time(self, n, requests=1) -> np.ndarray:
        """Eager prefill time (ms) of a batch of n forward tokens from `requests` requests
        (the full runner measured one request per batch and ignores it)."""
        if self.runner == "full" or self.batches is None:
            return _interp_extrap(n, self.tokens.astype(np.float64), self.eager_ms)
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

        memory = None
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
                row["eager_ms"] = round(float(self.eager_ms[i]), 4)
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
    if str(path).lower().endswith(".csv"):
        if cal.runner != "full":
            raise InputError("a breakable-runner calibration is written as JSON only "
                             "(its per-batch table does not fit tokens,eager_ms,graph_ms)", str(path))
        buf = io.StringIO()
        buf.write("tokens,eager_ms,graph_ms\n")
        for t, e, g in zip(cal.tokens, cal.eager_ms, cal.graph_ms):
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


def _number(v, path: str, fieldname: str, allow_none: bool = False) -> float | None:
    if v is None and allow_none:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise InputError(f"field {fieldname} must be a number, got {v!r}", path)
    return float(v)


def _int_field(v, path: str, fieldname: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise InputError(f"field {fieldname} must be an integer, got {str(v)[:40]!r}", path)
    if not 0 < v <= MAX_TOKENS:
        raise InputError(f"field {fieldname} must be in 1..{MAX_TOKENS}, got {str(v)[:40]}", path)
    return v


def _list_field(obj: dict, key: str, path: str, prefix: str) -> list:
    v = obj.get(key)
    if not isinstance(v, list):
        raise InputError(f"field {prefix}{key} must be a list", path)
    return v


def _parse_json(text: str, path: str) -> Calibration:
    from bcgtune.core.document import check_header
    from bcgtune.fileio import parse_json

    obj = parse_json(text, path)
    version = obj.get("format_version") if isinstance(obj, dict) else None
    known = not isinstance(version, bool) and version in READ_VERSIONS
    if not known and isinstance(obj, dict) and obj.get("kind") in (None, CALIBRATION_KIND):
        raise InputError(f"unsupported calibration format_version {str(version)[:20]!r} "
                         f"(this bcgtune reads {' and '.join(map(str, READ_VERSIONS))}); rerun bcgtune calibrate", path)
    obj = check_header(obj, CALIBRATION_KIND, version if known else FORMAT_VERSION, "calibration", path)
    runner = obj.get("runner", "full") if version >= 2 else "full"  # version 1: whole-forward graphs
    if runner not in RUNNERS:
        raise InputError(f"field runner must be one of {', '.join(RUNNERS)}, got {str(runner)[:40]!r}", path)
    rows = obj.get("rows")
    if not isinstance(rows, list) or not rows:
        raise InputError("field rows must be a non-empty list", path)
    need = ("tokens", "eager_ms", "graph_ms") if runner == "full" else ("tokens", "graph_ms")
    toks, eag, gra = [], [], []
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise InputError(f"rows[{i}] must be an object", path)
        for key in need:
            if key not in row:
                raise InputError(f"missing field rows[{i}].{key}", path)
        toks.append(_int_field(row["tokens"], path, f"rows[{i}].tokens"))
        gra.append(_number(row["graph_ms"], path, f"rows[{i}].graph_ms"))
        if runner == "full":
            eag.append(_number(row["eager_ms"], path, f"rows[{i}].eager_ms"))
    order = np.argsort(np.asarray(toks), kind="stable")
    batches = None
    raw_b = obj.get("batches")
    if runner == "breakable":
        if not isinstance(raw_b, dict):
            raise InputError("field batches must be an object of columns tokens/requests/eager_ms/breaks_ms", path)
        bt = [_int_field(v, path, f"batches.tokens[{j}]") for j, v in enumerate(_list_field(raw_b, "tokens", path, "batches."))]
        br = [_int_field(v, path, f"batches.requests[{j}]") for j, v in enumerate(_list_field(raw_b, "requests", path, "batches."))]
        be = [_number(v, path, f"batches.eager_ms[{j}]") for j, v in enumerate(_list_field(raw_b, "eager_ms", path, "batches."))]
        bb = [_number(v, path, f"batches.breaks_ms[{j}]") for j, v in enumerate(_list_field(raw_b, "breaks_ms", path, "batches."))]
        if not (len(bt) == len(br) == len(be) == len(bb)):
            raise InputError("batches columns tokens/requests/eager_ms/breaks_ms differ in length", path)
        batches = BatchTimes(bt, br, be, bb)
    elif raw_b is not None:
        raise InputError("field batches belongs to a breakable-runner calibration (runner is full)", path)
    pool = per = None
    pbt = None
    mem = obj.get("memory")
    if mem is not None:
        if not isinstance(mem, dict):
            raise InputError("field memory must be an object or null", path)
        pool = _number(mem.get("pool_gib"), path, "memory.pool_gib", allow_none=True)
        per = _number(mem.get("per_graph_gib"), path, "memory.per_graph_gib", allow_none=True)
        raw = mem.get("pool_by_tokens")
        if raw is not None:
            if not isinstance(raw, dict) or not isinstance(raw.get("tokens"), list) or not isinstance(raw.get("gib"), list):
                raise InputError("field memory.pool_by_tokens must be {tokens: [...], gib: [...]}", path)
            ptok = [_int_field(t, path, f"memory.pool_by_tokens.tokens[{j}]") for j, t in enumerate(raw["tokens"])]
            gib = [_number(v, path, f"memory.pool_by_tokens.gib[{j}]") for j, v in enumerate(raw["gib"])]
            if len(gib) != len(ptok):
                raise InputError("memory.pool_by_tokens tokens and gib differ in length", path)
            pbt = (np.asarray(ptok, dtype=np.int64), np.asarray(gib, dtype=np.float64))
    meta = obj.get("meta") or {}
    if not isinstance(meta, dict):
        raise InputError("field meta must be an object", path)
    meta = dict(meta)
    for key in ("tool_version", "created"):
        if key in obj:
            meta.setdefault(key, obj[key])
    meta.setdefault("format_version", version)
    return Calibration(
        tokens=np.asarray(toks, dtype=np.int64)[order],
        eager_ms=np.asarray(eag)[order] if runner == "full" else None,
        graph_ms=np.asarray(gra)[order],
        pool_gib=pool,
        per_graph_gib=per,
        pool_by_tokens=pbt,
        meta=meta,
        runner=runner,
        batches=batches,
    )


def _parse_csv(text: str, path: str) -> Calibration:
    header = None
    rows: dict[int, tuple[float, float, int]] = {}
    for lineno, row in enumerate(csv.reader(io.StringIO(text)), start=1):
        if not row or not "".join(row).strip() or row[0].lstrip().startswith("#"):
            continue
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
            if not math.isfinite(v) or v < 0:
                raise InputError(f"field {name} must be a finite time >= 0, got {c!r}", f"{path}:{lineno}")
            vals.append(v)
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
