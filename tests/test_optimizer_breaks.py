"""The time objective under the breakable runner's cost model is still exact: a batch of n
tokens from r requests costs segments(b) + breaks(n, r) replayed, eager(n, r) not. Checked
against brute force over every bucket list, for both candidate models, with request mixes,
memory budgets and break costs of any size."""

import itertools

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bcgtune.core.plan.calibration import BatchTimes, Calibration
from bcgtune.core.plan.optimizer import optimal_buckets_time, predicted_time_ms
from bcgtune.core.sglang.replay import assign_buckets
from bcgtune.core.trace.mix import BatchMix
from bcgtune.errors import InputError


class FakeBreakable:
    """Segments on measured rows (any order), eager and breaks per (n, r) from tables."""

    runner = "breakable"

    def __init__(self, rows, seg, eager, breaks, pool=1.0, per=0.2):
        self.tokens = np.asarray(rows, float)
        self.graph_ms = np.asarray(seg, float)
        self.eager_tab, self.break_tab = eager, breaks
        self.pool_gib, self.per_graph_gib, self.pool_by_tokens = pool, per, None

    def graph_time(self, b):
        return np.interp(np.asarray(b, float), self.tokens, self.graph_ms)

    def eager_time(self, n, r):
        return np.array([self.eager_tab[(int(a), int(b))] for a, b in zip(np.atleast_1d(n), np.atleast_1d(r))])

    def break_time(self, n, r):
        return np.array([self.break_tab[(int(a), int(b))] for a, b in zip(np.atleast_1d(n), np.atleast_1d(r))])

    def graph_memory_gib(self, buckets):
        return self.pool_gib * max(buckets) / 32 + (len(buckets) - 1) * self.per_graph_gib


def cost_by_hand(mix, buckets, cal, factor, candidates):
    """Each batch priced directly: replay = segments of its bucket + its breaks; else eager."""
    from bcgtune.core.plan.optimizer import graph_ms_model

    total = 0.0
    chosen, replay = assign_buckets(mix.tokens, buckets, factor)
    for n, r, c, b, ok in zip(mix.tokens, mix.requests, mix.counts, chosen, replay):
        if ok:
            total += c * (float(graph_ms_model(cal, np.array([b]), candidates)[0]) + cal.break_tab[(int(n), int(r))])
        else:
            total += c * cal.eager_tab[(int(n), int(r))]
    return total


batches = st.lists(st.tuples(st.integers(1, 16), st.integers(1, 3)), min_size=1, max_size=8).map(
    lambda rows: [(n, min(r, n)) for n, r in rows]
)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    batch=batches,
    K=st.integers(1, 3),
    A=st.sampled_from([1, 2, 4]),
    factor=st.sampled_from([2.0, 1.5]),
    candidates=st.sampled_from(["trace", "calibration"]),
    rows=st.lists(st.integers(2, 40), min_size=1, max_size=6, unique=True).map(lambda r: [1] + sorted(r)),
    data=st.data(),
    mem=st.one_of(st.none(), st.floats(0.2, 2.0)),
)
def test_breakable_time_optimum_equals_brute_force(batch, K, A, factor, candidates, rows, data, mem):
    mix = BatchMix.from_batches([n for n, _ in batch], [r for _, r in batch])
    pairs = set(zip(mix.tokens.tolist(), mix.requests.tolist()))
    eager = {p: data.draw(st.floats(0.5, 20)) for p in sorted(pairs)}
    breaks = {p: data.draw(st.floats(0.0, 10)) for p in sorted(pairs)}
    seg = data.draw(st.lists(st.floats(0.1, 12), min_size=len(rows), max_size=len(rows)))
    if candidates == "trace":
        seg = sorted(seg)  # the interpolated model: non-decreasing in the bucket
    cal = FakeBreakable(rows, seg, eager, breaks)
    sizes, counts = mix.histogram()
    if candidates == "calibration":
        values = [r for r in rows if r % A == 0]
        if not values:
            with pytest.raises(InputError):
                optimal_buckets_time(sizes, counts, K, cal, A, None, factor, candidates=candidates, mix=mix)
            return
    else:
        values = list(range(A, int(factor * max(sizes)) + 2 * A + 1, A))
    sol = optimal_buckets_time(sizes, counts, K, cal, A, None, factor, max_graph_mem_gib=mem, candidates=candidates, mix=mix)
    best = min(
        predicted_time_ms(sizes, counts, comb, cal, factor, candidates=candidates, mix=mix)
        for k in range(K + 1)
        for comb in itertools.combinations(values, k)
        if mem is None or k == 0 or cal.graph_memory_gib(list(comb)) <= mem
    )
    got = predicted_time_ms(sizes, counts, sol.buckets, cal, factor, candidates=candidates, mix=mix)
    assert got == pytest.approx(best, abs=1e-6)
    assert sol.cost == pytest.approx(got, abs=1e-6)
    assert got == pytest.approx(cost_by_hand(mix, sol.buckets, cal, factor, candidates), abs=1e-6)
    if mem is not None and sol.buckets:
        assert cal.graph_memory_gib(sol.buckets) <= mem


def test_break_costs_can_make_eager_win_for_some_requests():
    # 8 tokens from 1 request replays cheaply; from 4 requests the breaks cost more than eager
    rows = [8, 16]
    eager = {(8, 1): 10.0, (8, 4): 10.0}
    cheap = FakeBreakable(rows, [2.0, 3.0], eager, {(8, 1): 1.0, (8, 4): 1.0})
    dear = FakeBreakable(rows, [2.0, 3.0], eager, {(8, 1): 1.0, (8, 4): 9.0})
    one = BatchMix.from_batches([8], [1])
    four = BatchMix.from_batches([8], [4])
    s, c = np.array([8]), np.array([1])
    assert optimal_buckets_time(s, c, 2, cheap, mix=four).buckets == [8]
    assert optimal_buckets_time(s, c, 2, dear, mix=four).buckets == []  # 2 + 9 > 10: stays eager
    assert optimal_buckets_time(s, c, 2, dear, mix=one).buckets == [8]
    assert predicted_time_ms(s, c, [8], dear, mix=four) == pytest.approx(11.0)


def test_mix_must_match_the_histogram():
    cal = FakeBreakable([8], [1.0], {(8, 1): 3.0}, {(8, 1): 0.0})
    with pytest.raises(InputError, match="different batches"):
        optimal_buckets_time([8, 9], [1, 1], 1, cal, mix=BatchMix.from_batches([8], [1]))


def test_real_calibration_prices_batches_by_request_count():
    cal = Calibration(
        tokens=[64, 128],
        eager_ms=None,
        graph_ms=[1.0, 1.5],
        runner="breakable",
        batches=BatchTimes([64, 64, 100], [1, 4, 2], [9.0, 9.5, 10.0], [0.5, 0.8, 0.7]),
    )
    mix = BatchMix.from_batches([64, 64, 64, 100], [1, 4, 4, 2])
    sizes, counts = mix.histogram()
    # 64 replays in 64 (1.0 + breaks), 100 in 128 (1.5 + 0.7)
    want = (1.0 + 0.5) + 2 * (1.0 + 0.8) + (1.5 + 0.7)
    assert predicted_time_ms(sizes, counts, [64, 128], cal, mix=mix) == pytest.approx(want)
    assert predicted_time_ms(sizes, counts, [], cal, mix=mix) == pytest.approx(9.0 + 2 * 9.5 + 10.0)
    sol = optimal_buckets_time(sizes, counts, 2, cal, candidates="calibration", mix=mix)
    assert sol.cost == pytest.approx(want) and sol.buckets == [64, 128]
