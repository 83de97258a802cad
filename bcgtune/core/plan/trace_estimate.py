"""From a proof run on some of a trace's batches to claims about the whole trace.

A proof replays the trace's batches in trace order under each list. When the whole trace
fits the time it has, it replays every batch, and what it measures is the trace's: the only
error left is the measurement's. Otherwise it replays a stratified sample, and its totals
are turned into whole-trace estimates by the time model (a model-assisted, "difference"
estimator, as survey sampling does with a good predictor).

The design (`proof_design`). Each batch falls in a stratum: the buckets the lists give it
(the recommended list's, SGLang's ladder's, the optimum's; 0 for eager), so batches that
the lists run alike are sampled together and the ones that tell the lists apart are sampled
for what they are. Batches where the recommended list and the optimum differ are always
taken (their stratum is replayed whole) while they fill at most MUST_SHARE of the budget;
beyond that they are sampled like the rest (the strata tell the two lists apart). The other
strata share what is left in proportion to their predicted time (a stratum's residual
spread grows with its batches' time), at least two batches each (a spread needs two),
every k-th in trace order from a seeded start, so the
sample keeps the trace's order and its mix. When there are more strata than the budget holds
two of, strata are merged (the recommended list's bucket alone, then bands of predicted
time).

The estimate of a list's total over the trace, with p_i its predicted time of batch i and
y_i its measured time (the median over the proof's rounds):

    T^ = sum over the trace of p_i + sum over strata h of N_h * mean over the sample of (y_i - p_i)

The model supplies what the sample cannot see (which batches the trace holds), the sample
corrects the model where it errs (its residuals y - p), and the model's error on the batches
left out is the residuals' spread:

    V_sampling = sum_h N_h^2 (1 - n_h / N_h) s_h^2 / n_h

(s_h^2: the residuals' variance in stratum h; a stratum of one sampled batch takes the pooled
relative variance of the others). A difference of two lists is estimated the same way on
the per-batch differences, over the batches the two run differently only: where both run a
batch in the same captured graph (or both eagerly) its true difference is exactly 0.

What else the interval holds, each added as a variance:
  * rounds: the spread of the sample's expanded total from round to round over R rounds (the
    drift of the device while the proof ran; paired for a difference);
  * capture: each graph of this capture sits off the mean of all captures of its size by a
    small offset (`capture_sd` of its time) that the server's own capture will not share:
    capture_sd^2 x the sum over buckets of (the graph time the list runs in it)^2 (for a
    difference, the net of the two lists per bucket);
  * level (totals only): a server process runs every list faster or slower together than this
    one (`level_sd`); a difference and a gain cancel it but for its share of the difference;
  * host (eager forwards that are launch-bound): the host's speed moves eager's time
    (`host_sd` of the launch-bound part).
The half-width is t(0.975, df) x the square root of the sum, with df by Welch-Satterthwaite
(n - strata for the sampling part, R - 1 for the rounds, unbounded for the stated allowances).
The gain in % is -D / T(ladder), its half-width from D's and T's (added, not in quadrature:
they are not independent).

The allowances are bcgtune's noise profile (engines/sim/noise.py, fitted on an H200): stated,
not measured by the run, and the output says so. benchmarks/tune_coverage.py measures how
often these intervals hold the truth on the simulated device. Pure numpy; no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from bcgtune.core.sglang.replay import DEFAULT_PADDING_FACTOR, assign_buckets
from bcgtune.core.stats import t_quantile_975

MIN_PER_STRATUM = 2
MUST_SHARE = 0.6  # the batches two lists run differently are replayed whole while they fill at most this share of the budget


@dataclass(frozen=True)
class Allowances:
    """Stated relative sds of what one run cannot measure (see the module)."""

    capture_sd: float
    level_sd: float
    host_sd: float
    source: str = "bcgtune's noise profile, fitted on an H200 (benchmarks/fit_sim_noise.py)"

    def to_json(self) -> dict[str, Any]:
        return {"capture_sd": self.capture_sd, "level_sd": self.level_sd, "host_sd": self.host_sd, "source": self.source}


def chosen_buckets(tokens: np.ndarray, buckets: Sequence[int], factor: float = DEFAULT_PADDING_FACTOR) -> np.ndarray:
    """Per batch, the bucket a list replays it in (0: eager), by SGLang's rule."""
    tok = np.asarray(tokens, dtype=np.int64)
    bl = np.unique(np.asarray(list(buckets), dtype=np.int64))
    if not bl.size:
        return np.zeros(tok.size, dtype=np.int64)
    c, ok = assign_buckets(tok, bl, factor)
    return np.where(ok, c, 0).astype(np.int64)


@dataclass(frozen=True)
class ProofDesign:
    """The batches a proof replays: their positions in the trace (ascending: trace order),
    each one's stratum, and per stratum its size in the trace and in the sample."""

    index: np.ndarray
    stratum_of_trace: np.ndarray  # per trace batch, its stratum
    trace_counts: np.ndarray  # N_h
    sample_counts: np.ndarray  # n_h
    certain: np.ndarray  # per stratum: replayed whole because the recommended list and the optimum differ there
    key: str  # how the strata were formed
    n_trace: int

    @property
    def whole(self) -> bool:
        return int(self.index.size) == self.n_trace

    @property
    def strata(self) -> int:
        return int(self.trace_counts.size)

    @property
    def stratum_of_sample(self) -> np.ndarray:
        return self.stratum_of_trace[self.index]

    @property
    def weights(self) -> np.ndarray:
        """Per sampled batch, how many trace batches it stands for (N_h / n_h)."""
        h = self.stratum_of_sample
        return self.trace_counts[h] / self.sample_counts[h]

    def to_json(self) -> dict[str, Any]:
        return {
            "sampled_batches": int(self.index.size),
            "trace_batches": self.n_trace,
            "whole_trace": self.whole,
            "strata": self.strata,
            "strata_by": self.key,
            "always_replayed": int(self.trace_counts[self.certain].sum()),
        }


def _strata(keys: np.ndarray) -> np.ndarray:
    """Stratum ids (0..H-1) of per-batch key rows, in order of first appearance."""
    _, first, inv = np.unique(keys, axis=0, return_index=True, return_inverse=True)
    order = np.argsort(np.argsort(first))
    return order[np.asarray(inv).ravel()]


def proof_design(
    tokens: np.ndarray,
    lists: Mapping[str, Sequence[int]],
    weight: np.ndarray,
    budget_batches: int,
    *,
    must_differ: tuple[str, str] | None = None,
    seed: int = 0,
    factor: float = DEFAULT_PADDING_FACTOR,
) -> ProofDesign:
    """The batches to replay: every batch when the budget holds the trace, else the
    stratified sample the module describes. `lists`: name -> buckets (their buckets per batch
    form the strata); `weight`: a batch's predicted time (its allocation weight);
    `must_differ`: two list names whose differing batches are always replayed."""
    tok = np.asarray(tokens, dtype=np.int64)
    n = int(tok.size)
    w = np.maximum(np.asarray(weight, dtype=np.float64), 1e-12)
    cols = [chosen_buckets(tok, b, factor) for b in lists.values() if len(b)]
    if not cols:
        cols = [np.zeros(n, dtype=np.int64)]
    must = np.zeros(n, dtype=bool)
    budget = max(1, int(budget_batches))
    if must_differ is not None:
        a, b = must_differ
        must = chosen_buckets(tok, lists[a], factor) != chosen_buckets(tok, lists[b], factor)
        if must.sum() > MUST_SHARE * budget:  # too many to replay whole: sampled like the rest, first in line
            must = np.zeros(n, dtype=bool)
    if budget >= n:
        sid = np.zeros(n, dtype=np.int64)
        return ProofDesign(np.arange(n), sid, np.asarray([n]), np.asarray([n]), np.asarray([True]), "the whole trace", n)
    first = cols[0]
    band = np.minimum(np.floor(np.log2(w / w.min()) * 2), 62).astype(np.int64)  # half-octave bands of predicted time
    tries = [
        ("the bucket each list gives a batch", np.stack(cols, axis=1)),
        ("the recommended list's bucket, and whether the other lists run the batch alike",
         np.stack([first, *(c != first for c in cols[1:])], axis=1)),
        ("the recommended list's bucket", first[:, None]),
        ("bands of predicted time", band[:, None]),
    ]  # fmt: skip
    free = budget - int(must.sum())
    for key, keys in tries:
        keys = np.concatenate([keys, must[:, None].astype(np.int64)], axis=1)
        sid = _strata(keys)
        counts = np.bincount(sid)
        open_ = np.ones(counts.size, dtype=bool)
        open_[np.unique(sid[must])] = False
        need = int(np.minimum(counts[open_], MIN_PER_STRATUM).sum())
        if need <= max(free, 0) or key == tries[-1][0]:
            break
    certain = ~open_
    alloc = counts.copy()
    if open_.any():
        alloc[open_] = _allocate(counts[open_], np.bincount(sid, weights=w, minlength=counts.size)[open_], max(free, 0))
    index = np.sort(np.concatenate([_systematic(np.flatnonzero(sid == h), int(alloc[h]), seed + h) for h in range(counts.size)]))
    return ProofDesign(index, sid, counts, np.bincount(sid[index], minlength=counts.size), certain, key, n)


def _allocate(counts: np.ndarray, weights: np.ndarray, total: int) -> np.ndarray:
    """Sample sizes per stratum: at least min(N_h, 2) (at least 1 when the budget is short),
    the rest in proportion to the stratum's predicted time, never above N_h."""
    floor = np.minimum(counts, MIN_PER_STRATUM)
    if floor.sum() > total:
        floor = np.minimum(counts, 1)
    n = floor.copy()
    left = total - int(n.sum())
    share = weights / max(float(weights.sum()), 1e-12)
    while left > 0:
        room = counts - n
        if not (room > 0).any():
            break
        want = share * (n.sum() + left) - n
        want[room <= 0] = -np.inf
        h = int(np.argmax(want))
        take = int(min(room[h], max(1, min(left, math.floor(want[h]) if np.isfinite(want[h]) and want[h] >= 1 else 1))))
        n[h] += take
        left -= take
    return n


def _systematic(members: np.ndarray, k: int, seed: int) -> np.ndarray:
    """k of a stratum's trace positions, every (N/k)-th from a seeded start: spread over the
    trace in its order."""
    if k >= members.size:
        return members
    if k <= 0:
        return members[:0]
    start = np.random.default_rng(seed).uniform(0, members.size / k)
    pos = np.floor(start + np.arange(k) * (members.size / k)).astype(np.int64)
    return members[np.minimum(pos, members.size - 1)]


@dataclass(frozen=True)
class TraceEstimate:
    """An estimate over the whole trace with its 95% interval, and what the interval holds
    (each part's variance, in the estimate's units squared)."""

    center: float
    half: float
    df: float
    parts: dict[str, float] = field(default_factory=dict)
    sampled: int = 0
    trace: int = 0

    def contains(self, x: float) -> bool:
        return self.center - self.half <= x <= self.center + self.half

    def to_json(self) -> dict[str, Any]:
        return {
            "center": self.center,
            "half": self.half,
            "df": None if math.isinf(self.df) else self.df,
            "parts_half": {k: 1.959963984540054 * math.sqrt(max(v, 0.0)) for k, v in self.parts.items()},
            "sampled_batches": self.sampled,
            "trace_batches": self.trace,
        }


def _combine(parts: dict[str, tuple[float, float]]) -> tuple[float, float]:
    """(total variance, Welch-Satterthwaite df) of independent parts (variance, df)."""
    v = sum(max(p[0], 0.0) for p in parts.values())
    den = sum(max(p[0], 0.0) ** 2 / p[1] for p in parts.values() if p[1] < math.inf and p[0] > 0)
    df = v * v / den if den > 0 else math.inf
    return v, df


def _t(df: float) -> float:
    return 1.959963984540054 if math.isinf(df) or df > 1e6 else t_quantile_975(max(1.0, df))


def _sampling_variance(design: ProofDesign, resid: np.ndarray, pred: np.ndarray, active: np.ndarray) -> tuple[float, float]:
    """(V_sampling, df) of the difference estimator over the strata (`active`: the sampled
    batches that count; the others' residual is exactly 0)."""
    h = design.stratum_of_sample
    big_n = design.trace_counts.astype(np.float64)
    small_n = design.sample_counts.astype(np.float64)
    e = np.where(active, resid, 0.0)
    var_h = np.zeros(design.strata)
    # the residuals' spread relative to the predictions, pooled over every stratum with two or
    # more sampled batches (those replayed whole too: their spread is the model's all the same)
    rel_sum, pooled_df = 0.0, 0
    for s in range(design.strata):
        sel = (h == s) & active
        if sel.sum() >= 2:
            scale = float(np.mean(np.abs(pred[sel]))) or 1.0
            rel_sum += float(np.var(e[sel], ddof=1)) / scale**2 * (int(sel.sum()) - 1)
            pooled_df += int(sel.sum()) - 1
    if pooled_df == 0 and active.sum() >= 2:  # no stratum has two: every sampled batch's relative residual
        rel = e[active] / np.maximum(np.abs(pred[active]), 1e-12)
        rel_sum, pooled_df = float(np.var(rel, ddof=1)) * (int(active.sum()) - 1), int(active.sum()) - 1
    rel_pooled = rel_sum / pooled_df if pooled_df else 0.0
    for s in range(design.strata):
        if small_n[s] >= big_n[s]:
            continue  # replayed whole: no sampling error
        sel = h == s
        scale = float(np.mean(np.abs(pred[sel]))) if sel.any() else 0.0
        if sel.sum() >= 2:
            var_h[s] = float(np.var(e[sel], ddof=1))
        else:
            var_h[s] = rel_pooled * scale**2
    fpc = np.where(big_n > 0, 1.0 - small_n / np.maximum(big_n, 1), 0.0)
    v = float(np.sum(np.where(small_n > 0, big_n**2 * fpc * var_h / np.maximum(small_n, 1), 0.0)))
    return v, float(max(pooled_df, 1))


def _rounds_variance(design: ProofDesign, rounds: np.ndarray) -> tuple[float, float]:
    """(variance, df) of the expanded sample total from its per-round values (batches x R):
    the spread of the run while it ran, over its R rounds."""
    r = np.asarray(rounds, dtype=np.float64)
    if r.ndim != 2 or r.shape[1] < 2:
        return 0.0, math.inf
    totals = design.weights @ r
    return float(np.var(totals, ddof=1)) / r.shape[1], float(r.shape[1] - 1)


def estimate_total(
    design: ProofDesign,
    predicted_trace: np.ndarray,
    measured_rounds: np.ndarray,
    *,
    graph_by_bucket: Mapping[int, float],
    host_ms: float,
    allow: Allowances,
) -> TraceEstimate:
    """A list's total over the trace (ms). `predicted_trace`: its predicted time per trace
    batch; `measured_rounds`: its measured time per sampled batch and round; `graph_by_bucket`:
    the predicted graph time the list runs in each of its buckets over the trace (capture
    offsets); `host_ms`: the predicted launch-bound eager time in it (the host's part)."""
    pred = np.asarray(predicted_trace, dtype=np.float64)
    rounds = np.asarray(measured_rounds, dtype=np.float64)
    y = np.median(rounds, axis=1)
    p_s = pred[design.index]
    resid = y - p_s
    center = float(pred.sum() + design.weights @ resid)
    parts = {
        "sampling": _sampling_variance(design, resid, p_s, np.ones(resid.size, dtype=bool)),
        "rounds": _rounds_variance(design, rounds),
        "capture": ((allow.capture_sd**2) * float(sum(g * g for g in graph_by_bucket.values())), math.inf),
        "level": ((allow.level_sd * center) ** 2, math.inf),
        "host": ((allow.host_sd * host_ms) ** 2, math.inf),
    }
    return _finish(center, parts, design)


def estimate_difference(
    design: ProofDesign,
    predicted_a: np.ndarray,
    predicted_b: np.ndarray,
    rounds_a: np.ndarray,
    rounds_b: np.ndarray,
    differ: np.ndarray,
    *,
    net_graph_by_bucket: Mapping[int, float],
    host_ms: float,
    allow: Allowances,
) -> TraceEstimate:
    """total(A) - total(B) over the trace (ms): per-batch paired differences, over the
    batches the two lists run differently (`differ`, per trace batch); `net_graph_by_bucket`:
    per bucket, A's graph time in it minus B's over the trace's differing batches."""
    pa = np.asarray(predicted_a, dtype=np.float64)
    pb = np.asarray(predicted_b, dtype=np.float64)
    dif = np.asarray(differ, dtype=bool)
    q = np.where(dif, pa - pb, 0.0)
    ra, rb = np.asarray(rounds_a, dtype=np.float64), np.asarray(rounds_b, dtype=np.float64)
    act = dif[design.index]
    d_rounds = np.where(act[:, None], ra - rb, 0.0)
    y = np.median(d_rounds, axis=1)  # the paired difference of each batch, its median over rounds
    q_s = q[design.index]
    resid = np.where(act, y - q_s, 0.0)
    center = float(q.sum() + design.weights @ resid)
    parts = {
        "sampling": _sampling_variance(design, resid, np.where(act, pa[design.index], 0.0), act),
        "rounds": _rounds_variance(design, d_rounds),
        "capture": ((allow.capture_sd**2) * float(sum(g * g for g in net_graph_by_bucket.values())), math.inf),
        "level": ((allow.level_sd * center) ** 2, math.inf),
        "host": ((allow.host_sd * host_ms) ** 2, math.inf),
    }
    return _finish(center, parts, design)


def _finish(center: float, parts: dict[str, tuple[float, float]], design: ProofDesign) -> TraceEstimate:
    v, df = _combine(parts)
    half = _t(df) * math.sqrt(v)
    return TraceEstimate(center, half, df, {k: p[0] for k, p in parts.items()}, int(design.index.size), design.n_trace)


def gain_pct(diff: TraceEstimate, ladder: TraceEstimate) -> tuple[float, float]:
    """(gain %, half-width %) of a list over the ladder: -D / T(ladder), the half-width
    D's relative half plus the gain times T's relative half (added: not independent).
    T's own level allowance is left out: a shift of every list cancels in the ratio."""
    t = ladder.center
    if t <= 0:
        return 0.0, math.inf
    g = -100.0 * diff.center / t
    t_half_no_level = _t(ladder.df) * math.sqrt(max(sum(v for k, v in ladder.parts.items() if k != "level"), 0.0))
    return g, 100.0 * diff.half / t + abs(g) * t_half_no_level / t


def per_bucket_graph(chosen: np.ndarray, graph_ms: np.ndarray) -> dict[int, float]:
    """Per bucket (chosen > 0), the summed graph time of the batches that replay in it."""
    c = np.asarray(chosen, dtype=np.int64)
    g = np.asarray(graph_ms, dtype=np.float64)
    out: dict[int, float] = {}
    for b in np.unique(c[c > 0]).tolist():
        out[int(b)] = float(g[c == b].sum())
    return out
