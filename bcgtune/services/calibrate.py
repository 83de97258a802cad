"""`bcgtune calibrate`: measure what the time objective prices, on one runner, and graph
memory; the result is a core.plan.calibration.Calibration (and every timed round behind it).

The pipeline: the sizes to measure (a list, a bucket grid, or a grid over a trace's sizes
with the trace's (tokens, requests) batch mix), the engine built, graph memory per largest
graph, capture, then every call timed in interleaved rounds (engines/timing.py)."""

from __future__ import annotations

import functools
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from bcgtune.core.plan.measure_defaults import CPU_ROUNDS, DEFAULT_CHECK_BATCHES, GPU_ROUNDS  # when not given
from bcgtune.core.sglang.replay import DEFAULT_PADDING_FACTOR
from bcgtune.engines.spec import EngineSpec
from bcgtune.errors import ExternalError, InputError

if TYPE_CHECKING:
    from bcgtune.core.plan.calibration import Calibration
    from bcgtune.core.plan.model_check import ModelCheck
    from bcgtune.core.trace.mix import BatchMix
    from bcgtune.core.trace.prefill_trace import PrefillTrace
    from bcgtune.engines.base import CaptureRecord, StaticPrefillEngine
    from bcgtune.engines.timing import RoundTimes

DEFAULT_CALIBRATION_SIZES = (16, 64, 128, 256, 512, 768, 1024, 1536, 2048, 2560, 3072, 4096, 5120, 6144, 8192)
MAX_POOL_SIZES = 16  # graph memory alone is measured at most at this many sizes (smooth in n)
MAX_GRID_SIZES = 4096  # a 64-token grid to 16k tokens is 256 sizes; each costs seconds on a GPU
DEFAULT_GRID = 64
# (warm-up, timed) rounds of the model check at most (each replays the whole sample of the trace)
CHECK_ROUNDS = (1, 5)

Say = Callable[[str], None]


# ---------------------------------------------------------------------------------------
# which sizes (pure: no torch)
# ---------------------------------------------------------------------------------------
def grid_sizes(
    step: int, max_tokens: int | None = None, trace_sizes: Any = None, factor: float = DEFAULT_PADDING_FACTOR
) -> list[int]:
    """Sizes for a bucket-grid calibration: every multiple of `step` up to `max_tokens`
    (default 8192). With a trace, only the multiples some traced size n can replay in
    (n <= c <= factor * n), none above the first multiple at or past the largest traced size
    (a larger bucket only pads more) nor above `max_tokens`, plus the trace's smallest and largest size so
    eager time is measured, not extrapolated, at the ends."""
    if step < 1:
        raise InputError(f"--grid must be >= 1, got {step}")
    if trace_sizes is None:
        top = max_tokens or 8192
        if top // step > MAX_GRID_SIZES:
            raise InputError(
                f"--grid {step} up to {top} tokens is {top // step:,} sizes to measure "
                f"(at most {MAX_GRID_SIZES:,}): use a coarser grid or a smaller --max-tokens"
            )
        out = list(range(step, top + 1, step))
        if not out:
            raise InputError(f"--grid {step} is above --max-tokens {top}")
        return out
    s = np.unique(np.asarray(trace_sizes, dtype=np.int64))
    top = int(-(-int(s[-1]) // step) * step)
    if max_tokens is not None:
        top = min(top, max_tokens)
    if top // step > 100 * MAX_GRID_SIZES:  # the scan below holds every multiple up to top
        raise InputError(
            f"--grid {step} up to this trace's largest size ({int(s[-1]):,} tokens) spans "
            f"{top // step:,} multiples: use a coarser grid or --max-tokens"
        )
    c = np.arange(step, top + 1, step, dtype=np.int64)
    # some n with c / factor <= n <= c
    hi = np.searchsorted(s, c, side="right")
    lo = np.searchsorted(s * factor, c.astype(np.float64), side="left")
    keep = set(c[lo < hi].tolist())
    if len(keep) > MAX_GRID_SIZES:
        raise InputError(
            f"--grid {step} over this trace is {len(keep):,} sizes to measure (at most {MAX_GRID_SIZES:,}): use a coarser grid"
        )
    keep.update(int(x) for x in (s[0], s[-1]) if max_tokens is None or x <= max_tokens)
    if not keep:
        raise InputError(f"no size to measure: the trace's sizes start at {int(s[0])}, above --max-tokens {max_tokens}")
    return sorted(keep)


def pool_subset(sizes: Sequence[int]) -> list[int]:
    """At most MAX_POOL_SIZES sizes spread evenly on a log scale, the largest included."""
    if len(sizes) <= MAX_POOL_SIZES:
        return list(sizes)
    idx = np.unique(np.round(np.geomspace(1, len(sizes), MAX_POOL_SIZES)).astype(int) - 1)
    return sorted({sizes[i] for i in idx} | {sizes[-1]})


@dataclass
class CalibrationSizes:
    """What a calibration measures: its sizes (buckets), the trace's batch mix when it has
    one, and what to record about how they were chosen (calibration meta)."""

    sizes: list[int]
    mix: BatchMix | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    trace: PrefillTrace | None = None  # the trace the sizes come from (its batches replayed by the model check)


def _check_count(wanted: list[int]) -> None:
    """Refuse more sizes than a calibration can measure in reasonable time (each costs a
    capture and timed replays: seconds on a GPU)."""
    if len(wanted) > MAX_GRID_SIZES:
        raise InputError(
            f"{len(wanted):,} sizes to measure (at most {MAX_GRID_SIZES:,}): give fewer sizes or a coarser grid", "--sizes"
        )


def calibration_sizes(
    sizes: list[int] | None = None,
    max_tokens: int | None = None,
    grid: int | None = None,
    sizes_from: str | None = None,
    factor: float = DEFAULT_PADDING_FACTOR,
    mix_every: int = 1,
) -> CalibrationSizes:
    """The sizes to measure: `sizes` (default DEFAULT_CALIBRATION_SIZES), or a bucket grid
    (`grid`, default 64 with a trace) up to `max_tokens` or over the sizes the trace
    `sizes_from` can replay in, `sizes` then added to the grid. Reads the trace; no torch.
    An empty value is an error, never "unset"."""
    if sizes is not None and not sizes:
        raise InputError("no sizes given (an empty list)", "--sizes")
    if sizes_from is not None and not sizes_from.strip():
        raise InputError("no trace given (an empty path)", "--sizes-from")
    if sizes_from is not None or grid is not None:
        trace_sizes = mix = trace = None
        meta: dict[str, Any] = {"bucket_grid": grid or DEFAULT_GRID, "sizes_from": sizes_from}
        if sizes_from is not None:
            from bcgtune.core.trace.mix import batch_mix
            from bcgtune.files.trace_file import load_trace

            trace = load_trace(sizes_from)
            trace_sizes = trace.sizes
            mix = batch_mix(trace).sample(mix_every)
            meta["mix_every"] = mix_every
        wanted = grid_sizes(grid or DEFAULT_GRID, max_tokens=max_tokens, trace_sizes=trace_sizes, factor=factor)
        if sizes is not None:
            extra = [s for s in sizes if max_tokens is None or s <= max_tokens]
            meta["sizes_added"] = sorted(set(extra) - set(wanted))
            wanted = sorted(set(wanted) | set(extra))
            _check_count(wanted)
        return CalibrationSizes(wanted, mix, meta, trace)
    wanted = list(sizes) if sizes is not None else list(DEFAULT_CALIBRATION_SIZES)
    if max_tokens is not None:
        wanted = [s for s in wanted if s <= max_tokens] or [max_tokens]
    _check_count(wanted)
    return CalibrationSizes(wanted)


# ---------------------------------------------------------------------------------------
# the result
# ---------------------------------------------------------------------------------------
@dataclass
class CalibrationRounds:
    """Every timed round's value (ms), in round order: what the calibration's medians
    summarize. Rows are the calibration's sizes (segments alone on the breakable runner,
    whole-forward replays on full); batches are (tokens, requests) pairs (the breakable
    runner's batch mix; on full, each size as one request)."""

    rows: list[int]
    graph_ms: list[list[float]]  # per row
    batches: list[tuple[int, int]]
    eager_ms: list[list[float]]  # per batch
    replay_ms: list[list[float]] | None = None  # breakable, per batch: its replay in its bucket
    breaks_ms: list[list[float]] | None = None  # breakable, per batch: replay minus the segments run just before it


@dataclass
class CalibrateResult:
    """A calibration and every timed round behind it."""

    calibration: Calibration
    rounds: CalibrationRounds

    def to_json(self) -> dict[str, Any]:
        return self.calibration.to_json_obj()


# ---------------------------------------------------------------------------------------
# the pipeline
# ---------------------------------------------------------------------------------------
def calibrate(
    request: CalibrationSizes,
    spec: EngineSpec,
    warmup: int | None = None,
    repeats: int | None = None,
    memory: bool = True,
    progress: Say | None = None,
    model_check: bool = True,
    check_batches: int | None = None,
    check_eager: bool = False,
) -> CalibrateResult:
    """Measure the sizes (and batch mix) of `request` on the engine of `spec`; the
    calibration's meta records how the sizes were chosen. On a trace (`request.trace`), and
    unless `model_check` is False, the calibration then checks its own model: a sample of
    at most `check_batches` of the trace's batches replayed in order under SGLang's ladder
    and the time optimum (and eager, with `check_eager`: its error is its own kind's),
    measured against predicted (core.plan.model_check)."""
    say = progress or (lambda msg: None)
    say(f"{len(request.sizes)} sizes: {request.sizes[0]} ... {request.sizes[-1]}")
    check = None
    if request.trace is not None and model_check:
        check = CheckPlan(request.trace, check_batches or DEFAULT_CHECK_BATCHES, eager=check_eager)
    result = run_calibrate(
        request.sizes,
        spec,
        warmup=warmup,
        repeats=repeats,
        memory=memory,
        progress=progress,
        mix=request.mix,
        check=check,
        meta=request.meta,
    )
    if request.trace is not None and not model_check:
        result.calibration.meta["model_check_skipped"] = "skipped by the run that calibrated it (--no-model-check)"
    return result


@dataclass
class CheckPlan:
    """What the model check replays: the trace's batches (at most `batches`, every Nth in
    trace order), under `lists` (name -> buckets; None: SGLang's ladder for the chunk and the
    time optimum of the new calibration)."""

    trace: PrefillTrace
    batches: int
    lists: dict[str, list[int]] | None = None
    factor: float = DEFAULT_PADDING_FACTOR
    eager: bool = False  # replay eager too (no graphs)


def check_lists(cal: Calibration, trace: PrefillTrace, chunk: int | None, factor: float = DEFAULT_PADDING_FACTOR):
    """The lists the model check replays: SGLang's default ladder for the trace's chunk, and
    a sparse list, the time optimum of `cal` (at most 12 buckets among its measured sizes);
    eager when the optimum is the ladder itself."""
    from bcgtune.core.plan.bucket_plan import assumed_chunked_prefill_size, make_plan
    from bcgtune.core.plan.plan_types import plan_request
    from bcgtune.core.sglang.ladder import sglang_default_ladder

    cps = assumed_chunked_prefill_size(trace, chunk)
    ladder = sglang_default_ladder(cps)
    req = plan_request(
        objective="time",
        calibration=cal,
        max_buckets=12,
        sglang_ladder=ladder,
        ladder_max=cps,
        quantiles=False,
        padding_factor=factor,
    )
    plan = make_plan(trace, req)
    opt = list((plan.optimal or plan.rows[0]).buckets)
    if opt == ladder:
        return {"SGLang ladder": ladder, "eager": []}
    return {"SGLang ladder": ladder, "time optimum": opt}


def check_model(run: _Run, cal: Calibration, plan: CheckPlan) -> ModelCheck:
    """Replay a sample of the trace's batches in order under the check's lists, on a fresh
    engine over the same model, in the calibration's rounds; measured against predicted."""
    import datetime as dt

    from bcgtune.core.plan.bucket_plan import resolve_candidates
    from bcgtune.core.plan.model_check import ListCheck, ModelCheck, sample_every, trace_sequence
    from bcgtune.core.plan.predict import TimeModel
    from bcgtune.core.trace.mix import BatchMix
    from bcgtune.engines.trace_replay import engine_for, replay_in_order

    say = run.say
    tok, req, ordered = trace_sequence(plan.trace, seed=run.spec.seed)
    every = sample_every(tok.size, plan.batches)
    st, sr = tok[::every], req[::every]
    if run.spec.runner == "full":
        sr = np.ones_like(sr)
    lists = plan.lists if plan.lists is not None else check_lists(cal, plan.trace, run.spec.chunked_prefill_size, plan.factor)
    if plan.eager and not any(not b for b in lists.values()):
        lists = {**lists, "eager": []}
    mix = BatchMix.from_batches(st, sr)
    sizes, counts = mix.histogram()
    model = TimeModel(sizes, counts, cal, plan.factor, resolve_candidates("auto", cal), mix=mix)
    largest = max([int(st.max()), *(max(b) for b in lists.values() if b)])
    say(
        f"model check: {st.size:,} of {tok.size:,} trace batches (every {every}"
        f"{'' if ordered else ', shuffled: the trace keeps no order'}) replayed in order under "
        + ", ".join(f"{n} ({len(b)} graphs)" for n, b in lists.items())
    )
    engine = engine_for(run.engine, largest, run.spec)
    # a round replays the whole sample, so its total averages over many batches: a few
    # rounds give its spread (at most the calibration's own)
    warmup, repeats = min(run.warmup, CHECK_ROUNDS[0]), min(run.repeats, CHECK_ROUNDS[1])
    got = replay_in_order(
        engine,
        lists,
        st,
        sr,
        warmup,
        repeats,
        seed=run.spec.seed,
        factor=plan.factor,
        on_round=lambda done, total: say(f"model check round {done}/{total} done"),
    )
    engine.release()
    checks = []
    for name, bl in lists.items():
        r = got[name]
        pred = float(model.totals(bl)[0])
        checks.append(ListCheck(name, list(bl), pred, r.measured_ms, r.round_totals_ms.tolist()))
        say(f"model check: {name}: predicted {pred:,.1f} ms, measured {r.measured_ms:,.1f} ms ({100 * checks[-1].bias:+.2f}%)")
    mc = ModelCheck(
        lists=checks,
        batches=int(st.size),
        of=int(tok.size),
        every=every,
        rounds=repeats,
        ordered=ordered,
        device=run.env.get("gpu_name") or run.engine.device.type,
        created=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
    )
    say(f"model check: intervals widen by {mc.margins_text()}")
    return mc


def run_calibrate(
    sizes: Sequence[int] = DEFAULT_CALIBRATION_SIZES,
    spec: EngineSpec | None = None,
    warmup: int | None = None,
    repeats: int | None = None,
    memory: bool = True,
    progress: Say | None = None,
    mix: BatchMix | None = None,
    check: CheckPlan | None = None,
    meta: dict[str, Any] | None = None,
) -> CalibrateResult:
    """Measure what the time objective prices, on one runner, and graph memory.

    breakable: segments(b) at every size of `sizes` (the bucket grid), and eager(n, r) and
    breaks(n, r) at every batch of `mix` (core.trace.mix.BatchMix; default: each size as one
    request). breaks(n, r) = replay of the batch in the smallest grid bucket >= n minus that
    bucket's segments. full: eager and whole-forward replay at every size (one request).
    `warmup` and `repeats` (untimed and timed rounds) default to GPU_ROUNDS on a GPU and
    CPU_ROUNDS without one."""
    from bcgtune.engines.build import open_engine
    from bcgtune.engines.preflight import check_run

    spec = spec or EngineSpec()
    wanted = sorted({int(s) for s in sizes})
    if not wanted or wanted[0] < 1:
        raise InputError("calibration sizes must be positive integers", "--sizes")
    if mix is not None and spec.runner == "breakable" and int(mix.tokens.max()) > wanted[-1]:
        wanted.append(int(mix.tokens.max()))  # breaks of the largest batches need a bucket that holds them
    shape = check_run(spec, wanted, what="calibration size")
    session = open_engine(spec, max(wanted), shape)
    say = progress or (lambda msg: None)
    default_warmup, default_repeats = GPU_ROUNDS if session.engine.graphs_enabled else CPU_ROUNDS
    warmup = default_warmup if warmup is None else warmup
    repeats = default_repeats if repeats is None else repeats
    run = _Run(session.engine, session.environment, session.model, spec, warmup, repeats, say)
    if spec.runner == "breakable":
        result = _calibrate_breakable(run, wanted, mix, memory)
    else:
        result = _calibrate_full(run, wanted, memory)
    result.calibration.meta.update(meta or {})  # how the sizes were chosen (the candidates the optimum picks among)
    if check is not None:  # `check`: the model check (see calibrate)
        result.calibration.model_check = check_model(run, result.calibration, check)
    return result


@dataclass
class _Run:
    engine: Any
    env: dict[str, Any]
    desc: dict[str, Any]
    spec: EngineSpec
    warmup: int
    repeats: int
    say: Say

    def meta(self, inputs: str, replay_includes: str) -> dict[str, Any]:
        env, engine = self.env, self.engine
        return {
            "gpu": {k: env.get(k) for k in ("gpu_name", "gpu_memory_gib", "compute_capability", "multiprocessors", "driver")},
            "software": {k: env.get(k) for k in ("backend", "torch", "cuda", "hip", "cudnn", "python")},
            "engine": {
                "runner": engine.runner,
                "runner_matches": env.get("runner_matches"),
                "graph_mode": engine.mode,
                "graph_impl": engine.graph_impl,
                "attention": env.get("attention"),
                "sdpa_backend": env["sdpa_backend"],
                "warmup": self.warmup,
                "repeats": self.repeats,
                "timer": ("cuda events, median" if engine.device.type == "cuda" else "perf_counter, median")
                + " of interleaved rounds (every size once per round, in shuffled order)",
                "inputs": inputs,
                "replay_includes": replay_includes,
            },
            "model": self.desc,
        }


def _pool_by_largest(
    sizes: list[int], make_solo: Callable[[int], StaticPrefillEngine], say: Say
) -> tuple[np.ndarray, np.ndarray] | None:
    """Pool size when each of (a subset of) the sizes is the largest graph, alone in a
    fresh pool: (tokens, GiB) arrays, or None when a capture failed."""
    pool_by: dict[int, float | None] = {}
    for n in reversed(pool_subset(sizes)):
        solo = make_solo(n)
        r = solo.capture([n], record_attention=False)[0]
        pool_by[n] = r.pool_growth_gib if r.ok else None
        solo.release()
        del solo
        gib = pool_by[n]
        say(f"pool   n={n:6d}  {gib if gib is not None else float('nan'):.4f} GiB (alone)")
    if not all(v is not None for v in pool_by.values()):
        return None
    keys = sorted(pool_by)
    return np.asarray(keys), np.asarray([pool_by[k] for k in keys], dtype=np.float64)


def _capture_all(engine: StaticPrefillEngine, sizes: list[int], record_attention: bool = True) -> list[CaptureRecord]:
    """Capture every size; a failed capture ends the calibration (ExternalError). Without a
    GPU nothing is captured: the sizes are declared, and the timed rounds run each one's
    forward (a run at capture would only repeat it)."""
    if not engine.graphs_enabled:
        engine.declare(sizes)
        return []
    recs = engine.capture(sizes, record_attention=record_attention)
    failed = [r for r in recs if not r.ok]
    if failed:
        raise ExternalError(f"capture failed at {failed[0].bucket} tokens: {failed[0].error}")
    return recs


def _graph_memory(
    engine: StaticPrefillEngine, recs: list[CaptureRecord], sizes: list[int], meta: dict
) -> tuple[float | None, float | None]:
    """(pool of the largest graph, mean growth per further graph) from a capture largest
    first, the growth per bucket recorded in `meta`; (None, None) without graphs. The mean,
    not the median: most further graphs fit in segments the pool already holds (growth 0)
    and a few add a segment; only the mean keeps the total."""
    if not engine.graphs_enabled:
        return None, None
    growth = {r.bucket: r.pool_growth_gib or 0.0 for r in recs}
    rest = [growth[b] for b in sizes if b != max(sizes)]
    meta["pool_growth_gib_largest_first"] = {str(b): growth[b] for b in sizes}
    return growth[max(sizes)], (statistics.fmean(rest) if rest else 0.0)


def _calibrate_breakable(run: _Run, sizes: list[int], mix: BatchMix | None, memory: bool) -> CalibrateResult:
    from bcgtune.core.plan.calibration import BatchTimes, Calibration
    from bcgtune.core.trace.mix import BatchMix
    from bcgtune.engines.timing import summarize_ms

    engine, say = run.engine, run.say
    if mix is None:
        mix = BatchMix.single_request(sizes, np.ones(len(sizes), dtype=np.int64))
    pbt = None
    if memory and engine.graphs_enabled:
        impl = engine.impl.name

        def make_solo(n: int) -> StaticPrefillEngine:
            if engine.simulated:
                return engine.fresh(n)
            from bcgtune.engines.breakable import BreakablePrefillEngine

            return BreakablePrefillEngine(
                engine.model, engine.device, n, sdpa_backend=run.spec.sdpa_backend, warmup=engine.warmup, graph_impl=impl
            )

        pbt = _pool_by_largest(sizes, make_solo, say)
    recs = _capture_all(engine, sizes, record_attention=False)
    # Every call in the same interleaved rounds (time_interleaved): the segments of every
    # bucket alone, and for every batch its eager forward and its replay next to its bucket's
    # segments. One phase, so the segment curve and the break times see the same mix of GPU
    # clock and power states (a GPU at its power limit runs some seconds at 1.6 GHz, others at
    # 2.0: measured in separate phases, segments and breaks disagreed by 5% on the H200). A
    # batch's break time is the median over rounds of its replay minus the segments run just
    # before it.
    grid = np.asarray(sizes, dtype=np.int64)
    pairs = [(int(n), int(r)) for n, r in zip(mix.tokens.tolist(), mix.requests.tolist())]
    buckets = [int(grid[np.searchsorted(grid, n)]) for n, _ in pairs]
    host: RoundTimes = []
    times = _time_breakable(run, sizes, pairs, buckets, host)
    seg_rounds, batch_rounds = times[: len(sizes)], times[len(sizes) :]
    eager_host = [statistics.median(host[len(sizes) + 2 * i][0]) for i in range(len(pairs))]
    seg = {b: summarize_ms(t[0]) for b, t in zip(sizes, seg_rounds)}
    for b in sizes:
        say(f"segments b={b:6d}  {seg[b].median_ms:9.3f} ms  ({engine.segment_count(b)} segments)")
    eager_ms, breaks_ms, spread, clipped = [], [], {}, 0
    rounds = CalibrationRounds(
        rows=list(sizes), graph_ms=[t[0] for t in seg_rounds], batches=pairs, eager_ms=[], replay_ms=[], breaks_ms=[]
    )
    for i, ((n, r), b) in enumerate(zip(pairs, buckets)):
        eager_t = batch_rounds[2 * i][0]
        seg_alone, full = batch_rounds[2 * i + 1]
        e, t = summarize_ms(eager_t), summarize_ms(full)
        paired = [f - s_ for f, s_ in zip(full, seg_alone)]
        brk = statistics.median(paired)
        if brk < 0:
            clipped += 1
            brk = 0.0
        eager_ms.append(e.median_ms)
        breaks_ms.append(brk)
        rounds.eager_ms.append(eager_t)
        assert rounds.replay_ms is not None and rounds.breaks_ms is not None
        rounds.replay_ms.append(full)
        rounds.breaks_ms.append(paired)
        spread[f"{n}x{r}"] = {
            "eager_p10_p90": [e.p10_ms, e.p90_ms],
            "replay_ms": t.median_ms,
            "bucket": b,
            "replay_p10_p90": [t.p10_ms, t.p90_ms],
        }
        say(f"batch  n={n:6d} r={r:3d}  eager {e.median_ms:9.3f} ms  replay in {b} {t.median_ms:9.3f} ms  breaks {brk:8.3f} ms")
    meta = run.meta(
        "n random tokens split evenly into r requests, seeded",
        "input copy + pad fill + batch metadata + segments and breaks + logits tail",
    )
    meta.update(
        {
            "segments_spread": {str(b): [seg[b].p10_ms, seg[b].p90_ms] for b in sizes},
            "segments_per_graph": {str(b): engine.segment_count(b) for b in sizes},
            "batches_spread": spread,
            "breaks_clipped_at_zero": clipped,
            "mix": {"pairs": int(mix.tokens.size), "batches": mix.n_batches, "requests_known": mix.requests_known},
            "capture_s": {str(r.bucket): round(r.capture_s, 4) for r in recs},
        }
    )
    pool_gib, per_graph = _graph_memory(engine, recs, sizes, meta)
    cal = Calibration(
        tokens=grid,
        eager_ms=None,
        graph_ms=np.asarray([seg[b].median_ms for b in sizes]),
        pool_gib=pool_gib,
        per_graph_gib=per_graph,
        pool_by_tokens=pbt,
        meta=meta,
        runner="breakable",
        batches=BatchTimes(
            mix.tokens,
            mix.requests,
            np.asarray(eager_ms),
            np.asarray(breaks_ms),
            eager_rounds=np.asarray(rounds.eager_ms, dtype=np.float64),
            breaks_rounds=np.asarray(rounds.breaks_ms, dtype=np.float64),
            eager_host_ms=np.asarray(eager_host, dtype=np.float64),
        ),
        graph_rounds=np.asarray(rounds.graph_ms, dtype=np.float64),
    )
    _provenance(cal, run, sizes)
    engine.release()
    return CalibrateResult(cal, rounds)


def _provenance(cal: Calibration, run: _Run, sizes: list[int]) -> None:
    """What the calibration records about its run: the engine options (so that `calibrate
    --extend` measures alike) and its first session."""
    import dataclasses
    import datetime as dt

    from bcgtune.core.plan.calibration import first_session

    cal.engine_options = dataclasses.asdict(run.spec)
    created = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    cal.sessions = [first_session(run.repeats, {"created": created, **cal.meta}, sizes)]


def _time_breakable(
    run: _Run, sizes: list[int], pairs: list[tuple[int, int]], buckets: list[int], host: RoundTimes | None = None
) -> RoundTimes:
    """times[group][call][round]: first each bucket's segments alone, then per batch its
    eager forward, then its bucket's segments and its replay back to back (`host`: each
    call's host launch time, the same shape). Every eager forward starts from an idle GPU
    between other calls, as a server's prefill step starts after the scheduler's own work:
    a launch-bound forward's time is then its host launch time, which `host` shows."""
    from bcgtune.engines import timing

    engine, say, warmup = run.engine, run.say, run.warmup
    inputs = [engine.inputs(n, seed=run.spec.seed + n, requests=r) for n, r in pairs]
    groups: list[list[Callable[[], object]]] = [[functools.partial(engine.replay_segments, b)] for b in sizes]
    for x, b in zip(inputs, buckets):
        groups.append([engine.eager_call(x)])
        groups.append([functools.partial(engine.replay_segments, b), engine.replay_call(x, b)])
    say(
        f"timing {len(sizes)} buckets' segments and {len(pairs)} batches (eager, and replay next to its bucket's "
        f"segments) in {run.repeats} interleaved rounds after {warmup} warm-up round{'s' if warmup != 1 else ''}"
    )
    return timing.time_interleaved(
        groups,
        engine.device,
        warmup,
        run.repeats,
        seed=run.spec.seed,
        on_round=lambda done, total: say(f"round {done}/{total} done" + (" (warm-up)" if done <= warmup else "")),
        host_out=host,
    )


def _calibrate_full(run: _Run, sizes: list[int], memory: bool) -> CalibrateResult:
    from bcgtune.core.plan.calibration import Calibration
    from bcgtune.engines import timing

    engine, say, seed = run.engine, run.say, run.spec.seed
    inputs = {n: engine.inputs(n, seed=seed + n) for n in sizes}
    # each kind measured in interleaved rounds over the sizes (time_interleaved), not a
    # block per size: every size sees the same mix of GPU clock and power states
    e_times = timing.time_interleaved(
        [[engine.eager_call(inputs[n])] for n in sizes], engine.device, run.warmup, run.repeats, seed=seed
    )
    eager = {n: timing.summarize_ms(t[0]) for n, t in zip(sizes, e_times)}
    for n in sizes:
        say(f"eager  n={n:6d}  {eager[n].median_ms:9.3f} ms")
    pbt = None
    if memory and engine.graphs_enabled:

        def make_solo(n: int) -> StaticPrefillEngine:
            if engine.simulated:
                return engine.fresh(n)
            from bcgtune.engines.full import FullPrefillEngine

            return FullPrefillEngine(engine.model, engine.device, n, sdpa_backend=run.spec.sdpa_backend)

        pbt = _pool_by_largest(sizes, make_solo, say)
    recs = _capture_all(engine, sizes)
    g_times = timing.time_interleaved(
        [[engine.replay_call(inputs[n], n)] for n in sizes], engine.device, run.warmup, run.repeats, seed=seed + 1
    )
    graph = {n: timing.summarize_ms(t[0]) for n, t in zip(sizes, g_times)}
    for n in sizes:
        say(f"replay b={n:6d}  {graph[n].median_ms:9.3f} ms")
    meta = run.meta("one sequence of n random tokens, seeded", "input copy + pad fill + replay")
    meta.update(
        {
            "attention_mismatches": [r.bucket for r in recs if not r.attention_match],
            "spread": {
                str(n): {
                    "eager_p10_p90": [eager[n].p10_ms, eager[n].p90_ms],
                    "graph_p10_p90": [graph[n].p10_ms, graph[n].p90_ms],
                }
                for n in sizes
            },
            "capture_s": {str(r.bucket): round(r.capture_s, 4) for r in recs},
        }
    )
    pool_gib, per_graph = _graph_memory(engine, recs, sizes, meta)
    cal = Calibration(
        tokens=np.asarray(sizes),
        eager_ms=np.asarray([eager[n].median_ms for n in sizes]),
        graph_ms=np.asarray([graph[n].median_ms for n in sizes]),
        pool_gib=pool_gib,
        per_graph_gib=per_graph,
        pool_by_tokens=pbt,
        meta=meta,
        runner="full",
        graph_rounds=np.asarray([t[0] for t in g_times], dtype=np.float64),
        eager_rounds=np.asarray([t[0] for t in e_times], dtype=np.float64),
    )
    rounds = CalibrationRounds(
        rows=list(sizes), graph_ms=[t[0] for t in g_times], batches=[(n, 1) for n in sizes], eager_ms=[t[0] for t in e_times]
    )
    _provenance(cal, run, sizes)
    engine.release()
    return CalibrateResult(cal, rounds)


# ---------------------------------------------------------------------------------------
# extending a calibration in place (`bcgtune calibrate --extend CAL --sizes LIST`)
# ---------------------------------------------------------------------------------------
@dataclass
class ExtendResult:
    """The calibration with the sizes added, and what the run measured: the sizes, the rows
    timed again beside them (anchors), and the scale that put the new run on the first's."""

    calibration: Calibration
    added: list[int]
    anchors: list[int]
    scale_graph: float | None
    scale_eager: float | None

    def to_json(self) -> dict[str, Any]:
        return self.calibration.to_json_obj()


def recorded_spec(cal: Calibration, where: str) -> EngineSpec:
    """The engine options a format-3 calibration recorded, as an EngineSpec (validated)."""
    from bcgtune.core.schema import validate

    if cal.engine_options is None or cal.graph_rounds is None:
        raise InputError(
            "this calibration keeps no timed rounds or engine options (written before format 3): "
            "run bcgtune calibrate again to extend it",
            where,
        )
    return validate(EngineSpec, cal.engine_options, where, prefix=("engine_options",))


def extend(
    path: str, sizes: Sequence[int], progress: Say | None = None, spec_check: Callable[[EngineSpec], None] | None = None
) -> ExtendResult:
    """Measure `sizes` into the calibration at `path` (not written here): the same engine
    (its recorded options), warm-up and number of rounds; beside them the rows nearest each
    (core.plan.calibration_extend.extension_anchors), timed again in the same rounds, so the new values
    are put on the calibration's scale (core.plan.calibration_extend.extend_calibration). The breakable
    runner times segments only (break and eager times belong to the trace's batches, which
    are measured already); the full runner times eager and replay. `spec_check(spec)` may
    refuse the recorded engine (options given on the command line that differ from it)."""
    import datetime as dt

    from bcgtune import __version__
    from bcgtune.core.plan.calibration import Calibration
    from bcgtune.core.plan.calibration_extend import extend_calibration, extension_anchors
    from bcgtune.engines import timing
    from bcgtune.engines.build import open_engine
    from bcgtune.engines.preflight import check_run
    from bcgtune.files.calibration_file import load_calibration

    cal = load_calibration(path)
    spec = recorded_spec(cal, path)
    if spec_check is not None:
        spec_check(spec)
    wanted = sorted({int(s) for s in sizes})
    new = [s for s in wanted if s not in set(cal.tokens.tolist())]
    if not new:
        raise InputError(f"the calibration has measured every size given already ({', '.join(map(str, wanted[:8]))})", "--sizes")
    anchors = extension_anchors(cal, new)
    measure = sorted(set(new) | set(anchors))
    first = cal.sessions[0] if cal.sessions else {}
    recorded_warmup = first.get("warmup")
    warmup: int = recorded_warmup if isinstance(recorded_warmup, int) else 3
    repeats = cal.rounds
    say = progress or (lambda msg: None)
    shape = check_run(spec, measure, what="calibration size")
    session = open_engine(spec, max(measure), shape)
    _same_gpu(cal, session.environment, path)
    engine = session.engine
    say(
        f"{len(new)} sizes to add, {len(anchors)} measured rows timed again beside them; {repeats} rounds after "
        f"{warmup} warm-up round{'s' if warmup != 1 else ''} (the calibration's)"
    )
    recs = _capture_all(engine, measure, record_attention=False)
    if spec.runner == "breakable":
        groups: list[list[Callable[[], object]]] = [[functools.partial(engine.replay_segments, b)] for b in measure]
    else:
        inputs = {n: engine.inputs(n, seed=spec.seed + n) for n in measure}
        groups = [[engine.eager_call(inputs[n])] for n in measure] + [[engine.replay_call(inputs[n], n)] for n in measure]
    times = timing.time_interleaved(
        groups,
        engine.device,
        warmup,
        repeats,
        seed=spec.seed + max(1, len(cal.sessions)),
        on_round=lambda done, total: say(f"round {done}/{total} done" + (" (warm-up)" if done <= warmup else "")),
    )
    k = len(measure)
    graph_rounds = np.asarray([t[0] for t in times[-k:]], dtype=np.float64)
    eager_rounds = np.asarray([t[0] for t in times[:k]], dtype=np.float64) if spec.runner == "full" else None
    measured = Calibration(
        tokens=np.asarray(measure),
        eager_ms=None if eager_rounds is None else np.median(eager_rounds, axis=1),
        graph_ms=np.median(graph_rounds, axis=1),
        meta={"capture_s": {str(r.bucket): round(r.capture_s, 4) for r in recs}},
        runner=spec.runner,
        graph_rounds=graph_rounds,
        eager_rounds=eager_rounds,
    )
    engine.release()
    created = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    merged = extend_calibration(cal, measured, {"created": created, "tool_version": __version__, "warmup": warmup})
    last = merged.sessions[-1]
    for n in new:
        i = int(np.searchsorted(merged.tokens, n))
        say(f"added  b={n:6d}  {merged.graph_ms[i]:9.3f} ms")
    return ExtendResult(merged, new, anchors, last.get("scale_graph"), last.get("scale_eager"))


def _same_gpu(cal: Calibration, env: dict[str, Any], where: str) -> None:
    """An extension runs on the GPU (and backend) the calibration was measured on."""
    gpu = cal.meta.get("gpu") if isinstance(cal.meta, dict) else None
    was = gpu.get("gpu_name") if isinstance(gpu, dict) else None
    now = env.get("gpu_name")
    soft = cal.meta.get("software") if isinstance(cal.meta, dict) else None
    was_backend = soft.get("backend") if isinstance(soft, dict) else None
    if (was or now) and was != now:
        raise InputError(f"this calibration was measured on {was or 'the CPU'}, this run is on {now or 'the CPU'}", where)
    if was_backend and env.get("backend") and was_backend != env.get("backend"):
        raise InputError(f"this calibration was measured with {was_backend}, this run with {env.get('backend')}", where)


def recheck_model(
    path: str,
    trace: PrefillTrace,
    lists: dict[str, list[int]],
    batches: int,
    progress: Say | None = None,
    eager: bool = False,
):
    """Check the model of the calibration at `path` again, on the lists given (name ->
    buckets; eager too with `eager`, as CheckPlan adds it), and return the new ModelCheck:
    after `calibrate --extend` added sizes that an optimum then picked, the model check made
    before them says nothing about that list. A size picked because its rounds came out fast
    is the one most likely to be priced low, so the list that is recommended is the one to
    replay (core.plan.model_check)."""
    from bcgtune.engines.build import open_engine
    from bcgtune.engines.preflight import check_run
    from bcgtune.files.calibration_file import load_calibration

    cal = load_calibration(path)
    spec = recorded_spec(cal, path)
    say = progress or (lambda msg: None)
    sizes = sorted({int(b) for bl in lists.values() for b in bl} | {int(trace.sizes[-1])})
    shape = check_run(spec, sizes, what="model-check size")
    session = open_engine(spec, max(sizes), shape)
    _same_gpu(cal, session.environment, path)
    first = cal.sessions[0] if cal.sessions else {}
    recorded_warmup = first.get("warmup")
    warmup: int = recorded_warmup if isinstance(recorded_warmup, int) else 3
    run = _Run(session.engine, session.environment, session.model, spec, warmup, cal.rounds, say)
    try:
        return check_model(run, cal, CheckPlan(trace, batches, lists, eager=eager))
    finally:
        session.engine.release()
