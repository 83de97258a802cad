"""Hostile-input suite: the real CLI driven with generated garbage (bytes, JSON, TOML, option
values, output paths). Whatever comes in: no traceback, an exit code from the README's list
other than 4 (a bug), at most one `error:` line, the run's input files byte-identical
afterwards, and bounded time and memory (the peak resident size may not grow by 1 GiB in one run)."""

from __future__ import annotations

import json
import math
import os
import tempfile

import tomli_w
from cli_helpers import USER_EXIT_CODES, assert_one_line_error, cli, digest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

SETTINGS = dict(
    max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
SECONDS = 20.0
MEMORY_MIB = 1024  # no run may raise the process's peak memory by more than this


def _peak_rss_mib() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


GOOD_TRACE = "size,count\n100,5\n300,2\n700,1\n2000,3\n"


def _check(r, inputs_before, paths) -> None:
    assert r.code in USER_EXIT_CODES, (r.code, r.err[-1500:])
    assert_one_line_error(r)
    assert r.seconds < SECONDS, r.seconds
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
