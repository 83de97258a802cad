"""SGLang's scheduler, played against a benchmark client's requests: the event loop of one
bench_serving run (bcgtune/adapters/bench_serving/simulator.py draws the requests and drives the runs),
recording every prefill forward as a log trace would.

Scheduler rules (sglang 0.5.23, srt/managers/scheduler.py `get_next_batch_to_run`,
`_get_new_batch_prefill_raw`; srt/managers/schedule_policy.py `PrefillAdder`):
  * each iteration: a prefill batch when requests wait or a chunked request continues and
    one can be admitted, else one decode step for every running request;
  * budgets rem_chunk = chunked_prefill_size - mixed, rem_input = max_prefill_tokens - mixed
    (mixed = running decode rows under --enable-mixed-chunk); each admitted extend is charged
    page-rounded; admission stops once either budget is spent;
  * the continuing chunked request goes first, then FCFS (what --disable-radix-cache forces;
    random prompts share no prefix, so no cache hits are modelled either way);
  * a request that overflows the chunk budget is cut to the remaining budget (exactly, on the
    ignore_eos + --disable-radix-cache path bench_serving takes; floored to a page otherwise),
    becomes the chunked request and the batch stops there;
  * new requests stop at max_running_requests - running (the chunked request holds a row);
  * KV room (only when max_total_tokens is given): prompt + min(max_new, 4096) + page must fit
    beside what running requests hold and will still write (ignore_eos: all of max_new);
  * --prefill-decode-interval K: K decode iterations after each prefill batch;
  * mixed chunk adds one decode row per running request to the prefill forward.
  * a batch carries images when any of its requests has images: every chunk of a chunked
    image request, and under mixed chunk also image requests' decode rows (the forward
    batch's multimodal inputs list every request in the batch).
  * --dp-size N: N schedulers fed round-robin in arrival order, stepping independently; under
    DP attention each gets chunked_prefill_size / N and max_running_requests / N and the
    ranks run every iteration together, as SGLang's MLP sync makes them (scheduler_lockstep.py:
    idle ranks run an idle batch, an iteration lasts as long as its slowest rank, and each
    batch records its step).
The loop also plays the client's side that interleaves with the server's events
(sglang/benchmark/serving.py): a semaphore of max_concurrency, and releases at the send
times it is given (all at once for request_rate inf).

Time is event-driven (heapq) and decode steps are jumped in closed form between events, so
cost grows with requests and prefill batches, not with decode steps. Memory is bounded: at
most `schema.REQUESTS_MAX` requests (the workload refuses more) and `BATCHES_MAX` recorded
batches. Pure: no printing, no files; `Simulation(..., progress=fn)` reports requests done.
"""

from __future__ import annotations

import itertools
import math
from array import array
from collections import deque
from collections.abc import Callable
from heapq import heappop, heappush
from typing import cast

import numpy as np

from bcgtune.core.sim.workload import StepTimeModel, Workload
from bcgtune.errors import InputError

CLIP_MAX_NEW_TOKENS = 4096  # schedule_policy.py: max_new estimate cap for KV admission
# Prefill batches one simulation may record (~64 bytes each): far above the ~6 million that
# `schema.REQUESTS_MAX` requests of a typical workload produce.
BATCHES_MAX = 20_000_000
PROGRESS_STEPS = 1000  # progress reports per simulation, at most (plus the first and last)

ProgressFn = Callable[[int, int], None]

EVENT_ARRIVE, EVENT_STEP, EVENT_DONE, EVENT_RELEASE = 0, 1, 2, 3


# ---- state -----------------------------------------------------------------------------------


class _Server:
    """The settings each scheduler step reads, resolved once; times in seconds."""

    __slots__ = (
        "chunk",
        "dec_base",
        "dec_kv",
        "dec_row",
        "exact_cut",
        "half_rtt",
        "kv_cap",
        "max_prefill",
        "max_run",
        "mixed",
        "page",
        "pdi",
        "per_req_s",
        "pre_s",
        "prefill_s",
        "step",
        "vision_s",
    )

    def __init__(self, w: Workload, prefill_s: list[float]):
        step = w.step
        self.chunk = w.resolved_chunked_prefill_size
        self.max_prefill = w.max_prefill_tokens
        self.max_run = w.resolved_max_running_requests
        self.page = w.page_size
        self.mixed = w.enable_mixed_chunk
        self.pdi = w.prefill_decode_interval
        self.exact_cut = w.disable_radix_cache
        self.kv_cap = w.max_total_tokens
        self.half_rtt = step.client_rtt_ms / 2000.0
        self.pre_s = step.image_preprocess_ms / 1000.0
        self.per_req_s = step.prefill_per_req_ms / 1000.0
        self.vision_s = step.vision_ms_per_image / 1000.0
        self.dec_base = step.decode_base_ms / 1000.0
        self.dec_row = step.decode_per_row_ms / 1000.0
        self.dec_kv = step.decode_per_ctx_token_ms / 1000.0
        self.step: StepTimeModel = step
        self.prefill_s = prefill_s

    def prefill_time(self, tokens: int) -> float:
        """Prefill forward time (s) of a size beyond the table."""
        return float(self.step.prefill_ms(np.array([tokens]))[0]) / 1000.0


class Rank:
    """One scheduler (DP rank): its queue, its running requests and its decode clock."""

    __slots__ = (
        "busy",
        "chunk_done",
        "chunked",
        "committed",
        "ctx",
        "fin",
        "idx",
        "img_run",
        "n_run",
        "pdi",
        "tick",
        "waiting",
    )

    def __init__(self, idx: int):
        self.idx = idx
        self.waiting: deque[int] = deque()  # arrived, not admitted (FCFS)
        self.chunked = -1  # the request being prefilled chunk by chunk, or -1
        self.chunk_done = 0  # its prompt tokens prefilled so far
        self.n_run = 0  # running (decoding) requests
        self.ctx = 0  # their context tokens (KV read per decode step)
        self.fin: list[tuple[int, int]] = []  # heap of (decode tick of the last token, request)
        self.tick = 0  # decode steps run so far
        self.committed = 0  # KV tokens held or promised to admitted requests
        self.pdi = 0  # decode iterations still owed before the next prefill
        self.busy = False  # a scheduler step is pending
        self.img_run = 0  # running requests that carry images


class Recorder:
    """The per-batch columns of the trace. Rows are appended to lists (fast) and moved to
    typed arrays (8 bytes a value at most) every FLUSH_ROWS rows, so memory stays ~64
    bytes a batch."""

    COLUMNS: tuple[tuple[str, str], ...] = (
        ("forward_tokens", "q"),
        ("new_seq", "q"),
        ("new_token", "q"),
        ("running_req", "q"),
        ("queue_req", "q"),
        ("images", "b"),
        ("time_s", "d"),
        ("rank", "i"),
    )
    FLUSH_ROWS = 1 << 16
    __slots__ = ("arrays", "decode_steps", "flushed", "rows")

    def __init__(self) -> None:
        self.arrays = [array(code) for _, code in self.COLUMNS]
        self.rows: list[list] = [[] for _ in self.COLUMNS]
        self.flushed = 0
        self.decode_steps = 0

    def batch(
        self, forward: int, new_seq: int, new_token: int, running: int, queue: int, images: int, t: float, rank: int
    ) -> None:
        rows = self.rows
        rows[0].append(forward)
        rows[1].append(new_seq)
        rows[2].append(new_token)
        rows[3].append(running)
        rows[4].append(queue)
        rows[5].append(images)
        rows[6].append(t)
        rows[7].append(rank)
        if len(rows[0]) >= self.FLUSH_ROWS:
            self._flush()

    def _flush(self) -> None:
        self.flushed += len(self.rows[0])
        if self.flushed > BATCHES_MAX:
            raise InputError(f"the simulation passed {BATCHES_MAX:,} prefill batches: shorten the workload")
        for arr, rows in zip(self.arrays, self.rows):
            arr.extend(rows)
            rows.clear()

    def __len__(self) -> int:
        return self.flushed + len(self.rows[0])

    def columns(self) -> dict[str, array]:
        self._flush()
        return {name: arr for (name, _), arr in zip(self.COLUMNS, self.arrays)}


class StepRecorder(Recorder):
    """The recorder of a DP-attention simulation: each batch also carries its step (the
    iteration every rank ran together), and ranks that decoded during another rank's
    prefill step are kept as (step, rank, rows): their rows vote and pad with the step."""

    COLUMNS = Recorder.COLUMNS + (("step", "q"),)
    __slots__ = ("dec_rank", "dec_rows", "dec_step")

    def __init__(self) -> None:
        super().__init__()
        self.dec_step = array("q")
        self.dec_rank = array("i")
        self.dec_rows = array("q")

    def batch_step(
        self, step: int, forward: int, new_seq: int, new_token: int, running: int, queue: int, images: int, t: float, rank: int
    ) -> None:
        self.rows[8].append(step)
        self.batch(forward, new_seq, new_token, running, queue, images, t, rank)

    def decode_vote(self, step: int, rank: int, rows: int) -> None:
        self.dec_step.append(step)
        self.dec_rank.append(rank)
        self.dec_rows.append(rows)


class PhaseRequests:
    """One phase's requests: prompt tokens, output tokens, images, KV need (admission), as
    lists (the scheduler indexes them per event)."""

    __slots__ = ("kv_need", "n_img", "out", "prompt")

    def __init__(self, prompt: np.ndarray, out: np.ndarray, n_img: np.ndarray, page: int):
        kv_need = -(-prompt // page) * page + np.minimum(out, CLIP_MAX_NEW_TOKENS) + page
        self.prompt: list[int] = prompt.tolist()
        self.out: list[int] = out.tolist()
        self.n_img: list[int] = n_img.tolist()
        self.kv_need: list[int] = kv_need.tolist()


class Simulation:
    """What lasts across phases and levels: the ranks, the round-robin pointer, the recorder,
    the progress count."""

    __slots__ = (
        "_every",
        "busy",
        "completed",
        "iteration",
        "lockstep",
        "next_rank",
        "next_report",
        "progress",
        "ranks",
        "rec",
        "reported",
        "server",
        "total",
    )

    def __init__(self, w: Workload, prefill_s: list[float], progress: ProgressFn | None):
        self.server = _Server(w, prefill_s)
        self.ranks = [Rank(i) for i in range(w.dp_size)]
        self.next_rank = 0
        # DP attention: the ranks run every scheduler iteration together
        self.lockstep = w.enable_dp_attention and w.dp_size > 1
        self.rec = StepRecorder() if self.lockstep else Recorder()
        self.iteration = 0  # lockstep iterations so far (the step of each batch)
        self.busy = False  # lockstep: an iteration is pending
        self.total = w.total_requests
        self.completed = 0  # requests of finished phases
        self.progress = progress
        self.reported = 0
        self._every = max(1, self.total // PROGRESS_STEPS)
        self.next_report = self._every if progress is not None else self.total + 1
        if progress is not None:
            progress(0, self.total)

    def report(self, phase_done: int = 0) -> None:
        """Progress, with `phase_done` completions of the running phase on top of `completed`."""
        done = self.completed + phase_done
        if self.progress is not None and done != self.reported:
            self.progress(done, self.total)
            self.reported = done
            self.next_report = done + self._every


# ---- the scheduler: one bench_serving run ----------------------------------------------------


def decode_steps_before(horizon: float, a: float, b: float, cap: int) -> int:
    """Decode steps to run until the next event, `horizon` seconds away, at most `cap` (>= 1).
    Step i (from 0) takes a + b i seconds (the context grows), so step j starts at
    S(j) = a j + b j (j-1)/2; the count is 1 plus the steps j >= 1 with S(j) < horizon. S is
    non-decreasing (a > 0, b >= 0), so those steps are j = 1..j*, and the count is found
    exactly: a closed-form guess checked against S, or, when the guess is far off (extreme
    step times), a bisection; never more than ~64 evaluations of S."""
    if horizon <= 0:
        return 1
    if a * cap + b * cap * (cap - 1) / 2.0 < horizon:  # j* >= cap: the count exceeds cap
        return cap
    try:
        if b > 0:
            p = a - b / 2.0
            j = math.ceil((-p + math.sqrt(p * p + 2.0 * b * horizon)) / b) - 1
        else:
            j = math.ceil(horizon / a) - 1
    except (OverflowError, ValueError):  # inf or nan: far outside [0, cap)
        j = 0
    j = min(max(j, 0), cap - 1)
    # the closed form can be off by one in floating point
    for _ in range(4):
        if a * (j + 1) + b * (j + 1) * j / 2.0 < horizon:
            j += 1
        elif j > 0 and a * j + b * j * (j - 1) / 2.0 >= horizon:
            j -= 1
        else:
            return j + 1
    lo, hi = 0, cap - 1  # S(lo) < horizon <= S(hi + 1): the largest j with S(j) < horizon
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a * mid + b * mid * (mid - 1) / 2.0 < horizon:
            lo = mid
        else:
            hi = mid - 1
    return lo + 1


class Phase:
    """One bench_serving run (every request until the last completes) against the ranks'
    schedulers: an event loop whose events each have a handler: a request's arrival at the
    server, a rank's scheduler step (a prefill batch or a jump of decode steps), a
    completion back at the client, and (Poisson arrivals) a request's release.

    Events are ordered by (time, sequence number); the releases own sequence numbers
    0..n-1 and only the next one is queued at a time (release times never decrease). The
    handlers copy what they read into locals: this loop is the simulator's hot path."""

    __slots__ = (
        "done",
        "heap",
        "in_flight",
        "kv_need",
        "limit",
        "max_in_flight",
        "n",
        "n_img",
        "out",
        "prompt",
        "ranks",
        "rec",
        "release",
        "released",
        "report_at",
        "sent",
        "seq",
        "server",
        "sim",
        "t0",
        "t_end",
    )

    def __init__(self, sim: Simulation, reqs: PhaseRequests, concurrency: int | None, release: np.ndarray | None, t0: float):
        self.sim = sim
        self.server = sim.server
        self.ranks = sim.ranks
        self.rec = sim.rec
        self.prompt, self.out, self.n_img, self.kv_need = reqs.prompt, reqs.out, reqs.n_img, reqs.kv_need
        self.n = len(reqs.prompt)
        self.limit = concurrency if concurrency is not None else self.n
        self.release = release
        self.t0 = t0
        self.heap: list[tuple[float, int, int, int]] = []
        self.seq = itertools.count(self.n if release is not None else 0)
        self.released = 0 if release is not None else self.n  # requests the client may send
        self.sent = 0
        self.in_flight = 0
        self.max_in_flight = 0
        self.t_end = t0
        self.done = 0  # completions in this phase
        self.report_at = sim.next_report - sim.completed  # completions that call for a report

    def run(self) -> tuple[float, int]:
        """Play the phase. Returns the end time and the most requests in flight at once."""
        if self.n == 0:
            return self.t0, 0
        if self.release is not None:
            self._queue_release(0)
        else:
            self._send_ready(self.t0)
        handlers = (self._on_arrival, self._on_step, self._on_completion, self._on_release)
        heap = self.heap
        while heap:
            t, _, kind, a = heappop(heap)
            handlers[kind](t, a)
        self.sim.completed += self.done
        return self.t_end, self.max_in_flight

    # ---- client -------------------------------------------------------------------------
    def _queue_release(self, rid: int) -> None:
        assert self.release is not None
        heappush(self.heap, (self.t0 + float(self.release[rid]), rid, EVENT_RELEASE, rid))

    def _send_ready(self, t: float) -> None:
        """The client sends released requests while fewer than its concurrency are in flight."""
        sent, in_flight, released, limit = self.sent, self.in_flight, self.released, self.limit
        if sent >= released or in_flight >= limit:
            return
        heap, seq, n_img = self.heap, self.seq, self.n_img
        t_out = t + self.server.half_rtt
        pre_s = self.server.pre_s
        while sent < released and in_flight < limit:
            in_flight += 1
            heappush(heap, (t_out + n_img[sent] * pre_s, next(seq), EVENT_ARRIVE, sent))
            sent += 1
        self.sent, self.in_flight = sent, in_flight
        if in_flight > self.max_in_flight:  # noqa: PLR1730 (hot path: no builtin call)
            self.max_in_flight = in_flight

    def _on_release(self, t: float, rid: int) -> None:
        self.released += 1
        if rid + 1 < self.n:
            self._queue_release(rid + 1)
        self._send_ready(t)

    def _on_completion(self, t: float, rid: int) -> None:
        self.in_flight -= 1
        if t > self.t_end:  # noqa: PLR1730 (hot path: no builtin call)
            self.t_end = t
        self.done += 1
        if self.done >= self.report_at:
            sim = self.sim
            sim.report(self.done)
            self.report_at = sim.next_report - sim.completed
        self._send_ready(t)

    # ---- server -------------------------------------------------------------------------
    def _on_arrival(self, t: float, rid: int) -> None:
        """Round-robin to a rank; wake its scheduler if it is idle."""
        sim = self.sim
        r = self.ranks[sim.next_rank % len(self.ranks)]
        sim.next_rank += 1
        r.waiting.append(rid)
        if not r.busy:
            r.busy = True
            heappush(self.heap, (t, next(self.seq), EVENT_STEP, r.idx))

    def _on_step(self, t: float, idx: int) -> None:
        """One scheduler iteration of rank `idx`: a prefill batch if one can be admitted,
        else decode steps, else the rank goes idle."""
        r = self.ranks[idx]
        deferred = False
        if r.pdi > 0:
            if r.n_run > 0:
                r.pdi -= 1
                deferred = True
            else:
                r.pdi = 0
        if not deferred and (r.waiting or r.chunked >= 0) and self._prefill(r, t):
            return
        if r.n_run > 0:
            self._decode(r, t, deferred)
            return
        if r.waiting or r.chunked >= 0:
            # Nothing runs and nothing can be admitted: only a KV pool too small for one request.
            rid = r.waiting[0] if r.waiting else r.chunked
            raise InputError(
                f"a KV pool of {self.server.kv_cap} tokens leaves no room for a waiting request of "
                f"{self.prompt[rid]} prompt tokens",
                field="max_total_tokens",
            )
        r.busy = False

    def _prefill(self, r: Rank, t: float) -> bool:
        """Admit and record one prefill batch (PrefillAdder: the continuing chunked request
        first, then waiting requests FCFS); False when nothing could be admitted."""
        batch = self._form_batch(r, t)
        if batch is None:
            return False
        d, finishing, rows = batch
        self._after_prefill(r, finishing, rows, t + d)
        return True

    def _form_batch(self, r: Rank, t: float, step: int = -1) -> tuple[float, list[int], int] | None:
        """Admit and record one prefill batch (in DP-attention step `step`, when >= 0).
        Returns its forward time, the requests whose prefill it completes and its mixed
        decode rows; None when nothing could be admitted."""
        s = self.server
        n_run = r.n_run
        mixed = n_run if s.mixed else 0
        rem_chunk = s.chunk - mixed
        rem_input = s.max_prefill - mixed
        finishing: list[int] = []  # requests whose prefill completes in this batch
        count = ext_total = img_flag = vision = 0
        if r.chunked >= 0:
            ext_total, charge, img_flag = self._continue_chunked(r, rem_chunk, finishing)
            rem_chunk -= charge
            rem_input -= charge
            count = 1
        if r.chunked < 0 and r.waiting:
            count, ext_total, img_flag, vision = self._admit_waiting(
                r, rem_chunk, rem_input, s.max_run - n_run, finishing, count, ext_total, img_flag
            )
        if not count:
            return None
        rows = n_run if (mixed and n_run > 0) else 0
        forward = ext_total + rows
        if rows and r.img_run:
            img_flag = 1
        table = s.prefill_s
        d = (
            (table[forward] if forward < len(table) else s.prefill_time(forward))
            + s.per_req_s * count
            + s.vision_s * vision
            + s.dec_kv * r.ctx * (1 if rows else 0)
        )
        if step < 0:
            self.rec.batch(forward, count, ext_total, n_run, len(r.waiting), img_flag, t, r.idx)
        else:
            cast(StepRecorder, self.rec).batch_step(step, forward, count, ext_total, n_run, len(r.waiting), img_flag, t, r.idx)
        return d, finishing, rows

    def _after_prefill(self, r: Rank, finishing: list[int], rows: int, te: float, wake: bool = True) -> None:
        """A prefill batch ended at `te`: its mixed decode rows advanced one token, its
        completed prompts start decoding; the rank's next step is due (`wake`)."""
        s = self.server
        if rows:
            r.tick += 1
            r.ctx += r.n_run
            self._finish_due(r, te)
        self._start_decoding(r, finishing, te)
        if s.pdi:
            r.pdi = s.pdi
        if wake:
            heappush(self.heap, (te, next(self.seq), EVENT_STEP, r.idx))

    def _continue_chunked(self, r: Rank, rem_chunk: int, finishing: list[int]) -> tuple[int, int, int]:
        """The chunked request's next chunk (at least one token). Returns (tokens, tokens
        charged to the budgets, image flag)."""
        rid = r.chunked
        page = self.server.page
        left = self.prompt[rid] - r.chunk_done
        take = min(left, rem_chunk if rem_chunk > 0 else 1)
        if take == left:
            finishing.append(rid)
            r.chunked = -1
            r.chunk_done = 0
        else:
            r.chunk_done += take
        return take, ((take + page - 1) // page) * page, 1 if self.n_img[rid] else 0

    def _admit_waiting(
        self,
        r: Rank,
        rem_chunk: int,
        rem_input: int,
        slots: int,
        finishing: list[int],
        count: int,
        ext_total: int,
        img_flag: int,
    ) -> tuple[int, int, int, int]:
        """New requests in arrival order until a budget, the running cap (`slots` new rows)
        or the KV room is spent; one that overflows the chunk budget is cut and ends the
        batch. Returns the batch's (requests, new tokens, image flag, images to encode)."""
        s = self.server
        prompt, n_img, kv_need = self.prompt, self.n_img, self.kv_need
        page, kv_cap = s.page, s.kv_cap
        waiting = r.waiting
        vision = 0
        while waiting and r.chunked < 0:
            if rem_input <= 0 or rem_chunk <= 0 or count >= slots:
                break
            rid = waiting[0]
            if kv_cap is not None and r.committed + kv_need[rid] > kv_cap:
                break
            ext = prompt[rid]
            if ext <= rem_chunk:
                waiting.popleft()
                charge = ((ext + page - 1) // page) * page
                rem_chunk -= charge
                rem_input -= charge
                finishing.append(rid)
            else:
                cut = rem_chunk if s.exact_cut else (rem_chunk // page) * page
                if cut <= 0:
                    break
                waiting.popleft()
                ext = cut
                rem_chunk -= cut
                rem_input -= cut
                r.chunked = rid
                r.chunk_done = cut
            r.committed += kv_need[rid]
            count += 1
            ext_total += ext
            if n_img[rid]:
                img_flag = 1
                vision += n_img[rid]
        return count, ext_total, img_flag, vision

    def _decode(self, r: Rank, t: float, deferred: bool) -> None:
        """Decode steps until something can change: a request finishes, the deferral ends,
        or (when a new arrival could start a prefill) the next event of anyone."""
        s = self.server
        n_run = r.n_run
        k = r.fin[0][0] - r.tick
        if deferred:
            k = min(k, 1 + r.pdi)
        a_s = s.dec_base + s.dec_row * n_run + s.dec_kv * r.ctx
        b_s = s.dec_kv * n_run
        if (deferred or not (r.waiting or r.chunked >= 0)) and self.heap:  # empty: nothing else can happen
            k = decode_steps_before(self.heap[0][0] - t, a_s, b_s, k)
        if deferred and k > 1:
            r.pdi -= k - 1
        dur = a_s * k + b_s * k * (k - 1) / 2.0
        r.tick += k
        r.ctx += n_run * k
        self.rec.decode_steps += k
        te = t + dur
        self._finish_due(r, te)
        heappush(self.heap, (te, next(self.seq), EVENT_STEP, r.idx))

    def _finish_due(self, r: Rank, t: float) -> None:
        """Requests whose last token came with the rank's latest decode tick leave it."""
        fin = r.fin
        if not fin or fin[0][0] > r.tick:
            return
        prompt, out, n_img, kv_need = self.prompt, self.out, self.n_img, self.kv_need
        heap, seq = self.heap, self.seq
        t_done = t + self.server.half_rtt
        while fin and fin[0][0] <= r.tick:
            _, rid = heappop(fin)
            r.n_run -= 1
            r.ctx -= prompt[rid] + out[rid]
            r.committed -= kv_need[rid]
            r.img_run -= 1 if n_img[rid] else 0
            heappush(heap, (t_done, next(seq), EVENT_DONE, rid))

    def _start_decoding(self, r: Rank, rids: list[int], t: float) -> None:
        """Requests whose prefill completed at `t` start decoding (or are done: the prefill
        produced their only output token)."""
        prompt, out, n_img = self.prompt, self.out, self.n_img
        for rid in rids:
            o = out[rid]
            if o <= 1:
                r.committed -= self.kv_need[rid]
                heappush(self.heap, (t + self.server.half_rtt, next(self.seq), EVENT_DONE, rid))
                continue
            r.n_run += 1
            r.ctx += prompt[rid] + 1
            r.img_run += 1 if n_img[rid] else 0
            heappush(r.fin, (r.tick + o - 1, rid))
