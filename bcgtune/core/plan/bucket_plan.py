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

from dataclasses import asdict, dataclass, field
from fractions import Fraction
from typing import Annotated, Any, Optional

import numpy as np
import pydantic
from pydantic import Field

from bcgtune.core.plan.dp_steps import (
    DPSteps,
    StepOptimum,
    evaluate_steps,
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
from bcgtune.core.plan.predict import TimeModel
from bcgtune.core.plan.recommend import (
    RecommendRule,
    Refinement,
    TimeInfo,
    count_text,
    price_with_intervals,
    refine_json,
    time_json,
)
from bcgtune.core.plan.step_grouping import StepGrouping, group_steps
from bcgtune.core.schema import DP_RANKS_MAX, GIB_MAX, TOKENS_MAX, Seed, validate
from bcgtune.core.sglang.constants import CANDIDATE_SETS, OBJECTIVES
from bcgtune.core.sglang.ladder import ceil_to, default_chunked_prefill_size, sglang_default_ladder, sorted_unique
from bcgtune.core.sglang.replay import DEFAULT_PADDING_FACTOR, ListMetrics, evaluate_list
from bcgtune.core.stats import Interval, nearest_rank
from bcgtune.core.trace.mix import BatchMix, batch_mix
from bcgtune.core.trace.prefill_trace import PrefillTrace
from bcgtune.errors import InputError

PLAN_FORMAT_VERSION = 1
PLAN_KIND = "bcgtune.bucket-plan"
MAX_BUCKETS_LIMIT = 4096  # no SGLang launch captures more prefill graphs than this

# The hand-tuned MI355X list from the Qwen multimodal breakable-prefill pull request: it
# matched the +21% throughput of SGLang's 74-graph default ladder with 11 graphs.
MI355X_PR_HAND_LIST = [256, 512, 768, 1024, 1280, 1408, 2560, 2752, 3840, 4096, 5376]
MI355X_PR_HAND_LIST_NAME = "hand-tuned MI355X list (Qwen multimodal PR)"


class PlanRequest(pydantic.BaseModel):
    """What to optimize, with the bounds each input must meet (checked on construction)."""

    model_config = pydantic.ConfigDict(arbitrary_types_allowed=True, extra="forbid")

    max_buckets: Annotated[int, Field(ge=1, le=MAX_BUCKETS_LIMIT)] = 12
    align: Annotated[int, Field(ge=1, le=TOKENS_MAX)] = 1
    # the multiple SGLang rounds captured buckets up to for this layout (core/sglang/ladder.py)
    layout_align: Annotated[int, Field(ge=1, le=TOKENS_MAX)] = 1
    max_bucket: Optional[Annotated[int, Field(ge=1, le=TOKENS_MAX)]] = None
    padding_factor: Annotated[float, Field(ge=1.0, le=1e6, allow_inf_nan=False)] = DEFAULT_PADDING_FACTOR
    objective: str = "padding"
    chunked_prefill_size: Optional[Annotated[int, Field(ge=1, le=TOKENS_MAX)]] = None
    # SGLang's default ladder as this launch captures it (bcgtune.core.sglang.ladder.resolve_prefill_capture),
    # with its maximum; None: the plain ladder up to chunked_prefill_size (or one covering the trace)
    sglang_ladder: Optional[list[int]] = None
    ladder_max: Optional[int] = None
    compare: list[tuple[str, list[int]]] = []
    calibration: Any = None  # core.plan.calibration.Calibration, for objective=time
    max_graph_mem_gib: Optional[Annotated[float, Field(gt=0, le=GIB_MAX, allow_inf_nan=False)]] = None
    kmeans: bool = False  # scikit-learn KMeans row (imports scikit-learn: seconds)
    quantiles: bool = True
    candidates: str = "auto"
    seed: Seed = 0
    # attention-DP ranks of the server (DP attention): > 1 prices steps across ranks when
    # the trace's records can be grouped into steps (bcgtune.core.plan.dp_steps)
    attention_dp_size: Annotated[int, Field(ge=1, le=DP_RANKS_MAX)] = 1
    # time objective: recommend fewer graphs than the best only when the upper end of their
    # paired 95% interval against it is within this % of the best's predicted time
    # (None: core.sglang.constants.DEFAULT_TOLERANCE_PCT)
    tolerance_pct: Optional[Annotated[float, Field(ge=0, le=100, allow_inf_nan=False)]] = None

    @pydantic.field_validator("objective")
    @classmethod
    def _objective(cls, v: str) -> str:
        if v not in OBJECTIVES:
            raise ValueError(f"must be padding or time, got {v!r}")
        return v

    @pydantic.field_validator("candidates")
    @classmethod
    def _candidates(cls, v: str) -> str:
        if v not in CANDIDATE_SETS:
            raise ValueError(f"must be auto, trace or calibration, got {v!r}")
        return v


def plan_request(**fields: Any) -> PlanRequest:
    """A PlanRequest, or an InputError naming the field that is out of bounds."""
    return validate(PlanRequest, fields, as_fields=True)


@dataclass
class PlanRow:
    """One list of the comparison, with its metrics under the plan's rule and model."""

    name: str
    kind: str  # optimal | sglang-default | compare | captured | kmeans | quantile
    metrics: ListMetrics
    predicted_ms: float | None = None
    speedup_vs_eager: float | None = None
    graph_mem_gib: float | None = None
    aligned_from: list[int] | None = None  # the list as given, when SGLang's alignment changed it
    omitted_unused: int = 0  # buckets of a very long list that serve no traced batch: counted, not listed
    interval: Interval | None = None  # predicted_ms with its 95% interval (half None: one round)
    vs_recommended: Interval | None = None  # predicted_ms - the recommended row's, paired
    vs_best: str | None = None  # best | within noise | slower | faster | unknown (no interval)
    unmeasured: list[int] = field(default_factory=list)  # buckets priced by interpolation
    capture_s: float | None = None  # capture time of the list (calibration's per-bucket times)

    @property
    def buckets(self) -> list[int]:
        return self.metrics.buckets

    def to_dict(self) -> dict[str, Any]:
        d = self.metrics.to_dict()
        d["name"] = self.name
        d["kind"] = self.kind
        if self.predicted_ms is not None:
            d["predicted_ms"] = self.predicted_ms
            d["predicted_half_ms"] = None if self.interval is None else self.interval.half
            d["predicted_se_ms"] = None if self.interval is None else self.interval.se
            d["vs_recommended_ms"] = None if self.vs_recommended is None else self.vs_recommended.center
            d["vs_recommended_half_ms"] = None if self.vs_recommended is None else self.vs_recommended.half
            d["vs_best"] = self.vs_best
            d["unmeasured_buckets"] = self.unmeasured
            d["capture_s"] = self.capture_s
            d["speedup_vs_eager"] = self.speedup_vs_eager
        if self.graph_mem_gib is not None:
            d["graph_mem_gib"] = self.graph_mem_gib
        if self.aligned_from is not None:
            d["aligned_from"] = self.aligned_from
        if self.omitted_unused:
            d["buckets_omitted_unused"] = self.omitted_unused
        return d


@dataclass
class CurvePoint:
    k: int
    buckets: list[int]
    eager_batches: int
    padded_tokens: int
    waste_pct: float
    hit_rate_pct: float
    predicted_ms: float | None = None
    predicted_half_ms: float | None = None
    vs_recommended_ms: float | None = None  # paired difference from the recommended list
    vs_recommended_half_ms: float | None = None


@dataclass
class Restriction:
    """Why a row beats the optimal one on its objective: the constraint it breaks."""

    row: str
    reasons: list[str]


@dataclass
class TraceInfo:
    origin: str
    sources: list[dict[str, Any]]
    batches: int
    distinct_sizes: int
    tokens: int
    p50: int
    p99: int
    max: int
    workload: str | None


@dataclass
class DPAttentionInfo:
    """How a plan priced DP attention. `unit`: "step" (the trace's records grouped into
    steps across ranks: every metric counts steps) or "batch" (no rank information:
    `reason`). `proven`/`how`: whether the step optimum is proven (StepCertificate)."""

    ranks: int
    unit: str
    records: int
    steps: int = 0
    rule: str | None = None
    ungrouped: int = 0
    decode_votes: int = 0
    always_eager: int = 0
    proven: bool | None = None
    how: str | None = None
    reason: str | None = None


@dataclass
class BucketPlan:
    recommended: PlanRow
    rows: list[PlanRow]
    curve: list[CurvePoint]
    full_replay_buckets: list[int]
    full_replay_batches: int
    request: PlanRequest
    candidate_set: str  # trace | calibration
    candidate_count: int
    ladder_max: int
    trace: TraceInfo
    restrictions: list[Restriction] = field(default_factory=list)
    dp_attention: DPAttentionInfo | None = None
    optimal: PlanRow | None = None  # the exact optimum (rows[0]); `recommended` may have fewer graphs
    recommended_reason: str = ""
    time: TimeInfo | None = None
    refine: Refinement | None = None
    rule: RecommendRule | None = None  # the time objective's recommendation rule, as applied
    # the model that priced the rows with a calibration (core/predict.TimeModel), for paired
    # comparisons of any two lists on this plan's traffic; not part of the JSON
    model: TimeModel | None = field(default=None, repr=False, compare=False)

    @property
    def unit(self) -> str:
        """What a row's metrics count: "step" under DP attention with grouped steps, else "batch"."""
        return self.dp_attention.unit if self.dp_attention is not None else "batch"

    @property
    def flag(self) -> str:
        return "--cuda-graph-bs-prefill " + " ".join(map(str, self.recommended.buckets))

    def params(self) -> dict[str, Any]:
        r = self.request
        return {
            "max_buckets": r.max_buckets,
            "align": r.align,
            "layout_align": r.layout_align,
            "max_bucket": r.max_bucket,
            "padding_factor": r.padding_factor,
            "objective": r.objective,
            "ladder_max": self.ladder_max,
            "candidates": self.candidate_count,
            "candidate_set": self.candidate_set,
            "max_graph_mem_gib": r.max_graph_mem_gib,
            "tolerance_pct": self.rule.tolerance_pct if self.rule is not None else r.tolerance_pct,
        }

    def to_json_obj(self) -> dict[str, Any]:
        from bcgtune.core.document import document_header

        rec = self.recommended.to_dict() | {
            "flag": self.flag,
            "objective": self.request.objective,
            "reason": self.recommended_reason,
            "rule": None if self.rule is None else self.rule.to_dict(),
        }
        opt = self.optimal or self.rows[0]
        return {
            **document_header(PLAN_KIND, PLAN_FORMAT_VERSION),
            "trace": asdict(self.trace),
            "params": self.params(),
            "recommended": rec,
            "optimal": opt.to_dict() | {"flag": "--cuda-graph-bs-prefill " + " ".join(map(str, opt.buckets))},
            "uncertainty": None if self.time is None else time_json(self.time),
            "refine": None if self.refine is None else refine_json(self.refine),
            "comparison": [r.to_dict() for r in self.rows],
            "curve": [{k: v for k, v in asdict(c).items() if v is not None} for c in self.curve],
            "min_buckets_full_replay": {
                "buckets": len(self.full_replay_buckets),
                "list": self.full_replay_buckets,
                "replayable_batches": self.full_replay_batches,
            },
            "restrictions": [asdict(x) for x in self.restrictions],
            "dp_attention": None if self.dp_attention is None else asdict(self.dp_attention),
        }


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
            sources=trace.sources,
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


class Pricer:
    """Metrics (and, with a calibration, predicted time and graph memory) of any list, by
    one rule and one model for every row: per batch, or per DP-attention step."""

    def __init__(self, sizes, counts, req: PlanRequest, candidates: str, mix: BatchMix | None, steps: DPSteps | None = None):
        self.sizes, self.counts, self.req, self.candidates, self.mix = sizes, counts, req, candidates, mix
        self.steps = steps
        self.eager_ms = None
        self.model: TimeModel | None = None
        if req.calibration is not None:
            self.model = TimeModel(sizes, counts, req.calibration, req.padding_factor, candidates, mix=mix, steps=steps)
            self.eager_ms = self.time_ms([])

    def metrics(self, buckets, name: str = "") -> ListMetrics:
        if self.steps is not None:
            return evaluate_steps(self.steps, buckets, name=name, factor=self.req.padding_factor)
        return evaluate_list(self.sizes, self.counts, buckets, name=name, factor=self.req.padding_factor)

    def time_ms(self, buckets) -> float:
        assert self.model is not None
        return float(self.model.totals(buckets)[0])

    def row(self, name: str, kind: str, buckets, *, sglang_aligns: bool = False) -> PlanRow:
        arr = sorted_unique(list(buckets))
        aligned = sorted_unique(ceil_to(arr, self.req.layout_align)) if sglang_aligns else arr
        captured, omitted = _serving_part(aligned, self.sizes)
        m = self.metrics(captured, name)
        if omitted:  # counted, not listed
            m.graphs += omitted
            m.unused_buckets += omitted
        changed = sglang_aligns and (aligned.size != arr.size or bool((aligned != arr).any()))
        r = PlanRow(
            name=name,
            kind=kind,
            metrics=m,
            aligned_from=arr.tolist() if changed and not omitted else None,
            omitted_unused=omitted,
        )
        cal = self.req.calibration
        if cal is not None:
            r.predicted_ms = self.time_ms(captured)
            r.speedup_vs_eager = self.eager_ms / r.predicted_ms if r.predicted_ms and self.eager_ms is not None else None
            if cal.has_memory and captured:
                r.graph_mem_gib = float(cal.graph_memory_gib(aligned.tolist()))
        return r


LISTED_MAX = 4096  # a longer list is listed by the buckets that serve traced batches


def _serving_part(buckets: np.ndarray, sizes: np.ndarray) -> tuple[list[int], int]:
    """(the list to evaluate, how many buckets it leaves out). Which bucket a batch uses and
    whether it replays depends only on the smallest bucket at or above it, so a list longer
    than LISTED_MAX (SGLang's ladder to 2**31 tokens has 4 million buckets) is evaluated on
    those buckets alone, and the others are counted as unused graphs."""
    if buckets.size <= LISTED_MAX:
        return buckets.tolist(), 0
    idx = np.searchsorted(buckets, sizes, side="left")
    serving = buckets[sorted_unique(idx[idx < buckets.size])]
    return serving.tolist(), int(buckets.size - serving.size)


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
