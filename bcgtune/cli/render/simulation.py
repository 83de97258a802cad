"""Rendering of `trace --simulate`: the trace's sizes, image and replay shares, and the
per-concurrency-level breakdown (bcgtune.core.sim.summary.SimulationSummary)."""

from __future__ import annotations

from bcgtune.cli.render.table import num, table
from bcgtune.core.sim.summary import SimulationSummary
from bcgtune.core.trace.prefill_trace import PrefillTrace


def render_simulation_text(trace: PrefillTrace, s: SimulationSummary) -> str:
    p = [trace.percentile(q) for q in (50, 90, 99)]
    lines = [
        f"simulated workload  {s.workload or 'from options (bench_serving and SGLang defaults otherwise)'}",
        f"prefill batches     {num(trace.n_batches)}",
        f"distinct sizes      {num(trace.sizes.size)}",
        f"forward tokens      {num(trace.n_tokens)}",
        f"size p50/p90/p99/max  {p[0]} / {p[1]} / {p[2]} / {int(trace.sizes[-1])}",
    ]
    for r in s.replay:
        lines.append(
            f"  {r.list}, {r.buckets} buckets: image batches {100 * r.image_share:.1f}%; "
            f"replay {100 * r.patched_replay_share:.1f}% patched runner vs "
            f"{100 * r.unpatched_replay_share:.1f}% unpatched (image batches eager)"
        )
    d = s.dp_steps
    if d is not None:
        lines.append(
            f"DP attention        {d.ranks} ranks run every iteration together: {num(d.steps)} prefill steps"
            + (f", {num(d.decode_votes)} votes of ranks decoding during them" if d.decode_votes else "")
        )
        for name, share in d.replay_shares.items():
            lines.append(f"  {name}: {100 * share:.1f}% of steps replay (every rank's count must replay; patched runner)")
    head = ["concurrency", "prompts", "batches", "image", "mean fwd", "max fwd", "decode steps", "sim s"]
    rows = []
    for lv in s.levels:
        rows.append(
            [
                "inf" if lv.max_concurrency is None else str(lv.max_concurrency),
                str(lv.num_prompts),
                str(lv.batches),
                str(lv.image_batches if lv.image_batches is not None else "-"),
                "-" if lv.mean_forward_tokens is None else str(lv.mean_forward_tokens),
                "-" if lv.max_forward_tokens is None else str(lv.max_forward_tokens),
                str(lv.decode_steps),
                f"{lv.duration_s:.1f}",
            ]
        )
    lines += table(head, rows, right=set(range(len(head))), indent="  ")
    return "\n".join(lines) + "\n"
