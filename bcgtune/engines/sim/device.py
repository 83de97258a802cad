"""One simulated process on the simulated GPU: its clock (simulated device milliseconds), and
what a real process draws once or wanders through while it runs (noise.py): a level shift of
every time, a slow drift of every time, the host's speed at launching eager forwards. Each
call is the truth (truth.py) times those, times its own heavy-tailed noise, and advances the
clock by what it took.

One device per (recorded calibration, seed) in a Python process: every engine a bcgtune
command opens on it (each step of a tune builds its own) shares its clock and its draws, as
the engines of one real process share one GPU. Pure numpy; no torch."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from bcgtune.engines.sim.noise import NoiseProfile
from bcgtune.engines.sim.truth import _P90_NORMAL, SimTruth


@dataclass
class _Wander:
    """An Ornstein-Uhlenbeck log factor: stationary sd `sd`, memory `tau_s` seconds."""

    sd: float
    tau_s: float
    x: float = 0.0

    def step(self, dt_s: float, rng: np.random.Generator) -> None:
        if self.sd <= 0 or dt_s <= 0:
            return
        a = math.exp(-dt_s / max(self.tau_s, 1e-9))
        self.x = self.x * a + self.sd * math.sqrt(max(0.0, 1.0 - a * a)) * float(rng.standard_normal())


@dataclass
class SimDevice:
    """The simulated GPU of one process (`type` "sim", as engines/timing reads it)."""

    truth: SimTruth
    profile: NoiseProfile
    seed: int
    name: str = "simulated GPU"
    type: str = "sim"
    index: None = None
    clock_ms: float = 0.0
    calls: int = 0
    _rng: Any = None
    _level: float = 0.0
    _drift: _Wander = field(default_factory=lambda: _Wander(0.0, 1.0))
    _host: _Wander = field(default_factory=lambda: _Wander(0.0, 1.0))
    _last_host_bound: bool = False

    def __post_init__(self) -> None:
        p = self.profile
        self._rng = np.random.default_rng([int(self.seed), 0x51D])
        self._level = float(self._rng.normal(0.0, p.level_sd))
        self._drift = _Wander(p.drift_sd, p.drift_tau_s, float(self._rng.normal(0.0, p.drift_sd)))
        self._host = _Wander(p.host_sd, p.host_tau_s, float(self._rng.normal(0.0, p.host_sd)))
        # the t noise scaled so that its p10-p90 width is a normal's of the same sd
        df = p.tail_df
        self._t_scale = _P90_NORMAL / _t_p90(df) if df > 0 else 1.0

    def __str__(self) -> str:
        return "sim"

    # ---- the clock -------------------------------------------------------------------
    def now_ms(self) -> float:
        return self.clock_ms

    def now_s(self) -> float:
        return self.clock_ms / 1e3

    def advance(self, ms: float) -> None:
        """The clock moves on (the device busy or idle), and what wanders wanders."""
        ms = max(0.0, float(ms))
        self.clock_ms += ms
        self._drift.step(ms / 1e3, self._rng)
        self._host.step(ms / 1e3, self._rng)

    def sync(self) -> None:
        """A synchronization between two calls: its own small cost."""
        self.advance(self.profile.sync_ms)

    def spend_s(self, seconds: float) -> None:
        """Work that is not a timed forward (a model build, a capture): seconds on the clock."""
        self.advance(seconds * 1e3)

    # ---- one call ---------------------------------------------------------------------
    def noise(self, sd_rel: float) -> float:
        """1 + a heavy-tailed relative noise of scale sd_rel (never below 0.2)."""
        sd = sd_rel * self.profile.call_sd_scale
        if sd <= 0:
            return 1.0
        df = self.profile.tail_df
        z = float(self._rng.standard_t(df)) * self._t_scale if df > 0 else float(self._rng.standard_normal())
        return max(0.2, 1.0 + sd * z)

    def run(self, true_ms: float, sd_rel: float, offset: float = 0.0) -> float:
        """One call whose true time is `true_ms`: its simulated time (ms), which the clock
        advances by. `offset`: its graph's capture offset."""
        ms = true_ms * math.exp(self._level + self._drift.x) * (1.0 + offset) * self.noise(sd_rel)
        self._last_host_bound = False
        self.calls += 1
        self.advance(ms)
        return ms

    def run_eager(self, n: int, r: int, sd_rel: float) -> float:
        """One eager forward: its launches at the host's speed now (truth.eager_at_host)."""
        truth = self.truth
        host = math.exp(self._host.x)
        true_ms = truth.eager_at_host(n, r, host)
        ms = true_ms * math.exp(self._level + self._drift.x) * self.noise(sd_rel)
        self._last_host_bound = truth.launch_ms * host > float(truth.device_ms(n, r))
        self.calls += 1
        self.advance(ms)
        return ms

    def last_host_ms(self, ms: float) -> float:
        """The host launch time of the last call of `ms` (engines/timing's host_out): the whole
        call for a launch-bound eager forward (the device waits on the host's launches until
        the last one), a few microseconds for a replay or a forward the device's work bounds."""
        return ms if self._last_host_bound else min(ms, 0.01)

    def draw_offset(self) -> float:
        """A new capture's offset against the mean of all captures of its size."""
        return float(self._rng.normal(0.0, self.profile.capture_sd))

    def describe(self) -> dict[str, Any]:
        return {
            "clock_s": round(self.now_s(), 4),
            "calls": self.calls,
            "level_shift_pct": round(100 * (math.exp(self._level) - 1), 4),
        }


def _t_p90(df: float) -> float:
    """Student t's 0.9 quantile (df > 0), by bisection on its CDF (no scipy)."""
    lo, hi = 0.0, 20.0
    for _ in range(80):
        mid = (lo + hi) / 2
        if _t_cdf(mid, df) < 0.9:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def _t_cdf(x: float, df: float) -> float:
    """Student t's CDF at x >= 0 by Simpson integration of its density (enough for a scale)."""
    c = math.exp(math.lgamma((df + 1) / 2) - math.lgamma(df / 2)) / math.sqrt(df * math.pi)
    n = 400
    h = x / n
    s = 0.0
    for i in range(n + 1):
        t = i * h
        f = c * (1 + t * t / df) ** (-(df + 1) / 2)
        s += f * (1 if i in (0, n) else 4 if i % 2 else 2)
    return 0.5 + s * h / 3


_DEVICES: dict[tuple[str, int], SimDevice] = {}


def sim_device(cal_key: str, truth_factory, profile: NoiseProfile, seed: int) -> SimDevice:
    """The simulated device of (calibration, seed) in this process: made once, shared by
    every engine opened on it."""
    key = (cal_key, int(seed))
    dev = _DEVICES.get(key)
    if dev is None:
        dev = SimDevice(truth_factory(), profile, int(seed))
        _DEVICES[key] = dev
    return dev


def forget_devices() -> None:
    """Drop every simulated device of this process (a new process's draws follow)."""
    _DEVICES.clear()
