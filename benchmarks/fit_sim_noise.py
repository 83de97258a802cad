"""Fit the simulated device's noise profile (bcgtune/engines/sim/noise.py FITTED) from the H200
measurements kept in benchmarks/results and benchmarks/RESULTS.md.

    python benchmarks/fit_sim_noise.py          # each figure beside its data
    python benchmarks/fit_sim_noise.py --json   # the fitted values only

What each figure rests on:
  rough_sd   leave-one-out: each interior row of the dense H200 calibrations predicted by
             linear interpolation of its neighbours; the residuals' mean square, less what
             the rows' own round-to-round noise explains (their recorded p10-p90 spreads),
             is the roughness of the true curve (bcgtune.engines.sim.noise.roughness_of).
  level_sd   the same lists measured in three processes (h200-measurements.md, "Run-to-run
             spread", Qwen3-0.6B shape) and the shift between a model-check process and a
             proof process (RESULTS.md, calls 6 and 8: -1.55% and -2.3%): each process's
             log-level sd, pooled.
  drift_sd   the spread of round totals within an A/A pass (benchmarks/results/gpu_replay_aa_*),
             less the per-call noise averaged over the pass's batches.
  host_sd    eager's totals on the launch-bound Qwen3-0.6B shape between processes
             (h200-measurements.md: 37.160, 28.446, 32.930 s) and between passes of one
             process (RESULTS.md calls 8 and 9), log sd pooled.
  capture_sd not separable in these runs (each captured every list once): stated in noise.py.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

RESULTS = ROOT / "benchmarks" / "results"
DENSE = (
    "cal_breakable_interleaved_grid64_qwen3-0.6b_h200.json",
    "cal_breakable_onephase_grid128_qwen3-8b_h200.json",
    "cal_breakable_twophase_grid128_qwen3-8b_h200.json",
)
# Totals (s) of the same lists in three processes (docs: h200-measurements.md "Run-to-run spread")
THREE_PROCESSES = {
    "SGLang ladder": (19.779, 19.497, 19.595),
    "time optimum": (19.606, 19.342, 19.498),
    "padding optimum": (19.555, 19.545, 19.734),
    "capped list": (19.686, 19.403, 19.585),
}
# A proof process's totals against the model check made in another (RESULTS.md calls 6 and 8)
PROCESS_PAIR_SHIFTS = (-0.0155, -0.023)
# Eager's totals (s) on the launch-bound shape: three processes; passes of one process (calls 8, 9)
EAGER_PROCESSES = (37.160, 28.446, 32.930)
EAGER_PASSES = ((2.324, 1.832, 1.754), (5.382, 4.654, 4.154))
AA = ("gpu_replay_aa_qwen3-0.6b_h200.json", "gpu_replay_aa_qwen3-8b_h200.json")


def fit_roughness() -> tuple[float, dict[str, float]]:
    from bcgtune.engines.sim.noise import roughness_of
    from bcgtune.files.calibration_file import load_calibration

    each = {}
    for name in DENSE:
        r = roughness_of(load_calibration(str(RESULTS / name)))
        if r is not None:
            each[name] = r
    return float(np.median(list(each.values()))), each


def fit_level() -> tuple[float, dict[str, float]]:
    logs = [np.log(np.asarray(v)) for v in THREE_PROCESSES.values()]
    # every list of a process moves together: the process's shift is the lists' mean shift
    per_process = np.mean([x - x.mean() for x in logs], axis=0)
    v3, df3 = float(np.sum(per_process**2)), len(per_process) - 1
    # a pair's shift is the difference of two processes' levels: variance 2 sigma^2
    pairs = np.log1p(np.asarray(PROCESS_PAIR_SHIFTS))
    vp, dfp = float(np.sum(pairs**2) / 2), len(pairs)
    sd = math.sqrt((v3 + vp) / (df3 + dfp))
    return sd, {"three processes, log sd": math.sqrt(v3 / df3), "process pairs, log sd": math.sqrt(vp / dfp)}


def fit_drift() -> tuple[float, dict[str, float]]:
    each = {}
    for name in AA:
        d = json.loads((RESULTS / name).read_text())
        vals = []
        for lst, v in d["passes"].items():
            if lst == "eager":
                continue
            rt = np.asarray(v["round_totals_ms"], dtype=np.float64)
            rel = rt / rt.mean(axis=1, keepdims=True)
            vals.append(float(np.mean(np.var(rel, axis=1, ddof=1))))
        # what per-call noise explains over a round's batches (recorded spreads, 8B 2%, 0.6B 0.2%)
        call = 0.02 if "8b" in name else 0.002
        batches = -(-int(d["batches"]) // int(d["every"]))
        each[name] = math.sqrt(max(float(np.median(vals)) - call**2 / batches, 0.0))
    return float(np.mean(list(each.values()))), each


def fit_host() -> tuple[float, dict[str, float]]:
    groups = [np.log(np.asarray(EAGER_PROCESSES))] + [np.log(np.asarray(p)) for p in EAGER_PASSES]
    ss = sum(float(np.sum((g - g.mean()) ** 2)) for g in groups)
    df = sum(len(g) - 1 for g in groups)
    return math.sqrt(ss / df), {
        "between processes": float(np.std(groups[0], ddof=1)),
        "between passes": float(np.sqrt(sum(np.var(g, ddof=1) for g in groups[1:]) / len(groups[1:]))),
    }


def fit() -> dict[str, float]:
    return {
        "rough_sd": round(fit_roughness()[0], 3),
        "level_sd": round(fit_level()[0], 3),
        "drift_sd": round(fit_drift()[0], 3),
        "host_sd": round(fit_host()[0], 2),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    got = fit()
    if args.json:
        print(json.dumps(got))
        return
    from bcgtune.engines.sim.noise import FITTED

    for key, (value, detail) in {
        "rough_sd": fit_roughness(),
        "level_sd": fit_level(),
        "drift_sd": fit_drift(),
        "host_sd": fit_host(),
    }.items():
        print(f"{key:10s} {value:.4f}  (noise.py: {getattr(FITTED, key)})")
        for k, v in detail.items():
            print(f"    {k}: {v:.4f}")
    print(f"capture_sd {FITTED.capture_sd} (stated, not fitted)")


if __name__ == "__main__":
    main()
