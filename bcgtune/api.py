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
from bcgtune.core.plan import BucketPlan
from bcgtune.core.replay import DEFAULT_PADDING_FACTOR, ListMetrics, evaluate_list, parse_bucket_list
from bcgtune.core.trace import PrefillTrace, load_trace, save_trace
from bcgtune.errors import InputError

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
    from bcgtune.files.workload_file import workload_from_options

    return simulate(workload_from_options(workload=workload, **options))


def suggest_buckets(
    trace: PrefillTrace | None = None,
    *,
    max_buckets: int = 12,
    align: int | None = None,
    max_bucket: int | None = None,
    objective: str = "padding",
    calibration: Calibration | None = None,
    padding_factor: float = DEFAULT_PADDING_FACTOR,
    compare: dict[str, Sequence[int]] | None = None,
    chunked_prefill_size: int | None = None,
    attention_dp_size: int | None = None,
    server_flags: dict[str, Any] | None = None,
    max_graph_mem_gib: float | None = None,
    candidates: str = "auto",
    kmeans: bool = False,
    baselines: bool = True,
    seed: int = 0,
    tolerance_pct: float | None = None,
) -> BucketPlan:
    """The optimal bucket list for `trace` (None: the built-in workload, simulated) and its
    comparison rows (SGLang's default ladder, `compare` lists, the server's captured list,
    quantiles); see BucketPlan. The same decisions as `bcgtune suggest-buckets`: `align` and
    `max_bucket` default to what SGLang captures for the launch (`server_flags`, SGLang's
    launch flags in snake case, e.g. {"tp_size": 8, "enable_dp_attention": True, "dp_size":
    8}; None: the layout the trace records). `attention_dp_size` N is short for a launch with
    N attention-DP ranks ({"tp_size": N, "attn_dp_size": N}): the trace's records are grouped
    into steps across ranks and every list is priced per step (`plan.dp_attention` says how,
    or why it stayed per batch). `tolerance_pct` (time objective): recommend the fewest graphs
    within this % of the best predicted time (None: within the noise of the calibration's
    timed rounds); `plan.optimal` is the exact optimum either way. Raises InputError when the
    launch runs no prefill graphs."""
    from bcgtune.services.suggest import SuggestRequest, suggest

    flags = dict(server_flags) if server_flags else {}
    if attention_dp_size is not None and attention_dp_size > 1:
        flags.setdefault("attn_dp_size", attention_dp_size)
        flags.setdefault("tp_size", attention_dp_size)
    req = SuggestRequest(
        trace=trace,
        max_buckets=max_buckets,
        align=align,
        max_bucket=max_bucket,
        padding_factor=padding_factor,
        objective=objective,
        calibration=calibration,
        max_graph_mem_gib=max_graph_mem_gib,
        candidates=candidates,
        seed=seed,
        compare=[(name, parse_bucket_list(list(lst), name)) for name, lst in (compare or {}).items()],
        chunked_prefill_size=chunked_prefill_size,
        kmeans=kmeans,
        baselines=baselines,
        server_flags=flags or None,
        tolerance_pct=tolerance_pct,
    )
    result = suggest(req)
    if result.plan is None:
        raise InputError(f"prefill graphs are off for this launch: {result.capture.reason}", field="server_flags")
    return result.plan


def evaluate(trace: PrefillTrace, buckets: Sequence[int], *, padding_factor: float = DEFAULT_PADDING_FACTOR) -> ListMetrics:
    """How a bucket list does on a trace under SGLang's replay rule: replay share, eager
    batches, padding."""
    bl = parse_bucket_list(list(buckets), "buckets")
    return evaluate_list(trace.sizes, trace.counts, bl, name="buckets", factor=padding_factor)


def drift(
    trace: PrefillTrace,
    deployed: Sequence[int],
    *,
    align: int | None = None,
    server_flags: dict[str, Any] | None = None,
    calibration: Calibration | None = None,
    threshold_pct: float = DEFAULT_THRESHOLD_PCT,
) -> DriftReport:
    """Is `deployed` still right for `trace`? Compared with the optimum of as many buckets,
    both as SGLang captures them for the launch `server_flags` (snake-case launch flags; None:
    a plain launch), aligned to its capture alignment unless `align` is given."""
    from bcgtune.services.launch import capture_for_flags

    buckets = parse_bucket_list(list(deployed), "deployed")
    if align is None:
        align = capture_for_flags(dict(server_flags or {}), buckets=buckets).alignment
    return drift_report(trace, buckets, align=align, calibration=calibration, threshold_pct=threshold_pct)
