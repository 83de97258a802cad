"""Rendering of a DoctorReport (bcgtune.services.doctor) and of what a launch captures
(bcgtune.core.sglang.capture.PrefillCapture), which `serve --dry-run` prints too."""

from __future__ import annotations

from bcgtune.core.sglang.capture import PrefillCapture
from bcgtune.services.doctor import DoctorReport


def render_text(report: DoctorReport) -> str:
    t, s, g = report.torch, report.sglang, report.prefill_runner_gate
    lines = [f"python   {report.python.version} ({report.python.executable})"]
    if t.installed:
        rt = f"HIP {t.hip}" if t.hip else (f"CUDA {t.cuda}" if t.cuda else "CPU build")
        gpus = ", ".join(f"{x.name} ({x.memory_gib} GiB)" for x in t.gpus) or "no GPU visible"
        lines.append(f"torch    {t.version} ({rt}); {gpus}")
    else:
        lines.append("torch    not installed")
    if s.installed:
        lines.append(f"sglang   {s.version or 'unknown version'} ({s.path})")
    else:
        lines.append("sglang   not installed")
    lines.append(f"default prefill backend here: {report.default_prefill_backend or 'unknown (no torch)'}")
    cached = f", answer cached {report.gate_cached_at}" if report.gate_cached_at else ""
    lines.append(f"prefill runner multimodal gate: {g.state} ({g.method}{cached}): {g.detail}")
    if g.answers:
        lines.append(f"  Qwen4-Exp batches: {_answers_text(g.answers)}")
    if report.profile is not None:
        lines.append(f"profile  {report.profile}")
        if report.resolved_prefill is not None:
            lines.extend("  " + ln for ln in render_resolved_prefill(report.resolved_prefill))
        if not report.findings:
            lines.append("  no findings")
        for f in report.findings:
            lines.append(f"  {f.severity:8s} {f.code}: {f.message}")
    lines.append(f"outcome  {outcome_text(report)}")
    for n in report.not_checked:
        lines.append(f"  not checked: {n}")
    for h in report.how_to_check:
        lines.append(f"  to check: {h}")
    return "\n".join(lines) + "\n"


def outcome_text(report: DoctorReport) -> str:
    if report.outcome == "ok":
        return "ok: checked by SGLang itself, nothing blocks"
    if report.outcome == "blocking":
        extra = " (and part of it was not checked by SGLang)" if report.not_checked else ""
        n = len(report.blocking)
        return f"blocking: {n} finding{'s' if n > 1 else ''} would stop or defeat the server{extra}"
    return "NOT CHECKED: SGLang's own answer is missing for part of this, so no verdict (not ok)"


def _answers_text(answers: dict[str, bool]) -> str:
    def yn(k):
        return "replays" if answers.get(k) else "eager"

    return (
        f"image: {yn('image_spec_off')} without / {yn('image_spec_on')} with speculative decoding; "
        f"text: {yn('text_spec_off')} / {yn('text_spec_on')}"
    )


def render_resolved_prefill(r: PrefillCapture) -> list[str]:
    """Lines describing what the server will do (doctor and serve --dry-run print them)."""
    lines = [f"prefill graphs ({'checked by SGLang: ' if r.checked else 'NOT CHECKED by SGLang: '}{source_text(r)}):"]
    lines.append(f"  backend    {r.backend if r.graphs_on else 'disabled'}: {r.reason}")
    if r.graphs_on:
        c = r.captured
        lines.append(f"  captures   {len(c)} graphs, {c[0]}..{c[-1]}: {' '.join(map(str, c))}")
    else:
        lines.append("  captures   nothing")
    extra = [f"alignment {r.alignment}"]
    if r.max_bs is not None:
        extra.append(f"ladder max {r.max_bs}")
    if r.chunked_prefill_size is not None:
        extra.append(f"chunked prefill {r.chunked_prefill_size} per attention-DP rank")
    lines.append("  " + ", ".join(extra))
    for n in r.notes:
        lines.append(f"  note: {n}")
    for u in r.unchecked:
        lines.append(f"  not checked: {u}")
    return lines


def source_text(r: PrefillCapture) -> str:
    """Who answered: SGLang (and when its answer was cached), or bcgtune's model and why
    SGLang's own answer was not used."""
    if r.source.kind == "sglang":
        return r.source.label + (f", answer cached {r.source.cached_at}" if r.source.cached_at else "")
    return r.source.label if r.source.not_asked is None else f"{r.source.label}; SGLang not asked: {r.source.not_asked}"


def capture_line(r: PrefillCapture, ask_flag: str = "--ask-sglang") -> str:
    """The first line of commands that price a launch (suggest-buckets, drift): whose answer
    says what SGLang captures for it, and what was not checked."""
    from bcgtune.services.launch import NOT_CACHED, probe_time_text

    if r.source.kind == "sglang":
        text = f"SGLang's capture for this launch (checked): {r.source.label}'s own answer"
        text += f" (cached {r.source.cached_at})" if r.source.cached_at else ""
    else:
        text = "SGLang's capture for this launch (NOT CHECKED by SGLang): bcgtune's model of its rules"
        why = r.source.not_asked
        if why == NOT_CACHED:
            why = f"no cached answer from SGLang: {ask_flag} asks it, {probe_time_text()} once"
        text += f" ({why})" if why else ""
    if r.unchecked:
        text += "; not checked: " + "; ".join(r.unchecked)
    return text
