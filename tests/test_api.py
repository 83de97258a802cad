"""The Python API's door: every argument checked as the command line checks its options.
A wrong type or value is an InputError naming the argument (never a raw TypeError,
AttributeError or ValueError from inside); numpy arrays and scalars count as the lists and
numbers they hold; `dir(bcgtune)` lists the API. A hypothesis suite throws hostile values
at every argument of every API function."""

from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path

import numpy as np
import pytest
from cli_helpers import hang_stop
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import bcgtune
from bcgtune.errors import BcgError, InputError

TRACE = bcgtune.trace_from_sizes([100] * 5 + [300] * 2 + [700] + [2000] * 3)
OTHER = bcgtune.trace_from_sizes([150, 900])
DP_LOG = Path(__file__).resolve().parent / "data" / "logs" / "e7_dp_attention_two_ranks.log"


def test_dir_lists_the_api():
    names = dir(bcgtune)
    for name in bcgtune.__all__:
        assert name in names
        assert name == "__version__" or callable(getattr(bcgtune, name))
    assert bcgtune.api.__all__ == [n for n in bcgtune.__all__ if n != "__version__"]


@pytest.mark.parametrize(
    "call, needle",
    [
        (lambda: bcgtune.suggest_buckets("trace.json"), "must be a PrefillTrace, got str (bcgtune.load_trace"),
        (lambda: bcgtune.evaluate("trace.json", [128]), "must be a PrefillTrace, got str"),
        (lambda: bcgtune.drift({"sizes": [1]}, [128]), "must be a PrefillTrace, got dict"),
        (lambda: bcgtune.save_trace(None, "t.json"), "must be a PrefillTrace, got None"),
        (lambda: bcgtune.trace_from_sizes(None), "must be a list of integers"),
        (lambda: bcgtune.trace_from_sizes(b"12"), "must be a list of integers"),
        (lambda: bcgtune.trace_from_sizes({"a": 1}), "must be a list of integers"),
        (lambda: bcgtune.trace_from_sizes("100 200"), "must be a list of integers"),
        (lambda: bcgtune.trace_from_sizes(5), "must be a list of integers"),
        (lambda: bcgtune.trace_from_sizes(np.array([100.5, 200])), "valid integer"),
        (lambda: bcgtune.trace_from_sizes(np.ones((2, 2), dtype=int)), "nested"),
        (lambda: bcgtune.evaluate(TRACE, None), "got None (buckets)"),
        (lambda: bcgtune.evaluate(TRACE, [128], padding_factor=float("nan")), "padding_factor"),
        (lambda: bcgtune.evaluate(TRACE, [128], padding_factor="x"), "padding_factor"),
        (lambda: bcgtune.drift(TRACE, None), "(deployed)"),
        (lambda: bcgtune.drift(TRACE, [128], threshold_pct="x"), "threshold_pct"),
        (lambda: bcgtune.drift(TRACE, [128], align=0), "(align)"),
        (lambda: bcgtune.drift(TRACE, [128], server_flags=["tp_size"]), "(server_flags)"),
        (lambda: bcgtune.suggest_buckets(TRACE, compare=[1, 2]), "(compare)"),
        (lambda: bcgtune.suggest_buckets(TRACE, server_flags=[1]), "(server_flags)"),
        (lambda: bcgtune.suggest_buckets(TRACE, calibration="cal.json"), "bcgtune.load_calibration"),
        (lambda: bcgtune.suggest_buckets(TRACE, align=[1]), "(align)"),
        (lambda: bcgtune.suggest_buckets(TRACE, attention_dp_size="x"), "(attention_dp_size)"),
        (lambda: bcgtune.suggest_buckets(TRACE, kmeans=None), "(kmeans)"),
        (lambda: bcgtune.suggest_buckets(TRACE, max_buckets=None), "(max_buckets)"),
        (lambda: bcgtune.suggest_buckets(TRACE, padding_factor=float("nan")), "(padding_factor)"),
        (lambda: TRACE.percentile(float("nan")), "(q)"),
        (lambda: TRACE.percentile(200), "(q)"),
        (lambda: TRACE.percentile("a"), "(q)"),
        (lambda: bcgtune.trace_from_logs(None), "(paths)"),
        (lambda: bcgtune.trace_from_logs([1]), "(paths)"),
        (lambda: bcgtune.load_trace(None), "(path)"),
        (lambda: bcgtune.load_calibration(3), "(path)"),
        (lambda: bcgtune.simulate_workload(1), "(workload)"),
        (lambda: bcgtune.merge_traces(TRACE), "must be a list of PrefillTrace, got PrefillTrace (traces)"),
        (lambda: bcgtune.merge_traces([]), "no trace to merge (traces)"),
        (lambda: bcgtune.merge_traces([TRACE, "t.json"]), "(traces[1])"),
        (lambda: bcgtune.merge_traces([TRACE, TRACE]), "the same trace is given twice"),
        (lambda: bcgtune.merge_traces([TRACE, OTHER], histogram_only=1), "(histogram_only)"),
        (lambda: bcgtune.suggest_buckets(TRACE, group=1), "the trace has 1 group (0..0), got 1 (group)"),
        (lambda: bcgtune.suggest_buckets(TRACE, group=-1), "(group)"),
        (lambda: bcgtune.drift(TRACE, [128], group=3), "(group)"),
        (lambda: bcgtune.drift(TRACE, [128], profiles=["h200"]), "not both (profiles)"),
        (lambda: bcgtune.drift(TRACE, profiles="h200"), "must be a list of profile files"),
        (lambda: bcgtune.drift(TRACE, profiles=[]), "no profile given (profiles)"),
        (lambda: bcgtune.drift(TRACE, profiles=["h200"], matches=[1]), "(matches)"),
        (lambda: bcgtune.drift(TRACE, profiles=["h200"], matches={"h200": "x"}), "(matches)"),
        (lambda: bcgtune.drift(TRACE, [128], matches={"h200": 0}), "give profiles (matches)"),
        (lambda: bcgtune.drift(TRACE), "(deployed)"),
        (lambda: bcgtune.trace_from_logs(["a.log"], cluster=5), "(cluster)"),
        (lambda: bcgtune.trace_from_logs(["a.log"], cluster="local", group=0), "(group)"),
        (lambda: bcgtune.trace_from_logs(["a.log"], cluster="nowhere"), "(cluster)"),
        (lambda: bcgtune.trace_from_logs(["a.log"], cluster="local:0"), "worker count 1..1024, got '0' (cluster)"),
        (lambda: bcgtune.trace_from_logs("-", cluster="local:1"), "standard input cannot be sent to a cluster (paths)"),
        (lambda: bcgtune.trace_from_logs(["a.log"], group=-1), "(group)"),
        (lambda: bcgtune.trace_from_logs(DP_LOG, group=1), "the trace has 1 group (0..0), got 1 (group)"),
        (lambda: bcgtune.trace_from_logs(["a.log"], group=True), "(group)"),
        (
            lambda: bcgtune.trace_from_logs(["a.log"], mixed_chunk=True, launch={"enable_mixed_chunk": False}),
            "contradicts mixed_chunk=True: give one of them (launch)",
        ),
        (lambda: bcgtune.drift(TRACE, profiles=["h200"], matches={"h200": -1}), "an integer 0, 1, ..., got -1 (matches)"),
        (lambda: bcgtune.drift(TRACE, profiles=["h200"], matches={"h200": 5}), "got 5 (matches)"),
        (lambda: bcgtune.drift(TRACE, profiles=["h200"], matches={"h200": [0, 1.5]}), "got 1.5 (matches)"),
        (lambda: bcgtune.drift(TRACE, profiles=["h200"], matches={None: 0}), "names a profile by its [profile] name"),
        (lambda: bcgtune.drift(TRACE, profiles=["h200"], matches={"nobody": 0}), "names none of the profiles given (h200)"),
        (lambda: bcgtune.drift(TRACE, profiles=["h200", "h200"]), "is given twice"),
        (lambda: bcgtune.drift(TRACE, profiles=[None]), "(profiles)"),
        (lambda: bcgtune.trace_summary("t.json"), "must be a PrefillTrace"),
    ],
)
def test_wrong_types_and_values_are_input_errors_naming_the_argument(call, needle):
    with pytest.raises(InputError) as ei:
        call()
    assert needle in str(ei.value), str(ei.value)


def test_numpy_arrays_and_scalars_are_accepted():
    sizes = np.array([100] * 5 + [300] * 2 + [700] + [2000] * 3, dtype=np.int32)
    t = bcgtune.trace_from_sizes(sizes)
    assert t.n_batches == TRACE.n_batches and t.percentile(np.float64(40)) == 100
    assert bcgtune.trace_from_sizes(np.array([7], dtype=np.uint16)).n_batches == 1
    a = bcgtune.evaluate(t, np.array([128, 512, 2048]))
    assert a == bcgtune.evaluate(t, [128, 512, 2048])
    plan = bcgtune.suggest_buckets(t, max_buckets=np.int64(3), compare={"mine": np.array([128, 512])}, seed=np.uint8(0))
    assert plan.recommended.buckets == bcgtune.suggest_buckets(t, max_buckets=3).recommended.buckets
    assert bcgtune.drift(t, np.array([128, 512, 2048])).verdict == bcgtune.drift(t, [128, 512, 2048]).verdict
    sim = bcgtune.simulate_workload(num_prompts=np.int64(4), max_concurrency=np.array([2]), dataset_name="random")
    assert sim.n_batches > 0
    by_hand = bcgtune.drift(t, profiles=np.array(["h200"]), matches={np.str_("h200"): np.array([0])})
    assert [r.deployed for r in by_hand.rows] == ["profile h200"]
    assert bcgtune.trace_from_logs(DP_LOG, group=np.int64(0)).n_batches == bcgtune.trace_from_logs(DP_LOG).n_batches


def test_a_path_object_and_one_log_path(tmp_path):
    log = tmp_path / "s.log"
    log.write_text("[2026-01-01 00:00:00] Prefill batch, #new-seq: 1, #new-token: 100, #cached-token: 0, cuda graph: True\n")
    assert bcgtune.trace_from_logs(log).n_batches == 1
    assert bcgtune.trace_from_logs([str(log)]).n_batches == 1
    bcgtune.save_trace(TRACE, tmp_path / "t.json")
    assert bcgtune.load_trace(tmp_path / "t.json").n_batches == TRACE.n_batches


def test_trace_from_logs_reads_what_the_command_line_reads(tmp_path):
    """Folders, globs, file:// and memory:// lists, and histogram_only, as `trace --log`."""
    import fsspec
    from cli_helpers import cli

    src = Path(__file__).resolve().parent / "data" / "sglang-logs"
    names = sorted(p.name for p in src.glob("*.log"))[:3]
    logs = tmp_path / "logs"
    logs.mkdir()
    for n in names:
        (logs / n).write_bytes((src / n).read_bytes())
    out = tmp_path / "cli.json"
    assert cli(["trace", "--log", logs, "--histogram-only", "-o", out, "-q"]).code == 0
    want = bcgtune.load_trace(out)
    for where in (logs, str(logs) + "/", str(logs / "*.log"), [f"file://{logs / n}" for n in names]):
        t = bcgtune.trace_from_logs(where, histogram_only=True)
        assert t.batches is None and t.sizes.tolist() == want.sizes.tolist() and t.counts.tolist() == want.counts.tolist()
    full = bcgtune.trace_from_logs(str(logs), jobs=1)
    assert full.batches is not None and full.sizes.tolist() == want.sizes.tolist()
    for n in names:
        with fsspec.open(f"memory://api-logs/{n}", "wb") as f:
            f.write((src / n).read_bytes())
    assert bcgtune.trace_from_logs(["memory://api-logs/"], histogram_only=True).counts.tolist() == want.counts.tolist()
    with pytest.raises(InputError, match=r"\(jobs\)"):
        bcgtune.trace_from_logs(logs, jobs=0)
    with pytest.raises(InputError, match=r"\(histogram_only\)"):
        bcgtune.trace_from_logs(logs, histogram_only="yes")


# ---- hostile values at every argument ---------------------------------------------------
SETTINGS = dict(
    max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
MEMORY_MIB = 1024  # no call may raise the process's peak memory by more than this


def _peak_rss_mib() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**80), max_value=2**80),
    st.sampled_from([0, -1, 1, 3, 64, 2**31 - 1, 2**31, 2**63]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12).filter(lambda s: s.strip() != "-"),
    st.binary(max_size=8),
)
_arrays = st.one_of(
    st.lists(st.integers(min_value=-(2**40), max_value=2**40), max_size=6).map(lambda v: np.array(v, dtype=np.int64)),
    st.lists(st.floats(allow_nan=True), max_size=4).map(lambda v: np.array(v, dtype=np.float64)),
    st.lists(st.booleans(), max_size=4).map(np.array),
    st.integers(min_value=-(2**31), max_value=2**31 - 1).map(np.int32),
    st.floats(allow_nan=True, width=32).map(np.float32),
    st.just(np.zeros((2, 2), dtype=np.int64)),
)
hostile = st.recursive(
    st.one_of(_scalars, _arrays),
    lambda c: st.lists(c, max_size=4) | st.tuples(c, c) | st.dictionaries(st.text(max_size=8), c, max_size=3),
    max_leaves=12,
)


def _calls() -> dict[str, tuple]:
    """API function -> (call with one keyword set, the keywords to try)."""
    return {
        "suggest_buckets": (
            lambda **kw: bcgtune.suggest_buckets(**{"trace": TRACE, **kw}),
            [
                "trace",
                "max_buckets",
                "align",
                "max_bucket",
                "objective",
                "calibration",
                "padding_factor",
                "compare",
                "chunked_prefill_size",
                "attention_dp_size",
                "server_flags",
                "max_graph_mem_gib",
                "candidates",
                "baselines",
                "seed",
                "group",
            ],
        ),
        "evaluate": (
            lambda **kw: bcgtune.evaluate(**{"trace": TRACE, "buckets": [128, 512], **kw}),
            ["trace", "buckets", "padding_factor"],
        ),
        "drift": (
            lambda **kw: bcgtune.drift(**{"trace": TRACE, "deployed": [128, 512], **kw}),
            ["trace", "deployed", "align", "server_flags", "calibration", "threshold_pct", "group", "profiles", "matches"],
        ),
        "merge_traces": (
            lambda **kw: bcgtune.merge_traces(**{"traces": [TRACE, OTHER], **kw}),
            ["traces", "histogram_only"],
        ),
        "trace_from_sizes": (lambda **kw: bcgtune.trace_from_sizes(**kw), ["sizes"]),
        "trace_from_logs": (
            lambda **kw: bcgtune.trace_from_logs(**{"paths": [], **kw}),
            ["paths", "mixed_chunk", "histogram_only", "jobs", "launch", "group", "cluster"],
        ),
        "load_trace": (lambda **kw: bcgtune.load_trace(**kw), ["path"]),
        "trace_summary": (lambda **kw: bcgtune.trace_summary(**{"trace": TRACE, **kw}), ["trace"]),
        "load_calibration": (lambda **kw: bcgtune.load_calibration(**kw), ["path"]),
        "save_trace": (lambda **kw: bcgtune.save_trace(**{"trace": TRACE, "path": "out.json", **kw}), ["trace", "path"]),
        "percentile": (lambda **kw: TRACE.percentile(**kw), ["q"]),
        "simulate_workload": (
            lambda **kw: bcgtune.simulate_workload(**{"num_prompts": 4, "max_concurrency": 2, **kw}),
            ["workload", "dataset_name", "image_resolution", "model_family", "seed", "random_range_ratio", "page_size"],
        ),
    }


CALLS = _calls()


@settings(**SETTINGS)
@given(data=st.data())
@pytest.mark.parametrize("function", sorted(CALLS))
def test_api_with_hostile_arguments(function, data):
    """Whatever an argument holds: a result or a bcgtune error, in bounded memory (a runaway is
    stopped as hung); never another
    exception."""
    call, names = CALLS[function]
    name = data.draw(st.sampled_from(names), label="argument")
    value = data.draw(hostile, label="value")
    if function == "suggest_buckets" and name == "trace" and value is None:
        value = []  # None simulates the built-in workload (valid, seconds): tested elsewhere
    cwd = os.getcwd()
    with tempfile.TemporaryDirectory() as d:
        os.chdir(d)  # hostile paths land in a scratch folder
        peak = _peak_rss_mib()
        try:
            with hang_stop():  # a runaway is stopped as hung; no call is timed
                call(**{name: value})
        except BcgError:
            pass
        finally:
            os.chdir(cwd)
        assert _peak_rss_mib() - peak < MEMORY_MIB


def test_hostile_values_do_reach_the_checks():
    """The strategy's values are refused by name (the suite is not passing on luck)."""
    for value in (None, "x", b"x", {"a": 1}, float("nan"), [[1]], np.zeros((2, 2))):
        with pytest.raises(InputError, match=r"\(buckets\)"):
            bcgtune.evaluate(TRACE, value)
    assert not math.isnan(bcgtune.evaluate(TRACE, np.array([128])).hit_rate_pct)


def test_merge_and_groups_through_the_api_agree_with_the_command_line(tmp_path):
    """Traces of two server configurations merged (as `trace merge`), then one configuration
    priced and judged by its group, as `suggest-buckets --group` and `drift` do."""
    from pathlib import Path

    from cli_helpers import cli

    logs = Path(__file__).resolve().parent / "data"
    a = bcgtune.trace_from_logs([logs / "logs" / "e7_dp_attention_two_ranks.log"])
    b = bcgtune.trace_from_logs([logs / "sglang-logs" / "24_newest_decode_graph_end_startup_and_load.log"])
    merged = bcgtune.merge_traces([a, b], histogram_only=True)
    assert merged.n_batches == a.n_batches + b.n_batches and len(merged.groups) == 2
    assert merged.batches is None
    for call in (lambda: bcgtune.suggest_buckets(merged, max_buckets=4), lambda: bcgtune.drift(merged, [256])):
        with pytest.raises(InputError, match=r"2 server configurations.*price one with group=N.*\(group\)"):
            call()
    bcgtune.save_trace(a, tmp_path / "a.json")
    bcgtune.save_trace(b, tmp_path / "b.json")
    r = cli(
        [
            "trace",
            "merge",
            str(tmp_path / "a.json"),
            str(tmp_path / "b.json"),
            "--histogram-only",
            "-o",
            str(tmp_path / "m.json"),
            "-q",
        ]
    )
    assert r.code == 0, r.err
    for group in (0, 1):
        plan = bcgtune.suggest_buckets(merged, max_buckets=4, group=group)
        r = cli(["suggest-buckets", str(tmp_path / "m.json"), "-k", "4", "--group", str(group), "--json"])
        assert r.code == 0, r.err
        assert json.loads(r.out)["recommended"]["buckets"] == plan.recommended.buckets
        assert bcgtune.drift(merged, plan.recommended.buckets, group=group).verdict == "keep"
