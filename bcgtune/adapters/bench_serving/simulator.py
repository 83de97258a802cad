"""Simulate a workload's prefill batches offline: play bench_serving's client against SGLang's
scheduler (bcgtune/core/sim/scheduler.py) and record every prefill forward as a log trace would.

This module is bench_serving's side (sglang/benchmark/serving.py): for each concurrency
level, the requests drawn as it draws them (adapters/bench_serving/client.py), Poisson send times
for a finite request rate, a warm-up of `warmup_requests` copies of request 0 (output capped
at 32) at the same concurrency, then 1 s of sleep, then the run; the levels one after
another with a pause between them. The scheduler plays each run.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from bcgtune.adapters.bench_serving.client import request_prompt_tokens, sample_lengths
from bcgtune.core.sim.scheduler import (
    BATCHES_MAX,
    CLIP_MAX_NEW_TOKENS,
    Phase,
    PhaseRequests,
    ProgressFn,
    Recorder,
    Simulation,
    StepRecorder,
)
from bcgtune.core.sim.scheduler_lockstep import LockstepPhase
from bcgtune.core.sim.workload import StepTimeModel, Workload
from bcgtune.core.trace.prefill_trace import PrefillTrace
from bcgtune.errors import InputError

WARMUP_OUTPUT_CAP = 32  # serving.py: warm-up output_len = min(output_len, 32)
WARMUP_SLEEP_S = 1.0  # serving.py: asyncio.sleep(1.0) after the warm-up
# Forward sizes whose prefill time is precomputed (O(1) lookups); larger ones, which only
# huge chunk budgets produce, are computed per batch.
PREFILL_TABLE_MAX = 1 << 18

# ---- a simulation: levels of warm-up + run ---------------------------------------------------


@dataclass
class _LevelPlan:
    """One concurrency level's requests, drawn as bench_serving draws them."""

    concurrency: int | None
    n: int
    prompt: np.ndarray
    out: np.ndarray
    n_img: np.ndarray
    release: np.ndarray | None  # Poisson send times after the run's start; None: all at once


def _plan_level(w: Workload, i: int, concurrency: int | None) -> _LevelPlan:
    n = w.prompts_for_level(i)
    inp, out = sample_lengths(w, n)
    gen = np.random.default_rng([w.seed, i])
    prompt, n_img = request_prompt_tokens(w, inp, gen)
    if w.context_length is not None:
        worst = int((prompt + out).max())
        if worst > w.context_length:
            raise InputError(
                f"requests reach {worst} tokens (prompt + output), above the context length {w.context_length}",
                field="context_length",
            )
    if w.max_total_tokens is not None:
        need = int(prompt.max()) + min(int(out.max()), CLIP_MAX_NEW_TOKENS) + 2 * w.page_size
        if need > w.max_total_tokens:
            raise InputError(
                f"a KV pool of {w.max_total_tokens} tokens is below one request's need of {need} tokens",
                field="max_total_tokens",
            )
    release = None
    if not math.isinf(w.request_rate):
        gaps = gen.exponential(1.0 / w.request_rate, size=n)
        release = np.concatenate([[0.0], np.cumsum(gaps[:-1])])
    return _LevelPlan(concurrency, n, prompt, out, n_img, release)


def _check_work(w: Workload, plans: list[_LevelPlan]) -> None:
    """Refuse, before simulating, a workload whose prompt tokens alone need more prefill
    batches than BATCHES_MAX (each batch carries at most one chunk of new tokens)."""
    per_batch = min(w.resolved_chunked_prefill_size, w.max_prefill_tokens + max(int(p.prompt.max()) for p in plans))
    tokens = sum(int(p.prompt.sum()) + w.warmup_requests * int(p.prompt[0]) for p in plans)
    need = -(-tokens // per_batch)
    if need > BATCHES_MAX:
        raise InputError(
            f"the workload needs at least {need:,} prefill batches ({tokens:,} prompt tokens, at most "
            f"{per_batch:,} a batch), above the simulator's limit of {BATCHES_MAX:,}"
        )


def _prefill_table_size(w: Workload, plans: list[_LevelPlan]) -> int:
    """The largest forward a batch can reach (new tokens plus mixed decode rows), capped."""
    max_prompt = max(int(p.prompt.max()) for p in plans)
    mixed_extra = w.resolved_max_running_requests if w.enable_mixed_chunk else 0
    size = min(w.resolved_chunked_prefill_size, w.max_prefill_tokens + max_prompt) + min(mixed_extra, 1 << 16)
    return int(min(size, PREFILL_TABLE_MAX))


def _play_level(sim: Simulation, w: Workload, plan: _LevelPlan, t: float) -> tuple[dict, float]:
    """bench_serving's warm-up, its sleep, then the run. Returns the level's metadata (as
    saved in trace JSON) and the end time."""
    rec = sim.rec
    phase = LockstepPhase if sim.lockstep else Phase
    start_batch, start_t, steps_before = len(rec), t, rec.decode_steps
    warm_tokens = warm_in_flight = 0
    if w.warmup_requests > 0:
        wn = w.warmup_requests
        warm = PhaseRequests(
            np.repeat(plan.prompt[:1], wn),
            np.repeat(np.minimum(plan.out[:1], WARMUP_OUTPUT_CAP), wn),
            np.repeat(plan.n_img[:1], wn),
            w.page_size,
        )
        t, warm_in_flight = phase(sim, warm, plan.concurrency, None, t).run()
        warm_tokens = int(plan.prompt[0]) * wn
        t += WARMUP_SLEEP_S
    warm_batches = len(rec) - start_batch
    run_start = t
    reqs = PhaseRequests(plan.prompt, plan.out, plan.n_img, w.page_size)
    t, in_flight = phase(sim, reqs, plan.concurrency, plan.release, t).run()
    dur = t - run_start
    level = {
        "max_concurrency": plan.concurrency,
        "num_prompts": plan.n,
        "batches": [start_batch, len(rec)],
        "warmup_batches": warm_batches,
        "decode_steps": rec.decode_steps - steps_before,
        "input_tokens": int(plan.prompt.sum()),
        "warmup_input_tokens": warm_tokens,
        "output_tokens": int(plan.out.sum()),
        "max_in_flight": max(in_flight, warm_in_flight),
        "start_s": round(start_t, 6),
        "duration_s": round(dur, 6),
        "output_throughput_tok_s": round(float(plan.out.sum()) / dur, 3) if dur > 0 else None,
    }
    return level, t


def _trace(w: Workload, rec: Recorder, levels: list[dict]) -> PrefillTrace:
    if not len(rec):
        raise InputError("the workload produced no prefill batches")
    cols = rec.columns()
    meta = {"workload": w.to_dict(), "levels": levels, "decode_steps": rec.decode_steps}
    if w.dp_size > 1:
        meta["ranks"] = [f"DP{i}" for i in range(w.dp_size)]
    else:
        del cols["rank"]
    if isinstance(rec, StepRecorder):
        meta["dp_attention"] = {
            "ranks": w.dp_size,
            "decode_votes": {"step": rec.dec_step.tolist(), "rank": rec.dec_rank.tolist(), "rows": rec.dec_rows.tolist()},
        }
    return PrefillTrace.from_batches(cols, origin="simulation", meta=meta)


def simulate(workload: Workload, step: StepTimeModel | None = None, *, progress: ProgressFn | None = None) -> PrefillTrace:
    """Play `workload` and return its prefill trace (origin "simulation"), deterministic for
    the workload's seed. `step` replaces the workload's step-time model (a calibration).
    `progress(done, total)` is called with completed requests (warm-ups included) about
    every 0.1% of `total`, first with 0 and last with total. Interruptible (Ctrl-C)."""
    w = workload if step is None else replace(workload, step=step)
    w.validate()
    plans = [_plan_level(w, i, conc) for i, conc in enumerate(w.levels)]
    _check_work(w, plans)
    sim = Simulation(w, w.step.prefill_table(_prefill_table_size(w, plans)), progress)
    levels = []
    t = 0.0
    for plan in plans:
        level, t = _play_level(sim, w, plan, t)
        levels.append(level)
        t += w.step.level_gap_s
    sim.report()
    return _trace(w, sim.rec, levels)
