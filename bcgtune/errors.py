"""One error hierarchy. The library raises these; the CLI prints `error: <what> (<where>)`
on one line to stderr and exits with the class's code. Never a traceback for user mistakes.

Exit codes (documented in the README):
  1  a check ran and failed (validate, doctor, bench significance gates)
  2  bad input: a file, field, flag or value the user gave is wrong
  3  an external step failed: the server, the GPU, a child process
"""

from __future__ import annotations


class BcgError(Exception):
    exit_code = 2

    def __init__(self, what: str, where: str | None = None):
        super().__init__(what)
        self.what = what
        self.where = where

    def __str__(self) -> str:
        return f"{self.what} ({self.where})" if self.where else self.what


class InputError(BcgError):
    """The user's input is wrong: file missing or malformed, bad flag value."""

    exit_code = 2


class CheckFailed(BcgError):
    """A check ran to completion and its verdict is negative."""

    exit_code = 1


class ExternalError(BcgError):
    """Something outside bcgtune failed: a server, a GPU, a child process."""

    exit_code = 3
