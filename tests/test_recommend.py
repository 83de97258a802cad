"""The recommendation rule of the time objective, against brute force on small cases: the
fewest graphs whose paired 95% upper bound against the best is within the margin
(--tolerance, default 0.5% of the best's predicted time); the exact optimum stays in the
table; wider round-to-round noise never recommends fewer graphs nor a list slower than the
margin allows. And the loop that measures what the optimizer wants (`calibrate --extend`),
run on a stand-in GPU whose true times are known: it ends with a fully measured list, never
worse than before."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pytest
from cli_helpers import assert_one_line_error, cli
from hypothesis import HealthCheck, assume, given, settings
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
    """The candidates the rule may pick for fewer graphs: for each number of graphs g <= k,
    the fastest list of g measured rows (brute force), with its predicted time and paired
    difference from the best; and the best."""
    rows = cal.tokens.tolist()
    per_g = []
    for g in range(0, k + 1):
        lists = [list(c) for c in itertools.combinations(rows, g)]
        per_g.append(min(lists, key=lambda bl: (tm.total(bl).center, bl)))
    best = min(per_g, key=lambda bl: (tm.total(bl).center, len(bl)))
    return [(bl, tm.total(bl).center, tm.difference(bl, best)) for bl in per_g], best


def _admitted(d, margin):
    return d.half is not None and d.center + d.half <= margin + 1e-9 * max(1.0, margin)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(case=timed_grid(), k=st.integers(1, 3), tolerance=st.sampled_from([None, 0.0, 1.0, 5.0, 30.0]))
def test_fewest_graphs_within_the_margin_matches_brute_force(case, k, tolerance):
    cal, sizes = case
    trace = bcgtune.trace_from_sizes(sizes)
    plan = bcgtune.suggest_buckets(
        trace, objective="time", calibration=cal, max_buckets=k, tolerance_pct=tolerance, baselines=False, max_bucket=10**6
    )
    tm = TimeModel(trace.sizes, trace.counts, cal, candidates="calibration")
    every, best = _brute(cal, sizes, k, tm)
    best_ms = tm.total(best).center
    pct = 0.5 if tolerance is None else tolerance
    margin = pct / 100 * best_ms
    ok = [bl for bl, _, d in every if _admitted(d, margin)]
    fewest = min(len(bl) for bl in ok)
    rec, opt = plan.recommended, plan.optimal
    # the exact optimum stays: nothing allowed is faster
    assert opt.predicted_ms == pytest.approx(best_ms, rel=1e-9, abs=1e-9)
    assert len(rec.buckets) == fewest, (rec.buckets, ok, plan.recommended_reason)
    # what it recommends is shown within the margin: its upper bound, not only its prediction
    d = tm.difference(rec.buckets, opt.buckets)
    assert rec.buckets == opt.buckets or _admitted(d, margin)
    assert plan.recommended_reason
    rule = plan.to_json_obj()["recommended"]["rule"]
    assert rule["tolerance_pct"] == pct and rule["given"] == (tolerance is not None) and rule["bound"] == "upper"
    assert rule["margin_ms"] == pytest.approx(margin)
    # the recommended row is in the table, with its paired difference from the optimum
    assert rec in plan.rows and opt is plan.rows[0]
    assert opt.vs_recommended.center == pytest.approx(-d.center, abs=1e-9)


def widened(cal: Calibration, s: float) -> Calibration:
    """The same calibration with every round's deviation from its size's median scaled by
    `s`: the medians (the predictions) stay, the round-to-round spread grows with s."""

    def spread(rounds):
        med = np.median(rounds, axis=1, keepdims=True)
        return med + s * (rounds - med)

    b = cal.batches
    batches = BatchTimes(
        b.tokens,
        b.requests,
        b.eager_ms,
        b.breaks_ms,
        eager_rounds=spread(b.eager_rounds),
        breaks_rounds=spread(b.breaks_rounds),
    )
    out = Calibration(
        tokens=cal.tokens,
        eager_ms=None,
        graph_ms=cal.graph_ms,
        runner="breakable",
        batches=batches,
        graph_rounds=spread(cal.graph_rounds),
        meta=cal.meta,
        per_graph_gib=cal.per_graph_gib,
        pool_gib=cal.pool_gib,
    )
    return out


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(
    case=timed_grid(),
    k=st.integers(1, 3),
    tolerance=st.sampled_from([None, 0.0, 2.0, 10.0]),
    spreads=st.lists(st.sampled_from([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 5.0]), min_size=2, max_size=4, unique=True).map(sorted),
)
def test_wider_noise_never_recommends_fewer_graphs_or_a_slower_list(case, k, tolerance, spreads):
    """The same per-size medians with a growing round-to-round spread: the recommended list is
    never predicted slower than the best by more than the margin, and its number of graphs
    never drops as the spread grows."""
    cal, sizes = case
    cals = [widened(cal, s) for s in spreads]
    assume(all(min(c.graph_rounds.min(), c.batches.eager_rounds.min(), c.batches.breaks_rounds.min()) >= 0 for c in cals))
    trace = bcgtune.trace_from_sizes(sizes)
    graphs, best = [], None
    for c in cals:
        plan = bcgtune.suggest_buckets(
            trace, objective="time", calibration=c.validate(), max_buckets=k, tolerance_pct=tolerance, baselines=False
        )
        opt, rec = plan.optimal, plan.recommended
        if best is None:
            best = opt.predicted_ms
        assert opt.predicted_ms == pytest.approx(best, rel=1e-9, abs=1e-9)  # the medians decide the optimum
        margin = plan.rule.margin_ms
        assert margin == pytest.approx((0.5 if tolerance is None else tolerance) / 100 * best)
        assert rec.predicted_ms - best <= margin + 1e-9 * max(1.0, margin), plan.recommended_reason
        graphs.append(len(rec.buckets))
    assert graphs == sorted(graphs), (spreads, graphs)


def test_a_list_exactly_at_the_margin_is_recommended_and_one_just_past_it_is_not():
    """Every value of round r is its median x (1 + eps_r): a list's paired difference from the
    optimum is D x (1 + eps_r), so its upper bound is known; a tolerance that puts the margin
    exactly there recommends it, one a millionth smaller keeps the optimum."""
    eps = [-0.02, 0.0, 0.02, 0.04, -0.04]
    f = 1.0 + np.asarray(eps)[None, :]
    tokens = np.array([64, 128, 192, 256])
    seg = 1.0 + tokens / 64.0
    bt = np.array([40, 100, 200])
    eager = 5.0 + bt / 40.0
    brk = np.full(bt.size, 0.1)
    batches = BatchTimes(bt, np.ones(bt.size, dtype=np.int64), eager, brk, eager[:, None] * f, brk[:, None] * f)
    cal = Calibration(
        tokens=tokens, eager_ms=None, graph_ms=seg, runner="breakable", batches=batches, graph_rounds=seg[:, None] * f
    ).validate()
    trace = bcgtune.trace_from_sizes([40] * 3 + [100] * 5 + [200] * 7)
    plan = bcgtune.suggest_buckets(trace, objective="time", calibration=cal, max_buckets=3, baselines=False)
    opt = plan.optimal
    tm = TimeModel(trace.sizes, trace.counts, cal, candidates="calibration")
    fewer = next(c.buckets for c in plan.curve if len(c.buckets) == len(opt.buckets) - 1)
    d = tm.difference(fewer, opt.buckets)
    assert d.half > 0 and d.center > 0
    at = 100 * (d.center + d.half) / opt.predicted_ms
    # nothing with fewer graphs still is inside that margin, so the boundary decides alone
    for c in plan.curve:
        if len(c.buckets) < len(fewer):
            e = tm.difference(c.buckets, opt.buckets)
            assert e.center + e.half > d.center + d.half
    assert tm.difference([], opt.buckets).center > d.center + d.half
    edge = bcgtune.suggest_buckets(trace, objective="time", calibration=cal, max_buckets=3, baselines=False, tolerance_pct=at)
    assert edge.recommended.buckets == fewer
    assert f"the fewest graphs whose paired 95% upper bound is within {at:g}%" in edge.recommended_reason
    past = bcgtune.suggest_buckets(
        trace, objective="time", calibration=cal, max_buckets=3, baselines=False, tolerance_pct=at * (1 - 1e-6)
    )
    assert past.recommended.buckets == opt.buckets
    assert "no list with fewer graphs has a paired 95% upper bound within" in past.recommended_reason
    # the same point estimate inside the margin does not count: its upper bound is past it
    mid = 100 * (d.center + d.half / 2) / opt.predicted_ms
    half_in = bcgtune.suggest_buckets(trace, objective="time", calibration=cal, max_buckets=3, baselines=False, tolerance_pct=mid)
    assert half_in.recommended.buckets == opt.buckets


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
    assert plan.rule.bound == "none" and "one timed round gives no interval" in plan.rule.summary()
    plan = bcgtune.suggest_buckets(trace, objective="time", calibration=cal, max_buckets=4, tolerance_pct=50)
    assert len(plan.recommended.buckets) < len(plan.optimal.buckets)
    assert plan.rule.bound == "predicted"
    assert "predicted within 50% (" in plan.recommended_reason and "by the predicted time alone" in plan.recommended_reason
    assert plan.flag == "--cuda-graph-bs-prefill " + " ".join(map(str, plan.recommended.buckets))
    with pytest.raises(InputError, match="tolerance"):
        bcgtune.suggest_buckets(trace, objective="time", calibration=cal, tolerance_pct=-1)
    for bad in (float("nan"), 101.0, float("inf")):
        with pytest.raises(InputError, match="tolerance"):
            bcgtune.suggest_buckets(trace, objective="time", calibration=cal, tolerance_pct=bad)


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


# ---- the command line: --tolerance, and the rule it prints ------------------------------
DOCS = Path(__file__).resolve().parent / "data" / "docs"


@pytest.mark.parametrize("command", ["suggest-buckets", "drift"])
@pytest.mark.parametrize("bad", ["-1", "nan", "101", "abc", "inf", "-0.001"])
def test_a_bad_tolerance_is_a_one_line_error_naming_the_flag(command, bad):
    args = ["--trace", DOCS / "small.csv", "-p", "h200"] if command == "drift" else [DOCS / "small.csv", "--objective", "time"]
    r = cli([command, *args, "--calibration", DOCS / "tiny-cal.json", "--tolerance", bad])
    assert r.code == 2, (r.code, r.err)
    assert_one_line_error(r)
    line = next(ln for ln in r.err.splitlines() if ln.startswith("error:"))
    assert "--tolerance" in line, line


def test_suggest_prints_the_rule_with_its_default_margin_and_carries_it_in_json():
    base = ["suggest-buckets", DOCS / "small.csv", "--objective", "time", "--calibration", DOCS / "tiny-cal.json"]
    r = cli([*base, "--max-buckets", "3"])
    assert r.code == 0, r.err
    rule = next(ln for ln in r.out.splitlines() if ln.startswith("rule: "))
    assert rule.startswith("rule: the fewest graphs whose paired 95% upper bound is within 0.5% (")
    assert "ms) of the best (the default; --tolerance PCT sets it)" in rule
    obj = json.loads(cli([*base, "--max-buckets", "3", "--json"]).out)
    got = obj["recommended"]["rule"]
    assert got["tolerance_pct"] == 0.5 and got["given"] is False and got["bound"] == "upper" and got["rounds"] == 5
    assert got["margin_ms"] == pytest.approx(0.005 * obj["optimal"]["predicted_ms"])
    assert obj["params"]["tolerance_pct"] == 0.5 and got["text"] in rule
    # stated: the rule names it, and a wide enough margin takes fewer graphs
    obj = json.loads(cli([*base, "--max-buckets", "3", "--json", "--tolerance", "30"]).out)
    assert obj["recommended"]["rule"]["given"] is True and "(--tolerance 30)" in obj["recommended"]["rule"]["text"]
    assert obj["recommended"]["graphs"] < obj["optimal"]["graphs"]


def test_the_padding_objective_has_no_time_rule():
    r = cli(["suggest-buckets", DOCS / "small.csv", "--max-buckets", "3"])
    assert r.code == 0 and "rule:" not in r.out
    obj = json.loads(cli(["suggest-buckets", DOCS / "small.csv", "--max-buckets", "3", "--json"]).out)
    assert obj["recommended"]["rule"] is None and obj["params"]["tolerance_pct"] is None


def test_drift_prints_the_same_rule_and_margin():
    args = ["drift", "-p", "h200", "--trace", DOCS / "small.csv", "--calibration", DOCS / "tiny-cal.json"]
    r = cli(args)
    assert r.code in (0, 1), r.err
    assert "rule: keep when the deployed list's paired 95% upper bound is within 0.5% (" in r.out
    obj = json.loads(cli([*args, "--json", "--tolerance", "3"]).out)
    assert obj["tolerance_pct"] == 3 and obj["margin_ms"] == pytest.approx(0.03 * obj["optimum"]["predicted_ms"])
    assert obj["excess"]["half"] is not None
