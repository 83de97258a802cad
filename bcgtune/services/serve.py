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

from bcgtune.core.sglang.capture import PrefillCapture
from bcgtune.errors import ExternalError, Interrupted

if TYPE_CHECKING:
    from bcgtune.adapters.sglang.launcher import ServerCommand
    from bcgtune.files.profile_file import Profile

Say = Callable[[str], None]


def _silent(_: str) -> None:
    return None


@dataclass
class ServePlan:
    """A launch ready to run: the profile, the command, and what was said about it (the
    flag check's verdict and the command's own notes), in order; with a dry run, also what
    SGLang will capture (`capture`)."""

    profile: Profile
    cmd: ServerCommand
    notes: list[str] = field(default_factory=list)
    capture: PrefillCapture | None = None

    @property
    def profile_name(self) -> str:
        return self.profile.name


@dataclass
class DryRun:
    """`serve --dry-run`: the command and the environment it adds, and what SGLang will
    capture for it."""

    plan: ServePlan
    capture: PrefillCapture


SGLANG_INSTALL_HINT = "pip install 'bcgtune[sglang]', or --python for an interpreter that has it"


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
    capture: bool = False,
) -> ServePlan:
    """Load the profile, build the launch command and check its flags against the installed
    SGLang's parser (bcgtune never imports SGLang itself: a child process answers, and its
    verdict is cached). With `capture`, the same child also answers what the launch
    captures (else bcgtune's model of SGLang's rules does). `skipped_by`: the user's reason
    not to start SGLang (then only cached answers are used). The flag check is skipped with
    another interpreter (--python) or without sglang. Raises InputError naming the profile
    key or argument SGLang refuses."""
    from bcgtune.adapters.sglang import launcher
    from bcgtune.adapters.sglang.resolve import sglang_installed
    from bcgtune.errors import InputError
    from bcgtune.files.profile_file import load_profile
    from bcgtune.services.launch import answers_for_profile

    prof = load_profile(profile_ref)
    cmd = launcher.build_server_command(prof, model=model, port=port, extra=list(extra), python=python)
    plan = ServePlan(prof, cmd)
    check = python is None and sglang_installed()
    answers = answers_for_profile(
        prof,
        model,
        sglang="ask" if (check or capture) else "never",
        skipped_by=skipped_by,
        refresh=refresh,
        check_flags=check,
        # the launch is resolved by the same child that checks its flags: SGLang's own refusal
        # stops here, before a server start that would fail minutes later
        resolve=capture or check,
        say=say,
        flags_cmd=cmd,
    )
    if python is not None:
        plan.notes.append("flag check skipped: --python runs another interpreter's SGLang")
    elif not check:
        plan.notes.append(f"flag check skipped: sglang is not installed here ({SGLANG_INSTALL_HINT})")
    else:
        verdict = answers.flags
        if verdict.ok is False:
            raise InputError(verdict.message or "SGLang refuses the launch", verdict.where)
        if verdict.ok is None:
            plan.notes.append(f"flag check skipped: {verdict.message}")
        else:
            n = len({s.flag for s in cmd.sources})
            cached = f" (answer cached {verdict.cached_at}; --refresh asks again)" if verdict.cached_at else ""
            plan.notes.append(
                f"flags checked against sglang {verdict.version or 'unknown version'}'s parser: {n} flags ok{cached}"
            )
    plan.notes += [f"note: {n}" for n in cmd.notes]
    from bcgtune.services.launch import refuse_refused

    if capture:
        plan.capture = answers.capture_or_raise()
        refuse_refused(plan.capture, prof.where)
    elif answers.capture is not None and answers.capture.checked:
        # starting the server: SGLang's own refusal stops it (the model's is not enough to
        # refuse a start, SGLang judges that itself in a moment)
        refuse_refused(answers.capture, prof.where)
    return plan


def dry_run(plan: ServePlan) -> DryRun:
    """`serve --dry-run`: the planned launch and what it captures (plan_serve with
    capture=True asked it)."""
    if plan.capture is None:
        raise ValueError("plan_serve(..., capture=True) answers what a dry run prints")
    return DryRun(plan, plan.capture)


def run_server(plan: ServePlan, *, log_file: str | None, grace: float, say: Say = _silent) -> Path:
    """Run the server in the foreground until it exits; returns its log. Raises
    Interrupted (Ctrl-C, SIGTERM: the server and everything it spawned stopped) or
    ExternalError (the server failed), naming the log."""
    from bcgtune.adapters.sglang.launcher import ServerProcess, describe_exit, run_foreground

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
    from bcgtune.adapters.sglang.launcher import SGLANG_MODULE
    from bcgtune.adapters.sglang.resolve import sglang_installed

    if cmd.argv[0] == sys.executable and SGLANG_MODULE in cmd.argv[:3] and not sglang_installed():
        raise ExternalError(f"sglang is not installed for {sys.executable}: {SGLANG_INSTALL_HINT}", "serve")
