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
import functools
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

DEFAULT_TRACE = Path(__file__).resolve().parent / "data" / "default_workload.json"


def load_mix(path: str | None, seed: int, batches: int):
    from bcgtune.core.trace.mix import batch_mix
    from bcgtune.core.trace.prefill_trace import PrefillTrace
    from bcgtune.files.trace_file import load_trace

    if path:
        return batch_mix(load_trace(path)), f"trace {path}", path
    if DEFAULT_TRACE.exists():
        return (
            batch_mix(load_trace(str(DEFAULT_TRACE))),
            f"trace {DEFAULT_TRACE.relative_to(DEFAULT_TRACE.parents[2])}",
            str(DEFAULT_TRACE),
        )
    rng = np.random.default_rng(seed)
    sizes = np.clip(np.round(rng.lognormal(np.log(1400), 0.8, batches)), 1, 16384).astype(int)
    trace = PrefillTrace.from_sizes(sizes, origin="simulation")
    return (
        batch_mix(trace),
        (
            f"generated: {batches} batches, lognormal(median 1400, sigma 0.8), clipped to [1, 16384], "
            f"seed {seed} ({DEFAULT_TRACE.name} absent)"
        ),
        None,
    )


def suggest(trace_path: str, k: int) -> list[int]:
    out = subprocess.run(
        [sys.executable, "-m", "bcgtune", "suggest-buckets", trace_path, "--max-buckets", str(k), "--json"],
        check=False,
        capture_output=True,
        text=True,
    )
    if out.returncode != 0:
        raise SystemExit(f"suggest-buckets failed: {out.stderr.strip()}")
    return list(json.loads(out.stdout)["recommended"]["buckets"])


def parse_args():
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
    ap.add_argument(
        "--also",
        action="append",
        default=[],
        metavar="NAME=LIST",
        help="another list to replay the same way, e.g. an earlier suggestion (repeatable)",
    )
    ap.add_argument(
        "--no-oracle", action="store_true", help="skip the oracle (a graph per distinct size): saves time on big models"
    )
    ap.add_argument("--calibration", help="calibration JSON: print each list's predicted total next to the measured one")
    ap.add_argument(
        "--aa",
        type=int,
        default=0,
        metavar="N",
        help="A/A mode: replay every list (and eager) in N independent passes of interleaved rounds, all lists in the same "
        "rounds of a pass (one pool holds every list's graphs), and check each pass against the calibration's predicted "
        "interval (needs --calibration)",
    )
    ap.add_argument(
        "--recommended",
        help="A/A mode: suggest-buckets' recommended list ('' when it is no graphs); its difference from the ladder is reported",
    )
    ap.add_argument("--out-json", help="write all numbers here")
    return ap.parse_args()


def log(m):
    print(m, file=sys.stderr, flush=True)


def tuned_list(args, mix, trace_path: str | None) -> list[int]:
    """--buckets, else what bcgtune suggest-buckets picks for the trace (written to a
    temporary CSV when it was generated)."""
    from bcgtune.core.sglang.replay import parse_bucket_list

    if args.buckets is not None:  # '' : the list of no graphs (suggest-buckets found none pays)
        return parse_bucket_list(args.buckets, "--buckets") if args.buckets.strip() else []
    src = trace_path
    if src is None:
        import tempfile

        from bcgtune.core.trace.prefill_trace import PrefillTrace
        from bcgtune.files.trace_file import save_trace

        sizes, cnt = mix.histogram()
        src = tempfile.mktemp(suffix=".csv")
        save_trace(PrefillTrace(sizes=sizes, counts=cnt), src)
    return suggest(src, 12)


def bucket_lists(args, tuned: list[int], oracle: list[int]) -> dict[str, list[int]]:
    """The lists replayed, by name: SGLang's ladder, the tuned list, every --also, the oracle."""
    from bcgtune.core.sglang.ladder import sglang_default_ladder
    from bcgtune.core.sglang.replay import parse_bucket_list

    lists = {"ladder": sglang_default_ladder(args.max_bs), "tuned": tuned}
    for spec in args.also:
        name, sep, lst = spec.partition("=")
        if not sep or not name or name in lists or name in ("eager", "oracle"):
            raise SystemExit(f"--also {spec!r}: give NAME=LIST with a new name")
        lists[name] = parse_bucket_list(lst, "--also")
    if not args.no_oracle:
        lists["oracle"] = oracle
    return lists


class Replayer:
    """The model on the device, a fresh engine per list, and every replay measured once per
    (batch, bucket): a replay does not depend on which other graphs share the pool."""

    def __init__(self, args, max_tokens: int):
        from bcgtune.engines.build import open_engine
        from bcgtune.engines.config import resolve
        from bcgtune.engines.spec import EngineSpec

        self.args = args
        session = open_engine(resolve(EngineSpec(model=args.model, device=args.device), [max_tokens]))
        self.dev = session.device
        self.max_tokens = max_tokens
        self.model, self.desc = session.model, session.description
        self.env = session.environment.to_json()
        self.replay_ms: dict[tuple[int, int, int], float] = {}
        self.reused = 0

    def new_engine(self):
        if self.args.runner == "breakable":
            from bcgtune.engines.breakable import BreakablePrefillEngine

            return BreakablePrefillEngine(self.model, self.dev, self.max_tokens, graph_impl=self.args.graph_impl)
        from bcgtune.engines.full import FullPrefillEngine

        return FullPrefillEngine(self.model, self.dev, self.max_tokens)

    def time_eager(self, pairs, origin: str, n_batches: int, n_sizes: int) -> tuple[dict, dict]:
        """(inputs per distinct batch, eager median per distinct batch); records the engine
        in the environment."""
        from bcgtune.engines.inputs import text_inputs
        from bcgtune.engines.timing import summarize_ms, time_interleaved

        args, env = self.args, self.env
        t0 = time.perf_counter()
        base = self.new_engine()
        env["runner"] = args.runner
        env["graph_impl"] = base.graph_impl
        env["attention"] = getattr(base, "attention_kind", "sdpa (one sequence)")
        log(
            f"{env.get('gpu_name')} torch {env['torch']} cuda {env['cuda']} hip {env['hip']} driver {env.get('driver')}; "
            f"runner {args.runner} ({env['graph_impl']}, attention {env['attention']}); {n_batches} batches, "
            f"{len(pairs)} distinct (tokens, requests), {n_sizes} distinct sizes; {origin}"
        )
        inputs = {p: text_inputs(self.model, p[0], self.dev, seed=p[0], requests=p[1]) for p in set(pairs)}
        distinct = list(dict.fromkeys(pairs))
        eager_ms = {
            p: summarize_ms(t[0]).median_ms
            for p, t in zip(
                distinct, time_interleaved([[base.eager_call(inputs[p])] for p in distinct], self.dev, args.warmup, args.repeats)
            )
        }
        log(f"eager timed at {len(eager_ms)} batches in {time.perf_counter() - t0:.1f} s")
        del base
        return inputs, eager_ms

    def replay_list(self, name: str, bl: list[int], pairs, counts, inputs, eager_ms) -> dict:
        """One list captured in a fresh pool (time, memory) and the trace's total prefill
        time with it: each batch replayed in its bucket when SGLang's rule allows, else eager."""
        import torch

        from bcgtune.core.sglang.replay import assign_buckets
        from bcgtune.engines.timing import summarize_ms, time_interleaved

        args = self.args
        eng = self.new_engine()
        before = eng.reserved_gib()
        t1 = time.perf_counter()
        recs = eng.capture(bl, record_attention=False) if bl else []  # no graphs: every batch eager
        cap_s = time.perf_counter() - t1
        mem = eng.reserved_gib() - before
        bad = [r for r in recs if not r.ok]
        chosen, replay = assign_buckets(np.asarray([n for n, _ in pairs]), bl)
        keys = [(n, r, c) if ok and c in eng.graphs else None for (n, r), c, ok in zip(pairs, chosen.tolist(), replay.tolist())]
        todo = list(dict.fromkeys(k for k in keys if k is not None and k not in self.replay_ms))
        self.reused += sum(1 for k in dict.fromkeys(k for k in keys if k is not None)) - len(todo)
        # in interleaved rounds, as the calibration measures (every batch once per round)
        times = time_interleaved(
            [[functools.partial(eng.replay, inputs[(n, r)], c)] for n, r, c in todo], self.dev, args.warmup, args.repeats
        )
        for k, t in zip(todo, times):
            self.replay_ms[k] = summarize_ms(t[0]).median_ms
        per_batch = [self.replay_ms[k] if k is not None else eager_ms[p] for k, p in zip(keys, pairs)]
        total = float((np.asarray(per_batch) * counts).sum())
        log(f"{name:9s} {len(bl):4d} graphs, capture {cap_s:6.2f} s, mem {mem:6.3f} GiB, prefill {total / 1e3:8.3f} s")
        eng.release()
        del eng
        torch.cuda.empty_cache() if self.dev.type == "cuda" else None
        return {
            "graphs": len(bl),
            "failed_captures": [(r.bucket, r.error) for r in bad],
            "capture_s": round(cap_s, 3),
            "graph_mem_gib": round(mem, 4),
            "replayed_batches": int(counts[replay].sum()),
            "batches": int(counts.sum()),
            "prefill_ms": round(total, 2),
            "buckets": bl if name != "oracle" else f"{len(bl)} distinct sizes",
        }


def add_predictions(results: dict, lists: dict, calibration: str, mix, tokens, requests, counts) -> None:
    """Each list's predicted total (the time objective's model) next to the measured one."""
    from bcgtune.core.plan.optimizer import predicted_time_ms
    from bcgtune.core.trace.mix import BatchMix
    from bcgtune.files.calibration_file import load_calibration

    cal = load_calibration(calibration)
    pm = BatchMix(tokens, requests, counts, mix.requests_known)
    sizes, cnt = pm.histogram()
    cand = "calibration" if cal.meta.get("bucket_grid") else "trace"
    for name in ["eager", *lists]:
        bl = [] if name == "eager" else lists[name]
        pred = predicted_time_ms(sizes, cnt, bl, cal, candidates=cand, mix=pm)
        results[name]["predicted_ms"] = round(pred, 2)
        results[name]["predicted_over_measured"] = round(pred / results[name]["prefill_ms"], 5)


def compare(results: dict, eager_total: float, predicted: bool) -> tuple[dict, dict]:
    """(ratios between the ways, the targets each meets or misses)."""
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
    if predicted:
        targets["predicted within 1% for every list"] = all(
            abs(r["predicted_over_measured"] - 1) <= 0.01 for r in results.values() if "predicted_over_measured" in r
        )
    return ratios, targets


def print_table(results: dict, lists: dict, tuned: list[int], targets: dict, predicted: bool) -> None:
    o = results.get("oracle")
    ref = o or results["ladder"]
    pred_col = " predicted" if predicted else ""
    print(
        f"{'way':18s} {'graphs':>6s} {'capture s':>9s} {'mem GiB':>8s} {'replayed':>9s} {'prefill s':>10s} "
        f"{'vs oracle' if o else 'vs ladder':>9s}{pred_col}"
    )
    for name in ["eager", *lists]:
        r = results[name]
        pred = f" {r['predicted_ms'] / 1e3:9.3f}" if "predicted_ms" in r else ""
        print(
            f"{name:18s} {r['graphs']:>6d} {r['capture_s']:>9.2f} {r['graph_mem_gib']:>8.3f} "
            f"{r['replayed_batches']:>4d}/{r['batches']:<4d} {r['prefill_ms'] / 1e3:>10.3f} "
            f"{r['prefill_ms'] / ref['prefill_ms']:>9.4f}{pred}"
        )
    print("tuned:", tuned)
    for k, v in targets.items():
        print(f"  {'PASS' if v else ('MISS' if v is not None else 'n/a ')}  {k}")


# ---- A/A mode: the same lists replayed in independent passes, against their intervals ------
def aa_lists(args, tuned: list[int], oracle: list[int]) -> tuple[dict[str, list[int]], str]:
    """The lists of the A/A runs (SGLang's ladder, the optimum, the recommended list when it
    differs, every --also list, the oracle unless --no-oracle), and the name of the
    recommended one: "recommended", "tuned" (it is the optimum) or "eager" (no graphs)."""
    from bcgtune.core.sglang.replay import parse_bucket_list

    lists = bucket_lists(args, tuned, oracle)
    if args.recommended is None:
        return lists, "tuned"
    if not args.recommended.strip():
        return lists, "eager"  # recommended: no graphs
    rec = parse_bucket_list(args.recommended, "--recommended")
    if rec == tuned:
        return lists, "tuned"
    return {"ladder": lists.pop("ladder"), "tuned": lists.pop("tuned"), "recommended": rec, **lists}, "recommended"


def aa_passes(rep, lists: dict, pairs, counts, passes: int) -> dict:
    """Every list's total in each of `passes` independent passes. One engine holds the graphs
    of every list (a replay does not depend on which other graphs share the pool); a pass
    times, in interleaved rounds (a fresh shuffle per pass), every distinct batch eager and
    every distinct (batch, bucket) some list replays, so all lists of a pass see the same
    rounds. Per list and pass: the total of per-call medians (as the calibration predicts it)
    and the total in each round (for the pass's own paired intervals)."""
    from bcgtune.core.sglang.replay import assign_buckets
    from bcgtune.engines.inputs import text_inputs
    from bcgtune.engines.timing import time_interleaved

    args = rep.args
    union = sorted(set().union(*map(set, lists.values())))
    eng = rep.new_engine()
    t0 = time.perf_counter()
    recs = eng.capture(union, record_attention=False) if union else []
    bad = [r.bucket for r in recs if not r.ok]
    if bad:
        raise SystemExit(f"capture failed at {bad[:5]}")
    log(f"captured {len(union)} graphs (every list's buckets) in {time.perf_counter() - t0:.1f} s")
    distinct = list(dict.fromkeys(pairs))
    inputs = {p: text_inputs(rep.model, p[0], rep.dev, seed=p[0], requests=p[1]) for p in distinct}
    tokens = np.asarray([n for n, _ in pairs])
    keys = {}
    for name, bl in lists.items():
        chosen, replay = assign_buckets(tokens, bl)
        keys[name] = [(n, r, int(c)) if ok else None for (n, r), c, ok in zip(pairs, chosen.tolist(), replay.tolist())]
    keys["eager"] = [None] * len(pairs)
    replays = list(dict.fromkeys(k for ks in keys.values() for k in ks if k is not None))
    groups = [[eng.eager_call(inputs[p])] for p in distinct] + [
        [functools.partial(eng.replay, inputs[(n, r)], b)] for n, r, b in replays
    ]
    index = {("eager", p): i for i, p in enumerate(distinct)} | {k: len(distinct) + i for i, k in enumerate(replays)}
    out: dict = {name: {"runs_ms": [], "round_totals_ms": []} for name in keys}
    for p in range(passes):
        t1 = time.perf_counter()
        times = time_interleaved(groups, rep.dev, args.warmup, args.repeats, seed=args.seed + 1000 * (p + 1))
        per_call = np.asarray([t[0] for t in times], dtype=np.float64)  # calls x rounds
        med = np.median(per_call, axis=1)
        for name, ks in keys.items():
            rows = np.asarray([index[k] if k is not None else index[("eager", q)] for k, q in zip(ks, pairs)])
            w = counts.astype(np.float64)
            out[name]["runs_ms"].append(float(w @ med[rows]))
            out[name]["round_totals_ms"].append((w @ per_call[rows]).tolist())
        log(
            f"pass {p + 1}/{passes}: {len(groups)} calls x {args.repeats} rounds in {time.perf_counter() - t1:.1f} s; "
            + ", ".join(f"{name} {v['runs_ms'][-1] / 1e3:.3f} s" for name, v in out.items())
        )
    eng.release()
    return out


def aa_predictions(lists: dict, calibration: str, mix, tokens, requests, counts):
    """(TimeModel on the replayed batches, each list's predicted total with its interval)."""
    from bcgtune.core.plan.bucket_plan import resolve_candidates
    from bcgtune.core.plan.predict import TimeModel
    from bcgtune.core.trace.mix import BatchMix
    from bcgtune.files.calibration_file import load_calibration

    cal = load_calibration(calibration)
    pm = BatchMix(tokens, requests, counts, mix.requests_known)
    sizes, cnt = pm.histogram()
    tm = TimeModel(sizes, cnt, cal, candidates=resolve_candidates("auto", cal), mix=pm)
    return tm, {name: tm.total(bl) for name, bl in {**lists, "eager": []}.items()}


def aa_report(lists: dict, runs: dict, tm, pred: dict, pick: str) -> dict:
    """Per list: predicted ± interval, each run, how many runs fall inside; the recommended
    (else the optimum) list's difference from the ladder: predicted (paired, calibration)
    and measured (each run, with the run's own paired interval; mean and SE over runs)."""
    from bcgtune.core.stats import round_interval

    table = {}
    for name in [*lists, "eager"]:
        iv = pred[name]
        ms = runs[name]["runs_ms"]
        inside = [iv.contains(x) for x in ms]
        table[name] = {
            "graphs": len(lists.get(name, [])),
            "predicted_ms": iv.center,
            "predicted_half_ms": iv.half,
            "runs_ms": ms,
            "inside": None if iv.half is None else int(sum(bool(x) for x in inside)),
            "run_half_ms": [round_interval(c, r).half for c, r in zip(ms, runs[name]["round_totals_ms"])],
        }
    d_pred = tm.difference(lists.get(pick, []), lists["ladder"])
    d_runs = [a - b for a, b in zip(runs[pick]["runs_ms"], runs["ladder"]["runs_ms"])]
    d_run_iv = [
        round_interval(d, np.asarray(ra) - np.asarray(rb))
        for d, ra, rb in zip(d_runs, runs[pick]["round_totals_ms"], runs["ladder"]["round_totals_ms"])
    ]
    n = len(d_runs)
    se = float(np.std(d_runs, ddof=1) / np.sqrt(n)) if n > 1 else None
    return {
        "lists": table,
        "recommended": pick,
        "difference": {
            "list": pick,
            "vs": "ladder",
            "predicted_ms": d_pred.center,
            "predicted_half_ms": d_pred.half,
            "runs_ms": d_runs,
            "run_half_ms": [iv.half for iv in d_run_iv],
            "mean_ms": float(np.mean(d_runs)),
            "se_ms": se,
            "inside": None if d_pred.half is None else int(sum(bool(d_pred.contains(x)) for x in d_runs)),
        },
    }


def print_aa(rep: dict, passes: int) -> None:
    def pm(c, h):
        return f"{c / 1e3:.3f}" + (f" ± {h / 1e3:.3f}" if h is not None else "")

    runs = " ".join(f"{'run ' + str(i + 1) + ' s':>9s}" for i in range(passes))
    print(f"{'list':14s} {'graphs':>6s} {'predicted s (95%)':>19s} {runs} {'inside':>7s}")
    for name, r in rep["lists"].items():
        cells = " ".join(f"{x / 1e3:9.3f}" for x in r["runs_ms"])
        inside = "-" if r["inside"] is None else f"{r['inside']}/{passes}"
        print(f"{name:14s} {r['graphs']:6d} {pm(r['predicted_ms'], r['predicted_half_ms']):>19s} {cells} {inside:>7s}")
    d = rep["difference"]
    se = f", SE {d['se_ms']:.1f} ms over {passes} runs" if d["se_ms"] is not None else ""
    each = ", ".join(f"{x:+.1f}" + (f" ± {h:.1f}" if h is not None else "") for x, h in zip(d["runs_ms"], d["run_half_ms"]))
    print(
        f"{d['list']} - {d['vs']}: predicted {d['predicted_ms']:+.1f}"
        + (f" ± {d['predicted_half_ms']:.1f}" if d["predicted_half_ms"] is not None else "")
        + f" ms (paired, calibration); measured {each} ms (each run, paired within it); "
        f"mean {d['mean_ms']:+.1f} ms{se}"
        + (f"; inside the predicted interval in {d['inside']}/{passes} runs" if d["inside"] is not None else "")
    )
    e = rep["lists"]["eager"]
    if e["inside"] is not None:
        print(f"eager inside its predicted interval in {e['inside']}/{passes} runs")


def main_aa(args, mix, origin, trace_path, tokens, requests, counts) -> int:
    from bcgtune.fileio import atomic_write_json

    if not args.calibration:
        raise SystemExit("--aa needs --calibration (the intervals to check)")
    tuned = tuned_list(args, mix, trace_path)
    oracle = sorted(set(tokens.tolist()))
    lists, pick = aa_lists(args, tuned, oracle)
    rep = Replayer(args, max(max(bl) for bl in lists.values() if bl))
    pairs = list(zip(tokens.tolist(), requests.tolist()))
    log(f"{rep.env.get('gpu_name')} torch {rep.env['torch']}; {mix.n_batches} batches, {len(set(pairs))} distinct; {origin}")
    runs = aa_passes(rep, lists, pairs, counts, args.aa)
    tm, pred = aa_predictions(lists, args.calibration, mix, tokens, requests, counts)
    report = aa_report(lists, runs, tm, pred, pick)
    report.update(
        environment=rep.env,
        model=rep.desc,
        trace=origin,
        runner=args.runner,
        every=args.every,
        batches=int(counts.sum()),
        bucket_lists=lists,
        passes=runs,
        method={
            "passes": args.aa,
            "warmup": args.warmup,
            "repeats": args.repeats,
            "timer": "CUDA events, median of interleaved rounds; every list's replays and eager in the same rounds of a pass",
        },
    )
    if args.out_json:
        atomic_write_json(args.out_json, report)
    print_aa(report, args.aa)
    return 0


def main() -> int:
    from bcgtune.fileio import atomic_write_json

    args = parse_args()
    mix, origin, trace_path = load_mix(args.trace, args.seed, args.batches)
    mix = mix.sample(args.every)
    tokens, requests, counts = mix.tokens.astype(int), mix.requests.astype(int), mix.counts.astype(int)
    if args.runner == "full":
        requests = np.ones_like(requests)  # the full engine's one request slot
    if args.aa:
        return main_aa(args, mix, origin, trace_path, tokens, requests, counts)
    tuned = tuned_list(args, mix, trace_path)
    oracle = sorted(set(tokens.tolist()))
    lists = bucket_lists(args, tuned, oracle)
    rep = Replayer(args, max(max(bl) for bl in lists.values() if bl))
    pairs = list(zip(tokens.tolist(), requests.tolist()))
    inputs, eager_ms = rep.time_eager(pairs, origin, mix.n_batches, len(oracle))

    results = {}
    for name, bl in lists.items():
        results[name] = rep.replay_list(name, bl, pairs, counts, inputs, eager_ms)
        if args.out_json:  # partial results survive a timeout
            atomic_write_json(args.out_json + ".partial", {"results": results})
    eager_total = float(sum(eager_ms[p] * c for p, c in zip(pairs, counts)))
    results["eager"] = {
        "graphs": 0,
        "capture_s": 0.0,
        "graph_mem_gib": 0.0,
        "prefill_ms": round(eager_total, 2),
        "replayed_batches": 0,
        "batches": int(counts.sum()),
    }
    if args.calibration:
        add_predictions(results, lists, args.calibration, mix, tokens, requests, counts)
    ratios, targets = compare(results, eager_total, bool(args.calibration))
    report = {
        "environment": rep.env,
        "model": rep.desc,
        "trace": origin,
        "runner": args.runner,
        "every": args.every,
        "batches": int(counts.sum()),
        "distinct_batches": len(pairs),
        "distinct_sizes": len(oracle),
        "requests_known": mix.requests_known,
        "tuned_buckets": tuned,
        "lists": lists | {"oracle": len(oracle)},
        "results": results,
        "ratios": ratios,
        "targets": targets,
        "replay_measurements": len(rep.replay_ms),
        "replay_reused": rep.reused,
        "eager_ms": {f"{n}x{r}": v for (n, r), v in eager_ms.items()},
        "replay_ms": {f"{n}x{r}@{b}": v for (n, r, b), v in rep.replay_ms.items()},
        "method": {
            "warmup": args.warmup,
            "repeats": args.repeats,
            "timer": "CUDA events, median of interleaved rounds (every batch once per round, shuffled)",
            "inputs": "n random tokens split evenly into r requests, seeded by n",
        },
    }
    if args.out_json:
        atomic_write_json(args.out_json, report)
        Path(args.out_json + ".partial").unlink(missing_ok=True)
    print_table(results, lists, tuned, targets, bool(args.calibration))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
