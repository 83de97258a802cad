"""bcgtune as a library: the trace, the optimizer and the evaluation as typed functions. The
command line is built on these; each raises bcgtune.errors.InputError (bad input, naming
the field or file) rather than printing.

    import bcgtune
    trace = bcgtune.trace_from_logs(["server.log"])        # or load_trace / simulate_workload
    plan = bcgtune.suggest_buckets(trace, max_buckets=8, align=64)
    print(plan.recommended.buckets, plan.recommended.metrics.hit_rate_pct)
    print(bcgtune.evaluate(trace, [256, 512, 1024]).waste_pct)
"""

from __future__ import annotations

from typing import Any, Sequence

from bcgtune.core.calibration import Calibration, load_calibration
from bcgtune.core.drift import DEFAULT_THRESHOLD_PCT, DriftReport, drift_report
from bcgtune.core.plan import BucketPlan, make_plan, plan_request
from bcgtune.core.replay import DEFAULT_PADDING_FACTOR, ListMetrics, evaluate_list, parse_bucket_list
from bcgtune.core.trace import PrefillTrace, load_trace, save_trace

__all__ = [
    "PrefillTrace",
    "BucketPlan",
    "ListMetrics",
    "DriftReport",
    "Calibration",
    "load_trace",
    "save_trace",
    "trace_from_logs",
    "trace_from_sizes",
    "simulate_workload",
    "suggest_buckets",
    "evaluate",
    "drift",
    "load_calibration",
]


def trace_from_logs(paths: Sequence[str], *, mixed_chunk: bool = False) -> PrefillTrace:
    """A trace from SGLang server logs (one per rank or replica; .gz and '-' work)."""
    from bcgtune.adapters.sglang_log import parse_logs

    return parse_logs(list(paths), mixed_chunk=mixed_chunk)


def trace_from_sizes(sizes: Sequence[int]) -> PrefillTrace:
    """A trace from per-batch forward sizes (token counts, one per prefill batch)."""
    from bcgtune.core.schema import Tokens, validate

    values = validate(list[Tokens], list(sizes), "sizes")
    return PrefillTrace.from_sizes(values, origin="sizes").validate("sizes")


def simulate_workload(workload: str = "mi355x-multimodal-pr", **options: Any) -> PrefillTrace:
    """Simulate a bench_serving run against SGLang's scheduler: a workload TOML or preset,
    with bench_serving / SGLang options (snake_case names, e.g. num_prompts="40,160")."""
    from bcgtune.adapters.simulator import simulate
    from bcgtune.adapters.workload import workload_from_options

    return simulate(workload_from_options(workload=workload, **options))


def suggest_buckets(
    trace: PrefillTrace,
    *,
    max_buckets: int = 12,
    align: int = 1,
    max_bucket: int | None = None,
    objective: str = "padding",
    calibration: Calibration | None = None,
    padding_factor: float = DEFAULT_PADDING_FACTOR,
    compare: dict[str, Sequence[int]] | None = None,
    chunked_prefill_size: int | None = None,
    attention_dp_size: int = 1,
    **more: Any,
) -> BucketPlan:
    """The optimal bucket list for `trace` and its comparison rows (SGLang's default ladder,
    `compare` lists, the server's captured list, quantiles); see BucketPlan. With
    `attention_dp_size` > 1 (a DP-attention server with that many attention-DP ranks), the
    trace's records are grouped into steps across ranks and every list is priced per step
    (`plan.dp_attention` says how, or why it stayed per batch). `more`: the other
    PlanRequest fields (max_graph_mem_gib, candidates, kmeans, quantiles, layout_align, seed)."""
    req = plan_request(
        max_buckets=max_buckets,
        align=align,
        max_bucket=max_bucket,
        objective=objective,
        calibration=calibration,
        padding_factor=padding_factor,
        chunked_prefill_size=chunked_prefill_size,
        attention_dp_size=attention_dp_size,
        compare=[(name, parse_bucket_list(list(lst), name)) for name, lst in (compare or {}).items()],
        **more,
    )
    return make_plan(trace, req)


def evaluate(trace: PrefillTrace, buckets: Sequence[int], *, padding_factor: float = DEFAULT_PADDING_FACTOR) -> ListMetrics:
    """How a bucket list does on a trace under SGLang's replay rule: replay share, eager
    batches, padding."""
    bl = parse_bucket_list(list(buckets), "buckets")
    return evaluate_list(trace.sizes, trace.counts, bl, name="buckets", factor=padding_factor)


def drift(
    trace: PrefillTrace,
    deployed: Sequence[int],
    *,
    align: int = 1,
    calibration: Calibration | None = None,
    threshold_pct: float = DEFAULT_THRESHOLD_PCT,
) -> DriftReport:
    """Is `deployed` still right for `trace`? Compared with the optimum of as many buckets."""
    return drift_report(
        trace, parse_bucket_list(list(deployed), "deployed"), align=align, calibration=calibration, threshold_pct=threshold_pct
    )
