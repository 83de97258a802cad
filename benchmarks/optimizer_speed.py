"""Optimizer speed at the issue's scale: 1,000,000 prefill batches with 30,000+ distinct
sizes, K = 32, solved exactly; scikit-learn KMeans on the same weighted sizes timed in the
same run for reference (KMeans is a heuristic: it does not honour the replay rule).

    python benchmarks/optimizer_speed.py [--batches 1000000] [--k 32] [--align 1]
"""

from __future__ import annotations

import argparse
import os
import platform
import time

import numpy as np


def machine() -> str:
    from _machine import cpu_model  # benchmarks/ is on sys.path when run as a script

    return f"{os.cpu_count()} cores, {cpu_model()}, Python {platform.python_version()}, numpy {np.__version__}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", type=int, default=1_000_000)
    ap.add_argument("--k", type=int, default=32)
    ap.add_argument("--align", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    from bcgtune.core.plan.bucket_plan import kmeans_buckets
    from bcgtune.core.plan.optimizer import optimal_buckets
    from bcgtune.core.sglang.replay import evaluate_list

    rng = np.random.default_rng(args.seed)
    # a long-tailed prefill mix up to 64k tokens: enough spread for 30,000+ distinct sizes
    x = np.concatenate(
        [
            rng.lognormal(7.0, 1.0, int(args.batches * 0.7)),
            rng.uniform(1, 65536, args.batches - int(args.batches * 0.7)),
        ]
    )
    x = np.clip(x.astype(np.int64), 1, 65536)
    t0 = time.perf_counter()
    sizes, counts = np.unique(x, return_counts=True)
    t_hist = time.perf_counter() - t0
    print(f"machine: {machine()}")
    print(f"trace: {counts.sum():,} batches, {sizes.size:,} distinct sizes (histogram {t_hist:.2f} s)")

    t0 = time.perf_counter()
    sol = optimal_buckets(sizes, counts, args.k, align=args.align)
    t_opt = time.perf_counter() - t0
    m = evaluate_list(sizes, counts, sol.buckets)
    print(
        f"bcgtune exact optimum, K={args.k}, align {args.align}: {t_opt:.2f} s "
        f"({sol.candidates:,} candidates; {len(sol.buckets)} buckets, eager {m.eager_batches:,}, waste {m.waste_pct:.2f}%)"
    )

    t0 = time.perf_counter()
    km = kmeans_buckets(sizes, counts, args.k, args.align, None, seed=args.seed)
    t_km = time.perf_counter() - t0
    mk = evaluate_list(sizes, counts, km)
    print(
        f"scikit-learn KMeans (n_init=3), same K and weights: {t_km:.2f} s "
        f"({len(km)} buckets, eager {mk.eager_batches:,}, waste {mk.waste_pct:.2f}%)"
    )


if __name__ == "__main__":
    main()
