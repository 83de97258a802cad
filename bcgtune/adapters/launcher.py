"""Run an LLM server as a supervised child process: its own process group, its output
teed to the terminal and a log file, signals forwarded, the whole group reaped.

Library use (issue 6 builds `trace --live` and `bench` on this):

    with ServerProcess(argv, log_path="run.log", extra_env={"X": "1"}) as server:
        server.wait_healthy("http://127.0.0.1:30000", timeout=900)
        ...                                   # talk to the server
    # leaving the block stops the server (SIGTERM, then SIGKILL after a grace period)
    print(server.returncode, server.log_path)

Why a process group: SGLang's launcher spawns scheduler/detokenizer subprocesses that
hold the GPUs. Signalling only the leader can leave them behind, so every signal goes to
the group (killpg), and after the leader exits the group is swept with SIGKILL.
The HTTP health check is stdlib-only (urllib) so the library stays light.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import IO, Mapping, Sequence

from bcgtune.errors import ExternalError, InputError

DEFAULT_GRACE_S = 30.0


def exit_status(returncode: int | None) -> int:
    """Shell-style exit status for a child's returncode (signal N -> 128 + N)."""
    if returncode is None:
        return 1
    return 128 - returncode if returncode < 0 else returncode


def describe_exit(returncode: int | None) -> str:
    if returncode is None:
        return "is still running"
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"was killed by {name}"
    return f"exited with code {returncode}"


class ServerProcess:
    """A child process in its own session/process group, output teed to `log_path`.

    argv: the full command (argv[0] is the program). extra_env: variables added to this
    process's environment. echo: where the child's output is mirrored (default
    sys.stdout's binary buffer; None for nowhere). grace_s: how long stop() waits after
    SIGTERM before SIGKILL.
    """

    def __init__(
        self,
        argv: Sequence[str],
        *,
        log_path: str | os.PathLike | None = None,
        extra_env: Mapping[str, str] | None = None,
        echo: IO[bytes] | None | str = "stdout",
        grace_s: float = DEFAULT_GRACE_S,
        cwd: str | os.PathLike | None = None,
    ):
        if not argv:
            raise InputError("empty server command")
        self.argv = [str(a) for a in argv]
        self.log_path: Path | None = Path(log_path) if log_path is not None else None
        self.extra_env = dict(extra_env or {})
        self._echo_target = echo
        self.grace_s = grace_s
        self.cwd = cwd
        self.proc: subprocess.Popen | None = None
        self._pump: threading.Thread | None = None
        self._log_fh: IO[bytes] | None = None
        # The signal that stopped the server when we (or the user, through us) asked it
        # to stop; None when it exited on its own.
        self.stopped_by: int | None = None

    # -- lifecycle -------------------------------------------------------------------
    def start(self) -> "ServerProcess":
        if self.proc is not None:
            raise InputError("server process already started")
        env = os.environ.copy()
        env.update(self.extra_env)
        if self.log_path is not None:
            parent = self.log_path.parent
            if not parent.is_dir():
                raise InputError("log folder does not exist", str(parent))
            try:
                self._log_fh = open(self.log_path, "ab")
            except OSError as exc:
                raise InputError(f"cannot write log: {exc.strerror}", str(self.log_path)) from None
        try:
            self.proc = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=self.cwd,
                start_new_session=True,  # own session + process group: pgid == pid
            )
        except OSError as exc:
            self._close_log()
            raise ExternalError(f"cannot start {self.argv[0]}: {exc.strerror}", self.argv[0]) from None
        self._pump = threading.Thread(target=self._pump_output, name="server-output", daemon=True)
        self._pump.start()
        return self

    def __enter__(self) -> "ServerProcess":
        if self.proc is None:
            self.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    @property
    def returncode(self) -> int | None:
        return self.proc.poll() if self.proc is not None else None

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def send_signal(self, sig: int) -> None:
        """Signal the whole process group (the server and everything it spawned)."""
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def wait(self, timeout: float | None = None) -> int | None:
        """Wait for the leader to exit (None on timeout); then sweep the group and
        flush the log."""
        if self.proc is None:
            return None
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None
        self._finish()
        return rc

    def stop(self, grace_s: float | None = None) -> int | None:
        """SIGTERM the group, wait `grace_s`, then SIGKILL; reap. Idempotent."""
        if self.proc is None:
            return None
        grace = self.grace_s if grace_s is None else grace_s
        if self.proc.poll() is None:
            self.stopped_by = signal.SIGTERM
            self.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(grace)
            except subprocess.TimeoutExpired:
                self.send_signal(signal.SIGKILL)
                self.proc.wait()
        self._finish()
        return self.proc.returncode

    def kill(self) -> int | None:
        if self.proc is None:
            return None
        self.send_signal(signal.SIGKILL)
        self.proc.wait()
        self._finish()
        return self.proc.returncode

    def _finish(self) -> None:
        # The leader is gone; anything left in its group is an orphan that may hold a GPU.
        self.send_signal(signal.SIGKILL)
        if self._pump is not None:
            self._pump.join(timeout=5.0)
        self._close_log()

    # -- health ----------------------------------------------------------------------
    def wait_healthy(self, url: str, timeout: float, *, path: str = "/health", interval: float = 1.0) -> float:
        """Poll GET url+path until it answers 200. Returns the seconds waited. Raises
        ExternalError if the server exits first or `timeout` passes (naming the log)."""
        if self.proc is None:
            raise InputError("server process not started")
        target = url.rstrip("/") + path
        start = time.monotonic()
        deadline = start + timeout
        while True:
            rc = self.proc.poll()
            if rc is not None:
                self._finish()
                raise ExternalError(f"server {describe_exit(rc)} before it became healthy", self._where())
            if http_ok(target, timeout=min(5.0, max(0.1, deadline - time.monotonic()))):
                return time.monotonic() - start
            if time.monotonic() >= deadline:
                raise ExternalError(f"server not healthy at {target} after {timeout:g} s", self._where())
            time.sleep(min(interval, max(0.0, deadline - time.monotonic())))

    def _where(self) -> str:
        return f"log: {self.log_path}" if self.log_path is not None else f"pid {self.pid}"

    # -- output ----------------------------------------------------------------------
    def _echo_stream(self) -> IO[bytes] | None:
        if self._echo_target == "stdout":
            return getattr(sys.stdout, "buffer", None)
        return self._echo_target  # type: ignore[return-value]

    def _pump_output(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        echo = self._echo_stream()
        while True:
            try:
                chunk = os.read(fd, 65536)
            except OSError:
                break
            if not chunk:
                break
            if self._log_fh is not None:
                try:
                    self._log_fh.write(chunk)
                    self._log_fh.flush()
                except (OSError, ValueError):
                    pass
            if echo is not None:
                try:
                    echo.write(chunk)
                    echo.flush()
                except (OSError, ValueError):
                    echo = None
        try:
            self.proc.stdout.close()
        except OSError:
            pass

    def _close_log(self) -> None:
        if self._log_fh is not None:
            try:
                self._log_fh.close()
            except OSError:
                pass
            self._log_fh = None


def http_ok(url: str, timeout: float = 5.0) -> bool:
    """True when GET `url` answers 2xx. Connection errors and 5xx (SGLang answers 503
    while starting) are False."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:  # noqa: S310 (local URL)
            return 200 <= resp.status < 300
    except (urllib.error.URLError, OSError, ValueError):
        return False


def run_foreground(server: ServerProcess) -> int:
    """Run `server` until it exits, forwarding SIGINT/SIGTERM to its group (a second
    signal, or the grace period running out, escalates to SIGKILL). Returns the child's
    returncode (negative for a signal, as subprocess reports it). Must run in the main
    thread (signal handlers)."""
    if server.proc is None:
        server.start()
    received: list[int] = []
    deadline: list[float] = []

    def forward(signum, _frame):
        if received:
            server.send_signal(signal.SIGKILL)
        else:
            server.send_signal(signum)
            deadline.append(time.monotonic() + server.grace_s)
        received.append(signum)

    old = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        while True:
            rc = server.wait(timeout=0.2)
            if rc is not None:
                break
            if deadline and time.monotonic() > deadline[0]:
                server.send_signal(signal.SIGKILL)
                deadline.clear()
    except BaseException:
        server.stop(grace_s=min(server.grace_s, 5.0))
        raise
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    if received:
        server.stopped_by = received[0]
    return server.proc.returncode  # type: ignore[union-attr]
