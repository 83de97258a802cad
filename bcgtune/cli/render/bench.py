"""Rendering of `bcgtune bench` results (bcgtune.core.bench.bench_result): the interleaved A/B
table and its plot."""

from __future__ import annotations

from bcgtune.core.bench.abstats import RowStat
from bcgtune.core.bench.bench_result import BenchResult


def _fmt_change(row: RowStat) -> str:
    mark = {"significant": "*", "within noise": "", "no noise estimate": "?"}[row.verdict]
    return f"{row.change_pct:+.1f}%{mark}"


_NOISE_SOURCE = {
    "aa-launches": "from {n} A/A launches of {base}",
    "runs": "from runs inside launches only (one base launch: a floor, launch-to-launch noise missing)",
    "none": "no A/A data",
}


def _rows(result: BenchResult, arm: str, metric: str) -> dict[int, RowStat]:
    comp = result.comparisons.get(arm, {}).get(metric)
    return {r.concurrency: r for r in comp.rows} if comp else {}


def render_table(result: BenchResult) -> str:
    """The A/B table: Concurrency | Output tok/s base | arm | Change | ... | TTFT | TPOT."""
    base = result.base_arm
    arms = [a.name for a in result.arms[1:]]
    thr = {a: _rows(result, a, "output_throughput") for a in arms}
    ttft = {a: _rows(result, a, "mean_ttft_ms") for a in arms}
    tpot = {a: _rows(result, a, "mean_tpot_ms") for a in arms}
    head = ["Concurrency", f"Output tok/s {base}"]
    for a in arms:
        head += [a, "Change"]
    head += [f"TTFT ({' / '.join(arms)})", f"TPOT ({' / '.join(arms)})"]
    rows = [head]
    for c in result.concurrency:
        any_arm = next((thr[a][c] for a in arms if c in thr[a]), None)
        if any_arm is None:
            continue
        row = [str(c), f"{any_arm.base:.1f}"]
        for a in arms:
            r = thr[a].get(c)
            row += [f"{r.arm:.1f}", _fmt_change(r)] if r else ["-", "-"]
        row.append(" / ".join(_fmt_change(ttft[a][c]) if c in ttft[a] else "-" for a in arms))
        row.append(" / ".join(_fmt_change(tpot[a][c]) if c in tpot[a] else "-" for a in arms))
        rows.append(row)
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = ["  ".join(cell.rjust(w) if j else cell.ljust(w) for j, (cell, w) in enumerate(zip(r, widths))) for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    out = "\n".join(lines) + "\n\n"
    for a in arms:
        m = result.comparisons.get(a, {}).get("output_throughput")
        if not m:
            continue
        se_txt = f"SE {m.se_pp:.2f} pp" if m.se_pp is not None else "SE unknown"
        src = _NOISE_SOURCE[m.noise_source].format(n=m.n_base_launches, base=base)
        mean = m.mean_change_pct
        mean_txt = "n/a" if mean is None else f"{mean:+.1f}%"
        out += (
            f"{a}: mean output throughput change {mean_txt} ({m.mean_verdict}), {se_txt} {src}; "
            f"{m.n_arm_launches} launches vs {m.n_base_launches}\n"
        )
    out += "* beyond 2 SE (significant); no mark: within noise; ? no noise estimate. TTFT/TPOT: lower is better.\n"
    if not result.complete:
        out += "(incomplete: interrupted or failed; partial results)\n"
    return out


def plot(result: BenchResult, path: str) -> None:
    """Change in output throughput vs the baseline per concurrency and arm, error bars 2 SE."""
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from bcgtune.fileio import atomic_write_bytes

    arms = [a.name for a in result.arms[1:]]
    concs = result.concurrency
    fig, ax = plt.subplots(figsize=(max(5.0, 1.4 * len(concs) + 2), 3.6))
    width = 0.8 / max(1, len(arms))
    for k, a in enumerate(arms):
        byc = _rows(result, a, "output_throughput")
        if not byc:
            continue
        xs = [i + (k - (len(arms) - 1) / 2) * width for i, c in enumerate(concs) if c in byc]
        ys = [byc[c].change_pct for c in concs if c in byc]
        err = [2 * (byc[c].se_pp or 0.0) for c in concs if c in byc]
        ax.bar(xs, ys, width, yerr=err, capsize=3, label=a)
    ax.axhline(0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(concs)), [str(c) for c in concs])
    ax.set_xlabel("concurrency")
    ax.set_ylabel(f"output tok/s change vs {result.base_arm} (%)")
    ax.set_title(f"bcgtune bench: {result.profile} (error bars: 2 SE from A/A)", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=120)
    plt.close(fig)
    atomic_write_bytes(path, buf.getvalue())
