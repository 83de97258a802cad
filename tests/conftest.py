"""Test-session settings.

Every test runs with its own bcgtune cache folder (never the user's) and with SGLang never
started by bcgtune (BCGTUNE_SGLANG_PROBE=off): ordinary tests answer from bcgtune's model of
SGLang's rules in milliseconds. Tests of asking SGLang itself use the `sglang_probe` fixture,
which turns it back on.

OpenMP threads sleep at barriers instead of spinning: the tests run on every core
(pytest-xdist), so each worker's torch threads would otherwise spin while another worker
holds the core they wait for (torch reads this when it loads, so here, before any test
module imports it)."""

from __future__ import annotations

import os
import sys
import tempfile

import pytest
from hypothesis import settings

# hypothesis times each example (200 ms by default) and fails a slow one: a bound on speed,
# which a machine busy with other work breaks; examples are judged by what they return only
settings.register_profile("behaviour-only", deadline=None)
settings.load_profile("behaviour-only")

# set at import, before any test module imports bcgtune or torch, and inherited by the
# commands tests run in child processes
os.environ["BCGTUNE_CACHE_DIR"] = tempfile.mkdtemp(prefix="bcgtune-test-cache-")
os.environ["BCGTUNE_SGLANG_PROBE"] = "off"
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# a child importing SGLang may take minutes on a machine busy with other work: the limit
# only stops one that hangs (tests assert what SGLang answers, never how fast)
os.environ.setdefault("BCGTUNE_PROBE_TIMEOUT", "1800")


@pytest.fixture
def sglang_probe(monkeypatch, tmp_path):
    """SGLang may be started (in a child process), with an empty answer cache of the test's
    own; skips where sglang is not installed."""
    from bcgtune.adapters.sglang.resolve import sglang_installed

    if not sglang_installed():
        pytest.skip("sglang not installed")
    monkeypatch.delenv("BCGTUNE_SGLANG_PROBE", raising=False)
    monkeypatch.setenv("BCGTUNE_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


# ---- no process a test starts outlives the tests ----------------------------------------------
def _descendants(root: int) -> list[int]:
    """Every process below `root` (read from /proc), children first found first."""
    from proc_helpers import proc_table

    parent = {pid: ppid for pid, (_, ppid, _) in proc_table().items()}
    out, frontier = [], [root]
    while frontier:
        kids = [pid for pid, pp in parent.items() if pp in frontier]
        out += kids
        frontier = kids
    return out


def _stop_all(pids: list[int], grace_s: float = 5.0) -> None:
    """SIGTERM each process (and its process group when it leads one), SIGKILL what is left
    after `grace_s`, and reap our own children."""
    import signal
    import time

    def send(sig: int) -> None:
        for pid in pids:
            try:
                if os.getpgid(pid) == pid:
                    os.killpg(pid, sig)
                else:
                    os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass

    def reap() -> None:
        while True:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return

    send(signal.SIGTERM)
    end = time.monotonic() + grace_s
    while time.monotonic() < end and any(os.path.exists(f"/proc/{p}") and _running(p) for p in pids):
        reap()
        time.sleep(0.05)
    send(signal.SIGKILL)
    time.sleep(0.05)
    reap()


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(") ", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


@pytest.fixture(scope="session", autouse=True)
def _no_process_outlives_the_tests():
    """This test process adopts the processes its children leave behind (Linux's child
    subreaper: a server whose launcher was killed, a worker of a stopped pool), and at the
    end of the session stops every process still below it: SIGTERM to it and its group, then
    SIGKILL, so a server that ignores SIGTERM is gone too."""
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
        except (OSError, AttributeError):
            pass
    yield
    if os.path.isdir("/proc"):
        left = [p for p in _descendants(os.getpid()) if _running(p)]
        if left:
            _stop_all(left)
