"""Rendering of a DoctorReport (bcgtune.services.doctor); what a launch captures is drawn
by bcgtune.cli.render.launch."""

from __future__ import annotations

from typing import TYPE_CHECKING

from bcgtune.cli.render.launch import render_resolved_prefill

if TYPE_CHECKING:  # the result type only: rendering never imports the service's pipeline
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
