"""`bcgtune serve`: options, one call into bcgtune.services.serve, the result rendered."""

from __future__ import annotations

from typing import Annotated, List, Optional

import typer

from bcgtune.cli import guard
from bcgtune.cli.console import note, out
from bcgtune.cli.help import examples
from bcgtune.cli.options import ModelPath, ProfileRef, Quiet


@examples(
    "bcgtune serve --profile mi355x --dry-run",
    "bcgtune serve -p h200.toml --log-file run.log -- --port 30001",
)
def serve_command(
    profile: ProfileRef,
    model_path: ModelPath = None,
    port: Annotated[
        Optional[int],
        typer.Option(
            "--port",
            min=1,
            max=65535,
            help="Server port (SGLang's --port). Default: the profile's, else SGLang's.",
            show_default=False,
        ),
    ] = None,
    log_file: Annotated[
        Optional[str],
        typer.Option(
            "--log-file", help="Where the server's output is appended. Default: ./<profile>-<time>.log.", show_default=False
        ),
    ] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Print the command and the environment it adds; launch nothing.")
    ] = False,
    python: Annotated[
        Optional[str],
        typer.Option(
            "--python", help="Interpreter that runs SGLang (skips the flag check). Default: bcgtune's own.", show_default=False
        ),
    ] = None,
    grace: Annotated[
        float,
        typer.Option("--grace", min=0.0, max=3600.0, help="Seconds to wait after forwarding Ctrl-C/SIGTERM before SIGKILL."),
    ] = 30.0,
    no_sglang_probe: Annotated[
        bool,
        typer.Option(
            "--no-sglang-probe",
            help="Never start the installed SGLang to check the launch first (a first answer takes about 10-20 s, a cached "
            "one under a second); answers it gave before are still used, otherwise bcgtune's model of its rules answers, "
            "the flags are not checked and the output says so.",
        ),
    ] = False,
    refresh: Annotated[
        bool,
        typer.Option("--refresh", help="Ask the installed SGLang again instead of using its cached answers."),
    ] = False,
    extra: Annotated[
        Optional[List[str]], typer.Argument(help="Extra SGLang flags, after `--`.", metavar="[-- EXTRA...]", show_default=False)
    ] = None,
    quiet: Quiet = False,
) -> None:
    """Launch an SGLang server from a profile, flags checked against SGLang's parser.

    Exit 3 if the server fails, 130 on Ctrl-C (the server and everything it spawned are
    stopped).
    """
    from bcgtune.cli.render.serve import render_dry_run
    from bcgtune.services import serve

    if log_file is not None and not dry_run:
        guard.outputs({"--log-file": log_file}, inputs=[profile])  # the log is appended to: never the profile
    from bcgtune.cli.console import Sayer

    skipped_by = "--no-sglang-probe" if no_sglang_probe else None
    plan = serve.plan_serve(
        profile,
        model=model_path,
        port=port,
        extra=list(extra or []),
        python=python,
        skipped_by=skipped_by,
        refresh=refresh,
        say=Sayer(quiet),
        capture=dry_run,
    )
    for line in plan.notes:
        note(line, quiet)
    if dry_run:
        out(render_dry_run(serve.dry_run(plan)), nl=False)
        return
    serve.run_server(plan, log_file=log_file, grace=grace, say=lambda m: note(m, quiet))
