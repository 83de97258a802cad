"""Helpers shared by the tests that start processes or call the CLI in-process."""

from __future__ import annotations

import os

from bcgtune.cli.app import main


def pid_alive(pid: int) -> bool:
    """True while `pid` runs. A zombie still answers kill(0) but holds no GPU: it counts as gone.
    The state field follows the `(comm)` field, which may itself contain spaces."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(") ", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def proc_table() -> dict[int, tuple[str, int, int]]:
    """pid -> (state, parent pid, process group) of every process, read from /proc (a
    process that ends while it is read is left out)."""
    table: dict[int, tuple[str, int, int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                fields = fh.read().rsplit(") ", 1)[1].split()
            table[int(entry)] = (fields[0], int(fields[1]), int(fields[2]))
        except (OSError, IndexError, ValueError):
            continue
    return table


def gone(pid: int, limit_s: float = 600.0) -> bool:
    """True once `pid` has stopped running. A kill is delivered asynchronously: a process just
    sent SIGKILL may run a moment longer, longer still on a busy machine, so this waits for it
    (up to `limit_s`, a hang stop, not a speed bound) instead of looking once."""
    import time

    end = time.monotonic() + limit_s
    while pid_alive(pid):
        if time.monotonic() > end:
            return False
        time.sleep(0.02)
    return True


def run_cli(args, capsys):
    """bcgtune's real entry point in-process: (exit code, stdout, stderr)."""
    try:
        main(args)
        code = 0
    except SystemExit as exc:
        code = exc.code or 0
    out, err = capsys.readouterr()
    return code, out, err
