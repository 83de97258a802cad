"""How often do the intervals `bcgtune tune` prints hold the truth? Simulated tunes on the
simulated device, whose truth over the whole trace is known exactly (bcgtune/engines/sim).

    python benchmarks/tune_coverage.py                      # 200 tunes, 2 workers
    python benchmarks/tune_coverage.py --tunes 40 --jobs 1   # smaller

Each tune is the default `bcgtune tune TRACE --model M --device sim --sim-calibration CAL`
(the budget planned to 600 simulated device seconds; validation is not run: the numerics are
not what this measures), with its own seed: its own simulated world (roughness) and process
(level shift, drift, host, captures, per-call noise). The cells are two recorded H200
calibrations (the Qwen3-0.6B shape, launch-bound, and the Qwen3-8B shape, compute-bound)
times two traces (the default workload in trace order with request counts, and a text-chat
trace kept as a size histogram, replayed in a seeded shuffle); seeds go round the cells.

For every printed 95% interval on the whole trace, whether it holds the truth and its
half-width: each list's total (recommended, SGLang's ladder, eager, the optimum when the
proof replays it), recommended minus ladder, the trace gain over the ladder, and recommended
minus optimum. Beside them, what the tool printed before this estimate existed, for
comparison: the proof sample's measured gain read as the trace's, and the model's predicted
recommended-minus-ladder before the proof. Also the budget: spent against the limit, and each
step's spent against its prediction.

Writes benchmarks/results/tune_coverage.json (every tune's figures) and prints the table.
Every worker is a child of this process and ends with it.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing as mp
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from _machine import machine_line  # noqa: E402

CALS = {
    "qwen3-0.6b": "benchmarks/results/cal_breakable_interleaved_grid64_qwen3-0.6b_h200.json",
    "qwen3-8b": "benchmarks/results/cal_breakable_onephase_grid128_qwen3-8b_h200.json",
}
TRACES = {
    "default workload": "benchmarks/data/default_workload.json",
    "text chat (histogram)": "benchmarks/data/chat_text_h200.csv",
}
QUANTITIES = (
    "total: recommended",
    "total: SGLang ladder",
    "total: eager",
    "total: optimum",
    "recommended - ladder",
    "trace gain (%)",
    "recommended - optimum",
)


def one_tune(job: tuple[int, str, str, str, str, float, int]) -> dict:
    """One simulated tune and its figures against the truth."""
    seed, model, cal, trace_name, trace, budget, chunk = job
    os.chdir(ROOT)
    from bcgtune.core.plan.model_check import trace_sequence
    from bcgtune.engines.sim.engine import device_of
    from bcgtune.engines.spec import EngineSpec
    from bcgtune.files.trace_file import load_trace
    from bcgtune.services import tune

    spec = EngineSpec(model=model, device="sim", sim_calibration=cal, chunked_prefill_size=chunk, seed=seed)
    with tempfile.TemporaryDirectory() as d:
        req = tune.TuneRequest(trace=trace, spec=spec, state_dir=d, validate=False, budget_s=budget)
        t0 = time.perf_counter()
        res = tune.tune(req)
        wall = time.perf_counter() - t0
    dev = device_of(spec)
    tok, rq, _ = trace_sequence(load_trace(trace), seed=seed)
    proof = res.steps["proof"]
    truth = {n: dev.truth.total_ms(tok, rq, r["buckets"]) for n, r in proof["lists"].items()}
    t = proof["trace"]
    out: dict = {"seed": seed, "model": model, "trace": trace_name, "wall_s": round(wall, 2), "checks": {}}

    def check(name: str, est: dict | None, true: float, scale: float) -> None:
        if est is None:
            return
        c, h = float(est["center"]), float(est["half"])
        out["checks"][name] = {
            "truth": true,
            "center": c,
            "half": h,
            "inside": abs(true - c) <= h,
            "half_rel_pct": 100.0 * h / scale if scale else None,
        }

    for n in ("recommended", "SGLang ladder", "eager", "optimum"):
        if n in t["lists"]:
            check(f"total: {n}", t["lists"][n], truth[n], truth[n])
    lad = truth["SGLang ladder"]
    d_true = truth["recommended"] - lad
    check("recommended - ladder", t["recommended_minus_ladder"], d_true, lad)
    g_true = -100.0 * d_true / lad
    check("trace gain (%)", {"center": t["gain"]["gain_pct"], "half": t["gain"]["half_pct"]}, g_true, 100.0)
    if t.get("recommended_minus_optimum") is not None:
        check("recommended - optimum", t["recommended_minus_optimum"], truth["recommended"] - truth["optimum"], truth["optimum"])
    # what the tool printed before: the sample's gain read as the trace's, the model's prediction
    rml = proof["recommended_minus_ladder"]
    g_sample = float(sum(rml["measured_gain_pct"]) / len(rml["measured_gain_pct"]))
    h_sample = max([h for h in rml["measured_gain_half_pct"] if h is not None] or [math.nan])
    check("before: sample gain read as the trace's (%)", {"center": g_sample, "half": h_sample}, g_true, 100.0)
    pred = res.steps["measure"]["recommended_minus_ladder"]
    if pred.get("half") is not None:
        check("before: predicted recommended - ladder", pred, d_true, lad)
    out["sample"] = proof["sample"]
    out["budget"] = res.budget
    out["steps"] = {n: {"predicted_s": st.get("predicted_s"), "spent_s": st.get("spent_s")} for n, st in res.steps.items()}
    out["graphs"] = {n: len(r["buckets"]) for n, r in proof["lists"].items()}
    return out


def summarize(rows: list[dict]) -> dict:
    import numpy as np

    table = {}
    names = list(QUANTITIES) + ["before: sample gain read as the trace's (%)", "before: predicted recommended - ladder"]
    for q in names:
        got = [r["checks"][q] for r in rows if q in r["checks"]]
        if not got:
            continue
        inside = [g["inside"] for g in got]
        halves = [g["half_rel_pct"] for g in got if g["half_rel_pct"] is not None]
        table[q] = {
            "tunes": len(got),
            "coverage_pct": 100.0 * sum(inside) / len(inside),
            "median_half_pct": float(np.median(halves)) if halves else None,
        }
    return table


def budget_summary(rows: list[dict]) -> dict:
    import numpy as np

    out: dict = {}
    for model in sorted({r["model"] for r in rows}):
        mine = [r for r in rows if r["model"] == model]
        spent = [r["budget"]["spent_s"] for r in mine]
        limit = mine[0]["budget"]["limit_s"]
        ratios: dict[str, list[float]] = {}
        for r in mine:
            for n, st in r["steps"].items():
                p, s = st["predicted_s"], st["spent_s"]
                if p and s is not None and p > 1.0:
                    ratios.setdefault(n, []).append(s / p)
        out[model] = {
            "limit_s": limit,
            "spent_max_s": float(max(spent)),
            "spent_median_s": float(np.median(spent)),
            "over_budget": int(sum(s > limit for s in spent)),
            "steps_spent_over_predicted": {
                n: {
                    "min": float(min(v)),
                    "median": float(np.median(v)),
                    "max": float(max(v)),
                    "outside_25pct": int(sum(abs(x - 1) > 0.25 for x in v)),
                    "tunes": len(v),
                }
                for n, v in ratios.items()
            },  # fmt: skip
        }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tunes", type=int, default=200)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--budget", type=float, default=600.0, help="each tune's budget (simulated device seconds)")
    ap.add_argument("--first-seed", type=int, default=1000)
    ap.add_argument("--out", default="benchmarks/results/tune_coverage.json")
    args = ap.parse_args()
    cells = [(m, c, tn, tp) for m, c in CALS.items() for tn, tp in TRACES.items()]
    jobs = []
    for i in range(args.tunes):
        m, c, tn, tp = cells[i % len(cells)]
        jobs.append((args.first_seed + i, m, c, tn, tp, args.budget, 8192))
    t0 = time.perf_counter()
    rows: list[dict] = []
    ctx = mp.get_context("fork")
    with ctx.Pool(max(1, args.jobs)) as pool:
        for k, r in enumerate(pool.imap_unordered(one_tune, jobs), 1):
            rows.append(r)
            if k % 10 == 0 or k == len(jobs):
                print(f"{k}/{len(jobs)} tunes ({time.perf_counter() - t0:.0f} s)", file=sys.stderr, flush=True)
    rows.sort(key=lambda r: r["seed"])
    overall = summarize(rows)
    per_cell = {f"{m} / {tn}": summarize([r for r in rows if r["model"] == m and r["trace"] == tn]) for m, _, tn, _ in cells}
    doc = {
        "machine": machine_line(),
        "command": " ".join(["python", "benchmarks/tune_coverage.py", *sys.argv[1:]]),
        "tunes": len(rows),
        "wall_s": round(time.perf_counter() - t0, 1),
        "overall": overall,
        "per_cell": per_cell,
        "budget": budget_summary(rows),
        "rows": rows,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(args.out).with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=1))
    os.replace(tmp, args.out)
    print(machine_line())
    print(f"{len(rows)} simulated tunes in {doc['wall_s']:.0f} s; 95% intervals against the truth over the whole trace\n")
    print(f"{'quantity':46s} {'tunes':>5s} {'coverage':>9s} {'median half-width':>18s}")
    for q, v in overall.items():
        unit = "points" if "(%)" in q else "% of the truth"
        half = "-" if v["median_half_pct"] is None else f"{v['median_half_pct']:.3f} {unit}"
        print(f"{q:46s} {v['tunes']:5d} {v['coverage_pct']:8.1f}% {half:>18s}")
    print()
    for cell, tab in per_cell.items():
        print(cell + ": " + ", ".join(f"{q} {v['coverage_pct']:.0f}%" for q, v in tab.items() if not q.startswith("before")))
    print()
    for model, b in doc["budget"].items():
        steps = ", ".join(
            f"{n} {v['min']:.2f}-{v['max']:.2f} ({v['outside_25pct']} outside 25%)"
            for n, v in b["steps_spent_over_predicted"].items()
        )
        print(
            f"{model}: spent median {b['spent_median_s']:.0f} s, max {b['spent_max_s']:.0f} s of {b['limit_s']:.0f} s "
            f"({b['over_budget']} over); spent/predicted per step: {steps}"
        )


if __name__ == "__main__":
    main()
