"""Rendering of `bcgtune validate --server`'s report (bcgtune.core.bench.server_validation)."""

from __future__ import annotations

from bcgtune.core.bench.server_validation import ServerValidation


def render_server_validation(r: ServerValidation) -> str:
    lines = [f"server validation: profile {r.profile} ({r.backend} prefill graphs) vs graphs disabled, {r.probes} probes"]
    lines.append(f"  {'probe':<16} {'kind':<5} {'agree':>9} {'first flip':>10} {'gap':>6} {'max |dlogp|':>11}  text")
    for c in r.requests:
        flip = "-" if c.first_flip is None else str(c.first_flip)
        gap = "-" if c.flip_gap is None else f"{c.flip_gap:.2f}"
        bad = " FAIL" if c.flip_fails or c.delta_fails else ""
        lines.append(
            f"  {c.name:<16} {c.kind:<5} {c.agree:>4}/{c.positions:<4} {flip:>10} {gap:>6} "
            f"{c.max_logprob_delta:>11.4f}  {'same' if c.identical_text else 'differs'}{bad}"
        )
    ta, same = r.top1_agreement, r.identical_text_rate
    lines.append(
        f"top-1 agreement {100 * ta:.1f}% of compared positions; identical text {100 * (same or 0.0):.0f}% of requests"
        if ta is not None
        else "no positions compared"
    )
    cap = r.replay.captured
    lines.append(f"captured buckets ({len(cap)}): {' '.join(map(str, cap)) or 'none'}")
    for kind in ("text", "image"):
        s = r.replay.phase(kind)
        if not s:
            continue
        share = "-" if s.share_of_eligible is None else f"{100 * s.share_of_eligible:.0f}%"
        lines.append(
            f"{kind} batches: {s.replayed}/{s.batches} replayed; {s.replayed_eligible}/{s.eligible} "
            f"of those a bucket serves ({share})"
        )
    rv = r.runner
    lines.append(f"runner: {rv.verdict} ({rv.why}); doctor says the installed runner is {rv.doctor.state}")
    if rv.verdict in ("patched", "unpatched") and rv.doctor.state in ("patched", "unpatched") and rv.verdict != rv.doctor.state:
        lines.append(
            "  note: the server's behaviour and this machine's SGLang source disagree (the server may run another SGLang)"
        )
    lines.append(f"logs and validation.json: {r.workdir}")
    lines.append("PASS" if r.ok else "FAIL: " + "; ".join(r.failures))
    return "\n".join(lines) + "\n"
