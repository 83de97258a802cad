"""The recommendation rule of the time objective, against brute force on small cases: the
fewest graphs whose predicted time is within noise of the best (the paired interval of the
difference holds 0) or within --tolerance of it; the exact optimum stays in the table. And
the loop that measures what the optimizer wants (`calibrate --extend`), run on a stand-in
GPU whose true times are known: it ends with a fully measured list, never worse than before."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import bcgtune
from bcgtune.core.plan.calibration import BatchTimes, Calibration
from bcgtune.core.plan.calibration_extend import extend_calibration, extension_anchors
from bcgtune.core.plan.predict import TimeModel
from bcgtune.errors import InputError


@st.composite
def timed_grid(draw):
    """A small breakable grid calibration with R timed rounds: segment and eager times with
    per-size noise and a per-round drift."""
    step = draw(st.sampled_from([32, 64]))
    n = draw(st.integers(3, 6))
    tokens = np.arange(1, n + 1) * step
    rounds = draw(st.integers(2, 5))
    seed = draw(st.integers(0, 10_000))
    rng = np.random.default_rng(seed)
    drift = 1 + draw(st.sampled_from([0.0, 0.01, 0.1])) * rng.standard_normal(rounds)
    noise = draw(st.sampled_from([0.0, 0.002, 0.05]))
    seg = np.sort(rng.uniform(0.5, 3.0, n)) if draw(st.booleans()) else rng.uniform(0.5, 3.0, n)
    g = seg[:, None] * drift[None, :] * (1 + noise * rng.standard_normal((n, rounds)))
    bt = np.unique(rng.integers(1, int(tokens[-1]) + 1, size=draw(st.integers(1, 5))))
    e = rng.uniform(1.0, 4.0, bt.size)[:, None] * drift[None, :] * (1 + noise * rng.standard_normal((bt.size, rounds)))
    b = np.abs(rng.uniform(0.0, 0.5, bt.size))[:, None] * (1 + noise * rng.standard_normal((bt.size, rounds)))
    batches = BatchTimes(
        bt,
        np.ones(bt.size, dtype=np.int64),
        np.median(e, 1),
        np.maximum(np.median(b, 1), 0.0),
        eager_rounds=e,
        breaks_rounds=b,
    )
    cal = Calibration(
        tokens=tokens,
        eager_ms=None,
        graph_ms=np.median(g, 1),
        runner="breakable",
        batches=batches,
        graph_rounds=g,
        meta={"bucket_grid": step, "capture_s": {str(t): 0.1 + t / 1000 for t in tokens}},
        per_graph_gib=0.01,
        pool_gib=0.5,
    )
    sizes = draw(st.lists(st.sampled_from(bt.tolist()), min_size=1, max_size=10))
    return cal.validate(), sizes


def _brute(cal, sizes, k, tm):
    """Every list of at most k measured rows: (graphs, predicted, difference from the best)."""
    rows = cal.tokens.tolist()
    lists = [list(c) for r in range(0, k + 1) for c in itertools.combinations(rows, r)]
    best = min(lists, key=lambda bl: tm.total(bl).center)
    return [(bl, tm.total(bl).center, tm.difference(bl, best)) for bl in lists], best


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(case=timed_grid(), k=st.integers(1, 3), tolerance=st.sampled_from([None, 0.0, 1.0, 5.0, 30.0]))
def test_fewest_graphs_within_noise_or_tolerance_matches_brute_force(case, k, tolerance):
    cal, sizes = case
    trace = bcgtune.trace_from_sizes(sizes)
    plan = bcgtune.suggest_buckets(
        trace, objective="time", calibration=cal, max_buckets=k, tolerance_pct=tolerance, baselines=False, max_bucket=10**6
    )
    tm = TimeModel(trace.sizes, trace.counts, cal, candidates="calibration")
    every, best = _brute(cal, sizes, k, tm)
    best_ms = tm.total(best).center
    if tolerance is None:
        ok = [bl for bl, _, d in every if d.center - d.half <= 0]
    else:
        ok = [bl for bl, ms, _ in every if ms - best_ms <= tolerance / 100 * best_ms + 1e-9 * max(1.0, best_ms)]
    fewest = min(len(bl) for bl in ok)
    rec, opt = plan.recommended, plan.optimal
    # the exact optimum stays: nothing allowed is faster
    assert opt.predicted_ms == pytest.approx(best_ms, rel=1e-9, abs=1e-9)
    assert len(rec.buckets) == fewest, (rec.buckets, ok, plan.recommended_reason)
    assert any(sorted(bl) == rec.buckets for bl in ok) or rec.buckets == opt.buckets
    assert plan.recommended_reason
    # the recommended row is in the table, with its paired difference from the optimum
    assert rec in plan.rows and opt is plan.rows[0]
    d = tm.difference(rec.buckets, opt.buckets)
    assert opt.vs_recommended.center == pytest.approx(-d.center, abs=1e-9)


def test_one_round_recommends_the_optimum_unless_a_tolerance_is_given():
    cal = Calibration(
        tokens=[64, 128, 192, 256],
        eager_ms=[5.0, 5.0, 5.0, 5.0],
        graph_ms=[1.0, 1.01, 1.02, 1.03],
        meta={"bucket_grid": 64},
    )
    trace = bcgtune.trace_from_sizes([60, 120, 180, 250])
    plan = bcgtune.suggest_buckets(trace, objective="time", calibration=cal, max_buckets=4)
    assert plan.recommended is plan.optimal and "one round" in plan.recommended_reason
    plan = bcgtune.suggest_buckets(trace, objective="time", calibration=cal, max_buckets=4, tolerance_pct=50)
    assert len(plan.recommended.buckets) < len(plan.optimal.buckets)
    assert "within the 50% tolerance of the best" in plan.recommended_reason
    assert plan.flag == "--cuda-graph-bs-prefill " + " ".join(map(str, plan.recommended.buckets))
    with pytest.raises(InputError, match="tolerance"):
        bcgtune.suggest_buckets(trace, objective="time", calibration=cal, tolerance_pct=-1)


# ---- the loop that measures what the optimizer wants -------------------------------------
def true_segments(b):
    """A stand-in GPU: segment time with dips at multiples of 128 (tile-aligned sizes replay
    faster than the sizes just above them), 1.0 ms + 4 us per token."""
    b = np.asarray(b, dtype=np.float64)
    return 1.0 + 0.004 * b - 0.25 * (b % 128 == 0) + 0.05 * ((b % 128) > 0)


def measure(sizes, rounds, rng, runner="breakable"):
    """What `calibrate --extend` measures on the stand-in: the sizes' segments in `rounds`
    rounds, slightly faster than the first run (another process)."""
    sizes = np.asarray(sorted(sizes))
    g = true_segments(sizes)[:, None] * 0.99 * (1 + 0.001 * rng.standard_normal((sizes.size, rounds)))
    return Calibration(tokens=sizes, eager_ms=None, graph_ms=np.median(g, 1), runner=runner, graph_rounds=g, batches=None)


def first_calibration(rng, rounds=4):
    grid = np.arange(256, 4097, 256)
    g = true_segments(grid)[:, None] * (1 + 0.001 * rng.standard_normal((grid.size, rounds)))
    bt = np.array([300, 700, 1000, 1500, 2100, 2900, 3300, 4000])
    e = (2.0 + 0.005 * bt)[:, None] * (1 + 0.001 * rng.standard_normal((bt.size, rounds)))
    b = (0.2 + 0.0001 * bt)[:, None] * (1 + 0.001 * rng.standard_normal((bt.size, rounds)))
    batches = BatchTimes(bt, np.ones(bt.size, dtype=np.int64), np.median(e, 1), np.median(b, 1), e, b)
    return Calibration(
        tokens=grid,
        eager_ms=None,
        graph_ms=np.median(g, 1),
        runner="breakable",
        batches=batches,
        graph_rounds=g,
        meta={"bucket_grid": 256, "source": "cal.json"},
        engine_options={"model": "tiny"},
    ).validate()


def true_total(trace, buckets):
    from bcgtune.core.sglang.replay import assign_buckets

    chosen, replay = assign_buckets(trace.sizes, buckets)
    eager = 2.0 + 0.005 * trace.sizes
    brk = 0.2 + 0.0001 * trace.sizes
    return float((np.where(replay, true_segments(np.maximum(chosen, 1)) + brk, eager) * trace.counts).sum())


def test_refine_loop_converges_and_is_never_worse():
    rng = np.random.default_rng(7)
    cal = first_calibration(rng)
    sizes = [300] * 30 + [700] * 20 + [1000] * 25 + [1500] * 10 + [2100] * 12 + [2900] * 8 + [3300] * 6 + [4000] * 4
    trace = bcgtune.trace_from_sizes(sizes)
    history = []
    for _ in range(8):
        plan = bcgtune.suggest_buckets(trace, objective="time", calibration=cal, max_buckets=4, baselines=False)
        history.append((plan.optimal.predicted_ms, true_total(trace, plan.optimal.buckets), plan.optimal.buckets))
        if plan.refine is None:
            break
        assert plan.refine.command == f"bcgtune calibrate --extend cal.json --sizes {','.join(map(str, plan.refine.sizes))}"
        assert plan.refine.gain is not None and plan.refine.gain.center > 0
        new = measure(sorted(set(plan.refine.sizes) | set(extension_anchors(cal, plan.refine.sizes))), cal.rounds, rng)
        before = cal.graph_ms.copy(), cal.tokens.copy()
        cal = extend_calibration(cal, new, {"created": "now", "tool_version": "test"})
        # the rows it had are unchanged; the added ones are on the first run's scale
        assert np.array_equal(cal.graph_ms[np.isin(cal.tokens, before[1])], before[0])
        assert cal.sessions[-1]["scale_graph"] == pytest.approx(1 / 0.99, rel=0.01)
        added = np.isin(cal.tokens, plan.refine.sizes)
        assert cal.graph_ms[added] == pytest.approx(true_segments(cal.tokens[added]), rel=0.01)
    else:
        pytest.fail(f"did not converge: {history}")
    assert len(history) >= 2  # the grid alone was not enough: it measured sizes the trace wanted
    preds = [h[0] for h in history]
    assert all(b <= a + 1e-9 for a, b in zip(preds, preds[1:]))  # never worse than before
    assert history[-1][1] <= history[0][1] + 1e-9  # nor on the stand-in GPU's true times
    assert set(history[-1][2]) <= set(cal.tokens.tolist())  # fully measured
    assert cal.sessions[0]["kind"] == "calibration" and all(s["kind"] == "extension" for s in cal.sessions[1:])


def test_extension_refuses_what_it_cannot_merge():
    rng = np.random.default_rng(0)
    cal = first_calibration(rng)
    with pytest.raises(InputError, match="as many rounds"):
        extend_calibration(cal, measure([300], 2, rng), {})
    with pytest.raises(InputError, match="nothing to add"):
        extend_calibration(cal, measure([256, 512], cal.rounds, rng), {})
    old = Calibration(tokens=[64], eager_ms=[1.0], graph_ms=[1.0])
    with pytest.raises(InputError, match="no timed rounds"):
        extend_calibration(old, measure([128], 1, rng, runner="full"), {})
    assert extension_anchors(cal, [300, 4100]) == [256, 512, 768, 3840, 4096]


def test_an_extension_on_a_machine_in_another_state_is_refused():
    """Anchors that ran twice as fast say the extension's values are not comparable."""
    rng = np.random.default_rng(0)
    cal = first_calibration(rng)
    fast = measure([300, *extension_anchors(cal, [300])], cal.rounds, rng)
    fast.graph_ms, fast.graph_rounds = fast.graph_ms / 2.2, fast.graph_rounds / 2.2
    with pytest.raises(InputError, match=r"ran replay 0.45x as long .* calibrate again instead"):
        extend_calibration(cal, fast, {})
