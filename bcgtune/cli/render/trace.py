"""Rendering of a TraceSummary (bcgtune.core.trace.summary): what `bcgtune trace --log` prints."""

from __future__ import annotations

import os

from bcgtune.cli.render.table import count, num
from bcgtune.core.trace.summary import TraceSummary


def render_trace_text(s: TraceSummary) -> str:
    lines = [
        f"sources          {count(len(s.sources), 'file')}, {count(s.lines or 0, 'line')}",
        f"prefill batches  {num(s.batches)}   (decode lines {num(s.decode_lines)}"
        + (f", legacy decode lines {num(s.legacy_decode_lines)}" if s.legacy_decode_lines else "")
        + ")",
        f"distinct sizes   {num(s.distinct_sizes)}",
        f"forward tokens   {num(s.tokens)}   ({s.forward_tokens_rule or 'as logged'})",
    ]
    if s.percentiles:
        p = s.percentiles
        lines.append(f"size p50/p90/p99/max  {p.p50} / {p.p90} / {p.p99} / {p.max}")
    if s.graph:
        g = s.graph
        label = "/".join(sorted(g.labels)) or "cuda"
        lines.append(
            f"graph flag       {g.replayed_pct:.1f}% replayed ({num(g.replayed)} of "
            f"{count(g.flagged_batches, 'flagged batch')}; {label} graph)"
        )
    else:
        lines.append("graph flag       not logged (older SGLang: replay unknown per batch)")
    if s.ranks:
        shown = ", ".join(f"{r} ({c})" for r, c in list(s.ranks.items())[:8])
        more = len(s.ranks) - 8
        lines.append(f"ranks            {shown}" + (f", +{more} more" if more > 0 else ""))
    if s.launch:
        lines.append(f"launch settings  {s.launch} (as the log states them)")
    lines += _groups(s)
    lines += _captured(s)
    for text in s.graph_disabled:
        lines.append(f"graph disabled   {text}")
    lines.append(f"malformed prefill lines  {s.malformed.count}")
    for sample in s.malformed.samples:
        lines.append(f"  {sample['where']}: {sample['text']}")
    for title, what in (
        (
            "head-cut prefill lines",
            s.head_cut,
        ),
        ("glued lines", s.glued),
    ):
        if what is not None:
            lines.append(f"{title}  {what.count}")
            lines += [f"  {x['where']}: {x['text']}" for x in what.samples]
    if s.head_cut is not None:
        lines.append("note: a head-cut line lost its `Prefill batch` head (a cut or interleaved write): not counted as a batch")
    if s.glued is not None:
        lines.append("note: a glued line holds several log lines (concurrent writers): each prefill record on it is read")
    if s.histogram_only:
        lines.append("note: histogram-only trace: counts per size and request mixes per configuration, no per-batch columns")
    for n in s.notes:
        lines.append(f"note: {n}")
    for w in s.warnings:
        lines.append(f"warning: {w}")
    for h in s.hints:
        lines.append(f"hint: {h}")
    return "\n".join(lines) + "\n"


def _groups(s: TraceSummary) -> list[str]:
    if not s.groups:
        return []
    lines = [f"configurations   {len(s.groups)} (each priced apart: suggest-buckets TRACE --group N)"]
    for g in s.groups:
        cap = f"; captured {g.captured_buckets} buckets" if g.captured_buckets else ""
        shown = ", ".join(os.path.basename(f) or f for f in g.files[:3]) + (
            f" +{len(g.files) - 3} more" if len(g.files) > 3 else ""
        )
        lines.append(
            f"  group {g.group}: {g.label}; {count(g.batches, 'batch')}, {count(g.sources, 'file')}"
            + (f" ({shown})" if shown else "")
            + f"; p50 {g.p50}, max {g.max}{cap}"
        )
    return lines


def _captured(s: TraceSummary) -> list[str]:
    cap = s.captured
    if cap is None:
        if s.capture_lines:
            return [f"capture lines    {s.capture_lines} (no complete prefill bucket list among them)"]
        return []
    lines = [
        f"captured buckets {len(cap.buckets)} (target prefill, backend {cap.backend or '?'}; "
        f"{count(cap.capture_lines, 'capture line')}"
        + (f", {cap.distinct_lists} different lists: the last one is shown" if cap.distinct_lists > 1 else "")
        + ")",
        "  " + " ".join(str(b) for b in cap.buckets),
    ]
    has_graph = bool(cap.per_bucket) and cap.per_bucket[0].replayed is not None
    lines.append("  bucket    served" + ("  replayed  ran eager" if has_graph else ""))
    for row in cap.per_bucket:
        if row.served == 0:
            continue
        line = f"  {row.bucket:>6}  {row.served:>8}"
        if has_graph:
            line += f"  {row.replayed:>8}  {row.ran_eager:>9}"
        lines.append(line)
    lines.append(
        f"  batches the rule serves: {num(cap.servable_batches)}; "
        f"eager by the rule (no bucket within 2x): {num(cap.not_servable_batches)}; "
        f"unused buckets: {len(cap.unused_buckets)}"
    )
    return lines
