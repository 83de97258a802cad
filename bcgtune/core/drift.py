"""Drift: is a deployed bucket list still right for today's traffic? The list is compared with
today's optimum under the same graph budget (as many buckets, the same alignment) on today's
trace, by replay share and padding and, with a calibration, by predicted prefill time. The
verdict is `re-tune` when the optimum is better by more than the threshold, else `keep`.

With a calibration both lists are priced as suggest-buckets prices them (the trace's request
mix, core/predict.TimeModel), and the optimum's gain is paired round by round with its 95%
interval: the verdict is `re-tune` only when the whole interval lies above the threshold, so a
gain within the calibration's noise never asks for a re-tune. A calibration of one round gives
no interval; the verdict then rests on the point estimate and says so."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from bcgtune.core.constants import DEFAULT_THRESHOLD_PCT
from bcgtune.core.ladder import align_buckets
from bcgtune.core.optimizer import optimal_buckets, optimal_buckets_time
from bcgtune.core.plan import resolve_candidates
from bcgtune.core.replay import DEFAULT_PADDING_FACTOR, ListMetrics, evaluate_list
from bcgtune.core.stats import Interval
from bcgtune.core.trace import PrefillTrace
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

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def drift_report(
    trace: PrefillTrace,
    deployed: list[int],
    *,
    name: str = "deployed list",
    align: int = 1,
    calibration=None,
    threshold_pct: float = DEFAULT_THRESHOLD_PCT,
    factor: float = DEFAULT_PADDING_FACTOR,
) -> DriftReport:
    trace.validate()
    if not deployed:
        raise InputError("the deployed list is empty", field="buckets")
    if not threshold_pct >= 0 or threshold_pct > 100:
        raise InputError(f"must be within 0..100, got {threshold_pct}", field="threshold")
    s, c = trace.sizes, trace.counts
    captured = align_buckets(deployed, align)
    k = len(captured)
    candidates = resolve_candidates("auto", calibration) if calibration is not None else "trace"
    model = None
    if calibration is not None:
        from bcgtune.core.mix import batch_mix
        from bcgtune.core.predict import TimeModel

        mix = batch_mix(trace)
        sol = optimal_buckets_time(s, c, k, calibration, align, None, factor, candidates=candidates, mix=mix)
        model = TimeModel(s, c, calibration, factor, candidates, mix=mix)
    else:
        sol = optimal_buckets(s, c, k, align, None, factor)

    def side(label: str, buckets: list[int]) -> DriftSide:
        ms = model.total(buckets).center if model is not None else None
        return DriftSide(label, evaluate_list(s, c, buckets, name=label, factor=factor), ms)

    dep = side(name, captured)
    opt = side(f"today's optimum ({k} buckets)", sol.buckets)
    gains = {
        "replay_pp": opt.metrics.hit_rate_pct - dep.metrics.hit_rate_pct,
        "waste_pp": dep.metrics.waste_pct - opt.metrics.waste_pct,
    }
    gain = None
    if model is not None and dep.predicted_ms:
        gain = model.gain_pct(captured, sol.buckets)
        gains["time_pct"] = gain.center
        basis = "time"
        retune, reason = _time_verdict(gain, threshold_pct)
    else:
        basis = "replay and padding"
        worst = max(gains["replay_pp"], gains["waste_pp"])
        retune = worst > threshold_pct
        waste = gains["waste_pp"]
        reason = (
            f"today's optimum replays {gains['replay_pp']:+.2f} points of batches and wastes "
            f"{abs(waste):.2f} points {'less' if waste >= 0 else 'more'} padding ({'above' if retune else 'within'} the "
            f"{threshold_pct:g}-point threshold)"
        )
    return DriftReport(dep, opt, threshold_pct, basis, gains, "re-tune" if retune else "keep", reason, gain)


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
