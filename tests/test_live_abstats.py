"""A/A noise and change statistics (bcgtune/core/bench/abstats.py) against hand-computed values."""

import math

import pytest

from bcgtune.core.bench.abstats import aa_noise, change_se, compare_arm, pct_change, verdict


def test_two_base_launches_hand_computed():
    # Base launches at two concurrencies, two runs each.
    # c=4: launch means 100, 104 -> grand 102; in % of grand: 98.0392..., 101.9607...
    #      var(ddof 1) = (d^2)/2 with d = 3.92157 pp -> 7.68935
    # c=16: launch means 200, 198 -> grand 199; %: 100.50251, 99.49749; d = 1.00503 -> 0.50504
    # pooled s2 = (7.68935 + 0.50504) / 2 = 4.09720 pp^2
    base = [{4: [99.0, 101.0], 16: [201.0, 199.0]}, {4: [103.0, 105.0], 16: [197.0, 199.0]}]
    n = aa_noise(base)
    d4 = 100 * (104 - 100) / 102
    d16 = 100 * (198 - 200) / 199
    s2 = (d4**2 / 2 + d16**2 / 2) / 2
    assert n.source == "aa-launches" and n.dof == 2
    assert n.var_pp2 == pytest.approx(s2, rel=1e-12)
    assert n.var_pp2 == pytest.approx(4.0972, abs=1e-4)
    # SE for 2 arm launches vs 2 base launches: sqrt(s2 * (1/2 + 1/2)) = sqrt(s2)
    assert change_se(n, 2, 2) == pytest.approx(math.sqrt(4.0972), abs=1e-4)

    arm = [{4: [110.0, 112.0], 16: [201.0, 201.0]}, {4: [114.0, 116.0], 16: [199.0, 199.0]}]
    cmp = compare_arm("output_throughput", "tuned", arm, "base", base)
    r4, r16 = cmp.rows
    # c=4: arm mean 113, base 102 -> +10.784%; SE 2.0242 -> significant (> 4.048)
    assert r4.change_pct == pytest.approx(100 * (113 - 102) / 102)
    assert r4.se_pp == pytest.approx(2.0242, abs=1e-4)
    assert r4.verdict == "significant"
    # c=16: arm 200 vs base 199 -> +0.5025%: within noise
    assert r16.change_pct == pytest.approx(100 / 199)
    assert r16.verdict == "within noise"
    assert cmp.mean_change_pct == pytest.approx((r4.change_pct + r16.change_pct) / 2)


def test_single_base_launch_falls_back_to_runs():
    # One base launch: runs 98, 102 -> mean 100; % 98, 102; var1 = 8; / 2 runs = 4 pp^2
    n = aa_noise([{8: [98.0, 102.0]}])
    assert n.source == "runs"
    assert n.var_pp2 == pytest.approx(4.0)
    # one run, one launch: nothing to estimate from
    n0 = aa_noise([{8: [100.0]}])
    assert n0.source == "none" and n0.var_pp2 is None
    assert change_se(n0, 1, 1) is None
    assert verdict(5.0, None) == "no noise estimate"


def test_seeds_style_se_three_launch_pairs():
    # 4 base launches: s2 is the ddof-1 variance of launch means in % of their mean.
    base = [{16: [v]} for v in (580.0, 575.0, 585.0, 578.0)]
    n = aa_noise(base)
    means = [580.0, 575.0, 585.0, 578.0]
    g = sum(means) / 4
    pct = [100 * m / g for m in means]
    mu = sum(pct) / 4
    assert n.var_pp2 == pytest.approx(sum((p - mu) ** 2 for p in pct) / 3)
    assert n.dof == 3


def test_pct_change_and_verdict_edges():
    assert pct_change(110, 100) == pytest.approx(10.0)
    assert math.isnan(pct_change(1, 0))
    assert verdict(2.0, 1.0) == "within noise"  # exactly 2 SE is not beyond
    assert verdict(-2.01, 1.0) == "significant"
