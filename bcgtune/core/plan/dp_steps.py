"""Prefill steps under SGLang's DP attention: every attention-DP rank replays one bucket.

With DP attention the attention-DP ranks run each scheduler iteration in lockstep, and a
prefill graph replays per step, not per batch. SGLang 0.5.23 (paths in the sglang package):

  * srt/managers/scheduler_components/dp_attn.py, `prepare_mlp_sync_batch_raw` and
    `MLPSyncBatchInfo.all_gather`: each iteration every rank all-gathers its forward token
    count (its extend tokens; 0 when idle; its rows when decoding) and its prefill-graph
    vote. The vote is min-reduced (`can_run_prefill_cuda_graph = tp0_info_cpu[:, 6].min()`),
    the "some rank extends" flag max-reduced (`is_extend_in_batch = ...[:, 3].max()`).
  * `_local_prefill_cuda_graph_vote`: an idle rank votes yes; a rank with an extend batch
    votes `PrefillCudaGraphRunner.can_replay_locally` on its own count, which holds SGLang's
    replay rule (bcgtune.core.sglang.replay) on that count: at most the largest bucket, and the
    smallest bucket >= it at most factor x it. A decoding rank votes the same rule on its
    decode rows, viewed as one-token extends (`convert_decode_to_extend`).
  * srt/model_executor/forward_batch_info.py, `ForwardBatch.prepare_mlp_sync_batch` (about
    lines 1784-1812): when the vote passed and some rank extends, padding is MAX_LEN with
    `bucket = min(size for size in bs if size >= max(global_num_tokens))`, the bucket of the
    largest count across ranks, and `global_num_tokens = [bucket] * sync_group_size`; an
    idle rank runs a fabricated request of `bucket` tokens (the `materializes_dummy_extend`
    branch). So every rank replays that one bucket, idle ranks included.
  * srt/model_executor/runner/prefill_cuda_graph_runner.py, `can_run_graph`: replays only
    under the group verdict (`can_run_dp_prefill_cuda_graph`); its idle-rank check
    (`_has_inactive_dp_rank`) reads the padded counts, where no rank holds 0 tokens.
    (Counts are first rounded up to the attention-TP size; buckets are multiples of it
    under this layout, so the bucket does not change.)

Hence, per step: the step replays iff every non-idle rank's own count replays; it replays in
the bucket of its largest count; its padding is ranks x bucket - its real tokens. An eager
step runs every rank eager on its own tokens (SUM_LEN padding: none). Not modelled: the
MegaMoE all-to-all backend, whose graphs may replay per-rank buckets
(`prefill_graph_tolerates_sum_len`), and local refusals other than the size rule (LoRA,
image batches on an unpatched runner, ...).

Optimizing over steps is harder than over batches: a step's fate depends on the buckets of
all its ranks' counts, not of one size, and choosing K buckets that replay the most steps is
NP-hard in general (with counts spaced more than 2x apart each bucket serves one count, and
steps of two busy ranks are the edges of a graph: the most steps replayed by K buckets is the
densest K-vertex subgraph). `optimal_step_buckets` therefore runs the exact histogram DP of
bcgtune.core.plan.optimizer on two item histograms that bracket the true cost, evaluates both
optima under the true rule, refines the better one, and says when the result is proven
optimal (see StepCertificate). With enough buckets to replay every step that can replay
(min_buckets_all_steps) the padding optimum is always proven.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from bcgtune.core.plan.optimizer import (
    CURVE_MAX_POINTS,
    ItemLists,
    Solution,
    batch_costs_ms,
    candidate_rows,
    graph_ms_model,
    measured_graph_ms,
    memory_budget,
    min_buckets_full_replay,
    monotone_graph_ms,
    optimal_item_lists,
)
from bcgtune.core.schema import DP_RANKS_MAX
from bcgtune.core.sglang.ladder import ceil_to
from bcgtune.core.sglang.replay import DEFAULT_PADDING_FACTOR, ListMetrics, assign_buckets
from bcgtune.core.stats import nearest_rank
from bcgtune.errors import InputError

RANKS_MAX = DP_RANKS_MAX


@dataclass(frozen=True)
class DPSteps:
    """Prefill steps of a DP-attention server: for step i, the per-rank forward counts of the
    ranks that ran work (`tokens[offsets[i]:offsets[i + 1]]`, each > 0, with the requests of
    each batch) out of `ranks` attention-DP ranks; the other ranks were idle."""

    ranks: int
    offsets: np.ndarray  # int64, n_steps + 1, first 0, strictly increasing
    tokens: np.ndarray  # int64 per rank-vote, > 0
    requests: np.ndarray  # int64 per rank-vote, >= 1 (1 when unknown)

    def __post_init__(self) -> None:
        off = np.asarray(self.offsets, dtype=np.int64)
        tok = np.asarray(self.tokens, dtype=np.int64)
        req = np.asarray(self.requests, dtype=np.int64)
        if not 1 <= self.ranks <= RANKS_MAX:
            raise InputError(f"must be within 1..{RANKS_MAX}, got {self.ranks}", field="attention_dp_size")
        if off.ndim != 1 or off.size < 2 or off[0] != 0 or off[-1] != tok.size or (np.diff(off) <= 0).any():
            raise InputError("steps need at least one rank count each")
        if tok.shape != req.shape or (tok <= 0).any() or (req < 1).any():
            raise InputError("rank counts must be positive, with at least one request each")
        per_step = np.diff(off)
        if int(per_step.max()) > self.ranks:
            raise InputError(
                f"a step holds {int(per_step.max())} rank counts, more than the {self.ranks} attention-DP ranks",
                field="attention_dp_size",
            )
        object.__setattr__(self, "offsets", off)
        object.__setattr__(self, "tokens", tok)
        object.__setattr__(self, "requests", req)

    @classmethod
    def from_votes(cls, step, tokens, ranks: int, requests=None) -> DPSteps:
        """Steps from one row per (step, rank) with work: `step` is any integer key (rows of
        one key form one step), `tokens` the rank's forward count."""
        key = np.asarray(step, dtype=np.int64)
        tok = np.asarray(tokens, dtype=np.int64)
        req = np.ones_like(tok) if requests is None else np.maximum(np.asarray(requests, dtype=np.int64), 1)
        if key.shape != tok.shape or key.ndim != 1 or key.size == 0:
            raise InputError("steps need a key and a count per rank")
        order = np.argsort(key, kind="stable")
        key, tok, req = key[order], tok[order], req[order]
        starts = np.flatnonzero(np.concatenate([[True], key[1:] != key[:-1]]))
        return cls(ranks, np.concatenate([starts, [key.size]]), tok, req)

    @classmethod
    def one_per_step(cls, sizes, counts) -> DPSteps:
        """Each batch of a histogram as a step of its own on one rank: the per-batch model."""
        s = np.repeat(np.asarray(sizes, dtype=np.int64), np.asarray(counts, dtype=np.int64))
        return cls(1, np.arange(s.size + 1, dtype=np.int64), s, np.ones_like(s))

    @property
    def n_steps(self) -> int:
        return int(self.offsets.size - 1)

    @property
    def starts(self) -> np.ndarray:
        return self.offsets[:-1]

    @property
    def step_of_vote(self) -> np.ndarray:
        return np.repeat(np.arange(self.n_steps), np.diff(self.offsets))

    @property
    def max_tokens(self) -> np.ndarray:
        """Per step, the largest rank count: the count that picks the bucket."""
        return np.maximum.reduceat(self.tokens, self.starts)

    @property
    def real_tokens(self) -> np.ndarray:
        """Per step, the tokens the ranks really run."""
        return np.add.reduceat(self.tokens, self.starts)


def step_outcomes(steps: DPSteps, buckets, factor: float = DEFAULT_PADDING_FACTOR) -> tuple[np.ndarray, np.ndarray]:
    """SGLang's rule per step: (the bucket every rank replays, 0 when above every bucket;
    whether the step replays: every rank's own count replays)."""
    chosen, _ = assign_buckets(steps.max_tokens, buckets, factor)
    _, vote = assign_buckets(steps.tokens, buckets, factor)
    return chosen, np.logical_and.reduceat(vote, steps.starts)


def step_padding(steps: DPSteps, chosen: np.ndarray, replay: np.ndarray) -> np.ndarray:
    """Padded tokens per replayed step: every rank pads to the bucket (idle ranks run it
    whole); 0 for eager steps."""
    return np.where(replay, steps.ranks * chosen - steps.real_tokens, 0)


def evaluate_steps(steps: DPSteps, buckets, name: str = "", factor: float = DEFAULT_PADDING_FACTOR) -> ListMetrics:
    """The metrics of a bucket list on steps (ListMetrics, counted in steps: `batches` are
    steps, `replayed_tokens` the real tokens of replayed steps)."""
    bl = sorted(int(b) for b in buckets)
    chosen, replay = step_outcomes(steps, bl, factor)
    pad = step_padding(steps, chosen, replay)
    n = steps.n_steps
    n_rep = int(replay.sum())
    padded = int(pad.sum())
    rep_tokens = int(steps.real_tokens[replay].sum())
    p99 = int(nearest_rank(pad[replay], np.ones(n_rep, dtype=np.int64), 99)) if n_rep else 0
    used = np.isin(np.asarray(bl, dtype=np.int64), chosen[replay])
    unused = int((~used).sum()) if bl else 0
    return ListMetrics.from_counts(name, bl, n, n_rep, rep_tokens, padded, p99, unused)


# ---- time ------------------------------------------------------------------------------
def step_costs_ms(steps: DPSteps, cal) -> tuple[np.ndarray, np.ndarray]:
    """(eager, break) time per step under a calibration: the ranks run in parallel, so a
    step costs its slowest rank (eager on its own tokens; between graph segments, eager on
    its own rows)."""
    eager, brk = batch_costs_ms(cal, steps.tokens, steps.requests)
    return np.maximum.reduceat(eager, steps.starts), np.maximum.reduceat(brk, steps.starts)


def predicted_step_time_ms(
    steps: DPSteps, buckets, cal, factor: float = DEFAULT_PADDING_FACTOR, candidates: str = "trace"
) -> float:
    """Predicted prefill time of the steps under a list: a replayed step costs its bucket's
    graph (every rank replays it in parallel) plus its slowest rank's break time, an eager
    step its slowest rank's eager time."""
    chosen, replay = step_outcomes(steps, buckets, factor)
    eager, brk = step_costs_ms(steps, cal)
    graph = graph_ms_model(cal, np.where(replay, chosen, 1), candidates)
    return float(np.where(replay, graph + brk, eager).sum())


# ---- the optimizer ---------------------------------------------------------------------
@dataclass(frozen=True)
class StepCertificate:
    """How sure the step optimum is. `proven`: no list within the constraints does better,
    by one of: every step has one distinct rank count (the histogram DP is then exact), the
    relaxation's bound is met, or (padding) the upper surrogate's optimum replays every step
    that any list can replay. `bound`: a lower bound on the objective ((eager steps, padded
    tokens) for padding, ms for time), None when none is known."""

    proven: bool
    how: str
    bound: tuple[int, int] | float | None = None


@dataclass
class StepOptimum:
    solution: Solution  # counted in steps: eager_batches are eager steps
    certificate: StepCertificate
    always_eager: int  # steps no allowed list can replay (a rank's count fits no bucket)


def _replayable(tokens: np.ndarray, align: int, max_bucket: int | None, factor: float) -> np.ndarray:
    """Counts some allowed bucket can replay: a multiple of `align` in [n, factor n], <= max_bucket."""
    lim = np.floor(factor * tokens.astype(np.float64)).astype(np.int64)
    if max_bucket is not None:
        lim = np.minimum(lim, max_bucket)
    return (lim // align) * align >= tokens


class _Items(NamedTuple):
    """An item histogram for optimal_item_lists: distinct sizes and per-size sums."""

    sizes: np.ndarray
    eager: np.ndarray
    weight: np.ndarray
    offset: np.ndarray


def _histogram(sizes: np.ndarray, eager: np.ndarray, weight: np.ndarray, offset: np.ndarray) -> _Items:
    """Items (one size each, with per-item costs) folded by size: the distinct sizes
    ascending and the per-size sums."""
    uniq, inv = np.unique(sizes, return_inverse=True)

    def fold(c: np.ndarray) -> np.ndarray:
        if c.dtype.kind == "f":
            return np.bincount(inv, weights=c, minlength=uniq.size)
        acc = np.zeros(uniq.size, dtype=np.int64)
        np.add.at(acc, inv, c)
        return acc

    return _Items(uniq, fold(eager), fold(weight), fold(offset))


@dataclass(frozen=True)
class _Bounds:
    """The constraints every list obeys, as optimal_item_lists takes them."""

    max_buckets: int
    align: int
    max_bucket: int | None
    factor: float
    graph: Callable | None = None
    fixed_cand: np.ndarray | None = None
    allowed: Callable | None = None

    def solve(self, items: _Items) -> ItemLists:
        return optimal_item_lists(
            items.sizes,
            items.eager,
            items.weight,
            items.offset,
            self.max_buckets,
            align=self.align,
            max_bucket=self.max_bucket,
            factor=self.factor,
            graph=self.graph,
            fixed_cand=self.fixed_cand,
            allowed=self.allowed,
        )


def _other_counts(steps: DPSteps) -> tuple[np.ndarray, np.ndarray]:
    """(step, count) of each distinct rank count of a step other than its largest: the votes
    that can turn a step eager without setting its bucket."""
    sid = steps.step_of_vote
    top = steps.max_tokens[sid]
    keep = steps.tokens < top
    pairs = np.unique(np.stack([sid[keep], steps.tokens[keep]]), axis=1) if keep.any() else np.zeros((2, 0), np.int64)
    return pairs[0], pairs[1]


def _subset(steps: DPSteps, mask: np.ndarray) -> DPSteps:
    lengths = np.diff(steps.offsets)[mask]
    vm = np.repeat(mask, np.diff(steps.offsets))
    return DPSteps(steps.ranks, np.concatenate([[0], np.cumsum(lengths)]), steps.tokens[vm], steps.requests[vm])


def optimal_step_buckets(
    steps: DPSteps, max_buckets: int, align: int = 1, max_bucket: int | None = None, factor: float = DEFAULT_PADDING_FACTOR
) -> StepOptimum:
    """At most `max_buckets` buckets (multiples of `align`, none above `max_bucket`) for the
    fewest eager steps, then the fewest padded tokens, under SGLang's DP-attention rule.

    Steps some rank of which no allowed bucket can replay are eager whatever the list; the
    rest are priced by two item histograms solved exactly by the histogram DP:
      R (relaxation, <= the true cost of every list): one item per step at its largest count,
        eager cost BIG, weight `ranks`, offset the step's real tokens: the step's other
        ranks' votes are ignored;
      U (>= the true cost of every list): R plus one item per other distinct count of a
        step, eager cost BIG, weight 0: a step costs BIG for each rank count that fails.
    Both optima are evaluated under the true rule and the better one is kept, per K; at the
    largest K it is then refined (_refine: U solved again on the steps it replays). It is
    proven optimal when it meets R's optimum, or when U's optimum leaves no step eager (a
    list with an eager step costs at least BIG, more than any list without one)."""
    if max_buckets < 1:
        raise InputError(f"must be at least 1, got {max_buckets}", field="max_buckets")
    ok_vote = _replayable(steps.tokens, align, max_bucket, factor)
    live = np.logical_and.reduceat(ok_vote, steps.starts)
    dead = int(steps.n_steps - live.sum())
    if not live.any():
        _no_step_replays(steps, align, max_bucket)
        sol = Solution(
            buckets=[],
            cost=0.0,
            eager_batches=steps.n_steps,
            padded_tokens=0,
            curve=[{"k": 1, "buckets": [], "eager_batches": steps.n_steps, "padded_tokens": 0, "cost": 0.0}],
        )
        return StepOptimum(sol, StepCertificate(True, "no allowed bucket replays any step", (steps.n_steps, 0)), dead)
    sub = _subset(steps, live)
    cap = max_bucket if max_bucket is not None else int(ceil_to(int(sub.tokens.max()), align))
    big = sub.ranks * sub.n_steps * int(ceil_to(cap, align)) + 1
    bounds = _Bounds(max_buckets, align, max_bucket, factor)
    lower = bounds.solve(_padding_items(sub, big, others=False))
    coupled = bool(_other_counts(sub)[0].size)
    upper = bounds.solve(_padding_items(sub, big, others=True)) if coupled else lower

    def true_key(bl: list[int]) -> tuple[int, int, int]:
        m = evaluate_steps(steps, bl, factor=factor)
        return (m.eager_batches, m.padded_tokens, len(bl))

    def resolve(mask: np.ndarray) -> list[int]:
        return bounds.solve(_padding_items(_subset(sub, mask), big, others=True)).lists[-1]

    per_k = _best_per_k([lower.lists, upper.lists], true_key, max_buckets)
    if coupled:
        per_k[-1] = _refine(sub, per_k[-1], true_key, resolve, factor)
    key, buckets = per_k[-1]
    key, buckets = next(p for p in per_k if p[0][:2] == key[:2])  # the fewest buckets among the best
    # certificate
    lb_costs = lower.costs[min(len(lower.costs), max_buckets) - 1]
    bound = (dead + int(lb_costs // big), int(lb_costs % big))
    u_list = upper.lists[min(len(upper.lists), max_buckets) - 1]
    u_eager = evaluate_steps(sub, u_list, factor=factor).eager_batches
    if not coupled:
        cert = StepCertificate(True, "every step has one distinct rank count: the histogram DP is exact", bound)
    elif key[:2] == bound:
        cert = StepCertificate(True, "meets the lower bound of the relaxation that ignores the smaller ranks' votes", bound)
    elif u_eager == 0:
        cert = StepCertificate(True, "the upper bound's optimum replays every step that any allowed list can replay", bound)
    else:
        cert = StepCertificate(False, f"no list has fewer than {bound[0]:,} eager steps", bound)
    curve = []
    for k, (kk, lst) in enumerate(per_k[:CURVE_MAX_POINTS], start=1):
        curve.append({"k": k, "buckets": lst, "eager_batches": kk[0], "padded_tokens": kk[1], "cost": float(kk[0]) * big + kk[1]})
    sol = Solution(
        buckets=buckets,
        cost=float(key[0]) * big + key[1],
        eager_batches=key[0],
        padded_tokens=key[1],
        curve=curve,
        objective="padding",
        candidates=upper.candidates,
    )
    return StepOptimum(sol, cert, dead)


def optimal_step_buckets_time(
    steps: DPSteps,
    max_buckets: int,
    cal,
    align: int = 1,
    max_bucket: int | None = None,
    factor: float = DEFAULT_PADDING_FACTOR,
    candidates: str = "trace",
    max_graph_mem_gib: float | None = None,
) -> StepOptimum:
    """Least predicted step time (predicted_step_time_ms) with at most `max_buckets`
    buckets. As optimal_step_buckets, with R: one item per step at its largest count (eager
    cost the step's eager time, weight 1, offset minus its break time) and U: R plus each
    other distinct count of a step at the step's eager time when it fails. Eager can beat
    replay here, so a U optimum without eager steps proves nothing and R is not a lower
    bound; the result is proven only when every step has one distinct count, or when it
    meets the per-step bound (each step at its best bucket or eager, ignoring K and the
    graph-memory budget `max_graph_mem_gib`, which the lists keep)."""
    if max_buckets < 1:
        raise InputError(f"must be at least 1, got {max_buckets}", field="max_buckets")
    rows = _calibration_rows(cal, align, max_bucket) if candidates == "calibration" else None
    eager, brk = step_costs_ms(steps, cal)
    if (eager < 0).any() or (brk < 0).any():
        raise InputError("calibration predicts a negative time inside the trace's size range")
    ok_vote = _replayable(steps.tokens, align, max_bucket, factor)
    live = np.logical_and.reduceat(ok_vote, steps.starts)
    dead_ms = float(eager[~live].sum())
    if not live.any():
        _no_step_replays(steps, align, max_bucket)
        sol = Solution(
            buckets=[],
            cost=dead_ms,
            eager_batches=steps.n_steps,
            padded_tokens=0,
            objective="time",
            curve=[{"k": 1, "buckets": [], "eager_batches": steps.n_steps, "padded_tokens": 0, "cost": dead_ms}],
        )
        return StepOptimum(sol, StepCertificate(True, "no allowed bucket replays any step", dead_ms), steps.n_steps)
    sub = _subset(steps, live)
    e_live, b_live = eager[live], brk[live]

    def graph(b):
        return monotone_graph_ms(cal, b) if rows is None else measured_graph_ms(cal, b)

    allowed = None if max_graph_mem_gib is None else memory_budget(cal, max_graph_mem_gib)
    bounds = _Bounds(max_buckets, align, max_bucket, factor, graph, rows, allowed)
    lower = bounds.solve(_time_items(sub, e_live, b_live, others=False))
    coupled = bool(_other_counts(sub)[0].size)
    upper = bounds.solve(_time_items(sub, e_live, b_live, others=True)) if coupled else lower

    def cost(bl: list[int]) -> tuple[float, int]:
        return (predicted_step_time_ms(steps, bl, cal, factor, candidates if rows is not None else "trace"), len(bl))

    def resolve(mask: np.ndarray) -> list[int]:
        return bounds.solve(_time_items(_subset(sub, mask), e_live[mask], b_live[mask], others=True)).lists[-1]

    per_k_t = _best_per_k([lower.lists, upper.lists], cost, max_buckets)
    if coupled:
        per_k_t[-1] = _refine(sub, per_k_t[-1], cost, resolve, factor)
    (best_ms, _), buckets = min(per_k_t, key=lambda o: o[0])
    # per-step bound: each live step at its cheapest allowed bucket or eager
    bound = dead_ms + _per_step_bound_ms(sub, e_live, b_live, graph, align, max_bucket, factor, rows)
    tol = 1e-9 * max(1.0, abs(best_ms))
    if not coupled:
        cert = StepCertificate(True, "every step has one distinct rank count: the histogram DP is exact", bound)
    elif best_ms <= bound + tol:
        cert = StepCertificate(True, "meets the per-step bound", bound)
    else:
        cert = StepCertificate(False, f"no list predicts less than {bound:,.1f} ms", bound)
    m_best = evaluate_steps(steps, buckets, factor=factor)
    curve = []
    for k, ((ms, _), lst) in enumerate(per_k_t[:CURVE_MAX_POINTS], start=1):
        m = evaluate_steps(steps, lst, factor=factor)
        curve.append({"k": k, "buckets": lst, "eager_batches": m.eager_batches, "padded_tokens": m.padded_tokens, "cost": ms})
    sol = Solution(
        buckets=buckets,
        cost=best_ms,
        eager_batches=m_best.eager_batches,
        padded_tokens=m_best.padded_tokens,
        curve=curve,
        objective="time",
        candidates=upper.candidates,
    )
    return StepOptimum(sol, cert, int((~live).sum()))


def _calibration_rows(cal, align: int, max_bucket: int | None) -> np.ndarray:
    """The calibration's measured sizes that may be buckets (candidates from a calibration)."""
    rows = candidate_rows(cal)
    rows = rows[rows % align == 0]
    if max_bucket is not None:
        rows = rows[rows <= max_bucket]
    if rows.size == 0:
        raise InputError(
            f"no calibration row is a multiple of {align}" + (f" at or below {max_bucket}" if max_bucket else ""),
            field="candidates",
        )
    return rows


def _no_step_replays(steps: DPSteps, align: int, max_bucket: int | None) -> None:
    """No step can replay: refused, as for batches, when the largest bucket allowed is below
    every count (then the limit is the mistake); otherwise every step runs eager."""
    smallest = ceil_to(int(steps.tokens.min()), align)
    if max_bucket is not None and smallest > max_bucket:
        raise InputError(
            f"{max_bucket} is below every traced size (the smallest needs a bucket of {smallest})", field="max_bucket"
        )


def _padding_items(steps: DPSteps, big: int, others: bool) -> _Items:
    """The item histogram of the padding objective: R (others False) or U (others True)."""
    one = np.ones(steps.n_steps, dtype=np.int64)
    top, real = steps.max_tokens, steps.real_tokens
    if not others:
        return _histogram(top, big * one, steps.ranks * one, real)
    _, o_size = _other_counts(steps)
    zeros = np.zeros(o_size.size, dtype=np.int64)
    return _histogram(
        np.concatenate([top, o_size]),
        np.concatenate([big * one, big + zeros]),
        np.concatenate([steps.ranks * one, zeros]),
        np.concatenate([real, zeros]),
    )


def _time_items(steps: DPSteps, eager: np.ndarray, brk: np.ndarray, others: bool) -> _Items:
    """The item histogram of the time objective: R (others False) or U (others True)."""
    one = np.ones(steps.n_steps)
    top = steps.max_tokens
    if not others:
        return _histogram(top, eager, one, -brk)
    o_step, o_size = _other_counts(steps)
    zeros = np.zeros(o_size.size)
    return _histogram(
        np.concatenate([top, o_size]),
        np.concatenate([eager, eager[o_step]]),
        np.concatenate([one, zeros]),
        np.concatenate([-brk, zeros]),
    )


REFINE_ROUNDS = 4


def _refine(live: DPSteps, best: tuple[tuple, list[int]], key, resolve, factor: float) -> tuple[tuple, list[int]]:
    """Improve the best list found: the steps it leaves eager are taken as given, and the
    upper bound is solved again on the steps it replays (`resolve(mask)`; a list that
    replays all of those may replay others too). Kept only where the true key improves; a
    few rounds at most."""
    for _ in range(REFINE_ROUNDS):
        _, replay = step_outcomes(live, best[1], factor)
        if replay.all() or not replay.any():
            break
        cand = resolve(replay)
        k = key(cand)
        if k[:-1] >= best[0][:-1]:
            break
        best = (k, cand)
    return best


def _best_per_k(sources: list[list[list[int]]], key, max_buckets: int) -> list[tuple[tuple, list[int]]]:
    """Per k, the best list under the true `key` (a tuple; smaller is better, ties to the
    fewer buckets) among the sources' optima for k buckets, or a smaller k's ("at most k").
    Every k up to the curve's length is evaluated, then the largest k: evaluating thousands
    of lists would cost more than the DP that found them."""
    K = min(max_buckets, max(len(s) for s in sources))
    ks = sorted(set(range(min(K, CURVE_MAX_POINTS))) | {K - 1})
    out: list[tuple[tuple, list[int]]] = []
    for k in ks:
        options = [(key(lst[min(k, len(lst) - 1)]), lst[min(k, len(lst) - 1)]) for lst in sources]
        best = min(options, key=lambda o: o[0])
        if out and out[-1][0][:-1] <= best[0][:-1]:
            best = out[-1]
        out.append(best)
    return out


def _per_step_bound_ms(steps: DPSteps, eager, brk, graph, align, max_bucket, factor, rows) -> float:
    """Sum over steps of min(eager, least graph time of an allowed bucket in [max count,
    factor x max count] + break): no list of any length does better."""
    top = steps.max_tokens
    if rows is None:
        b = ceil_to(top, align)
        ok = b <= np.floor(factor * top.astype(np.float64))
        if max_bucket is not None:
            ok &= b <= max_bucket
        g = np.where(ok, np.asarray(graph(np.where(ok, b, align)), dtype=np.float64), np.inf)
    else:
        gr = np.asarray(graph(rows), dtype=np.float64)
        lo = np.searchsorted(rows, top, side="left")
        hi = np.searchsorted(rows, np.floor(factor * top.astype(np.float64)), side="right")
        g = np.array([gr[a:z].min() if z > a else np.inf for a, z in zip(lo.tolist(), hi.tolist())])
    return float(np.minimum(eager, g + brk).sum())


def min_buckets_all_steps(
    steps: DPSteps, align: int = 1, max_bucket: int | None = None, factor: float = DEFAULT_PADDING_FACTOR
) -> tuple[list[int], int]:
    """The fewest buckets that replay every step that can replay at all (every rank count of
    it fits some allowed bucket), and how many steps that is: the greedy stabbing of
    min_buckets_full_replay over the rank counts of those steps."""
    ok_vote = _replayable(steps.tokens, align, max_bucket, factor)
    live = np.logical_and.reduceat(ok_vote, steps.starts)
    if not live.any():
        return [], 0
    vm = np.repeat(live, np.diff(steps.offsets))
    _, lst = min_buckets_full_replay(steps.tokens[vm], align, max_bucket, factor)
    return lst, int(live.sum())
