"""Drift: is a deployed bucket list still right for today's traffic?

The deployed list is one comparison row of the plan suggest-buckets makes for today's trace
with as many buckets (core/plan.make_plan: the same launch, alignment, ceiling, DP-attention
steps and time model), and today's optimum is that plan's optimal row. So drift and
suggest-buckets never disagree about a list on the same traffic. The lists are compared by
replay share and padding and, with a calibration, by predicted prefill time. The verdict is
`re-tune` when the optimum is better by more than the threshold, else `keep`.

With a calibration the two lists are paired round by round, with 95% intervals, and the
verdict uses the rule suggest-buckets recommends by (bcgtune.core.plan.recommend): a list slower
than the best stands for it only when it is shown close, never because the noise is wide.
`keep` when the deployed list is shown close: the upper end of the paired interval of (its
time - the optimum's) is within `tolerance_pct` % of the optimum's predicted time, or the
upper end of the optimum's gain is at most the threshold. Otherwise `re-tune`: a gain is
claimed ("above the threshold") only when the whole interval of the gain lies above the
threshold; when the interval straddles it, the verdict says that the noise leaves room for
a gain above the threshold, that today's optimum is predicted no slower, and that more
calibration rounds decide it. So wider noise can only move the verdict toward today's
optimum. A calibration of one round gives no interval; the verdict then rests on the point
estimates and says so."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any

from bcgtune.core.plan.bucket_plan import make_plan
from bcgtune.core.plan.plan_types import BucketPlan, PlanRow, RecommendRule, plan_request
from bcgtune.core.plan.recommend import recommend_rule
from bcgtune.core.sglang.constants import DEFAULT_THRESHOLD_PCT
from bcgtune.core.sglang.ladder import align_buckets
from bcgtune.core.sglang.replay import DEFAULT_PADDING_FACTOR, ListMetrics
from bcgtune.core.stats import Interval
from bcgtune.core.trace.prefill_trace import PrefillTrace
from bcgtune.errors import InputError


@dataclass
class DriftSide:
    name: str
    metrics: ListMetrics
    predicted_ms: float | None


@dataclass
class DriftReport:
    deployed: DriftSide
    optimum: DriftSide
    threshold_pct: float
    basis: str  # "time" (with a calibration) or "replay and padding"
    gains: dict[str, float]  # what the optimum gains, per measure, in % or percentage points
    verdict: str  # keep | re-tune
    reason: str
    time_gain: Interval | None = None  # the optimum's gain in % of the deployed list's time, paired interval
    unit: str = "batch"  # what the metrics count: "step" under DP attention with grouped steps
    # with a calibration: the margin (suggest-buckets' --tolerance) and the deployed list's
    # time minus the optimum's (ms, paired interval)
    tolerance_pct: float | None = None
    margin_ms: float | None = None
    excess: Interval | None = None
    tuned: dict[str, Any] | None = None  # the profile's [tuned] record: what bcgtune tune measured for the list

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def check_threshold(threshold_pct: float) -> None:
    if not threshold_pct >= 0 or threshold_pct > 100:
        raise InputError(f"must be within 0..100, got {threshold_pct}", field="threshold")


def check_tolerance(tolerance_pct: float | None, calibration: object = None) -> None:
    """A margin in % (0..100), given only with a calibration: a verdict by padding has none."""
    if tolerance_pct is not None and not (0 <= tolerance_pct <= 100):  # NaN fails both
        raise InputError(f"must be a percentage within 0..100, got {tolerance_pct}", field="tolerance")
    if tolerance_pct is not None and calibration is None:
        raise InputError("applies to a verdict by time only (with --calibration FILE)", field="tolerance")


def drift_report(
    trace: PrefillTrace,
    deployed: list[int],
    *,
    name: str = "deployed list",
    align: int = 1,
    calibration=None,
    threshold_pct: float = DEFAULT_THRESHOLD_PCT,
    factor: float = DEFAULT_PADDING_FACTOR,
    attention_dp_size: int = 1,
    max_bucket: int | None = None,
    tolerance_pct: float | None = None,
) -> DriftReport:
    """`deployed` (as SGLang captures it: aligned to `align`) against today's optimum of as
    many buckets on `trace`, both priced by one plan (see the module docstring).
    `tolerance_pct` None: the default margin (core.sglang.constants.DEFAULT_TOLERANCE_PCT)."""
    trace.validate()
    if not deployed:
        raise InputError("the deployed list is empty", field="buckets")
    check_threshold(threshold_pct)
    check_tolerance(tolerance_pct, calibration)
    captured = align_buckets(deployed, align)
    req = plan_request(
        max_buckets=len(captured),
        align=align,
        layout_align=align,
        max_bucket=max_bucket,
        padding_factor=factor,
        objective="padding" if calibration is None else "time",
        calibration=calibration,
        compare=[(name, captured)],
        quantiles=False,
        attention_dp_size=attention_dp_size,
        tolerance_pct=tolerance_pct,
    )
    return drift_from_plan(make_plan(trace, req), name, threshold_pct)


def drift_from_plan(plan: BucketPlan, name: str, threshold_pct: float) -> DriftReport:
    """The row `name` of `plan` (the deployed list, a comparison row) against the plan's
    optimum (at most as many buckets as the deployed list holds)."""
    check_threshold(threshold_pct)
    dep_row = next((r for r in plan.rows if r.kind == "compare" and r.name == name), None)
    if dep_row is None:
        raise InputError(f"the plan has no row {name!r} to judge", field="buckets")
    opt_row: PlanRow = plan.optimal or plan.rows[0]
    label = f"today's optimum ({len(dep_row.buckets)} buckets)"
    dep = DriftSide(name, replace(dep_row.metrics, name=name), dep_row.predicted_ms)
    opt = DriftSide(label, replace(opt_row.metrics, name=label), opt_row.predicted_ms)
    gains = {
        "replay_pp": opt.metrics.hit_rate_pct - dep.metrics.hit_rate_pct,
        "waste_pp": dep.metrics.waste_pct - opt.metrics.waste_pct,
    }
    gain = excess = rule = None
    if plan.model is not None and dep.predicted_ms:
        gain = plan.model.gain_pct(dep_row.buckets, opt_row.buckets)
        excess = plan.model.difference(dep_row.buckets, opt_row.buckets)
        rule = recommend_rule(plan.request.tolerance_pct, float(opt_row.predicted_ms or 0.0), plan.model.rounds)
        gains["time_pct"] = gain.center
        basis = "time"
        retune, reason = _time_verdict(gain, excess, threshold_pct, rule)
    else:
        basis = "replay and padding"
        worst = max(gains["replay_pp"], gains["waste_pp"])
        retune = worst > threshold_pct
        waste = gains["waste_pp"]
        unit = "steps" if plan.unit == "step" else "batches"
        reason = (
            f"today's optimum replays {gains['replay_pp']:+.2f} points of {unit} and wastes "
            f"{abs(waste):.2f} points {'less' if waste >= 0 else 'more'} padding ({'above' if retune else 'within'} the "
            f"{threshold_pct:g}-point threshold)"
        )
    verdict = "re-tune" if retune else "keep"
    return DriftReport(
        dep,
        opt,
        threshold_pct,
        basis,
        gains,
        verdict,
        reason,
        gain,
        plan.unit,
        tolerance_pct=None if rule is None else rule.tolerance_pct,
        margin_ms=None if rule is None else rule.margin_ms,
        excess=excess,
    )


def _time_verdict(gain: Interval, excess: Interval, threshold_pct: float, rule: RecommendRule) -> tuple[bool, str]:
    """Keep when the deployed list is shown close to today's optimum (within the tolerance,
    or a gain at most the threshold, by the upper ends of the paired intervals); else
    re-tune, claiming a gain only when the whole interval lies above the threshold."""
    said = f"today's optimum predicts {gain.center:.2f}% less prefill time"
    within = rule.within_of("it") + " (the tolerance)"
    if gain.half is None:
        if rule.bound == "predicted" and rule.admits(excess):
            return False, f"{said}: the deployed list is predicted {within} (one timed round: no interval)"
        retune = gain.center > threshold_pct
        where = "above" if retune else "within"
        return retune, f"{said} ({where} the {threshold_pct:g}% threshold; one timed round: no interval)"
    said += f" (95% paired interval {gain.low:.2f}% to {gain.high:.2f}%, {gain.rounds} timed rounds)"
    low = float(gain.low) if gain.low is not None else gain.center
    high = float(gain.high) if gain.high is not None else gain.center
    upper = excess.center + (excess.half or 0.0)
    if low > threshold_pct:
        return True, f"{said}: above the {threshold_pct:g}% threshold"
    if gain.center <= 0:
        return False, f"{said}: today's optimum is not predicted faster than the deployed list"
    if rule.admits(excess):
        return False, f"{said}: the deployed list is {within} (paired 95% upper bound {upper:+,.1f} ms)"
    if high <= threshold_pct:
        return False, f"{said}: the whole interval is within the {threshold_pct:g}% threshold"
    return True, (
        f"{said}: not shown above the {threshold_pct:g}% threshold, but the calibration's noise leaves room for a gain "
        f"above it, and the deployed list is not shown {within} (paired 95% upper bound {upper:+,.1f} ms); today's "
        "optimum is predicted no slower. Calibrate with more rounds to decide it"
    )
