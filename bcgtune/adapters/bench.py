"""`bcgtune bench`: the seeds' A/B method, automated.

Arms are profile variants (live.parse_variant: NAME:profile | NAME:disabled | NAME:default |
NAME:list=...). Launches follow an interleaved order (default A,X,X,A for two arms and
A,X,Y,Y,X,A for three: letters A, X, Y, Z, W name the arms in the order given, arm names
work too); the first arm is the baseline. Each launch runs a warm-up pass (one client run at
the first concurrency, discarded), then `runs` measured client runs per concurrency with
prompts = prompts_per_concurrency x concurrency, `--request-rate inf --max-concurrency C`
(closed loop). The statistics (change vs the baseline, SE from A/A launches) are in
bcgtune/core/abstats.py.

Everything a run produced lands in the work folder: one server log per launch, the client's
output, its result lines, and bench.json (rewritten atomically after every run, so an
interrupted bench keeps what it measured).
"""

from __future__ import annotations

import datetime as _dt
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from bcgtune.adapters.live import (
    Variant,
    apply_variant,
    build_launch,
    client_command,
    note,
    parse_variant,
    read_result_line,
    run_client,
    running_server,
    terminate_as_interrupt,
)
from bcgtune.errors import InputError

FORMAT_VERSION = 1
KIND = "bcgtune.bench"
LETTERS = "AXYZW"
METRICS = {  # result-line key -> (label, higher is better)
    "output_throughput": ("output tok/s", True),
    "mean_ttft_ms": ("TTFT ms", False),
    "mean_tpot_ms": ("TPOT ms", False),
}
_CONTROLLED = {"--max-concurrency", "--num-prompts", "--request-rate", "--output-file"}
DEFAULT_CONCURRENCY = (4, 16, 32, 64, 128)


@dataclass
class BenchPlan:
    profile: str
    arms: list[Variant]
    order: list[str]  # arm names, one per launch
    concurrency: list[int]
    runs: int = 2
    prompts_per_concurrency: int = 10
    warmup: bool = True
    bench_args: list[str] = field(default_factory=list)


def default_order(n_arms: int) -> str:
    if n_arms == 1:
        return "A,A"
    if n_arms == 2:
        return "A,X,X,A"
    mid = LETTERS[1:n_arms]
    return ",".join(["A", *mid, *reversed(mid), "A"])


def parse_order(text: str, arms: Sequence[Variant]) -> list[str]:
    names = [a.name for a in arms]
    out = []
    for tok in (t.strip() for t in text.split(",")):
        if not tok:
            raise InputError(f"empty entry in order {text!r}", "--order")
        if tok in names:
            out.append(tok)
        elif len(tok) == 1 and tok in LETTERS and LETTERS.index(tok) < len(arms):
            out.append(names[LETTERS.index(tok)])
        else:
            letters = ", ".join(f"{LETTERS[i]}={n}" for i, n in enumerate(names[: len(LETTERS)]))
            raise InputError(f"order entry {tok!r} names no arm ({letters})", "--order")
    missing = [n for n in names if n not in out]
    if missing:
        raise InputError(f"arm {missing[0]!r} is never launched in order {text!r}", "--order")
    return out


def parse_int_list(text: str, where: str) -> list[int]:
    vals = []
    for tok in text.replace(" ", "").split(","):
        try:
            v = int(tok)
        except ValueError:
            raise InputError(f"{tok!r} is not an integer", where) from None
        if v <= 0:
            raise InputError(f"{v} is not positive", where)
        vals.append(v)
    if not vals:
        raise InputError("empty list", where)
    return vals


def make_plan(
    profile: str,
    arms: Sequence[str],
    order: str | None,
    concurrency: str | None,
    runs: int,
    prompts_per_concurrency: int,
    bench_args: Sequence[str],
    warmup: bool = True,
) -> BenchPlan:
    if len(arms) < 2:
        raise InputError("give at least two --arm (the first is the baseline)", "--arm")
    variants = [parse_variant(a) for a in arms]
    names = [v.name for v in variants]
    if len(set(names)) != len(names):
        raise InputError("arm names must differ", "--arm")
    if runs < 1:
        raise InputError("runs must be >= 1", "--runs")
    if prompts_per_concurrency < 1:
        raise InputError("prompts per concurrency must be >= 1", "--prompts-per-concurrency")
    for a in bench_args:
        if a.split("=", 1)[0] in _CONTROLLED:
            raise InputError(f"{a.split('=', 1)[0]} is set by bench per run; leave it out of the bench_serving args", "bench args")
    seq = parse_order(order or default_order(len(variants)), variants)
    concs = parse_int_list(concurrency, "--concurrency") if concurrency else list(DEFAULT_CONCURRENCY)
    return BenchPlan(profile, variants, seq, concs, runs, prompts_per_concurrency, warmup, list(bench_args))


def _run_args(plan: BenchPlan, c: int) -> list[str]:
    return [*plan.bench_args, "--max-concurrency", str(c), "--num-prompts", str(plan.prompts_per_concurrency * c), "--request-rate", "inf"]


def run_bench(plan: BenchPlan, workdir: str | os.PathLike | None = None, health_timeout: float = 1800.0) -> dict:
    """Run every launch of the plan; return the result object (also written to
    <workdir>/bench.json)."""
    from bcgtune.adapters.profiles import load_profile, resolve_profile_path
    from bcgtune.fileio import atomic_write_json, sha256_file

    profile = load_profile(plan.profile)
    ppath = resolve_profile_path(plan.profile)
    folder = Path(workdir) if workdir else Path.cwd() / f"bcgtune-bench-{profile.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    folder.mkdir(parents=True, exist_ok=True)
    variants = {v.name: v for v in plan.arms}
    result: dict[str, Any] = {
        "format_version": FORMAT_VERSION,
        "kind": KIND,
        "tool": "bcgtune",
        "tool_version": _version(),
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "complete": False,
        "profile": profile.name,
        "profile_path": str(ppath),
        "profile_sha256": sha256_file(str(ppath)),
        "arms": [{"name": v.name, "variant": v.kind, "buckets": v.buckets} for v in plan.arms],
        "base_arm": plan.arms[0].name,
        "order": plan.order,
        "concurrency": plan.concurrency,
        "runs": plan.runs,
        "prompts_per_concurrency": plan.prompts_per_concurrency,
        "warmup": plan.warmup,
        "bench_args": plan.bench_args,
        "workdir": str(folder),
        "launches": [],
        "comparisons": {},
    }
    out_json = folder / "bench.json"
    total = len(plan.order)
    with terminate_as_interrupt():
        for i, arm in enumerate(plan.order):
            tag = f"{i + 1:02d}-{arm}"
            launch = build_launch(apply_variant(profile, variants[arm]), folder / f"{tag}.server.log")
            entry = {"index": i, "arm": arm, "launch_command": launch.argv, "launch_env": launch.env,
                     "server_log": str(launch.log_path), "runs": []}
            result["launches"].append(entry)
            with running_server(launch, label=f"launch {i + 1}/{total} ({arm})", timeout=health_timeout) as server:
                steps = [(plan.concurrency[0], -1)] if plan.warmup else []
                steps += [(c, r) for c in plan.concurrency for r in range(plan.runs)]
                for c, r in steps:
                    what = "warm-up" if r < 0 else f"run {r + 1}/{plan.runs}"
                    note(f"launch {i + 1}/{total} ({arm}): concurrency {c}, {what}")
                    name = f"{tag}.c{c}.{'warmup' if r < 0 else f'r{r + 1}'}"
                    res_file = folder / f"{name}.jsonl"
                    argv = client_command(_run_args(plan, c), launch.base_url, res_file)
                    run_client(argv, server=server, launch=launch, log_path=folder / f"{name}.client.log", echo=False)
                    if r < 0:
                        continue
                    line = read_result_line(res_file, folder / f"{name}.client.log")
                    row = {"concurrency": c, "run": r + 1}
                    for key in (*METRICS, "median_ttft_ms", "median_tpot_ms", "completed", "duration",
                                "total_input_tokens", "total_output_tokens", "request_throughput"):
                        row[key] = line.get(key)
                    if not line.get("completed"):
                        from bcgtune.errors import ExternalError

                        raise ExternalError(f"benchmark run completed no request (concurrency {c})", str(res_file))
                    entry["runs"].append(row)
                    result["comparisons"] = compare(result)
                    atomic_write_json(out_json, result)
    result["complete"] = True
    result["comparisons"] = compare(result)
    atomic_write_json(out_json, result)
    return result


def _version() -> str:
    from bcgtune import __version__

    return __version__


def arm_launch_values(result: dict, arm: str, metric: str) -> list[dict[int, list[float]]]:
    out = []
    for entry in result["launches"]:
        if entry["arm"] != arm:
            continue
        d: dict[int, list[float]] = {}
        for row in entry["runs"]:
            v = row.get(metric)
            if isinstance(v, (int, float)):
                d.setdefault(int(row["concurrency"]), []).append(float(v))
        if d:
            out.append(d)
    return out


def compare(result: dict) -> dict:
    from bcgtune.core.abstats import compare_arm

    base = result["base_arm"]
    out: dict[str, dict] = {}
    for arm in (a["name"] for a in result["arms"][1:]):
        out[arm] = {}
        for metric in METRICS:
            a = arm_launch_values(result, arm, metric)
            b = arm_launch_values(result, base, metric)
            if a and b:
                out[arm][metric] = compare_arm(metric, arm, a, base, b).to_dict()
    return out


# --------------------------------------------------------------------------- rendering
def _fmt_change(row: dict) -> str:
    ch = row["change_pct"]
    mark = {"significant": "*", "within noise": "", "no noise estimate": "?"}.get(row["verdict"], "")
    return f"{ch:+.1f}%{mark}"


def render_table(result: dict) -> str:
    """The seeds' table: Concurrency | Output tok/s base | arm | Change | ... | TTFT | TPOT."""
    base = result["base_arm"]
    arms = [a["name"] for a in result["arms"][1:]]
    comps = result["comparisons"]
    thr = {a: {r["concurrency"]: r for r in comps.get(a, {}).get("output_throughput", {}).get("rows", [])} for a in arms}
    ttft = {a: {r["concurrency"]: r for r in comps.get(a, {}).get("mean_ttft_ms", {}).get("rows", [])} for a in arms}
    tpot = {a: {r["concurrency"]: r for r in comps.get(a, {}).get("mean_tpot_ms", {}).get("rows", [])} for a in arms}
    head = ["Concurrency", f"Output tok/s {base}"]
    for a in arms:
        head += [a, "Change"]
    head += [f"TTFT ({' / '.join(arms)})", f"TPOT ({' / '.join(arms)})"]
    rows = [head]
    for c in result["concurrency"]:
        any_arm = next((thr[a][c] for a in arms if c in thr[a]), None)
        if any_arm is None:
            continue
        row = [str(c), f"{any_arm['base']:.1f}"]
        for a in arms:
            r = thr[a].get(c)
            row += [f"{r['arm']:.1f}", _fmt_change(r)] if r else ["-", "-"]
        row.append(" / ".join(_fmt_change(ttft[a][c]) if c in ttft[a] else "-" for a in arms))
        row.append(" / ".join(_fmt_change(tpot[a][c]) if c in tpot[a] else "-" for a in arms))
        rows.append(row)
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = ["  ".join(cell.rjust(w) if j else cell.ljust(w) for j, (cell, w) in enumerate(zip(r, widths))) for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    out = "\n".join(lines) + "\n\n"
    for a in arms:
        m = comps.get(a, {}).get("output_throughput")
        if not m:
            continue
        se = m["se_pp"]
        se_txt = f"SE {se:.2f} pp" if se is not None else "SE unknown"
        src = {"aa-launches": f"from {m['n_base_launches']} A/A launches of {base}",
               "runs": "from runs inside launches only (one base launch: a floor, launch-to-launch noise missing)",
               "none": "no A/A data"}[m["noise_source"]]
        mean = m["mean_change_pct"]
        out += (f"{a}: mean output throughput change {mean:+.1f}% ({m['mean_verdict']}), {se_txt} {src}; "
                f"{m['n_arm_launches']} launches vs {m['n_base_launches']}\n")
    out += "* beyond 2 SE (significant); no mark: within noise; ? no noise estimate. TTFT/TPOT: lower is better.\n"
    if not result.get("complete"):
        out += "(incomplete: interrupted or failed; partial results)\n"
    return out


def plot(result: dict, path: str) -> None:
    """Change in output throughput vs the baseline per concurrency and arm, error bars 2 SE."""
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from bcgtune.fileio import atomic_write_bytes

    arms = [a["name"] for a in result["arms"][1:]]
    concs = result["concurrency"]
    fig, ax = plt.subplots(figsize=(max(5.0, 1.4 * len(concs) + 2), 3.6))
    width = 0.8 / max(1, len(arms))
    for k, a in enumerate(arms):
        m = result["comparisons"].get(a, {}).get("output_throughput")
        if not m:
            continue
        byc = {r["concurrency"]: r for r in m["rows"]}
        xs = [i + (k - (len(arms) - 1) / 2) * width for i, c in enumerate(concs) if c in byc]
        ys = [byc[c]["change_pct"] for c in concs if c in byc]
        err = [2 * (byc[c]["se_pp"] or 0.0) for c in concs if c in byc]
        ax.bar(xs, ys, width, yerr=err, capsize=3, label=a)
    ax.axhline(0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(concs)), [str(c) for c in concs])
    ax.set_xlabel("concurrency")
    ax.set_ylabel(f"output tok/s change vs {result['base_arm']} (%)")
    ax.set_title(f"bcgtune bench: {result['profile']} (error bars: 2 SE from A/A)", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=120)
    plt.close(fig)
    atomic_write_bytes(path, buf.getvalue())
