"""`bcgtune drift`: are the deployed bucket lists still right for today's traffic? Exit 0
keep, 1 re-tune: a cron job can run it on new logs."""

from __future__ import annotations

import datetime as dt
from typing import Annotated, List, Optional

import typer

from bcgtune import __version__
from bcgtune.cli import guard
from bcgtune.cli.console import emit, note
from bcgtune.cli.help import examples
from bcgtune.cli.options import TOLERANCE_HELP, JsonFlag, Quiet, Unchecked, tolerance_option
from bcgtune.core.sglang.constants import DEFAULT_THRESHOLD_PCT
from bcgtune.errors import InputError


@examples(
    "bcgtune drift --profile h200.toml --trace trace.json",
    "bcgtune drift --profile h200.toml --log today.log --threshold 2   # cron",
    "bcgtune drift --profile h200.toml --log today.log --write-profile h200.toml",
    "bcgtune drift -p small.toml -p big.toml --log s3://bucket/today/   # a fleet",
    "bcgtune drift --log today/*.log   # each configuration's logged capture list",
    "bcgtune drift -p a.toml -p b.toml --log today/ --match b=2   # rotated logs",
)
def drift_command(
    profile: Annotated[
        Optional[List[str]],
        typer.Option(
            "--profile",
            "-p",
            help="A deployed profile (built-in name or .toml), repeatable: each is judged on the server configurations "
            "of today's logs it agrees with. None: every configuration is judged by the list its servers logged capturing.",
            show_default=False,
        ),
    ] = None,
    log: Annotated[
        Optional[List[str]],
        typer.Option(
            "--log",
            help="Today's SGLang server log(s): files, folders, globs or URLs; .gz ok. Several may follow one --log.",
            show_default=False,
        ),
    ] = None,
    trace_path: Annotated[
        Optional[str], typer.Option("--trace", help="Today's trace file instead of logs (bcgtune trace -o).", show_default=False)
    ] = None,
    group: Annotated[
        Optional[List[int]],
        typer.Option(
            "--group",
            min=0,
            help="Judge only this server configuration of today's traffic, repeatable (each profile on those it agrees with; "
            "one profile alone: on these).",
            show_default=False,
        ),
    ] = None,
    match: Annotated[
        Optional[List[str]],
        typer.Option(
            "--match",
            help="PROFILE=GROUP: judge this profile (its [profile] name, file, or position 0, 1, ...) on this server "
            "configuration of today's traffic, whatever the settings its logs state; repeatable. For logs that lost "
            "their startup lines, or a profile that states too little to tell configurations apart.",
            show_default=False,
        ),
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
    tolerance: Annotated[
        Optional[float],
        typer.Option(
            "--tolerance",
            callback=tolerance_option,
            help="With a calibration. " + TOLERANCE_HELP + " Keep when the deployed list is within it of today's optimum "
            "or the gain's upper end is within --threshold; a gain is claimed only when its whole interval is above "
            "--threshold.",
            show_default=False,
        ),
    ] = None,
    write_profile: Annotated[
        Optional[str],
        typer.Option(
            "--write-profile",
            help="On a re-tune verdict, write today's optimum into this profile's \\[buckets] (atomic; it may be the "
            "--profile itself). One judged list only. On keep the file is left as it is.",
            show_default=False,
        ),
    ] = None,
    no_sglang_probe: Annotated[
        bool,
        typer.Option(
            "--no-sglang-probe",
            help="Never start the installed SGLang (by default it checks each profile's launch: about 10-20 s once, then "
            "cached); answers it gave before are still used, otherwise bcgtune's model of its rules answers and the "
            "output says the launch is not checked.",
        ),
    ] = False,
    unchecked: Unchecked = False,
    as_json: JsonFlag = False,
    quiet: Quiet = False,
    extra: Annotated[Optional[List[str]], typer.Argument(hidden=True, show_default=False)] = None,
) -> None:
    """Are the deployed bucket lists still right for today's traffic? Exit 1: re-tune.

    Compares each list with today's optimum on the traffic of its server configuration (same
    number of graphs, same alignment); with several, one table, and exit 1 if any needs
    re-tuning. Exit 0 keeps the lists, so a cron job can run it on each day's logs.
    """
    from bcgtune.cli.console import Sayer
    from bcgtune.cli.render.drift import render_drift_text, render_fleet_text
    from bcgtune.cli.render.launch import capture_line
    from bcgtune.files.profile_file import load_profile
    from bcgtune.services.drift import drift_fleet, load_traffic, parse_matches
    from bcgtune.services.launch import sglang_use

    log = _logs(log, extra, trace_path)
    if unchecked and write_profile is None:
        raise InputError("applies to --write-profile (what is written when SGLang did not check the launch)", "--unchecked")
    target = None
    if write_profile is not None:
        from bcgtune.cli.commands.suggest import _profile_target

        target = _profile_target(write_profile)
        # the profile judged may be the one rewritten: its [buckets] is updated in place
        guard.outputs(
            {"--write-profile": target}, inputs=[*(log or []), trace_path, calibration], in_place=[target, *(profile or [])]
        )
    profiles = [load_profile(p) for p in profile or []]
    trace = load_traffic(log, trace_path)
    cal = None
    if calibration:
        from bcgtune.files.calibration_file import load_calibration

        cal = load_calibration(calibration)
    priced = []  # what SGLang captures for each profile's launch, and whose answer it is

    def said(capture) -> None:
        priced.append(capture)

    pairs = parse_matches(match, profiles, len(trace.groups) or 1)
    fleet = drift_fleet(
        profiles,
        trace,
        groups=group,
        matches=pairs,
        calibration=cal,
        threshold_pct=threshold,
        tolerance_pct=tolerance,
        sglang=sglang_use(no_sglang_probe),
        say=said,
        progress=Sayer(quiet),
    )

    def doc() -> dict:
        out = fleet.to_dict()
        out.update(_launch_check(priced))
        if priced and "rows" not in out:
            out["launch_capture"] = priced[0].to_json()
        elif priced:
            out["launch_captures"] = [c.to_json() for c in priced]
        return out

    def source() -> str:  # whose answer priced each profile's launch, first
        return "".join(capture_line(c) + "\n" for c in priced)

    _vouch(target, fleet, priced, unchecked)  # before anything is printed or written
    if len(fleet.rows) == 1 and not fleet.unjudged:
        row = fleet.rows[0]
        emit(doc, lambda: source() + render_drift_text(row.report, row.batches), as_json=as_json)
    else:
        emit(doc, lambda: source() + render_fleet_text(fleet, trace.n_batches), as_json=as_json)
    if target is not None:
        _write(target, fleet, trace, profile, quiet, priced)
    if fleet.verdict == "re-tune":
        raise typer.Exit(1)  # the verdict is on stdout already (text or JSON): exit 1, nothing more
    if as_json:
        note("keep: " + "; ".join(r.report.reason for r in fleet.rows), quiet)


def _logs(log: list[str] | None, extra: list[str] | None, trace_path: str | None) -> list[str] | None:
    """Today's logs (`--log a.log b.log`, a shell glob: one value per --log, the rest arrive
    as arguments); exactly one of them and --trace."""
    if extra and log:
        log = list(log) + list(extra)
    elif extra:
        raise InputError(f"unexpected argument {extra[0][:60]!r}")
    if bool(log) == bool(trace_path):
        raise InputError("give today's traffic as --log FILE... or --trace FILE")
    return log


def _vouch(target: str | None, fleet, priced: list, unchecked: bool) -> None:
    """A list about to be written is for a launch SGLang checked, one bcgtune's model
    vouches for, or --unchecked was given (services.launch.require_vouched)."""
    if target is not None and priced and len(fleet.rows) == 1 and fleet.verdict == "re-tune":
        from bcgtune.services.launch import require_vouched

        require_vouched(priced[0], unchecked_ok=unchecked)


def _launch_check(priced: list) -> dict:
    """launch_check for --json: "not checked" when SGLang did not check any launch priced."""
    if not priced:
        return {}
    unchecked = [c for c in priced if not c.checked]
    return {
        "launch_check": "not checked" if unchecked else "checked",
        "launch_check_reason": unchecked[0].not_checked_reason if unchecked else None,
    }


def _write(target: str, fleet, trace, profiles: list[str] | None, quiet: bool, priced: list) -> None:
    """Today's optimum into the profile, on a re-tune verdict (one judged list only);
    [buckets].launch_check says whether SGLang itself checked the launch it was priced for."""
    from bcgtune.cli.commands.suggest import _unchecked_note
    from bcgtune.files.profile_file import trace_digest_provenance, write_profile_buckets
    from bcgtune.services.launch import launch_check_key

    if len(fleet.rows) != 1:
        raise InputError(
            f"{len(fleet.rows)} lists were judged: --write-profile writes one (give one --profile, or --group N)",
            "--write-profile",
        )
    rep = fleet.rows[0].report
    if rep.verdict != "re-tune":
        note(f"kept {target} as it is (verdict keep)", quiet)
        return
    base = None
    import os

    if not os.path.exists(target):
        if not profiles:
            raise InputError(f"{target} does not exist: give --profile to create it from", "--write-profile")
        base = profiles[0]
    provenance = {
        **trace_digest_provenance(trace.sources),
        "objective": "time" if rep.basis == "time" else "padding",
        "max_buckets": len(rep.optimum.metrics.buckets),
        "tool_version": __version__,
        "date": dt.date.today().isoformat(),
    }
    if priced:
        provenance["launch_check"] = launch_check_key(priced[0])
    write_profile_buckets(target, rep.optimum.metrics.buckets, provenance, base_profile=base)
    unchecked = _unchecked_note(priced[0]) if priced else ""
    note(f"wrote {len(rep.optimum.metrics.buckets)} buckets (today's optimum) to {target}{unchecked}", quiet)
