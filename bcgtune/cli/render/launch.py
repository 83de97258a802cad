"""Rendering of what a launch captures (bcgtune.core.sglang.capture.PrefillCapture): the
lines doctor and `serve --dry-run` print, and the first line of the commands that price a
launch (suggest-buckets, drift)."""

from __future__ import annotations

from bcgtune.core.sglang.capture import PrefillCapture


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
