"""The doors found open by a hostile run on main, each reproduction as a test: a binary trace
whose column claims a billion rows, tune reading its trace from stdin, a zip:// archive of
logs, two tunes on one state folder, an output the user may not write, stdin merged with a
copy of itself, an infinite probe timeout, values accepted unchecked, tune on a configuration
whose batches outgrow its logged chunk, a stop while bcgtune exits, and the suite in an
environment without the optional packages."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest
from cli_helpers import HANG_S, assert_one_line_error, cli, digest
from hostile_fixtures import H200, REAL_LOG, Fixtures
from hostile_table import _stdin

from bcgtune.errors import InputError

REPO = Path(__file__).resolve().parents[1]
TINY_TRACE = "size,count\n40,3\n70,5\n120,2\n"  # a tune of it on the CPU takes seconds


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}


@pytest.fixture(scope="module")
def fx(tmp_path_factory) -> Fixtures:
    return Fixtures(tmp_path_factory.mktemp("doors"))


# 1 -----------------------------------------------------------------------------------------
def test_a_column_claiming_a_billion_rows_is_refused_from_its_header(fx):
    import bcgtune

    bomb = fx.path("trace.npz_bomb_rows")
    assert bomb.stat().st_size < 10 << 20  # 8 GB once inflated
    r = cli(["suggest-buckets", bomb])
    assert r.code == 2 and "batches.forward_tokens: has 1,000,000,000 rows, the histogram counts 14 batches" in r.err
    assert_one_line_error(r)
    with pytest.raises(InputError, match="has 1,000,000,000 rows"):
        bcgtune.load_trace(str(bomb))
    # a document that itself claims 2^33 batches: its column is refused by the bound on what columns hold
    r = cli(["suggest-buckets", fx.path("trace.npz_bomb_count")])
    assert r.code == 2 and "is more than a trace may hold" in r.err, r.err


# 2 -----------------------------------------------------------------------------------------
def test_tune_reads_its_trace_from_stdin_and_keeps_it(tmp_path):
    pytest.importorskip("torch")
    state = tmp_path / "state"
    args = ["tune", "-", "--model", "tiny", "--device", "cpu", "--state-dir", state, "--list", "64,128", "--json"]
    with _stdin(TINY_TRACE.encode()):
        r = cli(args)
    assert r.code == 0, r.err
    kept = state / "trace-from-stdin"
    assert kept.read_text() == TINY_TRACE
    assert json.loads(r.out)["buckets"] == [64, 128]
    with _stdin(TINY_TRACE.encode()):  # the same bytes again: the state's trace, every step resumed
        again = cli(args)
    steps = ["plan", "calibrate", "optimum", "measure", "validate", "proof"]
    assert again.code == 0 and json.loads(again.out)["resumed"] == steps
    with _stdin(b"size,count\n40,3\n"):  # other bytes: another trace, refused by the state
        other = cli(args)
    assert other.code == 2 and "this state folder holds a tune of" in other.err, other.err


def test_tune_from_stdin_is_refused_for_what_stdin_holds(tmp_path):
    pytest.importorskip("torch")
    with _stdin(b"\x00\x01binary"):
        r = cli(["tune", "-", "--model", "tiny", "--device", "cpu", "--state-dir", tmp_path / "s"])
    assert r.code == 2 and r.err.strip().endswith("binary data, not a trace (<stdin>)"), r.err
    assert not (tmp_path / "s").exists()  # a state folder made for a refused tune is not left behind
    with _stdin(b"size,count\n1000000,1\n"):
        r = cli(["tune", "-", "--model", "tiny", "--device", "cpu", "--state-dir", tmp_path / "s"])
    assert r.code == 2 and "does not fit" in r.err and "trace-from-stdin" in r.err, r.err


# 3 -----------------------------------------------------------------------------------------
def test_a_zip_archive_of_logs_is_read(tmp_path):
    pytest.importorskip("fsspec")
    z = tmp_path / "z.zip"
    with zipfile.ZipFile(z, "w") as zf:
        zf.write(REAL_LOG, "a.log")
        zf.write(REAL_LOG, "day/b.log")
    for url, batches in ((f"zip://a.log::file://{z}", 14), (f"zip://*.log::file://{z}", 14), (f"zip://day/::file://{z}", 14)):
        r = cli(["trace", "--log", url, "--json"])
        assert r.code == 0, (url, r.err)
        assert json.loads(r.out)["batches"] == batches, url


# 4 -----------------------------------------------------------------------------------------
HOLD = """
import sys, time
from bcgtune.files.folder_lock import folder_held
with folder_held(sys.argv[1], ".tune.lock", "tune state folder"):
    print("held", flush=True)
    time.sleep(120)
"""


def test_a_second_tune_on_a_state_folder_in_use_is_refused_naming_the_first(tmp_path):
    pytest.importorskip("torch")
    trace = tmp_path / "t.csv"
    trace.write_text(TINY_TRACE)
    state = tmp_path / "state"
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(state)], stdout=subprocess.PIPE, text=True, env=_env())
    try:
        assert holder.stdout.readline().strip() == "held"
        r = cli(["tune", trace, "--model", "tiny", "--device", "cpu", "--state-dir", state, "--list", "64,128"])
        assert r.code == 2, r.err
        assert_one_line_error(r)
        assert f"in use by another bcgtune: pid {holder.pid} on host" in r.err and str(state) in r.err
        assert sorted(p.name for p in state.iterdir()) == [".tune.lock"]  # nothing measured, nothing written
        # the logs' trace is written into the folder too: refused the same way
        r = cli(["tune", "--log", REAL_LOG, "--model", "tiny", "--device", "cpu", "--state-dir", state])
        assert r.code == 2 and f"pid {holder.pid}" in r.err, r.err
    finally:
        holder.kill()
        holder.wait()
    # its holder gone (killed: the lock went with it), the folder is free
    r = cli(["tune", trace, "--model", "tiny", "--device", "cpu", "--state-dir", state, "--list", "64,128"])
    assert r.code == 0, r.err


def test_the_state_folder_lock_is_reentrant_in_one_process_and_exclusive_across(tmp_path):
    from bcgtune.files.folder_lock import folder_held, read_holder

    with folder_held(tmp_path, ".x.lock", "test folder"):
        with folder_held(tmp_path, ".x.lock", "test folder"):  # a command holding it calls a service that takes it
            assert read_holder(tmp_path / ".x.lock")["pid"] == os.getpid()
        code = (
            "import sys\nfrom bcgtune.files.folder_lock import folder_held\nfrom bcgtune.errors import InputError\n"
            f"try:\n    with folder_held({str(tmp_path)!r}, '.x.lock', 'test folder'):\n        print('took it')\n"
            "except InputError as e:\n    print(e)\n"
        )
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_env(), timeout=HANG_S).stdout
        assert f"in use by another bcgtune: pid {os.getpid()}" in out, out


# 5 -----------------------------------------------------------------------------------------
def _as_nobody(fn) -> int:
    """fn() in a forked child running as user nobody (this process is root): its return."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover (the child)
        try:
            os.close(r)
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            os.write(w, str(fn()).encode())
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r) as fh:
        got = fh.read()
    os.waitpid(pid, 0)
    return int(got or -1)


def test_write_profile_refuses_a_file_the_user_may_not_write(tmp_path):
    import tempfile

    trace = tmp_path / "t.csv"
    trace.write_text(TINY_TRACE)
    folder = Path(tempfile.mkdtemp(prefix="bcgtune-ro-"))  # writable by everyone: the rename would go through
    try:
        folder.chmod(0o777)
        trace_there = folder / "t.csv"
        shutil.copy(trace, trace_there)
        trace_there.chmod(0o644)
        prof = folder / "mine.toml"
        shutil.copy(H200, prof)
        prof.chmod(0o444)
        before = digest([prof])
        args = ["suggest-buckets", str(trace_there), "--write-profile", str(prof), "-q"]
        assert cli(["suggest-buckets", str(trace_there), "-q"]).code == 0  # everything it imports is loaded
        if os.geteuid() == 0:  # root may write anything: the refusal is shown as another user
            code = _as_nobody(lambda: cli(args).code)
            assert code == 2
        else:
            r = cli(args)
            assert r.code == 2 and "is not writable by you" in r.err, r.err
        assert digest([prof]) == before and (prof.stat().st_mode & 0o777) == 0o444
    finally:
        shutil.rmtree(folder, ignore_errors=True)


# 6 -----------------------------------------------------------------------------------------
def test_merge_refuses_stdin_that_holds_a_file_given_beside_it(tmp_path):
    t = tmp_path / "t.csv"
    t.write_text(TINY_TRACE)
    with _stdin(TINY_TRACE.encode()):
        r = cli(["trace", "merge", t, "-", "--json"])
    assert r.code == 2 and f"has the same contents as {t}: its batches would count twice (<stdin>)" in r.err, r.err
    with _stdin(TINY_TRACE.encode()):
        r = cli(["trace", "merge", "-", "-"])
    assert r.code == 2 and "given twice" in r.err, r.err
    other = tmp_path / "o.csv"
    other.write_text("size,count\n64,1\n")
    with _stdin(TINY_TRACE.encode()):
        r = cli(["trace", "merge", other, "-", "--json"])
    assert r.code == 0 and json.loads(r.out)["batches"] == 11, r.err


# 7 -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("value", ["inf", "1e309", "nan", "-inf", "86401", "0"])
def test_an_unbounded_probe_timeout_is_refused(value):
    r = cli(["doctor", "--no-sglang-probe", "--probe-timeout", value])
    assert r.code == 2 and "must be a positive number of seconds, at most 86400 (--probe-timeout)" in r.err, r.err


# 8 -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("value", ["4", 4.0, True, None])
def test_the_api_takes_a_count_as_an_integer(value):
    import bcgtune

    t = bcgtune.trace_from_sizes([100, 200, 300])
    with pytest.raises(InputError) as exc:
        bcgtune.suggest_buckets(t, max_buckets=value)
    assert exc.value.field == "max_buckets" and "must be a valid integer" in exc.value.what


def test_launch_settings_a_log_overrides_are_said_and_digits_are_ascii(tmp_path):
    r = cli(["trace", "--log", REAL_LOG, "--launch", "chunked_prefill_size=-1"])
    assert r.code == 0 and "--launch not used: every log states its own launch settings" in r.err, r.err
    for bad in ("tp_size=１", "tp_size=1_0", "chunked_prefill_size=-7"):
        r = cli(["trace", "--log", REAL_LOG, "--launch", bad])
        assert r.code == 2 and "(--launch)" in r.err, (bad, r.err)


def test_a_profile_number_in_non_ascii_digits_never_reaches_the_launch(tmp_path):
    prof = tmp_path / "p.toml"
    prof.write_text(H200.read_text().replace("tp-size = 1", 'tp-size = "１"'))
    r = cli(["serve", "--profile", prof, "--dry-run", "--no-sglang-probe"])
    assert r.code == 2 and "'１' is a number in non-ASCII digits" in r.err and "[server].tp-size" in r.err, r.err
    assert "launch_server" not in r.out


def test_tolerance_without_the_time_objective_is_refused(tmp_path):
    t = tmp_path / "t.csv"
    t.write_text(TINY_TRACE)
    r = cli(["suggest-buckets", t, "--tolerance", "1"])
    assert r.code == 2 and "applies to the time objective" in r.err and "(--tolerance)" in r.err, r.err
    r = cli(["drift", "--profile", "h200", "--trace", t, "--tolerance", "1"])
    assert r.code == 2 and "applies to a verdict by time only" in r.err, r.err


@pytest.mark.parametrize("chunk", [-7, 1e30, "8192"])
def test_a_traces_logged_chunk_is_bounded(fx, tmp_path, chunk):
    doc = json.loads(fx.path("trace.json").read_text())
    doc["meta"]["startup"][0]["chunked_prefill_size"] = chunk
    p = tmp_path / "t.json"
    p.write_text(json.dumps(doc))
    r = cli(["suggest-buckets", p])
    assert r.code == 2 and "meta.startup[0].chunked_prefill_size" in r.err, r.err


# 9 -----------------------------------------------------------------------------------------
def test_tune_refuses_a_configuration_whose_batches_outgrow_its_logged_chunk(tmp_path):
    pytest.importorskip("torch")
    a, b = tmp_path / "a.log", tmp_path / "b.log"
    shutil.copy(REAL_LOG, a)
    b.write_text(REAL_LOG.read_text().replace("chunked_prefill_size=8192", "chunked_prefill_size=4096"))
    r = cli(["tune", "--log", a, b, "--group", "1", "--model", "tiny", "--device", "cpu", "--state-dir", tmp_path / "s"])
    assert r.code == 2 and "the trace's batches reach 8,192 tokens, above the chunk its server logged (4,096)" in r.err, r.err
    assert_one_line_error(r)


# 10 ----------------------------------------------------------------------------------------
EXITING = """
import atexit, sys, time
atexit.register(time.sleep, 60)  # a slow exit: the window a stop may land in
sys.argv = ["bcgtune", "suggest-buckets", sys.argv[1]]
from bcgtune.cli.app import main
main()
"""


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_while_bcgtune_exits_after_an_error_is_130(tmp_path, sig):
    p = subprocess.Popen(
        [sys.executable, "-c", EXITING, str(tmp_path / "missing.csv")], stderr=subprocess.PIPE, text=True, env=_env()
    )
    try:
        line = p.stderr.readline()
        assert line.startswith("error: no such file"), line
        time.sleep(0.2)
        p.send_signal(sig)
        assert p.wait(timeout=HANG_S) == 130
        assert "Traceback" not in p.stderr.read()
    finally:
        p.kill()
        p.wait()


# 11 ----------------------------------------------------------------------------------------
BLOCK = """
import sys
for name in ("sglang", "tokenizers"):  # as if not installed: import fails, find_spec says None
    sys.modules[name] = None
"""


def test_tests_that_need_optional_packages_skip_without_them(tmp_path):
    (tmp_path / "sitecustomize.py").write_text(BLOCK)
    env = {**_env(), "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO), os.environ.get("PYTHONPATH", "")])}
    tests = [
        "tests/test_live_standin.py",
        "tests/test_docs.py::test_doc_examples[README.md]",
        "tests/test_docs.py::test_doc_examples[live.md]",
        "tests/test_serve.py::test_dry_run_golden",
        "tests/test_serve.py::test_dry_run_env_model_port_extra",
        "tests/test_launch_check.py::test_doctor_checked_and_ok_exits_0",
    ]
    p = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider", *tests],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=HANG_S,
    )  # fmt: skip
    assert p.returncode == 0, p.stdout[-3000:]
    tail = p.stdout.strip().splitlines()[-1]
    assert "failed" not in tail and "error" not in tail and "skipped" in tail, tail
