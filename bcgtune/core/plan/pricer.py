"""The one pricing of every row of a plan: a list's metrics under the replay rule, and with
a calibration its predicted time and graph memory, per batch or per DP-attention step."""

from __future__ import annotations

import numpy as np

from bcgtune.core.plan.dp_steps import DPSteps, evaluate_steps
from bcgtune.core.plan.plan_types import PlanRequest, PlanRow
from bcgtune.core.plan.predict import TimeModel
from bcgtune.core.sglang.ladder import ceil_to, sorted_unique
from bcgtune.core.sglang.replay import ListMetrics, evaluate_list
from bcgtune.core.trace.mix import BatchMix


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
