"""`bcgtune trace`: a workload's prefill sizes from server logs (and, later, a simulation
or a live run)."""

from __future__ import annotations

from typing import List, Optional

import typer

from bcgtune.cli.app import app


@app.command("trace")
def trace_command(
    log: Optional[List[str]] = typer.Option(None, "--log", help="SGLang server log(s); .gz ok; '-' for stdin."),
    out: Optional[str] = typer.Option(None, "-o", "--out", help="Write the trace: JSON, or size,count CSV if OUT ends in .csv."),
) -> None:
    """Record a workload's prefill forward sizes."""
    from bcgtune.errors import InputError

    raise InputError("give --log FILE (log parsing is being built)")
