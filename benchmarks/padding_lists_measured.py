"""Price padding-objective bucket lists with the H200 measurements (RESULTS.md): replay time
per bucket from the four-way run (oracle: every traced size) and the 64-token grid
calibration, eager time per traced size from the four-way run. CPU only.

    python3 benchmarks/padding_lists_measured.py
"""

import csv
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bcgtune.core.plan.optimizer import optimal_buckets
from bcgtune.core.sglang.replay import assign_buckets

HERE = Path(__file__).resolve().parent
run = json.loads((HERE / "results/gpu_replay_grid_qwen3-0.6b_default_workload_h200.json").read_text())
cal = json.loads((HERE / "results/cal_grid_qwen3-0.6b_h200.json").read_text())
eager = {int(k): v for k, v in run["eager_ms"].items()}
graph = {int(r["tokens"]): r["graph_ms"] for r in cal["rows"]}
for way in run["graph_ms"].values():
    graph.update({int(k): v for k, v in way.items()})
rows = list(csv.DictReader(open(HERE / "data/default_workload.csv")))
sizes = np.array([int(r["size"]) for r in rows])
counts = np.array([int(r["count"]) for r in rows])
ladder_ms = run["results"]["ladder"]["prefill_ms"]


def measured_ms(buckets):
    chosen, replay = assign_buckets(sizes, buckets, 2.0)
    missing = sorted({int(b) for b, r in zip(chosen, replay) if r and int(b) not in graph})
    if missing:
        raise SystemExit(f"unmeasured buckets {missing}")
    return sum(c * (graph[int(b)] if r else eager[int(n)]) for n, c, b, r in zip(sizes, counts, chosen, replay))


for align in (1, 64, 128, 256):
    sol = optimal_buckets(sizes, counts, 12, align=align, max_bucket=8192)
    t = measured_ms(sol.buckets)
    print(f"align {align:3d}: {t / 1e3:.3f} s, {t / ladder_ms:.3f} x ladder  {sol.buckets}")
print(f"time optimum (grid, measured): {run['results']['tuned']['prefill_ms'] / 1e3:.3f} s; ladder {ladder_ms / 1e3:.3f} s")
