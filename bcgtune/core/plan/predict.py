"""Predicted prefill time of bucket lists, with 95% intervals from a calibration's timed rounds.

The statistic. `bcgtune calibrate` times every size in R interleaved rounds: each round runs
every call once, in a fresh shuffled order, so one round is one complete measurement of every
size, and the R rounds are its repeats. For a list L the prediction is, as before, the sum
over the trace's batches of each batch's median time (replayed: the bucket's graph plus its
break time; eager: its eager time). Its interval comes from the list's total in each round,
T_r(L) = the same sum with every size at its round-r value:

    predicted(L) +- t(0.975, R - 1) * sd(T_1(L) .. T_R(L)) / sqrt(R)

(a Student t interval with the spread of the per-round totals; core/stats.round_interval).
Two lists priced on the same trace use the same batches and the same rounds, so their
difference is paired: d_r = T_r(A) - T_r(B), and

    predicted(A) - predicted(B) +- t(0.975, R - 1) * sd(d_1 .. d_R) / sqrt(R).

A drift that moves a whole round (a GPU clock state, a busy host) moves both lists of a pair
alike and cancels in d_r; it stays in the interval of each total. Two lists are "within noise"
of each other when the interval of their difference holds 0.

What the interval covers: the calibration's own round-to-round noise on this GPU and host.
It does not cover a shift of the whole machine between processes (on an H200 every list moved
by up to 1.4% together between three runs; such a shift cancels in differences), nor the
error of interpolating sizes the calibration did not measure (`unmeasured`), nor a host that
launches kernels at another speed: eager forwards of a small model are launch-bound, their
time is the CPU's (`host_bound`), and it moved 29-68% between processes on that H200.

The model's own error. A calibration made on a trace (format 4) carries a model check
(bcgtune.core.plan.model_check): the trace's batches replayed in order under SGLang's ladder and a
sparse list, measured against predicted. From it, u_total (the largest relative error of a
total, |bias| + t se) and u_diff (the largest difference between two lists' relative errors,
plus t times their combined se). Every interval is then widened, the two parts added (not
in quadrature: the model error is a bias, not a noise that averages out):

    total(L):          predicted(L) +- [noise half-width + u_total * predicted(L)]
    difference(A, B):  d +- [paired noise half-width + u_total * |d| + u_diff * max(P_A, P_B)]
    gain_pct(A, B):    the difference's widening in % of predicted(A)

where P_A, P_B are each list's predicted time over the batches the two lists price
differently (another bucket, or replay against eager): the model error of a difference is
bias(A) (T(A) - T(B)) + (bias(A) - bias(B)) T(B), and on batches both lists run the same way
the two errors are the same and cancel. Two lists that differ in one bucket so differ in
model error only on the batches of that bucket.
The widening is recorded in Interval.model_half. Without a model check (formats 1-3, a
calibration on sizes alone, a run that skipped it) the intervals cover the noise only, and
the plan says that they do not cover the model's error.

A calibration that kept one value per size (formats 1 and 2, the CSV) is one round: it gives
no interval, and the plan says so. Pure numpy: no torch, no printing.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from bcgtune.core.plan.optimizer import batch_costs_ms, graph_ms_model, mix_for
from bcgtune.core.sglang.replay import DEFAULT_PADDING_FACTOR, assign_buckets
from bcgtune.core.stats import Interval, distinct, round_interval
from bcgtune.core.trace.mix import BatchMix

# An eager forward whose host launch time is at least this share of its time is launch-bound.
HOST_BOUND_SHARE = 0.8
# Without a host timing: eager at least this many times its replay is mostly launch overhead.
HOST_BOUND_RATIO = 1.5


@dataclass(frozen=True)
class HostBound:
    """How much of the eager time in a trace is host launch time. `share`: of the trace's
    predicted eager time (every batch eager), the part in launch-bound batches; `how`:
    "measured" (host launch time per batch, kept by the calibration) or "inferred" (eager
    time against replay time of the same batch)."""

    batches: int
    of: int
    share: float
    how: str


class TimeModel:
    """One rule and one calibration for every list of a plan: predicted totals with their
    intervals, and paired differences. `steps` (core.plan.dp_steps.DPSteps): price DP-attention
    steps instead of batches."""

    def __init__(
        self,
        sizes,
        counts,
        cal,
        factor: float = DEFAULT_PADDING_FACTOR,
        candidates: str = "trace",
        mix: BatchMix | None = None,
        steps=None,
    ):
        self.cal, self.factor, self.candidates, self.steps = cal, factor, candidates, steps
        self.views = [cal, *cal.round_views()]  # column 0: the medians; 1..R: each round
        if steps is not None:
            from bcgtune.core.plan.dp_steps import step_costs_ms

            costs = [step_costs_ms(steps, v) for v in self.views]
            self.weights = np.ones(steps.n_steps)
            self.unit_tokens = steps.max_tokens
        else:
            m = mix_for(sizes, counts, mix)
            self.mix = m
            costs = [batch_costs_ms(v, m.tokens, m.requests) for v in self.views]
            self.weights = m.counts.astype(np.float64)
            self.unit_tokens = m.tokens
        self.eager = np.stack([c[0] for c in costs], axis=1)  # units x (1 + R)
        self.breaks = np.stack([c[1] for c in costs], axis=1)
        self._totals: dict[tuple[int, ...], np.ndarray] = {}
        self._unit_costs: dict[tuple[int, ...], np.ndarray] = {}  # per unit, its median cost under a list

    @property
    def rounds(self) -> int:
        return len(self.views) - 1 if len(self.views) > 1 else 1

    def _outcome(self, bl: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if self.steps is not None:
            from bcgtune.core.plan.dp_steps import step_outcomes

            return step_outcomes(self.steps, bl, self.factor)
        return assign_buckets(self.mix.tokens, bl, self.factor)

    def totals(self, buckets) -> np.ndarray:
        """[predicted total, then the total in each round] (ms)."""
        bl = distinct(np.asarray(list(buckets), dtype=np.int64))
        key = tuple(bl.tolist())
        got = self._totals.get(key)
        if got is not None:
            return got
        chosen, replay = self._outcome(bl)
        if bl.size:
            g = np.stack([np.asarray(graph_ms_model(v, bl, self.candidates), dtype=np.float64) for v in self.views], axis=1)
            idx = np.clip(np.searchsorted(bl, chosen), 0, bl.size - 1)
            cost = np.where(replay[:, None], g[idx] + self.breaks, self.eager)
        else:
            cost = self.eager
        out = self.weights @ cost
        self._totals[key] = out
        self._unit_costs[key] = cost[:, 0]
        return out

    def _differing(self, a, b) -> tuple[float, float]:
        """(T_A, T_B) over the units (batches or steps) the two lists price differently: the
        part of each total where their model errors can differ."""
        ka = tuple(distinct(np.asarray(list(a), dtype=np.int64)).tolist())
        kb = tuple(distinct(np.asarray(list(b), dtype=np.int64)).tolist())
        self.totals(a), self.totals(b)
        ca, cb = self._unit_costs[ka], self._unit_costs[kb]
        diff = ca != cb
        return float(self.weights[diff] @ ca[diff]), float(self.weights[diff] @ cb[diff])

    @property
    def model_check(self):
        """The calibration's model check (core.plan.model_check.ModelCheck), None when not checked."""
        return getattr(self.cal, "model_check", None)

    def total(self, buckets) -> Interval:
        """The list's predicted total (ms) with its 95% interval, widened by the model error
        when the calibration checked it (the module says how)."""
        t = self.totals(buckets)
        iv = round_interval(t[0], t[1:])
        mc = self.model_check
        return iv if mc is None else iv.widened(mc.total_half(t[0], eager=not len(list(buckets))))

    def difference(self, a, b) -> Interval:
        """predicted(a) - predicted(b) (ms), with its paired 95% interval, widened by the model
        error when the calibration checked it."""
        ta, tb = self.totals(a), self.totals(b)
        d = ta - tb
        iv = round_interval(d[0], d[1:])
        mc = self.model_check
        return iv if mc is None else iv.widened(mc.difference_half(ta[0], tb[0], *self._differing(a, b), *_eager(a, b)))

    def gain_pct(self, a, b) -> Interval:
        """How much less time list b takes than list a, in % of a's: 100 (T(a) - T(b)) / T(a),
        with its paired 95% interval (the same ratio in each round). For a verdict such as
        drift's: b's gain over a is real when the interval's low end is above the threshold."""
        ta, tb = self.totals(a), self.totals(b)
        with np.errstate(divide="ignore", invalid="ignore"):
            g = np.where(ta > 0, 100.0 * (ta - tb) / ta, 0.0)
        iv = round_interval(g[0], g[1:])
        mc = self.model_check
        if mc is None or ta[0] <= 0:
            return iv
        return iv.widened(100.0 * mc.difference_half(ta[0], tb[0], *self._differing(a, b), *_eager(a, b)) / ta[0])

    def unmeasured(self, buckets) -> list[int]:
        """The list's buckets that replay some traced batch at a size the calibration did not
        measure: priced by interpolating its rows."""
        bl = distinct(np.asarray(list(buckets), dtype=np.int64))
        if not bl.size:
            return []
        chosen, replay = self._outcome(bl)
        used = distinct(chosen[replay])
        return used[~np.isin(used, self.cal.tokens)].tolist()

    def outside(self) -> tuple[int, int, int, int]:
        """(units, of units, smallest measured, largest measured): the traced batches (or
        steps) whose size lies outside the sizes the calibration timed their eager and break
        cost at, so those costs are extrapolated."""
        cal = self.cal
        measured = cal.batches.tokens if cal.runner == "breakable" and cal.batches is not None else cal.tokens
        lo, hi = int(measured.min()), int(measured.max())
        if self.steps is not None:  # a step is outside when one of its ranks' counts is
            tok = self.steps.tokens
            out = np.logical_or.reduceat((tok < lo) | (tok > hi), self.steps.starts)
            return int(out.sum()), int(self.steps.n_steps), lo, hi
        tok, w = self.mix.tokens, self.mix.counts
        out = (tok < lo) | (tok > hi)
        return int(w[out].sum()), int(w.sum()), lo, hi

    def host_bound(self) -> HostBound:
        """How much of the trace's eager time is host launch time (see HostBound)."""
        cal = self.cal
        tok = self.mix.tokens if self.steps is None else self.steps.tokens
        req = self.mix.requests if self.steps is None else self.steps.requests
        w = self.mix.counts.astype(np.float64) if self.steps is None else np.ones(tok.size)
        eager, brk = batch_costs_ms(cal, tok, req)
        if cal.runner == "breakable" and cal.batches is not None and cal.batches.eager_host_ms is not None:
            bt = cal.batches
            share = np.asarray(bt.lookup("eager_host_ms", tok, req), dtype=np.float64) / np.maximum(eager, 1e-9)
            bound, how = share >= HOST_BOUND_SHARE, "measured"
        else:
            rows = cal.tokens
            b = rows[np.clip(np.searchsorted(rows, tok), 0, rows.size - 1)]
            replay = np.asarray(graph_ms_model(cal, b, "calibration"), dtype=np.float64) + brk
            bound, how = eager >= HOST_BOUND_RATIO * replay, "inferred"
        total = float((w * eager).sum())
        share_t = float((w * eager)[bound].sum()) / total if total > 0 else 0.0
        return HostBound(int(w[bound].sum()), int(w.sum()), share_t, how)


def _eager(a, b) -> tuple[bool, bool]:
    """Which of two bucket lists is eager (no graphs): its model error is its own kind's."""
    return not len(list(a)), not len(list(b))


def per_batch_ms(
    cal, tokens, requests, buckets, candidates: str = "trace", factor: float = DEFAULT_PADDING_FACTOR
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(predicted time, its graph part, the bucket chosen: 0 eager) of each batch of a
    sequence under a list, at the calibration's medians: what TimeModel sums, batch by batch."""
    tok = np.asarray(tokens, dtype=np.int64)
    req = np.asarray(requests, dtype=np.int64)
    eager, brk = batch_costs_ms(cal, tok, req)
    bl = np.unique(np.asarray(list(buckets), dtype=np.int64))
    if not bl.size:
        return eager, np.zeros_like(eager), np.zeros(tok.size, dtype=np.int64)
    chosen, replay = assign_buckets(tok, bl, factor)
    g = np.asarray(graph_ms_model(cal, np.where(replay, chosen, bl[0]), candidates), dtype=np.float64)
    graph = np.where(replay, g, 0.0)
    return np.where(replay, g + brk, eager), graph, np.where(replay, chosen, 0).astype(np.int64)


def host_share(cal, tokens, requests) -> np.ndarray:
    """Per batch, the part of its eager time that waits on the host launching it, and so moves
    with the host's speed: the host's launch time of one forward (the calibration's smallest
    eager time: a forward of the fewest tokens waits on its launches) where it exceeds the
    device's own work (a replay of the batch in a bucket of its size), as a share of eager's
    time; 0 where the device's work hides the launches."""
    tok = np.asarray(tokens, dtype=np.int64)
    req = np.asarray(requests, dtype=np.int64)
    eager, brk = batch_costs_ms(cal, tok, req)
    eager = np.maximum(eager, 1e-9)
    bt = cal.batches
    measured = bt.eager_ms if cal.runner == "breakable" and bt is not None else cal.eager_ms
    launch = float(np.min(measured)) if measured is not None and np.size(measured) else 0.0
    device = np.asarray(graph_ms_model(cal, tok, "trace"), dtype=np.float64) + brk
    return np.where(launch > device, np.minimum(launch / eager, 1.0), 0.0)
