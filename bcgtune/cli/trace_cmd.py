"""`bcgtune trace`: a workload's prefill sizes from server logs (and, later, a simulation
or a live run). Parse the options, build the trace in one library call, render."""

from __future__ import annotations

from typing import List, Optional

import typer

from bcgtune.cli.app import app


@app.command("trace")
def trace_command(
    log: Optional[List[str]] = typer.Option(
        None, "--log", help="SGLang server log(s), repeatable (one per rank or replica); .gz ok; '-' for stdin."
    ),
    out: Optional[str] = typer.Option(
        None, "-o", "--out", help="Write the trace: JSON, or size,count CSV if OUT ends in .csv."
    ),
    mixed_chunk: bool = typer.Option(
        False, "--mixed-chunk", help="The server ran with --enable-mixed-chunk: add one token per running decode row."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the summary as one JSON object."),
) -> None:
    """Record a workload's prefill forward sizes."""
    from bcgtune.errors import InputError

    if not log:
        raise InputError("give --log FILE (an SGLang server log)", "bcgtune trace")
    trace = _trace_from_logs(log, mixed_chunk)
    _emit(trace, out, as_json)


def _trace_from_logs(paths: List[str], mixed_chunk: bool):
    from bcgtune.adapters.sglang_log import parse_logs
    from bcgtune.errors import InputError

    if sum(1 for p in paths if p == "-") > 1:
        raise InputError("stdin ('-') can be read once only", "--log")
    return parse_logs(list(paths), mixed_chunk=mixed_chunk)


def _emit(trace, out: Optional[str], as_json: bool) -> None:
    """Write the trace (if asked) and print the summary: human text or one JSON object on
    stdout; chatter on stderr."""
    import json

    from bcgtune.cli.render_trace import render_trace_text, trace_summary
    from bcgtune.core.trace import save_trace

    if out:
        save_trace(trace, out)
        typer.echo(f"wrote {out} ({trace.n_batches} batches, {trace.sizes.size} sizes)", err=True)
    if as_json:
        typer.echo(json.dumps(trace_summary(trace), separators=(",", ":")))
    else:
        typer.echo(render_trace_text(trace), nl=False)
