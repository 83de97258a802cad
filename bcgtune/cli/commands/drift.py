"""`bcgtune drift`: is a profile's bucket list still right for today's traffic? Exit 0 keep,
1 re-tune: a cron job can run it on new logs."""

from __future__ import annotations

from typing import Annotated, List, Optional

import typer

from bcgtune.cli.console import emit, note
from bcgtune.cli.help import examples
from bcgtune.cli.options import JsonFlag, ProfileRef, Quiet
from bcgtune.core.constants import DEFAULT_THRESHOLD_PCT
from bcgtune.errors import CheckFailed, InputError


@examples(
    "bcgtune drift --profile h200.toml --trace trace.json",
    "bcgtune drift --profile h200.toml --log today.log --threshold 2   # cron",
)
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
            help="Re-tune when today's optimum is better by more than this: % of predicted time with a calibration, else "
            "points of replay share or padding waste.",
        ),
    ] = DEFAULT_THRESHOLD_PCT,
    as_json: JsonFlag = False,
    quiet: Quiet = False,
) -> None:
    """Is a profile's bucket list still right for today's traffic? Exit 1: re-tune.

    Compares the list with today's optimum on today's traffic (same number of graphs, same
    alignment). Exit 0 keeps the list, so a cron job can run it on each day's logs.
    """
    from bcgtune.adapters.profiles import load_profile
    from bcgtune.cli.render.drift import render_drift_text
    from bcgtune.services.drift import drift_for_profile, load_traffic

    if bool(log) == bool(trace_path):
        raise InputError("give today's traffic as --log FILE... or --trace FILE")
    prof = load_profile(profile)
    trace = load_traffic(log, trace_path)
    cal = None
    if calibration:
        from bcgtune.core.calibration import load_calibration

        cal = load_calibration(calibration)
    rep = drift_for_profile(prof, trace, calibration=cal, threshold_pct=threshold)
    emit(rep.to_dict, lambda: render_drift_text(rep, trace.n_batches), as_json=as_json)
    if rep.verdict == "re-tune":
        raise CheckFailed(rep.reason, "drift")
    note("keep: " + rep.reason, quiet or not as_json)
