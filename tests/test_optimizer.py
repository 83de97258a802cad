"""The optimizer is exact: checked against brute force over every aligned bucket list and
against a naive O(K * values^2) DP that does no candidate reduction, on random inputs."""

import itertools

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bcgtune.core.plan.optimizer import (
    min_buckets_full_replay,
    optimal_buckets,
    optimal_buckets_time,
    predicted_time_ms,
)
from bcgtune.core.sglang.replay import assign_buckets, evaluate_list
from bcgtune.errors import InputError


def brute_padding(sizes, counts, K, A, M, factor):
    top = M if M is not None else int(max(sizes)) + A
    values = list(range(A, top + 1, A))
    best = None
    for k in range(0, K + 1):
        for comb in itertools.combinations(values, k):
            m = evaluate_list(sizes, counts, comb, factor=factor)
            key = (m.eager_batches, m.padded_tokens, k)
            if best is None or key < best:
                best = key
    return best


def naive_dp(sizes, counts, K, A, M, factor):
    """Layered DP over every multiple of A (no candidate reduction, no monotonicity)."""
    top = M if M is not None else (int(max(sizes)) // A + 1) * A
    values = list(range(A, top + 1, A))
    pairs = list(zip(map(int, sizes), map(int, counts)))

    def seg(lo, hi):
        e = p = 0
        for x, w in pairs:
            if lo < x <= hi:
                if hi <= factor * x:
                    p += w * (hi - x)
                else:
                    e += w
        return e, p

    def tail(lo):
        return sum(w for x, w in pairs if x > lo), 0

    layer = {0: (0, 0)}
    best = tail(0)
    for _ in range(K):
        new = {}
        for hi in values:
            new[hi] = min(
                (tuple(a + b for a, b in zip(v, seg(lo, hi))) for lo, v in layer.items() if lo < hi),
                default=(10**18, 0),
            )
        for lo, v in new.items():
            best = min(best, tuple(a + b for a, b in zip(v, tail(lo))))
        layer = {0: (0, 0), **new}
    return best


histograms = st.lists(st.tuples(st.integers(1, 40), st.integers(1, 4)), min_size=1, max_size=6).map(
    lambda rows: (np.array(sorted(dict(rows))), np.array([dict(rows)[s] for s in sorted(dict(rows))]))
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    hist=histograms,
    K=st.integers(1, 3),
    A=st.sampled_from([1, 2, 4, 8]),
    M=st.one_of(st.none(), st.integers(1, 48)),
    factor=st.sampled_from([2.0, 1.5, 3.0]),
)
def test_padding_optimum_equals_brute_force(hist, K, A, M, factor):
    sizes, counts = hist
    if M is not None and -(-int(sizes[0]) // A) * A > M:
        with pytest.raises(InputError):
            optimal_buckets(sizes, counts, K, A, M, factor)
        return
    sol = optimal_buckets(sizes, counts, K, A, M, factor)
    eager, padded, k = brute_padding(sizes, counts, K, A, M, factor)
    assert (sol.eager_batches, sol.padded_tokens) == (eager, padded)
    assert len(sol.buckets) == k  # fewest buckets among optimal lists
    assert all(b % A == 0 for b in sol.buckets)
    assert M is None or all(b <= M for b in sol.buckets)
    # the reported figures are those of the returned list
    m = evaluate_list(sizes, counts, sol.buckets, factor=factor)
    assert (m.eager_batches, m.padded_tokens) == (sol.eager_batches, sol.padded_tokens)


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    rows=st.lists(st.tuples(st.integers(1, 150), st.integers(1, 6)), min_size=1, max_size=25),
    K=st.integers(1, 6),
    A=st.sampled_from([1, 3, 8, 16]),
    factor=st.sampled_from([2.0, 1.25, 4.0]),
)
def test_padding_optimum_equals_naive_dp_on_larger_inputs(rows, K, A, factor):
    d = {}
    for s, c in rows:
        d[s] = d.get(s, 0) + c
    sizes = np.array(sorted(d))
    counts = np.array([d[s] for s in sorted(d)])
    sol = optimal_buckets(sizes, counts, K, A, None, factor)
    assert (sol.eager_batches, sol.padded_tokens) == naive_dp(sizes, counts, K, A, None, factor)


def test_curve_is_monotone_and_ends_at_solution():
    rng = np.random.default_rng(0)
    x = np.clip(rng.lognormal(7, 0.8, 20000).astype(int), 1, 8192)
    sizes, counts = np.unique(x, return_counts=True)
    sol = optimal_buckets(sizes, counts, 12, align=16)
    keys = [(p["eager_batches"], p["padded_tokens"]) for p in sol.curve]
    assert len(keys) == 12
    assert keys == sorted(keys, reverse=True)
    assert keys[-1] == (sol.eager_batches, sol.padded_tokens)
    for p in sol.curve:
        assert len(p["buckets"]) <= p["k"]


def test_min_buckets_full_replay_is_minimal_and_complete():
    rng = np.random.default_rng(1)
    for _ in range(200):
        sizes = np.unique(rng.integers(1, 60, size=rng.integers(1, 8)))
        A = int(rng.choice([1, 2, 8]))
        n, buckets = min_buckets_full_replay(sizes, A)
        # every size that can replay at all does
        can = np.array([-(-s // A) * A <= 2 * s for s in sizes])
        _, rep = assign_buckets(sizes, buckets)
        assert (rep | ~can).all() and not (rep & ~can).any()
        # and the exact optimizer needs exactly n buckets to reach zero avoidable eager batches
        counts = np.ones_like(sizes)
        avoidable = int((~can).sum())
        if n:
            assert optimal_buckets(sizes, counts, n, A).eager_batches == avoidable
        if n > 1:
            assert optimal_buckets(sizes, counts, n - 1, A).eager_batches > avoidable


def test_rejects_bad_parameters():
    with pytest.raises(InputError):
        optimal_buckets([10], [1], 0)
    with pytest.raises(InputError):
        optimal_buckets([10], [1], 2, align=0)
    with pytest.raises(InputError, match="max_bucket"):
        optimal_buckets([100, 200], [1, 1], 2, max_bucket=50)


class FakeCalibration:
    """Piecewise-linear curves with the calibration API (linear extrapolation)."""

    def __init__(self, tokens, eager, graph, pool=1.0, per=0.1):
        self.tokens = np.asarray(tokens, float)
        self.eager_ms = np.asarray(eager, float)
        self.graph_ms = np.asarray(graph, float)
        self.pool_gib, self.per_graph_gib, self.pool_by_tokens = pool, per, None

    def _interp(self, y, q):
        t, q = self.tokens, np.asarray(q, float)
        r = np.interp(q, t, y)
        r = np.where(q < t[0], y[0] + (q - t[0]) * (y[1] - y[0]) / (t[1] - t[0]), r)
        return np.where(q > t[-1], y[-1] + (q - t[-1]) * (y[-1] - y[-2]) / (t[-1] - t[-2]), r)

    def eager_time(self, n):
        return self._interp(self.eager_ms, n)

    def graph_time(self, b):
        return self._interp(self.graph_ms, b)

    def graph_memory_gib(self, buckets):
        return self.pool_gib * max(buckets) / 32 + (len(buckets) - 1) * self.per_graph_gib


def brute_time(sizes, counts, K, values, cal, factor, mem, candidates="trace"):
    """Least predicted time over every list of at most K of `values` within the memory budget."""
    return min(
        predicted_time_ms(sizes, counts, comb, cal, factor, candidates=candidates)
        for k in range(K + 1)
        for comb in itertools.combinations(values, k)
        if mem is None or k == 0 or cal.graph_memory_gib(list(comb)) <= mem
    )


small_histograms = st.lists(st.tuples(st.integers(1, 16), st.integers(1, 4)), min_size=1, max_size=5).map(
    lambda rows: (np.array(sorted(dict(rows))), np.array([dict(rows)[s] for s in sorted(dict(rows))]))
)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    hist=small_histograms,
    K=st.integers(1, 3),
    A=st.sampled_from([1, 2, 4]),
    factor=st.sampled_from([2.0, 1.5]),
    eager=st.lists(st.floats(1, 10), min_size=5, max_size=5).map(sorted),
    graph=st.lists(st.floats(0.5, 12), min_size=5, max_size=5),
    mem=st.one_of(st.none(), st.floats(0.2, 2.0)),
)
def test_time_optimum_equals_brute_force(hist, K, A, factor, eager, graph, mem):
    sizes, counts = hist
    cal = FakeCalibration([1, 8, 16, 32, 64], eager, graph, pool=1.0, per=0.2)
    sol = optimal_buckets_time(sizes, counts, K, cal, A, None, factor, max_graph_mem_gib=mem)
    values = list(range(A, int(factor * max(sizes)) + 2 * A + 1, A))
    best = brute_time(sizes, counts, K, values, cal, factor, mem)
    got = predicted_time_ms(sizes, counts, sol.buckets, cal, factor)
    assert got == pytest.approx(best, abs=1e-6)
    assert sol.cost == pytest.approx(got, abs=1e-6)
    if mem is not None and sol.buckets:
        assert cal.graph_memory_gib(sol.buckets) <= mem


def test_time_objective_drops_buckets_where_replay_does_not_pay():
    # replay pays below 1k tokens, costs more than eager above 2k (the H200 hf shape)
    cal = FakeCalibration([64, 512, 1024, 2048, 8192], [50, 55, 58, 69, 285], [10, 20, 35, 72, 380])
    sizes = np.array([100, 400, 900, 3000, 6000])
    sol = optimal_buckets_time(sizes, np.ones(5, int), 8, cal)
    assert sol.buckets and max(sol.buckets) < 3000
    assert sol.cost < predicted_time_ms(sizes, np.ones(5), [], cal)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    hist=small_histograms,
    K=st.integers(1, 3),
    A=st.sampled_from([1, 2, 4]),
    factor=st.sampled_from([2.0, 1.5]),
    rows=st.lists(st.integers(2, 40), min_size=1, max_size=8, unique=True).map(lambda r: [1] + sorted(r)),
    data=st.data(),
    mem=st.one_of(st.none(), st.floats(0.2, 2.0)),
)
def test_measured_candidates_optimum_equals_brute_force(hist, K, A, factor, rows, data, mem):
    """--candidates calibration: buckets only at measured rows, at their measured (not
    monotone) replay times; brute force over every subset of the aligned rows."""
    sizes, counts = hist
    n = len(rows)
    eager = sorted(data.draw(st.lists(st.floats(1, 10), min_size=n, max_size=n)))  # no negative extrapolation
    graph = data.draw(st.lists(st.floats(0.5, 12), min_size=n, max_size=n))  # any order: dips allowed
    cal = FakeCalibration(rows, eager, graph, pool=1.0, per=0.2)
    values = [r for r in rows if r % A == 0]
    if not values:
        with pytest.raises(InputError, match="align"):
            optimal_buckets_time(sizes, counts, K, cal, A, None, factor, candidates="calibration")
        return
    sol = optimal_buckets_time(sizes, counts, K, cal, A, None, factor, max_graph_mem_gib=mem, candidates="calibration")
    assert set(sol.buckets) <= set(values)
    best = brute_time(sizes, counts, K, values, cal, factor, mem, candidates="calibration")
    got = predicted_time_ms(sizes, counts, sol.buckets, cal, factor, candidates="calibration")
    assert got == pytest.approx(best, abs=1e-6)
    assert sol.cost == pytest.approx(got, abs=1e-6)


def test_measured_candidates_take_the_tile_aligned_dip():
    # replay time with the shape measured on the H200 (benchmarks/RESULTS.md): 1280 tokens
    # replays faster than 1279; the running-max model cannot see it, the measured one does
    rows = [1152, 1216, 1279, 1280, 1344]
    cal = FakeCalibration(rows, [20.0] * 5, [9.28, 9.97, 10.14, 9.71, 10.4])
    sizes, counts = np.array([1200, 1250, 1270]), np.array([5, 5, 5])
    sol = optimal_buckets_time(sizes, counts, 1, cal, candidates="calibration")
    assert sol.buckets == [1280]
    assert sol.cost == pytest.approx(15 * 9.71)
    trace_model = optimal_buckets_time(sizes, counts, 1, cal)
    assert predicted_time_ms(sizes, counts, trace_model.buckets, cal) > sol.cost
