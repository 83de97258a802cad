"""Replay one prefill trace through the torch engine several ways and compare total prefill time.

    eager     every batch eager
    ladder    SGLang's default prefill ladder (max = chunked prefill size, 8192 on an H200)
    tuned     a given bucket list (bcgtune's)
    oracle    a graph at every distinct size (<= the largest size the trace holds)
    NAME      any further list (--also NAME=LIST)

Batches are the trace's (tokens, requests) pairs when it carries request counts (a JSON
trace with `new_seq`), else one request each. A batch of n tokens costs eager(n, r) unless
the list has a bucket b >= n with b <= 2n (SGLang's rule), in which case it costs its replay
in b: for the breakable runner (default) the segments of b plus attention on the batch's
real rows between them, for the full runner the whole-forward graph of b (one request: the
full engine runs every batch as one sequence). Everything is measured on the GPU (CUDA
events, median): eager once per distinct batch, replay once per distinct (batch, bucket)
that a list uses (a replay does not depend on which other graphs share the pool, so a
(batch, bucket) measured for one list is reused by the next). Capture time and graph memory
are measured per list (fresh pool, largest first, memory = reserved growth after
empty_cache). `--every K` keeps every Kth distinct batch, counts carried to the kept one
(for large models). `--calibration CAL` adds each list's predicted total (the time
objective's model) next to the measurement.

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

DEFAULT_TRACE = Path(__file__).resolve().parent / "data" / "default_workload.json"


def load_mix(path: str | None, seed: int, batches: int):
    from bcgtune.core.mix import batch_mix
    from bcgtune.core.trace import PrefillTrace, load_trace

    if path:
        return batch_mix(load_trace(path)), f"trace {path}", path
    if DEFAULT_TRACE.exists():
        return batch_mix(load_trace(str(DEFAULT_TRACE))), f"trace {DEFAULT_TRACE.relative_to(DEFAULT_TRACE.parents[2])}", str(DEFAULT_TRACE)
    rng = np.random.default_rng(seed)
    sizes = np.clip(np.round(rng.lognormal(np.log(1400), 0.8, batches)), 1, 16384).astype(int)
    trace = PrefillTrace.from_sizes(sizes, origin="simulation")
    return batch_mix(trace), (f"generated: {batches} batches, lognormal(median 1400, sigma 0.8), clipped to [1, 16384], "
                              f"seed {seed} ({DEFAULT_TRACE.name} absent)"), None


def suggest(trace_path: str, k: int) -> list[int]:
    out = subprocess.run([sys.executable, "-m", "bcgtune", "suggest-buckets", trace_path, "--max-buckets", str(k), "--json"], check=False,
                         capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"suggest-buckets failed: {out.stderr.strip()}")
    return list(json.loads(out.stdout)["recommended"]["buckets"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace", nargs="?", help="JSON/CSV trace (default: benchmarks/data/default_workload.json, else generated)")
    ap.add_argument("--model", default="qwen3-8b")
    ap.add_argument("--runner", default="breakable", choices=["breakable", "full"])
    ap.add_argument("--graph-impl", default="auto", help="breakable capture machinery: auto, sglang, bcgtune")
    ap.add_argument("--buckets", help="bcgtune's list (default: bcgtune suggest-buckets TRACE --max-buckets 12)")
    ap.add_argument("--max-bs", type=int, default=8192, help="max of SGLang's default ladder (chunked prefill size)")
    ap.add_argument("--batches", type=int, default=400, help="batches of a generated trace")
    ap.add_argument("--every", type=int, default=1, help="keep every Kth distinct (tokens, requests) batch")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--also", action="append", default=[], metavar="NAME=LIST",
                    help="another list to replay the same way, e.g. an earlier suggestion (repeatable)")
    ap.add_argument("--no-oracle", action="store_true", help="skip the oracle (a graph per distinct size): saves time on big models")
    ap.add_argument("--calibration", help="calibration JSON: print each list's predicted total next to the measured one")
    ap.add_argument("--out-json", help="write all numbers here")
    args = ap.parse_args()

    import torch

    from bcgtune.core.ladder import sglang_default_ladder
    from bcgtune.core.replay import assign_buckets, parse_bucket_list
    from bcgtune.engines.loader import load_model, parse_dtype
    from bcgtune.engines.runtime import environment, resolve_device
    from bcgtune.engines.torch_graphs import text_inputs

    mix, origin, trace_path = load_mix(args.trace, args.seed, args.batches)
    mix = mix.sample(args.every)
    tokens, requests, counts = mix.tokens.astype(int), mix.requests.astype(int), mix.counts.astype(int)
    if args.runner == "full":
        requests = np.ones_like(requests)  # the full engine's one request slot
    if args.buckets:
        tuned = parse_bucket_list(args.buckets, "--buckets")
    else:
        src = trace_path
        if src is None:
            import tempfile

            from bcgtune.core.trace import PrefillTrace, save_trace

            sizes, cnt = mix.histogram()
            src = tempfile.mktemp(suffix=".csv")
            save_trace(PrefillTrace(sizes=sizes, counts=cnt), src)
        tuned = suggest(src, 12)
    ladder = sglang_default_ladder(args.max_bs)
    oracle = sorted(set(tokens.tolist()))
    lists = {"ladder": ladder, "tuned": tuned}
    for spec in args.also:
        name, sep, lst = spec.partition("=")
        if not sep or not name or name in lists or name in ("eager", "oracle"):
            raise SystemExit(f"--also {spec!r}: give NAME=LIST with a new name")
        lists[name] = parse_bucket_list(lst, "--also")
    if not args.no_oracle:
        lists["oracle"] = oracle
    dev = resolve_device(args.device)
    dtype = parse_dtype("auto", dev)
    max_tokens = max(max(bl) for bl in lists.values())
    model, desc = load_model(args.model, dev, dtype)
    env = environment(dev)
    def log(m):
        print(m, file=sys.stderr, flush=True)

    def new_engine():
        if args.runner == "breakable":
            from bcgtune.engines.breakable import BreakablePrefillEngine

            return BreakablePrefillEngine(model, dev, max_tokens, graph_impl=args.graph_impl)
        from bcgtune.engines.torch_graphs import PrefillGraphEngine

        return PrefillGraphEngine(model, dev, max_tokens)

    t0 = time.perf_counter()
    base = new_engine()
    env["runner"] = args.runner
    env["graph_impl"] = base.graph_impl
    env["attention"] = getattr(base, "attention_kind", "sdpa (one sequence)")
    log(f"{env.get('gpu_name')} torch {env['torch']} cuda {env['cuda']} hip {env['hip']} driver {env.get('driver')}; "
        f"runner {args.runner} ({env['graph_impl']}, attention {env['attention']}); {mix.n_batches} batches, "
        f"{len(tokens)} distinct (tokens, requests), {len(oracle)} distinct sizes; {origin}")
    pairs = list(zip(tokens.tolist(), requests.tolist()))
    inputs = {p: text_inputs(model, p[0], dev, seed=p[0], requests=p[1]) for p in set(pairs)}
    eager_ms = {}
    for p in pairs:
        if p not in eager_ms:
            eager_ms[p] = base.time_eager(inputs[p], args.warmup, args.repeats)["median_ms"]
    log(f"eager timed at {len(eager_ms)} batches in {time.perf_counter() - t0:.1f} s")
    del base

    results = {}
    replay_ms: dict[tuple[int, int, int], float] = {}
    reused = 0
    for name, bl in lists.items():
        eng = new_engine()
        before = eng._reserved()
        t1 = time.perf_counter()
        recs = eng.capture(bl, record_attention=False)
        cap_s = time.perf_counter() - t1
        mem = eng._reserved() - before
        bad = [r for r in recs if not r.ok]
        chosen, replay = assign_buckets(tokens, bl)
        per_batch = []
        for (n, r), c, ok in zip(pairs, chosen.tolist(), replay.tolist()):
            if ok and c in eng.graphs:
                key = (n, r, c)
                if key in replay_ms:
                    reused += 1
                else:
                    replay_ms[key] = eng.time_replay(inputs[(n, r)], c, args.warmup, args.repeats)["median_ms"]
                per_batch.append(replay_ms[key])
            else:
                per_batch.append(eager_ms[(n, r)])
        total = float((np.asarray(per_batch) * counts).sum())
        results[name] = {
            "graphs": len(bl), "failed_captures": [(r.bucket, r.error) for r in bad],
            "capture_s": round(cap_s, 3), "graph_mem_gib": round(mem, 4),
            "replayed_batches": int(counts[replay].sum()), "batches": int(counts.sum()),
            "prefill_ms": round(total, 2), "buckets": bl if name != "oracle" else f"{len(bl)} distinct sizes",
        }
        log(f"{name:9s} {len(bl):4d} graphs, capture {cap_s:6.2f} s, mem {mem:6.3f} GiB, prefill {total / 1e3:8.3f} s")
        if args.out_json:  # partial results survive a timeout
            from bcgtune.fileio import atomic_write_json

            atomic_write_json(args.out_json + ".partial", {"results": results})
        eng.release()
        del eng
        torch.cuda.empty_cache() if dev.type == "cuda" else None
    eager_total = float(sum(eager_ms[p] * c for p, c in zip(pairs, counts)))
    results["eager"] = {"graphs": 0, "capture_s": 0.0, "graph_mem_gib": 0.0, "prefill_ms": round(eager_total, 2),
                        "replayed_batches": 0, "batches": int(counts.sum())}
    if args.calibration:
        from bcgtune.core.calibration import load_calibration
        from bcgtune.core.mix import BatchMix
        from bcgtune.core.optimizer import predicted_time_ms

        cal = load_calibration(args.calibration)
        pm = BatchMix(tokens, requests, counts, mix.requests_known)
        sizes, cnt = pm.histogram()
        cand = "calibration" if cal.meta.get("bucket_grid") else "trace"
        for name in ["eager", *lists]:
            bl = [] if name == "eager" else lists[name]
            pred = predicted_time_ms(sizes, cnt, bl, cal, candidates=cand, mix=pm)
            results[name]["predicted_ms"] = round(pred, 2)
            results[name]["predicted_over_measured"] = round(pred / results[name]["prefill_ms"], 5)
    o, lad, tu = results.get("oracle"), results["ladder"], results["tuned"]
    ratios = {
        "tuned_vs_oracle_time": tu["prefill_ms"] / o["prefill_ms"] if o else None,
        "tuned_vs_ladder_time": tu["prefill_ms"] / lad["prefill_ms"],
        "tuned_vs_eager_time": tu["prefill_ms"] / eager_total,
        "tuned_vs_min_eager_ladder": tu["prefill_ms"] / min(eager_total, lad["prefill_ms"]),
        "ladder_vs_eager_time": lad["prefill_ms"] / eager_total,
        "ladder_over_tuned_graphs": lad["graphs"] / max(tu["graphs"], 1),
        "ladder_over_tuned_capture_s": lad["capture_s"] / max(tu["capture_s"], 1e-9),
        "ladder_over_tuned_mem": lad["graph_mem_gib"] / max(tu["graph_mem_gib"], 1e-9),
    }
    targets = {
        "tuned no slower than min(eager, ladder)": ratios["tuned_vs_min_eager_ladder"] <= 1.0,
        "tuned within 2% of oracle": ratios["tuned_vs_oracle_time"] <= 1.02 if o else None,
        ">= 4x fewer graphs": ratios["ladder_over_tuned_graphs"] >= 4,
        "less capture time": tu["capture_s"] < lad["capture_s"],
        "less graph memory": tu["graph_mem_gib"] < lad["graph_mem_gib"],
    }
    if args.calibration:
        targets["predicted within 1% for every list"] = all(
            abs(r["predicted_over_measured"] - 1) <= 0.01 for r in results.values() if "predicted_over_measured" in r)
    report = {"environment": env, "model": desc, "trace": origin, "runner": args.runner, "every": args.every,
              "batches": int(counts.sum()), "distinct_batches": len(pairs), "distinct_sizes": len(oracle),
              "requests_known": mix.requests_known, "tuned_buckets": tuned, "lists": lists | {"oracle": len(oracle)},
              "results": results, "ratios": ratios, "targets": targets,
              "replay_measurements": len(replay_ms), "replay_reused": reused,
              "eager_ms": {f"{n}x{r}": v for (n, r), v in eager_ms.items()},
              "replay_ms": {f"{n}x{r}@{b}": v for (n, r, b), v in replay_ms.items()},
              "method": {"warmup": args.warmup, "repeats": args.repeats, "timer": "CUDA events, median",
                         "inputs": "n random tokens split evenly into r requests, seeded by n"}}
    if args.out_json:
        from bcgtune.fileio import atomic_write_json

        atomic_write_json(args.out_json, report)
        Path(args.out_json + ".partial").unlink(missing_ok=True)
    ref = o or lad
    pred_col = " predicted" if args.calibration else ""
    print(f"{'way':18s} {'graphs':>6s} {'capture s':>9s} {'mem GiB':>8s} {'replayed':>9s} {'prefill s':>10s} "
          f"{'vs oracle' if o else 'vs ladder':>9s}{pred_col}")
    for name in ["eager", *lists]:
        r = results[name]
        pred = f" {r['predicted_ms'] / 1e3:9.3f}" if "predicted_ms" in r else ""
        print(f"{name:18s} {r['graphs']:>6d} {r['capture_s']:>9.2f} {r['graph_mem_gib']:>8.3f} "
              f"{r['replayed_batches']:>4d}/{r['batches']:<4d} {r['prefill_ms'] / 1e3:>10.3f} {r['prefill_ms'] / ref['prefill_ms']:>9.4f}{pred}")
    print("tuned:", tuned)
    for k, v in targets.items():
        print(f"  {'PASS' if v else ('MISS' if v is not None else 'n/a ')}  {k}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
