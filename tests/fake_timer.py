"""A stand-in for engines.timing.time_interleaved with known times: every call's time is a
function of what it runs (the calls are functools.partial of the engine's eager, replay
and replay_segments, whose arguments say the batch and the bucket), times (1 + eps[r]) in
round r. The calls still run once, so the engine's own path is exercised; only the clock is
replaced. Used through monkeypatch on bcgtune.engines.timing."""

from __future__ import annotations

import functools
import inspect

import numpy as np


def segments_ms(b: int) -> float:
    """Segment time of bucket b: 1 ms + 10 us per token, 0.3 ms less at multiples of 32
    (tile-aligned sizes replay faster than the sizes just above them)."""
    return 1.0 + 0.01 * b - (0.3 if b % 32 == 0 else 0.0)


def eager_ms(n: int, r: int) -> float:
    return 3.0 + 0.02 * n + 0.1 * r


def breaks_ms(n: int, r: int) -> float:
    return 0.2 + 0.001 * n + 0.05 * r


def base_ms(fn) -> float:
    """The known time of one engine call."""
    if not isinstance(fn, functools.partial):  # the full runner's eager call: a closure over its batch
        inner = inspect.unwrap(fn)
        x = next((c.cell_contents for c in inner.__closure__ or () if hasattr(c.cell_contents, "lengths")), None)
        if x is None:
            raise AssertionError(f"an engine call that says nothing of its batch: {fn!r}")
        return eager_ms(int(x.n), len(x.lengths))
    name = getattr(fn.func, "__name__", "")
    if name == "replay_segments":
        return segments_ms(int(fn.args[0]))
    x = fn.args[0]
    n, r = int(x.n), len(x.lengths)
    if name == "eager":
        return eager_ms(n, r)
    if name == "replay":
        b = int(fn.args[1]) if len(fn.args) > 1 else int(fn.keywords["bucket"])
        return segments_ms(b) + breaks_ms(n, r)
    raise AssertionError(f"unknown engine call {name}")


def fake_interleaved(real, eps, host_share: float = 1.0, run_calls: bool = True):
    """A time_interleaved whose round r multiplies every call's known time by 1 + eps[r]
    (len(eps) must be the number of rounds asked for); host launch time is host_share of it.
    `run_calls`: run every call once, so the engine's own path is exercised."""
    eps = np.asarray(eps, dtype=np.float64)

    def fake(groups, device, warmup, repeats, seed=0, on_round=None, host_out=None):
        assert repeats == eps.size, (repeats, eps.size)
        if run_calls:
            real(groups, device, 0, 1, seed)
        out = [[[base_ms(fn) * (1.0 + e) for e in eps] for fn in g] for g in groups]
        if host_out is not None:
            host_out[:] = [[[host_share * t for t in call] for call in g] for g in out]
        return out

    return fake
