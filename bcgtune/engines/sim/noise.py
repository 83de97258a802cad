"""What varies on the simulated device, and by how much.

Two sources. The recorded calibration itself gives the round-to-round spread of each size it
measured (its kept rounds, or the p10-p90 spreads that older formats kept), so a simulated
8B-shaped model is as noisy as the recording was, size by size. Everything a calibration
cannot show comes from `FITTED`, which `benchmarks/fit_sim_noise.py` computes from the H200
measurements in benchmarks/results and benchmarks/RESULTS.md (run it to see each figure
beside its data; tests/test_sim.py checks that these constants are its output):

  rough_sd      size-to-size roughness of the true time curve, as a share of it: what a
                measured size says about its neighbours. Leave-one-out interpolation of the
                dense H200 calibrations leaves 0.9% (Qwen3-0.6B shape) and 1.7-2.1% (8B) beyond
                their measurement noise, about the same at gaps of 16 and of 500 tokens: the
                roughness is short-range (a new value every `rough_step` tokens). A recording
                dense enough to tell gives its own (`roughness_of`); FITTED's is the median.
  level_sd      the shift of every time between processes (log sd): the same lists measured
                in three processes, and the 1.5-2.3% between a check and a proof process.
  drift_sd/tau  a slow wander of every time within a process (log sd, seconds): the spread
                of round totals within an A/A pass beyond what per-call noise explains.
  host_sd/tau   the host's speed at launching an eager forward (log sd, seconds): eager's
                totals on the launch-bound 0.6B moved 13% between processes and between
                passes of one process.
  capture_sd    the offset of one captured graph against another capture of the same size.
                Not separable in the recorded runs (each captured a list once); 0.3% is the
                largest per-graph offset consistent with the spread of the recommended-minus-
                ladder gain between the H200 tunes (an assumption, not a fit).
  tail_df       per-call noise is Student t with this many degrees of freedom, scaled so that
                its p10-p90 width is the recorded one: heavier tails than a normal's (the
                recorded eager spreads reach 13-15% at p90 across batches).

The per-call overheads a simulated run pays (a synchronization between calls, a model
build, a capture where the recording kept none) are stated, not fitted.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class NoiseProfile:
    rough_sd: float = 0.015
    rough_step: int = 16
    level_sd: float = 0.010
    drift_sd: float = 0.003
    drift_tau_s: float = 120.0
    host_sd: float = 0.13
    host_tau_s: float = 120.0
    capture_sd: float = 0.003
    tail_df: float = 4.0
    call_sd_scale: float = 1.0  # the recorded per-call spreads scaled by this (0: calls without noise)
    # per-call relative spread when the recording kept none (the 8B H200 medians)
    graph_sd: float = 0.015
    eager_sd: float = 0.02
    # stated costs of a simulated run
    sync_ms: float = 0.02  # a synchronization between two calls
    build_s: float = 2.0  # building a model: this, plus build_s_per_gparam per billion parameters
    build_s_per_gparam: float = 0.6
    capture_extra_s: float = 0.02  # a capture beyond its warm-up forwards, where the recording kept no capture times

    def to_json(self) -> dict:
        return asdict(self)


# The output of benchmarks/fit_sim_noise.py (rounded), and the stated costs.
FITTED = NoiseProfile(
    rough_sd=0.017,
    level_sd=0.011,
    drift_sd=0.003,
    host_sd=0.14,
)


def roughness_of(cal, max_gap: int = 600, min_rows: int = 30) -> float | None:
    """The size-to-size roughness of a recorded calibration's graph curve (relative sd), or
    None when it has too few close rows to tell: each interior row predicted by linear
    interpolation of its neighbours (at most `max_gap` tokens apart); the residuals' mean
    square less what the rows' own noise explains (their kept rounds, or recorded p10-p90
    spreads; a median of R rounds has about 1.25 sd / sqrt(R))."""
    import numpy as np

    t = np.asarray(cal.tokens, dtype=np.float64)
    g = np.asarray(cal.graph_ms, dtype=np.float64)
    if t.size < 3:
        return None
    meta = cal.meta if isinstance(cal.meta, dict) else {}
    if cal.graph_rounds is not None and cal.rounds >= 3:
        r = np.asarray(cal.graph_rounds, dtype=np.float64)
        sd = 1.4826 * np.median(np.abs(r - np.median(r, axis=1, keepdims=True)), axis=1)
        rounds = cal.rounds
    else:
        spread = meta.get("segments_spread") if cal.runner == "breakable" else meta.get("spread")
        sd = np.full(t.shape, np.nan)
        if isinstance(spread, dict):
            for i, x in enumerate(t.astype(int).tolist()):
                v = spread.get(str(x))
                if isinstance(v, dict):
                    v = v.get("graph_p10_p90")
                if isinstance(v, list) and len(v) == 2:
                    sd[i] = (float(v[1]) - float(v[0])) / 2.563
        eng = meta.get("engine")
        rep = eng.get("repeats") if isinstance(eng, dict) else None
        rounds = rep if isinstance(rep, int) and rep > 0 else 1
    se = 1.2533 * np.nan_to_num(sd, nan=0.0) / np.sqrt(rounds)
    res, noise = [], []
    for i in range(1, t.size - 1):
        a, b, c = t[i - 1], t[i], t[i + 1]
        if c - a > max_gap or g[i] <= 0:
            continue
        w2 = (b - a) / (c - a)
        w1 = 1.0 - w2
        pred = w1 * g[i - 1] + w2 * g[i + 1]
        if pred <= 0:
            continue
        res.append(g[i] / pred - 1.0)
        noise.append((se[i] ** 2 + (w1 * se[i - 1]) ** 2 + (w2 * se[i + 1]) ** 2) / pred**2)
    if len(res) < min_rows:
        return None
    excess = float(np.mean(np.square(res)) - np.mean(noise))
    # a field interpolated between lattice points: the residual of a row against its two
    # neighbours holds its own value and half of each neighbour's (in expectation 1.5 x var)
    return float(np.sqrt(max(excess, 0.0) / 1.5))
