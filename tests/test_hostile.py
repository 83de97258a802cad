"""Hostile-input suite: the real CLI driven with generated garbage (bytes, JSON, TOML, option
values, output paths). Whatever comes in: no traceback, an exit code from the README's list
other than 4 (a bug), at most one `error:` line, the run's input files byte-identical
afterwards, and bounded memory (the peak resident size may not grow by 1 GiB in one run); a
run that never ends is stopped as hung (cli_helpers.HANG_S), and no run is timed."""

from __future__ import annotations

import json
import math
import os
import tempfile

import tomli_w
from cli_helpers import HANG_S, USER_EXIT_CODES, assert_one_line_error, cli, digest, free_port
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

SETTINGS = dict(
    max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
MEMORY_MIB = 1024  # no run may raise the process's peak memory by more than this


def _peak_rss_mib() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


GOOD_TRACE = "size,count\n100,5\n300,2\n700,1\n2000,3\n"


def _check(r, inputs_before, paths) -> None:
    assert r.code in USER_EXIT_CODES, (r.code, r.err[-1500:])
    assert_one_line_error(r)
    assert digest(paths) == inputs_before


def _run_with_file(data: bytes, args_for):
    with tempfile.TemporaryDirectory() as d:
        p = os.path.join(d, "input")
        with open(p, "wb") as fh:
            fh.write(data)
        t = os.path.join(d, "t.csv")
        with open(t, "w") as fh:
            fh.write(GOOD_TRACE)
        for item in args_for(p, t, d):
            # (args, the run's inputs), or args alone: both files are inputs
            args, inputs = item if isinstance(item, tuple) else (item, [p, t])
            before = digest(inputs)
            peak = _peak_rss_mib()
            _check(cli(args), before, inputs)
            assert _peak_rss_mib() - peak < MEMORY_MIB, (args, _peak_rss_mib() - peak)


# ---- generated values -----------------------------------------------------------------
_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**80), max_value=2**80),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=30),
)
json_values = st.recursive(
    _scalars, lambda c: st.lists(c, max_size=5) | st.dictionaries(st.text(max_size=10), c, max_size=5), max_leaves=30
)
numbers = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([0, -1, 1, 2**31 - 1, 2**31, 2**63, 10**30]),
    st.floats(allow_nan=True, allow_infinity=True),
)


def _num_text(x) -> str:
    if isinstance(x, float) and math.isnan(x):
        return "nan"
    return str(x)


# ---- bytes as every kind of input -----------------------------------------------------
@settings(**SETTINGS)
@given(data=st.one_of(st.binary(max_size=400), st.text(max_size=400).map(str.encode)))
def test_garbage_bytes_as_any_input(data):
    def args_for(p, t, d):
        yield ["suggest-buckets", p]
        yield ["suggest-buckets", t, "--objective", "time", "--calibration", p]
        yield ["trace", "--log", p, "--json"]
        yield ["doctor", "--no-sglang-probe", "--profile", p]
        yield ["trace", "--simulate", "--workload", p, "--num-prompts", "4"]
        yield ["drift", "--profile", "mi355x", "--trace", p]

    _run_with_file(data, args_for)


# ---- structured documents with hostile values -----------------------------------------
@settings(**SETTINGS)
@given(
    sizes=st.lists(json_values, max_size=6),
    counts=st.lists(json_values, max_size=6),
    extra=st.dictionaries(
        st.sampled_from(["sources", "meta", "captures", "batches", "origin", "parse_stats", "kind", "format_version"]),
        json_values,
        max_size=4,
    ),
)
def test_trace_json_with_hostile_fields(sizes, counts, extra):
    doc = {"format_version": 1, "kind": "bcgtune.prefill-trace", "histogram": {"sizes": sizes, "counts": counts}, **extra}
    _run_with_file(json.dumps(doc).encode(), lambda p, t, d: [["suggest-buckets", p, "--json"]])


@settings(**SETTINGS)
@given(
    rows=st.lists(st.dictionaries(st.sampled_from(["tokens", "eager_ms", "graph_ms", "x"]), json_values, max_size=4), max_size=5),
    memory=json_values,
)
def test_calibration_json_with_hostile_fields(rows, memory):
    doc = {"format_version": 1, "kind": "bcgtune.calibration", "rows": rows, "memory": memory}
    _run_with_file(json.dumps(doc).encode(), lambda p, t, d: [["suggest-buckets", t, "--objective", "time", "--calibration", p]])


_toml_scalars = st.one_of(
    st.booleans(), st.integers(min_value=-(2**63), max_value=2**63 - 1), st.floats(allow_nan=True), st.text(max_size=20)
)
_toml_values = st.one_of(
    _toml_scalars,
    st.lists(st.integers(min_value=-(2**63), max_value=2**63 - 1), max_size=5),
    st.lists(st.text(max_size=8), max_size=3),
)
_keys = st.sampled_from(
    [
        "name",
        "platform",
        "model",
        "hardware",
        "tp-size",
        "tp",
        "cuda-graph-backend-prefill",
        "chunked-prefill-size",
        "list",
        "x",
        "random_input_len",
        "num_prompts",
        "max_concurrency",
        "prefill_floor_ms",
        "seed",
        "dataset_name",
        "dp_size",
    ]
)
_tables = st.dictionaries(_keys, _toml_values, max_size=6)


@settings(**SETTINGS)
@given(
    doc=st.dictionaries(
        st.sampled_from(["profile", "server", "env", "buckets", "client", "step_time", "extra"]), _tables, max_size=4
    )
)
def test_profiles_and_workloads_with_hostile_tables(doc):
    data = tomli_w.dumps(doc).encode()

    def args_for(p, t, d):
        yield ["doctor", "--no-sglang-probe", "--profile", p]
        yield ["serve", "--profile", p, "--dry-run"]
        yield ["trace", "--simulate", "--workload", p, "--num-prompts", "3"]
        yield ["drift", "--profile", p, "--trace", t]

    _run_with_file(data, args_for)


# ---- option values and output paths ------------------------------------------------------
_options = st.sampled_from(
    [
        "--max-buckets",
        "--align",
        "--max-bucket",
        "--padding-factor",
        "--chunked-prefill-size",
        "--max-graph-mem",
        "--seed",
        "--tp",
        "--dp",
        "--attn-cp-size",
        "--moe-dense-tp-size",
    ]
)


@settings(**SETTINGS)
@given(opts=st.lists(st.tuples(_options, st.one_of(numbers.map(_num_text), st.text(max_size=12))), max_size=3))
def test_suggest_with_hostile_option_values(opts):
    def args_for(p, t, d):
        args = ["suggest-buckets", t]
        for name, value in opts:
            args += [name, value]
        yield args

    _run_with_file(b"", args_for)


@settings(**SETTINGS)
@given(
    kind=st.sampled_from(["self", "folder", "dev", "missing-dir", "empty", "new", "trace"]),
    flag=st.sampled_from(["--plot", "--write-profile"]),
)
def test_hostile_output_paths(kind, flag):
    def args_for(p, t, d):
        target = {
            "self": p,
            "folder": d,
            "dev": "/dev/null",
            "missing-dir": os.path.join(d, "no", "x"),
            "empty": "",
            "new": os.path.join(d, "new.out"),
            "trace": t,
        }[kind]
        yield ["suggest-buckets", p, flag, target, "--base-profile", "h200"], [p]
        yield ["trace", "--log", p, "-o", target], [p]

    log = b"[2026-01-01 00:00:00] Prefill batch, #new-seq: 1, #new-token: 100, cuda graph: True\n"
    _run_with_file(GOOD_TRACE.encode() if kind != "self" else log, args_for)


# ---- the server commands and drift: hostile option values --------------------------------
_texts = st.one_of(
    numbers.map(_num_text),
    st.text(max_size=16),
    st.sampled_from(["", " ", "-", "/dev/zero", "/dev/null", "/", ".", "..", "x" * 300, "a:b", "a:list=", "A,X"]),
)


def _options(names):
    return st.lists(st.tuples(st.sampled_from(names), _texts), max_size=3)


def _flatten(pairs):
    return [x for name, value in pairs for x in (name, value)]


def _profile_copy(d):
    import shutil

    from bcgtune.files.profile_file import builtin_profile_path

    p = os.path.join(d, "p.toml")
    shutil.copy(builtin_profile_path("mi355x"), p)
    return p


@settings(**SETTINGS)
@given(
    opts=_options(["--port", "--model-path", "--log-file", "--grace", "--profile"]),
    extra=st.lists(_texts, max_size=3),
)
def test_serve_dry_run_with_hostile_values(opts, extra):
    def args_for(p, t, d):
        prof = _profile_copy(d)
        args = ["serve", "--profile", prof, "--dry-run", "--no-sglang-probe", "--python", "/bin/false", *_flatten(opts)]
        yield (args + (["--", *extra] if extra else [])), [p, t, prof]

    _run_with_file(GOOD_TRACE.encode(), args_for)


@settings(**SETTINGS)
@given(
    opts=_options(["--arm", "--order", "--concurrency", "--runs", "--prompts-per-concurrency", "--plot", "--profile"]),
    arms=st.lists(_texts, min_size=0, max_size=3),
)
def test_bench_with_hostile_values(opts, arms):
    """Everything up to the first launch: what is refused, is refused with one line."""
    from unittest import mock

    import bcgtune.services.bench as bench_service
    from bcgtune.errors import ExternalError

    def no_launch(*a, **k):
        raise ExternalError("stopped before the first launch (test)")

    def args_for(p, t, d):
        prof = _profile_copy(d)
        arm_args = _flatten(("--arm", a) for a in arms) or ["--arm", "a:disabled", "--arm", "b:profile"]
        yield ["bench", "--profile", prof, *arm_args, *_flatten(opts)], [p, t, prof]

    with mock.patch.object(bench_service, "run_bench", no_launch):
        _run_with_file(GOOD_TRACE.encode(), args_for)


@settings(**SETTINGS)
@given(opts=_options(["--profile", "--model-path", "--runner-source"]))
def test_doctor_with_hostile_values(opts):
    def args_for(p, t, d):
        yield ["doctor", "--no-sglang-probe", *_flatten(opts)], [p, t]
        yield ["doctor", "--no-sglang-probe", "--json", "--runner-source", p, *_flatten(opts)], [p, t]

    _run_with_file(b"def can_replay_locally(self): return True\n", args_for)


@settings(**SETTINGS)
@given(opts=_options(["--threshold", "--log", "--trace", "--calibration", "--profile"]), data=st.binary(max_size=300))
def test_drift_with_hostile_values(opts, data):
    def args_for(p, t, d):
        prof = _profile_copy(d)
        yield ["drift", "--profile", prof, "--trace", t, *_flatten(opts)], [p, t, prof]
        yield ["drift", "--profile", prof, "--log", p, *_flatten(opts)], [p, t, prof]
        yield ["drift", "--profile", prof, "--trace", t, "--calibration", p], [p, t, prof]

    _run_with_file(data, args_for)


# ---- the doors: inputs as the files they name, clusters and URLs, duplicates, stale temps ----
import contextlib  # noqa: E402
import fcntl  # noqa: E402
import http.server  # noqa: E402
import shutil  # noqa: E402
import socket  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

LOG_LINE = "[2026-01-01 00:00:00] Prefill batch, #new-seq: 1, #new-token: 100, cuda graph: True\n"
REAL_LOG = Path(__file__).parent / "data" / "sglang-logs" / "01_docker_desktop_outer_timestamp.log"


@pytest.fixture()
def logs(tmp_path):
    d = tmp_path / "logs"
    d.mkdir()
    (d / "a.log").write_text(LOG_LINE)
    (d / "b.log").write_text(LOG_LINE.replace("100", "300"))
    return d


@pytest.mark.parametrize(
    "form",
    [
        "{d}",
        "{d}/",
        "{d}/*.log",
        "{d}/?.log",
        "file://{d}/a.log",
        "file://{d}/*.log",
        "local://{d}/a.log",
        "simplecache::file://{d}/a.log",
        "{d}/../logs/a.log",
    ],
)
def test_an_output_is_refused_when_an_input_expands_to_it(logs, form):
    target = logs / "a.log"
    before = digest([target, logs / "b.log"])
    r = cli(["trace", "--log", form.format(d=logs), "-o", target])
    assert r.code == 2, r.err
    assert_one_line_error(r)
    assert "input of this run" in r.err and str(target) in r.err
    assert digest([target, logs / "b.log"]) == before


def test_an_output_beside_inputs_that_is_none_of_them_is_written(logs):
    for out in (logs / "t.json", logs / "new.log"):
        r = cli(["trace", "--log", logs, "-o", out, "-q"])
        assert r.code == 0, r.err
        assert out.exists()
        out.unlink()


def test_trace_merge_refuses_an_output_that_a_file_url_names(tmp_path):
    a, b = tmp_path / "a.json", tmp_path / "b.csv"
    assert cli(["trace", "--log", REAL_LOG, "-o", a, "-q"]).code == 0
    b.write_text("size,count\n64,1\n")
    before = digest([a, b])
    r = cli(["trace", "merge", f"file://{a}", b, "-o", a])
    assert r.code == 2 and "input of this run" in r.err, r.err
    assert digest([a, b]) == before


@contextlib.contextmanager
def _tcp_server(reply: bytes | None, close: bool = False):
    """A TCP server on 127.0.0.1 that sends `reply` to each connection (None: stays silent),
    then closes it when `close`."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()
    held = []

    def serve():
        while True:
            try:
                c, _ = srv.accept()
            except OSError:
                return
            if reply:
                c.sendall(reply)
            if close:
                c.close()
            else:
                held.append(c)

    threading.Thread(target=serve, daemon=True).start()
    try:
        yield f"tcp://127.0.0.1:{srv.getsockname()[1]}"
    finally:
        srv.close()
        for c in held:
            c.close()


@contextlib.contextmanager
def _http_server(root):
    handler = lambda *a, **k: http.server.SimpleHTTPRequestHandler(*a, directory=str(root), **k)  # noqa: E731
    handler_cls = type("Quiet", (http.server.SimpleHTTPRequestHandler,), {"log_message": lambda *a: None})
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), lambda *a: handler_cls(*a, directory=str(root)))
    del handler
    t = threading.Thread(target=httpd.serve_forever, daemon=True)
    t.start()
    try:
        yield httpd.server_address[1]
    finally:
        httpd.shutdown()
        httpd.server_close()


@pytest.mark.parametrize(
    "reply, close, found",
    [
        (None, False, "sent nothing"),
        (b"\xff" * 64, False, "not Dask's protocol"),
        (b"SSH-2.0-OpenSSH_9.6\r\n", False, "SSH server"),
        (b"", True, "closed the connection"),
        (b"\x00" * 8 + b"\xff" * 8, False, "not Dask's protocol"),  # a frame count no handshake has
    ],
)
def test_cluster_at_something_that_is_not_a_scheduler_fails_with_what_is_there(logs, reply, close, found):
    with _tcp_server(reply, close) as address:
        r = cli(["trace", "--log", logs / "a.log", "--cluster", address])
    assert r.code == 3, r.err
    assert_one_line_error(r)
    assert "not a Dask scheduler" in r.err and found in r.err and address in r.err


def test_cluster_at_an_http_server_names_it(logs, tmp_path):
    with _http_server(tmp_path) as port:
        r = cli(["trace", "--log", logs / "a.log", "--cluster", f"tcp://127.0.0.1:{port}"])
    assert r.code == 3, r.err
    assert_one_line_error(r)
    assert "an HTTP server answers there" in r.err


def test_cluster_where_nothing_listens(logs):
    r = cli(["trace", "--log", logs / "a.log", "--cluster", f"tcp://127.0.0.1:{free_port()}"])
    assert r.code == 3 and "nothing listens there" in r.err, r.err
    assert_one_line_error(r)


@pytest.mark.parametrize(
    "value, needle",
    [
        ("tcp://", "no host"),
        ("tcp://:8786", "no host"),
        ("inproc://x", "inproc://"),
        ("tcp://127.0.0.1:99999", "port"),
        ("tcp://127.0.0.1:x", "port"),
        ("udp://127.0.0.1:8786", "unknown scheduler protocol"),
        ("127.0.0.1:8786", "scheduler address"),
        ("local:-1", "local:N"),
    ],
)
def test_a_malformed_cluster_value_is_bad_input_before_dask_is_imported(logs, value, needle):
    code = (
        "import sys\nfrom bcgtune.cli.app import main\n"
        f"try:\n    main(['trace', '--log', {str(logs / 'a.log')!r}, '--cluster', {value!r}])\n"
        "except SystemExit as exc:\n    print('exit', exc.code, 'dask' in sys.modules or 'distributed' in sys.modules)\n"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=HANG_S)
    assert p.stdout.strip() == "exit 2 False", (p.stdout, p.stderr)
    assert needle in p.stderr and len([ln for ln in p.stderr.splitlines() if ln.startswith("error:")]) == 1


@pytest.mark.parametrize(
    "url, codes, needle",
    [
        ("ftp://127.0.0.1:{port}/x.log", {3}, "refused"),
        ("zip://x.log::file:///nonexistent-bcgtune.zip", {2}, "no such file"),
        ("zip://x.log::file://{log}", {2}, "archive"),
        ("hdfs://127.0.0.1:{port}/x.log", {2, 3}, "hdfs"),
        ("bogus://x/y.log", {2}, "bogus"),
    ],
)
def test_bad_urls_are_one_line_never_an_internal_error(url, codes, needle, tmp_path):
    pytest.importorskip("fsspec")
    log = tmp_path / "plain.log"
    log.write_text(LOG_LINE)
    r = cli(["trace", "--log", url.format(port=free_port(), log=log)])
    assert r.code in codes, r.err
    assert_one_line_error(r)
    assert needle in r.err.lower() or url.split(":")[0] in r.err


def test_trace_merge_refuses_the_same_histogram_twice(tmp_path):
    a, b, c = tmp_path / "a.csv", tmp_path / "b.csv", tmp_path / "c.csv"
    a.write_text(GOOD_TRACE)
    shutil.copy(a, b)
    c.write_text("size,count\n64,1\n")
    r = cli(["trace", "merge", a, a])
    assert r.code == 2 and "given twice" in r.err and str(a) in r.err, r.err
    r = cli(["trace", "merge", a, c, b, "--json"])
    assert r.code == 2 and f"same contents as {a}" in r.err and str(b) in r.err, r.err
    assert_one_line_error(r)
    r = cli(["trace", "merge", a, c, "--json"])
    assert r.code == 0 and json.loads(r.out)["batches"] == 12, r.err


def test_a_write_removes_the_temp_files_killed_writes_left(tmp_path):
    a, c = tmp_path / "a.csv", tmp_path / "c.csv"
    a.write_text(GOOD_TRACE)
    c.write_text("size,count\n64,1\n")
    out = tmp_path / "m.json"
    stale = tmp_path / ".m.json.k1ll3d00.tmp"
    stale.write_text("half a trace")
    held = tmp_path / ".m.json.wr1t1ng0.tmp"  # a write in progress holds its temp locked
    held.write_text("being written")
    other = tmp_path / ".other.json.k1ll3d00.tmp"  # another target's
    other.write_text("x")
    with open(held, "rb") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        r = cli(["trace", "merge", a, c, "-o", out])
    assert r.code == 0, r.err
    assert not stale.exists() and held.exists() and other.exists()
    assert str(stale) in r.err and "interrupted write" in r.err
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")) == sorted([other.name, held.name])


def test_a_killed_write_leaves_a_temp_that_the_next_write_removes(tmp_path):
    """A real kill (SIGKILL) in the middle of an atomic write, then the same write again."""
    out = tmp_path / "big.json"
    code = (
        "import os, signal\nfrom bcgtune.fileio import atomic_write_chunks\n"
        "def chunks():\n    yield b'x' * 1000\n    os.kill(os.getpid(), signal.SIGKILL)\n"
        f"atomic_write_chunks({str(out)!r}, chunks())\n"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=HANG_S)
    assert p.returncode == -9
    left = [q for q in tmp_path.iterdir() if q.name.endswith(".tmp")]
    assert len(left) == 1 and not out.exists()
    a = tmp_path / "a.csv"
    a.write_text(GOOD_TRACE)
    r = cli(["trace", "--log", REAL_LOG, "-o", out, "-q"])
    assert r.code == 0, r.err
    assert not left[0].exists() and str(left[0]) in r.err


# ---- left from before: checks that come first, values that were accepted -------------------
def _in_a_child(args: list[str]) -> tuple[int, str, bool]:
    """(exit code, stderr, whether torch was imported) of the CLI run in a fresh interpreter."""
    code = (
        "import sys\nfrom bcgtune.cli.app import main\n"
        f"try:\n    main({[str(a) for a in args]!r})\n"
        "except SystemExit as exc:\n    print(exc.code, 'torch' in sys.modules)\n"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=HANG_S)
    rc, torch_loaded = p.stdout.split()[-2:]
    return int(rc), p.stderr, torch_loaded == "True"


@pytest.mark.parametrize("name", ["out.csv", "out.CSV.gz"])
def test_calibrate_refuses_a_csv_for_the_breakable_runner_before_measuring(tmp_path, name):
    rc, err, torch_loaded = _in_a_child(
        ["calibrate", "--model", "tiny", "--device", "cpu", "--sizes", "16 32", "-o", tmp_path / name]
    )
    assert rc == 2 and "JSON only" in err and not torch_loaded, err
    assert not (tmp_path / name).exists()


def test_capture_takes_the_profiles_chunk_as_the_ceiling(tmp_path):
    pytest.importorskip("torch")
    prof = tmp_path / "p.toml"
    prof.write_text(
        '[profile]\nname = "p"\nplatform = "cuda"\nmodel = "tiny"\n\n[server]\nchunked-prefill-size = 256\n\n'
        "[buckets]\nlist = [128, 512]\n"
    )
    r = cli(["capture", "--profile", prof, "--model", "tiny", "--device", "cpu"])
    assert r.code == 2 and "512 is above the chunked-prefill ceiling 256" in r.err, r.err
    assert_one_line_error(r)


@pytest.mark.parametrize("backend", ["efficient", "cudnn"])
def test_an_sdpa_backend_without_a_cpu_kernel_is_refused(backend):
    pytest.importorskip("torch")
    r = cli(["capture", "--buckets", "16", "--model", "tiny", "--device", "cpu", "--sdpa-backend", backend])
    assert r.code == 2 and "--sdpa-backend" in r.err and "no " + backend in r.err, r.err
    assert_one_line_error(r)


def test_a_cpu_capture_says_no_graph_was_captured():
    pytest.importorskip("torch")
    r = cli(["capture", "--buckets", "16 32", "--model", "tiny", "--device", "cpu", "--sdpa-backend", "flash"])
    assert r.code == 0, r.err
    assert "no graphs captured" in r.out and "graph capture not checked" in r.out
    assert not [ln for ln in r.out.splitlines() if ln.rstrip().endswith(" ok")]


def _dp_trace_doc(tmp_path):
    from bcgtune.adapters.bench_serving.simulator import simulate
    from bcgtune.core.sim.workload import Workload
    from bcgtune.files.trace_file import save_trace

    w = Workload(
        dataset_name="random", num_prompts=[60], random_input_len=1500, random_output_len=20, random_range_ratio=0.2,
        max_concurrency=[16], chunked_prefill_size=4096, dp_size=4, enable_dp_attention=True, seed=3,
    )  # fmt: skip
    p = tmp_path / "dp.json"
    save_trace(simulate(w), str(p))
    return json.loads(p.read_text())


@pytest.mark.parametrize(
    "break_it, needle",
    [
        (lambda v, b: v["rank"].append(0), "differ in length"),
        (lambda v, b: v["rank"].__setitem__(0, 4), "not below meta.dp_attention.ranks"),
        (lambda v, b: v["step"].__setitem__(0, max(b["step"]) + 1000), "no step of the trace"),
        (lambda v, b: [v[k].append(v[k][0]) for k in ("step", "rank", "rows")], "votes twice"),
        (lambda v, b: (v["step"].__setitem__(0, b["step"][0]), v["rank"].__setitem__(0, b["rank"][0])), "both prefills"),
    ],
)
def test_bad_dp_decode_votes_are_refused(tmp_path, break_it, needle):
    doc = _dp_trace_doc(tmp_path)
    votes = doc["meta"]["dp_attention"]["decode_votes"]
    assert votes["step"]
    good = tmp_path / "good.json"
    good.write_text(json.dumps(doc))
    assert cli(["suggest-buckets", good, "--tp", "4", "--attn-dp-size", "4", "--json"]).code == 0
    break_it(votes, doc["batches"])
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    r = cli(["suggest-buckets", bad, "--tp", "4", "--attn-dp-size", "4"])
    assert r.code == 2 and needle in r.err and "decode_votes" in r.err, r.err
    assert_one_line_error(r)


@pytest.mark.parametrize("content", [bytes(range(256)) * 8, b"\xff\xfeclass PrefillCudaGraphRunner:\n"])
def test_doctor_refuses_a_runner_source_that_is_no_runner(tmp_path, content):
    f = tmp_path / "runner.py"
    f.write_bytes(content)
    r = cli(["doctor", "--no-sglang-probe", "--runner-source", f])
    assert r.code == 2 and f"--runner-source {f}" in r.err, r.err
    assert_one_line_error(r)


def test_doctor_judges_a_python_file_by_running_it_not_by_its_text(tmp_path):
    """Python text without the runner's class is for SGLang to judge by importing it; here
    SGLang is not asked, so it is not checked (exit 5), never refused for what it reads as."""
    f = tmp_path / "runner.py"
    f.write_text("x = 1\n")
    r = cli(["doctor", "--no-sglang-probe", "--runner-source", f, "--json"])
    assert r.code == 5 and json.loads(r.out)["prefill_runner_gate"]["state"] == "not checked", r.err


def test_api_doors():
    import bcgtune
    from bcgtune.errors import InputError

    t = bcgtune.trace_from_sizes([100, 200, 300])
    for call, field in (
        (lambda: t.percentile("50"), "q"),
        (lambda: t.percentile(b"50"), "q"),
        (lambda: bcgtune.suggest_buckets(t, bogus_kw=1), "bogus_kw"),
        (lambda: bcgtune.suggest_buckets(t, compare={1: [256]}), "compare"),
        (lambda: bcgtune.suggest_buckets(t, compare={"": [256]}), "compare"),
        (lambda: bcgtune.evaluate(t), "evaluate"),
        (lambda: bcgtune.evaluate(t, [256], 1.5), "evaluate"),
        (lambda: bcgtune.trace_from_sizes(), "trace_from_sizes"),
    ):
        with pytest.raises(InputError) as ei:
            call()
        assert ei.value.field == field, (ei.value, field)
    assert t.percentile(50) == 200
    assert bcgtune.suggest_buckets(t, compare={"mine": [256, 512]}).rows


def test_write_profile_keeps_a_byte_order_mark(tmp_path):
    prof = tmp_path / "mine.toml"
    prof.write_bytes(b"\xef\xbb\xbf" + (Path(__file__).parents[1] / "profiles" / "h200.toml").read_bytes())
    t = tmp_path / "t.csv"
    t.write_text(GOOD_TRACE)
    r = cli(["suggest-buckets", t, "--write-profile", prof, "-q", "--unchecked"])
    assert r.code == 0, r.err
    data = prof.read_bytes()
    assert data.startswith(b"\xef\xbb\xbf") and b"\xef\xbb\xbf" not in data[3:]
    from bcgtune.files.profile_file import load_profile

    assert load_profile(str(prof)).buckets  # still a profile, with the new list


@pytest.mark.parametrize("tokens", [str(2**70), str(2**31), "-" + str(2**70), "9" * 5000])
def test_a_calibration_csv_with_a_huge_token_count_names_the_row(tmp_path, tokens):
    cal = tmp_path / "c.csv"
    cal.write_text(f"tokens,eager_ms,graph_ms\n256,1.0,0.5\n{tokens},1.0,0.5\n")
    t = tmp_path / "t.csv"
    t.write_text(GOOD_TRACE)
    r = cli(["suggest-buckets", t, "--objective", "time", "--calibration", cal])
    assert r.code == 2 and f"{cal}:3" in r.err and "tokens" in r.err, r.err
    assert_one_line_error(r)
