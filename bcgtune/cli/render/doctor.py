"""Rendering of a DoctorReport (bcgtune.adapters.doctor)."""

from __future__ import annotations

from bcgtune.adapters.doctor import DoctorReport


def render_text(report: DoctorReport) -> str:
    t, s, g = report.torch, report.sglang, report.prefill_runner_gate
    lines = [f"python   {report.python['version']} ({report.python['executable']})"]
    if t.get("installed"):
        rt = f"HIP {t['hip']}" if t.get("hip") else (f"CUDA {t['cuda']}" if t.get("cuda") else "CPU build")
        gpus = ", ".join(f"{x['name']} ({x['memory_gib']} GiB)" for x in t.get("gpus", [])) or "no GPU visible"
        lines.append(f"torch    {t['version']} ({rt}); {gpus}")
    else:
        lines.append("torch    not installed")
    if s.get("installed"):
        lines.append(f"sglang   {s.get('version') or 'unknown version'} ({s['path']})")
    else:
        lines.append("sglang   not installed")
    lines.append(f"default prefill backend here: {report.default_prefill_backend or 'unknown (no torch)'}")
    lines.append(f"prefill runner multimodal gate: {g.state}: {g.detail}")
    if report.profile is not None:
        lines.append(f"profile  {report.profile}")
        if not report.findings:
            lines.append("  no findings")
        for f in report.findings:
            lines.append(f"  {f.severity:8s} {f.code}: {f.message}")
    return "\n".join(lines) + "\n"
