"""drift: is a profile's bucket list still right for today's traffic?

`drift_for_profile` decides what the profile's launch captures (services/launch.py) and
compares that list with today's optimum under the same graph budget (bcgtune.core.drift)."""

from __future__ import annotations

from bcgtune.core.calibration import Calibration
from bcgtune.core.drift import DEFAULT_THRESHOLD_PCT, DriftReport, drift_report
from bcgtune.core.plan import assumed_chunked_prefill_size
from bcgtune.core.trace import PrefillTrace
from bcgtune.errors import InputError


def load_traffic(logs: list[str] | None, trace_path: str | None) -> PrefillTrace:
    """Today's traffic: server logs or a trace file (exactly one of them)."""
    if logs and not trace_path:
        from bcgtune.adapters.sglang_log import parse_logs

        return parse_logs(list(logs))
    if trace_path and not logs:
        from bcgtune.core.trace import load_trace

        return load_trace(trace_path)
    raise InputError("give today's traffic as --log FILE... or --trace FILE")


def drift_for_profile(
    profile, trace: PrefillTrace, *, calibration: Calibration | None = None, threshold_pct: float = DEFAULT_THRESHOLD_PCT
) -> DriftReport:
    """The profile's captured list (its [buckets], or SGLang's default ladder for its
    launch) against today's optimum of as many buckets on `trace`."""
    from bcgtune.adapters.hardware import gpu_for
    from bcgtune.services.launch import capture_for_flags

    server = dict(profile.server)
    gpu = gpu_for(profile.hardware)
    if "chunked_prefill_size" not in server and (trace.chunked_prefill_size() or gpu is None):
        server["chunked_prefill_size"] = assumed_chunked_prefill_size(trace, None)
    capture = capture_for_flags(
        server,
        platform=profile.platform,
        buckets=profile.buckets,
        model_path=profile.model or "",
        gpu_memory_gib=gpu.memory_gib if gpu is not None else None,
    )
    if not capture.graphs_on:
        raise InputError(f"the profile runs no prefill graphs: {capture.reason}", profile.where)
    what = "list" if profile.buckets else "SGLang default ladder (no list)"
    return drift_report(
        trace,
        list(capture.captured),
        name=f"profile {profile.name}'s {what}",
        align=capture.alignment,
        calibration=calibration,
        threshold_pct=threshold_pct,
    )
