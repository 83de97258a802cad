"""Replay one prefill trace through the torch engine four ways and compare total prefill time.

    eager     every batch eager
    ladder    SGLang's default prefill ladder (max = chunked prefill size, 8192 on an H200)
    tuned     a given bucket list (bcgtune's, K <= 12)
    oracle    a graph at every distinct size (<= the largest size the trace holds)

A batch of n tokens costs eager(n) unless the list has a bucket b >= n with b <= 2n (SGLang's
rule), in which case it costs replay(b). Both are measured on the GPU (CUDA events, median),
eager at every distinct size and replay at every bucket some batch uses; totals are sums over
the trace's batches. Capture time and graph memory are measured per list (largest first, one
pool, memory = reserved growth after empty_cache).

    PYTHONPATH=. python3 benchmarks/gpu_replay.py [TRACE] --buckets LIST --out-json FILE
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

DEFAULT_TRACE = Path(__file__).resolve().parent / "data" / "default_workload.csv"


def load_sizes(path: str | None, seed: int, batches: int):
    from bcgtune.core.trace import PrefillTrace, load_trace

    if path:
        return load_trace(path), f"trace {path}"
    if DEFAULT_TRACE.exists():
        return load_trace(str(DEFAULT_TRACE)), f"trace {DEFAULT_TRACE.relative_to(DEFAULT_TRACE.parents[2])}"
    rng = np.random.default_rng(seed)
    sizes = np.clip(np.round(rng.lognormal(np.log(1400), 0.8, batches)), 1, 16384).astype(int)
    return PrefillTrace.from_sizes(sizes, origin="simulation"), (
        f"generated: {batches} batches, lognormal(median 1400, sigma 0.8), clipped to [1, 16384], seed {seed} "
        f"({DEFAULT_TRACE.name} absent)")


def suggest(trace_path: str, k: int) -> list[int]:
    out = subprocess.run([sys.executable, "-m", "bcgtune", "suggest-buckets", trace_path, "--max-buckets", str(k), "--json"],
                         capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"suggest-buckets failed: {out.stderr.strip()}")
    return list(json.loads(out.stdout)["recommended"]["buckets"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace", nargs="?", help="JSON/CSV trace (default: benchmarks/data/default_workload.csv, else generated)")
    ap.add_argument("--model", default="qwen3-8b")
    ap.add_argument("--buckets", help="bcgtune's list (default: bcgtune suggest-buckets TRACE --max-buckets 12)")
    ap.add_argument("--max-bs", type=int, default=8192, help="max of SGLang's default ladder (chunked prefill size)")
    ap.add_argument("--batches", type=int, default=400, help="batches of a generated trace")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--also", action="append", default=[], metavar="NAME=LIST",
                    help="another list to replay the same way, e.g. an earlier suggestion (repeatable)")
    ap.add_argument("--no-oracle", action="store_true", help="skip the oracle (a graph per distinct size): saves time on big models")
    ap.add_argument("--out-json", help="write all numbers here")
    args = ap.parse_args()

    import torch

    from bcgtune.core.ladder import sglang_default_ladder
    from bcgtune.core.replay import assign_buckets, parse_bucket_list
    from bcgtune.engines.loader import load_model, parse_dtype
    from bcgtune.engines.runtime import environment, resolve_device
    from bcgtune.engines.torch_graphs import PrefillGraphEngine, text_inputs

    trace, origin = load_sizes(args.trace, args.seed, args.batches)
    sizes, counts = trace.sizes.astype(int), trace.counts.astype(int)
    if args.buckets:
        tuned = parse_bucket_list(args.buckets, "--buckets")
    else:
        src = args.trace or (str(DEFAULT_TRACE) if DEFAULT_TRACE.exists() else None)
        if src is None:
            import tempfile

            from bcgtune.core.trace import save_trace

            src = tempfile.mktemp(suffix=".csv")
            save_trace(trace, src)
        tuned = suggest(src, 12)
    ladder = sglang_default_ladder(args.max_bs)
    oracle = sorted(set(sizes.tolist()))
    lists = {"ladder": ladder, "tuned": tuned} if args.no_oracle else {"ladder": ladder, "tuned": tuned, "oracle": oracle}
    for spec in args.also:
        name, sep, lst = spec.partition("=")
        if not sep or not name or name in lists or name == "eager":
            raise SystemExit(f"--also {spec!r}: give NAME=LIST with a new name")
        lists[name] = parse_bucket_list(lst, "--also")
    dev = resolve_device(args.device)
    dtype = parse_dtype("auto", dev)
    max_tokens = max(max(bl) for bl in lists.values())
    model, desc = load_model(args.model, dev, dtype)
    env = environment(dev)
    log = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    log(f"{env.get('gpu_name')} torch {env['torch']} cuda {env['cuda']} hip {env['hip']} driver {env.get('driver')}; "
        f"{trace.n_batches} batches, {len(oracle)} distinct sizes; {origin}")

    t0 = time.perf_counter()
    base = PrefillGraphEngine(model, dev, max_tokens)
    inputs = {}
    eager_ms = {}
    for n in oracle:
        x = text_inputs(model, n, dev, seed=n)
        eager_ms[n] = base.time_eager(x, args.warmup, args.repeats)["median_ms"]
    log(f"eager timed at {len(oracle)} sizes in {time.perf_counter() - t0:.1f} s")
    del base

    results = {}
    graph_ms_all = {}
    for name, bl in lists.items():
        eng = PrefillGraphEngine(model, dev, max_tokens)
        before = eng._reserved()
        t1 = time.perf_counter()
        recs = eng.capture(bl, record_attention=False)
        cap_s = time.perf_counter() - t1
        mem = eng._reserved() - before
        bad = [r for r in recs if not r.ok]
        chosen, replay = assign_buckets(sizes, bl)
        used = sorted(set(chosen[replay].tolist()))
        gms = {}
        for b in used:
            if b not in eng.graphs:
                continue
            x = text_inputs(model, b, dev, seed=b)
            gms[b] = eng.time_replay(x, b, args.warmup, args.repeats)["median_ms"]
        graph_ms_all[name] = gms
        per_batch = np.array([gms[int(c)] if r and int(c) in gms else eager_ms[int(n)]
                              for n, c, r in zip(sizes, chosen, replay)])
        total = float((per_batch * counts).sum())
        results[name] = {
            "graphs": len(bl), "failed_captures": [(r.bucket, r.error) for r in bad],
            "capture_s": round(cap_s, 3), "graph_mem_gib": round(mem, 4),
            "replayed_batches": int(counts[replay].sum()), "batches": int(counts.sum()),
            "prefill_ms": round(total, 2), "buckets": bl if name != "oracle" else f"{len(bl)} distinct sizes",
        }
        log(f"{name:7s} {len(bl):4d} graphs, capture {cap_s:6.2f} s, mem {mem:6.3f} GiB, prefill {total / 1e3:8.3f} s")
        if args.out_json:  # partial results survive a timeout
            from bcgtune.fileio import atomic_write_json

            atomic_write_json(args.out_json + ".partial", {"results": results, "eager_ms": {str(k): v for k, v in eager_ms.items()},
                                                         "graph_ms": {k: {str(b): v for b, v in d.items()} for k, d in graph_ms_all.items()}})
        eng.release()
        del eng
        torch.cuda.empty_cache() if dev.type == "cuda" else None
    eager_total = float(sum(eager_ms[int(n)] * c for n, c in zip(sizes, counts)))
    results["eager"] = {"graphs": 0, "capture_s": 0.0, "graph_mem_gib": 0.0, "prefill_ms": round(eager_total, 2),
                        "replayed_batches": 0, "batches": int(counts.sum())}
    o, lad, tu = results.get("oracle"), results["ladder"], results["tuned"]
    ratios = {
        "tuned_vs_oracle_time": tu["prefill_ms"] / o["prefill_ms"] if o else None,
        "tuned_vs_ladder_time": tu["prefill_ms"] / lad["prefill_ms"],
        "tuned_vs_eager_time": tu["prefill_ms"] / eager_total,
        "ladder_vs_eager_time": lad["prefill_ms"] / eager_total,
        "ladder_over_tuned_graphs": lad["graphs"] / tu["graphs"],
        "ladder_over_tuned_capture_s": lad["capture_s"] / max(tu["capture_s"], 1e-9),
        "ladder_over_tuned_mem": lad["graph_mem_gib"] / max(tu["graph_mem_gib"], 1e-9),
    }
    targets = {
        "tuned within 3% of oracle": ratios["tuned_vs_oracle_time"] <= 1.03 if o else None,
        "tuned no slower than ladder": ratios["tuned_vs_ladder_time"] <= 1.0,
        ">= 4x fewer graphs": ratios["ladder_over_tuned_graphs"] >= 4,
        "less capture time": tu["capture_s"] < lad["capture_s"],
        "less graph memory": tu["graph_mem_gib"] < lad["graph_mem_gib"],
    }
    report = {"environment": env, "model": desc, "trace": origin, "batches": int(counts.sum()),
              "distinct_sizes": len(oracle), "tuned_buckets": tuned, "results": results, "ratios": ratios,
              "targets": targets, "eager_ms": {str(k): v for k, v in eager_ms.items()},
              "graph_ms": {k: {str(b): v for b, v in d.items()} for k, d in graph_ms_all.items()},
              "method": {"warmup": args.warmup, "repeats": args.repeats, "timer": "CUDA events, median"}}
    if args.out_json:
        from bcgtune.fileio import atomic_write_json

        atomic_write_json(args.out_json, report)
        Path(args.out_json + ".partial").unlink(missing_ok=True)
    ref = o or lad
    print(f"{'way':8s} {'graphs':>6s} {'capture s':>9s} {'mem GiB':>8s} {'replayed':>9s} {'prefill s':>10s} "
          f"{'vs oracle' if o else 'vs ladder':>9s}")
    for name in ["eager"] + list(lists):
        r = results[name]
        print(f"{name:8s} {r['graphs']:>6d} {r['capture_s']:>9.2f} {r['graph_mem_gib']:>8.3f} "
              f"{r['replayed_batches']:>4d}/{r['batches']:<4d} {r['prefill_ms'] / 1e3:>10.3f} {r['prefill_ms'] / ref['prefill_ms']:>9.4f}")
    print("tuned:", tuned)
    for k, v in targets.items():
        print(f"  {'PASS' if v else ('MISS' if v is not None else 'n/a ')}  {k}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
