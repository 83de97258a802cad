"""BucketPlan: the optimal list for a trace, compared with the alternatives a user has.

Pure: takes a PrefillTrace and a PlanRequest, returns typed data; rendering lives in
bcgtune/cli/render/plan.py. Every row of the comparison is priced by the same model (the
padding metrics, and with a calibration the same predicted-time model). The optimal row is
exact within its constraints (at most K buckets, multiples of the alignment, none above the
maximum, measured sizes only when the candidates are a calibration's rows, the memory
budget): a row that beats it on its own objective must break one of them, and the plan
says which (`Restriction`).

With a calibration every row carries its predicted time with a 95% interval from the
calibration's timed rounds, and its paired difference from the recommended row
(bcgtune.core.plan.predict says how both are computed and what they cover). The recommended row
of the time objective is the fewest graphs whose time is shown within a margin of the best:
the upper end of the 95% paired interval of the difference is at most `tolerance_pct` % of
the best's predicted time (default 0.5%; bcgtune.core.plan.recommend states the rule, and wider
noise can only move it toward the best); among lists of that many graphs, the least capture
time, then the least graph memory. The exact optimum stays in the table.
When the optimum may pick only measured sizes, a second search also prices the sizes the
trace wants that the calibration did not measure (by interpolation); when it finds a faster
list, the plan names those sizes, and `bcgtune calibrate --extend` measures them.

Baseline rows are what SGLang would capture: its default ladder and the lists given to
compare, each rounded up to the layout's capture alignment as SGLang does (the row says
so when that changed the list), not to the optimizer's `align`.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np

from bcgtune.core.plan.dp_steps import (
    DPSteps,
    StepOptimum,
    min_buckets_all_steps,
    optimal_step_buckets,
    optimal_step_buckets_time,
)
from bcgtune.core.plan.optimizer import (
    _DENSE_MAX_CANDIDATES,
    candidate_rows,
    explore_candidates,
    min_buckets_full_replay,
    optimal_buckets,
    optimal_buckets_time,
)
from bcgtune.core.plan.plan_types import (
    BucketPlan,
    CurvePoint,
    DPAttentionInfo,
    PlanRequest,
    PlanRow,
    Restriction,
    TraceInfo,
    count_text,
)
from bcgtune.core.plan.pricer import Pricer
from bcgtune.core.plan.recommend import price_with_intervals
from bcgtune.core.plan.step_grouping import StepGrouping, group_steps
from bcgtune.core.sglang.ladder import ceil_to, default_chunked_prefill_size, sglang_default_ladder
from bcgtune.core.sglang.replay import evaluate_list
from bcgtune.core.stats import nearest_rank
from bcgtune.core.trace.mix import BatchMix, batch_mix
from bcgtune.core.trace.prefill_trace import PrefillTrace
from bcgtune.errors import InputError

# The hand-tuned MI355X list from the Qwen multimodal breakable-prefill pull request: it
# matched the +21% throughput of SGLang's 74-graph default ladder with 11 graphs.
MI355X_PR_HAND_LIST = [256, 512, 768, 1024, 1280, 1408, 2560, 2752, 3840, 4096, 5376]
MI355X_PR_HAND_LIST_NAME = "hand-tuned MI355X list (Qwen multimodal PR)"


def assumed_chunked_prefill_size(trace: PrefillTrace, chunked_prefill_size: int | None) -> int:
    """The traced server's chunked_prefill_size: as given, else as the trace knows it (log
    startup line, simulated workload), else the smallest of SGLang's memory-based defaults
    that covers the trace's largest batch."""
    if chunked_prefill_size:
        return int(chunked_prefill_size)
    known = trace.chunked_prefill_size()
    if known:
        return known
    biggest = int(trace.sizes[-1])
    for cps in (default_chunked_prefill_size(g) for g in (16, 40, 100, 200)):
        if cps >= biggest:
            return cps
    return biggest


def kmeans_buckets(sizes, counts, k: int, align: int, max_bucket: int | None, seed: int = 0) -> list[int]:
    """scikit-learn KMeans on the weighted sizes; bucket = cluster max rounded up to align.
    scikit-learn is imported here only: it takes seconds to import."""
    from sklearn.cluster import KMeans

    x = np.asarray(sizes, dtype=np.float64).reshape(-1, 1)
    k = max(1, min(k, len(x)))
    km = KMeans(n_clusters=k, n_init=3, random_state=seed).fit(x, sample_weight=np.asarray(counts, float))
    tops = [int(np.asarray(sizes)[km.labels_ == c].max()) for c in range(k) if (km.labels_ == c).any()]
    return _aligned_capped(tops, align, max_bucket)


def quantile_buckets(sizes, counts, k: int, align: int, max_bucket: int | None) -> list[int]:
    """Buckets at the weighted quantiles i/k (i = 1..k) of the batch sizes."""
    tops = [int(nearest_rank(sizes, counts, Fraction(100 * i, k), presorted=True)) for i in range(1, k + 1)]
    return _aligned_capped(tops, align, max_bucket)


def _aligned_capped(tops, align, max_bucket):
    out = set()
    for t in tops:
        b = ceil_to(int(t), align)
        if max_bucket is not None and b > max_bucket:
            b = (max_bucket // align) * align
        if b > 0:
            out.add(b)
    return sorted(out)


def resolve_candidates(candidates: str, calibration) -> str:
    if candidates == "auto":
        grid = (getattr(calibration, "meta", None) or {}).get("bucket_grid") if calibration is not None else None
        return "calibration" if grid else "trace"
    if candidates == "calibration" and calibration is None:
        raise InputError("candidates from a calibration need a calibration", field="calibration")
    return candidates


def make_plan(trace: PrefillTrace, req: PlanRequest) -> BucketPlan:
    """The optimal list for `trace` and the comparison rows. With `attention_dp_size` > 1 and
    records that group into steps across ranks, everything is priced per step
    (bcgtune.core.plan.dp_steps); otherwise per batch, and `dp_attention` says why."""
    trace.validate()
    if req.calibration is not None:
        req.calibration.validate(req.calibration.meta.get("source") if isinstance(req.calibration.meta, dict) else None)
    sizes, counts = trace.sizes, trace.counts
    candidates = resolve_candidates(req.candidates, req.calibration)
    mix = batch_mix(trace)  # requests per batch: the breakable runner's break and eager costs need them
    dp_info, steps = _dp_attention(trace, req.attention_dp_size)
    if steps is not None and dp_info is not None:
        opt = _solve_steps(steps, req, candidates)
        sol = opt.solution
        dp_info.proven, dp_info.how, dp_info.always_eager = opt.certificate.proven, opt.certificate.how, opt.always_eager
    else:
        sol = _solve(sizes, counts, req, candidates, mix)
    pricer = Pricer(sizes, counts, req, candidates, mix, steps)

    proven = dp_info is None or dp_info.proven is not False
    rows = [pricer.row("bcgtune (optimal)" if proven else "bcgtune (best found)", "optimal", sol.buckets)]
    if req.sglang_ladder is not None:
        ladder_max = req.ladder_max or (max(req.sglang_ladder) if req.sglang_ladder else 0)
        name = f"SGLang default ladder (max {ladder_max}" + (f", aligned to {req.layout_align})" if req.layout_align > 1 else ")")
        rows.append(pricer.row(name, "sglang-default", req.sglang_ladder))
    else:
        ladder_max = assumed_chunked_prefill_size(trace, req.chunked_prefill_size)
        rows.append(
            pricer.row(
                f"SGLang default ladder (max {ladder_max})",
                "sglang-default",
                sglang_default_ladder(ladder_max),
                sglang_aligns=True,
            )
        )
    if req.calibration is not None:
        rows.append(pricer.row("eager (no graphs)", "eager", []))
    for name, lst in req.compare:
        rows.append(pricer.row(name, "compare", lst, sglang_aligns=True))
    cap = trace.captured_list()
    if cap is not None:
        rows.append(pricer.row("server's captured list", "captured", cap.buckets))
    k = max(1, len(sol.buckets) or req.max_buckets)
    if req.kmeans:
        rows.append(
            pricer.row(f"KMeans (k={k})", "kmeans", kmeans_buckets(sizes, counts, k, req.align, req.max_bucket, req.seed))
        )
    if req.quantiles:
        rows.append(pricer.row(f"quantiles (k={k})", "quantile", quantile_buckets(sizes, counts, k, req.align, req.max_bucket)))

    if steps is not None:
        full_list, replayable = min_buckets_all_steps(steps, req.align, req.max_bucket, req.padding_factor)
    else:
        full_list = min_buckets_full_replay(sizes, req.align, req.max_bucket, req.padding_factor)[1]
        replayable = evaluate_list(sizes, counts, full_list, factor=req.padding_factor).replayed_batches if full_list else 0
    curve = [_curve_point(pricer, p, req) for p in sol.curve]
    explore = _explore(sizes, counts, req, candidates, mix, steps, pricer, sol.buckets)
    if explore is not None:
        rows.insert(1, explore)
    plan = BucketPlan(
        recommended=rows[0],
        optimal=rows[0],
        rows=rows,
        curve=curve,
        full_replay_buckets=full_list,
        full_replay_batches=replayable,
        request=req,
        candidate_set=candidates if req.objective == "time" else "trace",
        candidate_count=sol.candidates,
        ladder_max=ladder_max,
        trace=TraceInfo(
            origin=trace.origin,
            sources=trace.own_sources(),
            batches=trace.n_batches,
            distinct_sizes=int(sizes.size),
            tokens=trace.n_tokens,
            p50=trace.percentile(50),
            p99=trace.percentile(99),
            max=int(sizes[-1]),
            workload=(trace.meta.get("workload") or {}).get("name") if isinstance(trace.meta.get("workload"), dict) else None,
        ),
        dp_attention=dp_info,
        model=pricer.model,
    )
    if pricer.model is not None:
        price_with_intervals(plan, pricer, explore)
    plan.restrictions = restrictions(plan)
    return plan


def _explore(sizes, counts, req: PlanRequest, candidates: str, mix, steps, pricer: Pricer, optimum: list[int]):
    """The row of the exploring search (measured sizes at their times, and the sizes the
    trace wants that the calibration did not measure, priced by interpolation), when the
    optimum may pick measured sizes only and that search finds a faster list; else None."""
    cal = req.calibration
    if req.objective != "time" or candidates != "calibration" or steps is not None or pricer.model is None:
        return None
    if explore_candidates(cal, sizes, req.align, req.max_bucket, req.padding_factor).size > _DENSE_MAX_CANDIDATES:
        return None  # too many sizes to search at measured times: the plan keeps the measured optimum
    sol = optimal_buckets_time(
        sizes,
        counts,
        req.max_buckets,
        cal,
        req.align,
        req.max_bucket,
        req.padding_factor,
        req.max_graph_mem_gib,
        candidates="explore",
        mix=mix,
    )
    unmeasured = pricer.model.unmeasured(sol.buckets)
    base = pricer.model.totals(optimum)[0]
    if not unmeasured or not sol.cost < base - 1e-9 * max(1.0, base):
        return None
    return pricer.row(f"bcgtune (any size: {count_text(len(unmeasured), 'unmeasured size')})", "explore", sol.buckets)


def _solve(sizes, counts, req: PlanRequest, candidates: str, mix: BatchMix | None):
    if req.objective == "time":
        if req.calibration is None:
            raise InputError("the time objective needs a calibration", field="calibration")
        return optimal_buckets_time(
            sizes,
            counts,
            req.max_buckets,
            req.calibration,
            req.align,
            req.max_bucket,
            req.padding_factor,
            req.max_graph_mem_gib,
            candidates=candidates,
            mix=mix,
        )
    if req.max_graph_mem_gib is not None:
        raise InputError(
            "a graph-memory budget applies to the time objective (it needs a calibration's memory model)",
            field="max_graph_mem_gib",
        )
    return optimal_buckets(sizes, counts, req.max_buckets, req.align, req.max_bucket, req.padding_factor)


def _dp_attention(trace: PrefillTrace, ranks: int) -> tuple[DPAttentionInfo | None, DPSteps | None]:
    """The steps to price under DP attention (None: per batch), with what the plan says."""
    if ranks <= 1:
        return None, None
    g: StepGrouping = group_steps(trace, ranks)
    if g.steps is None:
        return DPAttentionInfo(ranks=ranks, unit="batch", records=g.records, reason=g.reason), None
    return DPAttentionInfo(
        ranks=ranks,
        unit="step",
        records=g.records,
        steps=g.steps.n_steps,
        rule=g.rule,
        ungrouped=g.ungrouped,
        decode_votes=g.decode_votes,
    ), g.steps


def _solve_steps(steps: DPSteps, req: PlanRequest, candidates: str) -> StepOptimum:
    if req.objective == "time":
        if req.calibration is None:
            raise InputError("the time objective needs a calibration", field="calibration")
        return optimal_step_buckets_time(
            steps,
            req.max_buckets,
            req.calibration,
            req.align,
            req.max_bucket,
            req.padding_factor,
            candidates,
            req.max_graph_mem_gib,
        )
    if req.max_graph_mem_gib is not None:
        raise InputError(
            "a graph-memory budget applies to the time objective (it needs a calibration's memory model)",
            field="max_graph_mem_gib",
        )
    return optimal_step_buckets(steps, req.max_buckets, req.align, req.max_bucket, req.padding_factor)


def _curve_point(pricer: Pricer, p: dict, req: PlanRequest) -> CurvePoint:
    m = pricer.metrics(p["buckets"])
    half = None
    if req.objective == "time" and pricer.model is not None:
        half = pricer.model.total(p["buckets"]).half
    return CurvePoint(
        k=p["k"],
        buckets=p["buckets"],
        eager_batches=m.eager_batches,
        padded_tokens=m.padded_tokens,
        waste_pct=m.waste_pct,
        hit_rate_pct=m.hit_rate_pct,
        predicted_ms=p["cost"] if req.objective == "time" else None,
        predicted_half_ms=half,
    )


def _beats(row: PlanRow, opt: PlanRow, objective: str) -> bool:
    if objective == "time":
        return (
            row.predicted_ms is not None
            and opt.predicted_ms is not None
            and row.predicted_ms < opt.predicted_ms - 1e-9 * max(1.0, opt.predicted_ms)
        )
    a, b = row.metrics, opt.metrics
    return (a.eager_batches, a.padded_tokens) < (b.eager_batches, b.padded_tokens)


def restrictions(plan: BucketPlan) -> list[Restriction]:
    """For each row that beats the optimal row on its objective, the constraints of the
    optimum that row breaks (an exact optimum is beaten only by a list it was not allowed)."""
    req = plan.request
    opt = plan.optimal or plan.rows[0]
    cal_rows = pickable = None
    if plan.candidate_set == "calibration":
        cal_rows = set(np.asarray(req.calibration.tokens).tolist())
        pickable = set(candidate_rows(req.calibration).tolist())
    out = []
    for row in plan.rows[1:]:
        if not _beats(row, opt, req.objective):
            continue
        b = row.buckets
        why = []
        if len(b) > req.max_buckets:
            why.append(f"{len(b)} buckets, more than the {req.max_buckets} allowed")
        off = [x for x in b if x % req.align]
        if off:
            why.append(f"buckets that are not multiples of {req.align}")
        if req.max_bucket is not None and b and max(b) > req.max_bucket:
            why.append(f"buckets above {req.max_bucket}")
        if cal_rows is not None and any(x not in cal_rows for x in b):
            why.append(
                "buckets at sizes the calibration did not measure, priced by interpolating it "
                "(the optimum picks measured sizes only)"
            )
        if cal_rows is not None and pickable is not None and any(x in cal_rows and x not in pickable for x in b):
            why.append(
                "buckets at sizes measured only to be compared (calibrate --sizes on a grid), which the optimum does "
                "not pick: among one-off sizes it would favour those that measured low by chance"
            )
        if req.max_graph_mem_gib is not None and row.graph_mem_gib is not None and row.graph_mem_gib > req.max_graph_mem_gib:
            why.append(f"{row.graph_mem_gib:.2f} GiB of graphs, above the {req.max_graph_mem_gib:g} GiB budget")
        if not why and plan.dp_attention is not None and plan.dp_attention.proven is False:
            why.append("none: the step optimum is not proven, and this list is better within the same constraints")
        elif not why:
            why.append("none found: please report this as a bug")
        out.append(Restriction(row=row.name, reasons=why))
    return out
