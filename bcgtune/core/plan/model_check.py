"""The time model checked against a replay of the trace: how far a list's predicted total
(the sum of per-size medians from a calibration's loop) lies from the same batches replayed
one after another in trace order, as a server runs them. Pure numpy: no torch, no I/O.

A calibration times each size in interleaved rounds, away from its neighbours in the trace.
A replay of the trace in order meets what the loop does not: the batch before (caches,
clocks, the host's launch queue), sizes the calibration interpolated, and every batch's own
inputs. On an H200 the two disagreed by 0.5-1.4% of a total, more than the calibration's own
round-to-round noise, and by a third of a recommended-minus-ladder difference.

`ModelCheck` records, per list replayed (at least SGLang's ladder and a sparse list), the
predicted and the measured total over the same sample of trace batches, and each timed
round's measured total. From those:

    bias(L)   = measured(L) / predicted(L) - 1                       (relative error)
    se(L)     = sd_r(T_r(L) / predicted(L) - 1) / sqrt(R)             (its standard error)
    u_total   = max_L |bias(L)| + t(0.975, R - 1) se(L)               (of a total)
    u_diff    = max_{L,M} |bias(L) - bias(M)| + t sqrt(se(L)^2 + se(M)^2)  (between lists)

Lists with graphs and eager (no graphs) err apart: eager launches every kernel from the host,
so on a launch-bound shape its error follows the host's CPU (on an H200 its replay moved 30%
between passes of one process, where the graph lists moved 1-2%). The maxima run over the
lists of one kind: a list with graphs takes the graph lists' margin, eager takes the checked
eager list's own; a kind the check did not replay takes the maximum over every list, and a
difference between the kinds the maximum over pairs of one list of each.

core.plan.predict widens every interval by them (see TimeModel there).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from bcgtune.core.stats import t_quantile_975
from bcgtune.errors import InputError


@dataclass(frozen=True)
class ListCheck:
    """One list replayed on the sample: its predicted and measured total (ms; measured = the
    sum over batches of each call's median over rounds, the statistic the prediction uses),
    and the measured total in each timed round."""

    name: str
    buckets: list[int]
    predicted_ms: float
    measured_ms: float
    round_totals_ms: list[float] = field(default_factory=list)

    @property
    def bias(self) -> float:
        """measured / predicted - 1."""
        return self.measured_ms / self.predicted_ms - 1.0 if self.predicted_ms > 0 else 0.0

    @property
    def se(self) -> float | None:
        """Standard error of the relative error over the timed rounds (None: one round)."""
        r = np.asarray(self.round_totals_ms, dtype=np.float64)
        if r.size < 2 or self.predicted_ms <= 0:
            return None
        return float(np.std(r / self.predicted_ms - 1.0, ddof=1)) / math.sqrt(r.size)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "buckets": [int(b) for b in self.buckets],
            "predicted_ms": round(float(self.predicted_ms), 4),
            "measured_ms": round(float(self.measured_ms), 4),
            "round_totals_ms": [round(float(x), 4) for x in self.round_totals_ms],
            "bias": self.bias,
            "se": self.se,
        }


@dataclass(frozen=True)
class ModelCheck:
    """The model error of one calibration, measured by replaying `batches` of the trace's
    `of` batches (every `every`-th, in trace order when `ordered`, else in a seeded shuffle
    of its histogram) under each list of `lists`, in `rounds` timed rounds."""

    lists: list[ListCheck]
    batches: int
    of: int
    every: int
    rounds: int
    ordered: bool = True
    device: str | None = None
    created: str | None = None

    def _t(self) -> float:
        return t_quantile_975(self.rounds - 1) if self.rounds >= 2 else 0.0

    def _kind(self, eager: bool) -> list[ListCheck]:
        """The checked lists of one kind (eager: no graphs), or every list when the check
        replayed none of that kind."""
        own = [c for c in self.lists if (not c.buckets) == eager]
        return own or list(self.lists)

    def total_margin_for(self, eager: bool = False) -> float:
        """u_total of a list with graphs, or of eager: the relative model error of its total."""
        t = self._t()
        return max((abs(c.bias) + t * (c.se or 0.0) for c in self._kind(eager)), default=0.0)

    def difference_margin_for(self, a_eager: bool = False, b_eager: bool = False) -> float:
        """u_diff between a list of each kind given: how far their model errors can differ;
        over every pair of lists when the check replayed no two lists of those kinds (one
        list with graphs beside eager)."""
        pairs = [(a, b) for a in self._kind(a_eager) for b in self._kind(b_eager) if a is not b]
        if not pairs:
            pairs = [(a, b) for i, a in enumerate(self.lists) for b in self.lists[i + 1 :]]
        t = self._t()
        return max((abs(a.bias - b.bias) + t * math.sqrt((a.se or 0.0) ** 2 + (b.se or 0.0) ** 2) for a, b in pairs), default=0.0)

    @property
    def total_margin(self) -> float:
        """u_total of a list with graphs (a fraction of its total)."""
        return self.total_margin_for(False)

    @property
    def difference_margin(self) -> float:
        """u_diff between two lists with graphs (a fraction of a total)."""
        return self.difference_margin_for(False, False)

    @property
    def eager_checked(self) -> bool:
        return any(not c.buckets for c in self.lists)

    def total_half(self, total_ms: float, eager: bool = False) -> float:
        """What the model error adds to the half-width of a total of `total_ms`."""
        return self.total_margin_for(eager) * abs(float(total_ms))

    def difference_half(
        self,
        a_ms: float,
        b_ms: float,
        a_differing_ms: float | None = None,
        b_differing_ms: float | None = None,
        a_eager: bool = False,
        b_eager: bool = False,
    ) -> float:
        """What the model error adds to the half-width of total(A) - total(B):
        u_total |T(A) - T(B)| + u_diff max(P(A), P(B)), since the error of the difference is
        bias(A) (T(A) - T(B)) + (bias(A) - bias(B)) T(B); P is each list's time over the
        batches the lists price differently (the rest cancels), the whole totals when not given."""
        pa = float(a_ms) if a_differing_ms is None else float(a_differing_ms)
        pb = float(b_ms) if b_differing_ms is None else float(b_differing_ms)
        u_total = self.total_margin_for(a_eager)
        return u_total * abs(float(a_ms) - float(b_ms)) + self.difference_margin_for(a_eager, b_eager) * max(pa, pb)

    def margins_text(self) -> str:
        """'+X% of a total, +Y% of the larger total for a difference' (and eager's own)."""
        out = (
            f"+{100 * self.total_margin:.2f}% of a total, "
            f"+{100 * self.difference_margin:.2f}% of the larger total for a difference"
        )
        if self.eager_checked:
            out += f", eager +{100 * self.total_margin_for(True):.2f}% of its total (its own replay)"
        return out

    def summary(self) -> str:
        """'checked by replay on N batches: ladder predicted X s, measured Y s; ...'."""
        parts = [f"{c.name} predicted {c.predicted_ms / 1e3:,.3f} s, measured {c.measured_ms / 1e3:,.3f} s" for c in self.lists]
        how = "in trace order" if self.ordered else "in a shuffled order (the trace keeps no batch order)"
        return f"checked by replay on {self.batches:,} batches ({how}, {self.rounds} rounds): " + "; ".join(parts)

    def to_json(self) -> dict[str, Any]:
        return {
            "batches": self.batches,
            "of": self.of,
            "every": self.every,
            "rounds": self.rounds,
            "ordered": self.ordered,
            "device": self.device,
            "created": self.created,
            "total_margin": self.total_margin,
            "difference_margin": self.difference_margin,
            "eager_margin": self.total_margin_for(True) if self.eager_checked else None,
            "lists": [c.to_json() for c in self.lists],
        }

    @classmethod
    def from_json(cls, obj: Any, where: str | None = None) -> ModelCheck:
        """A ModelCheck from its JSON (types checked by the calibration file's schema)."""
        lists = [
            ListCheck(
                str(c["name"]),
                [int(b) for b in c["buckets"]],
                float(c["predicted_ms"]),
                float(c["measured_ms"]),
                [float(x) for x in c.get("round_totals_ms") or []],
            )
            for c in obj["lists"]
        ]
        if len(lists) < 2:
            raise InputError("model_check needs at least two lists replayed", where)
        rounds = int(obj["rounds"])
        if any(len(c.round_totals_ms) not in (0, rounds) for c in lists):
            raise InputError(f"model_check: every list keeps {rounds} round totals (its rounds)", where)
        return cls(
            lists=lists,
            batches=int(obj["batches"]),
            of=int(obj["of"]),
            every=int(obj["every"]),
            rounds=rounds,
            ordered=bool(obj.get("ordered", True)),
            device=obj.get("device"),
            created=obj.get("created"),
        )


def not_checked_reason(cal) -> str:
    """Why a calibration carries no model check, in the words a table prints."""
    meta = cal.meta if isinstance(cal.meta, dict) else {}
    skipped = meta.get("model_check_skipped")
    if isinstance(skipped, str) and skipped:
        return skipped
    fmt = meta.get("format_version")
    if meta.get("format") == "csv" or (isinstance(fmt, int) and fmt < 4):
        return "a calibration written before format 4 (calibrate on a trace again to check it)"
    if not meta.get("sizes_from"):
        return "calibrated on sizes, not on a trace (calibrate --sizes-from TRACE checks it)"
    return "not run"


def trace_sequence(trace, seed: int = 0) -> tuple[np.ndarray, np.ndarray, bool]:
    """(tokens, requests, ordered): the trace's batches one by one, in the order the server
    ran them when the trace keeps its per-batch columns, else its (tokens, requests) mix
    expanded and shuffled with `seed` (ordered False)."""
    cols = trace.batches or {}
    tok = cols.get("forward_tokens")
    if tok is not None and len(tok):
        t = np.asarray(tok, dtype=np.int64)
        req = cols.get("new_seq")
        r = np.ones_like(t) if req is None else np.asarray(req, dtype=np.int64)
        r = np.where(r >= 1, np.minimum(r, t), 1)
        return t, r, True
    from bcgtune.core.trace.mix import batch_mix

    mix = batch_mix(trace)
    t = np.repeat(mix.tokens, mix.counts)
    r = np.repeat(mix.requests, mix.counts)
    order = np.random.default_rng(seed).permutation(t.size)
    return t[order], r[order], False


def sample_every(n_batches: int, max_batches: int) -> int:
    """The step that keeps at most `max_batches` of `n_batches` (every Nth, the first kept)."""
    if max_batches < 1:
        raise InputError(f"must be >= 1, got {max_batches}", "--check-batches")
    return max(1, -(-int(n_batches) // int(max_batches)))
