"""DP-attention steps: SGLang's per-step rule against a plain re-statement of it, and the
step optimizer against brute force over every aligned bucket list."""

import bisect
import itertools

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bcgtune.core.plan.calibration import Calibration
from bcgtune.core.plan.dp_steps import (
    DPSteps,
    evaluate_steps,
    min_buckets_all_steps,
    optimal_step_buckets,
    optimal_step_buckets_time,
    predicted_step_time_ms,
)
from bcgtune.core.plan.optimizer import optimal_buckets
from bcgtune.errors import InputError

SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow])


def sglang_step(counts, ranks, buckets, factor):
    """One step as SGLang 0.5.23 runs it, written out: every rank votes its own count
    (can_replay_locally: at most the largest bucket, its bucket within factor x it; idle
    ranks vote yes), the vote is min-reduced, and every rank pads to the bucket of the
    largest count (prepare_mlp_sync_batch). Returns (replays, bucket, padded tokens)."""
    bl = sorted(buckets)

    def own_vote(n):
        if not bl or n > bl[-1]:
            return False
        return bl[bisect.bisect_left(bl, n)] <= factor * n

    if not all(own_vote(n) for n in counts):
        return False, 0, 0
    bucket = min(b for b in bl if b >= max(counts))
    return True, bucket, ranks * bucket - sum(counts)


def brute_metrics(step_counts, ranks, buckets, factor):
    eager = padded = 0
    for counts in step_counts:
        ok, _, pad = sglang_step(counts, ranks, buckets, factor)
        eager += not ok
        padded += pad
    return eager, padded


def make_steps(step_counts, ranks):
    key = [i for i, c in enumerate(step_counts) for _ in c]
    return DPSteps.from_votes(key, [n for c in step_counts for n in c], ranks)


@st.composite
def dp_traces(draw, max_size=24, max_steps=6):
    ranks = draw(st.integers(1, 4))
    steps = draw(st.lists(st.lists(st.integers(1, max_size), min_size=1, max_size=ranks), min_size=1, max_size=max_steps))
    return ranks, steps


@settings(max_examples=300, **SETTINGS)
@given(
    tr=dp_traces(max_size=200, max_steps=12),
    buckets=st.lists(st.integers(1, 260), max_size=8, unique=True),
    factor=st.sampled_from([2.0, 1.5, 3.0]),
)
def test_step_evaluation_is_sglangs_rule(tr, buckets, factor):
    ranks, steps = tr
    m = evaluate_steps(make_steps(steps, ranks), buckets, factor=factor)
    eager, padded = brute_metrics(steps, ranks, buckets, factor)
    assert (m.eager_batches, m.padded_tokens) == (eager, padded)
    assert m.batches == len(steps) and m.replayed_batches == len(steps) - eager
    assert m.replayed_tokens == sum(sum(c) for c in steps if sglang_step(c, ranks, buckets, factor)[0])


def brute_step_optimum(steps, ranks, K, A, M, factor):
    top = M if M is not None else max(n for c in steps for n in c) + A
    values = list(range(A, top + 1, A))
    best = None
    for k in range(0, K + 1):
        for comb in itertools.combinations(values, k):
            key = (*brute_metrics(steps, ranks, comb, factor), k)
            if best is None or key < best:
                best = key
    return best


@settings(max_examples=120, **SETTINGS)
@given(
    tr=dp_traces(),
    K=st.integers(1, 3),
    A=st.sampled_from([1, 2, 4]),
    M=st.one_of(st.none(), st.integers(12, 30)),
    factor=st.sampled_from([2.0, 1.5]),
)
def test_step_optimizer_against_brute_force(tr, K, A, M, factor):
    ranks, steps = tr
    s = make_steps(steps, ranks)
    try:
        opt = optimal_step_buckets(s, K, A, M, factor)
    except InputError:
        # refused only when no allowed bucket replays any step
        assert brute_step_optimum(steps, ranks, K, A, M, factor)[0] == len(steps)
        return
    sol, cert = opt.solution, opt.certificate
    assert len(sol.buckets) <= K and all(b % A == 0 for b in sol.buckets) and all(M is None or b <= M for b in sol.buckets)
    got = brute_metrics(steps, ranks, sol.buckets, factor)
    assert got == (sol.eager_batches, sol.padded_tokens)  # the list is priced by SGLang's rule
    best = brute_step_optimum(steps, ranks, K, A, M, factor)
    assert got >= best[:2]  # never better than possible
    assert cert.bound <= best[:2]  # the relaxation's bound is a lower bound
    if cert.proven:
        assert got == best[:2], cert.how
    if K >= len(min_buckets_all_steps(s, A, M, factor)[0]):  # enough buckets to replay every step that can: proven
        assert cert.proven and got == best[:2]
    for point in sol.curve:  # each K's list is priced by the rule too
        assert brute_metrics(steps, ranks, point["buckets"], factor) == (point["eager_batches"], point["padded_tokens"])


@settings(max_examples=80, **SETTINGS)
@given(sizes=st.lists(st.integers(1, 400), min_size=1, max_size=40), K=st.integers(1, 5), A=st.sampled_from([1, 8]))
def test_one_rank_per_step_is_the_batch_optimizer(sizes, K, A):
    uniq, counts = np.unique(np.array(sizes), return_counts=True)
    opt = optimal_step_buckets(DPSteps.one_per_step(uniq, counts), K, A)
    ref = optimal_buckets(uniq, counts, K, A)
    assert opt.certificate.proven
    assert (opt.solution.eager_batches, opt.solution.padded_tokens) == (ref.eager_batches, ref.padded_tokens)
    assert opt.solution.buckets == ref.buckets


def test_a_coupled_step_needs_a_bucket_for_its_small_rank():
    # two ranks: 900 tokens and 20 tokens in one step. One bucket at 900 would replay the
    # 900-token rank, but the 20-token rank votes no: the whole step runs eager.
    s = make_steps([[900, 20]], 2)
    assert evaluate_steps(s, [900]).eager_batches == 1
    opt = optimal_step_buckets(s, 2)
    assert opt.solution.buckets == [20, 900] and opt.solution.eager_batches == 0
    assert opt.solution.padded_tokens == 2 * 900 - 920  # the idle-free step pads the small rank
    assert opt.certificate.proven


def test_idle_ranks_pay_the_whole_bucket():
    s = make_steps([[300]], 8)
    m = evaluate_steps(s, [300])
    assert (m.eager_batches, m.padded_tokens) == (0, 7 * 300)


def test_unprovable_case_is_said_so():
    # three steps of two busy ranks whose counts are spaced more than 2x apart: each bucket
    # serves one count, and which K counts to cover is a densest-subgraph choice.
    steps = [[1, 3], [3, 9], [9, 1], [27, 1]]
    s = make_steps(steps, 2)
    opt = optimal_step_buckets(s, 2)
    best = brute_step_optimum(steps, 2, 2, 1, None, 2.0)
    got = (opt.solution.eager_batches, opt.solution.padded_tokens)
    assert got >= best[:2] and opt.certificate.bound <= best[:2]
    if opt.certificate.proven:
        assert got == best[:2]
    else:
        assert "no list has fewer than" in opt.certificate.how


def test_steps_refuse_inconsistent_input():
    with pytest.raises(InputError):
        DPSteps.from_votes([0, 0, 0], [5, 6, 7], ranks=2)  # three counts in one step of two ranks
    with pytest.raises(InputError):
        DPSteps.from_votes([0], [0], ranks=2)
    with pytest.raises(InputError, match="attention_dp_size"):
        DPSteps.from_votes([0], [5], ranks=0)


# ---- time ------------------------------------------------------------------------------
def _cal():
    rows = [8, 16, 32, 64, 128, 256]
    eager = [2.0 + 0.05 * r for r in rows]
    graph = [1.0 + 0.03 * r for r in rows]
    return Calibration(tokens=np.array(rows), eager_ms=np.array(eager), graph_ms=np.array(graph))


def brute_time(steps, ranks, K, cal, A, factor):
    values = list(range(A, 256 + 1, A))
    s = make_steps(steps, ranks)
    best = float(predicted_step_time_ms(s, [], cal, factor))
    for k in range(1, K + 1):
        for comb in itertools.combinations(values, k):
            best = min(best, predicted_step_time_ms(s, list(comb), cal, factor))
    return best


def test_step_time_is_the_slowest_rank_and_one_graph():
    cal = _cal()
    s = make_steps([[100, 10]], 4)
    eager = max(cal.eager_time(np.array([100]))[0], cal.eager_time(np.array([10]))[0])
    assert predicted_step_time_ms(s, [], cal) == pytest.approx(eager)
    # replayed: every rank replays the 128 bucket in parallel: one graph time
    assert predicted_step_time_ms(s, [16, 128], cal) == pytest.approx(float(cal.graph_time(np.array([128]))[0]))
    # the 10-token rank has no bucket within 2x: the whole step runs eager
    assert predicted_step_time_ms(s, [128], cal) == pytest.approx(eager)


@settings(max_examples=25, **SETTINGS)
@given(tr=dp_traces(max_size=120, max_steps=4), K=st.integers(1, 2), A=st.sampled_from([8, 16]))
def test_step_time_optimizer_against_brute_force(tr, K, A):
    ranks, steps = tr
    cal = _cal()
    s = make_steps(steps, ranks)
    try:
        opt = optimal_step_buckets_time(s, K, cal, A, 256)
    except InputError:
        return
    got = predicted_step_time_ms(s, opt.solution.buckets, cal)
    assert got == pytest.approx(opt.solution.cost)
    best = brute_time(steps, ranks, K, cal, A, 2.0)
    assert got >= best - 1e-6
    assert opt.certificate.bound <= best + 1e-6
    if opt.certificate.proven:
        assert got == pytest.approx(best), opt.certificate.how
