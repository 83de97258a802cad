"""`bcgtune trace merge`: several traces in, one out (provenance and server configurations
kept). Parse the options, one library call, render."""

from __future__ import annotations

from typing import Annotated, List, Optional

import typer

from bcgtune.cli import guard
from bcgtune.cli.console import note, out, out_json
from bcgtune.cli.help import examples
from bcgtune.cli.options import JsonFlag, Quiet
from bcgtune.errors import InputError


@examples(
    "bcgtune trace merge monday.json tuesday.json -o week.json",
    "bcgtune trace merge full.json histogram-only.json --histogram-only -o all.json",
)
def trace_merge_command(
    traces: Annotated[
        Optional[List[str]],
        typer.Argument(
            metavar="TRACES...",
            help="Trace files (bcgtune trace -o), in order: traces from logs, or plain size,count histograms.",
            show_default=False,
        ),
    ] = None,
    out_path: Annotated[
        Optional[str],
        typer.Option(
            "-o",
            "--out",
            help="Write the merged trace: versioned JSON, or binary when the name ends in .npz.",
            show_default=False,
        ),
    ] = None,
    histogram_only: Annotated[
        bool,
        typer.Option(
            "--histogram-only",
            help="Keep counts per size and request mixes per configuration only (needed when some inputs have no "
            "per-batch columns).",
        ),
    ] = False,
    as_json: JsonFlag = False,
    quiet: Quiet = False,
) -> None:
    """Merge traces into one, sources, statistics and server configurations kept.

    Any grouping of the inputs, in the same order, gives the same trace. Refused: a
    simulation beside logs, different --mixed-chunk settings, per-batch columns beside a
    histogram-only trace (without --histogram-only), the same log twice.
    """
    from bcgtune.cli.render.trace import render_trace_text
    from bcgtune.core.trace.summary import summarize
    from bcgtune.files.trace_file import save_trace
    from bcgtune.services.trace import merge_trace_files

    paths = list(traces or [])
    if not paths:
        raise InputError("give the trace files to merge", "TRACES")
    if out_path is not None and out_path.lower().endswith(".csv"):
        raise InputError("a merged trace is written as JSON or .npz (it keeps sources and configurations)", f"-o {out_path}")
    guard.outputs({"-o": out_path}, inputs=paths)
    trace = merge_trace_files(paths, histogram_only=histogram_only)
    if out_path:
        save_trace(trace, out_path)
        note(f"wrote {out_path} ({trace.n_batches:,} batches, {trace.sizes.size:,} sizes)", quiet)
    summary = summarize(trace)
    if as_json:
        out_json(summary.to_dict())
    else:
        out(render_trace_text(summary), nl=False)
