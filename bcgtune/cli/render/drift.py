"""Rendering of a DriftReport (bcgtune.core.drift)."""

from __future__ import annotations

from bcgtune.cli.render.table import table
from bcgtune.core.drift import DriftReport


def render_drift_text(r: DriftReport, trace_batches: int) -> str:
    timed = r.deployed.predicted_ms is not None
    head = ["list", "graphs", "hit %", "eager", "waste %"] + (["pred. ms"] if timed else [])
    rows = []
    for side in (r.deployed, r.optimum):
        m = side.metrics
        row = [side.name, str(m.graphs), f"{m.hit_rate_pct:.1f}", f"{m.eager_batches:,}", f"{m.waste_pct:.2f}"]
        if timed:
            row.append(f"{side.predicted_ms:,.1f}")
        rows.append(row)
    lines = [f"today's traffic: {trace_batches:,} prefill batches; verdict on {r.basis}", ""]
    lines += table(head, rows)
    lines += ["", f"verdict: {r.verdict.upper()}: {r.reason}"]
    if r.verdict == "re-tune":
        lines.append("--cuda-graph-bs-prefill " + " ".join(map(str, r.optimum.metrics.buckets)))
    return "\n".join(lines) + "\n"
