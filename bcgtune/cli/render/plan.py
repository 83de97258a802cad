"""Rendering of a BucketPlan (bcgtune.core.plan.bucket_plan): text, and a PNG plot."""

from __future__ import annotations

import io

from bcgtune.cli.render.table import count, num, table
from bcgtune.core.plan.plan_types import BucketPlan

CURVE_ROWS_SHOWN = 24

# Command-line names of the plan's constraints, for the notes that explain a beaten optimum.
_FLAG_HINTS = (
    ("allowed", "--max-buckets"),
    ("multiples of", "--align"),
    ("buckets above", "--max-bucket"),
    ("did not measure", "--candidates"),
    ("only to be compared", "calibrate --extend"),
    ("budget", "--max-graph-mem"),
)


def render_plan_text(plan: BucketPlan) -> str:
    lines = _header(plan) + [""] + _comparison(plan) + [""] + _curve(plan) + [""] + _summary(plan) + _notes(plan)
    if plan.recommended.buckets:
        lines += ["", plan.flag]
    return "\n".join(lines) + "\n"


def _header(plan: BucketPlan) -> list[str]:
    t, r = plan.trace, plan.request
    src = ", ".join(s.get("path", "?") for s in t.sources if isinstance(s, dict))
    if not src and t.workload:
        src = f"workload {t.workload!r}"
    if r.objective == "padding":
        objective = f"padding (fewest eager {_plural(plan.unit)}, then fewest padded tokens)"
    else:
        objective = (
            "time (predicted prefill time"
            + ("; buckets only at measured sizes" if plan.candidate_set == "calibration" else "")
            + ")"
        )
    obj = (
        f"objective: {objective}; at most {count(r.max_buckets, 'bucket')}, multiples of {r.align}"
        + (f", none above {r.max_bucket}" if r.max_bucket else "")
        + f"; replay iff bucket <= {r.padding_factor:g} x tokens"
        + (f"; graph memory <= {r.max_graph_mem_gib:g} GiB" if r.max_graph_mem_gib is not None else "")
    )
    return [
        f"trace: {src or '-'} ({t.origin})",
        f"  {count(t.batches, 'prefill batch')}, {count(t.distinct_sizes, 'distinct size')}, "
        f"{count(t.tokens, 'token')}; p50 {num(t.p50)}, p99 {num(t.p99)}, max {num(t.max)}",
        obj,
    ] + _dp_lines(plan)


def _plural(unit: str) -> str:
    """'batch' -> 'batches', 'step' -> 'steps' (count's rule)."""
    return count(2, unit).split(" ", 1)[1]


def _dp_lines(plan: BucketPlan) -> list[str]:
    """How DP attention was priced: per step across ranks, or per batch and why."""
    d = plan.dp_attention
    if d is None:
        return []
    if d.unit != "step":
        return [f"DP attention ({d.ranks} ranks): priced per batch, not per step: {d.reason}"]
    lines = [
        f"DP attention ({d.ranks} ranks): a step replays in the bucket of its largest rank, and only when every "
        "rank's own count replays; padding counts every rank (idle ranks run the whole bucket)",
        f"  {count(d.steps, 'step')} from {count(d.records, 'prefill record')}, grouped by {d.rule}"
        + (f"; {num(d.decode_votes)} votes of ranks decoding during a prefill step" if d.decode_votes else ""),
    ]
    if d.ungrouped:
        lines.append(
            f"  {count(d.ungrouped, 'record')} could not be grouped into steps: each is priced as a step of its own "
            "(the other ranks idle)"
        )
    if d.always_eager:
        lines.append(f"  {count(d.always_eager, 'step')} cannot replay with any allowed bucket (a rank's count fits none)")
    return lines


def _pm(iv, signed: bool = False) -> str:
    """'19,849.1 ± 12.0' (an Interval); the center alone when it has no interval."""
    if iv is None:
        return "-"
    c = f"{iv.center:+,.1f}" if signed else f"{iv.center:,.1f}"
    return c + (f" ± {iv.half:,.1f}" if iv.half is not None else "")


def _comparison(plan: BucketPlan) -> list[str]:
    timed = plan.request.calibration is not None
    headers = ["list", "graphs", "hit %", "eager", "waste %", "mean pad", "p99 pad"]
    if timed:
        headers += ["pred. ms", "vs recommended", "vs best", "vs eager"]
    body = []
    for r in plan.rows:
        m = r.metrics
        name = r.name + (f" (aligned to {plan.request.layout_align})" if r.aligned_from is not None else "")
        cells = [
            name,
            str(m.graphs),
            f"{m.hit_rate_pct:.1f}",
            num(m.eager_batches),
            f"{m.waste_pct:.2f}",
            f"{m.mean_pad:.1f}",
            num(m.p99_pad),
        ]
        if timed:
            pred = (
                _pm(r.interval) if r.interval is not None else (f"{r.predicted_ms:,.1f}" if r.predicted_ms is not None else "-")
            )
            cells += [
                pred + ("*" if r.unmeasured else ""),
                "-" if r is plan.recommended else _pm(r.vs_recommended, signed=True),
                r.vs_best if r.vs_best not in (None, "unknown") else "-",
                f"{r.speedup_vs_eager:.3f}x" if r.speedup_vs_eager else "-",
            ]
        body.append(cells)
    return table(headers, body)


def _curve(plan: BucketPlan) -> list[str]:
    timed = any(c.predicted_ms is not None for c in plan.curve)
    head = ["K", "eager", "hit %", "waste %", "padded tokens"] + (["pred. ms"] if timed else [])
    pts = plan.curve
    half = CURVE_ROWS_SHOWN // 2
    elided = len(pts) > CURVE_ROWS_SHOWN
    rows = []
    for i, c in enumerate(pts[:half] + pts[-half:] if elided else pts):
        if elided and i == half:
            rows.append(["..."] + [""] * (len(head) - 1))
        row = [str(c.k), num(c.eager_batches), f"{c.hit_rate_pct:.1f}", f"{c.waste_pct:.2f}", num(c.padded_tokens)]
        if timed:
            row.append(
                "-"
                if c.predicted_ms is None
                else f"{c.predicted_ms:,.1f}" + (f" ± {c.predicted_half_ms:,.1f}" if c.predicted_half_ms is not None else "")
            )
        rows.append(row)
    d = plan.dp_attention
    which = "best list found" if d is not None and d.proven is False else "optimal list"
    return [f"waste vs number of buckets ({which} for each K):"] + table(head, rows, right=set(range(len(head))), indent="  ")


def _summary(plan: BucketPlan) -> list[str]:
    unit = plan.unit
    n_full = len(plan.full_replay_buckets)
    line = f"smallest K that replays every {unit} that can replay at all: {n_full}"
    m = plan.recommended.metrics
    if n_full:
        line += f" ({num(plan.full_replay_batches)} of {count(m.batches, unit)})"
    if not m.graphs:
        r = plan.request
        why = (
            f"no bucket that is a multiple of {r.align}"
            + (f" and at most {r.max_bucket}" if r.max_bucket else "")
            + f" replays any traced {unit}"
            if r.objective == "padding"
            else "no graph is predicted to pay for itself"
        )
        if plan.recommended_reason:
            return [line, "recommended: no graphs; run prefill eager"] + _rule(plan) + [f"why: {plan.recommended_reason}"]
        return [line, f"recommended: no graphs ({why}); run prefill eager"]
    out = [
        line,
        f"recommended: {count(m.graphs, 'graph')}, {m.hit_rate_pct:.1f}% of {_plural(unit)} replay, {m.waste_pct:.2f}% "
        f"padding waste",
    ]
    rec = plan.recommended
    if plan.request.objective == "time" and rec.interval is not None:
        out[-1] += f", predicted {_pm(rec.interval)} ms"
    out += _rule(plan)
    if plan.recommended_reason:
        out.append(f"why: {plan.recommended_reason}")
    return out


def _rule(plan: BucketPlan) -> list[str]:
    """The time objective's recommendation rule, with its margin in % and ms."""
    return [] if plan.rule is None else [f"rule: {plan.rule.summary()}"]


def _notes(plan: BucketPlan) -> list[str]:
    r = plan.request
    notes = []
    for x in plan.restrictions:
        if any(row.name == x.row and row.kind == "explore" for row in plan.rows):
            continue  # the note on what to measure next says why it is faster
        flags = sorted({flag for reason in x.reasons for key, flag in _FLAG_HINTS if key in reason})
        which = "best-found" if plan.dp_attention is not None and plan.dp_attention.proven is False else "optimal"
        notes.append(
            f"note: {x.row} beats the {which} row on {r.objective} because it has "
            + "; ".join(x.reasons)
            + (f" ({', '.join(flags)})" if flags else "")
        )
    d = plan.dp_attention
    if d is not None and d.unit == "step" and d.proven is False:
        notes.append(
            "note: with DP attention a step replays only when every rank's count replays, which couples the sizes of\n"
            "  a step; finding the best K buckets is then NP-hard in general. This list is the best found from two\n"
            f"  exact bounding optima, not proven optimal ({d.how})."
        )
    if any(row.aligned_from is not None for row in plan.rows):
        notes.append(f"note: rows marked 'aligned to {r.layout_align}' are rounded up as SGLang captures them under this layout")
    notes += _time_notes(plan)
    if r.objective == "time" and plan.candidate_set == "trace":
        notes.append(
            "note: buckets may be any size here, priced by interpolating the calibration's rows; replay time\n"
            "  steps at tile boundaries between rows, so the list can run slower than predicted. For a measured\n"
            "  optimum: bcgtune calibrate --sizes-from TRACE --grid 64 (then buckets are picked among measured\n"
            "  sizes), or --candidates calibration with a dense calibration of your own."
        )
    if r.objective == "padding" and plan.recommended.buckets:
        notes.append(
            "note: padded tokens are a proxy for prefill time. To optimize measured time on your GPU and model:\n"
            "  bcgtune calibrate --sizes-from TRACE --grid 64 -o cal.json, then --objective time --calibration cal.json"
        )
    return notes


def _time_notes(plan: BucketPlan) -> list[str]:
    """What the predicted times rest on and what they leave out; what to measure next."""
    t = plan.time
    if t is None:
        return []
    notes = []
    if t.why_none:
        notes.append(f"note: no interval ({t.why_none}); rerun bcgtune calibrate (it keeps every timed round) for one")
    else:
        notes.append(
            f"note: ± is a {t.confidence:.0%} interval from the calibration's {t.rounds} timed rounds "
            "(a Student t interval of the\n"
            "  per-round totals; a difference is paired round by round). It covers this calibration's noise, not a shift of\n"
            "  the whole machine between processes (every list moves together; differences cancel it)."
        )
        if t.widest_pct is not None and t.widest_pct > WIDE_INTERVAL_PCT:
            notes.append(
                f"note: the calibration's rounds disagree widely (an interval of ±{t.widest_pct:.1f}%): the GPU or host was not\n"
                "  steady while it timed; no list is called better unless beyond that noise. Calibrate again on an idle machine."
            )
    notes.append(_model_note(plan))
    hb = t.host_bound
    if hb is not None and hb.share >= HOST_NOTE_SHARE:
        how = "host launch time measured at 80% or more of eager" if hb.how == "measured" else "eager at least 1.5x its replay"
        notes.append(
            f"note: eager time here depends on the host: {hb.share:.0%} of the trace's eager time is in launch-bound batches\n"
            f"  ({how}), whose time follows this host's CPU speed and load; the interval does not cover another host or load."
        )
    if t.outside is not None:
        n, of, lo, hi = t.outside
        notes.append(
            f"note: {num(n)} of {count(of, plan.unit)} lie outside the sizes the calibration timed "
            f"({num(lo)} to {num(hi)} tokens):\n"
            "  their times are extrapolated, which no interval covers; calibrate --sizes-from this trace to measure them"
        )
    for s in t.scaled_sessions:
        g, e = s.get("scale_graph"), s.get("scale_eager")
        if all(x is None or abs(x - 1.0) < 0.001 for x in (g, e)):
            continue
        notes.append(
            f"note: sizes {', '.join(map(str, s.get('sizes') or []))} were measured by a later run "
            "(calibrate --extend) and scaled"
            f" by {g if g is not None else e:.4f} to the first run's times (from the rows both runs timed)"
        )
    unmeasured = sorted({b for r in plan.rows for b in r.unmeasured})
    if unmeasured and plan.request.objective == "time":
        notes.append("note: * marks rows with buckets the calibration did not measure, priced by interpolating it")
    ref = plan.refine
    if ref is not None:
        gain = ""
        if ref.gain is not None:
            gain = f", predicted {ref.gain.center:,.1f}" + (f" ± {ref.gain.half:,.1f}" if ref.gain.half is not None else "")
            gain += " ms faster than the optimum over measured sizes"
        head = f"note: {ref.row} holds {count(len(ref.sizes), 'size')} the calibration did not measure{gain}."
        if ref.command:
            notes.append(
                head + "\n  Measure them, then run this again (repeat until the list holds only measured sizes):\n"
                f"  {ref.command}"
            )
        else:
            notes.append(f"{head}\n  {ref.why_no_command}")
    return notes


def _model_note(plan: BucketPlan) -> str:
    """What the intervals rest on beyond the calibration's noise: the model check, or that
    they do not cover the model's own error."""
    from bcgtune.core.plan.model_check import not_checked_reason

    cal = plan.request.calibration
    mc = getattr(cal, "model_check", None)
    if mc is None:
        return f"note: the intervals do not cover the time model's own error (model error not checked: {not_checked_reason(cal)})"
    return f"note: the intervals include the time model's error, {mc.summary()}:\n  {mc.margins_text()}"


WIDE_INTERVAL_PCT = 10.0
HOST_NOTE_SHARE = 0.25  # say so when at least this share of the eager time is host launch time


def _plot_time(ax, plan: BucketPlan) -> None:
    """Each list's predicted time minus the recommended list's (ms), with the 95% paired
    interval of that difference, against its number of graphs: the optimum for each K as a
    line, the comparison rows as points, the recommended list at 0. The y axis is linear
    within a few intervals of 0 and logarithmic beyond, so noise and eager both show."""
    pts = [c for c in plan.curve if c.vs_recommended_ms is not None]
    halves = [c.vs_recommended_half_ms for c in pts if c.vs_recommended_half_ms]
    ax.errorbar(
        [c.k for c in pts],
        [c.vs_recommended_ms for c in pts],
        yerr=[c.vs_recommended_half_ms or 0.0 for c in pts],
        fmt="o-",
        capsize=3,
        label="optimum for each K",
    )
    for r in plan.rows:
        d = r.vs_recommended
        if d is None or r is plan.recommended or r.kind in ("optimal", "recommended"):
            continue
        ax.errorbar([r.metrics.graphs], [d.center], yerr=[d.half or 0.0], fmt="s", capsize=3, label=r.name[:40])
    ax.errorbar([len(plan.recommended.buckets)], [0.0], fmt="*", ms=14, color="#d1495b", label="recommended")
    ax.axhline(0.0, color="#d1495b", lw=0.8, ls=":")
    ax.set_yscale("symlog", linthresh=max(4 * max(halves), 1e-3) if halves else 1.0)
    ax.set_xlabel("graphs")
    ax.set_ylabel("ms more than the recommended list (95% paired interval)")
    ax.set_title("predicted time vs graphs")
    ax.legend(fontsize=7, loc="upper right")
    ax.grid(alpha=0.3)


def plot_plan(trace, plan: BucketPlan, path: str) -> None:
    """Two panels: the forward-size histogram (log y) with the recommended buckets as
    vertical lines, and padding waste / eager share vs K. Written atomically."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    from bcgtune.fileio import atomic_write_bytes

    timed = any(c.vs_recommended_ms is not None for c in plan.curve)
    fig, axes = plt.subplots(1, 3 if timed else 2, figsize=(19 if timed else 13, 4.5))
    ax1, ax2 = axes[0], axes[1]
    sizes, counts = trace.sizes, trace.counts
    bins = np.linspace(0, float(sizes[-1]) * 1.02 + 1, 120)
    ax1.hist(sizes, bins=bins, weights=counts, color="#4878a8")
    ax1.set_yscale("log")
    for b in plan.recommended.buckets:
        ax1.axvline(b, color="#d1495b", lw=1)
    ax1.set_xlabel("forward tokens per prefill batch")
    ax1.set_ylabel("batches")
    ax1.set_title(f"prefill sizes and the {count(len(plan.recommended.buckets), 'recommended bucket')}")
    ks = [c.k for c in plan.curve]
    ax2.plot(ks, [c.waste_pct for c in plan.curve], "o-", label="padding waste %")
    ax2.plot(ks, [100.0 - c.hit_rate_pct for c in plan.curve], "s--", label="eager batches %")
    ax2.set_xlabel("max buckets K")
    ax2.set_ylabel("%")
    ax2.set_title("waste vs K (optimal list per K)")
    ax2.legend()
    ax2.grid(alpha=0.3)
    if timed:
        _plot_time(axes[2], plan)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    atomic_write_bytes(path, buf.getvalue())
