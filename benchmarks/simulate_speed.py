"""Simulator speed: 100,000 requests through `bcgtune.adapters.simulator.simulate`.

Usage: python benchmarks/simulate_speed.py [--requests N] [--repeat R]
Prints the machine, then the best of R wall-clock times for each scenario:
  * image-c128: the seeds' default workload (512x512 image, 1024/128, ratio 0.8) at
    concurrency 128 on the mi355x server settings, N prompts;
  * text-c64-poisson: random text prompts, Poisson arrivals 40 req/s capped at 256 in flight;
  * mixed-dp2: the image workload with --enable-mixed-chunk and --dp-size 2;
and the default workload trace (the main job's embedded default, 2,440 prompts).
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from bcgtune.adapters.simulator import default_workload_trace, simulate  # noqa: E402
from bcgtune.adapters.workload import Workload, default_workload  # noqa: E402
from _machine import cpu_model  # noqa: E402  (benchmarks/ is on sys.path when run as a script)


def best_of(fn, repeat: int) -> tuple[float, object]:
    best, res = float("inf"), None
    for _ in range(repeat):
        t = time.perf_counter()
        res = fn()
        best = min(best, time.perf_counter() - t)
    return best, res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=100_000)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    n = a.requests
    print(f"machine: {os.cpu_count()} cores, {cpu_model()}, Python {platform.python_version()}, numpy {np.__version__}")
    base = default_workload()
    cases = {
        "image-c128": replace(base, num_prompts=[n], max_concurrency=[128]),
        "text-c64-poisson": Workload(
            dataset_name="random", num_prompts=[n], random_input_len=1024, random_output_len=128,
            random_range_ratio=0.5, request_rate=40.0, max_concurrency=[256], max_running_requests=128,
        ),
        "mixed-dp2": replace(base, num_prompts=[n], max_concurrency=[128], enable_mixed_chunk=True, dp_size=2),
    }
    for name, w in cases.items():
        dt, tr = best_of(lambda: simulate(w), a.repeat)
        print(
            f"{name}: {n:,} requests in {dt:.2f} s ({n / dt:,.0f} req/s); "
            f"{tr.n_batches:,} prefill batches, {tr.meta['decode_steps']:,} decode steps"
        )
    dt, tr = best_of(default_workload_trace, a.repeat)
    img = float(tr.batches["images"].mean())
    print(
        f"default workload (seeds-mi355x, 2,440 prompts): {dt:.2f} s; {tr.n_batches:,} batches, "
        f"{tr.sizes.size} distinct sizes, image batches {100 * img:.1f}%"
    )


if __name__ == "__main__":
    main()
