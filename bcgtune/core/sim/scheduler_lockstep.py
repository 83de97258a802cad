"""SGLang's scheduler under DP attention (dp_size > 1 with --enable-dp-attention): the ranks
run every scheduler iteration together, as SGLang's MLP sync makes them
(srt/managers/scheduler_components/dp_attn.py, prepare_mlp_sync_batch_raw). The event loop
of bcgtune/core/sim/scheduler.py with one step for all ranks; pure, like it.
"""

from __future__ import annotations

from heapq import heappush
from typing import cast

import numpy as np

from bcgtune.core.sim.scheduler import EVENT_STEP, Phase, Rank, StepRecorder, decode_steps_before
from bcgtune.errors import InputError


def _envelope_segments(a: np.ndarray, b: np.ndarray, k: int) -> list[tuple[int, int, float, float]]:
    """Step i (0 <= i < k) of lockstep decoding takes max over ranks of a_r + b_r i: the
    upper envelope of lines of non-negative slope, as segments (i0, i1, a, b) of the line
    that is highest on [i0, i1)."""
    segs = []
    i0 = 0
    while i0 < k:
        vals = a + b * i0
        top = vals.max()
        cur = int(np.flatnonzero(vals == top)[np.argmax(b[vals == top])])
        ac, bc = float(a[cur]), float(b[cur])
        steeper = b > bc
        i1 = k
        if steeper.any():
            # the first integer i > i0 where a steeper line rises above the current one
            x = np.minimum((ac - a[steeper]) / (b[steeper] - bc), float(k))  # beyond k: never within the jump
            cross = np.floor(x).astype(np.int64) + 1
            i1 = int(min(k, max(i0 + 1, int(cross.min()))))
        segs.append((i0, i1, ac, bc))
        i0 = i1
    return segs


def lockstep_decode(a: np.ndarray, b: np.ndarray, k: int, horizon: float | None) -> tuple[int, float]:
    """Decode steps to run together (at most k; with a `horizon`, until the first step that
    starts at or after it, as decode_steps_before) and their total time."""
    n = k
    if horizon is not None:
        start = 0.0  # time of the steps before the segment
        for i0, i1, ac, bc in _envelope_segments(a, b, k):
            a0 = ac + bc * i0
            c = decode_steps_before(horizon - start, a0, bc, i1 - i0 + 1)
            if i0 + c <= i1:
                n = i0 + c
                break
            m = i1 - i0
            start += a0 * m + bc * m * (m - 1) / 2.0
    total = 0.0
    for i0, i1, ac, bc in _envelope_segments(a, b, n):
        m = i1 - i0
        total += (ac + bc * i0) * m + bc * m * (m - 1) / 2.0
    return n, total


class LockstepPhase(Phase):
    """The phase under DP attention (dp_size > 1): as SGLang's ranks do
    (srt/managers/scheduler_components/dp_attn.py, prepare_mlp_sync_batch_raw), every rank
    runs each scheduler iteration together: a rank with a prefill batch runs it, a rank with
    running requests decodes one step, and the others run an idle batch; the iteration lasts
    as long as its slowest rank. Iterations in which no rank prefills are jumped in closed
    form, each decode step as long as the slowest rank's. Each batch records its iteration
    (`step`), and the ranks that decode in a prefill iteration are recorded as decode votes
    (SGLang views their rows as one-token extends that vote on the step's graph and pad to
    its bucket, dp_attn.py `_local_prefill_cuda_graph_vote`)."""

    __slots__ = ()

    def _prefills(self, t: float, step: int) -> tuple[list[bool], list[tuple[Rank, tuple]]]:
        """Each rank's part of the iteration: whether it owes a decode step (prefill-decode
        interval), and the prefill batches formed (rank, (time, completed, mixed rows))."""
        deferred = []
        prefills = []
        for r in self.ranks:
            d = False
            if r.pdi > 0:
                if r.n_run > 0:
                    r.pdi -= 1
                    d = True
                else:
                    r.pdi = 0
            deferred.append(d)
            if not d and (r.waiting or r.chunked >= 0):
                batch = self._form_batch(r, t, step)
                if batch is not None:
                    prefills.append((r, batch))
        return deferred, prefills

    def _check_room(self) -> None:
        """Nothing runs anywhere, yet a rank has work: only a KV pool too small for one request."""
        for r in self.ranks:
            if r.waiting or r.chunked >= 0:
                rid = r.waiting[0] if r.waiting else r.chunked
                raise InputError(
                    f"a KV pool of {self.server.kv_cap} tokens leaves no room for a waiting request of "
                    f"{self.prompt[rid]} prompt tokens",
                    field="max_total_tokens",
                )

    def _on_arrival(self, t: float, rid: int) -> None:
        """Round-robin to a rank; start an iteration if none is pending."""
        sim = self.sim
        r = self.ranks[sim.next_rank % len(self.ranks)]
        sim.next_rank += 1
        r.waiting.append(rid)
        if not sim.busy:
            sim.busy = True
            heappush(self.heap, (t, next(self.seq), EVENT_STEP, -1))

    def _on_step(self, t: float, _idx: int) -> None:
        """One iteration of every rank (or a jump of decode-only iterations)."""
        sim, s = self.sim, self.server
        step = sim.iteration
        deferred, prefills = self._prefills(t, step)
        decoding = [r for r in self.ranks if r.n_run > 0 and not any(p[0] is r for p in prefills)]
        if not prefills and not decoding:
            self._check_room()
            sim.busy = False
            return
        a = np.array([s.dec_base + s.dec_row * r.n_run + s.dec_kv * r.ctx for r in decoding])
        b = np.array([s.dec_kv * r.n_run for r in decoding])
        if prefills:
            k = 1
            dur = max([batch[0] for _, batch in prefills] + ([float(a.max())] if decoding else []))
            for r in decoding:
                cast(StepRecorder, self.rec).decode_vote(step, r.idx, r.n_run)
        else:
            k = min(r.fin[0][0] - r.tick for r in decoding)
            for r in decoding:
                if deferred[r.idx]:
                    k = min(k, 1 + r.pdi)
            k, dur = lockstep_decode(a, b, k, (self.heap[0][0] - t) if self.heap else None)
        te = t + dur
        for r, (_, finishing, rows) in prefills:
            self._after_prefill(r, finishing, rows, te, wake=False)
        for r in decoding:
            if deferred[r.idx] and k > 1:
                r.pdi -= k - 1
            r.tick += k
            r.ctx += r.n_run * k
            self.rec.decode_steps += k
            self._finish_due(r, te)
        sim.iteration += k
        heappush(self.heap, (te, next(self.seq), EVENT_STEP, -1))
