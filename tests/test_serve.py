"""`bcgtune serve`: golden dry-run commands, flag validation against SGLang's real parser,
and the launch lifecycle with a stand-in server (tests/fake_sglang_server.py)."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cli_helpers import HANG_S
from proc_helpers import gone, run_cli

import bcgtune.adapters.sglang.resolve as sr
from bcgtune.adapters.sglang.launcher import build_server_command, check_command_flags
from bcgtune.errors import InputError
from bcgtune.files.profile_file import load_profile

HERE = Path(__file__).resolve().parent
FAKE = HERE / "fake_sglang_server.py"
GOLDEN = HERE / "data" / "serve"


@pytest.mark.parametrize("name", ["mi355x", "h200"])
def test_dry_run_golden(name, capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", "/nonexistent/hub")  # the models are not on this machine
    monkeypatch.setattr(sr, "sglang_installed", lambda: True)  # the same text with or without sglang installed
    code, out, err = run_cli(["serve", "--profile", name, "--dry-run", "--no-sglang-probe"], capsys)
    assert code == 0, err
    assert out.replace(sys.executable, "{python}") == (GOLDEN / f"{name}.dry-run.txt").read_text()
    assert "flag check skipped" in err


def test_dry_run_env_model_port_extra(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(sr, "sglang_installed", lambda: True)  # the same text with or without sglang installed
    p = tmp_path / "p.toml"
    p.write_text(
        '[profile]\nname = "p"\nplatform = "rocm"\n[server]\ntp-size = 2\nport = 1\n'
        'mem-fraction-static = 0.85\nenable-foo = false\n[env]\nSGLANG_USE_AITER = "1"\nX = "a b"\n'
    )
    code, out, err = run_cli(
        [
            "serve",
            "--profile",
            str(p),
            "--model-path",
            "/m dir",
            "--port",
            "31000",
            "--dry-run",
            "--no-sglang-probe",
            "--",
            "--log-level",
            "debug",
        ],
        capsys,
    )
    assert code == 0, err
    assert out.replace(sys.executable, "{python}").startswith(
        "# environment added by profile p:\nexport SGLANG_USE_AITER=1\nexport X='a b'\n"
        "{python} -m sglang.launch_server --model-path '/m dir' --tp-size 2 --mem-fraction-static 0.85 "
        "--port 31000 --log-level debug\n"
    )
    # what SGLang will capture follows as shell comments: ROCm's default backend is disabled
    assert (
        "# prefill graphs (NOT CHECKED by SGLang: bcgtune model; SGLang not asked: '/m dir' is neither a local model "
        "folder nor a Hugging Face hub id):"
    ) in out
    assert "#   captures   nothing" in out


def test_no_model_is_an_input_error(tmp_path, capsys):
    p = tmp_path / "p.toml"
    p.write_text('[profile]\nname = "p"\nplatform = "cuda"\n')
    code, _, err = run_cli(["serve", "--profile", str(p), "--dry-run"], capsys)
    assert code == 2 and "no model" in err and str(p) in err
    assert "pass --model-path" in err  # the option's name


# ------------------------------------------------------------- against SGLang's real parser
def _parser():
    pytest.importorskip("sglang.srt.server_args")
    from bcgtune.adapters.sglang.launcher import _sglang_parser

    return _sglang_parser()


@pytest.fixture(scope="module")
def sglang_parser():
    return _parser()


@pytest.mark.sglang
@pytest.mark.parametrize("name", ["mi355x", "h200"])
def test_builtin_profiles_pass_the_real_parser(name, sglang_parser):
    check_command_flags(build_server_command(load_profile(name), port=30000), sglang_parser)


@pytest.mark.sglang
@pytest.mark.parametrize(
    "extra, message, origin",
    [
        (["--cuda-graph-bs-prefil", "4", "8"], "abbreviation of --cuda-graph-bs-prefill", "argument --cuda-graph-bs-prefil"),
        (["--tp", "2"], "abbreviation of --tp-size", "argument --tp"),
        (["--cuda-graph-bs", "4"], "not an SGLang flag", "argument --cuda-graph-bs"),
        (["--no-such-flag"], "not an SGLang flag", "argument --no-such-flag"),
        (["--cuda-graph-backend-prefill=fast"], "invalid choice", "argument --cuda-graph-backend-prefill=fast"),
    ],
)
def test_extra_flags_refused(extra, message, origin, sglang_parser):
    cmd = build_server_command(load_profile("h200"), extra=extra)
    with pytest.raises(InputError) as ei:
        check_command_flags(cmd, sglang_parser)
    assert message in str(ei.value) and ei.value.where == origin


@pytest.mark.sglang
@pytest.mark.parametrize(
    "line, message, key",
    [
        (
            'cuda-graph-backend-prefil = "breakable"',
            "abbreviation of --cuda-graph-backend-prefill",
            "[server].cuda-graph-backend-prefil",
        ),
        ("attention-backend = true", "takes a value", "[server].attention-backend"),
        ("disable-radix-cache = 1", "is a switch", "[server].disable-radix-cache"),
        ("context-length = [1, 2]", "one value", "[server].context-length"),
        ('attention-backend = "warp-drive"', "invalid choice", "[server].attention-backend"),
        ('linear_attn_backendd = "triton"', "not an SGLang flag", "[server].linear-attn-backendd"),
    ],
)
def test_profile_keys_refused(tmp_path, line, message, key, sglang_parser):
    p = tmp_path / "p.toml"
    p.write_text(f'[profile]\nname = "p"\nplatform = "cuda"\nmodel = "m"\n[server]\n{line}\n')
    cmd = build_server_command(load_profile(str(p)))
    with pytest.raises(InputError) as ei:
        check_command_flags(cmd, sglang_parser)
    assert message in str(ei.value) and ei.value.where == f"{p}: {key}", str(ei.value)


@pytest.mark.sglang
def test_cli_refuses_abbreviation_with_sglang(capsys, sglang_probe):
    code, out, err = run_cli(["serve", "--profile", "mi355x", "--dry-run", "--", "--cuda-graph-bs-prefil", "8"], capsys)
    assert code == 2 and out == ""
    assert err.strip().splitlines()[-1] == (
        "error: --cuda-graph-bs-prefil is an abbreviation of --cuda-graph-bs-prefill: write the full flag name "
        "(argument --cuda-graph-bs-prefil)"
    )


# ------------------------------------------------------------- lifecycle with a stand-in
def _wrapper(tmp_path) -> Path:
    """A stand-in `python`: drops `-m sglang.launch_server` and runs the fake server."""
    w = tmp_path / "fakepython"
    w.write_text(f'#!/bin/sh\nshift 2\nexec "{sys.executable}" "{FAKE}" "$@"\n')
    w.chmod(0o755)
    return w


def _serve(tmp_path, env_extra, *args):
    env = dict(os.environ, **env_extra)
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "bcgtune",
            "serve",
            "--profile",
            "mi355x",
            "--python",
            str(_wrapper(tmp_path)),
            "--grace",
            "5",
            *args,
        ],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_ctrl_c_leaves_no_process_behind(tmp_path):
    pid_file = tmp_path / "pids"
    log = tmp_path / "server.log"
    proc = _serve(tmp_path, {"FAKE_PID_FILE": str(pid_file)}, "--log-file", str(log))
    deadline = time.monotonic() + HANG_S
    while time.monotonic() < deadline and not (log.exists() and "Prefill batch" in log.read_text()):
        time.sleep(0.05)
    assert pid_file.exists(), proc.communicate(timeout=HANG_S)
    leader, grandchild = map(int, pid_file.read_text().split())
    proc.send_signal(signal.SIGINT)  # what Ctrl-C sends to bcgtune (the server has its own group)
    out, err = proc.communicate(timeout=HANG_S)
    assert gone(leader) and gone(grandchild)
    assert proc.returncode == 130, err  # interrupted, whatever the server's own exit code
    assert "Received sig 2" in log.read_text() and "Prefill batch, #new-seq" in out  # teed to terminal too
    assert f"log: {log}" in err and "error: interrupted: server stopped" in err


def test_ctrl_c_is_130_when_the_server_ignores_signals(tmp_path):
    pid_file = tmp_path / "pids"
    log = tmp_path / "server.log"
    proc = _serve(tmp_path, {"FAKE_PID_FILE": str(pid_file), "FAKE_IGNORE_SIGNALS": "1"}, "--log-file", str(log))
    deadline = time.monotonic() + HANG_S
    while time.monotonic() < deadline and not (log.exists() and "Prefill batch" in log.read_text()):
        time.sleep(0.05)
    assert pid_file.exists(), proc.communicate(timeout=HANG_S)
    leader, grandchild = map(int, pid_file.read_text().split())
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=HANG_S)  # the grace period (5 s), then SIGKILL to the group
    assert proc.returncode == 130, err
    assert gone(leader) and gone(grandchild)
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert errors == [f"error: interrupted: server stopped, it was killed by SIGKILL (log: {log})"]


def test_crash_reports_code_and_log_in_one_line(tmp_path):
    proc = _serve(tmp_path, {"FAKE_EXIT_CODE": "7"})
    out, err = proc.communicate(timeout=HANG_S)
    assert proc.returncode == 3  # an external failure; the server's own code is in the message
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1
    logs = list(tmp_path.glob("mi355x-*.log"))  # default: ./<profile>-<timestamp>.log
    assert len(logs) == 1 and "fake crash" in logs[0].read_text()
    assert lines[0] == f"error: server exited with code 7 (log: {logs[0]})"


def test_serve_without_sglang_says_how_to_install_it_and_starts_nothing(tmp_path, capsys, monkeypatch):
    import bcgtune.adapters.sglang.resolve as sr

    monkeypatch.setattr(sr, "sglang_installed", lambda: False)
    code, out, err = run_cli(["serve", "--profile", "h200", "--log-file", str(tmp_path / "x.log")], capsys)
    assert code == 3 and "asking" not in err, err
    assert err.strip().splitlines()[-1].startswith("error: sglang is not installed for ")
    assert "pip install 'bcgtune[sglang]'" in err and not (tmp_path / "x.log").exists()
    # a dry run still prints the command, priced by bcgtune's model
    code, out, err = run_cli(["serve", "--profile", "h200", "--dry-run"], capsys)
    assert code == 0 and "SGLang not asked" in out and "asking" not in err
    assert "flag check skipped: sglang is not installed here (pip install 'bcgtune[sglang]'" in err


def test_serve_log_file_may_not_be_the_profile(tmp_path, capsys):
    p = tmp_path / "p.toml"
    p.write_text('[profile]\nname = "p"\nplatform = "cuda"\nmodel = "m"\n')
    before = p.read_bytes()
    code, _, err = run_cli(["serve", "--profile", str(p), "--log-file", str(p), "--python", "/bin/false"], capsys)
    assert code == 2 and "is also an input of this run" in err and p.read_bytes() == before
