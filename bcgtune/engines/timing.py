"""Timing of engine calls: back-to-back repeats (`time_calls`) and interleaved rounds over
many calls (`time_interleaved`), CUDA events on a GPU, perf_counter on CPU, and the
simulated clock on the simulated device (engines/sim: a call advances its clock by the time
it simulates; no torch there). Python's garbage collector is paused while timing (a
launch-bound forward is Python work, and a collection inside one is noise, not cost)."""

from __future__ import annotations

import contextlib
import random
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

Call = Callable[[], object]
# times[group][call][round] in ms: every call of every group, one value per timed round
RoundTimes = list[list[list[float]]]


@dataclass(frozen=True)
class TimeSummary:
    """Median, p10 and p90 (ms) of a list of times."""

    median_ms: float
    p10_ms: float
    p90_ms: float
    repeats: int


def summarize_ms(times: Sequence[float]) -> TimeSummary:
    """Median, p10 and p90 (ms) of a list of times (nearest-rank quantiles)."""
    ordered = sorted(float(t) for t in times)

    def q(p: float) -> float:
        return ordered[min(len(ordered) - 1, int(p * (len(ordered) - 1) + 0.5))]

    return TimeSummary(statistics.median(ordered), q(0.1), q(0.9), len(ordered))


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Python's garbage collector off while timing (and back on after, if it was on)."""
    import gc

    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def time_calls(fn: Call, device: Any, warmup: int, repeats: int) -> TimeSummary:
    """Median, p10 and p90 (ms) of `repeats` back-to-back calls after `warmup` untimed ones:
    CUDA events on a GPU (host-side launch gaps included when the GPU waits for them),
    perf_counter on CPU."""
    for _ in range(max(0, warmup)):
        fn()
    with gc_paused():
        return summarize_ms(_back_to_back(fn, device, repeats))


def _back_to_back(fn: Call, device: Any, repeats: int) -> list[float]:
    if device.type == "sim":
        return [_sim_call(fn, device) for _ in range(repeats)]
    if device.type != "cuda":
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
        return times
    import torch

    stream = torch.cuda.current_stream(device)
    evs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(repeats)]
    torch.cuda.synchronize(device)
    for s, e in evs:
        s.record(stream)
        fn()
        e.record(stream)
    torch.cuda.synchronize(device)
    return [s.elapsed_time(e) for s, e in evs]


def time_interleaved(
    groups: Sequence[Sequence[Call]],
    device: Any,
    warmup: int,
    repeats: int,
    seed: int = 0,
    on_round: Callable[[int, int], None] | None = None,
    host_out: RoundTimes | None = None,
) -> RoundTimes:
    """Times (ms) of every call in `groups`, measured in rounds: each round runs every group
    once, the groups in a fresh shuffled order, the calls of a group back to back (a pair
    such as segments-alone and the full replay of the same bucket lands in the same moment
    of the GPU's clock and power state, so their difference is free of drift). `warmup`
    untimed rounds first; `on_round(done, total)` after each round, warm-up included.
    Returns times[group][call][round]: every round's value, in round order.

    Each call starts on an idle GPU (a synchronization before it, none inside it), as a
    server's prefill step does (its scheduler waits for every step's output): the time is
    then the call's own, host launch gaps included. Without it a launch-bound call that
    follows queued work hides its launches behind that work and measures shorter, by how
    much depending on its neighbour (seen on the H200: eager forwards of a 0.6B-shaped model
    16% shorter between graph replays than between other eager forwards).

    Measuring every size in rounds instead of in blocks (all repeats of one size, then the
    next) gives every size the same mix of GPU states: on a long run a block measured while
    the GPU is cool or warm shifts that size alone, which no later average undoes.

    `host_out` (a list, filled like the result): each call's host time, from its start to
    the moment the host returns from launching its work (ms). A call whose host time is
    nearly its whole time kept the GPU waiting on its launches: it is launch-bound, and its
    time is the host CPU's (on CPU the two are the same)."""
    rng = random.Random(seed)
    report = on_round or (lambda done, total: None)
    order = list(range(len(groups)))
    total = max(0, warmup) + repeats
    with _no_grad(device):
        for w in range(max(0, warmup)):
            rng.shuffle(order)
            for g in order:
                for fn in groups[g]:
                    _sim_call(fn, device) if device.type == "sim" else fn()
            report(w + 1, total)
        out: RoundTimes = [[[] for _ in grp] for grp in groups]
        host: RoundTimes = [[[] for _ in grp] for grp in groups]
        with gc_paused():
            for rnd in range(repeats):
                rng.shuffle(order)
                _one_round(groups, order, device, out, host)
                report(max(0, warmup) + rnd + 1, total)
    if host_out is not None:
        host_out[:] = host
    return out


def _no_grad(device: Any) -> contextlib.AbstractContextManager[Any]:
    """torch.no_grad() where torch runs the calls; nothing on the simulated device."""
    if device.type == "sim":
        return contextlib.nullcontext()
    import torch

    return torch.no_grad()


def _sim_call(fn: Call, device: Any) -> float:
    """One call on the simulated device, from an idle device (the synchronization between
    calls costs its simulated time too): the simulated ms the call took."""
    device.sync()
    t0 = device.now_ms()
    fn()
    return device.now_ms() - t0


def _one_round(groups: Sequence[Sequence[Call]], order: list[int], device: Any, out: RoundTimes, host: RoundTimes) -> None:
    """Every call once, groups in `order`, each call's time appended to out[group][call]
    and its host launch time to host[group][call] (on the simulated device, the host time a
    launch-bound call simulates)."""
    if device.type == "sim":
        for g in order:
            for i, fn in enumerate(groups[g]):
                ms = _sim_call(fn, device)
                out[g][i].append(ms)
                host[g][i].append(device.last_host_ms(ms))
        return
    if device.type != "cuda":
        for g in order:
            for i, fn in enumerate(groups[g]):
                t0 = time.perf_counter()
                fn()
                ms = (time.perf_counter() - t0) * 1e3
                out[g][i].append(ms)
                host[g][i].append(ms)
        return
    import torch

    stream = torch.cuda.current_stream(device)
    marks = []
    for g in order:
        for i, fn in enumerate(groups[g]):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize(device)  # between calls, never inside one
            s.record(stream)
            t0 = time.perf_counter()
            fn()
            host[g][i].append((time.perf_counter() - t0) * 1e3)
            e.record(stream)
            marks.append((g, i, s, e))
    torch.cuda.synchronize(device)
    for g, i, s, e in marks:
        out[g][i].append(s.elapsed_time(e))
