"""The time model's own error (core.plan.model_check): its arithmetic, how every interval and
paired difference widens by it (core.plan.predict), the calibration file that keeps it (format 4,
older formats read as "not checked"), and what suggest-buckets says its intervals rest on."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from cli_helpers import assert_one_line_error, cli
from test_predict import EPS, OLD, scaled_calibration

from bcgtune.core.plan.model_check import ListCheck, ModelCheck, sample_every, trace_sequence
from bcgtune.core.plan.predict import TimeModel
from bcgtune.core.stats import t_quantile_975
from bcgtune.core.trace.mix import BatchMix
from bcgtune.core.trace.prefill_trace import PrefillTrace
from bcgtune.files.calibration_file import load_calibration, save_calibration


def _check(ladder=(1000.0, 980.0, [970.0, 990.0, 980.0]), sparse=(900.0, 895.0, [890.0, 900.0, 895.0])) -> ModelCheck:
    return ModelCheck(
        lists=[ListCheck("SGLang ladder", [64, 128], *ladder), ListCheck("time optimum", [128], *sparse)],
        batches=30,
        of=60,
        every=2,
        rounds=3,
    )


def test_bias_spread_and_margins():
    mc = _check()
    lad, opt = mc.lists
    assert lad.bias == pytest.approx(-0.02) and opt.bias == pytest.approx(895 / 900 - 1)
    se_l = np.std(np.array([970, 990, 980]) / 1000 - 1, ddof=1) / math.sqrt(3)
    assert lad.se == pytest.approx(se_l)
    t = t_quantile_975(2)
    assert mc.total_margin == pytest.approx(max(abs(c.bias) + t * c.se for c in mc.lists))
    assert mc.difference_margin == pytest.approx(abs(lad.bias - opt.bias) + t * math.sqrt(lad.se**2 + opt.se**2))
    assert mc.difference_half(100.0, 90.0) == pytest.approx(mc.total_margin * 10 + mc.difference_margin * 100)
    assert "checked by replay on 30 batches" in mc.summary() and "predicted 1.000 s, measured 0.980 s" in mc.summary()


def test_no_model_error_no_widening_and_one_round_no_interval():
    same = _check(ladder=(1000.0, 1000.0, [1000.0, 1000.0, 1000.0]), sparse=(900.0, 900.0, [900.0, 900.0, 900.0]))
    assert same.total_margin == 0 and same.difference_margin == 0
    one = ModelCheck([ListCheck("a", [1], 10.0, 11.0), ListCheck("b", [], 10.0, 10.0)], 5, 5, 1, 1)
    assert one.lists[0].se is None and one.total_margin == pytest.approx(0.1)


@pytest.mark.parametrize("runner", ["breakable", "full"])
def test_intervals_widen_by_the_stated_formula(runner):
    """The noise half-width as before, plus u_total x the total; a difference adds
    u_total |d| + u_diff max(T_A, T_B): the formula core.plan.predict states."""
    cal = scaled_calibration(runner).validate()
    mix = BatchMix.from_batches([40, 100, 100, 100, 200, 200], [1, 1, 3, 3, 2, 2])
    sizes, counts = mix.histogram()
    m = mix if runner == "breakable" else None
    plain = TimeModel(sizes, counts, cal, mix=m)
    before_model = TimeModel(sizes, counts, scaled_calibration(runner).validate(), mix=m)
    a, b = [128, 256], []
    before = {tuple(bl): plain.total(bl) for bl in ([], [128, 256])}
    d0, g0 = plain.difference(a, b), plain.gain_pct(a, b)
    cal.model_check = _check()
    checked = TimeModel(sizes, counts, cal, mix=m)
    mc = cal.model_check
    k = t_quantile_975(len(EPS) - 1) * np.std(EPS, ddof=1) / math.sqrt(len(EPS))
    for bl in ([], [128, 256]):
        p, w = before[tuple(bl)], checked.total(bl)
        assert w.center == p.center and p.model_half is None
        assert w.half == pytest.approx(k * p.center + mc.total_margin * p.center) and w.model_half == pytest.approx(
            mc.total_margin * p.center
        )
        assert w.contains(p.center * (1 + mc.total_margin) + 0.99 * p.half)
    ta, tb = before[tuple(a)].center, before[tuple(b)].center
    d1 = checked.difference(a, b)
    assert d1.center == d0.center
    # P: each list's time over the batches the two run differently (here: those [128, 256] replays)
    ca, cb = checked._unit_costs[(128, 256)], checked._unit_costs[()]
    dif = ca != cb
    pa, pb = float(checked.weights[dif] @ ca[dif]), float(checked.weights[dif] @ cb[dif])
    assert dif.any() and pa <= ta and pb <= tb
    assert d1.half == pytest.approx(d0.half + mc.total_margin * abs(ta - tb) + mc.difference_margin * max(pa, pb))
    # two lists that run most batches the same way: only the batches they run differently count
    c, e = [64, 128, 256], [64, 256]
    same, dd = before_model.difference(c, e), checked.difference(c, e)
    costs_c, costs_e = checked._unit_costs[(64, 128, 256)], checked._unit_costs[(64, 256)]
    differ = costs_c != costs_e
    assert differ.any() and not differ.all()
    w = checked.weights
    pc, pe = float(w[differ] @ costs_c[differ]), float(w[differ] @ costs_e[differ])
    tc, te = before_model.totals(c)[0], before_model.totals(e)[0]
    assert dd.half == pytest.approx(same.half + mc.total_margin * abs(tc - te) + mc.difference_margin * max(pc, pe))
    assert max(pc, pe) < max(tc, te)
    g1 = checked.gain_pct(a, b)
    assert g1.half == pytest.approx(g0.half + 100 * mc.difference_half(ta, tb, pa, pb) / ta)


def test_format4_keeps_the_check_and_older_files_say_not_checked(tmp_path):
    cal = scaled_calibration().validate()
    cal.model_check = _check()
    p = tmp_path / "c.json"
    save_calibration(cal, p)
    doc = json.loads(p.read_text())
    assert doc["format_version"] == 4 and doc["model_check"]["lists"][0]["name"] == "SGLang ladder"
    back = load_calibration(p)
    assert back.model_check == cal.model_check
    # a format-3 document: no check, read as not checked; a check inside it is refused
    doc3 = dict(doc, format_version=3, model_check=None)
    (tmp_path / "c3.json").write_text(json.dumps(doc3))
    assert load_calibration(tmp_path / "c3.json").model_check is None
    (tmp_path / "bad.json").write_text(json.dumps(dict(doc, format_version=3)))
    with pytest.raises(Exception, match="format-4"):
        load_calibration(tmp_path / "bad.json")
    one = dict(doc)
    one["model_check"] = dict(doc["model_check"], lists=doc["model_check"]["lists"][:1])
    (tmp_path / "one.json").write_text(json.dumps(one))
    (tmp_path / "t.csv").write_text("size,count\n40,3\n100,5\n")
    r = cli(["suggest-buckets", tmp_path / "t.csv", "--objective", "time", "--calibration", tmp_path / "one.json"])
    assert r.code == 2 and "model_check" in r.err
    assert_one_line_error(r)


def test_suggest_says_what_the_intervals_rest_on(tmp_path):
    trace = tmp_path / "t.csv"
    trace.write_text("size,count\n40,3\n100,5\n200,2\n")
    cal = scaled_calibration().validate()
    cal.model_check = _check()
    save_calibration(cal, tmp_path / "checked.json")
    r = cli(["suggest-buckets", trace, "--objective", "time", "--calibration", tmp_path / "checked.json"])
    assert r.code == 0, r.err
    assert "the intervals include the time model's error, checked by replay on 30 batches" in r.out
    assert "SGLang ladder predicted 1.000 s, measured 0.980 s" in r.out
    r = cli(["suggest-buckets", trace, "--objective", "time", "--calibration", tmp_path / "checked.json", "--json"])
    mc = json.loads(r.out)["model_check"]
    assert mc["checked"] and mc["batches"] == 30
    # an older calibration: the intervals do not cover the model's error, and the plan says why
    cal.model_check = None
    save_calibration(cal, tmp_path / "plain.json")
    r = cli(["suggest-buckets", trace, "--objective", "time", "--calibration", tmp_path / "plain.json", "--json"])
    assert json.loads(r.out)["model_check"]["checked"] is False
    r = cli(
        ["suggest-buckets", trace, "--objective", "time", "--calibration", OLD / "format2_breakable_grid128_qwen3-8b_h200.json"]
    )
    assert "model error not checked: a calibration written before format 4" in r.out.replace("\n  ", " ")


def test_trace_order_and_sampling():
    t = PrefillTrace.from_batches({"forward_tokens": [30, 10, 20, 10], "new_seq": [2, 1, -1, 1]})
    tok, req, ordered = trace_sequence(t)
    assert ordered and tok.tolist() == [30, 10, 20, 10] and req.tolist() == [2, 1, 1, 1]
    h = PrefillTrace(sizes=np.array([10, 20]), counts=np.array([2, 1]))
    tok, req, ordered = trace_sequence(h, seed=1)
    assert not ordered and sorted(tok.tolist()) == [10, 10, 20]
    assert sample_every(1275, 200) == 7 and sample_every(10, 200) == 1


def test_model_check_needs_a_trace(tmp_path):
    r = cli(["calibrate", "--model", "tiny", "--sizes", "16,32", "--check-batches", "5", "-o", tmp_path / "c.json"])
    assert r.code == 2 and "--sizes-from" in r.err
    assert_one_line_error(r)


def test_eager_and_graph_lists_err_apart():
    # eager (no graphs) launch-bound on the host: -20% with a wide spread, where the graph
    # lists err by 1-2%; each kind takes its own margin, a difference across kinds the pair's
    graph = _check()
    eager = ListCheck("eager", [], 2000.0, 1600.0, [1500.0, 1700.0, 1600.0])
    mc = ModelCheck(lists=[*graph.lists, eager], batches=30, of=60, every=2, rounds=3)
    t = t_quantile_975(2)
    assert mc.total_margin == pytest.approx(graph.total_margin)  # eager does not widen the graph lists
    assert mc.difference_margin == pytest.approx(graph.difference_margin)
    assert mc.total_margin_for(True) == pytest.approx(abs(eager.bias) + t * eager.se)
    lad = graph.lists[0]
    across = max(abs(c.bias - eager.bias) + t * math.sqrt(c.se**2 + eager.se**2) for c in graph.lists)
    assert mc.difference_margin_for(True, False) == pytest.approx(across)
    assert mc.difference_half(100.0, 90.0, a_eager=True) == pytest.approx(mc.total_margin_for(True) * 10 + across * 100)
    assert mc.to_json()["eager_margin"] == pytest.approx(mc.total_margin_for(True))
    # a check without eager: eager takes the largest margin of every list, as before
    assert graph.total_margin_for(True) == pytest.approx(max(abs(c.bias) + t * c.se for c in graph.lists))
    assert graph.to_json()["eager_margin"] is None
    # the model prices each list with its own kind's margin
    assert lad.bias != eager.bias


def test_the_time_model_widens_eager_by_its_own_kind():
    from test_predict import scaled_calibration as cal_of

    cal = cal_of("breakable").validate()
    mix = BatchMix.from_batches([40, 100, 100, 100, 200, 200], [1, 1, 3, 3, 2, 2])
    sizes, counts = mix.histogram()
    graph = _check()
    plain = TimeModel(sizes, counts, cal, mix=mix)
    t_e, t_g = plain.total([]), plain.total([128, 256])  # before the check: the model reads it when pricing
    cal.model_check = ModelCheck(
        lists=[*graph.lists, ListCheck("eager", [], 2000.0, 1600.0, [1500.0, 1700.0, 1600.0])],
        batches=30, of=60, every=2, rounds=3,
    )  # fmt: skip
    checked = TimeModel(sizes, counts, cal, mix=mix)
    assert checked.total([]).half == pytest.approx(t_e.half + cal.model_check.total_margin_for(True) * t_e.center)
    assert checked.total([128, 256]).half == pytest.approx(t_g.half + cal.model_check.total_margin * t_g.center)


def test_one_graph_list_beside_eager_still_bounds_a_difference_between_graph_lists():
    # the check replays SGLang's ladder and eager (the optimum was the ladder): no two lists
    # with graphs were measured, so their difference takes the one measured pair's margin
    lad = ListCheck("SGLang ladder", [64, 128], 1000.0, 980.0, [970.0, 990.0, 980.0])
    eager = ListCheck("eager", [], 2000.0, 1900.0, [1890.0, 1910.0, 1900.0])
    mc = ModelCheck(lists=[lad, eager], batches=30, of=60, every=2, rounds=3)
    t = t_quantile_975(2)
    pair = abs(lad.bias - eager.bias) + t * math.sqrt(lad.se**2 + eager.se**2)
    assert mc.difference_margin == pytest.approx(pair) and mc.difference_margin > 0
    assert mc.total_margin == pytest.approx(abs(lad.bias) + t * lad.se)
