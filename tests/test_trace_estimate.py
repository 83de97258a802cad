"""The proof's whole-trace estimates (core.plan.trace_estimate): the design replays the whole
trace when it fits, else a stratified sample that keeps the batches two lists run
differently; the estimator is exact where the model is, and its interval covers a total at
its stated rate where the model errs batch by batch."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bcgtune.core.plan.trace_estimate import (
    Allowances,
    chosen_buckets,
    estimate_difference,
    estimate_total,
    gain_pct,
    proof_design,
)

NONE = Allowances(capture_sd=0.0, level_sd=0.0, host_sd=0.0)


def _trace(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.clip(np.round(rng.lognormal(np.log(900), 0.9, n)), 16, 8192).astype(np.int64)


LISTS = {"recommended": [256, 1024, 2048, 4096, 8192], "SGLang ladder": [128, 256, 512, 1024, 1536, 2048, 3072, 4096, 6144, 8192]}


def test_the_whole_trace_when_it_fits():
    tok = _trace(300, 1)
    d = proof_design(tok, LISTS, tok.astype(float), 300)
    assert d.whole and d.index.tolist() == list(range(300)) and d.strata == 1
    pred = tok * 0.01
    rounds = np.stack([pred * 1.1, pred * 1.1, pred * 1.1], axis=1)
    est = estimate_total(d, pred, rounds, graph_by_bucket={}, host_ms=0.0, allow=NONE)
    assert est.center == pytest.approx(float(pred.sum() * 1.1)) and est.parts["sampling"] == 0.0


@settings(max_examples=40, deadline=None)
@given(n=st.integers(40, 600), budget=st.integers(8, 200), seed=st.integers(0, 10_000))
def test_a_sample_keeps_order_strata_and_counts(n, budget, seed):
    tok = _trace(n, seed)
    d = proof_design(tok, LISTS, tok.astype(float) + 1.0, budget, seed=seed)
    assert (np.diff(d.index) > 0).all()  # trace order, each batch once
    assert d.trace_counts.sum() == n and (d.sample_counts >= 1).all() and (d.sample_counts <= d.trace_counts).all()
    assert d.weights.sum() == pytest.approx(n)
    if not d.whole:
        assert d.index.size <= max(budget, 2 * d.strata, d.strata)


def test_batches_the_recommended_list_and_the_optimum_run_differently_are_all_replayed():
    tok = _trace(1200, 2)
    lists = {**LISTS, "optimum": [256, 1024, 2000, 4096, 8192]}
    differ = np.flatnonzero(chosen_buckets(tok, lists["recommended"]) != chosen_buckets(tok, lists["optimum"]))
    budget = int(differ.size / 0.5)  # they fill half of it: replayed whole
    d = proof_design(tok, lists, tok.astype(float), budget, must_differ=("recommended", "optimum"))
    assert 0 < differ.size < tok.size / 2 and np.isin(differ, d.index).all() and not d.whole
    # beyond MUST_SHARE of the budget they are sampled like the rest
    d = proof_design(tok, lists, tok.astype(float), int(differ.size / 0.7), must_differ=("recommended", "optimum"))
    assert not np.isin(differ, d.index).all()


def test_where_the_model_is_exact_the_sample_gives_the_trace_exactly():
    tok = _trace(1000, 3)
    pred = tok * 0.02 + 1.0
    d = proof_design(tok, LISTS, pred, 80, seed=5)
    rounds = np.repeat(pred[d.index][:, None], 3, axis=1)
    est = estimate_total(d, pred, rounds, graph_by_bucket={}, host_ms=0.0, allow=NONE)
    assert est.center == pytest.approx(float(pred.sum())) and est.half == pytest.approx(0.0, abs=1e-9)


def test_a_difference_counts_only_the_batches_the_lists_run_differently():
    tok = _trace(800, 4)
    ca, cb = chosen_buckets(tok, LISTS["recommended"]), chosen_buckets(tok, LISTS["SGLang ladder"])
    differ = ca != cb
    pa, pb = tok * 0.02 + ca * 0.001, tok * 0.02 + cb * 0.001
    d = proof_design(tok, LISTS, pa + pb, 120, seed=1)
    ra = np.repeat(pa[d.index][:, None], 2, axis=1)
    rb = np.repeat(pb[d.index][:, None], 2, axis=1) + np.where(differ[d.index], 0.0, 5.0)[:, None]  # noise where alike
    est = estimate_difference(d, pa, pb, ra, rb, differ, net_graph_by_bucket={}, host_ms=0.0, allow=NONE)
    assert est.center == pytest.approx(float((pa - pb)[differ].sum()))


def test_the_interval_covers_a_total_at_its_rate_when_the_model_errs_batch_by_batch():
    """The model errs by a per-batch factor (a size's own error, heavy-tailed) and each round
    adds noise; over 300 draws of the measurements and the sample, the 95% interval of the
    whole trace's total holds the truth 90-99% of the time."""
    tok = _trace(1500, 6)
    pred = tok * 0.02 + 2.0
    inside, draws = 0, 300
    for k in range(draws):
        rng = np.random.default_rng(k)
        truth = pred * (1.0 + 0.04 * rng.standard_t(4, tok.size))
        d = proof_design(tok, LISTS, pred, 150, seed=k)
        rounds = truth[d.index][:, None] * (1.0 + 0.01 * rng.standard_normal((d.index.size, 4)))
        est = estimate_total(d, pred, rounds, graph_by_bucket={}, host_ms=0.0, allow=NONE)
        inside += est.contains(float(truth.sum()))
    assert 0.90 <= inside / draws <= 0.99


def test_the_gain_and_its_half_width():
    from bcgtune.core.plan.trace_estimate import TraceEstimate

    d = TraceEstimate(-300.0, 50.0, float("inf"), {"sampling": 1.0})
    t = TraceEstimate(10_000.0, 250.0, float("inf"), {"level": 250.0**2 / 1.959963984540054**2})
    g, h = gain_pct(d, t)
    assert g == pytest.approx(3.0) and h == pytest.approx(0.5)  # the ladder's level allowance cancels in the ratio
