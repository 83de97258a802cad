"""What `trace --simulate` reports beyond a log trace's summary: the image share and the
batches that replay with the patched and the unpatched prefill runner under a bucket list,
per concurrency level, and under DP attention per step. Pure functions of a trace."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from bcgtune.core.plan.dp_steps import evaluate_steps
from bcgtune.core.plan.step_grouping import group_steps
from bcgtune.core.sglang.ladder import default_chunked_prefill_size, sglang_default_ladder
from bcgtune.core.sglang.replay import DEFAULT_PADDING_FACTOR, assign_buckets
from bcgtune.core.sim.workload import Workload
from bcgtune.core.trace.prefill_trace import PrefillTrace


@dataclass(frozen=True, kw_only=True)
class ReplayShare:
    """Batches that replay under one bucket list: with the patched prefill runner (image
    batches replay like text ones) and the unpatched SGLang 0.5.23 runner (every image batch
    of a Qwen multimodal model runs eager). `list` and `buckets` name the list."""

    list: str | None = None
    buckets: int
    batches: int
    image_batches: int
    image_share: float
    images_known: bool
    patched_replay_batches: int
    unpatched_replay_batches: int
    patched_replay_share: float
    unpatched_replay_share: float

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class LevelSummary:
    """One concurrency level of a simulated sweep."""

    max_concurrency: int | None
    num_prompts: int
    batches: int
    image_batches: int | None
    mean_forward_tokens: float | None
    max_forward_tokens: int | None
    decode_steps: int
    duration_s: float


@dataclass(frozen=True)
class StepShare:
    """Under DP attention: the simulated steps (iterations with a prefill on some rank) and,
    per list, the share of steps that replay (every rank's count replays; the patched
    runner, so image batches replay like text ones)."""

    ranks: int
    steps: int
    decode_votes: int
    replay_shares: dict[str, float]


@dataclass(frozen=True)
class SimulationSummary:
    """What `trace --simulate` reports beyond a log trace's summary."""

    workload: str | None
    replay: list[ReplayShare]
    levels: list[LevelSummary]
    dp_steps: StepShare | None = None

    def to_dict(self) -> dict:
        """The JSON form: {"workload", "replay": [{"list", "buckets", ...}], "levels": [...]},
        with "dp_steps": {...} under DP attention."""
        out: dict[str, Any] = {
            "workload": self.workload,
            "replay": [r.to_dict() for r in self.replay],
            "levels": [asdict(lv) for lv in self.levels],
        }
        if self.dp_steps is not None:
            out["dp_steps"] = asdict(self.dp_steps)
        return out


def replay_shares(
    trace: PrefillTrace, buckets: Iterable[int], factor: float = DEFAULT_PADDING_FACTOR, *, label: str | None = None
) -> ReplayShare:
    """Share of batches that replay under a bucket list, for the patched and the unpatched
    runner (see ReplayShare; no speculative decoding). Pure function of the trace."""
    buckets = list(buckets)
    if trace.batches is not None and "forward_tokens" in trace.batches:
        sizes = np.asarray(trace.batches["forward_tokens"], dtype=np.int64)
        weights = np.ones(sizes.shape, dtype=np.int64)
        img = trace.batches.get("images")
        images_known = img is not None and bool((np.asarray(img) >= 0).all())
        is_img = (np.asarray(img) == 1) if img is not None else np.zeros(sizes.shape, dtype=bool)
    else:
        sizes = np.asarray(trace.sizes, dtype=np.int64)
        weights = np.asarray(trace.counts, dtype=np.int64)
        images_known = False
        is_img = np.zeros(sizes.shape, dtype=bool)
    _, replay = assign_buckets(sizes, buckets, factor)
    total = int(weights.sum())
    n_img = int(weights[is_img].sum())
    patched = int(weights[replay].sum())
    unpatched = int(weights[replay & ~is_img].sum())
    return ReplayShare(
        list=label,
        buckets=len(buckets),
        batches=total,
        image_batches=n_img,
        image_share=n_img / total if total else 0.0,
        images_known=images_known,
        patched_replay_batches=patched,
        unpatched_replay_batches=unpatched,
        patched_replay_share=patched / total if total else 0.0,
        unpatched_replay_share=unpatched / total if total else 0.0,
    )


def _level_summary(level: dict, fwd: np.ndarray | None, img: np.ndarray | None) -> LevelSummary:
    s, e = level["batches"]
    n = e - s
    return LevelSummary(
        max_concurrency=level["max_concurrency"],
        num_prompts=level["num_prompts"],
        batches=n,
        image_batches=int((img[s:e] == 1).sum()) if img is not None else None,
        mean_forward_tokens=round(float(fwd[s:e].mean()), 1) if fwd is not None and n else None,
        max_forward_tokens=int(fwd[s:e].max()) if fwd is not None and n else None,
        decode_steps=level["decode_steps"],
        duration_s=level["duration_s"],
    )


def simulation_summary(
    trace: PrefillTrace, buckets: Iterable[int] | None = None, factor: float = DEFAULT_PADDING_FACTOR
) -> SimulationSummary:
    """Image share and the patched-vs-unpatched replay shares under SGLang's default ladder
    (max = the simulated chunked prefill size) and, if given, a user list (labelled
    "--buckets"); plus the per-concurrency-level breakdown."""
    wl = trace.meta.get("workload", {})
    max_bs = int(wl.get("resolved", {}).get("chunked_prefill_size") or default_chunked_prefill_size(Workload().gpu_memory_gib))
    max_bs = min(max_bs, 1 << 20)
    lists = {f"sglang default ladder (max {max_bs})": sglang_default_ladder(max_bs)}
    if buckets:
        lists["--buckets"] = sorted(int(b) for b in buckets)
    fwd = trace.batches["forward_tokens"] if trace.batches is not None else None
    img = trace.batches.get("images") if trace.batches is not None else None
    return SimulationSummary(
        workload=wl.get("name") or None,
        replay=[replay_shares(trace, bl, factor, label=name) for name, bl in lists.items()],
        levels=[_level_summary(lv, fwd, img) for lv in trace.meta.get("levels", [])],
        dp_steps=_step_share(trace, lists, factor),
    )


def _step_share(trace: PrefillTrace, lists: dict[str, list[int]], factor: float) -> StepShare | None:
    """The steps of a DP-attention simulation and the share each list replays."""
    dp = trace.meta.get("dp_attention")
    if not isinstance(dp, dict) or trace.batches is None or "step" not in trace.batches:
        return None
    g = group_steps(trace, int(dp["ranks"]))
    if g.steps is None:
        return None
    shares = {name: evaluate_steps(g.steps, bl, factor=factor).hit_rate_pct / 100.0 for name, bl in lists.items()}
    return StepShare(ranks=g.steps.ranks, steps=g.steps.n_steps, decode_votes=g.decode_votes, replay_shares=shares)
