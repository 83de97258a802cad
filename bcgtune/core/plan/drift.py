"""Drift: is a deployed bucket list still right for today's traffic?

The deployed list is one comparison row of the plan suggest-buckets makes for today's trace
with as many buckets (core/plan.make_plan: the same launch, alignment, ceiling, DP-attention
steps and time model), and today's optimum is that plan's optimal row. So drift and
suggest-buckets never disagree about a list on the same traffic. The lists are compared by
replay share and padding and, with a calibration, by predicted prefill time. The verdict is
`re-tune` when the optimum is better by more than the threshold, else `keep`.

With a calibration the optimum's gain is paired round by round with its 95% interval: the
verdict is `re-tune` only when the whole interval lies above the threshold, so a gain within
the calibration's noise never asks for a re-tune. A calibration of one round gives no
interval; the verdict then rests on the point estimate and says so."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any

from bcgtune.core.plan.bucket_plan import BucketPlan, PlanRow, make_plan, plan_request
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

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def check_threshold(threshold_pct: float) -> None:
    if not threshold_pct >= 0 or threshold_pct > 100:
        raise InputError(f"must be within 0..100, got {threshold_pct}", field="threshold")


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
) -> DriftReport:
    """`deployed` (as SGLang captures it: aligned to `align`) against today's optimum of as
    many buckets on `trace`, both priced by one plan (see the module docstring)."""
    trace.validate()
    if not deployed:
        raise InputError("the deployed list is empty", field="buckets")
    check_threshold(threshold_pct)
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
    gain = None
    if plan.model is not None and dep.predicted_ms:
        gain = plan.model.gain_pct(dep_row.buckets, opt_row.buckets)
        gains["time_pct"] = gain.center
        basis = "time"
        retune, reason = _time_verdict(gain, threshold_pct)
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
    return DriftReport(dep, opt, threshold_pct, basis, gains, verdict, reason, gain, plan.unit)


def _time_verdict(gain: Interval, threshold_pct: float) -> tuple[bool, str]:
    """Re-tune when the optimum's gain is above the threshold beyond the calibration's noise."""
    said = f"today's optimum predicts {gain.center:.2f}% less prefill time"
    if gain.half is None:
        retune = gain.center > threshold_pct
        where = "above" if retune else "within"
        return retune, f"{said} ({where} the {threshold_pct:g}% threshold; one timed round: no interval)"
    said += f" (95% paired interval {gain.low:.2f}% to {gain.high:.2f}%, {gain.rounds} timed rounds)"
    low = float(gain.low) if gain.low is not None else gain.center
    if low > threshold_pct:
        return True, f"{said}: above the {threshold_pct:g}% threshold"
    if gain.center > threshold_pct:
        return False, f"{said}: not clearly above the {threshold_pct:g}% threshold (within the calibration's noise)"
    return False, f"{said}: within the {threshold_pct:g}% threshold"
