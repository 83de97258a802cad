"""ServerProcess as a library: health wait, stop reaps the whole process group, a crash
before health is reported with its exit code and log path."""

import os
import sys
import time
from pathlib import Path

import pytest
from cli_helpers import HANG_S, free_port
from proc_helpers import gone

from bcgtune.adapters.sglang.launcher import ServerProcess, exit_status
from bcgtune.errors import ExternalError

FAKE = str(Path(__file__).with_name("fake_sglang_server.py"))


def test_context_manager_health_and_group_reaped(tmp_path, monkeypatch):
    pid_file = tmp_path / "pids"
    monkeypatch.setenv("FAKE_PID_FILE", str(pid_file))
    port = free_port()
    log = tmp_path / "server.log"
    with ServerProcess([sys.executable, FAKE, "--port", str(port)], log_path=log, echo=None, grace_s=5) as sp:
        sp.wait_healthy(f"http://127.0.0.1:{port}", timeout=HANG_S, interval=0.05)
        assert sp.returncode is None
        deadline = time.monotonic() + HANG_S  # the stand-in logs its batch lines after it turns healthy
        while time.monotonic() < deadline and "Prefill batch" not in log.read_text():
            time.sleep(0.05)
    leader, grandchild = map(int, pid_file.read_text().split())
    assert sp.returncode == 0  # exits cleanly on SIGTERM
    assert gone(leader) and gone(grandchild)
    text = log.read_text()
    assert "Prefill batch, #new-seq" in text and "Received sig 15" in text


def test_crash_before_healthy_names_code_and_log(tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_EXIT_CODE", "7")
    log = tmp_path / "crash.log"
    sp = ServerProcess([sys.executable, FAKE], log_path=log, echo=None)
    with sp:
        with pytest.raises(ExternalError) as ei:
            sp.wait_healthy("http://127.0.0.1:9", timeout=HANG_S, interval=0.05)
    assert "exited with code 7" in str(ei.value) and str(log) in str(ei.value)
    assert sp.returncode == 7 and exit_status(sp.returncode) == 7
    assert "fake crash" in log.read_text()


def test_stop_escalates_to_sigkill(tmp_path):
    # a child that ignores SIGTERM is killed after the grace period
    code = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); time.sleep(60)"
    sp = ServerProcess([sys.executable, "-c", code], log_path=tmp_path / "x.log", echo=None, grace_s=0.5).start()
    import time

    t = time.monotonic()
    while "up" not in (tmp_path / "x.log").read_text() and time.monotonic() - t < HANG_S:
        time.sleep(0.05)
    rc = sp.stop()
    assert rc == -9 and exit_status(rc) == 137
    assert gone(sp.pid)


def test_one_blas_thread_here_and_the_users_environment_for_a_server(tmp_path, monkeypatch):
    """The commands that read logs or price lists run with one OpenBLAS thread (numpy's
    pool would spin for nothing); a server they start gets the environment as the user set
    it: without the variable, or with the user's own value."""
    import bcgtune.procenv as procenv

    monkeypatch.setattr(procenv, "_set_here", {})
    monkeypatch.delenv("OPENBLAS_NUM_THREADS", raising=False)
    procenv.one_blas_thread()
    assert "OPENBLAS_NUM_THREADS" not in procenv.child_environ()
    out = tmp_path / "env.txt"
    code = f"import os; open({str(out)!r}, 'w').write(os.environ.get('OPENBLAS_NUM_THREADS', 'unset'))"
    with ServerProcess([sys.executable, "-c", code], log_path=None, echo=None, grace_s=5) as sp:
        deadline = time.monotonic() + HANG_S
        while sp.proc is not None and sp.proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
    assert out.read_text() == "unset"
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "4")  # the user's choice, made since: kept
    assert procenv.child_environ()["OPENBLAS_NUM_THREADS"] == "4"
    monkeypatch.setattr(procenv, "_set_here", {})
    procenv.one_blas_thread()  # and never replaced
    assert os.environ["OPENBLAS_NUM_THREADS"] == "4" and procenv.child_environ()["OPENBLAS_NUM_THREADS"] == "4"


def test_the_trace_command_asks_for_one_blas_thread(tmp_path):
    import subprocess

    code = (
        "import os, sys; os.environ.pop('OPENBLAS_NUM_THREADS', None)\n"
        "from bcgtune.cli.app import run\n"
        "run(['trace', '--log', sys.argv[1], '-q', '-o', sys.argv[2]])\n"
        "import bcgtune.procenv as p; var = 'OPENBLAS_NUM_THREADS'\n"
        "print(os.environ.get(var), p.child_environ().get(var))\n"
    )
    log = Path(__file__).parent / "data" / "sglang-logs" / "26_doc_hand_wrapped_prefill.log"
    argv = [sys.executable, "-c", code, str(log), str(tmp_path / "t.json")]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=HANG_S)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[-2:] == ["1", "None"]
