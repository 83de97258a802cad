"""BucketPlan: the optimal list for a trace, compared with the alternatives a user has.

Pure: takes a PrefillTrace and parameters, returns data. Rendering lives in the CLI.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from bcgtune.core.ladder import align_buckets, default_chunked_prefill_size, sglang_default_ladder
from bcgtune.core.mix import batch_mix
from bcgtune.core.optimizer import (
    min_buckets_full_replay,
    optimal_buckets,
    optimal_buckets_time,
    predicted_time_ms,
)
from bcgtune.core.replay import DEFAULT_PADDING_FACTOR, evaluate_list
from bcgtune.core.trace import PrefillTrace
from bcgtune.errors import InputError

PLAN_FORMAT_VERSION = 1

# The MI355X engineer's hand-derived list (seeds/000): same +21% as the 74-graph ladder.
SEEDS_HAND_LIST = [256, 512, 768, 1024, 1280, 1408, 2560, 2752, 3840, 4096, 5376]


@dataclass
class PlanRequest:
    max_buckets: int = 12
    align: int = 1
    max_bucket: int | None = None
    factor: float = DEFAULT_PADDING_FACTOR
    objective: str = "padding"  # padding | time
    chunked_prefill_size: int | None = None  # for SGLang's default ladder
    compare: list[tuple[str, list[int]]] = field(default_factory=list)
    calibration: Any = None  # core.calibration.Calibration, for objective=time
    max_graph_mem_gib: float | None = None
    baselines: bool = True  # KMeans and quantile rows
    # time objective's bucket candidates: trace (any aligned size, interpolated t_graph),
    # calibration (only measured rows, measured t_graph), auto (calibration when the
    # calibration was measured on a bucket grid: `bcgtune calibrate --grid/--sizes-from`)
    candidates: str = "auto"
    seed: int = 0


@dataclass
class BucketPlan:
    recommended: dict
    rows: list[dict]
    curve: list[dict]
    full_replay: dict
    params: dict
    trace_info: dict

    def to_json_obj(self) -> dict:
        from bcgtune import __version__

        return {
            "format_version": PLAN_FORMAT_VERSION,
            "kind": "bcgtune.bucket-plan",
            "tool_version": __version__,
            "trace": self.trace_info,
            "params": self.params,
            "recommended": self.recommended,
            "comparison": self.rows,
            "curve": self.curve,
            "min_buckets_full_replay": self.full_replay,
        }


def ladder_max_for(trace: PrefillTrace, chunked_prefill_size: int | None) -> int:
    """max_bs SGLang would use: chunked_prefill_size when known, else the smallest of
    SGLang's memory-based chunked_prefill_size defaults that covers the trace."""
    if chunked_prefill_size:
        return int(chunked_prefill_size)
    known = trace_chunked_prefill_size(trace)
    if known:
        return known
    biggest = int(trace.sizes[-1])
    for cps in (default_chunked_prefill_size(g) for g in (16, 40, 100, 200)):
        if cps >= biggest:
            return cps
    return biggest


def trace_chunked_prefill_size(trace: PrefillTrace) -> int | None:
    """chunked_prefill_size the traced server ran with, when the trace knows it: from the
    log's startup line, or from the simulated workload's resolved settings."""
    for st in trace.meta.get("startup") or []:
        if isinstance(st, dict) and st.get("chunked_prefill_size"):
            return int(st["chunked_prefill_size"])
    resolved = (trace.meta.get("workload") or {}).get("resolved") or {}
    if resolved.get("chunked_prefill_size"):
        return int(resolved["chunked_prefill_size"])
    return None


def kmeans_buckets(sizes, counts, k: int, align: int, max_bucket: int | None, seed: int = 0) -> list[int]:
    """scikit-learn KMeans on the weighted sizes; bucket = cluster max rounded up to align."""
    from sklearn.cluster import KMeans

    x = np.asarray(sizes, dtype=np.float64).reshape(-1, 1)
    k = max(1, min(k, len(x)))
    km = KMeans(n_clusters=k, n_init=3, random_state=seed).fit(x, sample_weight=np.asarray(counts, float))
    tops = [int(np.asarray(sizes)[km.labels_ == c].max()) for c in range(k) if (km.labels_ == c).any()]
    return _aligned_capped(tops, align, max_bucket)


def quantile_buckets(sizes, counts, k: int, align: int, max_bucket: int | None) -> list[int]:
    """Buckets at the weighted quantiles i/k (i = 1..k) of the batch sizes."""
    cum = np.cumsum(counts)
    total = cum[-1]
    tops = [int(np.asarray(sizes)[np.searchsorted(cum, max(1, int(np.ceil(i / k * total))))]) for i in range(1, k + 1)]
    return _aligned_capped(tops, align, max_bucket)


def _aligned_capped(tops, align, max_bucket):
    out = set()
    for t in tops:
        b = -(-t // align) * align
        if max_bucket is not None and b > max_bucket:
            b = (max_bucket // align) * align
        if b > 0:
            out.add(b)
    return sorted(out)


def resolve_candidates(candidates: str, calibration) -> str:
    if candidates not in ("auto", "trace", "calibration"):
        raise InputError(f"unknown --candidates {candidates!r} (auto, trace or calibration)")
    if candidates == "auto":
        grid = (getattr(calibration, "meta", None) or {}).get("bucket_grid") if calibration is not None else None
        return "calibration" if grid else "trace"
    if candidates == "calibration" and calibration is None:
        raise InputError("--candidates calibration needs --calibration FILE")
    return candidates


def make_plan(trace: PrefillTrace, req: PlanRequest) -> BucketPlan:
    trace.validate()
    sizes, counts = trace.sizes, trace.counts
    if req.max_buckets < 1:
        raise InputError(f"--max-buckets must be >= 1, got {req.max_buckets}")
    if req.align < 1:
        raise InputError(f"--align must be >= 1, got {req.align}")
    if req.max_bucket is not None and req.max_bucket < 1:
        raise InputError(f"--max-bucket must be >= 1, got {req.max_bucket}")
    if req.objective not in ("padding", "time"):
        raise InputError(f"unknown --objective {req.objective!r} (padding or time)")
    candidates = resolve_candidates(req.candidates, req.calibration)
    mix = batch_mix(trace)  # request counts per batch: the breakable runner's break and eager costs need them
    if req.objective == "time":
        if req.calibration is None:
            raise InputError("--objective time needs --calibration FILE")
        sol = optimal_buckets_time(
            sizes, counts, req.max_buckets, req.calibration, req.align, req.max_bucket, req.factor,
            req.max_graph_mem_gib, candidates=candidates, mix=mix,
        )
    else:
        if req.max_graph_mem_gib is not None:
            raise InputError("--max-graph-mem applies to --objective time (it needs a calibration's memory model)")
        sol = optimal_buckets(sizes, counts, req.max_buckets, req.align, req.max_bucket, req.factor)

    def row(name: str, buckets: list[int], kind: str) -> dict:
        m = evaluate_list(sizes, counts, buckets, name=name, factor=req.factor).to_dict()
        m["kind"] = kind
        if req.calibration is not None:
            m["predicted_ms"] = predicted_time_ms(sizes, counts, buckets, req.calibration, req.factor, candidates, mix)
        return m

    rows = [row("bcgtune (optimal)", sol.buckets, "optimal")]
    ladder_max = ladder_max_for(trace, req.chunked_prefill_size)
    ladder = align_buckets(sglang_default_ladder(ladder_max), req.align)
    rows.append(row(f"SGLang default ladder (max {ladder_max})", ladder, "sglang-default"))
    for name, lst in req.compare:
        rows.append(row(name, lst, "compare"))
    for cap in trace.captures or []:
        if (
            cap.get("kind") == "prefill"
            and cap.get("phase", "target") == "target"
            and cap.get("buckets")
            and not cap.get("elided")
        ):
            rows.append(row("server's captured list", sorted(set(cap["buckets"])), "captured"))
            break
    if req.baselines:
        k = max(1, len(sol.buckets) or req.max_buckets)
        rows.append(row(f"KMeans (k={k})", kmeans_buckets(sizes, counts, k, req.align, req.max_bucket, req.seed), "kmeans"))
        rows.append(row(f"quantiles (k={k})", quantile_buckets(sizes, counts, k, req.align, req.max_bucket), "quantile"))
    if req.calibration is not None:
        eager_ms = predicted_time_ms(sizes, counts, [], req.calibration, req.factor, candidates, mix)
        for r in rows:
            r["speedup_vs_eager"] = eager_ms / r["predicted_ms"] if r["predicted_ms"] else None
            if req.calibration.per_graph_gib is not None and r["buckets"]:
                try:
                    r["graph_mem_gib"] = float(req.calibration.graph_memory_gib(r["buckets"]))
                except InputError:
                    pass

    n_full, full_list = min_buckets_full_replay(sizes, req.align, req.max_bucket, req.factor)
    replayable = evaluate_list(sizes, counts, full_list, factor=req.factor).replayed_batches if full_list else 0
    rec = rows[0] | {"flag": "--cuda-graph-bs-prefill " + " ".join(map(str, sol.buckets)), "objective": req.objective}
    curve = []
    for p in sol.curve:
        m = evaluate_list(sizes, counts, p["buckets"], factor=req.factor)
        pt = {
            "k": p["k"],
            "buckets": p["buckets"],
            "eager_batches": m.eager_batches,
            "padded_tokens": m.padded_tokens,
            "waste_pct": m.waste_pct,
            "hit_rate_pct": m.hit_rate_pct,
        }
        if req.objective == "time":
            pt["predicted_ms"] = p["cost"]
        curve.append(pt)
    return BucketPlan(
        recommended=rec,
        rows=rows,
        curve=curve,
        full_replay={"buckets": n_full, "list": full_list, "replayable_batches": replayable},
        params={
            "max_buckets": req.max_buckets,
            "align": req.align,
            "max_bucket": req.max_bucket,
            "padding_factor": req.factor,
            "objective": req.objective,
            "ladder_max": ladder_max,
            "candidates": sol.candidates,
            "candidate_set": candidates if req.objective == "time" else "trace",
            "max_graph_mem_gib": req.max_graph_mem_gib,
        },
        trace_info={
            "origin": trace.origin,
            "sources": trace.sources,
            "batches": trace.n_batches,
            "distinct_sizes": int(sizes.size),
            "tokens": trace.n_tokens,
            "p50": trace.percentile(50),
            "p99": trace.percentile(99),
            "max": int(sizes[-1]),
            "workload": (trace.meta.get("workload") or {}).get("name"),
        },
    )
