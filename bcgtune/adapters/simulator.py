"""Simulate a workload's prefill batches offline: play bench_serving's client against SGLang's
scheduler and record every prefill forward as a log trace would.

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
  * --dp-size N: N schedulers fed round-robin in arrival order; under DP attention each gets
    chunked_prefill_size / N and max_running_requests / N. Ranks step independently here
    (real DP attention synchronizes their forwards).
Client (sglang/benchmark/serving.py): warm-up of `warmup_requests` copies of request 0
(output capped at 32) at the same concurrency, then 1 s of sleep, then the run; a semaphore
of max_concurrency; request_rate inf sends at once, else exponential gaps.

Time is event-driven (heapq) and decode steps are jumped in closed form between events, so
cost grows with requests and prefill batches, not with decode steps.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import replace

import numpy as np

from bcgtune.adapters.workload import (
    StepTimeModel,
    Workload,
    default_workload,
    request_prompt_tokens,
    sample_lengths,
)
from bcgtune.core.trace import PrefillTrace
from bcgtune.errors import InputError

CLIP_MAX_NEW_TOKENS = 4096  # schedule_policy.py: max_new estimate cap for KV admission
WARMUP_OUTPUT_CAP = 32  # serving.py: warm-up output_len = min(output_len, 32)
WARMUP_SLEEP_S = 1.0  # serving.py: asyncio.sleep(1.0) after the warm-up

_ARRIVE, _STEP, _DONE, _RELEASE = 0, 1, 2, 3


class _Rank:
    __slots__ = (
        "idx", "waiting", "chunked", "chunk_done", "n_run", "ctx", "fin", "tick", "committed",
        "pdi", "busy", "img_run",
    )

    def __init__(self, idx: int):
        self.idx = idx
        self.waiting: deque[int] = deque()
        self.chunked = -1
        self.chunk_done = 0
        self.n_run = 0
        self.ctx = 0
        self.fin: list[tuple[int, int]] = []
        self.tick = 0
        self.committed = 0
        self.pdi = 0
        self.busy = False
        self.img_run = 0


class _Recorder:
    def __init__(self) -> None:
        self.forward: list[int] = []
        self.new_seq: list[int] = []
        self.new_token: list[int] = []
        self.running: list[int] = []
        self.queue: list[int] = []
        self.images: list[int] = []
        self.time: list[float] = []
        self.rank: list[int] = []
        self.decode_steps = 0


def _run_phase(
    w: Workload,
    prompt: list[int],
    out: list[int],
    n_img: list[int],
    concurrency: int | None,
    release: list[float] | None,
    t0: float,
    ranks: list[_Rank],
    rr: list[int],
    rec: _Recorder,
    prefill_s: list[float],
) -> tuple[float, int]:
    """Play one bench_serving run (all requests until the last completes). Returns the end
    time and the most requests in flight at once."""
    step: StepTimeModel = w.step
    n = len(prompt)
    if n == 0:
        return t0, 0
    chunk = w.resolved_chunked_prefill_size
    max_prefill = w.max_prefill_tokens
    max_run = w.resolved_max_running_requests
    page = w.page_size
    mixed_on = w.enable_mixed_chunk
    pdi_k = w.prefill_decode_interval
    exact_cut = w.disable_radix_cache
    kv_cap = w.max_total_tokens
    n_ranks = len(ranks)
    half_rtt = step.client_rtt_ms / 2000.0
    pre_s = step.image_preprocess_ms / 1000.0
    per_req_s = step.prefill_per_req_ms / 1000.0
    vision_s = step.vision_ms_per_image / 1000.0
    dec_base = step.decode_base_ms / 1000.0
    dec_row = step.decode_per_row_ms / 1000.0
    dec_kv = step.decode_per_ctx_token_ms / 1000.0
    table_len = len(prefill_s)
    kv_need = [((p + page - 1) // page) * page + min(o, CLIP_MAX_NEW_TOKENS) + page for p, o in zip(prompt, out)]
    c_limit = concurrency if concurrency is not None else n

    heap: list[tuple[float, int, int, int]] = []
    seq = 0
    fifo: deque[int] = deque()
    in_flight = 0
    max_in_flight = 0
    done = 0
    t_end = t0

    def prefill_time(tokens: int) -> float:
        if tokens < table_len:
            return prefill_s[tokens]
        if step.prefill_curve is not None:
            return float(np.asarray(step.prefill_curve(np.array([tokens])))[0]) / 1000.0
        x = float(tokens)
        return max(step.prefill_floor_ms, step.prefill_c0_ms + step.prefill_c1_ms * x + step.prefill_c2_ms * x * x) / 1000.0

    if release is None:
        fifo.extend(range(n))
    else:
        for rid in range(n):
            heap.append((t0 + release[rid], seq, _RELEASE, rid))
            seq += 1
        heapq.heapify(heap)

    def send(rid: int, t: float) -> None:
        nonlocal seq, in_flight, max_in_flight
        in_flight += 1
        if in_flight > max_in_flight:
            max_in_flight = in_flight
        heapq.heappush(heap, (t + half_rtt + n_img[rid] * pre_s, seq, _ARRIVE, rid))
        seq += 1

    while fifo and in_flight < c_limit:
        send(fifo.popleft(), t0)

    def finish_due(r: _Rank, t: float) -> None:
        nonlocal seq
        fin = r.fin
        while fin and fin[0][0] <= r.tick:
            _, rid = heapq.heappop(fin)
            r.n_run -= 1
            r.ctx -= prompt[rid] + out[rid]
            r.committed -= kv_need[rid]
            r.img_run -= 1 if n_img[rid] else 0
            heapq.heappush(heap, (t + half_rtt, seq, _DONE, rid))
            seq += 1

    def join_running(r: _Rank, rid: int, t: float) -> None:
        nonlocal seq
        if out[rid] <= 1:  # the prefill produced the only output token
            r.committed -= kv_need[rid]
            heapq.heappush(heap, (t + half_rtt, seq, _DONE, rid))
            seq += 1
            return
        r.n_run += 1
        r.ctx += prompt[rid] + 1
        r.img_run += 1 if n_img[rid] else 0
        heapq.heappush(r.fin, (r.tick + out[rid] - 1, rid))

    while heap:
        t, _, kind, a = heapq.heappop(heap)
        if kind == _ARRIVE:
            r = ranks[rr[0] % n_ranks]
            rr[0] += 1
            r.waiting.append(a)
            if not r.busy:
                r.busy = True
                heapq.heappush(heap, (t, seq, _STEP, r.idx))
                seq += 1
            continue
        if kind == _DONE:
            done += 1
            in_flight -= 1
            if t > t_end:
                t_end = t
            while fifo and in_flight < c_limit:
                send(fifo.popleft(), t)
            continue
        if kind == _RELEASE:
            fifo.append(a)
            while fifo and in_flight < c_limit:
                send(fifo.popleft(), t)
            continue

        # ---- one scheduler iteration of rank `a` at time t -------------------------------
        r = ranks[a]
        n_run = r.n_run
        deferred = False
        if r.pdi > 0:
            if n_run > 0:
                r.pdi -= 1
                deferred = True
            else:
                r.pdi = 0
        admitted: list[int] = []
        finishing: list[int] = []  # requests whose prefill completes in this batch
        if not deferred and (r.waiting or r.chunked >= 0):
            mixed = n_run if mixed_on else 0
            rem_chunk = chunk - mixed
            rem_input = max_prefill - mixed
            slots = max_run - n_run
            count = 0
            ext_total = 0
            img_flag = 0
            vision = 0
            if r.chunked >= 0:
                rid = r.chunked
                left = prompt[rid] - r.chunk_done
                take = min(left, rem_chunk if rem_chunk > 0 else 1)
                charge = ((take + page - 1) // page) * page
                rem_chunk -= charge
                rem_input -= charge
                count += 1
                ext_total += take
                if n_img[rid]:
                    img_flag = 1
                admitted.append(rid)
                if take == left:
                    finishing.append(rid)
                    r.chunked = -1
                    r.chunk_done = 0
                else:
                    r.chunk_done += take
            waiting = r.waiting
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
                    cut = rem_chunk if exact_cut else (rem_chunk // page) * page
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
                admitted.append(rid)
                if n_img[rid]:
                    img_flag = 1
                    vision += n_img[rid]
            if admitted:
                rows = n_run if (mixed_on and n_run > 0) else 0
                forward = ext_total + rows
                if rows and r.img_run:
                    img_flag = 1
                d = prefill_time(forward) + per_req_s * count + vision_s * vision + dec_kv * r.ctx * (1 if rows else 0)
                rec.forward.append(forward)
                rec.new_seq.append(count)
                rec.new_token.append(ext_total)
                rec.running.append(n_run)
                rec.queue.append(len(waiting))
                rec.images.append(img_flag)
                rec.time.append(t)
                rec.rank.append(r.idx)
                te = t + d
                if rows:
                    r.tick += 1
                    r.ctx += n_run
                    finish_due(r, te)
                for rid in finishing:
                    join_running(r, rid, te)
                if pdi_k:
                    r.pdi = pdi_k
                heapq.heappush(heap, (te, seq, _STEP, r.idx))
                seq += 1
                continue
        if n_run > 0:
            # Decode steps until something can change: a request finishes, the deferral ends,
            # or (when a new arrival could start a prefill) the next event of anyone.
            k = r.fin[0][0] - r.tick
            blocked = bool(r.waiting) or r.chunked >= 0
            if deferred:
                k = min(k, 1 + r.pdi)
            a_s = dec_base + dec_row * n_run + dec_kv * r.ctx
            b_s = dec_kv * n_run
            if not blocked or deferred:
                horizon = (heap[0][0] - t) if heap else math.inf
                if horizon <= 0:
                    k = 1
                elif horizon != math.inf:
                    # most ticks j with start S(j) = a j + b j(j-1)/2 < horizon, plus the first
                    if b_s > 0:
                        p = a_s - b_s / 2.0
                        j = int(math.ceil((-p + math.sqrt(p * p + 2.0 * b_s * horizon)) / b_s)) - 1
                    else:
                        j = int(math.ceil(horizon / a_s)) - 1
                    j = max(j, 0)
                    while a_s * (j + 1) + b_s * (j + 1) * j / 2.0 < horizon:
                        j += 1
                    while j > 0 and a_s * j + b_s * j * (j - 1) / 2.0 >= horizon:
                        j -= 1
                    k = min(k, j + 1)
            k = max(k, 1)
            if deferred and k > 1:
                r.pdi -= k - 1
            dur = a_s * k + b_s * k * (k - 1) / 2.0
            r.tick += k
            r.ctx += n_run * k
            rec.decode_steps += k
            te = t + dur
            finish_due(r, te)
            heapq.heappush(heap, (te, seq, _STEP, r.idx))
            seq += 1
            continue
        if r.waiting or r.chunked >= 0:
            # Nothing runs and nothing can be admitted: only a KV pool too small for one request.
            raise InputError(
                f"--max-total-tokens {kv_cap} leaves no room for a waiting request of "
                f"{prompt[r.waiting[0]] if r.waiting else prompt[r.chunked]} prompt tokens"
            )
        r.busy = False
    return t_end, max_in_flight


def simulate(workload: Workload, step: StepTimeModel | None = None) -> PrefillTrace:
    """Play `workload` and return its prefill trace (origin "simulation"), deterministic for
    the workload's seed. `step` replaces the workload's step-time model (a calibration)."""
    w = workload if step is None else replace(workload, step=step)
    w.validate()
    levels = w.levels
    chunk = w.resolved_chunked_prefill_size
    n_ranks = w.dp_size
    ranks = [_Rank(i) for i in range(n_ranks)]
    rr = [0]
    rec = _Recorder()
    per_level = []
    t = 0.0
    plans = []
    max_prompt = 0
    for i, conc in enumerate(levels):
        n = w.prompts_for_level(i)
        inp, outs = sample_lengths(w, n)
        gen = np.random.default_rng([w.seed, i])
        prompt, n_img = request_prompt_tokens(w, inp, gen)
        if w.context_length is not None:
            worst = int((prompt + outs).max())
            if worst > w.context_length:
                raise InputError(
                    f"requests reach {worst} tokens (prompt + output), above --context-length {w.context_length}"
                )
        if w.max_total_tokens is not None:
            need = int(prompt.max()) + min(int(outs.max()), CLIP_MAX_NEW_TOKENS) + 2 * w.page_size
            if need > w.max_total_tokens:
                raise InputError(f"--max-total-tokens {w.max_total_tokens} is below one request's need of {need} tokens")
        release = None
        if not math.isinf(w.request_rate):
            gaps = gen.exponential(1.0 / w.request_rate, size=n)
            release = np.concatenate([[0.0], np.cumsum(gaps[:-1])]).tolist()
        max_prompt = max(max_prompt, int(prompt.max()))
        plans.append((conc, n, prompt, outs, n_img, release))
    mixed_extra = (w.resolved_max_running_requests if w.enable_mixed_chunk else 0)
    table_max = min(chunk, w.max_prefill_tokens + max_prompt) + min(mixed_extra, 1 << 16)
    prefill_s = w.step.prefill_table(int(table_max))

    for i, (conc, n, prompt, outs, n_img, release) in enumerate(plans):
        level_start_batch = len(rec.forward)
        level_start_t = t
        steps_before = rec.decode_steps
        p_list = prompt.tolist()
        o_list = outs.tolist()
        i_list = n_img.tolist()
        warm_tokens = 0
        warm_in_flight = 0
        if w.warmup_requests > 0:
            wn = w.warmup_requests
            t, warm_in_flight = _run_phase(
                w, [p_list[0]] * wn, [min(o_list[0], WARMUP_OUTPUT_CAP)] * wn, [i_list[0]] * wn,
                conc, None, t, ranks, rr, rec, prefill_s,
            )
            warm_tokens = p_list[0] * wn
            t += WARMUP_SLEEP_S
        warm_batches = len(rec.forward) - level_start_batch
        run_start = t
        t, in_flight = _run_phase(w, p_list, o_list, i_list, conc, release, t, ranks, rr, rec, prefill_s)
        dur = t - run_start
        per_level.append(
            {
                "max_concurrency": conc,
                "num_prompts": n,
                "batches": [level_start_batch, len(rec.forward)],
                "warmup_batches": warm_batches,
                "decode_steps": rec.decode_steps - steps_before,
                "input_tokens": int(prompt.sum()),
                "warmup_input_tokens": warm_tokens,
                "output_tokens": int(outs.sum()),
                "max_in_flight": max(in_flight, warm_in_flight),
                "start_s": round(level_start_t, 6),
                "duration_s": round(dur, 6),
                "output_throughput_tok_s": round(float(outs.sum()) / dur, 3) if dur > 0 else None,
            }
        )
        t += w.step.level_gap_s
    if not rec.forward:
        raise InputError("the workload produced no prefill batches")
    cols = {
        "forward_tokens": rec.forward,
        "new_seq": rec.new_seq,
        "new_token": rec.new_token,
        "running_req": rec.running,
        "queue_req": rec.queue,
        "images": rec.images,
        "time_s": rec.time,
    }
    meta = {"workload": w.to_dict(), "levels": per_level, "decode_steps": rec.decode_steps}
    if n_ranks > 1:
        cols["rank"] = rec.rank
        meta["ranks"] = [f"DP{i}" for i in range(n_ranks)]
    return PrefillTrace.from_batches(cols, origin="simulation", meta=meta)


def replay_shares(trace: PrefillTrace, buckets, factor: float = 2.0) -> dict:
    """Share of batches that replay under a bucket list, for the patched runner (image batches
    replay like text ones; no speculative decoding) and the unpatched 0.5.23 runner (every
    image batch of a Qwen4-Exp model runs eager). Pure function of the trace."""
    from bcgtune.core.replay import assign_buckets

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
    _, replay = assign_buckets(sizes, list(buckets), factor)
    total = int(weights.sum())
    n_img = int(weights[is_img].sum())
    patched = int(weights[replay].sum())
    unpatched = int(weights[replay & ~is_img].sum())
    return {
        "batches": total,
        "image_batches": n_img,
        "image_share": n_img / total if total else 0.0,
        "images_known": images_known,
        "patched_replay_batches": patched,
        "unpatched_replay_batches": unpatched,
        "patched_replay_share": patched / total if total else 0.0,
        "unpatched_replay_share": unpatched / total if total else 0.0,
    }


def default_workload_trace() -> PrefillTrace:
    """The main job's embedded default: the seeds' benchmark simulated (see default_workload)."""
    return simulate(default_workload())


def simulation_summary(trace: PrefillTrace, buckets=None, factor: float = 2.0) -> dict:
    """What `trace --simulate` reports beyond a log trace's summary: image share and the
    patched-vs-unpatched replay shares under SGLang's default ladder (max = chunked prefill
    size) and, if given, a user list; plus the per-concurrency-level breakdown."""
    from bcgtune.core.ladder import sglang_default_ladder

    wl = trace.meta.get("workload", {})
    max_bs = int(wl.get("resolved", {}).get("chunked_prefill_size") or 8192)
    max_bs = min(max_bs, 1 << 20)
    lists = {f"sglang default ladder (max {max_bs})": sglang_default_ladder(max_bs)}
    if buckets:
        lists["--buckets"] = sorted(int(b) for b in buckets)
    fwd = trace.batches["forward_tokens"] if trace.batches is not None else None
    img = trace.batches.get("images") if trace.batches is not None else None
    levels = []
    for lv in trace.meta.get("levels", []):
        s, e = lv["batches"]
        n = e - s
        levels.append(
            {
                "max_concurrency": lv["max_concurrency"],
                "num_prompts": lv["num_prompts"],
                "batches": n,
                "image_batches": int((img[s:e] == 1).sum()) if img is not None else None,
                "mean_forward_tokens": round(float(fwd[s:e].mean()), 1) if fwd is not None and n else None,
                "max_forward_tokens": int(fwd[s:e].max()) if fwd is not None and n else None,
                "decode_steps": lv["decode_steps"],
                "duration_s": lv["duration_s"],
            }
        )
    return {
        "workload": wl.get("name") or None,
        "replay": [{"list": name, "buckets": len(bl), **replay_shares(trace, bl, factor)} for name, bl in lists.items()],
        "levels": levels,
    }
