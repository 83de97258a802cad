"""`bcgtune doctor`: Python / torch / sglang, the platform's default prefill backend, the
installed prefill runner's multimodal gate, and (with a profile) what would disappoint at
launch. Exit 0 when nothing blocks, 1 when something does (CI can gate on it)."""

from __future__ import annotations

from typing import Optional

import typer

from bcgtune.cli.app import app


@app.command("doctor")
def doctor_command(
    profile: Optional[str] = typer.Option(None, "--profile", "-p", help="Built-in profile name or a .toml path."),
    model: Optional[str] = typer.Option(None, "--model", help="Model path or id; overrides \\[profile].model."),
    runner: Optional[str] = typer.Option(
        None, "--runner-source", help="Check this prefill_cuda_graph_runner.py instead of the installed one."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Check the installed SGLang (and a profile) for prefill CUDA-graph problems."""
    import json

    from bcgtune.adapters.doctor import render_text, run_doctor
    from bcgtune.errors import CheckFailed

    prof = None
    if profile is not None:
        from bcgtune.adapters.profiles import load_profile

        prof = load_profile(profile)
    report = run_doctor(prof, runner_path=runner, model=model)
    if as_json:
        typer.echo(json.dumps(report.to_dict(), separators=(",", ":")))
    else:
        typer.echo(render_text(report), nl=False)
    if report.blocking:
        n = len(report.blocking)
        raise CheckFailed(f"{n} blocking finding{'s' if n > 1 else ''}: {', '.join(f.code for f in report.blocking)}", "doctor")
