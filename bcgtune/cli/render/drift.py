"""Rendering of a DriftReport (bcgtune.core.plan.drift), and of several (services.drift.FleetDrift)."""

from __future__ import annotations

from bcgtune.cli.render.table import table
from bcgtune.core.plan.drift import DriftReport
from bcgtune.services.drift import FleetDrift


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
    if r.time_gain is not None and r.time_gain.half is not None:
        rows[1][-1] += f" ({-r.time_gain.center:+.2f}% ± {r.time_gain.half:.2f})"
    steps = f" grouped into {r.deployed.metrics.batches:,} DP-attention steps" if r.unit == "step" else ""
    lines = [f"today's traffic: {trace_batches:,} prefill batches{steps}; verdict on {r.basis}", ""]
    lines += table(head, rows)
    if r.tolerance_pct is not None and r.margin_ms is not None:
        lines += ["", "rule: " + drift_rule_text(r)]
    if r.tuned:
        lines += ["", _tuned_line(r.tuned)]
    lines += [f"warning: {w}" for w in r.shape_warnings]
    lines += ["", f"verdict: {r.verdict.upper()}: {r.reason}"]
    if r.verdict == "re-tune":
        lines.append("--cuda-graph-bs-prefill " + " ".join(map(str, r.optimum.metrics.buckets)))
    return "\n".join(lines) + "\n"


def drift_rule_text(r: DriftReport) -> str:
    """The time verdict's rule with its margin in % and ms (suggest-buckets' rule)."""
    ms = f"{r.margin_ms:,.1f}" if (r.margin_ms or 0) >= 10 else f"{r.margin_ms:.3g}"
    return (
        f"keep when the deployed list's paired 95% upper bound is within {r.tolerance_pct:g}% ({ms} ms) of today's "
        f"optimum (--tolerance) or the gain's upper end is within the {r.threshold_pct:g}% threshold; a gain is claimed "
        "only when its whole interval is above the threshold"
    )


def _tuned_line(tuned: dict) -> str:
    """The profile's [tuned] record: the gain bcgtune tune measured for the list it wrote."""
    from bcgtune.files.profile_file import tuned_text

    return "the deployed list was " + tuned_text(tuned)


def render_fleet_text(f: FleetDrift, trace_batches: int) -> str:
    """Several judged lists (profiles, or configurations' captured lists): one table."""
    timed = any(r.report.deployed.predicted_ms is not None for r in f.rows)
    basis = f.rows[0].report.basis if f.rows else "replay and padding"
    head = ["deployed", "configuration", "batches", "graphs", "hit %", "today's opt.", "waste %", "today's opt."]
    head += ["gain %"] if timed else []
    head += ["verdict"]
    rows = []
    for r in f.rows:
        d, o = r.report.deployed.metrics, r.report.optimum.metrics
        where = "the trace" if r.group is None else f"group {r.group}"
        row = [r.deployed, where, f"{r.batches:,}", str(d.graphs), f"{d.hit_rate_pct:.1f}", f"{o.hit_rate_pct:.1f}"]
        row += [f"{d.waste_pct:.2f}", f"{o.waste_pct:.2f}"]
        if timed:
            g = r.report.time_gain
            row.append("" if g is None else f"{g.center:.2f}" + ("" if g.half is None else f" ± {g.half:.2f}"))
        row.append(r.report.verdict.upper())
        rows.append(row)
    lists = f"{len(f.rows)} list{'s' if len(f.rows) != 1 else ''}"
    lines = [f"today's traffic: {trace_batches:,} prefill batches; {lists} judged on {basis}", ""]
    lines += table(head, rows)
    labels = dict.fromkeys(
        f"group {r.group}: {r.configuration}{_files(f.files.get(r.group, []))}" for r in f.rows if r.group is not None
    )
    if labels:
        lines += ["", "configurations (launch settings the logs state; their files):"] + [f"  {label}" for label in labels]
    paired = [f"  {r.deployed} on group {r.group}: by {r.matched}" for r in f.rows if r.matched in ("--match", "--group")]
    if paired:
        lines += ["", "paired by hand:"] + paired
    retune = [r for r in f.rows if r.report.verdict == "re-tune"]
    lines.append("")
    if retune:
        lines.append(f"verdict: RE-TUNE: {len(retune)} of {len(f.rows)} lists")
        for r in retune:
            at = "" if r.group is None else f" (group {r.group})"
            lines.append(f"  {r.deployed}{at}: {r.report.reason}")
            lines.append("  --cuda-graph-bs-prefill " + " ".join(map(str, r.report.optimum.metrics.buckets)))
    else:
        within = "shown within the threshold or the tolerance" if timed else "within the threshold"
        lines.append(f"verdict: KEEP: {'all ' + str(len(f.rows)) + ' lists' if len(f.rows) != 1 else 'the list'} {within}")
    for r in f.rows:
        if r.report.tuned:
            lines.append(f"note: {r.deployed}: {_tuned_line(r.report.tuned)}")
    for u in f.unjudged:
        lines.append(f"note: not judged: {u}")
    return "\n".join(lines) + "\n"


def _files(names: list[str], most: int = 4) -> str:
    """`; a.log, b.log +3 more` for a configuration's files."""
    if not names:
        return ""
    return "; " + ", ".join(names[:most]) + (f" +{len(names) - most} more" if len(names) > most else "")
