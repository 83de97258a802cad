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
(`*_rounds_ms`), so a prediction carries an interval (bcgtune.core.plan.predict): the point value
of a size is the median of its rounds, as before; a list's predicted total is the sum of
those medians, and its spread comes from the list's total in each round. Formats 1 and 2 and
the CSV kept one value per size: they read as "one round", which gives no interval.
Format 4 adds the model check (bcgtune.core.plan.model_check): the calibration's predictions
against a replay of the trace's batches in order, which widens every interval by the model's
own error; a calibration without it (formats 1-3, or one not made on a trace) reads as "model
error not checked".

The JSON document a calibration is written as comes from `Calibration.to_json_obj`; the
files (format 3 JSON, the older formats, the CSV) are read and written by
bcgtune.files.calibration_file, and `bcgtune calibrate --extend` adds rows through
bcgtune.core.plan.calibration_extend. Every value, read or measured, stays within the schema's
bounds (token counts within SGLang's int32 sizes, finite times below a day).

Between measured rows times are linearly interpolated; beyond them linearly extrapolated
from the two nearest rows (clipped at 0 ms: a time is never negative). A batch (n, r) of the
breakable runner takes its measured value when that pair was measured; otherwise it is
interpolated in n over the measured batches with the same r, inside the span of n they
cover, and elsewhere read from the curve over all measured batches (the mean where several
r share an n; linear beyond its ends, clipped at 0), never extrapolated from one r alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Annotated, Any, Literal, Optional

import numpy as np
from pydantic import Field

from bcgtune.core.schema import MS_MAX, GiB, Milliseconds, Tokens, validate
from bcgtune.errors import InputError

if TYPE_CHECKING:
    from bcgtune.core.plan.model_check import ModelCheck

FORMAT_VERSION = 4  # 4: format 3 with the model check (model_check, optional); 1-3 still read
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
    # the time model checked against a replay of the trace (core.plan.model_check); None: not checked
    model_check: ModelCheck | None = None

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
        for name, size in (("pool_gib", self.pool_gib), ("per_graph_gib", self.per_graph_gib)):
            validate(Optional[GiB], size if size is None else float(size), where, prefix=("memory", name))
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
            "model_check": None if self.model_check is None else self.model_check.to_json(),
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
