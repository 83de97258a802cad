"""One error hierarchy. The library raises these; the CLI prints `error: <what> (<where>)`
on one line to stderr and exits with the class's code. Never a traceback for user mistakes.

Exit codes (documented in the README):
  1  a check ran and failed (validate, doctor, bench significance gates, drift)
  2  bad input: a file, field, flag or value the user gave is wrong
  3  an external step failed: the server, the GPU, a child process, the disk
  4  an internal error (a bug in bcgtune); the message says how to see the traceback
  5  not checked: SGLang's own answer was not obtained (not asked, timed out, did not
     import, its answer cache locked), so no verdict is given (doctor)
  130 interrupted (Ctrl-C or SIGTERM)

`field` names the input in domain terms (`max_buckets`, `padding_factor`): the library does
not know which flag or key carried it. The CLI turns it into the flag's name, once, at its
boundary (bcgtune/cli/app.py)."""

from __future__ import annotations

MAX_QUOTE = 80


def quote(value: object, limit: int = MAX_QUOTE) -> str:
    """repr() of a user's value, cut to `limit` characters: an error line never carries a
    whole hostile input."""
    try:
        text = repr(value)
    except ValueError:  # an int too long for str() (sys.get_int_max_str_digits)
        text = f"<an integer of {value.bit_length()} bits>" if isinstance(value, int) else "<unprintable>"
    if len(text) > limit:
        text = text[: limit - 3] + "..."
    return text


class BcgError(Exception):
    exit_code = 2

    def __init__(self, what: str, where: str | None = None, *, field: str | None = None):
        super().__init__(what)
        self.what = what
        self.where = where
        self.field = field

    def __str__(self) -> str:
        where = self.where or self.field
        return f"{self.what} ({where})" if where else self.what


class InputError(BcgError):
    """The user's input is wrong: file missing or malformed, bad flag value."""

    exit_code = 2


class CheckFailed(BcgError):
    """A check ran to completion and its verdict is negative."""

    exit_code = 1


class ExternalError(BcgError):
    """Something outside bcgtune failed: a server, a GPU, a child process, the disk."""

    exit_code = 3


class NotChecked(BcgError):
    """A check could not run (SGLang not asked, timed out, failed to import, the answer
    cache locked): no verdict, never "ok"."""

    exit_code = 5


class Interrupted(BcgError):
    """Ctrl-C or SIGTERM (exit 130): whatever ran was stopped and nothing was half-written."""

    exit_code = 130
