"""A/B statistics for interleaved server launches (the method of the Qwen multimodal
breakable-prefill pull request). Pure: no I/O.

Design: arms are launched several times in an interleaved order (A, X, Y, Y, X, A); each
launch measures every concurrency level `runs` times after a warm-up. For one metric:

  launch mean   m[arm][launch][c] = mean over that launch's runs at concurrency c
  arm mean      M[arm][c]         = mean over the arm's launch means
  change        100 * (M[X][c] - M[A][c]) / M[A][c]                    (percent)

Noise comes from baseline-vs-baseline (A/A) launches, as in that pull request: express each base
launch mean in percent of the base arm mean at its concurrency, take the sample variance
over the base launches (ddof 1) and pool it over concurrencies (equal weights, each has
n_A - 1 degrees of freedom):

  s2   = mean_c var_ddof1( 100 * m[A][l][c] / M[A][c] , over l )     (launch-level, pp^2)
  SE   = sqrt( s2 * (1/n_X + 1/n_A) )                                 (pp, for every row)

With two base launches this is s2 = mean_c (d_c^2 / 2), d_c the A/A difference in percent.
A change beyond 2 SE is "significant", otherwise "within noise". With a single base launch
there is no A/A pair: the run-to-run spread inside launches stands in (sample variance of
runs around their launch mean, pooled; divided by the runs per launch), which misses
launch-to-launch noise, so the source is reported as "runs" and should be read as a floor.
The mean change over concurrencies is reported with the same SE (rows of one launch are
correlated, so averaging them is not credited with less noise).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Literal, Mapping, Sequence

SIGNIFICANCE_SE = 2.0
NoiseSource = Literal["aa-launches", "runs", "none"]
Verdict = Literal["significant", "within noise", "no noise estimate"]


def pct_change(x: float, base: float) -> float:
    if base == 0:
        return math.nan
    return 100.0 * (x - base) / base


def _mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs)


def _var1(xs: Sequence[float]) -> float:
    m = _mean(xs)
    return sum((x - m) ** 2 for x in xs) / (len(xs) - 1)


@dataclass
class Noise:
    """Launch-level noise of one metric, in percentage points squared."""

    var_pp2: float | None  # None when it cannot be estimated
    source: NoiseSource
    dof: int

    @property
    def sd_pp(self) -> float | None:
        return None if self.var_pp2 is None else math.sqrt(self.var_pp2)


def aa_noise(base_launches: Sequence[Mapping[int, Sequence[float]]]) -> Noise:
    """Noise from the base arm's launches: each launch maps concurrency -> its runs' values.
    Uses launch means when there are >= 2 base launches, else the runs inside launches."""
    concs = sorted(set().union(*[set(lr) for lr in base_launches])) if base_launches else []
    if len(base_launches) >= 2:
        terms = []
        dof = 0
        for c in concs:
            means = [_mean(lr[c]) for lr in base_launches if c in lr and lr[c]]
            if len(means) < 2:
                continue
            grand = _mean(means)
            if grand == 0:
                continue
            terms.append(_var1([100.0 * m / grand for m in means]))
            dof += len(means) - 1
        if terms:
            return Noise(_mean(terms), "aa-launches", dof)
    terms = []
    dof = 0
    for lr in base_launches:
        for c in concs:
            runs = list(lr.get(c) or [])
            if len(runs) < 2:
                continue
            m = _mean(runs)
            if m == 0:
                continue
            # variance of the launch mean = run variance / runs
            terms.append(_var1([100.0 * r / m for r in runs]) / len(runs))
            dof += len(runs) - 1
    if terms:
        return Noise(_mean(terms), "runs", dof)
    return Noise(None, "none", 0)


def change_se(noise: Noise, n_arm: int, n_base: int) -> float | None:
    if noise.var_pp2 is None or n_arm < 1 or n_base < 1:
        return None
    return math.sqrt(noise.var_pp2 * (1.0 / n_arm + 1.0 / n_base))


def verdict(change: float, se: float | None) -> Verdict:
    if se is None or math.isnan(change):
        return "no noise estimate"
    if se == 0:
        return "significant" if change != 0 else "within noise"
    return "significant" if abs(change) > SIGNIFICANCE_SE * se else "within noise"


@dataclass
class RowStat:
    concurrency: int
    base: float
    arm: float
    change_pct: float
    se_pp: float | None
    verdict: Verdict


@dataclass
class MetricComparison:
    metric: str
    arm: str
    base_arm: str
    n_arm_launches: int
    n_base_launches: int
    noise_source: NoiseSource
    noise_sd_pp: float | None
    se_pp: float | None
    rows: list[RowStat] = field(default_factory=list)
    mean_change_pct: float | None = None
    mean_verdict: Verdict = "no noise estimate"

    def to_dict(self) -> dict:
        return asdict(self)


def launch_means(launches: Sequence[Mapping[int, Sequence[float]]]) -> dict[int, list[float]]:
    out: dict[int, list[float]] = {}
    for lr in launches:
        for c, runs in lr.items():
            if runs:
                out.setdefault(c, []).append(_mean(runs))
    return out


def compare_arm(
    metric: str,
    arm: str,
    arm_launches: Sequence[Mapping[int, Sequence[float]]],
    base_arm: str,
    base_launches: Sequence[Mapping[int, Sequence[float]]],
) -> MetricComparison:
    """Per-concurrency change of `arm` vs `base_arm` with SE from the base's A/A launches."""
    noise = aa_noise(base_launches)
    se = change_se(noise, len(arm_launches), len(base_launches))
    a = launch_means(arm_launches)
    b = launch_means(base_launches)
    rows = []
    for c in sorted(set(a) & set(b)):
        mb, ma = _mean(b[c]), _mean(a[c])
        ch = pct_change(ma, mb)
        rows.append(RowStat(c, mb, ma, ch, se, verdict(ch, se)))
    mean_ch = _mean([r.change_pct for r in rows]) if rows else None
    return MetricComparison(
        metric=metric,
        arm=arm,
        base_arm=base_arm,
        n_arm_launches=len(arm_launches),
        n_base_launches=len(base_launches),
        noise_source=noise.source,
        noise_sd_pp=noise.sd_pp,
        se_pp=se,
        rows=rows,
        mean_change_pct=mean_ch,
        mean_verdict=verdict(mean_ch, se) if mean_ch is not None else "no noise estimate",
    )
