"""Run an LLM server as a supervised child process: its own process group, its output
teed to the terminal and a log file, signals forwarded, the whole group reaped.

Library use (`trace --live`, `validate --server` and `bench` are built on this):

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
from bcgtune.procenv import child_environ


def die_with_parent():
    """A preexec_fn for Popen: the child gets SIGKILL when this process dies, however it dies
    (a SIGKILL gives bcgtune no chance to stop it; the child runs in its own session, so
    nothing else would). Linux only (prctl PR_SET_PDEATHSIG); None elsewhere. The C function
    is looked up here, before the fork: the child only calls it."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def preexec() -> None:
        prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
        if os.getppid() != parent:  # the parent died before the line above took effect
            os._exit(1)

    return preexec


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
        env = child_environ()
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
                preexec_fn=die_with_parent(),
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


# --------------------------------------------------------------------------- SGLang command
SGLANG_MODULE = "sglang.launch_server"


class FlagSource:
    """Where a flag came from, for error messages: a profile key or a command argument."""

    def __init__(self, flag: str, origin: str, value=None, from_profile: bool = False):
        self.flag = flag
        self.origin = origin
        self.value = value
        self.from_profile = from_profile


class ServerCommand:
    """A launch: argv, the environment it adds, and where each flag came from."""

    def __init__(self, argv: list[str], env: dict[str, str], sources: list[FlagSource], notes: list[str]):
        self.argv = argv
        self.env = env
        self.sources = sources
        self.notes = notes

    def shell_line(self) -> str:
        import shlex

        return shlex.join(self.argv)

    def env_lines(self) -> list[str]:
        import shlex

        return [f"{k}={shlex.quote(v)}" for k, v in self.env.items()]


def _value_tokens(value) -> list[str]:
    if isinstance(value, list):
        return [_scalar_token(v) for v in value]
    return [_scalar_token(value)]


def _scalar_token(v) -> str:
    if isinstance(v, float) and v.is_integer():
        return repr(v)  # keep "0.9" style, never "1" for 1.0
    return str(v)


def _is_flag_token(tok: str) -> bool:
    if not tok.startswith("-") or tok == "-" or tok == "--":
        return False
    try:
        float(tok)
        return False  # a negative number is a value
    except ValueError:
        return True


def build_server_command(
    profile,
    *,
    model: str | None = None,
    port: int | None = None,
    extra: Sequence[str] = (),
    python: str | None = None,
) -> ServerCommand:
    """`python -m sglang.launch_server` for a profile: --model-path, the [server] flags in
    file order, --cuda-graph-bs-prefill from [buckets].list, --port, then EXTRA (which
    argparse lets win over earlier flags; a note says so)."""
    from bcgtune.files.profile_file import flag_name

    where = profile.where
    model_path = model or profile.model
    if not model_path:
        raise InputError("no model: set [profile].model or pass --model-path", where)
    argv = [python or sys.executable, "-m", SGLANG_MODULE, "--model-path", model_path]
    sources = [
        FlagSource("--model-path", "--model-path" if model else f"{where}: [profile].model", model_path, from_profile=not model)
    ]
    for key, value in profile.server.items():
        flag = flag_name(key)
        if key == "port" and port is not None:
            continue
        src = FlagSource(flag, f"{where}: [server].{key.replace('_', '-')}", value, from_profile=True)
        sources.append(src)
        if value is False:
            continue  # documented: false == key left out
        argv.append(flag)
        if value is not True:
            argv.extend(_value_tokens(value))
    if profile.buckets is not None:
        argv.append("--cuda-graph-bs-prefill")
        argv.extend(str(b) for b in profile.buckets)
        sources.append(FlagSource("--cuda-graph-bs-prefill", f"{where}: [buckets].list", profile.buckets, True))
    if port is not None:
        argv.extend(["--port", str(port)])
        sources.append(FlagSource("--port", "--port", port))
    notes = []
    earlier = {s.flag for s in sources}
    for tok in extra:
        if _is_flag_token(tok):
            name = tok.split("=", 1)[0]
            sources.append(FlagSource(name, f"argument {tok}"))
            if name in earlier:
                notes.append(f"extra argument {name} overrides the same flag set earlier (argparse keeps the last)")
    argv.extend(extra)
    return ServerCommand(argv, dict(profile.env), sources, notes)


class _ParseError(Exception):
    pass


def _sglang_parser():
    """SGLang's real launch parser with abbreviations off. Imports sglang (heavy): only
    called on the serve path."""
    import argparse

    from sglang.srt.server_args import ServerArgs

    class Parser(argparse.ArgumentParser):
        def error(self, message):  # noqa: D401
            raise _ParseError(message)

        def exit(self, status=0, message=None):
            raise _ParseError(message or f"exit {status}")

    parser = Parser(prog=SGLANG_MODULE, allow_abbrev=False, add_help=False)
    ServerArgs.add_cli_args(parser)
    return parser


def check_command_flags(cmd: ServerCommand, parser=None) -> None:
    """Every flag of `cmd` must be a full SGLang option name (argparse would accept a
    unique prefix, so `--cuda-graph-bs-prefil` would slip through), switches get no value
    and valued flags get one, and the whole command must parse. Raises InputError naming
    the profile key or the argument."""
    import contextlib
    import difflib
    import io

    if parser is None:
        parser = _sglang_parser()
    actions = parser._option_string_actions
    for src in cmd.sources:
        if src.flag in actions:
            action = actions[src.flag]
            if src.from_profile and src.value is not None:
                takes_value = action.nargs != 0
                if isinstance(src.value, bool) and takes_value:
                    raise InputError(f"{src.flag} takes a value, not true/false", src.origin)
                if not isinstance(src.value, bool) and not takes_value:
                    raise InputError(f"{src.flag} is a switch: write true (or leave it out)", src.origin)
                if isinstance(src.value, list) and action.nargs in (None, "?"):
                    raise InputError(f"{src.flag} takes one value, not a list", src.origin)
            continue
        prefixed = [o for o in actions if o.startswith(src.flag) and src.flag.startswith("--")]
        if len(prefixed) == 1:
            raise InputError(f"{src.flag} is an abbreviation of {prefixed[0]}: write the full flag name", src.origin)
        close = difflib.get_close_matches(src.flag, list(actions), n=1, cutoff=0.8)
        hint = f" (did you mean {close[0]}?)" if close else ""
        raise InputError(f"{src.flag} is not an SGLang flag{hint}", src.origin)
    sink = io.StringIO()
    try:
        with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
            parser.parse_args(cmd.argv[3:])
    except _ParseError as exc:
        msg = str(exc).strip()
        origin = "sglang.launch_server arguments"
        import re

        m = re.match(r"argument ([^:]+):", msg)
        if m:
            names = set(m.group(1).split("/"))
            for src in cmd.sources:
                if src.flag in names:
                    origin = src.origin
        raise InputError(f"SGLang rejects it: {msg}", origin) from None
    except Exception as exc:  # a type_parser raising something other than ArgumentError
        raise InputError(f"SGLang rejects it: {exc}", "sglang.launch_server arguments") from None
