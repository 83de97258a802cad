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

Timed rounds. `bcgtune calibrate` times every call in interleaved rounds: each round runs
every size once, in a fresh shuffled order. Format 3 keeps each value of each round
(`*_rounds_ms`), so a prediction carries an interval (bcgtune.core.predict): the point value
of a size is the median of its rounds, as before; a list's predicted total is the sum of
those medians, and its spread comes from the list's total in each round. Formats 1 and 2 and
the CSV kept one value per size: they read as "one round", which gives no interval.

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
  * JSON `format_version` 2: as 3 without rounds, sessions or engine options.
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

from bcgtune.core.schema import MS_MAX, Document, GiB, Milliseconds, NonNegativeInt, Tokens, validate
from bcgtune.errors import InputError
from bcgtune.fileio import csv_rows

FORMAT_VERSION = 3
READ_VERSIONS = (1, 2, 3)
ROUNDS_MAX = 10_000  # calibrate --repeats at most
# A paired difference of two times in one round (a break time's round value) may be negative.
SignedMilliseconds = Annotated[float, Field(strict=True, ge=-MS_MAX, le=MS_MAX, allow_inf_nan=False)]
# A row's stored median and the median of its stored rounds agree within the rounding of
# the file (4 decimals) and this much.
_MEDIAN_TOLERANCE_MS = 1e-3
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
    break time (everything a replay costs beyond its bucket's segments). `eager_rounds` and
    `breaks_rounds` (batches x R): each timed round's value (None: one value per batch, an
    older file). `eager_host_ms`: how long the host took to launch each eager forward
    (median; None: not measured)."""

    tokens: np.ndarray
    requests: np.ndarray
    eager_ms: np.ndarray
    breaks_ms: np.ndarray
    eager_rounds: np.ndarray | None = None
    breaks_rounds: np.ndarray | None = None
    eager_host_ms: np.ndarray | None = None

    def __post_init__(self) -> None:
        self.tokens = np.asarray(self.tokens, dtype=np.int64)
        self.requests = np.asarray(self.requests, dtype=np.int64)
        self.eager_ms = np.asarray(self.eager_ms, dtype=np.float64)
        self.breaks_ms = np.asarray(self.breaks_ms, dtype=np.float64)
        for name in ("eager_rounds", "breaks_rounds", "eager_host_ms"):
            if getattr(self, name) is not None:
                setattr(self, name, np.asarray(getattr(self, name), dtype=np.float64))
        if self.tokens.ndim == 1 and self.tokens.shape == self.requests.shape:
            order = np.lexsort((self.requests, self.tokens))
            for name in ("tokens", "requests", "eager_ms", "breaks_ms", "eager_rounds", "breaks_rounds", "eager_host_ms"):
                arr = getattr(self, name)
                if arr is not None and arr.ndim >= 1 and arr.shape[0] == order.size:
                    setattr(self, name, arr[order])

    @property
    def rounds(self) -> int | None:
        """Timed rounds per batch (None: not kept)."""
        return None if self.eager_rounds is None else int(self.eager_rounds.shape[1])

    def validate(self, where: str | None) -> None:
        """Equal columns, each value within its schema bound, every (tokens, requests)
        pair possible and measured once; rounds, when kept, as many per batch, with the
        medians they give."""
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
        if (self.eager_rounds is None) != (self.breaks_rounds is None):
            raise InputError("calibration batches keep rounds of eager_ms but not of breaks_ms, or the reverse", where)
        if self.eager_rounds is not None and self.breaks_rounds is not None:
            _check_rounds(self.eager_rounds, self.eager_ms, Milliseconds, "batches.eager_rounds_ms", where)
            _check_rounds(self.breaks_rounds, self.breaks_ms, SignedMilliseconds, "batches.breaks_rounds_ms", where, clip=True)
            if self.eager_rounds.shape != self.breaks_rounds.shape:
                raise InputError("batches.eager_rounds_ms and batches.breaks_rounds_ms differ in shape", where)
        if self.eager_host_ms is not None:
            if self.eager_host_ms.shape != t.shape:
                raise InputError("batches.eager_host_ms differs in length from batches.tokens", where)
            _check_column(Milliseconds, self.eager_host_ms, "batches.eager_host_ms", where)

    def round_view(self, i: int) -> BatchTimes:
        """The batches as round i measured them (rounds must be kept)."""
        assert self.eager_rounds is not None and self.breaks_rounds is not None
        return BatchTimes(self.tokens, self.requests, self.eager_rounds[:, i], self.breaks_rounds[:, i])

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


def _check_rounds(rounds: np.ndarray, point: np.ndarray, item: Any, name: str, where: str | None, clip: bool = False) -> None:
    """Rounds of a column: one row per value, as many rounds in each, each value within its
    bound, and the column's value the median of its rounds (clipped at 0 for a break time)."""
    if rounds.ndim != 2 or rounds.shape[0] != point.size or rounds.shape[1] < 1:
        raise InputError(f"{name} must hold one list of rounds per value, each as long as the others", where)
    if rounds.shape[1] > ROUNDS_MAX:
        raise InputError(f"{name}: {rounds.shape[1]:,} rounds (at most {ROUNDS_MAX:,})", where)
    validate(list[list[item]], rounds.tolist(), where, prefix=(name,))
    med = np.median(rounds, axis=1)
    if clip:
        med = np.maximum(med, 0.0)
    off = np.abs(point - med) > _MEDIAN_TOLERANCE_MS + 1e-6 * np.abs(med)
    if off.any():
        i = int(np.argmax(off))
        raise InputError(
            f"{name}[{i}]: the median of its rounds is {med[i]:.4f} ms, but the value stored beside it is {point[i]:.4f} ms",
            where,
        )


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
    # each timed round's value per row (rows x R); None: one value per row (formats 1, 2, CSV)
    graph_rounds: np.ndarray | None = None
    eager_rounds: np.ndarray | None = None  # full runner
    # provenance of each run that measured rows: the calibration, then any `calibrate --extend`
    sessions: list[dict] = field(default_factory=list)
    row_session: np.ndarray | None = None  # per row, its index in `sessions` (None: all the first)
    # the engine options the calibration ran with, so `calibrate --extend` measures alike
    engine_options: dict | None = None

    def __post_init__(self) -> None:
        self.tokens = np.asarray(self.tokens, dtype=np.int64)
        if self.eager_ms is not None:
            self.eager_ms = np.asarray(self.eager_ms, dtype=np.float64)
        self.graph_ms = np.asarray(self.graph_ms, dtype=np.float64)
        for name in ("graph_rounds", "eager_rounds"):
            if getattr(self, name) is not None:
                setattr(self, name, np.asarray(getattr(self, name), dtype=np.float64))
        if self.row_session is not None:
            self.row_session = np.asarray(self.row_session, dtype=np.int64)
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
        self._check_row_rounds(where)
        self._check_memory(where)
        return self

    @property
    def rounds(self) -> int:
        """Timed rounds behind every value (1 when the file kept one value per size)."""
        return 1 if self.graph_rounds is None else int(self.graph_rounds.shape[1])

    def _check_row_rounds(self, where: str | None) -> None:
        """Rounds kept for every table or for none, as many for every value, each the
        median's; the sessions rows name exist."""
        kept = [self.graph_rounds is not None]
        if self.runner == "full":
            kept.append(self.eager_rounds is not None)
        elif self.batches is not None:
            kept.append(self.batches.eager_rounds is not None)
        if len(set(kept)) > 1:
            raise InputError("calibration keeps timed rounds for some of its tables but not all", where)
        if self.graph_rounds is not None:
            _check_rounds(self.graph_rounds, self.graph_ms, Milliseconds, "rows.graph_rounds_ms", where)
            if self.runner == "full" and self.eager_rounds is not None:
                _check_rounds(self.eager_rounds, self._eager_column(), Milliseconds, "rows.eager_rounds_ms", where)
                if self.eager_rounds.shape != self.graph_rounds.shape:
                    raise InputError("rows.eager_rounds_ms and rows.graph_rounds_ms differ in shape", where)
            if self.batches is not None and self.batches.rounds not in (None, self.rounds):
                raise InputError(
                    f"batches keep {self.batches.rounds} rounds and rows {self.rounds}: a calibration's rounds are one set", where
                )
        if self.row_session is not None:
            if self.row_session.shape != self.tokens.shape:
                raise InputError("rows.session differs in length from rows", where)
            if self.row_session.size and (self.row_session.min() < 0 or self.row_session.max() >= max(1, len(self.sessions))):
                raise InputError("a row names a session the calibration does not list (rows.session)", where)

    def round_views(self) -> list[Calibration]:
        """The calibration as each timed round measured it (empty when no rounds are kept):
        every pricing function applies to a view as to the calibration itself."""
        if self.graph_rounds is None:
            return []
        views = []
        for i in range(self.rounds):
            views.append(
                Calibration(
                    tokens=self.tokens,
                    eager_ms=None if self.eager_rounds is None else self.eager_rounds[:, i],
                    graph_ms=self.graph_rounds[:, i],
                    pool_gib=self.pool_gib,
                    per_graph_gib=self.per_graph_gib,
                    pool_by_tokens=self.pool_by_tokens,
                    meta=self.meta,
                    runner=self.runner,
                    batches=None if self.batches is None or self.batches.eager_rounds is None else self.batches.round_view(i),
                )
            )
        return views

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

    def capture_s_of(self, buckets) -> float | None:
        """Capture time (s) of a bucket list: the sum of each bucket's capture time as the
        calibration recorded it (meta `capture_s`, captured largest first into one pool),
        interpolated between recorded sizes; None when none was recorded."""
        rec = self.meta.get("capture_s") if isinstance(self.meta, dict) else None
        if not isinstance(rec, dict) or not rec:
            return None
        pts = []
        for k, v in rec.items():
            try:
                t, sec = int(k), float(v)
            except (TypeError, ValueError):
                continue
            if t > 0 and np.isfinite(sec) and 0 <= sec < 86_400:
                pts.append((t, sec))
        if not pts:
            return None
        pts.sort()
        xs = np.asarray([p[0] for p in pts], dtype=np.float64)
        ys = np.asarray([p[1] for p in pts], dtype=np.float64)
        bl = np.asarray(list(buckets), dtype=np.float64)
        return float(np.interp(bl, xs, ys).sum()) if bl.size else 0.0

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
        # a calibration without kept rounds is written as what it is: one value, one round
        g_rounds = self.graph_rounds if self.graph_rounds is not None else self.graph_ms[:, None]
        e_rounds = None
        if self.runner == "full":
            e_rounds = self.eager_rounds if self.eager_rounds is not None else self._eager_column()[:, None]
        rows = []
        for i, (t, g) in enumerate(zip(self.tokens, self.graph_ms)):
            row: dict[str, Any] = {"tokens": int(t), "graph_ms": _ms(g), "graph_rounds_ms": _ms_list(g_rounds[i])}
            if e_rounds is not None:
                row["eager_ms"] = _ms(self._eager_column()[i])
                row["eager_rounds_ms"] = _ms_list(e_rounds[i])
            row["session"] = 0 if self.row_session is None else int(self.row_session[i])
            rows.append(row)
        batches = None
        if self.batches is not None:
            bt = self.batches
            er = bt.eager_rounds if bt.eager_rounds is not None else bt.eager_ms[:, None]
            br = bt.breaks_rounds if bt.breaks_rounds is not None else bt.breaks_ms[:, None]
            batches = {
                "tokens": bt.tokens.tolist(),
                "requests": bt.requests.tolist(),
                "eager_ms": _ms_list(bt.eager_ms),
                "breaks_ms": _ms_list(bt.breaks_ms),
                "eager_rounds_ms": [_ms_list(x) for x in er],
                "breaks_rounds_ms": [_ms_list(x) for x in br],
                "eager_host_ms": None if bt.eager_host_ms is None else _ms_list(bt.eager_host_ms),
            }
        header = document_header(CALIBRATION_KIND, FORMAT_VERSION)
        sessions = self.sessions or [first_session(self.rounds, {"created": header["created"], **self.meta})]
        return {
            **header,
            "runner": self.runner,
            "rounds": self.rounds,
            "rows": rows,
            "batches": batches,
            "memory": memory,
            "sessions": sessions,
            "engine_options": self.engine_options,
            "meta": self.meta,
        }


def _ms(x) -> float:
    return round(float(x), 4)


def _ms_list(xs) -> list[float]:
    return [round(float(x), 4) for x in np.asarray(xs).ravel()]


def first_session(rounds: int, meta: dict | None = None, sizes=None) -> dict[str, Any]:
    """The provenance of the run that measured a calibration (its first session)."""
    from bcgtune import __version__

    eng = (meta or {}).get("engine") if isinstance(meta, dict) else None
    warmup = eng.get("warmup") if isinstance(eng, dict) else None
    created = (meta or {}).get("created") if isinstance(meta, dict) else None
    return {
        "kind": "calibration",
        "created": str(created) if created else None,
        "tool_version": str((meta or {}).get("tool_version") or __version__),
        "rounds": int(rounds),
        "warmup": warmup if isinstance(warmup, int) and not isinstance(warmup, bool) else None,
        "sizes": [int(x) for x in sizes] if sizes is not None else [],
        "anchors": [],
        "scale_graph": None,
        "scale_eager": None,
    }


# ---- extending a calibration (`bcgtune calibrate --extend`) ------------------------------
ANCHORS_PER_SIDE = 2  # measured rows re-timed on each side of every added size
# An extension whose anchors moved by more than this factor ran on a machine in another
# state (another clock, load or process): its values would not be comparable, scaled or not.
SCALE_LIMIT = 1.5


def extension_anchors(cal: Calibration, sizes) -> list[int]:
    """The rows an extension times again beside the sizes it adds: the ANCHORS_PER_SIDE
    nearest measured rows below and above each added size. Their two timings put the new
    run's values on the first run's scale (`extend_calibration`)."""
    rows = cal.tokens
    out: set[int] = set()
    for n in sorted({int(x) for x in sizes} - set(rows.tolist())):
        i = int(np.searchsorted(rows, n))
        out.update(rows[max(0, i - ANCHORS_PER_SIDE) : i].tolist())
        out.update(rows[i : i + ANCHORS_PER_SIDE].tolist())
    return sorted(out)


def _scale(old: np.ndarray, new: np.ndarray) -> float | None:
    """Median ratio old / new over rows both runs timed (None: none positive)."""
    ok = (new > 0) & (old > 0)
    return float(np.median(old[ok] / new[ok])) if ok.any() else None


def extend_calibration(cal: Calibration, new: Calibration, session: dict[str, Any]) -> Calibration:
    """`cal` with the rows `new` measured and `cal` lacks, `new` being a later run (same
    runner, as many timed rounds) that also timed some of `cal`'s rows again (its anchors).
    The added rows are put on `cal`'s scale: each column (graph, and the full runner's
    eager) multiplied by the median ratio, over the anchors, of `cal`'s time to the new
    run's (a GPU clock or host that ran faster in one process moves every size alike). The
    session's provenance (with the anchors and the scales) is appended to `cal.sessions`;
    each added row names it. Rows `cal` has already are not changed."""
    if cal.graph_rounds is None:
        raise InputError("this calibration keeps no timed rounds (written before format 3): calibrate again to extend it")
    if new.runner != cal.runner:
        raise InputError(f"an extension of a {cal.runner}-runner calibration measured the {new.runner} runner")
    if new.graph_rounds is None or new.rounds != cal.rounds:
        raise InputError(f"an extension must time as many rounds as the calibration ({cal.rounds}), got {new.rounds}")
    both = np.intersect1d(cal.tokens, new.tokens)
    add = ~np.isin(new.tokens, cal.tokens)
    if not add.any():
        raise InputError("nothing to add: the calibration has measured every size given")
    io_, in_ = np.searchsorted(cal.tokens, both), np.searchsorted(new.tokens, both)
    scale_g = _scale(cal.graph_ms[io_], new.graph_ms[in_]) if both.size else None
    g_rounds = new.graph_rounds[add] * (scale_g or 1.0)
    e_rounds = None
    scale_e = None
    if cal.runner == "full":
        assert new.eager_rounds is not None and cal.eager_ms is not None and new.eager_ms is not None
        scale_e = _scale(cal.eager_ms[io_], new.eager_ms[in_]) if both.size else None
        e_rounds = new.eager_rounds[add] * (scale_e or 1.0)
    for what, scale in (("replay", scale_g), ("eager", scale_e)):
        if scale is not None and not 1 / SCALE_LIMIT <= scale <= SCALE_LIMIT:
            raise InputError(
                f"the rows timed again ran {what} {1 / scale:.3g}x as long as the calibration had them: this machine is "
                "not in the state it was calibrated in (another clock, load or process); calibrate again instead"
            )
    sessions = list(cal.sessions) or [first_session(cal.rounds, cal.meta)]
    index = len(sessions)
    sessions.append(
        {
            **session,
            "kind": "extension",
            "rounds": cal.rounds,
            "sizes": new.tokens[add].tolist(),
            "anchors": both.tolist(),
            "scale_graph": scale_g,
            "scale_eager": scale_e,
        }
    )
    tokens = np.concatenate([cal.tokens, new.tokens[add]])
    order = np.argsort(tokens, kind="stable")
    row_session = np.concatenate(
        [
            cal.row_session if cal.row_session is not None else np.zeros(cal.tokens.size, dtype=np.int64),
            np.full(int(add.sum()), index),
        ]
    )
    meta = dict(cal.meta)
    added_capture = new.meta.get("capture_s") if isinstance(new.meta, dict) else None
    if isinstance(added_capture, dict):
        keep = {str(t) for t in new.tokens[add].tolist()}
        meta["capture_s"] = {**(meta.get("capture_s") or {}), **{k: v for k, v in added_capture.items() if k in keep}}
    out = Calibration(
        tokens=tokens[order],
        eager_ms=None if e_rounds is None else np.concatenate([cal._eager_column(), np.median(e_rounds, axis=1)])[order],
        graph_ms=np.concatenate([cal.graph_ms, np.median(g_rounds, axis=1)])[order],
        pool_gib=cal.pool_gib,
        per_graph_gib=cal.per_graph_gib,
        pool_by_tokens=cal.pool_by_tokens,
        meta=meta,
        runner=cal.runner,
        batches=cal.batches,
        graph_rounds=np.concatenate([cal.graph_rounds, g_rounds])[order],
        eager_rounds=None
        if e_rounds is None or cal.eager_rounds is None
        else np.concatenate([cal.eager_rounds, e_rounds])[order],
        sessions=sessions,
        row_session=row_session[order],
        engine_options=cal.engine_options,
    )
    return out.validate()


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


class _Rounds3(Document):
    """What format 3 adds to every document: the timed rounds, the sessions, the engine."""

    rounds: RoundCount
    sessions: Annotated[list[_Session], Field(min_length=1, max_length=10_000)]
    engine_options: Optional[dict[str, Any]] = None


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
