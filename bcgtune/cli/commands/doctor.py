"""`bcgtune doctor`: options, one call into bcgtune.services.doctor, the report rendered.
Three outcomes (CI can gate on them): exit 0 when SGLang answered everything and nothing
blocks, 1 when something blocks, 5 when SGLang's own answer is missing for part of it (not
checked: never ok)."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from bcgtune.cli.console import Sayer, emit
from bcgtune.cli.help import examples
from bcgtune.cli.options import JsonFlag, ModelPath, Quiet
from bcgtune.errors import CheckFailed, NotChecked


@examples("bcgtune doctor", "bcgtune doctor --profile mi355x --json")
def doctor_command(
    profile: Annotated[
        Optional[str],
        typer.Option("--profile", "-p", help="Also check this profile (built-in name or .toml).", show_default=False),
    ] = None,
    model_path: ModelPath = None,
    runner_source: Annotated[
        Optional[str],
        typer.Option(
            "--runner-source", help="Check this prefill_cuda_graph_runner.py instead of the installed one.", show_default=False
        ),
    ] = None,
    no_sglang_probe: Annotated[
        bool,
        typer.Option(
            "--no-sglang-probe",
            help="Never start the installed SGLang (a first answer takes about 10-20 s, a cached one under a second): answers it "
            "gave before are still used, otherwise bcgtune's model of its rules answers, the runner is not checked (what "
            "its source reads as is shown beside it), and the outcome is 'not checked' (exit 5).",
        ),
    ] = False,
    probe_timeout: Annotated[
        Optional[float],
        typer.Option(
            "--probe-timeout",
            metavar="SECONDS",
            help="How long SGLang may take to answer (default $BCGTUNE_PROBE_TIMEOUT, else 300). Past it the outcome is "
            "'not checked' (exit 5), never ok.",
            show_default=False,
        ),
    ] = None,
    refresh: Annotated[
        bool,
        typer.Option("--refresh", help="Ask the installed SGLang again instead of using its cached answers."),
    ] = False,
    as_json: JsonFlag = False,
    quiet: Quiet = False,
) -> None:
    """Check the installed SGLang and a profile for prefill CUDA-graph problems.

    Exit 0: SGLang answered and nothing blocks. Exit 1: something blocks. Exit 5: not
    checked (SGLang not asked, timed out, did not import, its answer cache locked), never ok;
    the report says how to get its answer.
    """
    from bcgtune.cli.render.doctor import render_text
    from bcgtune.files.profile_file import load_profile
    from bcgtune.services.doctor import run_doctor

    prof = load_profile(profile) if profile is not None else None
    report = run_doctor(
        prof,
        runner_path=runner_source,
        model=model_path,
        skipped_by="--no-sglang-probe" if no_sglang_probe else None,
        refresh=refresh,
        probe_timeout=probe_timeout,
        say=Sayer(quiet),
    )
    emit(report.to_json, lambda: render_text(report), as_json=as_json)
    if report.blocking:
        n = len(report.blocking)
        raise CheckFailed(f"{n} blocking finding{'s' if n > 1 else ''}: {', '.join(f.code for f in report.blocking)}", "doctor")
    if report.outcome == "not checked":
        raise NotChecked(
            f"not checked: SGLang did not answer for {len(report.not_checked)} of the things doctor judges; "
            + "; ".join(report.how_to_check[:1]),
            "doctor",
        )
