"""Summary of a PrefillTrace: a pure function to a dict (`--json`) and one to text.

Nothing here prints or reads flags. The capture analysis applies SGLang's replay rule
(core/replay.assign_buckets) to the traced sizes with the buckets the server logged."""

from __future__ import annotations

from typing import Any

import numpy as np

from bcgtune.core.replay import assign_buckets
from bcgtune.core.trace import PrefillTrace

MAX_SAMPLES_SHOWN = 3


def captured_prefill_buckets(trace: PrefillTrace) -> dict | None:
    """The prefill bucket list the server logged at capture (target phase; the last
    complete list wins), with how many capture lines listed it and whether lists
    differ across ranks/restarts. None when no complete list was logged."""
    lists = [
        c
        for c in trace.captures
        if c.get("kind") == "prefill" and c.get("phase") == "target" and c.get("buckets") and not c.get("elided")
    ]
    if not lists:
        return None
    last = lists[-1]
    distinct = {tuple(c["buckets"]) for c in lists}
    return {
        "buckets": sorted(int(b) for b in last["buckets"]),
        "backend": last.get("backend"),
        "source": last.get("source"),
        "line": last.get("line"),
        "capture_lines": len(lists),
        "distinct_lists": len(distinct),
    }


def _bucket_usage(trace: PrefillTrace, buckets: list[int]) -> dict:
    b = trace.batches or {}
    fwd = b.get("forward_tokens")
    if fwd is None:  # histogram-only trace: expand counts per size
        sizes, weights, graph = trace.sizes, trace.counts, None
    else:
        sizes, weights = fwd, np.ones(len(fwd), dtype=np.int64)
        graph = b.get("graph")
    chosen, replay = assign_buckets(sizes, buckets)
    rows = []
    for bucket in buckets:
        sel = replay & (chosen == bucket)
        row: dict[str, Any] = {"bucket": int(bucket), "served": int(weights[sel].sum())}
        if graph is not None:
            g = graph[sel]
            row["replayed"] = int((g == 1).sum())
            row["ran_eager"] = int((g == 0).sum())
            row["unknown"] = int((g < 0).sum())
        rows.append(row)
    out: dict[str, Any] = {
        "per_bucket": rows,
        "servable_batches": int(weights[replay].sum()),
        "not_servable_batches": int(weights[~replay].sum()),
        "unused_buckets": [r["bucket"] for r in rows if r["served"] == 0],
    }
    if graph is not None:
        out["not_servable_but_replayed"] = int(((graph == 1) & ~replay).sum())
    return out


def trace_summary(trace: PrefillTrace) -> dict[str, Any]:
    """Everything `bcgtune trace` reports, as one JSON-ready dict."""
    ps = trace.parse_stats or {}
    meta = trace.meta or {}
    out: dict[str, Any] = {
        "batches": trace.n_batches,
        "distinct_sizes": int(trace.sizes.size),
        "tokens": trace.n_tokens,
        "percentiles": {
            "p50": trace.percentile(50),
            "p90": trace.percentile(90),
            "p99": trace.percentile(99),
            "max": int(trace.sizes[-1]),
        }
        if trace.n_batches
        else None,
        "forward_tokens_rule": meta.get("forward_tokens_rule"),
        "sources": [{k: s.get(k) for k in ("path", "sha256", "bytes")} for s in trace.sources],
        "lines": ps.get("lines"),
        "decode_lines": ps.get("decode_lines"),
        "legacy_decode_lines": ps.get("legacy_decode_lines"),
    }
    b = trace.batches or {}
    graph = b.get("graph")
    if graph is not None and (graph >= 0).any():
        flagged = int((graph >= 0).sum())
        replayed = int((graph == 1).sum())
        out["graph"] = {
            "flagged_batches": flagged,
            "replayed": replayed,
            "eager": flagged - replayed,
            "replayed_pct": round(100.0 * replayed / flagged, 2),
            "labels": meta.get("graph_labels") or {},
        }
    else:
        out["graph"] = None
    ranks = meta.get("ranks") or []
    rank_col = b.get("rank")
    if ranks and rank_col is not None:
        counts = np.bincount(rank_col[rank_col >= 0], minlength=len(ranks))
        out["ranks"] = {r: int(c) for r, c in zip(ranks, counts.tolist())}
        untagged = int((rank_col < 0).sum())
        if untagged:
            out["ranks"]["(none)"] = untagged
    else:
        out["ranks"] = {}
    cap = captured_prefill_buckets(trace)
    if cap is not None:
        cap.update(_bucket_usage(trace, cap["buckets"]))
    out["captured"] = cap
    out["capture_lines"] = len(trace.captures)
    out["graph_disabled"] = [d.get("text") for d in (meta.get("graph_disabled") or [])][:MAX_SAMPLES_SHOWN]
    out["malformed"] = {
        "count": int(ps.get("malformed_prefill_lines", 0)),
        "samples": [
            {"where": f"{s.get('path', s.get('source'))}:{s.get('line')}", "text": s.get("text")}
            for s in (ps.get("malformed_samples") or [])[:MAX_SAMPLES_SHOWN]
        ],
    }
    notes = []
    overlap = meta.get("rank_overlap") or {}
    if overlap.get("printers", 1) > 1:
        notes.append(
            f"{overlap['printers']} ranks/files print prefill lines; every line is kept as its own "
            "forward (under DP attention each DP rank runs its own batch)"
        )
        if overlap.get("records_matching_another_printer"):
            notes.append(
                f"{overlap['records_matching_another_printer']} records match a record of another "
                "rank/file (same second and sizes): if those are copies of one batch rather than "
                "distinct DP batches, trace one rank only"
            )
    if ps.get("zero_token_records"):
        notes.append(f"{ps['zero_token_records']} records with 0 forward tokens left out")
    if ps.get("wrapped_prefill_records"):
        notes.append(f"{ps['wrapped_prefill_records']} records were wrapped over several lines")
    if ps.get("legacy_prefill_records"):
        notes.append(f"{ps['legacy_prefill_records']} records in the pre-2024 'new fill batch' form")
    out["notes"] = notes
    return out


def _fmt_int(n: int | None) -> str:
    return "-" if n is None else f"{n:,}"


def render_trace_text(trace: PrefillTrace) -> str:
    """Human summary (what `bcgtune trace` prints on stdout)."""
    s = trace_summary(trace)
    lines = []
    n_src = len(s["sources"])
    lines.append(f"sources          {n_src} file{'s' if n_src != 1 else ''}, {_fmt_int(s['lines'])} lines")
    lines.append(
        f"prefill batches  {_fmt_int(s['batches'])}   (decode lines {_fmt_int(s['decode_lines'])}"
        + (f", legacy decode lines {_fmt_int(s['legacy_decode_lines'])}" if s.get("legacy_decode_lines") else "")
        + ")"
    )
    lines.append(f"distinct sizes   {_fmt_int(s['distinct_sizes'])}")
    lines.append(f"forward tokens   {_fmt_int(s['tokens'])}   ({s['forward_tokens_rule'] or 'as logged'})")
    if s["percentiles"]:
        p = s["percentiles"]
        lines.append(f"size p50/p90/p99/max  {p['p50']} / {p['p90']} / {p['p99']} / {p['max']}")
    if s["graph"]:
        g = s["graph"]
        label = "/".join(sorted(g["labels"])) or "cuda"
        lines.append(
            f"graph flag       {g['replayed_pct']:.1f}% replayed ({_fmt_int(g['replayed'])} of "
            f"{_fmt_int(g['flagged_batches'])} flagged batches; {label} graph)"
        )
    else:
        lines.append("graph flag       not logged (older SGLang: replay unknown per batch)")
    if s["ranks"]:
        shown = ", ".join(f"{r} ({c})" for r, c in list(s["ranks"].items())[:8])
        more = len(s["ranks"]) - 8
        lines.append(f"ranks            {shown}" + (f", +{more} more" if more > 0 else ""))
    cap = s["captured"]
    if cap:
        bl = cap["buckets"]
        lines.append(
            f"captured buckets {len(bl)} (target prefill, backend {cap['backend'] or '?'}; "
            f"{cap['capture_lines']} capture line{'s' if cap['capture_lines'] != 1 else ''}"
            + (f", {cap['distinct_lists']} different lists: last one used" if cap["distinct_lists"] > 1 else "")
            + ")"
        )
        lines.append("  " + " ".join(str(b) for b in bl))
        has_graph = "replayed" in cap["per_bucket"][0]
        head = "  bucket    served" + ("  replayed  ran eager" if has_graph else "")
        lines.append(head)
        for row in cap["per_bucket"]:
            if row["served"] == 0:
                continue
            line = f"  {row['bucket']:>6}  {row['served']:>8}"
            if has_graph:
                line += f"  {row['replayed']:>8}  {row['ran_eager']:>9}"
            lines.append(line)
        lines.append(
            f"  batches the rule serves: {_fmt_int(cap['servable_batches'])}; "
            f"eager by the rule (no bucket within 2x): {_fmt_int(cap['not_servable_batches'])}; "
            f"unused buckets: {len(cap['unused_buckets'])}"
        )
    elif s["capture_lines"]:
        lines.append(f"capture lines    {s['capture_lines']} (no complete prefill bucket list among them)")
    for text in s["graph_disabled"]:
        lines.append(f"graph disabled   {text}")
    m = s["malformed"]
    lines.append(f"malformed prefill lines  {m['count']}")
    for sample in m["samples"]:
        lines.append(f"  {sample['where']}: {sample['text']}")
    for note in s["notes"]:
        lines.append(f"note: {note}")
    return "\n".join(lines) + "\n"
