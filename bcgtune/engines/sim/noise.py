"""What varies on the simulated device, and by how much.

Two sources. The recorded calibration itself gives the round-to-round spread of each size it
measured (its kept rounds, or the p10-p90 spreads that older formats kept), so a simulated
8B-shaped model is as noisy as the recording was, size by size. Everything a calibration
cannot show comes from `FITTED`, which `benchmarks/fit_sim_noise.py` computes from the H200
measurements in benchmarks/results and benchmarks/RESULTS.md (run it to see each figure
beside its data; tests/test_sim.py checks that these constants are its output):

  rough_sd      size-to-size roughness of the true time curve, as a share of it: what a
                measured size says about its neighbours. Leave-one-out interpolation of the
                dense H200 calibrations leaves 1.1% (Qwen3-0.6B shape) and 1.8-2.6% (8B) beyond
                their measurement noise, about the same at gaps of 16 and of 500 tokens: the
                roughness is short-range (a new value every `rough_step` tokens).
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
    rough_sd=0.015,
    level_sd=0.010,
    drift_sd=0.003,
    host_sd=0.13,
)
