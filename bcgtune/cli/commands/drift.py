"""`bcgtune drift`: is a profile's bucket list still right for today's traffic? Exit 0 keep,
1 re-tune: a cron job can run it on new logs."""

from __future__ import annotations

from typing import Annotated, List, Optional

import typer

from bcgtune.adapters.hardware import gpu_for
from bcgtune.adapters.sglang_flags import prefill_launch_from_server_flags
from bcgtune.cli.console import emit, note
from bcgtune.cli.options import JsonFlag, ProfileRef, Quiet
from bcgtune.cli.render.drift import render_drift_text
from bcgtune.core.drift import DEFAULT_THRESHOLD_PCT, drift_report
from bcgtune.core.ladder import resolve_prefill_capture
from bcgtune.core.plan import assumed_chunked_prefill_size
from bcgtune.errors import CheckFailed, InputError


def drift_command(
    profile: ProfileRef,
    log: Annotated[
        Optional[List[str]], typer.Option("--log", help="Today's SGLang server log(s), repeatable; .gz ok.", show_default=False)
    ] = None,
    trace_path: Annotated[
        Optional[str], typer.Option("--trace", help="Today's trace file instead of logs (bcgtune trace -o).", show_default=False)
    ] = None,
    calibration: Annotated[
        Optional[str],
        typer.Option(
            "--calibration", help="Judge by predicted prefill time from this calibration (bcgtune calibrate).", show_default=False
        ),
    ] = None,
    threshold: Annotated[
        float,
        typer.Option(
            "--threshold",
            min=0.0,
            max=100.0,
            help="Re-tune when today's optimum is better by more than this: % of predicted time with a calibration, else points of replay share or padding waste.",
        ),
    ] = DEFAULT_THRESHOLD_PCT,
    as_json: JsonFlag = False,
    quiet: Quiet = False,
) -> None:
    """Is a profile's bucket list still right for today's traffic? Exit 1: re-tune.

    Compares the list with today's optimum on today's traffic (same number of graphs, same
    alignment).

    Example (cron): bcgtune drift --profile h200.toml --log /var/log/sglang/today.log --threshold 2
    """
    from bcgtune.adapters.profiles import load_profile

    if bool(log) == bool(trace_path):
        raise InputError("give today's traffic as --log FILE... or --trace FILE")
    prof = load_profile(profile)
    if log:
        from bcgtune.adapters.sglang_log import parse_logs

        trace = parse_logs(list(log))
    else:
        from bcgtune.core.trace import load_trace

        trace = load_trace(trace_path)
    cal = None
    if calibration:
        from bcgtune.core.calibration import load_calibration

        cal = load_calibration(calibration)
    server = dict(prof.server)
    gpu = gpu_for(prof.hardware)
    if "chunked_prefill_size" not in server and (trace.chunked_prefill_size() or gpu is None):
        server["chunked_prefill_size"] = assumed_chunked_prefill_size(trace, None)
    capture = resolve_prefill_capture(
        prefill_launch_from_server_flags(
            server,
            platform=prof.platform,
            buckets=prof.buckets,
            model_path=prof.model or "",
            gpu_memory_gib=gpu.memory_gib if gpu is not None else None,
        )
    )
    if not capture.graphs_on:
        raise InputError(f"the profile runs no prefill graphs: {capture.reason}", prof.where)
    what = "list" if prof.buckets else "SGLang default ladder (no list)"
    rep = drift_report(
        trace,
        list(capture.captured),
        name=f"profile {prof.name}'s {what}",
        align=capture.alignment,
        calibration=cal,
        threshold_pct=threshold,
    )
    emit(rep.to_dict, lambda: render_drift_text(rep, trace.n_batches), as_json=as_json)
    if rep.verdict == "re-tune":
        raise CheckFailed(rep.reason, "drift")
    note("keep: " + rep.reason, quiet or not as_json)
