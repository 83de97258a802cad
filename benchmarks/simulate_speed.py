"""Simulator speed: 100,000 requests through `bcgtune.adapters.bench_serving.simulator.simulate`.

Usage: python benchmarks/simulate_speed.py [--requests N] [--repeat R] [--large M] [--tree DIR]
Prints the machine, then the best of R runs (wall clock and CPU time of this process) for
each scenario:
  * image-c128: the default workload (512x512 image, 1024/128, ratio 0.8) at concurrency 128
    on the mi355x server settings, N prompts;
  * text-c64-poisson: random text prompts, Poisson arrivals 40 req/s capped at 256 in flight;
  * mixed-dp2: the image workload with --enable-mixed-chunk and --dp-size 2;
the default workload trace (the main job's embedded default, 2,440 prompts), and with
--large M one image-c128 run of M requests with its progress reports and the process's peak
memory (resident set). --tree DIR imports bcgtune from another checkout (e.g. an older commit
extracted with `git archive`) to compare before and after on one machine.
"""

from __future__ import annotations

import argparse
import inspect
import os
import platform
import resource
import sys
import time
from dataclasses import replace
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # _machine
if "--tree" in sys.argv:
    sys.path.insert(0, str(Path(sys.argv[sys.argv.index("--tree") + 1]).resolve()))
else:
    sys.path.insert(0, str(HERE.parent))

import numpy as np
from _machine import cpu_model

from bcgtune.adapters.bench_serving.simulator import simulate
from bcgtune.core.sim.workload import Workload
from bcgtune.files.workload_file import default_workload
from bcgtune.services.suggest import default_trace


def best_of(fn, repeat: int) -> tuple[float, float, object]:
    wall, cpu, res = float("inf"), float("inf"), None
    for _ in range(repeat):
        t, c = time.perf_counter(), time.process_time()
        res = fn()
        wall, cpu = min(wall, time.perf_counter() - t), min(cpu, time.process_time() - c)
    return wall, cpu, res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=100_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--large", type=int, default=0, help="also one run of this many requests (e.g. 3000000)")
    ap.add_argument("--tree", help="import bcgtune from this checkout instead of the one holding this script")
    a = ap.parse_args()
    n = a.requests
    print(f"machine: {os.cpu_count()} cores, {cpu_model()}, Python {platform.python_version()}, numpy {np.__version__}")
    print(f"bcgtune from {Path(inspect.getfile(simulate)).parents[2]}")
    base = default_workload()
    cases = {
        "image-c128": replace(base, num_prompts=[n], max_concurrency=[128]),
        "text-c64-poisson": Workload(
            dataset_name="random",
            num_prompts=[n],
            random_input_len=1024,
            random_output_len=128,
            random_range_ratio=0.5,
            request_rate=40.0,
            max_concurrency=[256],
            max_running_requests=128,
        ),
        "mixed-dp2": replace(base, num_prompts=[n], max_concurrency=[128], enable_mixed_chunk=True, dp_size=2),
    }
    for name, w in cases.items():
        wall, cpu, tr = best_of(lambda w=w: simulate(w), a.repeat)
        print(
            f"{name}: {n:,} requests in {wall:.2f} s, cpu {cpu:.2f} s ({n / wall:,.0f} req/s); "
            f"{tr.n_batches:,} prefill batches, {tr.meta['decode_steps']:,} decode steps"
        )
    wall, cpu, tr = best_of(default_trace, a.repeat)
    img = float(tr.batches["images"].mean())
    prompts = sum(lv["num_prompts"] for lv in tr.meta["levels"])
    print(
        f"default workload ({base.name}, {prompts:,} prompts): {wall:.2f} s, cpu {cpu:.2f} s; "
        f"{tr.n_batches:,} batches, {tr.sizes.size} distinct sizes, image batches {100 * img:.1f}%"
    )
    if a.large:
        reports: list[int] = []
        w = replace(base, num_prompts=[a.large], max_concurrency=[128])
        kw = (
            {"progress": lambda done, total: reports.append(done)} if "progress" in inspect.signature(simulate).parameters else {}
        )
        wall, cpu, tr = best_of(lambda: simulate(w, **kw), 1)
        peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(
            f"image-c128 large: {a.large:,} requests in {wall:.1f} s, cpu {cpu:.1f} s; {tr.n_batches:,} batches; "
            f"{len(reports)} progress reports; peak resident memory {peak_mib:,.0f} MiB"
        )


if __name__ == "__main__":
    main()
