"""Time curves of several calibrations side by side (dense 8B, 30B-A3B, a TP-4 rank, ...): a
forward replayed in its bucket (segments + the break of one request as long as the bucket)
and run eagerly, against tokens, each labelled with the shape the calibration recorded
(model, TP, all-reduce, MoE routing). The right panel is time per token, where the shape's
flat launch-bound range and its compute-bound slope show.

    python benchmarks/plot_time_curves.py LABEL=CAL.json ... -o curves.png [--csv curves.csv]

Writes the curves' values as CSV too (with --csv, or beside the PNG), so a machine without
matplotlib still keeps them (then pass --csv only). Reads calibrations as bcgtune does
(files/calibration_file.py)."""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def curves(cal) -> dict[str, np.ndarray]:
    """tokens, replay ms (in a bucket of that size), eager ms, for one request."""
    tokens = np.asarray(cal.tokens, dtype=np.int64)
    graph = np.asarray(cal.graph_time(tokens), dtype=np.float64)
    if cal.runner == "breakable":
        graph = graph + np.asarray(cal.break_time(tokens, 1), dtype=np.float64)
    eager = np.asarray(cal.eager_time(tokens, 1), dtype=np.float64)
    return {"tokens": tokens, "replay_ms": graph, "eager_ms": eager}


def shape_label(cal) -> str:
    shape = cal.meta.get("shape") if isinstance(cal.meta, dict) else None
    gpu = (cal.meta.get("gpu") or {}).get("gpu_name") if isinstance(cal.meta, dict) else None
    if not isinstance(shape, dict):
        return f"{(cal.meta.get('model') or {}).get('name', '?')} on {gpu or 'CPU'}"
    moe = shape.get("moe")
    tp = f"TP {shape.get('tp')}" + (f" ({shape.get('all_reduce')} all-reduce)" if shape.get("tp", 1) > 1 else "")
    parts = [f"{shape.get('model')}", tp]
    if isinstance(moe, dict):
        parts.append(f"{moe.get('rank_experts')}/{moe.get('experts')} experts top {moe.get('top_k')}, {moe.get('routing')}")
    return ", ".join(parts) + f" on {gpu or 'CPU'}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("calibrations", nargs="+", metavar="LABEL=CAL.json")
    ap.add_argument("-o", "--out", help="the PNG (needs matplotlib)")
    ap.add_argument("--csv", help="the curves' values (default: beside the PNG)")
    args = ap.parse_args(argv)
    from bcgtune.errors import BcgError
    from bcgtune.files.calibration_file import load_calibration

    named = []
    for item in args.calibrations:
        label, sep, path = item.partition("=")
        if not sep:
            label, path = Path(item).stem, item
        try:
            cal = load_calibration(path)
        except BcgError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        named.append((label, cal, curves(cal)))
    out_csv = args.csv or (str(Path(args.out).with_suffix(".csv")) if args.out else None)
    if out_csv is None:
        print("error: give -o PNG or --csv CSV", file=sys.stderr)
        return 2
    with open(out_csv, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["label", "shape", "tokens", "replay_ms", "eager_ms"])
        for label, cal, c in named:
            for t, g, e in zip(c["tokens"], c["replay_ms"], c["eager_ms"]):
                w.writerow([label, shape_label(cal), int(t), f"{g:.4f}", f"{e:.4f}"])
    print(f"wrote {out_csv}")
    if not args.out:
        return 0
    try:
        import matplotlib
    except ImportError:
        print("matplotlib is not installed (pip install 'bcgtune[plot]'): the curves are in the CSV", file=sys.stderr)
        return 0
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(14, 5))
    for i, (label, cal, c) in enumerate(named):
        color = f"C{i}"
        t = c["tokens"]
        ax1.plot(t, c["replay_ms"], "-", color=color, label=f"{label}: replay ({shape_label(cal)})")
        ax1.plot(t, c["eager_ms"], "--", color=color, label=f"{label}: eager")
        ax2.plot(t, 1e3 * c["replay_ms"] / t, "-", color=color, label=f"{label}: replay")
        ax2.plot(t, 1e3 * c["eager_ms"] / t, "--", color=color, label=f"{label}: eager")
    ax1.set(xlabel="tokens (bucket = batch, one request)", ylabel="ms per forward", title="prefill time")
    ax2.set(xlabel="tokens", ylabel="us per token", title="time per token", xscale="log", yscale="log")
    ax1.legend(fontsize=7)
    ax2.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
