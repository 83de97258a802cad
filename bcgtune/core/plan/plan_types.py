"""The plan's types: what a request asks (`PlanRequest`, checked on construction) and what
a plan answers (`BucketPlan`: its rows, curve, restrictions, what the time objective's
predictions rest on and the recommendation rule as applied), with their JSON. Data only:
bcgtune.core.plan.bucket_plan makes a plan, bcgtune.core.plan.pricer prices its rows and
bcgtune.core.plan.recommend applies the recommendation rule."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Annotated, Any, Optional

import pydantic
from pydantic import Field

from bcgtune.core.plan.predict import HostBound, TimeModel
from bcgtune.core.schema import DP_RANKS_MAX, GIB_MAX, TOKENS_MAX, Seed, validate
from bcgtune.core.sglang.constants import CANDIDATE_SETS, OBJECTIVES
from bcgtune.core.sglang.replay import DEFAULT_PADDING_FACTOR, ListMetrics
from bcgtune.core.stats import CONFIDENCE, Interval


def count_text(n: int, what: str) -> str:
    return f"{n} {what}" + ("" if n == 1 else "s")


@dataclass
class TimeInfo:
    """What the predicted times rest on: the calibration's timed rounds (`rounds` 1: no
    interval, `why_none` says why), the eager time that is host launch time, the traced
    batches outside the calibration's measured sizes, and `widest_pct`, the widest interval
    of any row relative to its prediction (rounds that disagree widely)."""

    rounds: int
    confidence: float
    statistic: str
    why_none: str | None
    host_bound: HostBound | None
    outside: tuple[int, int, int, int] | None  # (units, of, smallest measured, largest measured)
    widest_pct: float | None
    scaled_sessions: list[dict] = field(default_factory=list)  # extensions put on the first session's scale


@dataclass
class Refinement:
    """Sizes the optimizer wants measured: the list it found by also pricing unmeasured sizes
    (`row`), predicted `gain` ms faster than the measured optimum (paired interval), and the
    command that measures those sizes (None: the calibration cannot be extended in place)."""

    sizes: list[int]
    row: str
    gain: Interval | None
    command: str | None
    why_no_command: str | None = None


def time_json(t: TimeInfo) -> dict[str, Any]:
    d = asdict(t)
    d["outside"] = None if t.outside is None else dict(zip(("batches", "of", "smallest_measured", "largest_measured"), t.outside))
    return d


def refine_json(r: Refinement) -> dict[str, Any]:
    d = asdict(r)
    d["gain"] = None if r.gain is None else r.gain.to_dict()
    return d


@dataclass
class RecommendRule:
    """The time objective's rule as applied: a list with fewer graphs than the best is
    recommended only when `bound` of (its time - the best's) is at most `margin_ms`
    (`tolerance_pct` % of the best's predicted time). `bound`: "upper" (the upper end of the
    95% paired interval over `rounds` timed rounds), "predicted" (one round and a tolerance
    given: the predicted difference alone), "none" (one round, no tolerance given: the
    optimum). `given`: the tolerance was stated, not the default."""

    tolerance_pct: float
    margin_ms: float
    given: bool
    bound: str
    rounds: int
    confidence: float = CONFIDENCE

    def admits(self, d: Interval) -> bool:
        """Whether a list whose paired difference from the best is `d` may stand for it."""
        if self.bound == "none":
            return False
        if self.bound == "upper":
            if d.half is None:
                return False
            worst = d.center + d.half
        else:
            worst = d.center
        return worst <= self.margin_ms + 1e-9 * max(1.0, abs(self.margin_ms))

    @property
    def within(self) -> str:
        """'within 0.5% (463.5 ms) of the best'."""
        return self.within_of("the best")

    def within_of(self, what: str) -> str:
        ms = f"{self.margin_ms:,.1f}" if self.margin_ms >= 10 else f"{self.margin_ms:.3g}"
        return f"within {self.tolerance_pct:g}% ({ms} ms) of {what}"

    @property
    def text(self) -> str:
        """'whose paired 95% upper bound is within 0.5% (463.5 ms) of the best', as a reason
        and the printed rule say it."""
        if self.bound == "upper":
            return f"whose paired {self.confidence:.0%} upper bound is {self.within}"
        if self.bound == "predicted":
            return f"predicted {self.within} (one timed round: no interval, so by the predicted time alone)"
        return "(none: one timed round gives no interval to bound a list with fewer graphs)"

    @property
    def none_text(self) -> str:
        """What no list with fewer graphs met: 'has a paired 95% upper bound within ...'."""
        if self.bound == "upper":
            return f"has a paired {self.confidence:.0%} upper bound {self.within}"
        return f"is {self.text}"

    def summary(self) -> str:
        """The printed rule line."""
        src = f"--tolerance {self.tolerance_pct:g}" if self.given else "the default; --tolerance PCT sets it"
        if self.bound == "none":
            return (
                "the optimum: one timed round gives no interval to bound a list with fewer graphs "
                "(--tolerance PCT accepts fewer graphs predicted within PCT % of the best)"
            )
        return f"the fewest graphs {self.text} ({src})"

    def to_dict(self) -> dict[str, Any]:
        return {
            "tolerance_pct": self.tolerance_pct,
            "margin_ms": self.margin_ms,
            "given": self.given,
            "bound": self.bound,
            "rounds": self.rounds,
            "confidence": self.confidence,
            "text": self.summary(),
        }


PLAN_FORMAT_VERSION = 1


PLAN_KIND = "bcgtune.bucket-plan"


MAX_BUCKETS_LIMIT = 4096  # no SGLang launch captures more prefill graphs than this


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
    # SGLang's default ladder as this launch captures it (bcgtune.core.sglang.capture.resolve_prefill_capture),
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

    def model_check_json(self) -> dict[str, Any] | None:
        """The calibration's model check (what the intervals rest on), or why there is none;
        None without a calibration."""
        from bcgtune.core.plan.model_check import not_checked_reason

        cal = self.request.calibration
        if cal is None:
            return None
        mc = getattr(cal, "model_check", None)
        if mc is None:
            return {"checked": False, "reason": "model error not checked: " + not_checked_reason(cal)}
        return {"checked": True, "summary": mc.summary(), **mc.to_json()}

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
            "model_check": self.model_check_json(),
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
