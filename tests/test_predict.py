"""Predictions with intervals (bcgtune.core.plan.predict, core.stats): the t quantile, intervals
from timed rounds (a known spread gives the known interval), paired differences, earlier
calibration formats read as one round, and the notes a plan gives about what its numbers
rest on."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import bcgtune
from bcgtune.core.plan.calibration import BatchTimes, Calibration
from bcgtune.core.plan.optimizer import predicted_time_ms
from bcgtune.core.plan.predict import TimeModel
from bcgtune.core.stats import round_interval, t_quantile_975
from bcgtune.core.trace.mix import BatchMix
from bcgtune.errors import InputError
from bcgtune.files.calibration_file import load_calibration, save_calibration

ROOT = Path(__file__).resolve().parents[1]
OLD = ROOT / "tests" / "data" / "calibrations"
# round effects with a known spread: every size of round r runs (1 + EPS[r]) x its base time
EPS = np.array([-0.02, 0.0, 0.02, 0.04, -0.04])


def test_t_quantile_matches_scipy():
    stats = pytest.importorskip("scipy.stats")
    for df in (1, 2, 3, 5, 9, 29, 30, 31, 45, 100, 1000, 10**6):
        assert t_quantile_975(df) == pytest.approx(stats.t.ppf(0.975, df), abs=2e-4)
    with pytest.raises(ValueError):
        t_quantile_975(0)


def test_round_interval_is_the_t_interval():
    x = np.array([10.0, 11.0, 12.0, 13.0])
    iv = round_interval(11.5, x)
    se = np.std(x, ddof=1) / 2
    assert iv.se == pytest.approx(se) and iv.half == pytest.approx(3.1824 * se) and iv.rounds == 4
    assert iv.contains(11.5) and not iv.contains(11.5 + 1.01 * iv.half)
    one = round_interval(5.0, [5.0])
    assert one.half is None and one.se is None and one.contains(5.0) is None


def scaled_calibration(runner: str = "breakable", eps=EPS, grid=(64, 128, 192, 256)) -> Calibration:
    """A calibration whose every value in round r is base x (1 + eps[r]): medians = base."""
    f = 1.0 + np.asarray(eps)[None, :]
    tokens = np.asarray(grid)
    seg = 1.0 + tokens / 64.0
    if runner == "full":
        eager = 3.0 + tokens / 50.0
        return Calibration(
            tokens=tokens, eager_ms=eager, graph_ms=seg, graph_rounds=seg[:, None] * f, eager_rounds=eager[:, None] * f
        )
    bt, br = np.array([40, 100, 100, 200]), np.array([1, 1, 3, 2])
    eager = 5.0 + bt / 40.0
    brk = 0.1 * br.astype(float)
    batches = BatchTimes(bt, br, eager, brk, eager_rounds=eager[:, None] * f, breaks_rounds=brk[:, None] * f)
    return Calibration(
        tokens=tokens, eager_ms=None, graph_ms=seg, runner="breakable", batches=batches, graph_rounds=seg[:, None] * f
    )


@pytest.mark.parametrize("runner", ["breakable", "full"])
def test_known_round_spread_gives_the_known_interval(runner):
    """Every size scaled by (1 + eps_r) in round r: each list's per-round total is its
    prediction x (1 + eps_r), so its interval is t(0.975, R-1) x P x sd(eps) / sqrt(R), and a
    paired difference's is the same with P_A - P_B."""
    cal = scaled_calibration(runner).validate()
    mix = BatchMix.from_batches([40, 100, 100, 100, 200, 200], [1, 1, 3, 3, 2, 2])
    sizes, counts = mix.histogram()
    tm = TimeModel(sizes, counts, cal, mix=mix if runner == "breakable" else None)
    k = t_quantile_975(len(EPS) - 1) * np.std(EPS, ddof=1) / math.sqrt(len(EPS))
    for bl in ([], [128, 256], [64, 128, 192, 256]):
        p = predicted_time_ms(sizes, counts, bl, cal, mix=mix if runner == "breakable" else None)
        iv = tm.total(bl)
        assert iv.center == pytest.approx(p) and iv.half == pytest.approx(k * p) and iv.rounds == 5
    a, b = [128, 256], []
    d = tm.difference(a, b)
    pa, pb = tm.total(a).center, tm.total(b).center
    assert d.center == pytest.approx(pa - pb) and d.half == pytest.approx(k * abs(pa - pb))


def test_paired_difference_cancels_what_moves_every_size():
    """A round that is slow for every size moves both lists of a pair: their difference
    stays tight while each total's interval is wide."""
    cal = scaled_calibration(eps=[0.0, 0.3, -0.3, 0.1, -0.1])
    tm = TimeModel(np.array([100, 200]), np.array([3, 1]), cal)
    assert tm.total([128, 256]).half > 10 * tm.difference([128, 256], [128, 192, 256]).half


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    sizes=st.lists(st.integers(1, 400), min_size=1, max_size=12),
    buckets=st.lists(st.integers(1, 450), max_size=5),
    rounds=st.integers(1, 6),
    seed=st.integers(0, 1000),
    steps=st.booleans(),
)
def test_center_is_the_point_prediction(sizes, buckets, rounds, seed, steps):
    """The interval's center is exactly what the optimizer's model predicts, per batch and
    per DP-attention step."""
    from bcgtune.core.plan.dp_steps import DPSteps, predicted_step_time_ms

    rng = np.random.default_rng(seed)
    tokens = np.array([32, 96, 160, 256, 384])
    g = (1 + tokens / 100.0)[:, None] * (1 + 0.05 * rng.random((tokens.size, rounds)))
    e = (4 + tokens / 80.0)[:, None] * (1 + 0.05 * rng.random((tokens.size, rounds)))
    cal = Calibration(
        tokens=tokens, eager_ms=np.median(e, 1), graph_ms=np.median(g, 1), graph_rounds=g, eager_rounds=e
    ).validate()
    s, c = np.unique(sizes, return_counts=True)
    if steps:
        st_ = DPSteps.from_votes(np.arange(len(sizes)) // 2, np.asarray(sizes), 2)
        tm = TimeModel(s, c, cal, steps=st_)
        assert tm.total(buckets).center == pytest.approx(predicted_step_time_ms(st_, buckets, cal))
    else:
        tm = TimeModel(s, c, cal)
        assert tm.total(buckets).center == pytest.approx(predicted_time_ms(s, c, buckets, cal))
    assert (tm.total(buckets).half is None) == (rounds == 1)


@pytest.mark.parametrize(
    "name,fmt",
    [
        ("format1_qwen3-8b_h200.json", 1),
        ("format1_grid64_qwen3-0.6b_h200.json", 1),
        ("format2_breakable_grid128_qwen3-8b_h200.json", 2),
        ("whole_forward_qwen3-8b_h200.csv", None),
    ],
)
def test_earlier_formats_read_as_one_round_and_say_so(name, fmt, tmp_path):
    from cli_helpers import cli

    cal = load_calibration(OLD / name)
    assert cal.rounds == 1 and cal.round_views() == [] and cal.meta.get("format_version") == fmt
    trace = tmp_path / "t.csv"
    trace.write_text("size,count\n300,5\n1100,3\n2500,2\n")
    r = cli(["suggest-buckets", trace, "--objective", "time", "--calibration", OLD / name, "--max-buckets", "3"])
    assert r.code == 0, r.err
    assert "note: no interval (one round:" in r.out and "keeps one value per size" in r.out
    assert "why: the optimum: the calibration kept one value per size" in r.out
    # written again, it is format 3 with one round per value: still no interval
    out = tmp_path / "again.json"
    save_calibration(cal, out)
    again = load_calibration(out)
    assert json.loads(out.read_text())["format_version"] == 4 and again.rounds == 1
    assert again.graph_ms.tolist() == pytest.approx(cal.graph_ms.tolist())


def _doc(**rows_extra):
    return {
        "format_version": 3,
        "runner": "breakable",
        "rounds": 2,
        "rows": [{"tokens": 64, "graph_ms": 1.5, "graph_rounds_ms": [1.0, 2.0], **rows_extra}],
        "batches": {
            "tokens": [64],
            "requests": [1],
            "eager_ms": [3.0],
            "breaks_ms": [0.0],
            "eager_rounds_ms": [[3.0, 3.0]],
            "breaks_rounds_ms": [[-0.5, 0.1]],
        },
        "sessions": [{"kind": "calibration", "rounds": 2}],
    }


def test_format3_round_trip_keeps_rounds_sessions_and_negative_round_differences(tmp_path):
    p = tmp_path / "c.json"
    p.write_text(json.dumps(_doc()))
    cal = load_calibration(p)
    assert cal.rounds == 2 and cal.graph_rounds.tolist() == [[1.0, 2.0]]
    assert cal.batches.breaks_rounds.tolist() == [[-0.5, 0.1]] and cal.batches.breaks_ms.tolist() == [0.0]  # clipped median
    out = tmp_path / "o.json"
    save_calibration(cal, out)
    back = load_calibration(out)
    assert back.graph_rounds.tolist() == [[1.0, 2.0]] and back.sessions[0]["kind"] == "calibration"


@pytest.mark.parametrize(
    "change,match",
    [
        (lambda d: d["rows"][0].update(graph_rounds_ms=[1.0, float("nan")]), "NaN is not a number"),
        (lambda d: d["rows"][0].update(graph_rounds_ms=[1.0, -2.0]), r"graph_rounds_ms\[1\]"),
        (lambda d: d["rows"][0].update(graph_rounds_ms=[1.0]), "every row must keep 2 rounds"),
        (lambda d: d["rows"][0].update(graph_ms=9.0), r"rows.graph_rounds_ms\[0\]: the median of its rounds is 1.5000"),
        (lambda d: d["batches"].update(eager_rounds_ms=[[3.0, 3.0, 3.0]]), "rounds"),
        (lambda d: d["batches"].update(breaks_rounds_ms=[[1e300, 0.0]]), r"breaks_rounds_ms\[0\]\[0\]"),
        (lambda d: d.update(rounds=0), "rounds"),
        (lambda d: d.pop("sessions"), "sessions"),
        (lambda d: d["rows"][0].update(session=3), "names a session"),
    ],
)
def test_bad_rounds_are_one_line_errors(tmp_path, change, match):
    d = _doc()
    change(d)
    p = tmp_path / "c.json"
    p.write_text(json.dumps(d))
    with pytest.raises(InputError, match=match) as e:
        load_calibration(p)
    assert "\n" not in str(e.value)


def test_nan_rounds_of_a_calibration_built_in_code_are_refused():
    cal = scaled_calibration()
    cal.graph_rounds[1, 2] = float("nan")
    with pytest.raises(InputError, match=r"rows.graph_rounds_ms\[1\]\[2\]"):
        cal.validate()
    trace = bcgtune.trace_from_sizes([40, 100])
    with pytest.raises(InputError, match="graph_rounds_ms"):
        bcgtune.suggest_buckets(trace, objective="time", calibration=cal)


def test_cli_names_the_field_of_a_negative_round(tmp_path):
    from cli_helpers import assert_one_line_error, cli

    d = _doc()
    d["batches"]["eager_rounds_ms"] = [[3.0, -3.0]]
    p = tmp_path / "c.json"
    p.write_text(json.dumps(d))
    trace = tmp_path / "t.csv"
    trace.write_text("50\n60\n")
    r = cli(["suggest-buckets", trace, "--objective", "time", "--calibration", p])
    assert r.code == 2 and "batches.eager_rounds_ms[0][1]" in r.err
    assert_one_line_error(r)


def test_rounds_that_disagree_widely_are_said_and_call_nothing_better(tmp_path):
    """A calibration whose rounds disagree wildly: the intervals are wide, the plan says so,
    and the rule then recommends fewer graphs only where the upper bound is still within the
    margin (wide noise is not evidence that two lists are equal)."""
    cal = scaled_calibration(eps=[-0.5, 0.6, 0.0, -0.4, 0.5])
    trace = bcgtune.trace_from_sizes([40, 100, 100, 200, 200, 200])
    plan = bcgtune.suggest_buckets(trace, objective="time", calibration=cal, max_buckets=4)
    assert plan.time is not None and plan.time.widest_pct > 10
    from bcgtune.cli.render.plan import render_plan_text

    text = render_plan_text(plan)
    assert "rounds disagree widely" in text
    assert len(plan.recommended.buckets) <= len(plan.optimal.buckets)
    d = plan.model.difference(plan.recommended.buckets, plan.optimal.buckets)
    assert d.center + d.half <= plan.rule.margin_ms + 1e-9
    assert f"rule: {plan.rule.summary()}" in text


def test_sizes_outside_the_calibration_are_named(tmp_path):
    cal = scaled_calibration()
    trace = bcgtune.trace_from_sizes([10, 100, 100, 5000])
    plan = bcgtune.suggest_buckets(trace, objective="time", calibration=cal, max_buckets=2)
    n, of, lo, hi = plan.time.outside
    assert (n, of, lo, hi) == (2, 4, 40, 200)
    from bcgtune.cli.render.plan import render_plan_text

    assert "2 of 4 batches lie outside the sizes the calibration timed (40 to 200 tokens)" in render_plan_text(plan)


def test_plan_json_carries_the_intervals():
    cal = scaled_calibration()
    trace = bcgtune.trace_from_sizes([40, 100, 100, 200])
    plan = bcgtune.suggest_buckets(trace, objective="time", calibration=cal, max_buckets=3, compare={"mine": [128, 256]})
    obj = plan.to_json_obj()
    rows = {r["name"]: r for r in obj["comparison"]}
    mine = rows["mine"]
    tm = TimeModel(trace.sizes, trace.counts, cal)
    assert mine["predicted_half_ms"] == pytest.approx(tm.total([128, 256]).half)
    d = tm.difference([128, 256], obj["recommended"]["buckets"])
    assert mine["vs_recommended_ms"] == pytest.approx(d.center) and mine["vs_recommended_half_ms"] == pytest.approx(d.half)
    assert rows["eager (no graphs)"]["graphs"] == 0 and rows["eager (no graphs)"]["predicted_half_ms"] > 0
    assert obj["uncertainty"]["rounds"] == 5 and obj["uncertainty"]["confidence"] == 0.95
    assert obj["recommended"]["reason"] and obj["optimal"]["flag"].startswith("--cuda-graph-bs-prefill")
    assert all(c["predicted_half_ms"] > 0 for c in obj["curve"])


def test_host_bound_eager_is_said(tmp_path):
    """Eager forwards that cost far more than their replay are launch-bound: the plan says
    that eager time follows the host; a measured host launch time decides it when kept."""
    cal = scaled_calibration()
    cal.batches.eager_ms = cal.batches.eager_ms * 10
    cal.batches.eager_rounds = cal.batches.eager_rounds * 10
    trace = bcgtune.trace_from_sizes([40, 100, 200])
    plan = bcgtune.suggest_buckets(trace, objective="time", calibration=cal, max_buckets=3)
    hb = plan.time.host_bound
    assert hb.how == "inferred" and hb.share == pytest.approx(1.0)
    from bcgtune.cli.render.plan import render_plan_text

    assert "eager time here depends on the host" in render_plan_text(plan)
    cal.batches.eager_host_ms = cal.batches.eager_ms * 0.1  # the GPU, not the host, set the pace
    plan = bcgtune.suggest_buckets(trace, objective="time", calibration=cal, max_buckets=3)
    assert plan.time.host_bound.how == "measured" and plan.time.host_bound.share == 0.0
    assert "depends on the host" not in render_plan_text(plan)


def test_gain_in_percent_is_paired():
    """drift's time verdict can use it: the optimum's gain over a deployed list in % with
    its paired interval."""
    cal = scaled_calibration()
    tm = TimeModel(np.array([40, 100, 200]), np.array([5, 3, 1]), cal)
    g = tm.gain_pct([256], [64, 128, 256])
    a, b = tm.total([256]).center, tm.total([64, 128, 256]).center
    assert g.center == pytest.approx(100 * (a - b) / a)
    assert g.half == pytest.approx(0.0, abs=1e-9)  # every size scaled alike in a round: the ratio does not move


def test_plot_shows_the_intervals(tmp_path):
    """--plot of a time-objective plan adds a panel of each list's paired difference from the
    recommended list with its interval (matplotlib draws what the plan holds)."""
    pytest.importorskip("matplotlib")
    from bcgtune.cli.render.plan import plot_plan

    cal = scaled_calibration(eps=[-0.02, 0.0, 0.02, 0.01, -0.01])
    trace = bcgtune.trace_from_sizes([40, 100, 100, 200])
    plan = bcgtune.suggest_buckets(trace, objective="time", calibration=cal, max_buckets=3, compare={"mine": [128, 256]})
    assert all(c.vs_recommended_half_ms is not None for c in plan.curve)
    out = tmp_path / "p.png"
    plot_plan(trace, plan, str(out))
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# ---- through the engine's calibrate on the tiny CPU model, with a known clock -------------
def _fake_clock(monkeypatch, eps, host_share=1.0, run_calls=True):
    pytest.importorskip("torch")
    from fake_timer import fake_interleaved

    import bcgtune.engines.timing as timing

    monkeypatch.setattr(timing, "time_interleaved", fake_interleaved(timing.time_interleaved, eps, host_share, run_calls))


@pytest.mark.parametrize("runner", ["breakable", "full"])
def test_engine_calibration_with_a_known_spread_gives_the_known_interval(monkeypatch, runner):
    """calibrate on the tiny model with a stand-in clock whose round r runs every call
    (1 + eps_r) times its known time: the calibration keeps those rounds, its medians are the
    known times, and every list's interval is t(0.975, R-1) x P x sd(eps) / sqrt(R)."""
    from fake_timer import breaks_ms, eager_ms, segments_ms

    from bcgtune.engines.spec import EngineSpec
    from bcgtune.services.calibrate import run_calibrate

    _fake_clock(monkeypatch, EPS, host_share=0.25)
    mix = BatchMix.from_batches([20, 40, 40, 60], [1, 2, 2, 3])
    result = run_calibrate(
        [32, 64], EngineSpec(model="tiny", device="cpu", runner=runner), mix=mix, warmup=0, repeats=len(EPS), memory=False
    )
    cal = result.calibration
    assert cal.rounds == len(EPS) and cal.engine_options["model"] == "tiny" and cal.sessions[0]["rounds"] == len(EPS)
    # breakable rows: segments alone; full rows: a whole replay of one request of b tokens
    extra = (lambda b: 0.0) if runner == "breakable" else (lambda b: breaks_ms(b, 1))
    assert cal.graph_ms.tolist() == pytest.approx([segments_ms(32) + extra(32), segments_ms(64) + extra(64)])
    if runner == "breakable":
        assert cal.batches.eager_ms.tolist() == pytest.approx([eager_ms(20, 1), eager_ms(40, 2), eager_ms(60, 3)])
        assert cal.batches.breaks_ms.tolist() == pytest.approx([breaks_ms(20, 1), breaks_ms(40, 2), breaks_ms(60, 3)])
        assert cal.batches.eager_host_ms.tolist() == pytest.approx((0.25 * cal.batches.eager_ms).tolist())
    sizes, counts = mix.histogram()
    tm = TimeModel(sizes, counts, cal, mix=mix if runner == "breakable" else None)
    k = t_quantile_975(len(EPS) - 1) * np.std(EPS, ddof=1) / math.sqrt(len(EPS))
    for bl in ([], [32, 64], [64]):
        iv = tm.total(bl)
        assert iv.half == pytest.approx(k * iv.center, rel=1e-6)
    d = tm.difference([64], [32, 64])
    assert d.half == pytest.approx(k * abs(d.center), rel=1e-6)
    if runner == "breakable":  # measured host time: a quarter of eager, so not launch-bound
        plan = bcgtune.suggest_buckets(bcgtune.trace_from_sizes([20, 40, 60]), objective="time", calibration=cal)
        assert plan.time.host_bound.how == "measured" and plan.time.host_bound.share == 0.0


def test_refine_loop_through_the_cli_converges(monkeypatch, tmp_path):
    """The loop as a user runs it: calibrate on a coarse grid, suggest-buckets names the
    unmeasured sizes it wants and the command, `calibrate --extend` measures them in place,
    again until the list holds only measured sizes; the optimum over measured sizes never
    gets slower, and the file keeps its history."""
    from cli_helpers import cli

    from bcgtune.core.trace.prefill_trace import PrefillTrace
    from bcgtune.files.trace_file import save_trace

    _fake_clock(monkeypatch, [0.0, 0.01, -0.01], run_calls=False)  # the calls' own path: the test above
    trace = tmp_path / "t.json"
    sizes = [20] * 9 + [40] * 5 + [70] * 6 + [90] * 3 + [150] * 2
    save_trace(PrefillTrace.from_batches({"forward_tokens": sizes, "new_seq": [1] * len(sizes)}), str(trace))
    cal = tmp_path / "cal.json"
    r = cli(["calibrate", "--model", "tiny", "--device", "cpu", "--sizes-from", trace, "--grid", "64", "--repeats", "3",
             "--warmup", "0", "--no-memory", "-o", cal, "--quiet"])  # fmt: skip
    assert r.code == 0, r.err
    optima, commands = [], []
    for _ in range(6):
        r = cli(["suggest-buckets", trace, "--objective", "time", "--calibration", cal, "--max-buckets", "3", "--json"])
        assert r.code == 0, r.err
        plan = json.loads(r.out)
        optima.append(plan["optimal"]["predicted_ms"])
        if plan["refine"] is None:
            break
        cmd = plan["refine"]["command"]
        assert cmd.startswith(f"bcgtune calibrate --extend {cal} --sizes ")
        commands.append(cmd)
        r = cli(cmd.split()[1:] + ["--quiet"])
        assert r.code == 0, r.err
    else:
        pytest.fail(f"no fully measured list after {commands}")
    assert commands, "the 64-token grid alone left no size to measure"
    assert all(b <= a + 1e-9 for a, b in zip(optima, optima[1:]))
    final = load_calibration(cal)
    assert set(plan["optimal"]["buckets"]) <= set(final.tokens.tolist())
    assert [s["kind"] for s in final.sessions] == ["calibration"] + ["extension"] * len(commands)
    assert final.sessions[1]["scale_graph"] == pytest.approx(1.0)  # the same clock in both runs
    text = cli(["suggest-buckets", trace, "--objective", "time", "--calibration", cal, "--max-buckets", "3"]).out
    assert "calibrate --extend" not in text and "report this as a bug" not in text


# ---- drift's time verdict: paired, with its interval, priced as suggest-buckets prices ----
def _drift_trace():
    # batches of one request at 40, 100 and 200 tokens: a one-bucket list at 256 pads them all
    return bcgtune.trace_from_sizes([40] * 30 + [100] * 30 + [200] * 30)


def _round_noise_calibration(eps):
    """Every size's round-r time is base x (1 + eps[r]) except the graph at 256, whose own
    noise differs: the paired gain of a list without 256 over one with it then varies."""
    cal = scaled_calibration("breakable", eps=np.zeros(len(eps)))
    g = cal.graph_rounds.copy()
    g[-1] = g[-1] * (1.0 + np.asarray(eps))
    cal.graph_rounds = g
    return cal.validate()


def test_drift_claims_a_gain_only_beyond_the_noise_and_keeps_only_what_is_shown_close():
    from bcgtune.core.plan.drift import drift_report

    trace = _drift_trace()
    quiet = _round_noise_calibration([0.0, 0.001, -0.001, 0.0005, -0.0005])
    rep = drift_report(trace, [256], calibration=quiet, threshold_pct=1.0)
    gain = rep.time_gain
    assert gain is not None and gain.half is not None and gain.rounds == 5
    assert rep.gains["time_pct"] == pytest.approx(gain.center)
    assert gain.low > 1.0 and rep.verdict == "re-tune" and "above the 1% threshold" in rep.reason
    assert "95% paired interval" in rep.reason
    # the same gain, but a graph whose time swings by +-80% between rounds: the interval
    # straddles the threshold. No gain is claimed, but the deployed list is not shown close
    # either, so the verdict moves toward today's optimum and says how to decide it
    noisy = _round_noise_calibration([0.8, -0.8, 0.8, -0.8, 0.0])
    g = drift_report(trace, [256], calibration=noisy).time_gain
    assert g.center == pytest.approx(gain.center) and g.half > gain.half
    loud = drift_report(trace, [256], calibration=noisy, threshold_pct=g.center - g.half / 2)
    assert loud.time_gain.low < loud.threshold_pct < loud.time_gain.center
    assert loud.verdict == "re-tune" and "not shown above" in loud.reason and "more rounds" in loud.reason
    # a threshold above the whole interval: keep
    calm = drift_report(trace, [256], calibration=noisy, threshold_pct=g.high + 0.01)
    assert calm.verdict == "keep" and "whole interval is within" in calm.reason
    # no gain shown above a low threshold, and a tolerance that covers the deployed list's
    # upper bound: keep, and it says so; a hair tighter: re-tune
    upper = calm.excess.center + calm.excess.half
    opt_ms = calm.optimum.predicted_ms
    low = max(0.0, g.low)
    wide = drift_report(trace, [256], calibration=noisy, threshold_pct=low, tolerance_pct=100 * upper / opt_ms)
    assert wide.verdict == "keep" and "(the tolerance)" in wide.reason
    assert wide.margin_ms == pytest.approx(upper) and wide.to_dict()["tolerance_pct"] == pytest.approx(100 * upper / opt_ms)
    tight = drift_report(trace, [256], calibration=noisy, threshold_pct=low, tolerance_pct=100 * upper / opt_ms * 0.999)
    assert tight.verdict == "re-tune"
    assert drift_report(trace, [256], calibration=noisy).tolerance_pct == 0.5  # the default, as suggest-buckets'


@pytest.mark.parametrize("above", [True, False])
def test_wider_noise_never_turns_a_re_tune_into_keep(above):
    """The same medians with a growing round-to-round swing: once the verdict is re-tune it
    stays re-tune, whether the threshold is below the predicted gain or above it."""
    from bcgtune.core.plan.drift import drift_report

    trace = _drift_trace()
    base = drift_report(trace, [256], calibration=_round_noise_calibration([0.0] * 5)).time_gain.center
    threshold = base * (0.8 if above else 1.2)
    verdicts = []
    for s in (0.0, 0.05, 0.2, 0.5, 1.0):
        rep = drift_report(
            trace, [256], calibration=_round_noise_calibration(s * np.array([0.8, -0.8, 0.8, -0.8, 0.0])), threshold_pct=threshold
        )
        assert rep.time_gain.center == pytest.approx(base)
        verdicts.append(rep.verdict)
    first = verdicts.index("re-tune")
    assert all(v == "re-tune" for v in verdicts[first:]), verdicts
    assert verdicts[0] == ("re-tune" if above else "keep") and verdicts[-1] == "re-tune"


def test_drift_prices_a_list_as_suggest_buckets_does():
    from bcgtune.core.plan.drift import drift_report

    trace = _drift_trace()
    cal = scaled_calibration("breakable").validate()
    rep = drift_report(trace, [64, 128, 256], calibration=cal)
    plan = bcgtune.suggest_buckets(trace, max_buckets=3, objective="time", calibration=cal, compare={"deployed": [64, 128, 256]})
    row = next(r for r in plan.rows if r.name == "deployed")
    assert rep.deployed.predicted_ms == pytest.approx(row.predicted_ms)
    one_round = load_calibration(str(next(OLD.glob("*format2*"))))
    big = bcgtune.trace_from_sizes([int(one_round.tokens[0])] * 5 + [int(one_round.tokens[-1])] * 5)
    single = drift_report(big, [int(one_round.tokens[-1])], calibration=one_round, threshold_pct=0.0)
    assert single.time_gain is not None and single.time_gain.half is None and "no interval" in single.reason
