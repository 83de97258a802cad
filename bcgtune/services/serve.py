"""`bcgtune serve`: a profile's launch command (its bucket list as --cuda-graph-bs-prefill),
its flags checked against the installed SGLang's parser, then either what the launch will
capture (`--dry-run`) or the server itself, supervised, its output teed to a log file that
`bcgtune trace --log` reads afterwards.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from bcgtune.core.ladder import PrefillCapture
from bcgtune.errors import ExternalError, Interrupted

if TYPE_CHECKING:
    from bcgtune.adapters.launcher import ServerCommand
    from bcgtune.adapters.profiles import Profile

Say = Callable[[str], None]


def _silent(_: str) -> None:
    return None


@dataclass
class ServePlan:
    """A launch ready to run: the profile's name, the command, and what was said about it
    (the flag check's verdict and the command's own notes), in order."""

    profile: Profile
    cmd: ServerCommand
    notes: list[str] = field(default_factory=list)

    @property
    def profile_name(self) -> str:
        return self.profile.name


@dataclass
class DryRun:
    """`serve --dry-run`: the command and the environment it adds, and what SGLang will
    capture for it."""

    plan: ServePlan
    capture: PrefillCapture


def plan_serve(
    profile_ref: str,
    *,
    model: str | None = None,
    port: int | None = None,
    extra: Sequence[str] = (),
    python: str | None = None,
) -> ServePlan:
    """Load the profile, build the launch command and check its flags against the installed
    SGLang's parser (skipped with another interpreter, or without sglang). Raises InputError
    naming the profile key or argument SGLang refuses."""
    from bcgtune.adapters import launcher
    from bcgtune.adapters.profiles import load_profile

    prof = load_profile(profile_ref)
    cmd = launcher.build_server_command(prof, model=model, port=port, extra=list(extra), python=python)
    plan = ServePlan(prof, cmd)
    plan.notes.append(_check_flags(cmd, python))
    plan.notes += [f"note: {n}" for n in cmd.notes]
    return plan


def _check_flags(cmd, python: str | None) -> str:
    from bcgtune.adapters import launcher

    if python is not None:
        return "flag check skipped: --python runs another interpreter's SGLang"
    ok, info = launcher.sglang_check_available()
    if not ok:
        return f"flag check skipped: sglang is not importable here ({info})"
    launcher.check_command_flags(cmd)
    n = len({s.flag for s in cmd.sources})
    return f"flags checked against sglang {info}'s parser: {n} flags ok"


def dry_run(plan: ServePlan, *, model: str | None = None, probe: bool = True, say: Say = _silent) -> DryRun:
    """What SGLang will capture for the planned launch: asked of SGLang itself (`probe`),
    else bcgtune's model of its rules."""
    from bcgtune.services.launch import capture_for_profile

    if probe:
        say("bcgtune: asking the installed SGLang what it will capture (--no-sglang-probe skips this)")
    return DryRun(plan, capture_for_profile(plan.profile, model, probe=probe))


def run_server(plan: ServePlan, *, log_file: str | None, grace: float, say: Say = _silent) -> Path:
    """Run the server in the foreground until it exits; returns its log. Raises
    Interrupted (Ctrl-C, SIGTERM: the server and everything it spawned stopped) or
    ExternalError (the server failed), naming the log."""
    from bcgtune.adapters.launcher import ServerProcess, describe_exit, run_foreground

    cmd = plan.cmd
    log_path = Path(log_file) if log_file else Path.cwd() / f"{plan.profile_name}-{time.strftime('%Y%m%d-%H%M%S')}.log"
    server = ServerProcess(cmd.argv, log_path=log_path, extra_env=cmd.env, grace_s=grace)
    server.start()
    say(f"bcgtune: server pid {server.pid} started; log: {log_path}")
    rc = run_foreground(server)
    if server.stopped_by is not None:
        raise Interrupted(f"interrupted: server stopped, it {describe_exit(rc)}", f"log: {log_path}")
    if rc != 0:
        raise ExternalError(f"server {describe_exit(rc)}", f"log: {log_path}")
    say(f"bcgtune: server exited with code 0 (log: {log_path})")
    return log_path
