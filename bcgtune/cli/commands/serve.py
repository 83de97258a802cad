"""`bcgtune serve`: launch SGLang from a profile (its bucket list as --cuda-graph-bs-prefill),
flags checked against the installed SGLang's parser, output teed to a log file that
`bcgtune trace --log` reads afterwards."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, List, Optional

import typer

from bcgtune.cli import guard
from bcgtune.cli.console import note, out
from bcgtune.cli.help import examples
from bcgtune.cli.options import ModelPath, ProfileRef, Quiet
from bcgtune.errors import ExternalError, Interrupted


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
            help="With --dry-run: do not start the installed SGLang to ask what it will capture (20-45 s); bcgtune's model of its rules answers.",
        ),
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
    from bcgtune.adapters.launcher import build_server_command
    from bcgtune.adapters.profiles import load_profile

    if log_file is not None and not dry_run:
        guard.outputs({"--log-file": log_file})
    prof = load_profile(profile)
    cmd = build_server_command(prof, model=model_path, port=port, extra=list(extra or []), python=python)
    _check_flags(cmd, python, quiet)
    for n in cmd.notes:
        note(f"note: {n}", quiet)
    if dry_run:
        out(render_dry_run(cmd, prof.name) + _prefill_lines(prof, model_path, no_sglang_probe, quiet), nl=False)
        return
    _launch(cmd, prof.name, log_file, grace, quiet)


def render_dry_run(cmd, profile_name: str) -> str:
    lines = []
    if cmd.env:
        lines.append(f"# environment added by profile {profile_name}:")
        lines.extend(f"export {line}" for line in cmd.env_lines())
    else:
        lines.append(f"# environment added by profile {profile_name}: none")
    lines.append(cmd.shell_line())
    return "\n".join(lines) + "\n"


def _prefill_lines(prof, model_path: Optional[str], no_probe: bool, quiet: bool) -> str:
    """What SGLang will capture for this launch, as shell comments under the command."""
    from bcgtune.adapters.sglang_resolve import resolve_prefill, resolve_with_model
    from bcgtune.cli.render.doctor import render_resolved_prefill

    if no_probe:
        resolved = resolve_with_model(prof, model_path, fallback_reason="--no-sglang-probe")
    else:
        note("bcgtune: asking the installed SGLang what it will capture (--no-sglang-probe skips this)", quiet)
        resolved = resolve_prefill(prof, model_path)
    return "".join(f"# {line}\n" for line in render_resolved_prefill(resolved))


def _check_flags(cmd, python: Optional[str], quiet: bool) -> None:
    from bcgtune.adapters.launcher import check_command_flags, sglang_check_available

    if python is not None:
        note("flag check skipped: --python runs another interpreter's SGLang", quiet)
        return
    ok, info = sglang_check_available()
    if not ok:
        note(f"flag check skipped: sglang is not importable here ({info})", quiet)
        return
    check_command_flags(cmd)
    n = len({s.flag for s in cmd.sources})
    note(f"flags checked against sglang {info}'s parser: {n} flags ok", quiet)


def _launch(cmd, profile_name: str, log_file: Optional[str], grace: float, quiet: bool) -> None:
    from bcgtune.adapters.launcher import ServerProcess, describe_exit, run_foreground

    log_path = Path(log_file) if log_file else Path.cwd() / f"{profile_name}-{time.strftime('%Y%m%d-%H%M%S')}.log"
    server = ServerProcess(cmd.argv, log_path=log_path, extra_env=cmd.env, grace_s=grace)
    server.start()
    note(f"bcgtune: server pid {server.pid} started; log: {log_path}", quiet)
    rc = run_foreground(server)
    if server.stopped_by is not None:
        raise Interrupted(f"interrupted: server stopped, it {describe_exit(rc)}", f"log: {log_path}")
    if rc != 0:
        raise ExternalError(f"server {describe_exit(rc)}", f"log: {log_path}")
    note(f"bcgtune: server exited with code 0 (log: {log_path})", quiet)
