"""A fleet's logs: traces that know their servers (groups), merge, histogram-only traces,
logs over URLs (a local HTTP server), a Dask LocalCluster run, head-cut and glued lines,
the mixed-chunk hint, and drift over many profiles or configurations."""

from __future__ import annotations

import gzip
import http.server
import json
import socket
import threading
from functools import partial
from pathlib import Path

import numpy as np
import pytest
from cli_helpers import HANG_S, assert_one_line_error, cli
from hypothesis import given, settings
from hypothesis import strategies as st

from bcgtune.adapters.sglang.log import ParseOptions, parse_logs, parse_server_args_text
from bcgtune.core.trace.groups import launch_settings
from bcgtune.core.trace.merge import merge_traces
from bcgtune.core.trace.prefill_trace import PrefillTrace
from bcgtune.errors import ExternalError, InputError
from bcgtune.files.trace_file import load_trace, save_trace

SHARED_LOGS = Path(__file__).resolve().parent / "data" / "sglang-logs"
OUR_LOGS = Path(__file__).resolve().parent / "data" / "logs"
ALL_LOGS = sorted(SHARED_LOGS.glob("*.log")) + sorted(OUR_LOGS.glob("*.log"))


def server_log(
    chunk: int, tokens: list[int], *, model="org/Model-8B", tp=1, dp=1, dp_attention=False, running=None, seqs=None, extra=None
):
    """A log as SGLang 0.5.23 writes it: server_args (resolved: the chunk per attention-DP
    rank), the scheduler's startup line, then one prefill line per batch."""
    args = {
        "model_path": model,
        "tp_size": tp,
        "dp_size": dp,
        "enable_dp_attention": dp_attention,
        "chunked_prefill_size": chunk,
        "moe_dense_tp_size": None,
        **(extra or {}),
    }
    lines = [
        f"[2026-12-01 00:00:00] server_args={args!r}",
        f"[2026-12-01 00:00:01 TP0] max_total_num_tokens=400000, chunked_prefill_size={chunk}, max_prefill_tokens=16384, "
        "max_running_requests=4096, context_len=40960, available_gpu_mem=10.54 GB",
    ]
    for i, n in enumerate(tokens):
        r = 0 if running is None else running[i]
        s = 1 + i % 3 if seqs is None else seqs[i]
        lines.append(
            f"[2026-12-01 00:{i // 60 % 60:02d}:{i % 60:02d} TP0] Prefill batch, #new-seq: {s}, #new-token: {n}, "
            f"#cached-token: 0, token usage: 0.05, #running-req: {r}, #queue-req: 0, cuda graph: {n <= chunk}"
        )
    return "\n".join(lines) + "\n"


def _json(trace: PrefillTrace) -> dict:
    obj = trace.to_json_obj()
    obj.pop("created", None)
    return json.loads(json.dumps(obj))


@pytest.fixture()
def two_servers(tmp_path):
    """The issue's case: one server with 2048-token chunks, one with a 15,134-token batch."""
    a = tmp_path / "small.log"
    a.write_text(server_log(2048, [100, 700, 2048, 2048, 1500, 300]))
    b = tmp_path / "big.log"
    b.write_text(server_log(16384, [15134, 9000, 4000, 16384, 800], model="org/Other-70B", tp=8))
    return a, b


# ---- launch settings ----------------------------------------------------------------------
def test_server_args_in_both_forms_and_dp_attention_chunk():
    new = parse_server_args_text(
        "[2026-12-01 00:00:00] server_args={'model_path': 'Qwen/Qwen3-8B', 'tp_size': 4, 'dp_size': 4, "
        "'enable_dp_attention': True, 'chunked_prefill_size': 2048, 'json_model_override_args': '{\"tp_size\": 99}'}"
    )
    assert new["settings"] == {
        "model_path": "Qwen/Qwen3-8B",
        "tp_size": 4,
        "dp_size": 4,
        "enable_dp_attention": True,
        "chunked_prefill_size": 2048,
    }
    old = parse_server_args_text("server_args=ServerArgs(model_path='m', tp_size=2, chunked_prefill_size=8192, dp_size=1)")
    assert old["settings"] == {"model_path": "m", "tp_size": 2, "chunked_prefill_size": 8192, "dp_size": 1}
    assert parse_server_args_text("server_args=garbage tp_size=3") is None
    # SGLang logs the chunk of one attention-DP rank; the launch flag is that times the ranks
    flags, chunk = launch_settings(new["settings"], {"chunked_prefill_size": 2048})
    assert chunk == 2048 and flags["chunked_prefill_size"] == 8192


def test_batches_grouped_by_launch(two_servers, tmp_path):
    a, b = two_servers
    t = parse_logs([str(a), str(b)])
    assert [g.rank_chunk for g in t.groups] == [2048, 16384]
    assert [g.sources for g in t.groups] == [[0], [1]]
    assert t.batches["group"].tolist() == [0] * 6 + [1] * 5
    assert t.groups[1].settings["tp_size"] == 8 and "Other-70B" in t.groups[1].label()
    # one file, two launches (a restart with another chunk): two groups, split at server_args
    both = tmp_path / "restart.log"
    both.write_text(a.read_text() + b.read_text())
    r = parse_logs([str(both)])
    assert [g.n_batches for g in r.groups] == [6, 5] and r.groups[0].sources == r.groups[1].sources == [0]


# ---- per-group pricing --------------------------------------------------------------------
def test_a_mixed_trace_is_refused_naming_its_groups(two_servers, tmp_path):
    a, b = two_servers
    out = tmp_path / "t.json"
    r = cli(["trace", "--log", a, b, "-o", out])
    assert r.code == 0, r.err
    r = cli(["suggest-buckets", out])
    assert r.code == 2 and r.out == ""
    assert_one_line_error(r)
    assert "2 server configurations" in r.err and "group 0 (" in r.err and "group 1 (" in r.err
    assert "chunk 2048" in r.err and "chunk 16384" in r.err and "--group N" in r.err


def test_each_group_priced_with_its_own_ceiling(two_servers, tmp_path):
    a, b = two_servers
    out = tmp_path / "t.json"
    assert cli(["trace", "--log", a, b, "-o", out]).code == 0
    big = cli(["suggest-buckets", out, "--group", "1", "--json", "-k", "4"])
    assert big.code == 0, big.err
    plan = json.loads(big.out)
    assert plan["params"]["max_bucket"] == 16384  # the big server's ceiling, not the first group's 2048
    assert plan["recommended"]["eager_batches"] == 0 and max(plan["recommended"]["buckets"]) >= 15134
    small = json.loads(cli(["suggest-buckets", out, "--group", "0", "--json"]).out)
    assert small["params"]["max_bucket"] == 2048 and small["trace"]["batches"] == 6
    # the API decides the same way
    from bcgtune.services.suggest import SuggestRequest, suggest

    with pytest.raises(InputError, match="server configurations"):
        suggest(SuggestRequest(trace=load_trace(str(out))))
    res = suggest(SuggestRequest(trace=load_trace(str(out)), group=1, max_buckets=4))
    assert res.plan.recommended.buckets == plan["recommended"]["buckets"]
    r = cli(["suggest-buckets", out, "--group", "7"])
    assert r.code == 2 and "0..1" in r.err


def test_logged_dp_attention_layout_prices_steps(tmp_path):
    log = tmp_path / "dp.log"
    log.write_text(server_log(1024, [512, 1024, 300], tp=4, dp=4, dp_attention=True))
    t = parse_logs([str(log)])
    assert t.groups[0].settings["chunked_prefill_size"] == 4096 and t.groups[0].rank_chunk == 1024
    save_trace(t, str(tmp_path / "dp.json"))
    r = cli(["suggest-buckets", tmp_path / "dp.json", "--json"])
    assert r.code == 0, r.err
    assert "DP attention on 4 ranks" in r.err and "--tp 4 --dp 4 --dp-attention" in r.err
    assert json.loads(r.out)["dp_attention"]["ranks"] == 4


# ---- options after the list of logs ---------------------------------------------------------
def test_options_may_follow_the_list_of_logs(two_servers, tmp_path):
    a, b = two_servers
    r = cli(["trace", "--log", a, b, "--json"])
    assert r.code == 0, r.err
    assert json.loads(r.out)["batches"] == 11
    out = tmp_path / "x.json"
    r = cli(["trace", "--log", a, b, "-o", out, "--quiet"])
    assert r.code == 0 and load_trace(str(out)).n_batches == 11
    r = cli(["drift", "--log", a, b, "--group", "0", "-p", "h200", "--json"])
    assert r.code in (0, 1) and json.loads(r.out)


# ---- merge ----------------------------------------------------------------------------------
def _log_traces(histogram_only=False):
    files = [p for p in ALL_LOGS if parse_logs_ok(p)][:9]
    return [parse_logs([str(p)], histogram_only=histogram_only) for p in files], files


def parse_logs_ok(p) -> bool:
    try:
        parse_logs([str(p)])
        return True
    except InputError:
        return False


@pytest.mark.parametrize("histogram_only", [False, True])
def test_merge_of_parses_is_the_parse_of_all(histogram_only):
    traces, files = _log_traces(histogram_only)
    merged = merge_traces(traces)
    whole = parse_logs([str(p) for p in files], histogram_only=histogram_only)
    assert _json(merged) == _json(whole)


@settings(max_examples=25, deadline=None)
@given(cuts=st.lists(st.integers(1, 8), min_size=1, max_size=4, unique=True), histogram_only=st.booleans())
def test_merge_is_associative(cuts, histogram_only):
    traces, _ = _TRACES[histogram_only]
    flat = _json(merge_traces(traces))
    bounds = [0, *sorted(c for c in cuts if c < len(traces)), len(traces)]
    parts = [merge_traces(traces[lo:hi]) for lo, hi in zip(bounds, bounds[1:]) if hi > lo]
    assert _json(merge_traces(parts)) == flat
    left = merge_traces([merge_traces(traces[:2]), *traces[2:]])
    right = merge_traces([traces[0], merge_traces(traces[1:])])
    assert _json(left) == _json(right) == flat


_TRACES = {False: _log_traces(False), True: _log_traces(True)}


def test_merge_keeps_provenance_and_groups(two_servers, tmp_path):
    a, b = two_servers
    ta, tb = tmp_path / "a.json", tmp_path / "b.json"
    save_trace(parse_logs([str(a)]), str(ta))
    save_trace(parse_logs([str(b)]), str(tb))
    out = tmp_path / "ab.json"
    r = cli(["trace", "merge", ta, tb, "-o", out])
    assert r.code == 0, r.err
    m = load_trace(str(out))
    assert [s["path"] for s in m.sources] == [str(a), str(b)]
    assert [g.rank_chunk for g in m.groups] == [2048, 16384] and m.batches["source"].tolist() == [0] * 6 + [1] * 5
    assert _json(m) == _json(parse_logs([str(a), str(b)]))


def test_merge_refusals_are_one_line(two_servers, tmp_path):
    a, b = two_servers
    full, hist, again = tmp_path / "full.json", tmp_path / "hist.json", tmp_path / "again.json"
    save_trace(parse_logs([str(a)]), str(full))
    save_trace(parse_logs([str(b)], histogram_only=True), str(hist))
    save_trace(parse_logs([str(a)]), str(again))
    mixed = tmp_path / "mixed.json"
    both = tmp_path / "both.json"
    save_trace(parse_logs([str(b)], mixed_chunk=True), str(mixed))
    # each launch counts its forwards by its own settings: traces of two configurations merge
    r = cli(["trace", "merge", full, mixed, "-o", both])
    assert r.code == 0, r.err
    assert [g.settings.get("enable_mixed_chunk") for g in load_trace(str(both)).groups] == [None, True]
    # a trace written before that counted every batch by one rule: parsed again, not merged
    older = parse_logs([str(b)])
    older.meta["forward_tokens_rule"] = "new_token + replay_token + running_req (mixed chunk)"
    save_trace(older, str(mixed))
    sim = tmp_path / "sim.json"
    assert cli(["trace", "--simulate", "--num-prompts", "20", "-o", sim, "--quiet"]).code == 0
    csv = tmp_path / "h.csv"
    csv.write_text("size,count\n10,2\n")
    cases = [
        ([full, hist], "histogram-only: merge with --histogram-only"),
        ([full, again], "would count twice"),
        ([full, mixed], "trace the older one's logs again"),
        ([full, sim], "simulation"),
        ([full, csv], "plain histogram"),
        ([full], "at least two"),
    ]
    for args, needle in cases:
        r = cli(["trace", "merge", *args])
        assert r.code == 2, (args, r.err)
        assert_one_line_error(r)
        assert needle in r.err, r.err
    r = cli(["trace", "merge", full, hist, "--histogram-only", "--json"])
    assert r.code == 0 and json.loads(r.out)["histogram_only"] is True


def test_a_log_is_known_by_its_digest_in_merges_and_profiles(two_servers, tmp_path):
    """A trace names each log by the XXH3-128 of its bytes; one written before (sha256) is
    still told apart by its own digest; a list tuned on a log records the log's digest."""
    import xxhash

    a, _ = two_servers
    t = parse_logs([str(a)])
    assert t.sources[0]["xxh128"] == xxhash.xxh3_128(a.read_bytes()).hexdigest() and "sha256" not in t.sources[0]
    old = []
    for n in range(2):  # two older traces of one log: sources with sha256
        doc = t.to_json_obj()
        doc["sources"] = [{"path": str(a), "sha256": "ab" * 32, "bytes": a.stat().st_size}]
        doc["created"] = f"2026-01-0{n + 1}T00:00:00"  # not the same file twice
        old.append(tmp_path / f"old{n}.json")
        old[-1].write_text(json.dumps(doc))
    r = cli(["trace", "merge", *old])
    assert r.code == 2 and "sha256 abababababab" in r.err and "would count twice" in r.err, r.err
    prof = tmp_path / "p.toml"
    new = tmp_path / "new.json"
    save_trace(t, str(new))
    r = cli(
        ["suggest-buckets", new, "-k", "3", "--no-baselines", "--write-profile", prof, "--base-profile", "h200", "--unchecked"]
    )
    assert r.code == 0, r.err
    from bcgtune.files.profile_file import load_profile

    assert load_profile(str(prof)).provenance["trace_xxh128"] == t.sources[0]["xxh128"]
    r = cli(["suggest-buckets", old[0], "-k", "3", "--no-baselines", "--write-profile", prof, "--unchecked"])
    assert r.code == 0, r.err
    prov = load_profile(str(prof)).provenance
    assert prov["trace_sha256"] == "ab" * 32 and "trace_xxh128" not in prov


# ---- histogram-only ---------------------------------------------------------------------------
def _plans(trace: PrefillTrace, **kw):
    from bcgtune.services.suggest import SuggestRequest, suggest

    plan = suggest(SuggestRequest(trace=trace, **kw)).plan.to_json_obj()
    plan.pop("trace")
    plan.pop("created")
    return plan


def test_histogram_only_gives_the_plan_of_the_full_trace(tmp_path):
    from bcgtune.core.plan.calibration import BatchTimes, Calibration

    rng = np.random.default_rng(7)
    tokens = np.minimum(rng.lognormal(6.5, 1.1, 400).astype(int) + 1, 8192).tolist()
    seqs = rng.integers(1, 9, 400).tolist()
    log = tmp_path / "busy.log"
    log.write_text(server_log(8192, tokens, seqs=seqs))
    full, hist = parse_logs([str(log)]), parse_logs([str(log)], histogram_only=True)
    assert hist.batches is None and full.batches is not None
    grid = np.arange(64, 8193, 64)
    pairs = np.array(sorted({(n, min(r, n)) for n, r in zip(tokens, seqs)}))
    cal = Calibration(
        tokens=grid,
        eager_ms=None,
        graph_ms=0.02 * grid / 64 + 1.0,
        runner="breakable",
        batches=BatchTimes(pairs[:, 0], pairs[:, 1], 0.002 * pairs[:, 0] + 3.0, 0.05 * pairs[:, 1] + 0.01 * pairs[:, 0] / 64),
        meta={"bucket_grid": 64},
    )
    for kw in ({"max_buckets": 8}, {"max_buckets": 6, "objective": "time", "calibration": cal}):
        assert _plans(full, **kw) == _plans(hist, **kw)
    # ... and so does drift, over the file too
    h = tmp_path / "h.json"
    save_trace(hist, str(h))
    f = tmp_path / "f.json"
    save_trace(full, str(f))
    rh, rf = cli(["drift", "-p", "h200", "--trace", h, "--json"]), cli(["drift", "-p", "h200", "--trace", f, "--json"])
    assert rh.code == rf.code and json.loads(rh.out) == json.loads(rf.out)


def test_hostile_group_sections_are_one_line_errors(two_servers, tmp_path):
    a, _ = two_servers
    doc = _json(parse_logs([str(a)], histogram_only=True))
    bad = []
    empty = json.loads(json.dumps(doc))
    empty["groups"].append(
        {**empty["groups"][0], "histogram": {"sizes": [], "counts": []}, "mix": {"tokens": [], "requests": [], "counts": []}}
    )
    bad.append((empty, "empty group"))
    off = json.loads(json.dumps(doc))
    off["groups"][0]["histogram"]["counts"][0] += 1
    bad.append((off, "add up"))
    ghost = json.loads(json.dumps(doc))
    ghost["groups"][0]["sources"] = [5]
    bad.append((ghost, "does not exist"))
    crowd = json.loads(json.dumps(doc))
    crowd["groups"][0]["mix"]["requests"][0] = 10**6
    bad.append((crowd, "more requests than tokens"))
    col = _json(parse_logs([str(a)]))
    col["batches"]["group"][0] = 3
    bad.append((col, "batches.group"))
    for obj, needle in bad:
        p = tmp_path / "bad.json"
        p.write_text(json.dumps(obj))
        for args in (["suggest-buckets", p], ["drift", "-p", "h200", "--trace", p], ["trace", "merge", p, p]):
            r = cli(args)
            assert r.code == 2, (needle, args, r.err)
            assert_one_line_error(r)
            assert needle in r.err, (needle, r.err)


# ---- head-cut, glued, mixed chunk -------------------------------------------------------------
def test_head_cut_and_glued_lines_counted_and_reported(tmp_path):
    log = tmp_path / "messy.log"
    p = "[2026-12-01 00:00:0{s} TP0] Prefill batch, #new-seq: 1, #new-token: {n}, #cached-token: 0, cuda graph: True"
    d = "[2026-12-01 00:00:05 TP0] Decode batch, #running-req: 1, #token: 5, cuda graph: True, gen throughput (token/s): 1.0"
    log.write_text(
        "\n".join(
            [
                p.format(s=1, n=10),
                "batch. #new-seq: 1, #new-token: 32, #cached-token: 0, token usage: 0.01",
                p.format(s=2, n=11) + p.format(s=3, n=12),  # two prefill lines on one line
                d + p.format(s=4, n=13)[26:],  # a prefill line without its prefix, glued to a decode line
                "x" + p.format(s=5, n=14)[1:],  # the prefix lost its `[`
            ]
        )
        + "\n"
    )
    for opts in (ParseOptions(), ParseOptions(fast_path=False), ParseOptions(small_piece=-1)):
        t = parse_logs([str(log)], options=opts)
        assert t.batches["new_token"].tolist() == [10, 11, 12, 13, 14]
        assert t.meta["ranks"] == ["TP0"] and (t.batches["rank"] == 0).all()  # glued lines keep their rank tag
        assert t.meta["rank_overlap"]["printers"] == 1
        ps = t.parse_stats
        assert ps["head_cut_lines"] == 1 and ps["head_cut_samples"][0]["line"] == 2
        assert ps["glued_lines"] == 2 and [s["line"] for s in ps["glued_samples"]] == [3, 4]
    r = cli(["trace", "--log", log])
    assert r.code == 0 and "head-cut prefill lines  1" in r.out and "glued lines  2" in r.out


def test_mixed_chunk_signature_prints_the_hint(tmp_path):
    chunk = 512
    running = [7, 12, 3, 30, 0, 9]
    tokens = [chunk - r for r in running[:4]] + [200, chunk - 9]
    log = tmp_path / "mixed.log"
    log.write_text(server_log(chunk, tokens, running=running))
    r = cli(["trace", "--log", log])
    assert r.code == 0 and "hint:" in r.out and "--mixed-chunk" in r.out and "#new-token + #running-req" in r.out
    r = cli(["trace", "--log", log, "--mixed-chunk"])
    assert r.code == 0 and "hint:" not in r.out
    plain = tmp_path / "plain.log"
    plain.write_text(server_log(chunk, [chunk, chunk, chunk, 100], running=[7, 12, 3, 0]))
    assert "hint:" not in cli(["trace", "--log", plain]).out


# ---- logs over URLs ---------------------------------------------------------------------------
@pytest.fixture()
def http_root(tmp_path):
    """A local HTTP server over tmp_path (started by the test, on a free port)."""
    handler = partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path))
    handler.log_message = lambda *a, **k: None  # type: ignore[attr-defined]
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield tmp_path, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_logs_over_http_with_gz_and_progress(http_root):
    root, url = http_root
    data = (SHARED_LOGS / "24_newest_decode_graph_end_startup_and_load.log").read_bytes()
    (root / "a.log").write_bytes(data)
    (root / "a.log.gz").write_bytes(gzip.compress(data))
    local = parse_logs([str(root / "a.log")])
    for name in ("a.log", "a.log.gz"):
        calls: list = []
        t = parse_logs([f"{url}/{name}"], progress=lambda d, o, calls=calls: calls.append((d, o)))
        assert t.batches["forward_tokens"].tolist() == local.batches["forward_tokens"].tolist()
        assert t.sources[0]["xxh128"] == local.sources[0]["xxh128"] and t.sources[0]["path"] == f"{url}/{name}"
        size = (root / name).stat().st_size
        assert calls[-1] == (size, size)
    r = cli(["trace", "--log", f"{url}/a.log", f"{url}/a.log.gz", "--json"])
    assert r.code == 0 and json.loads(r.out)["batches"] == 2 * local.n_batches


def test_unreachable_and_missing_urls(http_root):
    _, url = http_root
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}/x.log"
    r = cli(["trace", "--log", dead])
    assert r.code == 3 and dead in r.err
    assert_one_line_error(r)
    r = cli(["trace", "--log", f"{url}/missing.log"])
    assert r.code == 2 and "no such file" in r.err
    assert_one_line_error(r)
    with pytest.raises(ExternalError):
        parse_logs([dead])


def test_protocol_without_its_package_names_it():
    pytest.importorskip("fsspec")
    import importlib.util

    if importlib.util.find_spec("s3fs") is not None:
        return
    r = cli(["trace", "--log", "s3://bucket/logs/x.log"])
    assert r.code == 2 and "s3fs" in r.err
    assert_one_line_error(r)


def test_folders_and_globs_of_logs(tmp_path):
    d = tmp_path / "logs"
    (d / "day").mkdir(parents=True)
    for i, p in enumerate(ALL_LOGS[:3]):
        (d / "day" / f"r{i}.log").write_bytes(p.read_bytes())
    (d / "day" / "notes.md").write_text("not a log")
    a = cli(["trace", "--log", d, "--json"])
    b = cli(["trace", "--log", str(d / "day" / "r*.log"), "--json"])
    assert a.code == b.code == 0 and json.loads(a.out)["sources"] == json.loads(b.out)["sources"]
    assert len(json.loads(a.out)["sources"]) == 3
    empty = tmp_path / "empty"
    empty.mkdir()
    r = cli(["trace", "--log", empty])
    assert r.code == 2 and "no log files there" in r.err


# ---- the distributed run ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def dask_cluster():
    """A LocalCluster of 2 worker processes, started the way `--cluster local:2` starts one;
    the tests reach it by its scheduler address (as `--cluster tcp://...` does)."""
    pytest.importorskip("distributed")
    from bcgtune.services.trace import _client

    client, local = _client("local:2")
    yield local.scheduler_address
    client.close()
    local.close()


def test_dask_cluster_gives_the_serial_trace(tmp_path, dask_cluster):
    from bcgtune.services.trace import trace_logs, trace_on_cluster

    files = [str(p) for p in ALL_LOGS if parse_logs_ok(p)]
    gz = tmp_path / "x.log.gz"
    gz.write_bytes(gzip.compress(Path(files[0]).read_bytes()))
    files.append(str(gz))
    on_cluster = trace_on_cluster(files, dask_cluster)
    serial = trace_logs(files, histogram_only=True)
    assert on_cluster.batches is None and _json(on_cluster) == _json(serial)
    r = cli(["trace", "--log", *files, "--cluster", dask_cluster, "--json"])
    assert r.code == 0 and json.loads(r.out)["batches"] == serial.n_batches


def test_dask_hostile_shards(tmp_path, dask_cluster):
    from bcgtune.services.trace import trace_on_cluster

    files = [str(p) for p in ALL_LOGS if parse_logs_ok(p)]
    bad = tmp_path / "corrupt.log.gz"
    blob = bytearray(gzip.compress(Path(files[1]).read_bytes() * 20))
    blob[len(blob) // 2] ^= 0xFF  # a flipped byte in the compressed stream
    bad.write_bytes(bytes(blob))
    with pytest.raises(InputError) as ei:
        trace_on_cluster([files[0], str(bad), files[1]], dask_cluster)
    assert ei.value.where == str(bad)
    r = cli(["trace", "--log", files[0], bad, "--cluster", dask_cluster])
    assert r.code == 2 and str(bad) in r.err
    assert_one_line_error(r)
    # an empty shard among others is fine; only empty shards is bad input
    empty = tmp_path / "empty.log"
    empty.write_text("")
    assert trace_on_cluster([files[0], str(empty)], dask_cluster).n_batches == parse_logs([files[0]]).n_batches
    with pytest.raises(InputError, match="no prefill batch lines"):
        trace_on_cluster([str(empty)], dask_cluster)
    r = cli(["trace", "--log", "-", "--cluster", dask_cluster])
    assert r.code == 2 and "standard input" in r.err


def test_cluster_option_errors():
    r = cli(["trace", "--log", str(ALL_LOGS[0]), "--cluster", "nowhere"])
    assert r.code == 2 and "scheduler address" in r.err
    r = cli(["trace", "--log", str(ALL_LOGS[0]), "--cluster", "local:0"])
    assert r.code == 2 and "local:N" in r.err
    r = cli(["trace", "--simulate", "--cluster", "local"])
    assert r.code == 2 and "apply to --log" in r.err


# ---- drift over a fleet ---------------------------------------------------------------------------
def test_drift_over_profiles_and_groups(two_servers, tmp_path):
    a, b = two_servers
    t = tmp_path / "t.json"
    assert cli(["trace", "--log", a, b, "-o", t]).code == 0
    small = tmp_path / "small.toml"
    small.write_text(
        '[profile]\nname = "small"\nplatform = "cuda"\nmodel = "org/Model-8B"\n\n[server]\nchunked-prefill-size = 2048\n\n'
        "[buckets]\nlist = [128, 256, 512, 1024, 2048]\n"
    )
    big = tmp_path / "big.toml"
    big.write_text(
        '[profile]\nname = "big"\nplatform = "cuda"\nmodel = "org/Other-70B"\n\n'
        "[server]\ntp = 8\nchunked-prefill-size = 16384\n\n"
        "[buckets]\nlist = [1024, 4096, 8192, 16384]\n"
    )
    r = cli(["drift", "-p", small, "-p", big, "--trace", t])
    assert r.code == 1, r.err  # the big server's list leaves its 15,134-token batch... priced, one re-tunes
    assert "2 lists judged" in r.out and "group 0" in r.out and "group 1" in r.out
    assert not [ln for ln in r.err.splitlines() if ln.startswith("error:")]  # the verdict once, on stdout
    js = json.loads(cli(["drift", "-p", small, "-p", big, "--trace", t, "--json"]).out)
    assert [row["group"] for row in js["rows"]] == [0, 1] and js["verdict"] in ("keep", "re-tune")
    r = cli(["drift", "-p", small, "--trace", t])
    assert "not judged" in r.out and "group 1" in r.out
    r = cli(["drift", "-p", "h200", "--trace", t])
    assert r.code == 2 and "agrees with none" in r.err and "--group N" in r.err


def test_drift_wording_write_profile_and_captured_lists(tmp_path):
    log = tmp_path / "s.log"
    body = server_log(8192, [3000, 3100, 2900, 3050, 100, 120, 90] * 5)
    body += (
        "[2026-12-01 00:00:00 TP0] Capture target prefill CUDA graph begin. "
        "backend=breakable, num_tokens=[64, 8192] (2), avail mem=10 GB\n"
    )
    log.write_text(body)
    prof = tmp_path / "p.toml"
    prof.write_text(
        '[profile]\nname = "p"\nplatform = "cuda"\n\n[server]\nchunked-prefill-size = 8192\n\n[buckets]\nlist = [64, 8192]\n'
    )
    before = prof.read_bytes()
    r = cli(["drift", "-p", prof, "--log", log, "--write-profile", prof, "--unchecked"])
    assert r.code == 1 and "verdict: RE-TUNE" in r.out and "-" not in r.out.split("wastes ")[1][:2]
    from bcgtune.files.profile_file import load_profile

    new = load_profile(str(prof))
    assert prof.read_bytes() != before and new.buckets and new.buckets != [64, 8192]
    r = cli(["drift", "-p", prof, "--log", log, "--write-profile", prof])
    assert r.code == 0 and "KEEP" in r.out and "kept" in r.err
    # no profile: every configuration judged by the list its servers logged capturing
    r = cli(["drift", "--log", log, "--json"])
    assert r.code == 1 and json.loads(r.out)["deployed"]["metrics"]["buckets"] == [64, 8192]


def test_drift_says_more_padding_when_the_optimum_pads_more():
    from bcgtune.core.plan.drift import drift_report

    t = PrefillTrace.from_sizes([60] * 50 + [100] * 50)
    rep = drift_report(t, [60], threshold_pct=2.0)  # the optimum replays all, and pads more
    assert rep.gains["waste_pp"] < 0 and "points more padding" in rep.reason and "-" not in rep.reason.split("wastes ")[1][:2]


def test_help_imports_no_fsspec_or_dask():
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from bcgtune.cli.app import run\n"
        "for args in (['--help'], ['trace', '--help'], ['trace', 'merge', '--help'], ['drift', '--help'], "
        "['suggest-buckets', '--help']):\n"
        "    assert run(args) == 0, args\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('fsspec', 'dask', 'distributed', 'aiohttp'))\n"
        "print('HEAVY', bad)\n"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=HANG_S)
    assert p.returncode == 0, p.stderr
    assert "HEAVY []" in p.stdout, p.stdout[-500:]


def test_trace_json_is_streamed_identically(monkeypatch):
    import bcgtune.files.trace_file as trace_mod

    t = parse_logs([str(p) for p in ALL_LOGS if parse_logs_ok(p)])
    whole = json.dumps(t.to_json_obj(), separators=(",", ":")) + "\n"
    monkeypatch.setattr(trace_mod, "_COLUMN_SLICE", 3)  # many slices per column
    streamed = "".join(trace_mod.json_text_chunks(t))
    a, b = json.loads(whole), json.loads(streamed)
    a.pop("created"), b.pop("created")
    assert a == b and len(whole) == len(streamed)


def test_a_mixed_trace_never_takes_the_first_groups_chunk(two_servers):
    a, b = two_servers
    t = parse_logs([str(a), str(b)])
    assert t.chunked_prefill_size() is None  # 2048 and 16384: no one chunk
    assert t.group_view(0).chunked_prefill_size() == 2048 and t.group_view(1).chunked_prefill_size() == 16384
    same = parse_logs([str(a), str(a)])
    assert same.chunked_prefill_size() == 2048


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 2**32 - 1), st.integers(0, 2**31 - 1)), min_size=1, max_size=60),
    st.booleans(),
)
def test_pairs_counted_one_each_equal_the_weighted_count(pairs, huge):
    """The run-length count of a log's batches (one each, sorted in place) gives what the
    weighted count gives with weights of one, and leaves its inputs as they were."""
    from bcgtune.core.trace.groups import pairs_of

    tokens = np.array([t for t, _ in pairs], np.int64)
    requests = np.array([r for _, r in pairs], np.int64)
    if huge:  # beyond the packed key: the general path
        tokens[0] = 2**40
    before = tokens.copy(), requests.copy()
    unit = pairs_of(tokens, requests)
    weighted = pairs_of(tokens, requests, np.ones(tokens.size, np.int64))
    for a, b in zip(unit, weighted):
        assert a.dtype == np.int64 and a.tolist() == b.tolist()
    assert int(unit[2].sum()) == len(pairs)
    assert tokens.tolist() == before[0].tolist() and requests.tolist() == before[1].tolist()


def test_parsed_columns_own_their_values(tmp_path):
    """Each chunk's columns are kept as arrays of their own, not views of the chunk's parse
    buffer (which would keep every buffer alive until the end of the log)."""
    from bcgtune.adapters.sglang.log.columns import _ColumnSink

    seen = []
    original = _ColumnSink.columns

    def spy(self):
        seen.extend(p for parts in self.parts.values() for p in parts)
        return original(self)

    log = tmp_path / "l.log"
    log.write_text(server_log(8192, [100 + 7 * i for i in range(200)]))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_ColumnSink, "columns", spy)
        parse_logs([str(log)])
    assert seen and all(p.base is None for p in seen)


def test_drift_judges_each_profile_on_the_configuration_it_serves(tmp_path):
    """Two healthy configurations (chunk 8192, the H200's default, and 2048): the profiles
    suggest-buckets writes for each state their chunk, and drift judges each on its own
    traffic only (exit 0, KEEP), names each configuration's files, leaves a configuration
    whose logs lost their startup lines unjudged (not an error) until --match pairs it, and
    --group filters what is judged."""
    import random

    from bcgtune.files.profile_file import load_profile

    model = load_profile("h200").model
    rng = random.Random(1)
    (tmp_path / "a.log").write_text(server_log(8192, [rng.randint(50, 8192) for _ in range(300)], model=model))
    (tmp_path / "b.log").write_text(server_log(2048, [rng.randint(50, 2048) for _ in range(300)], model=model))
    t = tmp_path / "ab.json"
    assert cli(["trace", "--log", tmp_path / "a.log", tmp_path / "b.log", "-o", t, "-q"]).code == 0
    profiles = []
    for g, chunk in ((0, 8192), (1, 2048)):
        p = tmp_path / f"p{g}.toml"
        r = cli(["suggest-buckets", t, "--group", str(g), "--write-profile", p, "--base-profile", "h200", "-q", "--unchecked"])
        assert r.code == 0, r.err
        assert load_profile(str(p)).server["chunked_prefill_size"] == chunk  # written even when the GPU's default
        profiles += ["-p", p]
    r = cli(["drift", *profiles, "--trace", t])
    assert r.code == 0, r.out + r.err
    assert "verdict: KEEP: all 2 lists" in r.out and "a.log" in r.out and "b.log" in r.out
    js = json.loads(cli(["drift", *profiles, "--trace", t, "--json"]).out)
    assert [(row["profile"].rsplit("/", 1)[-1], row["group"], row["matched"]) for row in js["rows"]] == [
        ("p0.toml", 0, "settings"),
        ("p1.toml", 1, "settings"),
    ]
    assert [f.rsplit("/", 1)[-1] for f in js["groups"]["1"]["files"]] == ["b.log"]
    # --group filters which configurations are judged
    js = json.loads(cli(["drift", *profiles, "--trace", t, "--group", "1", "--json"]).out)
    assert [(row["group"], row["deployed"]) for row in js["rows"]] == [(1, "profile p1")]
    assert any("profile p0" in u for u in js["unjudged"])
    # a rotated log (no startup lines) forms its own configuration: named, not judged, exit 0
    lines = (tmp_path / "a.log").read_text().splitlines()
    (tmp_path / "c.log").write_text("\n".join(lines[-100:]) + "\n")
    t3 = tmp_path / "abc.json"
    assert cli(["trace", "--log", tmp_path / "a.log", tmp_path / "b.log", tmp_path / "c.log", "-o", t3, "-q"]).code == 0
    r = cli(["drift", *profiles, "--trace", t3])
    assert r.code == 0, r.err
    assert "not judged: group 2" in r.out and "c.log" in r.out and "--match PROFILE=2" in r.out
    js = json.loads(cli(["drift", *profiles, "--trace", t3, "--match", "p0=2", "--json"]).out)
    assert sorted((row["deployed"], row["group"], row["matched"]) for row in js["rows"]) == [
        ("profile p0", 0, "settings"),
        ("profile p0", 2, "--match"),
        ("profile p1", 1, "settings"),
    ]
    assert js["unjudged"] == []
    r = cli(["drift", *profiles, "--trace", t3, "--match", "nobody=2"])
    assert r.code == 2 and "--match" in r.err
    assert_one_line_error(r)
    r = cli(["drift", *profiles, "--trace", t3, "--match", "p0=7"])
    assert r.code == 2 and "--match" in r.err
    assert_one_line_error(r)
    # a profile that states too little to tell the two apart is refused until paired by hand
    vague = tmp_path / "vague.toml"
    vague.write_text('[profile]\nname = "vague"\nplatform = "cuda"\n\n[buckets]\nlist = [512, 2048]\n')
    r = cli(["drift", "-p", vague, "-p", profiles[1], "--trace", t])
    assert r.code == 2 and "--match vague=N" in r.err
    assert_one_line_error(r)
    r = cli(["drift", "-p", vague, "-p", profiles[1], "--trace", t, "--match", "vague=1", "--json"])
    assert r.code in (0, 1) and {row["deployed"] for row in json.loads(r.out)["rows"]} == {"profile vague", "profile p0"}


def test_commands_agree_on_a_profiles_chunk(tmp_path):
    """A simulated trace that ran a 16,384-token chunk: suggest-buckets --write-profile from
    the H200 profile (no chunk stated: the GPU's 8192) writes the chunk it priced with the
    list, so no bucket lies above the profile's chunk; drift prices the H200 profile as it is
    deployed (SGLang's 58-graph ladder to 8192, as serve --dry-run says), and refuses
    batches that profile never forms with the remedy named."""
    from bcgtune.files.profile_file import load_profile

    def sim_trace(path, sizes):
        t = PrefillTrace.from_sizes(sizes)
        t.meta["workload"] = {"resolved": {"chunked_prefill_size": 16384}}
        save_trace(t, str(path))
        return path

    big = sim_trace(tmp_path / "big.json", [1000, 3000, 7000, 12000, 15000, 16384] * 20)
    new = tmp_path / "new.toml"
    r = cli(["suggest-buckets", big, "--write-profile", new, "--base-profile", "h200", "-k", "4", "-q", "--unchecked"])
    assert r.code == 0, r.err
    prof = load_profile(str(new))
    assert prof.server["chunked_prefill_size"] == 16384 and max(prof.buckets) <= 16384
    r = cli(["drift", "-p", "h200", "--trace", big])
    assert r.code == 2 and "set chunked-prefill-size = 16384" in r.err
    assert_one_line_error(r)
    small = sim_trace(tmp_path / "small.json", [1000, 3000, 7000, 8000] * 20)
    js = json.loads(cli(["drift", "-p", "h200", "--trace", small, "--json"]).out)
    dry = cli(["serve", "--profile", "h200", "--dry-run"])
    assert js["deployed"]["metrics"]["graphs"] == 58 and "captures   58 graphs" in dry.out + dry.err


def _die_with_parent() -> None:  # a child that outlives a killed test would hold the port and CPU
    import ctypes
    import signal as _signal

    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, _signal.SIGTERM)  # PR_SET_PDEATHSIG


@pytest.mark.skipif(not __import__("sys").platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_cluster_doc_commands_run_as_written(tmp_path):
    """docs/cluster.md's scheduler, worker and client commands, run as written (the
    scheduler host is this one, a free port, and 2 workers): the trace equals the serial
    histogram-only trace, with the logs given as a relative folder."""
    import os
    import subprocess
    import sys
    import time

    pytest.importorskip("distributed")
    from bcgtune.services.trace import trace_logs

    doc = (Path(__file__).resolve().parents[1] / "docs" / "cluster.md").read_text()
    block = doc.split("```text\n", 1)[1].split("```", 1)[0]
    cmds = [ln.strip() for ln in block.splitlines() if ln.strip() and not ln.startswith("#")]
    sched, worker, client = cmds
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    address = f"tcp://127.0.0.1:{port}"
    dask = [sys.executable, "-m", "distributed.cli.dask_scheduler"]
    assert sched.startswith("dask scheduler ") and worker.startswith("dask worker tcp://SCHEDULER_HOST:8786 ")
    sched_args = sched.split()[2:]
    sched_args[sched_args.index("--port") + 1] = str(port)
    worker_args = [address] + [a.replace("16", "2") for a in worker.split()[3:]]
    logs = tmp_path / "logs"
    logs.mkdir()
    for p in ALL_LOGS[:3]:
        (logs / p.name).write_bytes(p.read_bytes())
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    procs = []
    try:
        kw = dict(cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=_die_with_parent)
        procs.append(subprocess.Popen([*dask, "--host", "127.0.0.1", *sched_args, "--no-dashboard"], **kw))
        worker_dir = tmp_path / "worker"  # the workers run in another folder than the client
        worker_dir.mkdir()
        kw["cwd"] = worker_dir
        procs.append(
            subprocess.Popen([sys.executable, "-m", "distributed.cli.dask_worker", *worker_args, "--no-dashboard"], **kw)
        )
        from dask.distributed import Client

        deadline = time.monotonic() + 120
        while True:  # the workers joined
            try:
                with Client(address, timeout="5s") as c:
                    if len(c.scheduler_info()["workers"]) == 2:
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline, "the Dask workers did not start"
            time.sleep(0.5)
        argv = client.split()[1:]
        argv[argv.index("--log") + 1] = "logs/"  # relative, as a user might give it
        argv[argv.index("--cluster") + 1] = address
        argv[argv.index("-o") + 1] = "today.json"
        r = subprocess.run(
            [sys.executable, "-m", "bcgtune", *argv, "-q"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
        )
        assert r.returncode == 0, r.stderr[-2000:]
        serial = trace_logs([str(logs)], histogram_only=True)
        got = load_trace(str(tmp_path / "today.json"))
        assert got.sizes.tolist() == serial.sizes.tolist() and got.counts.tolist() == serial.counts.tolist()
        assert "error" not in r.stderr
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def test_profiles_written_per_group_pair_with_their_group(two_servers, tmp_path):
    """A profile written for one configuration of a fleet's trace carries that
    configuration's model and launch (not its base profile's), so drift pairs each profile
    with its configuration without --match; a failed pairing names the setting that differs."""
    from bcgtune.files.profile_file import load_profile

    a, b = two_servers
    t = tmp_path / "fleet.json"
    assert cli(["trace", "--log", a, b, "-o", t, "-q"]).code == 0
    for g in (0, 1):
        r = cli(["suggest-buckets", t, "--group", str(g), "--write-profile", tmp_path / f"p{g}.toml", "--base-profile",
                 "h200", "-k", "3", "--unchecked"])  # fmt: skip
        assert r.code == 0, r.err
        assert "launches as the logs of the traffic state: model org/" in r.err and "drift --match" not in r.err
    p0, p1 = load_profile(str(tmp_path / "p0.toml")), load_profile(str(tmp_path / "p1.toml"))
    assert p0.model == "org/Model-8B" and p0.server["chunked_prefill_size"] == 2048
    assert p1.model == "org/Other-70B" and p1.server["tp_size"] == 8 and p1.server["chunked_prefill_size"] == 16384
    r = cli(["drift", "-p", tmp_path / "p0.toml", "-p", tmp_path / "p1.toml", "--trace", t, "--json"])
    assert r.code in (0, 1), r.err
    rows = json.loads(r.out)["rows"]
    assert [(row["profile"].rsplit("/", 1)[-1], row["group"], row["matched"]) for row in rows] == [
        ("p0.toml", 0, "settings"), ("p1.toml", 1, "settings")
    ]  # fmt: skip
    # the API pairs them the same way
    from bcgtune import api

    report = api.drift(api.load_trace(t), profiles=[tmp_path / "p0.toml", tmp_path / "p1.toml"])
    assert [(row.group, row.matched) for row in report.rows] == [(0, "settings"), (1, "settings")]
    # the same profile twice would be judged, and counted in the verdict, twice
    r = cli(["drift", "-p", tmp_path / "p0.toml", "-p", str(tmp_path / "." / "p0.toml").replace("/p0", "/./p0"), "--trace", t])
    assert r.code == 2 and "is given twice" in r.err, r.err
    assert_one_line_error(r)
    # a profile of another model pairs with neither, and the error says in what
    other = tmp_path / "other.toml"
    other.write_text((tmp_path / "p1.toml").read_text().replace("org/Other-70B", "org/Third-1B"))
    r = cli(["drift", "-p", other, "--trace", t])
    assert r.code == 2 and "big.log): model org/Third-1B, the logs org/Other-70B" in r.err, r.err
    assert "small.log): model org/Third-1B, the logs org/Model-8B" in r.err
    assert_one_line_error(r)


def test_trace_writes_one_configuration_on_its_own(two_servers, tmp_path):
    """`trace --log ... --group N`: the configuration's own logs, parsed alone (its sources,
    statistics and batches only), the same as tracing those logs by themselves; a log that
    holds two configurations cannot be split by file and is refused, naming them."""
    a, b = two_servers
    t = tmp_path / "both.json"
    assert cli(["trace", "--log", a, b, "-o", t, "-q"]).code == 0
    groups = load_trace(str(t)).groups
    big = next(i for i, g in enumerate(groups) if g.rank_chunk == 16384)
    one, alone = tmp_path / "one.json", tmp_path / "alone.json"
    assert cli(["trace", "--log", a, b, "--group", str(big), "-o", one, "-q"]).code == 0
    assert cli(["trace", "--log", b, "-o", alone, "-q"]).code == 0
    assert _json(load_trace(str(one))) == _json(load_trace(str(alone)))
    r = cli(["trace", "--log", a, b, "--group", "2"])
    assert r.code == 2 and "(--group)" in r.err
    assert_one_line_error(r)
    restarted = tmp_path / "restarted.log"
    restarted.write_text(server_log(2048, [100, 200]) + server_log(8192, [5000, 6000]))
    r = cli(["trace", "--log", restarted, b, "--group", "0", "-q"])
    assert r.code == 2 and "restarted.log holds configurations" in r.err
    assert_one_line_error(r)


# ---- logs that lost their startup lines ---------------------------------------------------------
def _rotated(text: str) -> str:
    """A log rotated past its start: no server_args line, no startup line."""
    return "".join(ln + "\n" for ln in text.splitlines() if "server_args=" not in ln and "max_total_num_tokens" not in ln)


def test_launch_settings_given_to_rotated_logs_join_their_configuration(tmp_path):
    full = tmp_path / "full.log"
    full.write_text(server_log(2048, [100, 700, 2048, 1500]))
    rotated = tmp_path / "rotated.log"
    rotated.write_text(_rotated(server_log(2048, [300, 2048, 900])))
    plain = parse_logs([str(full), str(rotated)])
    assert len(plain.groups) == 2 and plain.groups[1].settings == {}
    # every setting the full log states (its startup line also states max_prefill_tokens)
    given = ["model_path=org/Model-8B", "--tp-size=1", "dp_size=1", "enable_dp_attention=false", "chunked_prefill_size=2048",
             "max_prefill_tokens=16384"]  # fmt: skip
    for hist in (False, True):
        out = tmp_path / f"t{hist}.json"
        r = cli(["trace", "--log", full, rotated, *[a for g in given for a in ("--launch", g)], "-o", out]
                + (["--histogram-only"] if hist else []))  # fmt: skip
        assert r.code == 0, r.err
        t = load_trace(str(out))
        assert len(t.groups) == 1 and sorted(t.groups[0].sources) == [0, 1] and t.groups[0].rank_chunk == 2048
        assert "launch settings given with --launch, not logged, for 1 file(s): " in r.out and str(rotated) in r.out
    # logged settings win: the full log keeps its own, the given ones go to the rotated log only
    r = cli(["trace", "--log", full, rotated, "--launch", "chunked_prefill_size=4096", "-o", tmp_path / "w.json"])
    t = load_trace(str(tmp_path / "w.json"))
    assert [g.settings.get("chunked_prefill_size") for g in t.groups] == [2048, 4096]
    # the API takes the same settings
    from bcgtune import api

    t = api.trace_from_logs([str(full), str(rotated)], launch={"model_path": "org/Model-8B", "tp_size": 1, "dp_size": 1,
                            "enable_dp_attention": False, "chunked_prefill_size": 2048, "max_prefill_tokens": 16384})  # fmt: skip
    assert len(t.groups) == 1


def test_a_given_chunk_is_the_launch_value_under_dp_attention(tmp_path):
    log = tmp_path / "r.log"
    log.write_text(_rotated(server_log(2048, [300, 2048, 900], dp=4, dp_attention=True)))
    r = cli(["trace", "--log", log, "--launch", "chunked_prefill_size=8192", "--launch", "dp_size=4",
             "--launch", "enable_dp_attention=true", "-o", tmp_path / "t.json"])  # fmt: skip
    assert r.code == 0, r.err
    g = load_trace(str(tmp_path / "t.json")).groups[0]
    assert g.settings["chunked_prefill_size"] == 8192 and g.rank_chunk == 2048


@pytest.mark.parametrize(
    "value, says",
    [
        ("chunk=8192", "unknown launch setting 'chunk'"),
        ("tp_size", "expected KEY=VALUE"),
        ("tp_size=abc", "tp_size: expected an integer"),
        ("tp_size=0", "tp_size: must be within 1.."),
        ("tp_size=99999999999", "tp_size: must be within 1.."),
        ("enable_dp_attention=yes", "expected true or false"),
        ("chunked_prefill_size=nan", "expected an integer"),
    ],
)
def test_bad_launch_settings_are_one_line(tmp_path, value, says):
    log = tmp_path / "r.log"
    log.write_text(server_log(2048, [300]))
    r = cli(["trace", "--log", log, "--launch", value])
    assert r.code == 2 and says in r.err and "--launch" in r.err
    assert_one_line_error(r)


def test_mixed_chunk_hint_for_a_log_without_startup_lines(tmp_path):
    chunk = 512
    running = [7, 12, 3, 0, 5, 2]
    tokens = [chunk - 7, chunk - 12, 200, 300, 100, 50]  # two saturated batches, as the issue's log
    mixed = tmp_path / "mixed.log"
    mixed.write_text(_rotated(server_log(chunk, tokens, running=running)))
    r = cli(["trace", "--log", mixed])
    assert r.code == 0 and "hint: 2 batches of the server log the same largest #new-token + #running-req (512)" in r.out
    assert "--mixed-chunk --launch chunked_prefill_size=512" in r.out
    r = cli(["trace", "--log", mixed, "--histogram-only"])
    assert "hint: 2 batches" in r.out
    # the hint's command: the chunk is then known, the forwards count the decode rows, no hint
    r = cli(["trace", "--log", mixed, "--mixed-chunk", "--launch", "chunked_prefill_size=512"])
    assert r.code == 0 and "hint:" not in r.out
    # with the chunk given but not --mixed-chunk: the logged-chunk signature, two batches suffice
    r = cli(["trace", "--log", mixed, "--launch", "chunked_prefill_size=512"])
    assert "hint: 2 chunk-saturated batches" in r.out
    # a plain server: saturated batches log #new-token = chunk, their sums differ: no hint
    plain = tmp_path / "plain.log"
    plain.write_text(_rotated(server_log(chunk, [chunk, chunk, chunk, 100, chunk - 7], running=[7, 12, 3, 0, 7])))
    assert "hint:" not in cli(["trace", "--log", plain]).out
    # one batch at the largest sum is not evidence
    one = tmp_path / "one.log"
    one.write_text(_rotated(server_log(chunk, [chunk - 7, 200, 100], running=[7, 3, 1])))
    assert "hint:" not in cli(["trace", "--log", one]).out
    # a fleet: two rotated logs of one configuration, one such batch each, add up
    a, b = tmp_path / "a.log", tmp_path / "b.log"
    a.write_text(_rotated(server_log(chunk, [chunk - 7, 100], running=[7, 1])))
    b.write_text(_rotated(server_log(chunk, [chunk - 9, 100], running=[9, 1])))
    assert "hint: 2 batches" in cli(["trace", "--log", a, b, "--histogram-only"]).out


def test_launch_settings_reach_the_cluster_workers(tmp_path):
    pytest.importorskip("distributed")
    full = tmp_path / "full.log"
    full.write_text(server_log(2048, [100, 700, 2048, 1500]))
    rotated = tmp_path / "rotated.log"
    rotated.write_text(_rotated(server_log(2048, [300, 2048, 900])))
    given = ["model_path=org/Model-8B", "tp_size=1", "dp_size=1", "enable_dp_attention=false", "chunked_prefill_size=2048",
             "max_prefill_tokens=16384"]  # fmt: skip
    out = tmp_path / "c.json"
    r = cli(["trace", "--log", full, rotated, "--cluster", "local:1", *[a for g in given for a in ("--launch", g)], "-o", out])
    assert r.code == 0, r.err
    assert len(load_trace(str(out)).groups) == 1


def test_no_mixed_chunk_hint_where_the_chunk_explains_the_sizes(tmp_path):
    """A plain server's saturated batches log #new-token = chunk: their largest sum with
    #running-req is the chunk plus the largest running count, which may repeat, but the
    chunk itself explains the sizes: no hint (it said `chunk 4159 and --enable-mixed-chunk`)."""
    plain = tmp_path / "plain.log"
    plain.write_text(_rotated(server_log(4096, [4096, 4096, 4096, 4096, 4096, 700, 2000], running=[63, 63, 10, 5, 0, 3, 63])))
    for hist in ([], ["--histogram-only"]):
        r = cli(["trace", "--log", plain, *hist])
        assert r.code == 0 and "hint:" not in r.out, r.out


def test_the_issues_rotated_logs_join_their_configuration_and_drift_pairs(tmp_path):
    """`trace --log x0 x1 x2 --launch model_path=... tp_size=1 chunked_prefill_size=8192
    enable_mixed_chunk=true`: x0 states its launch (mixed chunk), x1 and x2 lost their start:
    given those settings they join x0's configuration (the settings given need not repeat
    every one x0 logs), a second server stays apart, and each log counts forwards by its own
    settings: x0's running rows are counted without --mixed-chunk, the other server's not."""
    mixed = {"enable_mixed_chunk": True}
    x0 = tmp_path / "x0"
    x0.write_text(server_log(8192, [8190, 100, 7000], running=[2, 5, 0], extra=mixed))
    x1, x2 = tmp_path / "x1", tmp_path / "x2"
    x1.write_text(_rotated(server_log(8192, [8188, 300], running=[4, 1], extra=mixed)))
    x2.write_text(_rotated(server_log(8192, [50, 8192], running=[3, 0], extra=mixed)))
    other = tmp_path / "other"
    other.write_text(server_log(8192, [8192, 900], running=[7, 2], model="org/Other-70B", extra={"enable_mixed_chunk": False}))
    given = ["model_path=org/Model-8B", "tp_size=1", "chunked_prefill_size=8192", "enable_mixed_chunk=true"]
    out = tmp_path / "t.json"
    r = cli(["trace", "--log", x0, x1, x2, other, "--mixed-chunk", *[a for g in given for a in ("--launch", g)], "-o", out])
    assert r.code == 0, r.err
    t = load_trace(str(out))
    assert [sorted(g.sources) for g in t.groups] == [[0, 1, 2], [3]]
    assert "they joined group 0" in r.out and "hint:" not in r.out and "warning:" not in r.out
    assert t.groups[0].sizes.tolist() == [53, 105, 301, 7000, 8192] and t.groups[0].counts.tolist() == [1, 1, 1, 1, 3]
    assert t.groups[1].sizes.tolist() == [900, 8192]  # its own settings say no mixed chunk: --mixed-chunk does not apply
    # settings that name no logged configuration stay apart, and the note says in what they differ
    r = cli(["trace", "--log", x0, x1, other, "--launch", "model_path=org/Model-8B", "--launch", "chunked_prefill_size=4096"])
    assert r.code == 0 and "they name none of the configurations the logs state" in r.out
    assert "group 0: chunked_prefill_size 4096, the logs 8192" in r.out, r.out
    # the profiles written per group pair with them by their settings
    for g in (0, 1):
        assert cli(["suggest-buckets", out, "--group", str(g), "--write-profile", tmp_path / f"p{g}.toml", "--base-profile",
                    "h200", "-k", "3", "-q", "--unchecked"]).code == 0  # fmt: skip
    r = cli(["drift", "-p", tmp_path / "p0.toml", "-p", tmp_path / "p1.toml", "--trace", out, "--json"])
    assert r.code in (0, 1), r.err
    assert [(row["group"], row["matched"]) for row in json.loads(r.out)["rows"]] == [(0, "settings"), (1, "settings")]


def test_launch_settings_the_batches_contradict_are_warned_and_refused(tmp_path):
    """`--launch chunked_prefill_size=4096 dp_size=8 enable_dp_attention=true` is a chunk of
    512 per attention-DP rank; batches of 4,096 tokens contradict it: trace warns, and
    suggest-buckets refuses to cap the list at 512."""
    log = tmp_path / "r.log"
    log.write_text(_rotated(server_log(4096, [300, 4096, 900, 2500])))
    out = tmp_path / "t.json"
    r = cli(["trace", "--log", log, "--launch", "chunked_prefill_size=4096", "--launch", "dp_size=8", "--launch",
             "enable_dp_attention=true", "--launch", "tp_size=8", "-o", out])  # fmt: skip
    assert r.code == 0 and "warning: the server: its launch settings (given with --launch) give a chunk of 512" in r.out
    assert "reach 4,096 tokens" in r.out
    r = cli(["suggest-buckets", out])
    assert r.code == 2 and "above the chunk of 512 per attention-DP rank" in r.err
    assert_one_line_error(r)
    assert cli(["suggest-buckets", out, "--chunked-prefill-size", "32768", "-q"]).code == 0
    # settings that agree with the batches: no warning
    r = cli(["trace", "--log", log, "--launch", "chunked_prefill_size=4096"])
    assert r.code == 0 and "warning:" not in r.out


def test_a_rotated_piece_continues_its_older_pieces_launch(tmp_path):
    """server.log.2 holds the start (mixed chunk, chunk 512); server.log.1 and server.log
    state nothing: they continue its launch, per batch and histogram-only, serial and in
    workers, and a folder lists them; another log that lost its start stays apart."""
    start = server_log(512, [505, 100], running=[7, 1], extra={"enable_mixed_chunk": True})
    body = _rotated(server_log(512, [500, 200, 30], running=[12, 3, 0]))
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "server.log.2").write_text(start)
    (logs / "server.log.1").write_text(body)
    with gzip.open(logs / "server.log.gz", "wt") as fh:  # the newest piece, compressed
        fh.write(body)
    (logs / "notes.md").write_text("not a log")
    lost = tmp_path / "lost.log.1"
    lost.write_text(body)
    want = [30, 30, 101, 203, 203, 512, 512, 512]  # forwards count the running rows, as the launch says
    for hist in (False, True):
        for jobs in (1, 2):
            t = parse_logs(sorted(map(str, logs.glob("server.log*"))) + [str(lost)], histogram_only=hist, jobs=jobs,
                           options=ParseOptions(parallel_min_bytes=0))  # fmt: skip
            assert len(t.groups) == 2 and t.groups[0].settings["enable_mixed_chunk"] is True
            assert t.groups[0].n_batches == 8 and t.groups[1].settings == {}
            g0 = sorted(s for s, c in zip(t.groups[0].sizes.tolist(), t.groups[0].counts.tolist()) for _ in range(c))
            assert g0 == want
    r = cli(["trace", "--log", logs])
    assert r.code == 0 and "3 files" in r.out and "2 rotated file(s)" in r.out and "(from " in r.out
