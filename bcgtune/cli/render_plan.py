"""Rendering of a BucketPlan: a pure function to text, and a PNG plot."""

from __future__ import annotations

import io


def _fmt_int(n) -> str:
    return f"{int(n):,}"


def _table(headers: list[str], rows: list[list[str]], align_right: set[int]) -> list[str]:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]

    def fmt(cells):
        return "  ".join(c.rjust(w) if i in align_right else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths))).rstrip()

    return [fmt(headers), fmt(["-" * w for w in widths])] + [fmt(r) for r in rows]


def render_plan_text(plan) -> str:
    t = plan.trace_info
    p = plan.params
    src = ", ".join(s.get("path", "?") for s in t["sources"])
    if not src and t.get("workload"):
        src = f"workload {t['workload']!r}"
    lines = [
        f"trace: {src or '-'} ({t['origin']})",
        f"  {_fmt_int(t['batches'])} prefill batches, {_fmt_int(t['distinct_sizes'])} distinct sizes, "
        f"{_fmt_int(t['tokens'])} tokens; p50 {_fmt_int(t['p50'])}, p99 {_fmt_int(t['p99'])}, max {_fmt_int(t['max'])}",
        f"objective: {p['objective']}"
        + (" (fewest eager batches, then fewest padded tokens)" if p["objective"] == "padding" else
           " (predicted prefill time" + ("; buckets only at measured sizes" if p.get("candidate_set") == "calibration" else "") + ")")
        + f"; at most {p['max_buckets']} buckets, multiples of {p['align']}"
        + (f", none above {p['max_bucket']}" if p["max_bucket"] else "")
        + f"; replay iff bucket <= {p['padding_factor']:g} x tokens"
        + (f"; graph memory <= {p['max_graph_mem_gib']:g} GiB" if p.get("max_graph_mem_gib") is not None else ""),
        "",
    ]
    timed = any("predicted_ms" in r for r in plan.rows)
    headers = ["list", "graphs", "hit %", "eager", "waste %", "mean pad", "p99 pad"]
    if timed:
        headers += ["pred. ms", "vs eager"]
    body = []
    for r in plan.rows:
        cells = [
            r["name"],
            str(r["graphs"]),
            f"{r['hit_rate_pct']:.1f}",
            _fmt_int(r["eager_batches"]),
            f"{r['waste_pct']:.2f}",
            f"{r['mean_pad']:.1f}",
            _fmt_int(r["p99_pad"]),
        ]
        if timed:
            cells += [f"{r['predicted_ms']:,.1f}", f"{r['speedup_vs_eager']:.3f}x" if r.get("speedup_vs_eager") else "-"]
        body.append(cells)
    lines += _table(headers, body, align_right=set(range(1, len(headers))))
    lines.append("")
    lines.append("waste vs number of buckets (optimal list for each K):")
    curve_rows = []
    for c in plan.curve:
        row = [str(c["k"]), _fmt_int(c["eager_batches"]), f"{c['hit_rate_pct']:.1f}", f"{c['waste_pct']:.2f}", _fmt_int(c["padded_tokens"])]
        if "predicted_ms" in c:
            row.append(f"{c['predicted_ms']:,.1f}")
        curve_rows.append(row)
    ch = ["K", "eager", "hit %", "waste %", "padded tokens"] + (["pred. ms"] if plan.curve and "predicted_ms" in plan.curve[0] else [])
    lines += ["  " + s for s in _table(ch, curve_rows, align_right=set(range(len(ch))))]
    fr = plan.full_replay
    lines.append("")
    lines.append(
        f"smallest K that replays every batch that can replay at all: {fr['buckets']}"
        + (f" ({_fmt_int(fr['replayable_batches'])} of {_fmt_int(t['batches'])} batches)" if fr["buckets"] else "")
    )
    rec = plan.recommended
    lines.append(
        f"recommended: {rec['graphs']} graphs, {rec['hit_rate_pct']:.1f}% of batches replay, "
        f"{rec['waste_pct']:.2f}% padding waste"
    )
    if p["objective"] == "time" and p.get("candidate_set") == "trace":
        lines.append(
            "note: buckets may be any size here, priced by interpolating the calibration's rows; replay time\n"
            "  steps at tile boundaries between rows, so the list can run slower than predicted. For a measured\n"
            "  optimum: bcgtune calibrate --sizes-from TRACE --grid 64 (then buckets are picked among measured\n"
            "  sizes), or --candidates calibration with a dense calibration of your own."
        )
    if p["objective"] == "padding" and p["align"] == 1 and any(b % 128 for b in rec["buckets"]):
        lines.append(
            "note: padded tokens are a proxy for time. GPUs replay tile-aligned sizes faster than the sizes\n"
            "  just below them: on an H200, the padding-optimal K=12 list for the default workload (8192-token\n"
            "  chunks) ran 1.4% faster with --align 128 (benchmarks/RESULTS.md). To optimize measured time:\n"
            "  bcgtune calibrate --sizes-from TRACE --grid 64 -o cal.json on the GPU, then\n"
            "  --objective time --calibration cal.json."
        )
    lines.append("")
    lines.append(rec["flag"])
    return "\n".join(lines)


def plot_plan(trace, plan, path: str) -> None:
    """Two panels: the forward-size histogram (log y) with the recommended buckets as
    vertical lines, and padding waste / eager share vs K. Written atomically."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        from bcgtune.errors import InputError

        raise InputError("--plot needs matplotlib: pip install 'bcgtune[plot]'") from None
    import numpy as np

    from bcgtune.fileio import atomic_write_bytes

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 4.5))
    sizes, counts = trace.sizes, trace.counts
    bins = np.linspace(0, float(sizes[-1]) * 1.02 + 1, 120)
    ax1.hist(sizes, bins=bins, weights=counts, color="#4878a8")
    ax1.set_yscale("log")
    for b in plan.recommended["buckets"]:
        ax1.axvline(b, color="#d1495b", lw=1)
    ax1.set_xlabel("forward tokens per prefill batch")
    ax1.set_ylabel("batches")
    ax1.set_title(f"prefill sizes and the {len(plan.recommended['buckets'])} recommended buckets")
    ks = [c["k"] for c in plan.curve]
    ax2.plot(ks, [c["waste_pct"] for c in plan.curve], "o-", label="padding waste %")
    ax2.plot(ks, [100.0 - c["hit_rate_pct"] for c in plan.curve], "s--", label="eager batches %")
    ax2.set_xlabel("max buckets K")
    ax2.set_ylabel("%")
    ax2.set_title("waste vs K (optimal list per K)")
    ax2.legend()
    ax2.grid(alpha=0.3)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    atomic_write_bytes(path, buf.getvalue())
