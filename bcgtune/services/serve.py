"""`bcgtune serve`: a profile's launch command (its bucket list as --cuda-graph-bs-prefill),
its flags checked against the installed SGLang's parser, then either what the launch will
capture (`--dry-run`) or the server itself, supervised, its output teed to a log file that
`bcgtune trace --log` reads afterwards.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from bcgtune.core.capture import PrefillCapture
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
    skipped_by: str | None = None,
    refresh: bool = False,
    say: Say = _silent,
) -> ServePlan:
    """Load the profile, build the launch command and check its flags against the installed
    SGLang's parser, in a child process (its verdict is cached; `skipped_by`: the user's
    reason not to start SGLang, then only a cached verdict is used). Skipped with another
    interpreter (--python) or without sglang. Raises InputError naming the profile key or
    argument SGLang refuses."""
    from bcgtune.adapters import launcher
    from bcgtune.adapters.profiles import load_profile

    prof = load_profile(profile_ref)
    cmd = launcher.build_server_command(prof, model=model, port=port, extra=list(extra), python=python)
    plan = ServePlan(prof, cmd)
    plan.notes.append(_check_flags(cmd, python, skipped_by, refresh, say))
    plan.notes += [f"note: {n}" for n in cmd.notes]
    return plan


def _check_flags(cmd: ServerCommand, python: str | None, skipped_by: str | None, refresh: bool, say: Say) -> str:
    from bcgtune.adapters.sglang_resolve import sglang_installed
    from bcgtune.errors import InputError
    from bcgtune.services.launch import check_flags

    if python is not None:
        return "flag check skipped: --python runs another interpreter's SGLang"
    if not sglang_installed():
        return f"flag check skipped: sglang is not installed here ({SGLANG_INSTALL_HINT})"
    verdict = check_flags(cmd, skipped_by=skipped_by, refresh=refresh, say=say)
    if verdict.ok is False:
        raise InputError(verdict.message or "SGLang refuses the launch", verdict.where)
    if verdict.ok is None:
        return f"flag check skipped: {verdict.message}"
    n = len({s.flag for s in cmd.sources})
    cached = f" (answer cached {verdict.cached_at}; --refresh asks again)" if verdict.cached_at else ""
    return f"flags checked against sglang {verdict.version or 'unknown version'}'s parser: {n} flags ok{cached}"


SGLANG_INSTALL_HINT = "pip install 'bcgtune[sglang]', or --python for an interpreter that has it"


def dry_run(
    plan: ServePlan,
    *,
    model: str | None = None,
    skipped_by: str | None = None,
    refresh: bool = False,
    say: Say = _silent,
) -> DryRun:
    """What SGLang will capture for the planned launch: SGLang's own answer (cached, or
    asked in a child process unless `skipped_by` says why not), else bcgtune's model of its
    rules, which says what it could not check."""
    from bcgtune.services.launch import capture_for_profile

    return DryRun(plan, capture_for_profile(plan.profile, model, skipped_by=skipped_by, refresh=refresh, say=say))


def run_server(plan: ServePlan, *, log_file: str | None, grace: float, say: Say = _silent) -> Path:
    """Run the server in the foreground until it exits; returns its log. Raises
    Interrupted (Ctrl-C, SIGTERM: the server and everything it spawned stopped) or
    ExternalError (the server failed), naming the log."""
    from bcgtune.adapters.launcher import ServerProcess, describe_exit, run_foreground

    cmd = plan.cmd
    _require_sglang(cmd)
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


def _require_sglang(cmd: ServerCommand) -> None:
    """bcgtune's own interpreter runs the server: without sglang it would start and fail."""
    from bcgtune.adapters.launcher import SGLANG_MODULE
    from bcgtune.adapters.sglang_resolve import sglang_installed

    if cmd.argv[0] == sys.executable and SGLANG_MODULE in cmd.argv[:3] and not sglang_installed():
        raise ExternalError(f"sglang is not installed for {sys.executable}: {SGLANG_INSTALL_HINT}", "serve")
