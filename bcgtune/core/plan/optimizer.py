"""Exact optimal prefill bucket lists.

Problem. A trace is a histogram: distinct forward sizes x_1 < ... < x_m with batch counts
w_i. Choose at most K buckets, multiples of A, none above M. A batch of n tokens uses the
smallest bucket b >= n and replays iff b <= factor * n (SGLang's rule, core/sglang/replay.py);
otherwise it runs eager. Objectives:

  padding  lexicographic: fewest eager batches, then fewest padded tokens
           (sum over replayed batches of w * (b - n)).
  time     predicted prefill time (from a calibration): a batch of n tokens from r requests
           costs t_graph(b) + t_break(n, r) replayed and t_eager(n, r) eager. t_graph is the
           bucket's captured graph (the whole forward, or the breakable runner's segments);
           t_break is what the breakable runner runs eagerly between segments on the real
           rows (0 for whole-forward graphs), and does not depend on b. Not lexicographic:
           eager may win.

Candidates. Each bucket serves the sizes between the previous bucket and itself. Lowering a
bucket to the aligned round-up of the largest size it serves changes no assignment, lowers
padding and only widens the replay window, so for `padding` an optimal list exists within
C = {ceil_A(x_i)} (those <= M). For `time`, lowering can also turn an eager batch into a
(slower) replay, so the smallest aligned values above each replay threshold factor * x_i are
candidates too; with t_graph non-decreasing in b (we take its running maximum: a larger
graph never runs faster, measured dips are noise) an optimum lies within that set.

DP. Index candidates c_1 < ... < c_p, and let f_k(j) be the least cost of the sizes <= c_j
using at most k buckets, the largest being c_j. With the previous bucket c_i (i = 0: none):

    f_k(j) = min_i  f_{k-1}(i) + C(i, j),      f_{k-1}(0) = 0,

where C(i, j) is the cost of the sizes in (c_i, c_j] served by c_j: those below c_j / factor
run eager, the rest replay. Write E, W, V for prefix sums over sizes of the eager cost, the
weight and the per-size replay offset, h_j for the number of sizes below c_j / factor, and
e_i for the number of sizes <= c_i. Then

    e_i <= h_j  (part A):  C = E[h_j] - E[e_i] + u_j (W[e_j] - W[h_j]) - (V[e_j] - V[h_j])
    e_i >  h_j  (part B):  C = u_j (W[e_j] - W[e_i]) - (V[e_j] - V[e_i])

with u_j = c_j, V = sum w x for padding (eager cost BIG per batch, BIG > any total
padding) and u_j = t_graph(c_j), V = -sum of t_break over the batches for time (a
bucket-independent replay cost enters like the padding objective's V: only the lines'
intercepts move, so the envelope argument below holds unchanged). E sums t_eager over the
batches of each size, whatever their request counts. Part A is a prefix minimum of
f(i) - E[e_i]: O(p). Part B is a lower envelope of lines (slope -W[e_i], intercept
f(i) + V[e_i]) queried at u_j over a window i in [a_j, j - 1] whose ends never move left;
u_j is non-decreasing, so the leftmost optimal i is non-decreasing in j (exchange argument:
the lines are ordered by slope), and a divide-and-conquer over rows finds every row's
minimum in O(p log p) evaluations — vectorized level by level with numpy. K layers give
O(K p log p) overall (30,000 candidates, K = 32: about a second here), against O(K p^2) for
the naive DP. Every f_k(j) for every k is kept, which also yields the waste-vs-K curve and
the memory-budgeted optimum (the budget depends only on k and the largest bucket).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from bcgtune.core.sglang.ladder import ceil_to
from bcgtune.core.sglang.replay import DEFAULT_PADDING_FACTOR
from bcgtune.core.stats import distinct
from bcgtune.errors import InputError

_INT_LIMIT = 2**61
# The waste-vs-K curve reports at most this many K (each point is one reconstruction).
CURVE_MAX_POINTS = 64
# The DP keeps K x (candidates + 1) costs and argmins: refuse sizes that would not fit.
DP_MAX_CELLS = 60_000_000


@dataclass
class Solution:
    buckets: list[int]
    cost: float  # objective value (padding: eager * big + padded; time: ms)
    eager_batches: int
    padded_tokens: int
    # curve[k-1] = (eager_batches, padded_tokens, cost) of the optimum with at most k buckets
    curve: list[dict] = field(default_factory=list)
    objective: str = "padding"
    candidates: int = 0


@dataclass
class _Prep:
    sizes: np.ndarray
    counts: np.ndarray
    cand: np.ndarray  # candidate bucket values, ascending (index j = 1..p maps to cand[j-1])
    end: np.ndarray  # end[j] = number of sizes <= c_j; end[0] = 0 (length p + 1)
    h: np.ndarray  # h[j] = number of sizes x with factor * x < c_j; h[0] unused
    factor: float


def _prepare(sizes, counts, align: int, max_bucket: int | None, factor: float, extra_thresholds: bool, fixed_cand=None) -> _Prep:
    sizes = np.asarray(sizes, dtype=np.int64)
    counts = np.asarray(counts, dtype=np.int64)
    if sizes.ndim != 1 or sizes.shape != counts.shape:
        raise InputError("sizes and counts must be flat arrays of equal length")
    if sizes.size == 0:
        raise InputError("trace is empty: no prefill batches")
    if (sizes <= 0).any():
        raise InputError("forward sizes must be positive")
    if (counts <= 0).any():
        raise InputError("batch counts must be positive")
    if (np.diff(sizes) <= 0).any():
        order = np.argsort(sizes, kind="stable")
        sizes, counts = sizes[order], counts[order]
        uniq, inv = np.unique(sizes, return_inverse=True)
        counts = np.bincount(inv, weights=counts).astype(np.int64)
        sizes = uniq
    if align < 1:
        raise InputError(f"alignment must be >= 1, got {align}")
    if factor < 1:
        raise InputError(f"padding factor must be >= 1, got {factor}")
    if fixed_cand is not None:
        # explicit candidate buckets (measured calibration rows) that are multiples of the
        # alignment; a row that replays no traced size is kept too (it can still route the
        # sizes below it to eager, which is SGLang's rule, not a choice)
        cand = np.asarray(fixed_cand, dtype=np.int64)
        cand = cand[cand % align == 0]
    else:
        cand = ceil_to(sizes, align)
    if fixed_cand is None and extra_thresholds:
        # smallest aligned value strictly above factor * x: where x turns eager
        thr = (np.floor(factor * sizes.astype(np.float64)).astype(np.int64) // align + 1) * align
        cand = np.concatenate([cand, thr])
    if max_bucket is not None:
        cand = cand[cand <= max_bucket]
    cand = distinct(cand)
    end = np.concatenate([[0], np.searchsorted(sizes, cand, side="right")]).astype(np.int64)
    # number of sizes with factor * x < c  <=>  x < c / factor
    h = np.concatenate([[0], np.searchsorted(sizes * factor, cand.astype(np.float64), side="left")]).astype(np.int64)
    h = np.minimum(h, end)  # sizes below c/factor that are also <= c
    return _Prep(sizes, counts, cand, end, h, factor)


def _require_candidates(prep: _Prep, align: int, max_bucket: int | None) -> None:
    if prep.cand.size == 0:
        smallest = ceil_to(int(prep.sizes[0]), align)
        raise InputError(
            f"{max_bucket} is below every traced size (the smallest needs a bucket of {smallest})",
            field="max_bucket",
        )


def _check_dp_size(prep: _Prep, max_buckets: int) -> None:
    k = min(max_buckets, max(prep.cand.size, 1))
    if k * (prep.cand.size + 1) > DP_MAX_CELLS:
        most = max(1, DP_MAX_CELLS // (prep.cand.size + 1))
        raise InputError(
            f"{max_buckets} buckets over {prep.cand.size:,} candidate sizes is too large a search "
            f"(at most {most} buckets for this trace; a coarser alignment gives fewer candidates)",
            field="max_buckets",
        )


def _monotone_row_argmin(n_rows: int, lo: np.ndarray, hi: np.ndarray, value: Callable, big) -> np.ndarray:
    """Leftmost argmin per row j of value(j, i) over i in [lo[j], hi[j]] (window ends
    non-decreasing in j; rows with an empty window get lo[j]), for a matrix whose leftmost
    row argmin is non-decreasing. Divide and conquer, one vectorized pass per level."""
    opt = np.zeros(n_rows, dtype=np.int64)
    if n_rows == 0:
        return opt
    jl = np.array([0], dtype=np.int64)
    jr = np.array([n_rows - 1], dtype=np.int64)
    ol = np.array([int(lo.min())], dtype=np.int64)
    orr = np.array([int(hi.max())], dtype=np.int64)
    while jl.size:
        mid = (jl + jr) // 2
        a = np.maximum(ol, lo[mid])
        b = np.minimum(orr, hi[mid])
        empty = a > b
        length = np.where(empty, 1, b - a + 1)
        start = np.where(empty, np.minimum(np.maximum(lo[mid], ol), orr), a)
        offsets = np.concatenate([[0], np.cumsum(length)[:-1]])
        total = int(length.sum())
        rows = np.repeat(mid, length)
        cols = np.repeat(start - offsets, length) + np.arange(total, dtype=np.int64)
        vals = value(rows, cols)
        vals = np.where(np.repeat(empty, length), big, vals)
        mins = np.minimum.reduceat(vals, offsets)
        hit = np.flatnonzero(vals == np.repeat(mins, length))
        first = hit[np.searchsorted(hit, offsets)]
        best = cols[first]
        best = np.where(empty, np.clip(lo[mid], ol, orr), best)
        opt[mid] = best
        left = jl <= mid - 1
        right = mid + 1 <= jr
        jl, jr, ol, orr = (
            np.concatenate([jl[left], (mid + 1)[right]]),
            np.concatenate([(mid - 1)[left], jr[right]]),
            np.concatenate([ol[left], best[right]]),
            np.concatenate([best[left], orr[right]]),
        )
    return opt


def _solve_layers(prep: _Prep, K: int, E: np.ndarray, W: np.ndarray, V: np.ndarray, u: np.ndarray, big):
    """Run K DP layers. Returns f (K x (p+1)), arg (K x (p+1)); column 0 unused."""
    p = prep.cand.size
    end, h = prep.end, prep.h
    dtype = E.dtype
    f = np.zeros((K, p + 1), dtype=dtype)
    arg = np.zeros((K, p + 1), dtype=np.int64)
    if p == 0:
        return f, arg
    j = np.arange(1, p + 1)
    ej, hj, uj = end[j], h[j], u[j]
    # constant parts per row
    a_const = E[hj] + uj * (W[ej] - W[hj]) - (V[ej] - V[hj])  # part A: + (F(i) - E[e_i]) min
    b_const = uj * W[ej] - V[ej]  # part B: + min_i (F(i) + V[e_i] - u_j W[e_i])
    # t_j = last i (0..j-1) with end[i] <= h_j  (end is strictly increasing over i >= 0 for
    # padding; non-decreasing for time, so take the last such index)
    t = np.minimum(np.searchsorted(end, hj, side="right") - 1, j - 1)
    lo_b = t + 1  # part-B window [t_j + 1, j - 1], both ends non-decreasing in j
    hi_b = j - 1
    end_i = end  # indexable by i
    for k in range(K):
        F = np.zeros(p + 1, dtype=dtype)
        if k > 0:
            F[1:] = f[k - 1, 1:]
        # part A: prefix min of G(i) = F(i) - E[end_i] over i in [0, t_j]
        G = F - E[end_i]
        runmin = np.minimum.accumulate(G)
        prev = np.concatenate([[G[0] + 1 if dtype.kind == "i" else np.inf], runmin[:-1]])
        is_new = G < prev
        argrun = np.maximum.accumulate(np.where(is_new, np.arange(p + 1), 0))
        costA = a_const + runmin[t]
        argA = argrun[t]
        if k == 0:
            f[0, 1:] = a_const + G[0]  # only i = 0 (no previous bucket): C(0, j)
            # C(0, j): end_0 = 0 <= h_j always, so part A with i = 0
            arg[0, 1:] = 0
            continue
        # part B over rows j (0-based r = j - 1), cols i in [lo_b, hi_b]
        Fb = F + V[end_i]
        Wb = W[end_i]

        def value(rows, cols, Fb=Fb, Wb=Wb):
            return Fb[cols] - uj[rows] * Wb[cols]

        has_b = lo_b <= hi_b
        if has_b.any():
            optb = _monotone_row_argmin(p, lo_b, hi_b, value, big)
            costB = np.where(has_b, b_const + Fb[optb] - uj * Wb[optb], big)
        else:
            optb = np.zeros(p, dtype=np.int64)
            costB = np.full(p, big, dtype=dtype)
        takeB = costB < costA
        f[k, 1:] = np.where(takeB, costB, costA)
        arg[k, 1:] = np.where(takeB, optb, argA)
    return f, arg


_DENSE_MAX_CANDIDATES = 5_000  # K * p^2 stays within seconds (a 64-token grid to 16k has 256)


def _solve_layers_dense(prep: _Prep, K: int, E: np.ndarray, W: np.ndarray, V: np.ndarray, u: np.ndarray):
    """The same DP as `_solve_layers` (time objective) with no assumption on u: every
    previous bucket i < j is tried, O(K p^2). For measured bucket times, which are not monotone
    in the bucket (a GPU's tile-aligned sizes replay faster than the sizes just below them,
    benchmarks/RESULTS.md), so the quadrangle inequality behind the O(p log p) rows fails."""
    p = prep.cand.size
    f = np.zeros((K, p + 1))
    arg = np.zeros((K, p + 1), dtype=np.int64)
    if p == 0:
        return f, arg
    end, h = prep.end, prep.h
    Ei = E[end]  # E at e_i for every i = 0..p
    rows_per_block = max(1, 4_000_000 // (p + 1))
    cols = np.arange(p + 1)
    for k in range(K):
        F = np.zeros(p + 1)
        if k > 0:
            F[1:] = f[k - 1, 1:]
        for start in range(1, p + 1, rows_per_block):
            J = np.arange(start, min(p + 1, start + rows_per_block))
            if k == 0:
                lo = h[J]  # i = 0: e_0 = 0 <= h_j
                f[0, J] = E[lo] + u[J] * (W[end[J]] - W[lo]) - (V[end[J]] - V[lo])
                continue
            lo = np.maximum(end[None, :], h[J][:, None])
            val = F[None, :] + E[lo] - Ei[None, :] + u[J][:, None] * (W[end[J]][:, None] - W[lo]) - (V[end[J]][:, None] - V[lo])
            val[cols[None, :] >= J[:, None]] = np.inf
            best = np.argmin(val, axis=1)
            f[k, J] = val[np.arange(J.size), best]
            arg[k, J] = best
    return f, arg


def _reconstruct(prep: _Prep, arg: np.ndarray, k: int, j: int) -> list[int]:
    """Buckets of the optimum f_k(j) (k 0-based layer), following the stored argmins."""
    out = []
    while j > 0 and k >= 0:
        out.append(int(prep.cand[j - 1]))
        j = int(arg[k, j])
        k -= 1
    return sorted(out)


def _best_per_k(prep: _Prep, f, E, allowed=None) -> tuple[list[tuple], tuple]:
    """Per k (at most k + 1 buckets, index k), the best (cost, layer, column) and the best
    overall. total(k, j) = f_k(j) + eager cost of the sizes above c_j; k = 0 (no bucket)
    costs E[m]. `allowed(k) -> bool array over candidates` filters (k, largest bucket)
    pairs, e.g. by a graph-memory budget."""
    p = prep.cand.size
    no_bucket = E[prep.sizes.size]
    best_cost, best_k, best_j = no_bucket, -1, 0
    per_k: list[tuple] = []
    tail = no_bucket - E[prep.end[1:]]  # eager cost of the sizes above each candidate
    for k in range(f.shape[0] if p else 0):
        tot = (f[k, 1:] + tail).astype(np.float64)
        if allowed is not None:
            tot = np.where(allowed(k + 1), tot, np.inf)
        j = int(np.argmin(tot))
        if not np.isfinite(tot[j]):
            per_k.append((float(no_bucket), -1, 0))
            continue
        cost = f[k, j + 1] + tail[j]
        # "at most k": the best of k - 1 stays available when k adds nothing
        if per_k and per_k[-1][0] <= cost:
            per_k.append(per_k[-1])
        else:
            per_k.append((cost, k, j + 1))
        if cost < best_cost:
            best_cost, best_k, best_j = cost, k, j + 1
    if not per_k:
        per_k.append((no_bucket, -1, 0))
    return per_k, (best_cost, best_k, best_j)


def _pick(prep: _Prep, f, arg, E, max_buckets: int, objective: str, allowed=None) -> Solution:
    """Best list overall and per k (see _best_per_k)."""
    p = prep.cand.size
    per_k, (best_cost, best_k, best_j) = _best_per_k(prep, f, E, allowed)
    sol = _summarize(prep, _reconstruct(prep, arg, best_k, best_j), best_cost, objective)
    sol.curve = []
    # more buckets than candidates cannot help: the curve ends at the candidate count
    for k, (cost, kk, jj) in enumerate(per_k[: min(max_buckets, CURVE_MAX_POINTS)], start=1):
        s = _summarize(prep, _reconstruct(prep, arg, kk, jj), cost, objective)
        sol.curve.append(
            {"k": k, "buckets": s.buckets, "eager_batches": s.eager_batches, "padded_tokens": s.padded_tokens, "cost": s.cost}
        )
    sol.candidates = int(p)
    return sol


def _summarize(prep: _Prep, buckets: list[int], cost, objective: str) -> Solution:
    from bcgtune.core.sglang.replay import assign_buckets

    chosen, replay = assign_buckets(prep.sizes, buckets, prep.factor)
    w = prep.counts
    return Solution(
        buckets=list(buckets),
        cost=float(cost),
        eager_batches=int(w[~replay].sum()),
        padded_tokens=int(((chosen - prep.sizes) * w)[replay].sum()),
        objective=objective,
    )


def optimal_buckets(
    sizes,
    counts,
    max_buckets: int,
    align: int = 1,
    max_bucket: int | None = None,
    factor: float = DEFAULT_PADDING_FACTOR,
) -> Solution:
    """Exact lexicographic optimum (eager batches, then padded tokens) with at most
    `max_buckets` buckets; among optimal lists, one with the fewest buckets."""
    if max_buckets < 1:
        raise InputError(f"must be at least 1, got {max_buckets}", field="max_buckets")
    prep = _prepare(sizes, counts, align, max_bucket, factor, extra_thresholds=False)
    _require_candidates(prep, align, max_bucket)
    _check_dp_size(prep, max_buckets)
    s, w = prep.sizes, prep.counts
    total_w = int(w.sum())
    max_c = int(prep.cand[-1]) if prep.cand.size else 1
    big = total_w * max_c + 1  # one eager batch outweighs any total padding
    if big * (total_w + 2) >= _INT_LIMIT:
        raise InputError("trace too large for exact 64-bit arithmetic (reduce it to < ~1e7 batches)")
    zero = np.zeros(1, dtype=np.int64)
    E = np.concatenate([zero, np.cumsum(w * big)])
    W = np.concatenate([zero, np.cumsum(w)])
    V = np.concatenate([zero, np.cumsum(w * s)])
    u = np.concatenate([zero, prep.cand]).astype(np.int64)
    K = min(max_buckets, max(prep.cand.size, 1))
    f, arg = _solve_layers(prep, K, E, W, V, u, big=np.int64(_INT_LIMIT))
    return _pick(prep, f, arg, E, max_buckets, "padding")


def monotone_graph_ms(cal, b) -> np.ndarray:
    """t_graph as the optimizer uses it: the calibration's curve, never decreasing with the
    bucket (running maximum over the measured rows at or below b)."""
    b = np.asarray(b, dtype=np.float64)
    raw = np.asarray(cal.graph_time(b), dtype=np.float64)
    rows = np.asarray(cal.tokens, dtype=np.float64)
    cummax = np.maximum.accumulate(np.asarray(cal.graph_ms, dtype=np.float64))
    idx = np.searchsorted(rows, b, side="right") - 1
    floor = np.where(idx >= 0, cummax[np.clip(idx, 0, None)], -np.inf)
    return np.maximum(raw, floor)


def measured_graph_ms(cal, b) -> np.ndarray:
    """t_graph for buckets chosen among the calibration's rows: the measured time where b is a
    row, else the running-max curve of `monotone_graph_ms` (lists such as SGLang's ladder may
    hold unmeasured sizes; they are priced as in the default model)."""
    b = np.asarray(b, dtype=np.int64)
    rows = np.asarray(cal.tokens, dtype=np.int64)
    idx = np.clip(np.searchsorted(rows, b), 0, rows.size - 1)
    hit = rows[idx] == b
    return np.where(hit, np.asarray(cal.graph_ms, dtype=np.float64)[idx], monotone_graph_ms(cal, b))


GRAPH_MODELS = ("trace", "calibration", "explore")


def candidate_rows(cal) -> np.ndarray:
    """The calibration rows buckets may be picked among (`Calibration.candidate_tokens`; any
    object with `tokens` alone offers them all)."""
    pick = getattr(cal, "candidate_tokens", None)
    return np.asarray(pick() if pick is not None else cal.tokens, dtype=np.int64)


def graph_ms_model(cal, b, candidates: str = "trace") -> np.ndarray:
    """t_graph as each candidate set prices it: measured rows at their measured time
    (calibration, explore), or the running-maximum curve everywhere (trace)."""
    if candidates in ("calibration", "explore"):
        return measured_graph_ms(cal, b)
    return monotone_graph_ms(cal, b)


def explore_candidates(cal, sizes, align: int, max_bucket: int | None, factor: float) -> np.ndarray:
    """Candidate buckets of the exploring search: the calibration's rows it may pick among
    (`candidate_rows`) and every size the trace could want that the calibration did not
    measure (the aligned round-up of each traced size, and the smallest aligned size above
    each replay threshold), these priced by the running-maximum curve of `measured_graph_ms`.
    Rows measured only to be compared (`calibrate --sizes` on a grid) stay out."""
    s = distinct(np.asarray(sizes, dtype=np.int64))
    thr = (np.floor(factor * s.astype(np.float64)).astype(np.int64) // align + 1) * align
    wanted = distinct(np.concatenate([ceil_to(s, align), thr]))
    wanted = wanted[~np.isin(wanted, np.asarray(cal.tokens, dtype=np.int64))]
    cand = np.union1d(candidate_rows(cal), wanted)
    cand = cand[cand % align == 0]
    if max_bucket is not None:
        cand = cand[cand <= max_bucket]
    return cand


def batch_costs_ms(cal, tokens, requests) -> tuple[np.ndarray, np.ndarray]:
    """(eager, break) time of batches (n tokens, r requests) under a calibration. A
    calibration of whole-forward graphs has no break cost and one eager time per n."""
    tokens = np.asarray(tokens, dtype=np.int64)
    if getattr(cal, "runner", "full") == "breakable":
        return (
            np.asarray(cal.eager_time(tokens, requests), dtype=np.float64),
            np.asarray(cal.break_time(tokens, requests), dtype=np.float64),
        )
    return np.asarray(cal.eager_time(tokens), dtype=np.float64), np.zeros(tokens.shape)


def mix_for(sizes, counts, mix):
    """The batch mix to price: `mix`, whose histogram must be (sizes, counts), or one
    request per batch."""
    from bcgtune.core.trace.mix import BatchMix

    if mix is None:
        return BatchMix.single_request(sizes, counts)
    hs, hc = mix.histogram()
    s = np.asarray(sizes, dtype=np.int64)
    order = np.argsort(s, kind="stable")
    us, inv = np.unique(s[order], return_inverse=True)
    uc = np.bincount(inv, weights=np.asarray(counts, dtype=np.int64)[order]).astype(np.int64)
    if not (np.array_equal(hs, us) and np.array_equal(hc, uc)):
        raise InputError("the batch mix (tokens, requests) and the size histogram describe different batches")
    return mix


def predicted_time_ms(
    sizes, counts, buckets, cal, factor: float = DEFAULT_PADDING_FACTOR, candidates: str = "trace", mix=None
) -> float:
    """Predicted total prefill time of a trace under a bucket list (time objective's model;
    `candidates` names the graph-time model the optimizer used, see optimal_buckets_time).
    `mix` (core.trace.mix.BatchMix) gives each batch's request count; without it every batch is
    one request."""
    from bcgtune.core.sglang.replay import assign_buckets

    m = mix_for(sizes, counts, mix)
    chosen, replay = assign_buckets(m.tokens, buckets, factor)
    eager, brk = batch_costs_ms(cal, m.tokens, m.requests)
    graph = graph_ms_model(cal, np.where(replay, chosen, 1), candidates)
    t = np.where(replay, graph + brk, eager)
    return float((t * m.counts).sum())


def optimal_buckets_time(
    sizes,
    counts,
    max_buckets: int,
    cal,
    align: int = 1,
    max_bucket: int | None = None,
    factor: float = DEFAULT_PADDING_FACTOR,
    max_graph_mem_gib: float | None = None,
    candidates: str = "trace",
    mix=None,
) -> Solution:
    """Exact minimum of predicted prefill time with at most `max_buckets` buckets and,
    optionally, total graph memory within `max_graph_mem_gib` (calibration's memory model:
    pool of the largest graph + per-graph overhead for each further one). Buckets whose
    replay does not pay are left out.

    candidates="trace": any aligned size may be a bucket; t_graph is the calibration's
    interpolated curve made non-decreasing (O(K p log p)). candidates="calibration": buckets
    only at the calibration's measured rows (`Calibration.candidate_tokens`: not the sizes
    added only to be priced), each at its measured replay time, monotone or not (O(K p^2)
    over the rows); this is the model to use with a dense calibration grid
    (`bcgtune calibrate --grid`), since replay time between measured sizes is not linear.

    `mix` (core.trace.mix.BatchMix, histogram equal to sizes/counts) prices each batch with its
    request count, as the breakable runner's calibration needs; without it every batch is
    one request."""
    if max_buckets < 1:
        raise InputError(f"must be at least 1, got {max_buckets}", field="max_buckets")
    if candidates not in GRAPH_MODELS:
        raise InputError(f"must be trace, calibration or explore, got {candidates!r}", field="candidates")
    fixed = None
    if candidates == "calibration":
        fixed = candidate_rows(cal)
    elif candidates == "explore":
        fixed = explore_candidates(cal, sizes, align, max_bucket, factor)
    prep = _prepare(sizes, counts, align, max_bucket, factor, extra_thresholds=True, fixed_cand=fixed)
    if fixed is not None and prep.cand.size == 0:
        raise InputError(
            f"no calibration row is a multiple of the alignment {align}"
            + (f" at or below {max_bucket}" if max_bucket is not None else "")
            + " (buckets are picked among the calibration's rows)",
            field="candidates",
        )
    _require_candidates(prep, align, max_bucket)
    w = prep.counts.astype(np.float64)
    m = mix_for(prep.sizes, prep.counts, mix)
    te, tb = batch_costs_ms(cal, m.tokens, m.requests)
    if (te < 0).any() or (tb < 0).any():
        raise InputError("calibration predicts a negative time inside the trace's size range")
    row = m.size_index(prep.sizes)
    eager_sum = np.bincount(row, weights=te * m.counts, minlength=prep.sizes.size)
    break_sum = np.bincount(row, weights=tb * m.counts, minlength=prep.sizes.size)
    zero = np.zeros(1)
    E = np.concatenate([zero, np.cumsum(eager_sum)])
    W = np.concatenate([zero, np.cumsum(w)])
    V = -np.concatenate([zero, np.cumsum(break_sum)])
    K = min(max_buckets, max(prep.cand.size, 1))
    if fixed is not None:
        if prep.cand.size > _DENSE_MAX_CANDIDATES:
            raise InputError(
                f"{prep.cand.size} candidate sizes are too many to pick buckets among at measured times "
                f"(at most {_DENSE_MAX_CANDIDATES}); use a coarser grid or --align",
                field="candidates",
            )
        u = np.concatenate([zero, measured_graph_ms(cal, prep.cand)])
        f, arg = _solve_layers_dense(prep, K, E, W, V, u)
    else:
        u = np.concatenate([zero, monotone_graph_ms(cal, prep.cand)])
        f, arg = _solve_layers(prep, K, E, W, V, u, big=np.inf)
    allowed = None if max_graph_mem_gib is None else memory_budget(cal, max_graph_mem_gib)(prep.cand)
    return _pick(prep, f, arg, E, max_buckets, "time", allowed)


def memory_budget(cal, max_graph_mem_gib: float) -> Callable:
    """For candidates c, a function k -> whether k buckets with the largest at c fit in
    `max_graph_mem_gib` under the calibration's memory model (pool of the largest graph +
    per-graph overhead for each further one)."""
    if cal.per_graph_gib is None or (cal.pool_gib is None and cal.pool_by_tokens is None):
        raise InputError(
            "a graph-memory budget needs a calibration with graph memory (from bcgtune calibrate)", field="max_graph_mem_gib"
        )

    def for_candidates(cand):
        pool_top = np.array([cal.graph_memory_gib([int(c)]) for c in np.asarray(cand).tolist()])

        def allowed(k):
            return pool_top + (k - 1) * cal.per_graph_gib <= max_graph_mem_gib

        return allowed

    return for_candidates


@dataclass
class ItemLists:
    """`lists[k - 1]`: a list of at most k buckets with the least total cost `costs[k - 1]`
    of an item histogram (optimal_item_lists), for k = 1..K (K = max_buckets, or the number
    of candidates when smaller: more buckets than candidates cannot help)."""

    lists: list[list[int]]
    costs: list  # ints for integer costs (exact), floats otherwise
    candidates: int


def optimal_item_lists(
    sizes,
    eager,
    weight,
    offset,
    max_buckets: int,
    *,
    align: int = 1,
    max_bucket: int | None = None,
    factor: float = DEFAULT_PADDING_FACTOR,
    graph: Callable | None = None,
    fixed_cand=None,
    allowed: Callable | None = None,
) -> ItemLists:
    """This module's exact DP on any item histogram: distinct sizes x_1 < ... < x_m, and per
    size the eager cost e_i of its items (when the size does not replay), their weight w_i
    and offset v_i; replaying in bucket c, they cost u(c) w_i - v_i, with u(c) = c in
    integer arithmetic (graph None: padding-like costs) or u(c) = graph(c) (float; with
    `fixed_cand`, buckets only among those values and no assumption on u, else u must be
    non-decreasing). The cost of a list is the sum over sizes: `optimal_buckets` and
    `optimal_buckets_time` solve the same DP on a batch histogram; callers that build other
    histograms (one item per prefill step, say) read the optimum per k here. `allowed`,
    given the candidates, returns k -> a bool per candidate: whether a list of k buckets may
    have it as its largest (a graph-memory budget: `memory_budget`)."""
    if max_buckets < 1:
        raise InputError(f"must be at least 1, got {max_buckets}", field="max_buckets")
    sizes = np.asarray(sizes, dtype=np.int64)
    if sizes.size and (np.diff(sizes) <= 0).any():
        raise InputError("item sizes must be distinct and ascending")
    integer = graph is None
    dtype = np.int64 if integer else np.float64
    e = np.asarray(eager, dtype=dtype)
    w = np.asarray(weight, dtype=dtype)
    v = np.asarray(offset, dtype=dtype)
    prep = _prepare(
        sizes,
        np.ones(sizes.shape, dtype=np.int64),
        align,
        max_bucket,
        factor,
        extra_thresholds=not integer and fixed_cand is None,
        fixed_cand=fixed_cand,
    )
    _require_candidates(prep, align, max_bucket)
    _check_dp_size(prep, max_buckets)
    zero = np.zeros(1, dtype=dtype)
    E = np.concatenate([zero, np.cumsum(e)])
    W = np.concatenate([zero, np.cumsum(w)])
    V = np.concatenate([zero, np.cumsum(v)])
    K = min(max_buckets, max(prep.cand.size, 1))
    if integer:
        top = int(prep.cand[-1]) if prep.cand.size else 1
        if int(E[-1]) + (int(np.abs(w).sum()) + 1) * top + int(np.abs(v).sum()) >= _INT_LIMIT:
            raise InputError("trace too large for exact 64-bit arithmetic")
        u = np.concatenate([zero, prep.cand]).astype(np.int64)
        f, arg = _solve_layers(prep, K, E, W, V, u, big=np.int64(_INT_LIMIT))
    else:
        assert graph is not None
        u = np.concatenate([zero, np.asarray(graph(prep.cand), dtype=np.float64)])
        if fixed_cand is not None:
            f, arg = _solve_layers_dense(prep, K, E, W, V, u)
        else:
            f, arg = _solve_layers(prep, K, E, W, V, u, big=np.inf)
    per_k, _ = _best_per_k(prep, f, E, None if allowed is None else allowed(prep.cand))
    lists = [_reconstruct(prep, arg, kk, jj) for _, kk, jj in per_k]
    costs = [int(c) if integer else float(c) for c, _, _ in per_k]  # integer costs stay exact
    return ItemLists(lists=lists, costs=costs, candidates=int(prep.cand.size))


def min_buckets_full_replay(
    sizes, align: int = 1, max_bucket: int | None = None, factor: float = DEFAULT_PADDING_FACTOR
) -> tuple[int, list[int]]:
    """Fewest buckets that replay every size that can replay at all (some multiple of
    `align` lies in [x, factor * x] and <= max_bucket). Greedy interval stabbing: the
    smallest uncovered size x takes the largest allowed bucket <= min(factor * x, M), which
    covers every size up to it. Optimal for covering points by windows of this shape."""
    s = distinct(np.asarray(sizes, dtype=np.int64))
    lim = np.floor(factor * s.astype(np.float64)).astype(np.int64)
    if max_bucket is not None:
        lim = np.minimum(lim, max_bucket)
    top = (lim // align) * align
    can = top >= s
    s, top = s[can], top[can]
    out: list[int] = []
    i = 0
    while i < s.size:
        b = int(top[i])
        out.append(b)
        i = int(np.searchsorted(s, b, side="right"))
    return len(out), out
