"""Driving the real CLI in-process, capturing its output without pytest fixtures (so that
hypothesis can call it many times in one test)."""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import time
from dataclasses import dataclass

from bcgtune.cli.app import main

# A test that runs this long has hung: the limit stops it, never judges speed (tests assert
# behaviour; speed is measured in benchmarks/, as ratios). Busy machines run 10x slower.
HANG_S = 600

README_EXIT_CODES = {0, 1, 2, 3, 4, 130}
USER_EXIT_CODES = {0, 1, 2, 3, 5, 130}  # 4 means a bug in bcgtune


@dataclass
class Result:
    code: int
    out: str
    err: str
    seconds: float


class Hung(BaseException):
    """A call ran past HANG_S."""


@contextlib.contextmanager
def hang_stop(seconds: int = HANG_S):
    """Raise Hung in this thread after `seconds` (SIGALRM; the main thread only, else nothing)."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum, frame):
        raise Hung(f"still running after {seconds} s: hung")

    old = signal.signal(signal.SIGALRM, stop)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def cli(args: list[str], stdin: str | None = None) -> Result:
    """bcgtune's real entry point in-process: exit code, stdout, stderr, wall time (for
    reports only: tests never bound it); stopped as hung after HANG_S."""
    out, err = io.StringIO(), io.StringIO()
    t0 = time.monotonic()
    code = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), hang_stop():
        try:
            main([str(a) for a in args])
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    return Result(code, out.getvalue(), err.getvalue(), time.monotonic() - t0)


def _verdict_on_stdout(r: Result) -> bool:
    """drift's re-tune verdict (exit 1): the result itself, on stdout, as text or JSON."""
    return r.code == 1 and ("verdict: RE-TUNE" in r.out or '"verdict":"re-tune"' in r.out.replace(" ", ""))


def assert_one_line_error(r: Result) -> None:
    """A failure prints exactly one `error:` line on stderr and never a traceback; a check's
    verdict that is the command's result (drift: re-tune) is printed once, on stdout, and
    no `error:` line repeats it."""
    assert "Traceback" not in r.err and "Traceback" not in r.out, r.err[-2000:]
    if _verdict_on_stdout(r):
        assert not [ln for ln in r.err.splitlines() if ln.startswith("error:")], r.err[-2000:]
    elif r.code != 0:
        lines = [ln for ln in r.err.splitlines() if ln.startswith("error:")]
        assert len(lines) == 1, r.err[-2000:]
        assert len(lines[0]) < 600, lines[0][:600]


def digest(paths) -> dict[str, str | None]:
    out = {}
    for p in paths:
        p = str(p)
        if os.path.isfile(p):
            with open(p, "rb") as fh:
                out[p] = hashlib.sha256(fh.read()).hexdigest()
        else:
            out[p] = None
    return out


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on (a moment ago)."""
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port
