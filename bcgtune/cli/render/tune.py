"""`bcgtune tune`'s result as text (every step's wall time and figures, the proof run's table)
and as a plot of predicted vs measured per list."""

from __future__ import annotations

import io
from typing import Any

from bcgtune.cli.render.table import table


def _s(iv: dict[str, Any] | None, signed: bool = False, unit: float = 1e3) -> str:
    """An interval dict (center, half in ms) in seconds (unit 1e3) or ms (unit 1)."""
    if iv is None:
        return "-"
    prec = 3 if unit == 1e3 else 1
    c = iv["center"] / unit
    text = f"{c:+,.{prec}f}" if signed else f"{c:,.{prec}f}"
    return text + (f" ± {iv['half'] / unit:,.{prec}f}" if iv.get("half") is not None else "")


def _step_line(name: str, st: dict[str, Any]) -> str:
    if name == "plan":
        c = st.get("cost") or {}
        sizes = c.get("sizes") or [0]
        return (
            f"budget {st.get('limit_s', 0):.0f} s; probe: build {c.get('build_s', 0):.1f} s, replay "
            f"{(c.get('replay_ms') or [0])[0]:.1f}..{(c.get('replay_ms') or [0])[-1]:.1f} ms and eager "
            f"{(c.get('eager_ms') or [0])[0]:.1f}..{(c.get('eager_ms') or [0])[-1]:.1f} ms at {sizes[0]:,}..{sizes[-1]:,} tokens"
        )
    if name == "calibrate":
        mc = st.get("model_check")
        check = mc["summary"] if mc else "model error not checked"
        return f"{st['sizes']} sizes, {st['rounds']} rounds on {st['device']}; {check}"
    if name == "optimum" and st.get("given"):
        return (
            f"tuning the list given ({st['recommended']['graphs']} graphs); time optimum {st['optimal']['graphs']} graphs, "
            f"the optimizer recommends {st['optimizer_recommended']['graphs']}"
        )
    if name == "optimum":
        return f"time optimum {st['optimal']['graphs']} graphs, recommended {st['recommended']['graphs']}" + (
            f"; wants unmeasured sizes {st['unmeasured_wanted']}" if st["unmeasured_wanted"] else ""
        )
    if name == "measure":
        n = len(st["rounds"])
        tail = "the list holds only measured sizes" if st["measured_only"] else f"still unmeasured: {st['still_unmeasured']}"
        if st.get("refused"):
            tail += f" ({st['refused']})"
        return f"{n} of at most {st['max_rounds']} rounds ({sum(len(r['sizes']) for r in st['rounds'])} sizes added); {tail}"
    if name == "validate":
        if st.get("ok") is None:
            return st.get("note", "not checked")
        if not st["buckets"]:
            return st.get("note", "nothing to validate")
        return (
            f"{'ok' if st['ok'] else 'FAILED'}: {st['batches_checked']} batches replayed against eager "
            f"({st['bitwise_batches']} bit for bit), side inputs {', '.join(st['side_inputs']) or 'none'}"
            + (f"; {st['numerics']}" if st.get("numerics") else "")
        )
    if name == "proof":
        sample = st.get("sample") or {}
        what = "the whole trace" if sample.get("whole_trace") else f"a sample stratified by {sample.get('strata_by', '?')}"
        return (
            f"{st['passes']} pass{'es' if st['passes'] != 1 else ''} of {st['repeats']} rounds on {st['batches']:,} of "
            f"{st['of']:,} trace batches ({what}{', in trace order' if st['ordered'] else ', shuffled'})"
        )
    return ""


def _secs(v: Any) -> str:
    return "-" if v is None else f"{float(v):.1f}"


def format_tune(result) -> str:
    steps = result.steps
    proof = steps["proof"]
    engine = result.state["engine"]  # the engine's measurement key (engines/config.py)
    model = engine["model"]["name"] if isinstance(engine.get("model"), dict) else engine.get("model")
    tp = (engine.get("parallel") or {}).get("tp") or 1
    lines = [
        f"bcgtune tune: {result.state['trace']['path']} on {proof['device']} (torch {proof['torch'] or 'not used'}), "
        f"model {model}{f' (one rank of TP {tp})' if tp > 1 else ''}, runner {engine['runner']}"
    ]
    sim = proof.get("timer") == "simulated clock"
    body = []
    for name in ("plan", "calibrate", "optimum", "measure", "validate", "proof"):
        if name not in steps:
            continue
        st = steps[name]
        body.append(
            [name, _secs(st.get("predicted_s")), _secs(st.get("spent_s", st["wall_s"])),
             ("(kept) " if name in result.resumed else "") + _step_line(name, st)]
        )  # fmt: skip
    unit = "simulated s" if sim else "s"
    lines += table(["step", f"predicted {unit}", f"spent {unit}", "result"], body, right={1, 2}, wrap_last=90)
    b = result.budget
    if b.get("limit_s") is not None:
        lines.append(
            f"budget: {b['limit_s']:.0f} s of device time{' (simulated)' if sim else ''}; planned {b['predicted_s'] or 0:.0f} s, "
            f"spent {b['spent_s']:.0f} s" + ("" if b["spent_s"] <= b["limit_s"] else " (OVER the budget)")
        )
        for n in b.get("notes") or []:
            lines.append("note: " + n)
    lines.append("")
    lines += _proof_table(proof)
    lines += _trace_lines(proof)
    lines += _sample_lines(proof)
    lines += _notes(result, proof)
    lines.append("recommended: " + (result.flag if result.buckets else "no graphs; run prefill eager"))
    return "\n".join(lines) + "\n"


def _proof_table(proof: dict[str, Any]) -> list[str]:
    """Per list: on the whole trace (estimated), and on the batches replayed (predicted against
    measured, pass by pass)."""
    passes = proof["passes"]
    head = ["list", "graphs", "whole trace s (95%)", "replayed", "sample: predicted s"]
    head += [f"sample: measured s, pass {i + 1}" for i in range(passes)] + ["inside"]
    rows = []
    for name, r in proof["lists"].items():
        est = r.get("trace_estimate")
        rows.append(
            [name, str(r["graphs"]), _s(est), f"{r['replayed_batches']}/{proof['batches']}", _s(r["predicted"])]
            + [_s(m) for m in r["measured"]]
            + ["-" if r["inside"] is None else f"{r['inside']}/{passes}"]
        )
    return table(head, rows)


def _trace_lines(proof: dict[str, Any]) -> list[str]:
    """The whole trace's figures: the gain over the ladder, the differences, what they cover."""
    t = proof.get("trace")
    if not t:
        return []
    design = t["design"]
    on = (
        f"measured on the whole trace ({design['trace_batches']:,} batches)"
        if design["whole_trace"]
        else f"estimated from {design['sampled_batches']:,} of the trace's {design['trace_batches']:,} batches"
    )
    g = t["gain"]
    d = t["recommended_minus_ladder"]
    out = [
        f"gain over SGLang's ladder on the whole trace: {g['gain_pct']:+.2f}% ± {g['half_pct']:.2f}% (95%; {on})",
        f"recommended - ladder on the whole trace: {_s(d, True, 1)} ms ({d['differing_batches']:,} batches run differently)",
    ]
    o = t.get("recommended_minus_optimum")
    if o is not None:
        verdict = ""
        if "margin_ms" in o:
            verdict = (
                f"; within the {o['tolerance_pct']:g}% margin ({o['margin_ms']:,.1f} ms)"
                if o["within_margin"]
                else f"; beyond the {o['tolerance_pct']:g}% margin ({o['margin_ms']:,.1f} ms)"
                + ("" if o["not_beyond_margin"] else ", measurably")
            )
        out.append(
            f"recommended - optimum on the whole trace: {_s(o, True, 1)} ms ({o['differing_batches']:,} batches run differently"
            f"{verdict})"
        )
    a = t["allowances"]
    parts = "the sampling error, " if not design["whole_trace"] else ""
    out.append(
        f"these intervals hold {parts}the run's round-to-round noise and stated allowances: {100 * a['capture_sd']:.1f}% of each "
        f"graph's time for another capture of it, {100 * a['level_sd']:.1f}% for the shift of every time in another process "
        f"(totals only), {100 * a['host_sd']:.0f}% of launch-bound eager time for the host ({a['source']})"
    )
    return out


def _sample_lines(proof: dict[str, Any]) -> list[str]:
    """What the passes measured on the batches replayed (not the trace's figures)."""
    passes = proof["passes"]
    d = proof["recommended_minus_ladder"]
    each = "; ".join(
        f"{_s(m, True, 1)} ms (gain {g:+.2f}%" + (f" ± {h:.2f}%)" if h is not None else ")")
        for m, g, h in zip(d["measured"], d["measured_gain_pct"], d["measured_gain_half_pct"])
    )
    out = [
        f"on the {proof['batches']:,} batches replayed: recommended - ladder predicted {_s(d['predicted'], True, 1)} ms; "
        f"measured {each}" + (f"; inside the predicted interval in {d['inside']}/{passes}" if d["inside"] is not None else "")
    ]
    o = proof.get("recommended_minus_optimum")
    if o is not None:
        out.append(
            f"on the batches replayed: recommended - optimum predicted {_s(o['predicted'], True, 1)} ms; measured "
            + "; ".join(f"{_s(m, True, 1)} ms" for m in o["measured"])
            + f"; within the {o['tolerance_pct']:g}% margin of these batches ({o['margin_ms']:,.1f} ms)"
            + f" in {o['within_margin']}/{passes}"
            + (
                f", not measurably beyond it (its 95% interval reaches the margin) in {o['not_beyond_margin']}/{passes}"
                if "not_beyond_margin" in o
                else ""
            )
        )
        if o.get("differing_batches") == 0:
            out.append(
                "  on the proof's batches both lists replay every batch in the same bucket, so these passes measure only "
                "the noise between two captures of the same graphs"
                + (
                    f"; the trace has {o['differing_batches_in_trace']:,} batches they run differently"
                    if o.get("differing_batches_in_trace")
                    else ""
                )
            )
    return out


def _notes(result, proof: dict[str, Any]) -> list[str]:
    steps = result.steps
    passes = proof["passes"]
    lines = []
    mc = steps["measure"].get("model_check") or {}
    again = proof.get("model_rechecked")
    if again:
        lines.append(f"predicted intervals include the model error, checked again in the proof's process ({again['summary']})")
    elif mc.get("checked"):
        lines.append(f"predicted intervals include the model error ({mc['summary']})")
    else:
        lines.append(f"predicted intervals do not cover the model's own error ({mc.get('reason', 'model error not checked')})")
    for name, r in proof["lists"].items():
        if r["inside"] is None or r["inside"] == passes or r.get("in_model_check", True):
            continue
        centers = [m["center"] / 1e3 for m in r["measured"]]
        why = (
            "eager runs every kernel launch from the host, so on a launch-bound shape its time moves with the host's CPU"
            if not r["buckets"]
            else "its model error was not measured on it"
        )
        lines.append(
            f"note: {name} measured outside its predicted interval in {passes - r['inside']}/{passes} passes "
            f"({min(centers):,.3f}-{max(centers):,.3f} s): it is not replayed by the model check, and {why}; "
            "the other lists' figures do not depend on it"
        )
    if not proof["ordered"]:
        lines.append("note: the trace keeps no batch order: its batches were replayed in a seeded shuffle")
    if proof["timer"] == "simulated clock":
        lines.append("note: the simulated device: its times come from a recorded calibration (--sim-calibration), not a GPU")
    elif proof["timer"] != "cuda events":
        lines.append("note: no GPU: every step ran as a dry run on the CPU; its times describe no GPU")
    if proof["recommended_capture_s"] is not None:
        lines.append(
            f"recommended list: {len(result.buckets)} graphs, capture {proof['recommended_capture_s']:.2f} s, "
            f"graph memory {proof['recommended_graph_mem_gib']:.3f} GiB"
        )
    total = sum(float(steps[n]["wall_s"]) for n in steps)
    lines.append(
        f"wall time of the steps: {total:,.1f} s"
        + (f" ({', '.join(result.resumed)} kept from {result.state_dir})" if result.resumed else "")
    )
    return lines


def plot_tune(result, path: str) -> None:
    """Predicted total (95% interval) and each pass's measured total (its interval) per list,
    and the recommended-minus-ladder difference the same way. Written atomically."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from bcgtune.fileio import atomic_write_bytes

    proof = result.steps["proof"]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 4.5))
    names = list(proof["lists"])
    for i, name in enumerate(names):
        r = proof["lists"][name]
        p = r["predicted"]
        ax1.errorbar([i - 0.15], [p["center"] / 1e3], yerr=[(p["half"] or 0.0) / 1e3], fmt="o", capsize=4, color="#4878a8",
                     label="predicted" if i == 0 else None)  # fmt: skip
        for j, m in enumerate(r["measured"]):
            ax1.errorbar([i + 0.05 + 0.08 * j], [m["center"] / 1e3], yerr=[(m["half"] or 0.0) / 1e3], fmt="s", capsize=4,
                         color="#d1495b", label="measured (each pass)" if i == 0 and j == 0 else None)  # fmt: skip
    ax1.set_xticks(range(len(names)), names)
    ax1.set_ylabel("total prefill time on the replayed batches (s)")
    ax1.set_title("predicted vs measured, per list")
    ax1.legend()
    ax1.grid(alpha=0.3)
    d = proof["recommended_minus_ladder"]
    ax2.errorbar([0], [d["predicted"]["center"]], yerr=[d["predicted"]["half"] or 0.0], fmt="o", capsize=4, color="#4878a8")
    for j, m in enumerate(d["measured"]):
        ax2.errorbar([1 + 0.1 * j], [m["center"]], yerr=[m["half"] or 0.0], fmt="s", capsize=4, color="#d1495b")
    ax2.axhline(0.0, color="grey", lw=0.8, ls=":")
    ax2.set_xticks([0, 1], ["predicted", "measured"])
    ax2.set_ylabel("recommended - ladder (ms, 95% interval)")
    ax2.set_title("the gain over SGLang's ladder")
    ax2.grid(alpha=0.3)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    atomic_write_bytes(path, buf.getvalue())
