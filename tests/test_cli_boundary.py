"""The CLI boundary: usage errors, the README's exit codes command by command, one line per
failure, and a regression test for each way a user's input used to crash, run away or
overwrite an input."""

from __future__ import annotations

import gzip
import json
import os
import stat
import sys

import pytest
from cli_helpers import HANG_S, README_EXIT_CODES, assert_one_line_error, cli, digest

import bcgtune.cli.commands.engine as engine_cmd
import bcgtune.cli.render.doctor as doctor_render
import bcgtune.services.drift as drift_service
import bcgtune.services.suggest as suggest_service
from bcgtune.errors import CheckFailed, ExternalError, InputError

TRACE = "size,count\n100,5\n300,2\n700,1\n"


@pytest.fixture()
def trace_csv(tmp_path):
    p = tmp_path / "t.csv"
    p.write_text(TRACE)
    return p


# ---- usage errors: the parser's own one line, exit 2 ---------------------------------
@pytest.mark.parametrize(
    "args, needle",
    [
        (["suggest-buckets", "{t}", "--no-such-flag"], "no-such-flag"),
        (["suggest-buckets", "{t}", "--max-buckets", "abc"], "max-buckets"),
        (["suggest-buckets", "{t}", "--max-buckets"], "max-buckets"),
        (["suggest-bucket"], "suggest-bucket"),
        (["trace", "--log"], "--log"),
        (["serve"], "--profile"),
        (["capture", "--warmup", "-3"], "warmup"),
        (["--no-such-global"], "no-such-global"),
    ],
)
def test_usage_errors_are_one_line_exit_2(trace_csv, args, needle):
    r = cli([a.format(t=trace_csv) for a in args])
    assert r.code == 2, r.err
    assert_one_line_error(r)
    assert needle in r.err


def test_no_arguments_prints_help_exit_0():
    r = cli([])
    assert r.code == 0 and "suggest-buckets" in r.out and "Usage" in r.out


def test_version():
    r = cli(["--version"])
    assert r.code == 0 and r.out.startswith("bcgtune ")


# ---- the README's exit codes, command by command --------------------------------------
def _exit_code_cases(tmp_path):
    """(command line, module, function the command calls into) for every command, with a
    valid command line: the function is replaced to raise each kind of failure."""
    t = tmp_path / "t.csv"
    t.write_text(TRACE)
    log = tmp_path / "s.log"
    log.write_text("[2026-01-01 00:00:00] Prefill batch, #new-seq: 1, #new-token: 100, #cached-token: 0, cuda graph: True\n")
    import bcgtune.adapters.sglang.launcher as launcher
    import bcgtune.adapters.sglang.log as sglang_log
    import bcgtune.services.bench as bench_service
    import bcgtune.services.calibrate as calibrate_service
    import bcgtune.services.capture as capture_service
    import bcgtune.services.validate as validate_service

    return [
        (["trace", "--log", str(log)], sglang_log, "parse_logs"),
        (["suggest-buckets", str(t)], suggest_service, "make_plan"),
        (["drift", "--profile", "mi355x", "--trace", str(t)], drift_service, "drift_from_plan"),
        (["capture", "--buckets", "16", "--model", "tiny", "--device", "cpu"], capture_service, "run_capture"),
        (["validate", "--buckets", "16", "--model", "tiny", "--device", "cpu"], validate_service, "run_validate"),
        (
            ["calibrate", "-o", str(tmp_path / "cal.json"), "--sizes", "8", "--model", "tiny", "--device", "cpu"],
            calibrate_service,
            "calibrate",
        ),
        (["serve", "--profile", "mi355x", "--dry-run", "--no-sglang-probe"], launcher, "build_server_command"),
        (["doctor", "--no-sglang-probe"], doctor_render, "render_text"),
        (["bench", "--profile", "mi355x", "--arm", "a:disabled", "--arm", "b:profile"], bench_service, "plan_bench"),
    ]


@pytest.mark.parametrize(
    "exc, code",
    [
        (InputError("bad value", "here"), 2),
        (CheckFailed("check failed", "there"), 1),
        (ExternalError("the server died", "log: x"), 3),
        (KeyboardInterrupt(), 130),
        (RuntimeError("unexpected"), 4),
        (MemoryError(), 3),
    ],
)
def test_exit_codes_of_each_command(tmp_path, monkeypatch, exc, code):
    """Every command, each failure kind: the README's code and one line."""
    for args, module, name in _exit_code_cases(tmp_path):

        def boom(*a, **k):
            raise exc

        with monkeypatch.context() as m:
            m.setattr(module, name, boom)
            m.setattr(engine_cmd, "require_torch", lambda: None)  # these tests run without torch too
            r = cli(args)
        assert r.code == code, (args, r.err)
        assert r.code in README_EXIT_CODES
        assert_one_line_error(r)
        if code == 4:
            assert "--debug" in r.err and "BCGTUNE_DEBUG" in r.err


def test_success_exit_0(trace_csv, tmp_path):
    assert cli(["suggest-buckets", str(trace_csv)]).code == 0
    # doctor without SGLang's answer gives no verdict: not checked (5), never ok (0)
    r = cli(["doctor", "--no-sglang-probe", "--json"])
    assert r.code == 5 and json.loads(r.out)["ok"] is False and json.loads(r.out)["outcome"] == "not checked"


def test_debug_shows_the_traceback(trace_csv, monkeypatch):
    monkeypatch.setattr(suggest_service, "make_plan", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("kaboom")))
    with pytest.raises(RuntimeError, match="kaboom"):
        cli(["--debug", "suggest-buckets", str(trace_csv)])
    monkeypatch.setenv("BCGTUNE_DEBUG", "1")
    with pytest.raises(RuntimeError, match="kaboom"):
        cli(["suggest-buckets", str(trace_csv)])


# ---- regressions: each used to crash, run away, or pass nonsense ------------------------
def _write(tmp_path, name, data):
    p = tmp_path / name
    p.write_bytes(data if isinstance(data, bytes) else data.encode())
    return p


@pytest.mark.parametrize(
    "content, needle",
    [
        ("size,count\n1000000000000,1\n", "less than or equal to 2147483647"),
        ("size,count\n1e30,1\n", "less than or equal to 2147483647"),
        ("size,count\n100,1180591620717411303424\n", "less than or equal to"),
        ("[1, 1180591620717411303424]", "less than or equal to 2147483647"),
        ("[1, 1e30]", "valid integer"),
        ('{"format_version": 1, "histogram": {"sizes": [1], "counts": [1]}, "sources": 5}', "sources"),
        ('{"format_version": 1, "histogram": {"sizes": [1], "counts": [1]}, "meta": [1, 2]}', "meta"),
        (
            '{"format_version": 1, "histogram": {"sizes": [1], "counts": [1]}, '
            '"batches": {"forward_tokens": [1], "timestamp": ["x"]}}',
            "timestamp",
        ),
        (
            '{"format_version": 1, "histogram": {"sizes": [1], "counts": [1]}, "meta": ' + "[" * 5000 + "]" * 5000 + "}",
            "nested too deeply",
        ),
        ('{"format_version": 1, "histogram": {"sizes": [NaN], "counts": [1]}}', "NaN"),
        ("\x00\x01\x02binary", "binary"),
        ("size,count\n", "empty"),
    ],
)
def test_hostile_trace_files_are_one_line_exit_2(tmp_path, content, needle):
    p = _write(tmp_path, "t.txt", content)
    r = cli(["suggest-buckets", str(p)])
    assert r.code == 2, r.err
    assert_one_line_error(r)
    assert needle in r.err


def test_corrupt_and_truncated_gz(tmp_path):
    good = gzip.compress(TRACE.encode())
    for name, data in (("trunc.csv.gz", good[: len(good) // 2]), ("corrupt.csv.gz", b"\x1f\x8b" + b"junk" * 20)):
        r = cli(["suggest-buckets", str(_write(tmp_path, name, data))])
        assert r.code == 2, r.err
        assert_one_line_error(r)
        assert name in r.err


def test_closed_stdin(monkeypatch):
    monkeypatch.setattr(sys, "stdin", None)
    r = cli(["suggest-buckets", "-"])
    assert r.code == 2 and "standard input is closed" in r.err


@pytest.mark.parametrize(
    "extra, needle",
    [
        (["--seed", "-1"], "--seed"),
        (["--padding-factor", "nan"], "--padding-factor"),
        (["--padding-factor", "inf"], "--padding-factor"),
        (["--compare", "99999999999999999999999"], "2147483647"),
        (["--max-buckets", "0"], "--max-buckets"),
        (["--tp", "0"], "--tp"),
        (["--tp", "-4"], "--tp"),
        (["--dp", "0"], "--dp"),
        (["--attn-cp-size", "0"], "--attn-cp-size"),
        (["--chunked-prefill-size", "0"], "--chunked-prefill-size"),
        (["--objective", "speed"], "--objective"),
        (["--objective", "time"], "--calibration"),
        (["--plot", ""], "empty value: give a value or leave the option out (--plot)"),
        (["--align", "0"], "--align"),
        (["--max-graph-mem", "nan"], "--max-graph-mem"),
        (["--candidates", "bogus"], "--candidates"),
        (["--cuda-graph-backend-prefill", "bogus"], "--cuda-graph-backend-prefill"),
    ],
)
def test_nonsense_options_are_refused(trace_csv, extra, needle):
    r = cli(["suggest-buckets", str(trace_csv), *extra])
    assert r.code == 2, r.err
    assert_one_line_error(r)
    assert needle in r.err


def test_huge_max_buckets_is_clamped_not_a_runaway(trace_csv):
    r = cli(["suggest-buckets", str(trace_csv), "--max-buckets", "4096", "--json"])
    assert r.code == 0, r.err
    obj = json.loads(r.out)
    assert len(obj["recommended"]["buckets"]) <= 3
    r = cli(["suggest-buckets", str(trace_csv), "--max-buckets", "1000000000"])
    assert r.code == 2 and "--max-buckets" in r.err


def test_alignment_above_every_size_says_no_graphs(trace_csv):
    r = cli(["suggest-buckets", str(trace_csv), "--align", "1000000"])
    assert r.code == 0, r.err
    assert "--cuda-graph-bs-prefill\n" not in r.out + "\n"
    assert "no bucket" in r.out


def test_dev_zero_as_a_trace_is_refused_fast():
    r = cli(["suggest-buckets", "/dev/zero"])
    assert r.code == 2, r.err
    assert "binary" in r.err


# ---- outputs never hurt inputs ---------------------------------------------------------
def test_outputs_that_are_inputs_are_refused_before_work(tmp_path, trace_csv):
    log = _write(tmp_path, "x.log", "[2026-01-01 00:00:00] Prefill batch, #new-seq: 1, #new-token: 100\n")
    before = digest([log, trace_csv])
    for args in (
        ["trace", "--log", str(log), "-o", str(log)],
        ["suggest-buckets", str(trace_csv), "--plot", str(trace_csv)],
        ["suggest-buckets", str(trace_csv), "--write-profile", str(trace_csv)],
        ["calibrate", "--sizes-from", str(trace_csv), "-o", str(trace_csv), "--model", "tiny"],
    ):
        r = cli(args)
        assert r.code == 2, (args, r.err)
        assert_one_line_error(r)
        assert "input of this run" in r.err
    assert digest([log, trace_csv]) == before


def test_output_to_a_device_a_folder_or_nowhere(tmp_path, trace_csv):
    log = _write(tmp_path, "x.log", "[2026-01-01 00:00:00] Prefill batch, #new-seq: 1, #new-token: 100\n")
    for target, needle in (
        ("/dev/full", "not a regular file"),
        ("/dev/null", "not a regular file"),
        (str(tmp_path), "folder"),
        (str(tmp_path / "missing" / "t.json"), "does not exist"),
        ("", "empty value: give a value or leave the option out (--out)"),
    ):
        r = cli(["trace", "--log", str(log), "-o", target])
        assert r.code == 2, (target, r.err)
        assert needle in r.err
    assert stat.S_ISCHR(os.stat("/dev/full").st_mode)


def test_output_in_an_unwritable_folder(tmp_path, trace_csv):
    # /proc refuses new files to every user, root included (a chmod'ed folder would not stop root)
    r = cli(["suggest-buckets", str(trace_csv), "--plot", "/proc/self/p.png"])
    assert r.code == 2 and "cannot write" in r.err, r.err


def test_workdir_that_is_a_file(tmp_path, trace_csv):
    r = cli(["validate", "--server", "--profile", "mi355x", "--workdir", str(trace_csv)])
    assert r.code == 2 and "not a folder" in r.err
    r = cli(["trace", "--live", "--profile", "mi355x", "--workdir", str(trace_csv)])
    assert r.code == 2 and "not a folder" in r.err


def test_gpu_commands_without_torch(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torch" else real(name, *a))
    for cmd in (["capture", "--buckets", "16"], ["validate", "--buckets", "16"], ["calibrate", "-o", "/tmp/never.json"]):
        r = cli(cmd)
        assert r.code == 2, r.err
        assert "needs torch: pip install 'bcgtune[gpu]'" in r.err


# ---- exit codes of the outside world: a full disk, a closed stdout, a stop at start-up ----
def _bcgtune(args, **kw):
    import subprocess

    return subprocess.run([sys.executable, "-m", "bcgtune", *args], capture_output=True, text=True, timeout=HANG_S, **kw)


def test_a_full_disk_is_an_outside_failure(tmp_path, trace_csv, monkeypatch):
    import errno
    import subprocess

    # stdout on a full disk: the result cannot be delivered (exit 3), one line, no traceback
    for args in (["suggest-buckets", str(trace_csv)], ["suggest-buckets", str(trace_csv), "--json"], ["--help"]):
        p = subprocess.run(
            f'"{sys.executable}" -m bcgtune {" ".join(args)} > /dev/full',
            shell=True,
            capture_output=True,
            text=True,
            timeout=HANG_S,
        )
        assert p.returncode == 3, (args, p.stderr)
        assert p.stderr.count("error:") == 1 and "No space left on device" in p.stderr and "Traceback" not in p.stderr
    # an output file on a full disk (the atomic write's fsync fails)
    import bcgtune.fileio as fileio

    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    log = _write(tmp_path, "x.log", "[2026-01-01 00:00:00] Prefill batch, #new-seq: 1, #new-token: 100\n")
    with monkeypatch.context() as m:
        m.setattr(fileio.os, "fsync", full)
        r = cli(["trace", "--log", str(log), "-o", str(tmp_path / "t.json")])
    assert r.code == 3 and "No space left on device" in r.err, r.err
    assert_one_line_error(r)
    assert sorted(os.listdir(tmp_path)) == ["t.csv", "x.log"]  # no temp file left behind
    # a plot (matplotlib's own write) on a full disk
    import bcgtune.cli.render.plan as plan_render

    def full_plot(trace, plan, path):
        raise OSError(errno.ENOSPC, "No space left on device", path)

    with monkeypatch.context() as m:
        m.setattr(plan_render, "plot_plan", full_plot)
        r = cli(["suggest-buckets", str(trace_csv), "--plot", str(tmp_path / "p.png")])
    assert r.code == 3 and "p.png" in r.err, r.err
    assert_one_line_error(r)


def test_a_closed_or_vanishing_stdout_is_no_traceback(tmp_path, trace_csv):
    import subprocess

    prof = tmp_path / "tuned.toml"
    cmd = f'"{sys.executable}" -m bcgtune suggest-buckets {trace_csv} --write-profile {prof} --base-profile h200 --unchecked >&-'
    p = subprocess.run(cmd, shell=True, capture_output=True, text=True, timeout=HANG_S)
    assert p.returncode == 0 and "Traceback" not in p.stderr and "error" not in p.stderr, p.stderr
    assert prof.exists()  # the work is done; only the printed result had nowhere to go
    for args in ("suggest-buckets {t}", "suggest-buckets {t} --json", "--help", "suggest-buckets --help"):
        cmd = f'"{sys.executable}" -m bcgtune {args.format(t=trace_csv)} | head -c 1'
        p = subprocess.run(["bash", "-c", f"set -o pipefail; {cmd}"], capture_output=True, text=True, timeout=HANG_S)
        assert p.returncode == 0 and not p.stderr, (args, p.stderr)


@pytest.mark.parametrize("module", ["typer", "numpy", "bcgtune.cli.commands.suggest"])
@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_a_stop_during_start_up_imports_exits_130(trace_csv, module, sig):
    """Ctrl-C or SIGTERM while bcgtune is still importing: exit 130 and one line, as at any
    other moment (not a traceback, not 143)."""
    code = (
        "import os, signal, sys, time\n"
        "signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal\n"
        "class Stop:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        f"        if name == {module!r}:\n"
        f"            os.kill(os.getpid(), signal.{sig})\n"
        "            time.sleep(2)\n"
        "        return None\n"
        "sys.meta_path.insert(0, Stop())\n"
        "from bcgtune.cli.app import main\n"
        f"main(['suggest-buckets', {str(trace_csv)!r}])\n"
    )
    import subprocess

    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=HANG_S)
    assert p.returncode == 130, (p.returncode, p.stderr)
    assert p.stderr == "error: interrupted\n" and not p.stdout


@pytest.mark.parametrize(
    "content, needle",
    [
        (b"\xff\xfeprompt\n", "not UTF-8"),
        (b"\x00\x01binary", "binary"),
        (b'{"text": 5}\n', "'text'"),
        (b'{"text": "a", "max_new_tokens": true}\n', "max_new_tokens"),
        (b'{"text": "a", "max_new_tokens": 1e9}\n', "max_new_tokens"),
        (b'{"text": "a", "image": {"x": 1}}\n', "image"),
        (b'{"text": "a"' + b"[" * 100000 + b"\n", "invalid JSON"),
        (b"# only a comment\n", "holds no prompt"),
    ],
)
def test_hostile_prompts_files_are_input_errors(tmp_path, content, needle):
    p = _write(tmp_path, "prompts.txt", content)
    before = digest([p])
    r = cli(["validate", "--server", "--profile", "mi355x", "--prompts", str(p), "--workdir", str(tmp_path / "w")])
    assert r.code == 2, r.err
    assert_one_line_error(r)
    assert needle in r.err and "prompts.txt" in r.err
    assert digest([p]) == before


@pytest.mark.parametrize("name", ["t.json.gz", "t.csv.gz", "T.JSON.GZ"])
def test_gz_outputs_are_gzip_and_read_back(tmp_path, name):
    log = _write(tmp_path, "x.log", "[2026-01-01 00:00:00] Prefill batch, #new-seq: 1, #new-token: 100\n" * 3)
    out = tmp_path / name
    assert cli(["trace", "--log", str(log), "-o", str(out)]).code == 0
    data = gzip.decompress(out.read_bytes())
    assert data.startswith(b"size,count") if ".csv" in name else json.loads(data)["histogram"]["sizes"] == [100]
    r = cli(["suggest-buckets", str(out), "--json"])
    assert r.code == 0, r.err
    assert json.loads(r.out)["recommended"]["buckets"] == [100]


@pytest.mark.parametrize(
    "args, flag",
    [
        (["suggest-buckets", "{t}", "--write-profile", ""], "--write-profile"),
        (["suggest-buckets", "{t}", "--write-profile", "  "], "--write-profile"),
        (["suggest-buckets", "{t}", "--calibration", ""], "--calibration"),
        (["suggest-buckets", "{t}", "--compare", ""], "--compare"),
        (["suggest-buckets", ""], "TRACE"),
        (["drift", "--profile", "", "--trace", "{t}"], "--profile"),
        (["serve", "--profile", "mi355x", "--dry-run", "--log-file", ""], "--log-file"),
        (["bench", "--profile", "mi355x", "--arm", "a:disabled", "--arm", "", "--concurrency", "4"], "--arm"),
        (["trace", "--simulate", "--workload", ""], "--workload"),
        (["doctor", "--runner-source", ""], "--runner-source"),
        (["calibrate", "-o", "", "--model", "tiny"], "--out"),
        (["calibrate", "-o", "{d}/c.json", "--sizes", "", "--model", "tiny"], "--sizes"),
    ],
)
def test_an_empty_value_is_an_error_for_every_option(tmp_path, trace_csv, args, flag):
    r = cli([a.format(t=trace_csv, d=tmp_path) for a in args])
    assert r.code == 2, r.err
    assert_one_line_error(r)
    assert "empty value" in r.err and f"({flag})" in r.err
    assert list(tmp_path.iterdir()) == [trace_csv]  # nothing written


@pytest.mark.parametrize(
    "args, flag",
    [
        (["bench", "--profile", "mi355x", "--arm", "a:disabled", "--arm", "b:profile", "--concurrency", "4,,8"], "--concurrency"),
        (["bench", "--profile", "mi355x", "--arm", "a:disabled", "--arm", "b:profile", "--concurrency", "4,8,"], "--concurrency"),
        (["suggest-buckets", "{t}", "--compare", "256,,512"], "--compare"),
        (["trace", "--simulate", "--num-prompts", "4,,8"], "--num-prompts"),
        (["calibrate", "-o", "{d}/c.json", "--sizes", "64,,128", "--model", "tiny"], "--sizes"),
    ],
)
def test_an_empty_list_item_is_an_error(tmp_path, trace_csv, args, flag):
    r = cli([a.format(t=trace_csv, d=tmp_path) for a in args])
    assert r.code == 2, r.err
    assert_one_line_error(r)
    assert "empty item" in r.err and flag in r.err


# ---- every command's outputs refuse every file its command line names --------------------
_OUTPUTS = {
    "trace": (["trace", "--log", "{log}"], ["-o"]),
    "suggest-buckets": (["suggest-buckets", "{t}"], ["--plot", "--write-profile"]),
    "capture": (["capture", "--buckets", "16", "--model", "tiny", "--device", "cpu"], ["-o"]),
    "validate": (["validate", "--buckets", "16", "--model", "tiny", "--device", "cpu"], ["-o"]),
    "calibrate": (["calibrate", "--sizes", "16", "--model", "tiny", "--device", "cpu"], ["-o"]),
    "serve": (["serve", "--profile", "mi355x", "--python", "/bin/false"], ["--log-file"]),
    "bench": (["bench", "--profile", "mi355x", "--arm", "a:disabled", "--arm", "b:profile"], ["--plot"]),
}


def _string_params(name):
    """(how to give a value, the parameter) for each parameter of a command that takes text."""
    from bcgtune.cli.app import _build_command

    for p in _build_command(name).params:
        if getattr(p, "is_flag", False) or p.name == "help":
            continue
        if p.param_type_name == "argument":
            yield ("--" if p.nargs == -1 else "arg"), p
        elif not ({"--buckets", "--sizes", "--model", "--device"} & set(p.opts)):
            yield p.opts[0], p


def test_no_output_can_overwrite_a_file_the_command_line_names(tmp_path, trace_csv, monkeypatch):
    """Each output option of each command, against every other text-valued parameter given
    the same file: nothing is written, and the run stops before any work."""
    import bcgtune.services.bench as bench_lib
    import bcgtune.services.calibrate as calibrate_service
    import bcgtune.services.capture as capture_service
    import bcgtune.services.validate as validate_service

    def reached_work(*a, **k):
        raise AssertionError("the command started working")

    for mod, fn in (
        (capture_service, "run_capture"),
        (validate_service, "run_validate"),
        (calibrate_service, "calibrate"),
        (bench_lib, "run_bench"),
    ):
        monkeypatch.setattr(mod, fn, reached_work)
    monkeypatch.setattr(engine_cmd, "require_torch", lambda: None)
    log = _write(tmp_path, "x.log", "[2026-01-01 00:00:00] Prefill batch, #new-seq: 1, #new-token: 100\n")
    refused = set()
    for command, (base, outs) in _OUTPUTS.items():
        for out in outs:
            for how, p in _string_params(command):
                if out in p.opts:
                    continue
                f = tmp_path / "shared.toml"
                f.write_text(MI355X_TEXT)
                before = digest([f])
                args = [a.format(t=trace_csv, log=log) for a in base] + [out, str(f)]
                if how == "arg":  # suggest-buckets' TRACE
                    args[1] = str(f)
                elif how == "--":
                    args += ["--", "--some-file", str(f)]
                else:
                    args += [how, str(f)]
                r = cli(args)
                assert digest([f]) == before, (args, r.err)
                assert r.code != 0 and r.code in README_EXIT_CODES and "started working" not in r.err, (args, r.err)
                if "input of this run" in r.err:
                    refused.add((command, out, p.name))
    for case in (
        ("serve", "--log-file", "profile"),
        ("bench", "--plot", "profile"),
        ("bench", "--plot", "bench_args"),
        ("suggest-buckets", "--plot", "trace_path"),
        ("suggest-buckets", "--write-profile", "calibration"),
        ("trace", "-o", "log"),
        ("calibrate", "-o", "sizes_from"),
        ("validate", "-o", "prompts"),
        ("capture", "-o", "profile"),
    ):
        assert case in refused, (case, sorted(refused))


MI355X_TEXT = open(os.path.join(os.path.dirname(__file__), "..", "profiles", "mi355x.toml")).read()


def test_a_mistyped_command_gets_one_suggestion():
    r = cli(["suggest-bucket", "t.csv"])
    assert r.code == 2 and r.err.count("Did you mean 'suggest-buckets'?") == 1, r.err
    assert_one_line_error(r)


def test_a_file_name_too_long_for_the_file_system(trace_csv):
    long = "x" * 300
    for args in (
        ["doctor", "--no-sglang-probe", "--profile", long],
        ["drift", "--profile", long, "--trace", str(trace_csv)],
        ["suggest-buckets", str(trace_csv), "--write-profile", long],
        ["suggest-buckets", long],
        ["trace", "--log", long],
    ):
        r = cli(args)
        assert r.code == 2, (args[0], r.err)
        assert_one_line_error(r)


@pytest.mark.parametrize(
    "args, flag",
    [
        (["trace", "--simulate", "--dataset-name", "bogus"], "--dataset-name"),
        (["trace", "--simulate", "--model-family", "qwen9"], "--model-family"),
        (["suggest-buckets", "--objective", "speed"], "--objective"),
        (["suggest-buckets", "--candidates", "all"], "--candidates"),
        (["suggest-buckets", "--cuda-graph-backend-prefill", "bogus"], "--cuda-graph-backend-prefill"),
    ],
)
def test_closed_sets_are_choices_at_parse_time(args, flag):
    r = cli(args)
    assert r.code == 2, r.err
    assert_one_line_error(r)
    assert r.err.rstrip().endswith(f"({flag})") and ("must be one of" in r.err or "is not one of" in r.err), r.err
