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


def run_cli(args, capsys):
    """bcgtune's real entry point in-process: (exit code, stdout, stderr)."""
    try:
        main(args)
        code = 0
    except SystemExit as exc:
        code = exc.code or 0
    out, err = capsys.readouterr()
    return code, out, err
