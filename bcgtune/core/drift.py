"""Drift: is a deployed bucket list still right for today's traffic? The list is compared with
today's optimum under the same graph budget (as many buckets, the same alignment) on today's
trace, by replay share and padding and, with a calibration, by predicted prefill time. The
verdict is `re-tune` when the optimum is better by more than the threshold, else `keep`."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from bcgtune.core.constants import DEFAULT_THRESHOLD_PCT
from bcgtune.core.ladder import align_buckets
from bcgtune.core.optimizer import optimal_buckets, optimal_buckets_time, predicted_time_ms
from bcgtune.core.plan import resolve_candidates
from bcgtune.core.replay import DEFAULT_PADDING_FACTOR, ListMetrics, evaluate_list
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
    if calibration is not None:
        sol = optimal_buckets_time(s, c, k, calibration, align, None, factor, candidates=candidates)
    else:
        sol = optimal_buckets(s, c, k, align, None, factor)

    def side(label: str, buckets: list[int]) -> DriftSide:
        ms = predicted_time_ms(s, c, buckets, calibration, factor, candidates) if calibration is not None else None
        return DriftSide(label, evaluate_list(s, c, buckets, name=label, factor=factor), ms)

    dep = side(name, captured)
    opt = side(f"today's optimum ({k} buckets)", sol.buckets)
    gains = {
        "replay_pp": opt.metrics.hit_rate_pct - dep.metrics.hit_rate_pct,
        "waste_pp": dep.metrics.waste_pct - opt.metrics.waste_pct,
    }
    if calibration is not None and dep.predicted_ms:
        gains["time_pct"] = 100.0 * (dep.predicted_ms - (opt.predicted_ms or 0.0)) / dep.predicted_ms
        basis = "time"
        retune = gains["time_pct"] > threshold_pct
        reason = (
            f"today's optimum predicts {gains['time_pct']:.2f}% less prefill time "
            f"({'above' if retune else 'within'} the {threshold_pct:g}% threshold)"
        )
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
    return DriftReport(dep, opt, threshold_pct, basis, gains, "re-tune" if retune else "keep", reason)
