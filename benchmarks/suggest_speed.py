"""End-to-end wall time of `bcgtune suggest-buckets` as a user runs it (a fresh process:
interpreter start, imports, simulation or trace loading, optimizer, baselines, rendering):

  * the main job, `bcgtune suggest-buckets` on the built-in workload;
  * a 1,000,000-batch trace (a long-tailed mix up to 64k tokens, written as a size,count CSV)
    with K = 32, baselines included (the quantile row; `--kmeans` adds scikit-learn's, timed
    separately since it is opt-in).

    python benchmarks/suggest_speed.py [--repeat 5]

Prints the best and median of `--repeat` runs of each.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parent


def _machine() -> str:
    sys.path.insert(0, str(HERE))
    from _machine import cpu_model

    return f"{os.cpu_count()} cores, {cpu_model()}, Python {platform.python_version()}, numpy {np.__version__}"


def _trace_csv(path: Path, batches: int, seed: int = 0) -> int:
    rng = np.random.default_rng(seed)
    x = np.concatenate(
        [
            rng.lognormal(7.0, 1.0, int(batches * 0.7)),
            rng.uniform(1, 65536, batches - int(batches * 0.7)),
        ]
    )
    sizes, counts = np.unique(np.clip(x.astype(np.int64), 1, 65536), return_counts=True)
    path.write_text("size,count\n" + "".join(f"{s},{c}\n" for s, c in zip(sizes.tolist(), counts.tolist())))
    return int(sizes.size)


def _time(args: list[str], repeat: int) -> list[float]:
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        subprocess.run(
            [sys.executable, "-m", "bcgtune", *args], check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        out.append(time.perf_counter() - t0)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--batches", type=int, default=1_000_000)
    a = ap.parse_args()
    print(f"machine: {_machine()}")
    with tempfile.TemporaryDirectory() as d:
        trace = Path(d) / "big.csv"
        distinct = _trace_csv(trace, a.batches)
        cases = [
            ("main job: bcgtune suggest-buckets", ["suggest-buckets"]),
            (f"{a.batches:,} batches ({distinct:,} sizes), K=32", ["suggest-buckets", str(trace), "-k", "32"]),
            (f"{a.batches:,} batches, K=32, with --kmeans", ["suggest-buckets", str(trace), "-k", "32", "--kmeans"]),
        ]
        for name, args in cases:
            times = _time(args, a.repeat)
            print(f"{name}: best {min(times):.2f} s, median {statistics.median(times):.2f} s ({a.repeat} runs)")


if __name__ == "__main__":
    main()
