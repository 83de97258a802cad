"""Check a tune's whole-trace figure by measuring it: replay every batch of the trace, in
trace order, under the tune's recommended list and SGLang's ladder, and compare the measured
gain with the `trace_estimate` the tune printed (its gain over the ladder on the whole trace
and its 95% interval).

Both lists are captured once into one pool; each pass runs its rounds with the two lists in a
fresh shuffled order per round (engines/trace_replay.replay_in_order, the proof's own replay),
so the gain of a pass is paired. Per pass it prints the measured totals and the gain
(ladder - recommended) / ladder, computed as the proof computes it (each call's median over the
pass's rounds, summed), and whether it falls inside the tune's interval.

    PYTHONPATH=. python3 benchmarks/whole_trace_check.py TUNE_JSON TRACE --model qwen3-8b \
        [--device cuda|sim --sim-calibration CAL] [--chunked-prefill-size 8192] \
        [--passes 2] [--repeats 2] [--warmup 1] [--out-json FILE]

TUNE_JSON is `bcgtune tune ... --json`'s output; TRACE the trace it tuned. The rank the tune
measured (TP, EP, all-reduce, MoE routing) is read from the JSON's engine record; a tune with
a measured all-reduce curve needs that curve again (--all-reduce-curve FILE).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("tune_json")
    ap.add_argument("trace")
    ap.add_argument("--model", required=True)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--sim-calibration", default=None)
    ap.add_argument("--chunked-prefill-size", type=int, default=None)
    ap.add_argument("--passes", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--all-reduce-curve", default=None, help="the tune's --all-reduce-curve, where it gave one")
    ap.add_argument("--out-json", default=None)
    a = ap.parse_args(argv)

    from bcgtune.core.plan.model_check import trace_sequence
    from bcgtune.engines.build import open_engine
    from bcgtune.engines.config import resolve
    from bcgtune.engines.spec import EngineSpec
    from bcgtune.engines.trace_replay import replay_in_order
    from bcgtune.files.trace_file import load_trace

    d = json.loads(Path(a.tune_json).read_text())
    proof = d["steps"]["proof"]
    est = proof["trace_estimate"]
    lists = {
        "recommended": [int(b) for b in proof["lists"]["recommended"]["buckets"]],
        "SGLang ladder": [int(b) for b in proof["lists"]["SGLang ladder"]["buckets"]],
    }
    engine_rec = d.get("engine") or {}
    par = engine_rec.get("parallel") or {}
    all_reduce = par.get("all_reduce") or "none"
    if all_reduce == "real":
        raise SystemExit("the tune timed real all-reduces across processes: this one-process replay cannot")
    curve = par.get("curve") or {}
    if curve.get("points") and not a.all_reduce_curve:
        raise SystemExit(f"the tune added a measured all-reduce curve ({curve['source']}): give it with --all-reduce-curve")
    trace = load_trace(a.trace)
    tok, rq, ordered = trace_sequence(trace, seed=a.seed)
    spec = EngineSpec(
        model=a.model,
        device=a.device,
        seed=a.seed,
        chunked_prefill_size=a.chunked_prefill_size,
        sim_calibration=a.sim_calibration,
        tp=par.get("tp"),
        ep=par.get("ep"),
        all_reduce="auto" if all_reduce == "none" else all_reduce,
        all_reduce_curve=a.all_reduce_curve,
        routing=engine_rec.get("routing") or "skewed",
    )
    largest = max(int(tok.max()), *(max(b) for b in lists.values() if b))
    cfg = resolve(spec, [largest], what="trace size")
    if cfg.runner == "full":
        rq = np.ones_like(rq)
    session = open_engine(cfg)
    engine = session.engine
    print(
        f"whole trace: {tok.size:,} batches{' in trace order' if ordered else ' (shuffled: the trace keeps no order)'}; "
        f"recommended {len(lists['recommended'])} graphs, ladder {len(lists['SGLang ladder'])}; "
        f"device {session.environment.gpu_name or engine.device.type}",
        flush=True,
    )
    lo, hi = est["gain_pct"] - est["half_pct"], est["gain_pct"] + est["half_pct"]
    print(
        f"the tune's figure: gain {est['gain_pct']:.2f}% ± {est['half_pct']:.2f} over the ladder on the whole trace "
        f"(measured on {est['sampled_batches']} of {est['trace_batches']} batches)",
        flush=True,
    )
    passes = []
    for p in range(a.passes):
        t0 = time.perf_counter()
        got = replay_in_order(engine, lists, tok, rq, a.warmup, a.repeats, seed=a.seed + 7919 * (p + 1))
        r, lad = got["recommended"].measured_ms, got["SGLang ladder"].measured_ms
        gain = (lad - r) / lad * 100.0
        lad_rounds = got["SGLang ladder"].round_totals_ms
        rounds = (lad_rounds - got["recommended"].round_totals_ms) / lad_rounds * 100
        inside = lo <= gain <= hi
        passes.append(
            {
                "recommended_ms": r,
                "ladder_ms": lad,
                "gain_pct": gain,
                "round_gains_pct": rounds.tolist(),
                "inside": bool(inside),
                "wall_s": time.perf_counter() - t0,
            }
        )
        print(
            f"pass {p + 1}/{a.passes} ({time.perf_counter() - t0:.0f} s): recommended {r / 1e3:.3f} s, ladder {lad / 1e3:.3f} s, "
            f"gain {gain:.2f}% (rounds: {', '.join(f'{g:.2f}' for g in rounds)}); "
            f"{'inside' if inside else 'OUTSIDE'} the tune's interval [{lo:.2f}, {hi:.2f}]",
            flush=True,
        )
    engine.release()
    out = {
        "tune_json": a.tune_json,
        "trace": a.trace,
        "batches": int(tok.size),
        "ordered": bool(ordered),
        "lists": lists,
        "trace_estimate": est,
        "passes": passes,
        "inside": sum(p["inside"] for p in passes),
        "warmup": a.warmup,
        "repeats": a.repeats,
        "device": session.environment.gpu_name or engine.device.type,
    }
    print(f"inside the tune's interval in {out['inside']}/{a.passes} passes")
    if a.out_json:
        tmp = Path(a.out_json + ".tmp")
        tmp.write_text(json.dumps(out, indent=1))
        tmp.replace(a.out_json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
