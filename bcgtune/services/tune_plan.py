"""The time budget of `bcgtune tune`, planned before anything is measured.

A tune first times a few forwards of the model on the device (`probe`: a model build, a
capture and a replay and an eager forward at five sizes spanning the trace), then picks what
each step measures so that the whole tune fits `--budget` (device seconds: wall time on a
GPU or the CPU, the simulated clock on the simulated device), and predicts each step's
seconds. Options the user gave are kept as given; a note says when they alone exceed the
budget. After each step the rest is planned again with what is left, each later step's
prediction made from the calibration once there is one (its per-batch times) and from the
probe before that; the measuring rounds and the proof take what remains.

How it picks: the calibration (grid, batch mix, rounds, model-check batches, graph-memory
curve) and the proof (the whole trace or a sample, its rounds) each walk down a ladder of
settings from rich to lean (CAL_LEVELS, PROOF_LEVELS); the pair whose levels sum lowest
among those that fit is taken (the calibration first on ties), so neither is starved for the
other. The plan aims at PLAN_TARGET of the budget: slack for what a prediction misses.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from bcgtune.core.plan.measure_defaults import TUNE_BUDGET_CPU_S, TUNE_BUDGET_S
from bcgtune.core.sglang.replay import DEFAULT_PADDING_FACTOR

Say = Callable[[str], None]

DEFAULT_BUDGET_S = TUNE_BUDGET_S
CPU_BUDGET_S = TUNE_BUDGET_CPU_S
PLAN_TARGET = 0.9
PROBE_SIZES = 5
PROBE_ROUNDS = (1, 3)
# (grid, every Nth distinct batch of the mix, (warm-up, timed) rounds, model-check batches, graph-memory curve)
CAL_LEVELS: tuple[tuple[int, int, tuple[int, int], int, bool], ...] = (
    (64, 1, (3, 10), 200, True),
    (64, 2, (3, 10), 200, True),
    (128, 2, (3, 10), 200, False),
    (128, 4, (2, 8), 150, False),
    (128, 8, (2, 8), 120, False),
    (256, 8, (2, 8), 100, False),
    (256, 16, (1, 6), 64, False),
    (256, 32, (1, 5), 48, False),
    (512, 32, (1, 5), 40, False),
    (512, 64, (1, 4), 40, False),
    (1024, 64, (1, 3), 30, False),
    (1024, 128, (1, 3), 20, False),
)
# (batches, None: the whole trace; (warm-up, timed) rounds)
PROOF_LEVELS: tuple[tuple[int | None, tuple[int, int]], ...] = (
    (None, (1, 5)),
    (1600, (1, 5)),
    (800, (1, 5)),
    (400, (1, 5)),
    (240, (1, 5)),
    (160, (1, 5)),
    (100, (1, 5)),
    (64, (1, 5)),
    (48, (1, 4)),
    (32, (1, 3)),
    (24, (1, 3)),
)
CHECK_ROUNDS = (1, 5)  # services/calibrate.CHECK_ROUNDS: the model check's rounds at most
VALIDATE_CALLS_PER_BUCKET = 12  # run_validate(sizes_per_bucket=2): 4 batches, eager and replay, pad invariance
HOST_PLAN_S = 1.0  # a GPU's or CPU's wall time for one pricing of the trace (the optimizer): host work
EXTRA_ROUNDS = 0.5  # a measuring round after the first: priced at half a round each (often the last wants few sizes)


# ---------------------------------------------------------------------------------------
# the device's costs, from a probe
# ---------------------------------------------------------------------------------------
@dataclass
class CostModel:
    """What the probe measured: seconds to build the model, and at a few sizes a capture
    (s), a replay of one request in its own bucket and an eager forward (ms per call, its
    synchronization included), on the tune's clock."""

    sizes: list[int]
    replay_ms: list[float]
    eager_ms: list[float]
    capture_s: list[float]
    build_s: float
    host_plan_s: float
    clock: str  # "simulated" or "wall"

    def _at(self, ys: list[float], n) -> np.ndarray:
        xs = np.asarray(self.sizes, dtype=np.float64)
        y = np.asarray(ys, dtype=np.float64)
        x = np.asarray(n, dtype=np.float64)
        if xs.size == 1:
            return np.full(x.shape, float(y[0])) * np.maximum(x / max(xs[0], 1.0), 1.0)
        out = np.interp(x, xs, y)
        hi = x > xs[-1]
        if hi.any():
            slope = max((y[-1] - y[-2]) / max(xs[-1] - xs[-2], 1.0), 0.0)
            out = np.where(hi, y[-1] + slope * (x - xs[-1]), out)
        return np.maximum(out, 0.0)

    def replay(self, n) -> np.ndarray:
        return self._at(self.replay_ms, n)

    def eager(self, n) -> np.ndarray:
        return self._at(self.eager_ms, n)

    def capture(self, b) -> np.ndarray:
        return self._at(self.capture_s, b)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> CostModel:
        return cls(
            sizes=[int(x) for x in obj["sizes"]],
            replay_ms=[float(x) for x in obj["replay_ms"]],
            eager_ms=[float(x) for x in obj["eager_ms"]],
            capture_s=[float(x) for x in obj["capture_s"]],
            build_s=float(obj["build_s"]),
            host_plan_s=float(obj["host_plan_s"]),
            clock=str(obj["clock"]),
        )


def clock_of(spec) -> Callable[[], float]:
    """Seconds on the tune's clock: the simulated device's, else wall time."""
    from bcgtune.engines.spec import is_simulated

    if is_simulated(spec):
        from bcgtune.engines.sim.engine import device_of

        dev = device_of(spec)
        return dev.now_s
    return time.perf_counter


def probe(spec, tokens: np.ndarray, say: Say) -> CostModel:
    """Build the model, capture PROBE_SIZES sizes spanning the trace's batches and time a
    replay and an eager forward at each (each call from an idle device, its synchronization
    counted): the costs every prediction rests on until a calibration exists."""
    from bcgtune.engines.build import open_engine
    from bcgtune.engines.preflight import check_run
    from bcgtune.engines.spec import is_simulated

    sizes = sorted({int(x) for x in np.quantile(np.asarray(tokens), np.linspace(0, 1, PROBE_SIZES), method="nearest")})
    clock = clock_of(spec)
    shape = check_run(spec, sizes, what="probe size")
    t0 = clock()
    session = open_engine(spec, max(sizes), shape)
    engine = session.engine
    build_s = clock() - t0
    cap: dict[int, float] = {}
    if engine.graphs_enabled:
        for r in engine.capture(sizes, record_attention=False):
            cap[r.bucket] = r.capture_s
    else:
        engine.declare(sizes)
    sync = _sync_of(engine)
    replay, eager = [], []
    for n in sizes:
        x = engine.inputs(n, seed=spec.seed + n)
        replay.append(_per_call_ms(engine.replay_call(x, n), clock, sync))
        eager.append(_per_call_ms(engine.eager_call(x), clock, sync))
    engine.release()
    sim = is_simulated(spec)
    cost = CostModel(
        sizes=sizes,
        replay_ms=replay,
        eager_ms=eager,
        capture_s=[cap.get(n, 0.0) for n in sizes],
        build_s=build_s,
        host_plan_s=0.0 if sim else HOST_PLAN_S,
        clock="simulated" if sim else "wall",
    )
    say(
        f"  probe: build {build_s:.1f} s; at {sizes[0]:,}..{sizes[-1]:,} tokens replay {replay[0]:.1f}..{replay[-1]:.1f} ms, "
        f"eager {eager[0]:.1f}..{eager[-1]:.1f} ms"
        + (f", capture {cost.capture_s[0]:.2f}..{cost.capture_s[-1]:.2f} s" if cap else "")
    )
    return cost


def _sync_of(engine) -> Callable[[], None]:
    if engine.device.type == "sim":
        return engine.device.sync
    if engine.device.type == "cuda":
        import torch

        return lambda: torch.cuda.synchronize(engine.device)
    return lambda: None


def _per_call_ms(fn, clock, sync) -> float:
    """Median ms of one call from an idle device to its end, over PROBE_ROUNDS."""
    w, r = PROBE_ROUNDS
    for _ in range(w):
        fn()
    out = []
    for _ in range(r):
        sync()
        t0 = clock()
        fn()
        sync()
        out.append((clock() - t0) * 1e3)
    return float(np.median(out))


# ---------------------------------------------------------------------------------------
# the predictions
# ---------------------------------------------------------------------------------------
@dataclass
class TracePlanView:
    """What the predictions need of the trace: its batches in order and its mix."""

    tokens: np.ndarray
    requests: np.ndarray
    mix_tokens: np.ndarray
    mix_requests: np.ndarray
    chunk: int
    sizes: np.ndarray

    @classmethod
    def of(cls, trace, chunk: int | None, seed: int) -> TracePlanView:
        from bcgtune.core.plan.bucket_plan import assumed_chunked_prefill_size
        from bcgtune.core.plan.model_check import trace_sequence
        from bcgtune.core.trace.mix import batch_mix

        tok, req, _ = trace_sequence(trace, seed=seed)
        mix = batch_mix(trace)
        return cls(tok, req, mix.tokens, mix.requests, assumed_chunked_prefill_size(trace, chunk), np.asarray(trace.sizes))


def predict_calibrate(cost: CostModel, view: TracePlanView, grid: int, mix_every: int, rounds: tuple[int, int],
                      check: int, memory: bool, gpu: bool, runner: str) -> float:  # fmt: skip
    """Seconds of the calibrate step: build, captures (and the graph-memory curve), every
    size and batch in the rounds, the model check (ladder, optimum and eager replayed on
    `check` batches)."""
    from bcgtune.core.sglang.ladder import sglang_default_ladder
    from bcgtune.services.calibrate import grid_sizes, pool_subset

    sizes = np.asarray(grid_sizes(grid, max_tokens=view.chunk, trace_sizes=view.sizes), dtype=np.int64)
    step = max(1, mix_every)
    pairs_n = view.mix_tokens[::step]
    buckets = sizes[np.clip(np.searchsorted(sizes, pairs_n), 0, sizes.size - 1)]
    calls = rounds[0] + rounds[1]
    if runner == "breakable":
        per_round = cost.replay(sizes).sum() + (cost.eager(pairs_n) + cost.replay(buckets) * 2).sum()
        n_calls = sizes.size + 3 * pairs_n.size
    else:  # full: eager and replay at every size
        per_round = (cost.replay(sizes) + cost.eager(sizes)).sum()
        n_calls = 2 * sizes.size
    seconds = cost.build_s + calls * per_round / 1e3 + cost.host_plan_s
    if gpu:
        seconds += float(cost.capture(sizes).sum())
        if memory:
            seconds += float(cost.capture(np.asarray(pool_subset(sizes.tolist()))).sum())
    del n_calls
    if check > 0:
        every = max(1, -(-view.tokens.size // check))
        st = view.tokens[::every]
        check_calls = min(rounds[0], CHECK_ROUNDS[0]) + min(rounds[1], CHECK_ROUNDS[1])
        per = (2 * cost.replay(st) + cost.eager(st)).sum()
        seconds += check_calls * per / 1e3 + cost.host_plan_s
        if gpu:
            ladder = np.asarray(sglang_default_ladder(view.chunk))
            seconds += float(cost.capture(ladder).sum()) + float(cost.capture(sizes[-12:]).sum())
    return float(seconds)


def predict_validate(cost: CostModel, buckets: list[int], gpu: bool) -> float:
    """Seconds of the validate step: build, capture, a dozen forwards per bucket."""
    if not buckets:
        return 0.0
    b = np.asarray(buckets, dtype=np.int64)
    seconds = cost.build_s + VALIDATE_CALLS_PER_BUCKET * float((cost.replay(b) + cost.eager(b)).sum()) / 2e3
    return seconds + (float(cost.capture(b).sum()) if gpu else 0.0)


def predict_check(cost: CostModel, pricing_rows: np.ndarray, rounds: tuple[int, int], buckets: np.ndarray, gpu: bool) -> float:
    """Seconds of a model check on a sample: a fresh engine (no build), its lists' graphs
    captured, every list's batches (ms per batch summed over the lists) in its rounds."""
    calls = min(rounds[0], CHECK_ROUNDS[0]) + min(rounds[1], CHECK_ROUNDS[1])
    seconds = calls * float(np.sum(pricing_rows)) / 1e3 + cost.host_plan_s
    return seconds + (float(cost.capture(buckets).sum()) if gpu and buckets.size else 0.0)


# ---------------------------------------------------------------------------------------
# the plan
# ---------------------------------------------------------------------------------------
@dataclass
class TunePlan:
    """What each step measures, and each step's predicted seconds."""

    limit_s: float
    grid: int
    mix_every: int
    warmup: int
    repeats: int
    check_batches: int
    memory: bool
    measure_rounds: int
    proof_batches: int | None  # None: the whole trace
    proof_warmup: int
    proof_repeats: int
    predicted: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    given: list[str] = field(default_factory=list)  # the settings the user gave (kept as given)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> TunePlan:
        return cls(**{k: obj[k] for k in cls.__dataclass_fields__ if k in obj})

    def describe(self, trace_batches: int) -> str:
        p = self.predicted
        proof = "the whole trace" if self.proof_batches is None or self.proof_batches >= trace_batches else (
            f"{self.proof_batches:,} of {trace_batches:,} batches (stratified)"
        )  # fmt: skip
        parts = [
            f"probe {p.get('plan', 0):.0f} s",
            f"calibrate grid {self.grid}, every {self.mix_every} of the distinct batches, {self.repeats} rounds after "
            f"{self.warmup}, model check on {self.check_batches} batches{', graph-memory curve' if self.memory else ''}: "
            f"{p.get('calibrate', 0):.0f} s",
            f"measure at most {self.measure_rounds} rounds: {p.get('measure', 0):.0f} s",
            f"validate: {p.get('validate', 0):.0f} s",
            f"proof on {proof}, {self.proof_repeats} rounds after {self.proof_warmup}: {p.get('proof', 0):.0f} s",
        ]
        return f"plan for a budget of {self.limit_s:.0f} s (predicted {sum(p.values()):.0f} s): " + "; ".join(parts)


def initial_plan(req, cost: CostModel, view: TracePlanView, limit: float, spent: float, gpu: bool) -> TunePlan:
    """The plan made after the probe: the calibration and proof levels that fit what is left
    of the budget together, with the user's options kept as given."""
    given = {k: getattr(req, k) for k in ("grid", "mix_every", "warmup", "repeats", "check_batches", "memory")}
    avail = limit * PLAN_TARGET - spent
    n = int(view.tokens.size)
    k = min(int(req.max_buckets), 12)
    rec_guess = np.unique(np.quantile(view.tokens, np.linspace(0.05, 1, k), method="nearest"))
    validate_s = predict_validate(cost, rec_guess.tolist(), gpu)
    best: tuple[int, int, float, float, tuple, tuple] | None = None
    for i, lvl in enumerate(CAL_LEVELS):
        cal = _merge_cal(lvl, given)
        cal_s = predict_calibrate(cost, view, cal[0], cal[1], cal[2], cal[3], cal[4], gpu, req.spec.runner)
        measure_s = _measure_guess(cost, view, cal, k, gpu, req.measure_rounds)
        for j, plvl in enumerate(_proof_levels(req, n)):
            proof_s = _proof_guess(cost, view, plvl, req.passes, gpu)
            if cal_s + measure_s + validate_s + proof_s <= avail and (best is None or i + j < best[0] + best[1]):
                best = (i, j, cal_s, measure_s, cal, plvl)
                break
    notes = []
    if best is None:  # nothing fits: the leanest of each, and a note
        cal = _merge_cal(CAL_LEVELS[-1], given)
        plvl = _proof_levels(req, n)[-1]
        cal_s = predict_calibrate(cost, view, cal[0], cal[1], cal[2], cal[3], cal[4], gpu, req.spec.runner)
        best = (len(CAL_LEVELS) - 1, 0, cal_s, _measure_guess(cost, view, cal, k, gpu, req.measure_rounds), cal, plvl)
        notes.append(f"even the leanest plan is predicted beyond the budget of {limit:.0f} s")
    _, _, cal_s, measure_s, cal, plvl = best
    proof_s = _proof_guess(cost, view, plvl, req.passes, gpu)
    given_names = [k for k, v in given.items() if v is not None]
    for k_, v in (("proof_batches", req.proof_batches), ("proof_repeats", req.proof_repeats)):
        if v is not None:
            given_names.append(k_)
    plan = TunePlan(
        limit_s=limit,
        grid=cal[0],
        mix_every=cal[1],
        warmup=cal[2][0],
        repeats=cal[2][1],
        check_batches=cal[3],
        memory=cal[4],
        measure_rounds=int(req.measure_rounds),
        proof_batches=plvl[0],
        proof_warmup=plvl[1][0],
        proof_repeats=plvl[1][1],
        predicted={
            "plan": spent,
            "calibrate": cal_s,
            "optimum": cost.host_plan_s,
            "measure": measure_s,
            "validate": validate_s,
            "proof": proof_s,
        },  # fmt: skip
        notes=notes,
        given=given_names,
    )
    total = sum(plan.predicted.values())
    if given_names and total > limit:
        plan.notes.append(
            f"the options given ({', '.join('--' + g.replace('_', '-') for g in given_names)}) make this tune predicted "
            f"{total:.0f} s, beyond the budget of {limit:.0f} s: they are kept as given"
        )
    return plan


def _merge_cal(lvl, given: dict[str, Any]) -> tuple[int, int, tuple[int, int], int, bool]:
    grid, mix, rounds, check, memory = lvl
    w = given["warmup"] if given["warmup"] is not None else rounds[0]
    r = given["repeats"] if given["repeats"] is not None else rounds[1]
    return (
        given["grid"] if given["grid"] is not None else grid,
        given["mix_every"] if given["mix_every"] is not None else mix,
        (w, r),
        given["check_batches"] if given["check_batches"] is not None else check,
        given["memory"] if given["memory"] is not None else memory,
    )


def _proof_levels(req, n: int) -> list[tuple[int | None, tuple[int, int]]]:
    out: list[tuple[int | None, tuple[int, int]]] = []
    for b, rounds in PROOF_LEVELS:
        if b is not None and b >= n:
            continue
        pb = req.proof_batches if req.proof_batches is not None else b
        w = req.proof_warmup if req.proof_warmup is not None else rounds[0]
        r = req.proof_repeats if req.proof_repeats is not None else rounds[1]
        lvl = (pb, (w, r))
        if lvl not in out:
            out.append(lvl)
    return out


def _measure_guess(cost: CostModel, view: TracePlanView, cal, k: int, gpu: bool, rounds: int) -> float:
    """A measuring round of about half a list's sizes beside their neighbours, and the model
    check again on the ladder, the list and eager (before the optimum says what it wants)."""
    if rounds <= 0:
        return 0.0
    sizes = np.unique(np.quantile(view.tokens, np.linspace(0.1, 1, max(1, k // 2)), method="nearest"))
    timed = (cal[2][0] + cal[2][1]) * float(cost.replay(sizes).sum()) * 5 / 1e3  # each size and its 4 anchors
    every = max(1, -(-view.tokens.size // max(1, cal[3])))
    st = view.tokens[::every]
    check = predict_check(cost, 2 * cost.replay(st) + cost.eager(st), cal[2], sizes, gpu)
    capture = float(cost.capture(sizes).sum()) * 5 if gpu else 0.0
    return cost.build_s * 2 + timed * (1 + EXTRA_ROUNDS * (rounds - 1)) + capture + check + cost.host_plan_s


def _proof_guess(cost: CostModel, view: TracePlanView, plvl, passes: int, gpu: bool) -> float:
    """The proof before the lists are known: the recommended list, the ladder and eager
    (about two replays and an eager forward per batch) on its batches; a sample weighted by
    predicted time holds the dearer batches more often."""
    from bcgtune.core.sglang.ladder import sglang_default_ladder

    b, rounds = plvl
    w = 2 * cost.replay(view.tokens) + cost.eager(view.tokens)
    n = view.tokens.size
    per = float(w.sum()) if b is None or b >= n else float(b) * float((w * w).sum() / max(w.sum(), 1e-9))
    seconds = cost.build_s + passes * (rounds[0] + rounds[1]) * per / 1e3
    if gpu:
        seconds += float(cost.capture(np.asarray(sglang_default_ladder(view.chunk))).sum()) * 1.2
    return seconds + cost.host_plan_s


def predict_proof_exact(cost: CostModel, pricing, design, lists: dict[str, list[int]], rounds: tuple[int, int],
                        passes: int, gpu: bool) -> float:  # fmt: skip
    """The proof's seconds once its lists and batches are known (the calibration prices every
    list's batches: TracePricing)."""
    per = sum(float(pricing.time[n][design.index].sum()) for n in lists)
    seconds = cost.build_s + passes * (rounds[0] + rounds[1]) * per / 1e3
    if gpu:
        used: set[int] = set()
        for n, bl in lists.items():
            if bl:
                used.update(int(b) for b in np.unique(pricing.chosen[n][design.index]) if b > 0)
        used.update(int(b) for b in lists.get("recommended", []))
        seconds += float(cost.capture(np.asarray(sorted(used))).sum()) if used else 0.0
    return seconds + cost.host_plan_s


def proof_fit(cost: CostModel, pricing, tok: np.ndarray, lists, req, left_s: float, gpu: bool, seed: int):
    """The richest proof level that fits `left_s` (its design and prediction), the leanest
    when none does; the user's proof options kept."""
    from bcgtune.services.tune_proof import design_for

    levels = _proof_levels(req, int(tok.size))
    chosen = None
    for b, rounds in levels:
        design = design_for(pricing, tok, lists, b if b is not None else int(tok.size), seed)
        s = predict_proof_exact(cost, pricing, design, lists, rounds, req.passes, gpu)
        chosen = (b, rounds, design, s)
        if s <= left_s:
            return chosen, True
    assert chosen is not None
    return chosen, False


def default_budget(gpu: bool) -> float:
    return DEFAULT_BUDGET_S if gpu else CPU_BUDGET_S


__all__ = [
    "CostModel",
    "TracePlanView",
    "TunePlan",
    "DEFAULT_BUDGET_S",
    "CPU_BUDGET_S",
    "DEFAULT_PADDING_FACTOR",
]
