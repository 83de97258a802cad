"""Calibration: measured prefill times (eager and graph replay) and graph memory of one model
on one GPU, the input of the time objective. Pure numpy: no torch, no printing.

On-disk forms (both read by `load_calibration`):
  * JSON, `format_version` 1, written by `bcgtune calibrate` / `save_calibration`:
      {"format_version": 1, "kind": "bcgtune.calibration", "tool_version", "created",
       "rows": [{"tokens", "eager_ms", "graph_ms", ...}, ...],
       "memory": {"pool_gib", "per_graph_gib", "pool_by_tokens": {"tokens": [...], "gib": [...]}} | null,
       "meta": {"gpu": ..., "software": ..., "model": ..., "method": ...}}
  * CSV with the header `tokens,eager_ms,graph_ms` (one row per measured size).

Between measured rows times are linearly interpolated; beyond them linearly extrapolated
from the two nearest rows (clipped at 0 ms: a time is never negative).
"""

from __future__ import annotations

import csv
import datetime as _dt
import io
import json
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from bcgtune.errors import InputError

FORMAT_VERSION = 1
CALIBRATION_KIND = "bcgtune.calibration"


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
class Calibration:
    tokens: np.ndarray  # measured sizes, ascending, int64
    eager_ms: np.ndarray  # median eager forward time at each size
    graph_ms: np.ndarray  # median graph replay time of a bucket of that size
    pool_gib: float | None = None  # memory of the first (largest) graph's pool
    per_graph_gib: float | None = None  # typical extra memory per further graph
    pool_by_tokens: tuple[np.ndarray, np.ndarray] | None = None  # (tokens, GiB) when that bucket is the largest
    meta: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.tokens = np.asarray(self.tokens, dtype=np.int64)
        self.eager_ms = np.asarray(self.eager_ms, dtype=np.float64)
        self.graph_ms = np.asarray(self.graph_ms, dtype=np.float64)
        if self.pool_by_tokens is not None:
            t, g = self.pool_by_tokens
            t = np.asarray(t, dtype=np.int64)
            g = np.asarray(g, dtype=np.float64)
            order = np.argsort(t, kind="stable")
            self.pool_by_tokens = (t[order], g[order])

    # ---- checks ---------------------------------------------------------------------
    def validate(self, where: str | None = None) -> "Calibration":
        t, e, g = self.tokens, self.eager_ms, self.graph_ms
        if t.ndim != 1 or t.size == 0:
            raise InputError("calibration has no rows", where)
        if not (t.shape == e.shape == g.shape):
            raise InputError("calibration columns tokens/eager_ms/graph_ms differ in length", where)
        if (t <= 0).any():
            raise InputError(f"tokens must be positive, got {int(t[t <= 0][0])}", where)
        if (np.diff(t) <= 0).any():
            raise InputError("calibration tokens must be distinct and ascending", where)
        for name, arr in (("eager_ms", e), ("graph_ms", g)):
            bad = ~np.isfinite(arr) | (arr < 0)
            if bad.any():
                i = int(np.argmax(bad))
                raise InputError(f"{name} at tokens={int(t[i])} must be a finite time >= 0, got {arr[i]}", where)
        for name, v in (("pool_gib", self.pool_gib), ("per_graph_gib", self.per_graph_gib)):
            if v is not None and (not math.isfinite(v) or v < 0):
                raise InputError(f"{name} must be a finite size >= 0, got {v}", where)
        if self.pool_by_tokens is not None:
            pt, pg = self.pool_by_tokens
            if pt.shape != pg.shape or pt.size == 0:
                raise InputError("memory.pool_by_tokens tokens and gib differ in length or are empty", where)
            if (np.diff(pt) <= 0).any() or (pt <= 0).any():
                raise InputError("memory.pool_by_tokens tokens must be positive, distinct and ascending", where)
            if (~np.isfinite(pg) | (pg < 0)).any():
                raise InputError("memory.pool_by_tokens gib must be finite sizes >= 0", where)
        return self

    # ---- the model the optimizer uses -----------------------------------------------
    def eager_time(self, n) -> np.ndarray:
        """Eager prefill time (ms) of a batch of n forward tokens."""
        return _interp_extrap(n, self.tokens.astype(np.float64), self.eager_ms)

    def graph_time(self, b) -> np.ndarray:
        """Replay time (ms) of the graph captured for bucket b (padding included)."""
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
        from bcgtune import __version__

        memory = None
        if self.has_memory or self.per_graph_gib is not None:
            memory = {"pool_gib": self.pool_gib, "per_graph_gib": self.per_graph_gib, "pool_by_tokens": None}
            if self.pool_by_tokens is not None:
                memory["pool_by_tokens"] = {
                    "tokens": self.pool_by_tokens[0].tolist(),
                    "gib": [round(float(x), 6) for x in self.pool_by_tokens[1]],
                }
        return {
            "format_version": FORMAT_VERSION,
            "kind": CALIBRATION_KIND,
            "tool": "bcgtune",
            "tool_version": __version__,
            "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "rows": [
                {"tokens": int(t), "eager_ms": round(float(e), 4), "graph_ms": round(float(g), 4)}
                for t, e, g in zip(self.tokens, self.eager_ms, self.graph_ms)
            ],
            "memory": memory,
            "meta": self.meta,
        }


def save_calibration(cal: Calibration, path) -> None:
    """Atomic write: `tokens,eager_ms,graph_ms` CSV when the path ends in .csv, else JSON."""
    from bcgtune.fileio import atomic_write_text

    cal.validate(str(path))
    if str(path).lower().endswith(".csv"):
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
    path = str(path)
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except FileNotFoundError:
        raise InputError("no such file", path) from None
    except IsADirectoryError:
        raise InputError("is a folder, not a file", path) from None
    except OSError as exc:
        raise InputError(f"cannot read: {exc.strerror}", path) from None
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise InputError("not a text file (expected calibration JSON or tokens,eager_ms,graph_ms CSV)", path) from None
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


def _parse_json(text: str, path: str) -> Calibration:
    from bcgtune.core.document import check_header
    from bcgtune.fileio import parse_json

    obj = check_header(parse_json(text, path), CALIBRATION_KIND, FORMAT_VERSION, "calibration", path)
    rows = obj.get("rows")
    if not isinstance(rows, list) or not rows:
        raise InputError("field rows must be a non-empty list", path)
    toks, eag, gra = [], [], []
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise InputError(f"rows[{i}] must be an object", path)
        for key in ("tokens", "eager_ms", "graph_ms"):
            if key not in row:
                raise InputError(f"missing field rows[{i}].{key}", path)
        t = row["tokens"]
        if isinstance(t, bool) or not isinstance(t, int):
            raise InputError(f"field rows[{i}].tokens must be an integer, got {t!r}", path)
        toks.append(t)
        eag.append(_number(row["eager_ms"], path, f"rows[{i}].eager_ms"))
        gra.append(_number(row["graph_ms"], path, f"rows[{i}].graph_ms"))
    order = np.argsort(np.asarray(toks), kind="stable")
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
            for j, t in enumerate(raw["tokens"]):
                if isinstance(t, bool) or not isinstance(t, int):
                    raise InputError(f"field memory.pool_by_tokens.tokens[{j}] must be an integer, got {t!r}", path)
            gib = [_number(v, path, f"memory.pool_by_tokens.gib[{j}]") for j, v in enumerate(raw["gib"])]
            if len(gib) != len(raw["tokens"]):
                raise InputError("memory.pool_by_tokens tokens and gib differ in length", path)
            pbt = (np.asarray(raw["tokens"], dtype=np.int64), np.asarray(gib, dtype=np.float64))
    meta = obj.get("meta") or {}
    if not isinstance(meta, dict):
        raise InputError("field meta must be an object", path)
    meta = dict(meta)
    for key in ("tool_version", "created"):
        if key in obj:
            meta.setdefault(key, obj[key])
    return Calibration(
        tokens=np.asarray(toks, dtype=np.int64)[order],
        eager_ms=np.asarray(eag)[order],
        graph_ms=np.asarray(gra)[order],
        pool_gib=pool,
        per_graph_gib=per,
        pool_by_tokens=pbt,
        meta=meta,
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
    )
