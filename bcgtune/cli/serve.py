"""`bcgtune serve`: launch SGLang from a profile (its bucket list as --cuda-graph-bs-prefill),
flags checked against the installed SGLang's parser, output teed to a log file that
`bcgtune trace --log` reads afterwards."""

from __future__ import annotations

from typing import List, Optional

import typer

from bcgtune.cli.app import app


@app.command(
    "serve",
    context_settings={"allow_interspersed_args": False},
)
def serve_command(
    profile: str = typer.Option(..., "--profile", "-p", help="Built-in profile name (mi355x, h200) or a .toml path."),
    model: Optional[str] = typer.Option(None, "--model", help="Model path or hub id; overrides \\[profile].model."),
    port: Optional[int] = typer.Option(None, "--port", help="Server port (SGLang's --port)."),
    log_file: Optional[str] = typer.Option(
        None, "--log-file", help="Where the server's output is written (default ./<profile>-<timestamp>.log)."
    ),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the command and the environment it adds; launch nothing."),
    python: Optional[str] = typer.Option(
        None, "--python", help="Interpreter that runs SGLang (default: bcgtune's own). Skips the flag check."
    ),
    grace: float = typer.Option(30.0, "--grace", help="Seconds to wait after forwarding a signal before SIGKILL."),
    extra: Optional[List[str]] = typer.Argument(None, help="Extra SGLang flags, after `--`.", metavar="[-- EXTRA...]"),
) -> None:
    """Launch an SGLang server from a profile."""
    import sys

    from bcgtune.adapters.launcher import build_server_command
    from bcgtune.adapters.profiles import load_profile
    from bcgtune.errors import InputError

    if port is not None and not (0 < port < 65536):
        raise InputError(f"port must be 1..65535, got {port}", "--port")
    if grace < 0:
        raise InputError("grace must not be negative", "--grace")
    prof = load_profile(profile)
    cmd = build_server_command(prof, model=model, port=port, extra=list(extra or []), python=python)
    _check_flags(cmd, python)
    for note in cmd.notes:
        typer.echo(f"note: {note}", err=True)
    if dry_run:
        typer.echo(render_dry_run(cmd, prof.name), nl=False)
        return
    sys.exit(_launch(cmd, prof.name, log_file, grace))


def render_dry_run(cmd, profile_name: str) -> str:
    lines = []
    if cmd.env:
        lines.append(f"# environment added by profile {profile_name}:")
        lines.extend(f"export {line}" for line in cmd.env_lines())
    else:
        lines.append(f"# environment added by profile {profile_name}: none")
    lines.append(cmd.shell_line())
    return "\n".join(lines) + "\n"


def _check_flags(cmd, python: Optional[str]) -> None:
    from bcgtune.adapters.launcher import check_command_flags, sglang_check_available

    if python is not None:
        typer.echo("flag check skipped: --python runs another interpreter's SGLang", err=True)
        return
    ok, info = sglang_check_available()
    if not ok:
        typer.echo(f"flag check skipped: sglang is not importable here ({info})", err=True)
        return
    check_command_flags(cmd)
    n = len({s.flag for s in cmd.sources})
    typer.echo(f"flags checked against sglang {info}'s parser: {n} flags ok", err=True)


def _launch(cmd, profile_name: str, log_file: Optional[str], grace: float) -> int:
    import time
    from pathlib import Path

    from bcgtune.adapters.launcher import ServerProcess, describe_exit, exit_status, run_foreground

    log_path = Path(log_file) if log_file else Path.cwd() / f"{profile_name}-{time.strftime('%Y%m%d-%H%M%S')}.log"
    server = ServerProcess(cmd.argv, log_path=log_path, extra_env=cmd.env, grace_s=grace)
    server.start()
    typer.echo(f"bcgtune: server pid {server.pid} started; log: {log_path}", err=True)
    rc = run_foreground(server)
    if server.stopped_by is not None:
        typer.echo(f"bcgtune: server stopped on request, {describe_exit(rc)} (log: {log_path})", err=True)
    elif rc != 0:
        typer.echo(f"error: server {describe_exit(rc)} (log: {log_path})", err=True)
    else:
        typer.echo(f"bcgtune: server exited with code 0 (log: {log_path})", err=True)
    return exit_status(rc)
