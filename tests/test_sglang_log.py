"""Golden and property tests of the SGLang log parser (bcgtune/adapters/sglang_log.py)."""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bcgtune.adapters.sglang_log import (
    parse_capture_text,
    parse_logs,
    parse_prefill_text,
    parse_prefix,
    parse_startup_text,
    scan_log,
)
from bcgtune.errors import InputError

SHARED_LOGS = Path(__file__).resolve().parents[2] / "shared" / "data" / "sglang-logs"
OUR_LOGS = Path(__file__).resolve().parent / "data" / "logs"


def _golden_cases():
    cases = []
    for folder in (SHARED_LOGS, OUR_LOGS):
        exp_path = folder / "EXPECTED.json"
        if not exp_path.is_file():
            continue
        expected = json.loads(exp_path.read_text())
        for name, exp in expected.items():
            if name.startswith("_"):
                continue
            cases.append(pytest.param(folder / name, exp, id=f"{folder.name}/{name}"))
    return cases


GOLDEN = _golden_cases()


@pytest.mark.parametrize("path,exp", GOLDEN)
def test_golden_log(path: Path, exp: dict):
    if not path.is_file():
        pytest.skip(f"{path.name} is held out (not in this checkout)")
    res = scan_log(str(path))
    assert res.lines == exp["physical_lines"]
    got = [
        {
            "line_no": r.line,
            "new_seq": r.new_seq,
            "new_token": r.new_token,
            "cached_token": r.cached_token,
            "graph": r.graph if r.graph_label == "cuda" else None,
            "rank": r.rank,
        }
        for r in res.records
    ]
    want = [{k: p[k] for k in ("line_no", "new_seq", "new_token", "cached_token", "graph", "rank")} for p in exp["prefill"]]
    assert got == want
    assert len(res.records) == exp["prefill_count"]
    for r, p in zip(res.records, exp["prefill"]):
        if "physical_lines" in p:
            assert r.physical_lines == p["physical_lines"]
        if "npu_graph" in p:
            assert r.graph_label == "npu" and r.graph == p["npu_graph"]
        if "forward_ct" in p:
            assert r.forward_ct == p["forward_ct"]
        assert r.legacy == bool(p.get("legacy_format", False))
    assert res.decode_lines == exp["decode_lines"]
    assert res.legacy_decode_lines == exp["legacy_decode_lines"]
    assert not res.malformed, res.malformed
    assert len(res.captures) == len(exp["capture_lines"])
    for cap, want_cap in zip(res.captures, exp["capture_lines"]):
        assert cap["line"] == want_cap["line_no"]
        assert cap["rank"] == want_cap["rank"]
        assert cap["label"] == want_cap["kind"]
        for key in ("num_tokens", "bs"):
            if key in want_cap:
                assert cap["bucket_axis"] == key
                assert cap["buckets"] == want_cap[key]
                assert cap["elided"] == bool(want_cap.get("list_elided", False))
        for key in ("elapsed_s", "mem_usage_gb", "avail_mem_gb", "backend"):
            if key in want_cap:
                assert cap[key] == pytest.approx(want_cap[key]) if isinstance(want_cap[key], float) else cap[key] == want_cap[key]
    assert len(res.startup) == len(exp["startup_lines"])
    for got_s, want_s in zip(res.startup, exp["startup_lines"]):
        assert got_s["line"] == want_s["line_no"]
        for k, v in want_s.items():
            if k != "line_no":
                assert got_s[k] == v, k


def test_golden_cases_found():
    # our own excerpts always ship with the repo
    assert any("logs/" in p.id for p in GOLDEN)


def test_rank_overlap_of_cp_ranks_printing_one_batch():
    trace = parse_logs([str(OUR_LOGS / "e2_pp_attn_cp_ranks.log")])
    assert trace.n_batches == 16
    assert len(trace.meta["ranks"]) == 16
    assert trace.meta["rank_overlap"] == {"printers": 16, "records_matching_another_printer": 16}


# ---- line-level behaviour -----------------------------------------------------------
def test_prefix_variants():
    ts, rank = parse_prefix("[2025-02-04 05:29:21 TP0] ")
    assert rank == "TP0" and ts == pytest.approx(1738646961.0)
    assert parse_prefix("[16:43:29 TP0] ") == (pytest.approx(16 * 3600 + 43 * 60 + 29), "TP0")
    ts, rank = parse_prefix("[2026-09-24 01:47:50.615 DP3 TP3 EP3] ")
    assert rank == "DP3 TP3 EP3" and ts % 1 == pytest.approx(0.615)
    # other loggers' brackets are not ranks, their time still serves
    ts, rank = parse_prefix("[2025-07-02 11:36:23 handler.py:169 INFO] ")
    assert rank is None and not math.isnan(ts)
    assert parse_prefix("[2025-03-11 16:16:58] [2025-03-11 01:16:58 TP0] ")[1] == "TP0"
    assert parse_prefix("  0%|          | 0/23 [00:00<?, ?it/s][2025-03-07 09:25:12 TP3] ")[1] == "TP3"
    assert parse_prefix("[gpu=0] ")[1] == "gpu=0"
    assert math.isnan(parse_prefix("")[0])


@pytest.mark.parametrize(
    "line",
    [
        "Parses `Prefill batch`, `Decode batch` and `Finish` lines.",
        "[2026-08-28 21:35:16] Prefill batch, #new-seq: 1",
        "[2026-09-02 10:14:03] Prefill batch, #new-seq: 1, #new-token: x, #cached-token: 0",
        "[2026-09-02 10:14:03] Prefill batch, #new-seq: 1, #new-token: 5, cuda graph: maybe",
    ],
)
def test_malformed_prefill_lines_are_none(line):
    assert parse_prefill_text(line) is None


def test_malformed_lines_counted_with_samples(tmp_path):
    log = tmp_path / "m.log"
    good = "[2026-08-27 03:46:54] Prefill batch, #new-seq: 9, #new-token: 8192, #cached-token: 0, cuda graph: True"
    bad = "[2026-08-28 21:35:16] Prefill batch, #new-seq: 1"
    log.write_text("\n".join([good, bad, "noise", bad, good]) + "\n")
    trace = parse_logs([str(log)])
    assert trace.n_batches == 2
    ps = trace.parse_stats
    assert ps["malformed_prefill_lines"] == 2
    assert [s["line"] for s in ps["malformed_samples"]] == [2, 4]
    assert ps["malformed_samples"][0]["text"] == bad
    assert ps["per_source"][0]["malformed_prefill_lines"] == 2


def test_only_malformed_lines_is_an_input_error(tmp_path):
    log = tmp_path / "m.log"
    log.write_text("[2026-08-28 21:35:16] Prefill batch, #new-seq: 1\n")
    with pytest.raises(InputError, match="no readable prefill batch lines"):
        parse_logs([str(log)])


def test_replay_token_and_mixed_chunk_arithmetic(tmp_path):
    log = tmp_path / "r.log"
    log.write_text(
        "[2026-01-01 00:00:00 TP0] Prefill batch, #new-seq: 2, #new-token: 100, #cached-token: 5, "
        "#running-req: 7, #queue-req: 1, #replay-token: 20, cuda graph: True\n"
        "[2026-01-01 00:00:01 TP0] Prefill batch, #new-seq: 1, #new-token: 50, #running-req: 3, cuda graph: False\n"
        "[2026-01-01 00:00:02 TP0] Prefill batch, #new-seq: 1, #new-token: 64\n"
    )
    plain = parse_logs([str(log)])
    assert plain.batches["forward_tokens"].tolist() == [120, 50, 64]
    mixed = parse_logs([str(log)], mixed_chunk=True)
    assert mixed.batches["forward_tokens"].tolist() == [127, 53, 64]
    assert mixed.batches["graph"].tolist() == [1, 0, -1]
    assert mixed.batches["replay_token"].tolist() == [20, -1, -1]
    assert mixed.batches["running_req"].tolist() == [7, 3, -1]
    assert mixed.meta["mixed_chunk"] is True


def test_hand_wrapped_record_and_crlf(tmp_path):
    log = tmp_path / "w.log"
    log.write_bytes(
        b"[2026-09-22 01:06:11] Prefill batch, #new-seq: 4, #new-token: 2048,\r\n"
        b"    #cached-token: 10, #running-req: 26,\r\n"
        b"    cuda graph: False\r\n"
        b"[2026-09-22 01:06:12] Prefill batch, #new-seq: 1, #new-token: 8, \r\n"
        b"[2026-09-22 01:06:12] INFO: x\r\n"
    )
    res = scan_log(str(log))
    assert [(r.line, r.physical_lines, r.new_token, r.cached_token, r.running_req, r.graph) for r in res.records] == [
        (1, 3, 2048, 10, 26, False),
        (4, 1, 8, -1, -1, None),
    ]


def test_gz_stdin_and_several_files(tmp_path, monkeypatch):
    src = SHARED_LOGS / "24_newest_decode_graph_end_startup_and_load.log"
    if not src.is_file():
        src = OUR_LOGS / "e1_npu_forward_iter.log"
    data = src.read_bytes()
    gz = tmp_path / "a.log.gz"
    gz.write_bytes(gzip.compress(data))
    plain = parse_logs([str(src)])
    zipped = parse_logs([str(gz)])
    assert zipped.batches["forward_tokens"].tolist() == plain.batches["forward_tokens"].tolist()
    assert zipped.sources[0]["sha256"] == plain.sources[0]["sha256"]  # of the decompressed bytes

    import io
    import sys

    class FakeStdin:
        buffer = io.BytesIO(data)

    monkeypatch.setattr(sys, "stdin", FakeStdin())
    piped = parse_logs(["-"])
    assert piped.n_batches == plain.n_batches and piped.sources[0]["path"] == "<stdin>"

    both = parse_logs([str(src), str(OUR_LOGS / "e1_npu_forward_iter.log")])
    assert both.n_batches == plain.n_batches + 2
    assert both.batches["source"].tolist() == [0] * plain.n_batches + [1, 1]
    assert [p["prefill_records"] for p in both.parse_stats["per_source"]] == [plain.n_batches, 2]
    assert both.sources[1]["bytes"] == (OUR_LOGS / "e1_npu_forward_iter.log").stat().st_size


def test_missing_and_empty_inputs(tmp_path):
    with pytest.raises(InputError) as ei:
        parse_logs([str(tmp_path / "nope.log")])
    assert ei.value.where == str(tmp_path / "nope.log")
    empty = tmp_path / "empty.log"
    empty.write_text("")
    other = tmp_path / "other.log"
    other.write_text("[2026-01-01 00:00:00] Decode batch, #running-req: 1\n")
    with pytest.raises(InputError, match="no prefill batch lines found") as ei:
        parse_logs([str(empty), str(other)])
    assert str(empty) in str(ei.value) and str(other) in str(ei.value)


def test_trace_columns_and_round_trip(tmp_path):
    from bcgtune.core.trace import load_trace, save_trace

    path = SHARED_LOGS / "05_issue1612_time_only_prefix.log"
    if not path.is_file():
        pytest.skip("shared logs absent")
    trace = parse_logs([str(path)])
    assert trace.n_batches == 25 and trace.meta["ranks"] == ["TP0"]
    assert (trace.batches["rank"] == 0).all()
    assert trace.batches["line"][0] == 42
    assert trace.batches["timestamp"][0] == pytest.approx(16 * 3600 + 43 * 60 + 29)
    out = tmp_path / "t.json"
    save_trace(trace, str(out))
    back = load_trace(str(out))
    assert back.sizes.tolist() == trace.sizes.tolist() and back.counts.tolist() == trace.counts.tolist()
    assert back.batches["new_token"].tolist() == trace.batches["new_token"].tolist()
    assert back.parse_stats["prefill_records"] == 25


def test_capture_lines_elided_and_legacy():
    cap = parse_capture_text(
        "[2026-08-27 03:46:18] Capture target decode CUDA graph begin. backend=full, "
        "num_tokens_per_req=1, bs=[1 … 256] (36), avail mem=10.88 GB"
    )
    assert cap["buckets"] == [1, 256] and cap["elided"] and cap["listed_count"] == 36
    assert cap["phase"] == "target" and cap["kind"] == "decode" and cap["event"] == "begin"
    cap = parse_capture_text("[2025-05-29 23:20:05 TP0] Capture cuda graph end. Time elapsed: 4.10 s. mem usage=2.51 GB. avail mem=15.05 GB.")
    assert (cap["kind"], cap["elapsed_s"], cap["mem_usage_gb"], cap["avail_mem_gb"]) == ("legacy", 4.1, 2.51, 15.05)
    cap = parse_capture_text("[2025-05-29 23:20:01 TP0] Capture cuda graph bs [1, 2, 4, 8, 16, 24, 32]")
    assert cap["label"] == "cuda graph bs" and cap["buckets"] == [1, 2, 4, 8, 16, 24, 32]
    assert parse_capture_text("⏎ Capturing batches (bs=1 avail_mem=10.55 GB): 100%| 36/36") is None
    assert parse_startup_text("Warning: available_size=75821, max_total_num_token=75833") is None


def test_graph_disabled_lines_kept(tmp_path):
    log = tmp_path / "d.log"
    log.write_text(
        "[2026-01-01 00:00:00] Disable prefill CUDA graph because LoRA is enabled.\n"
        "[2026-01-01 00:00:01] Prefill batch, #new-seq: 1, #new-token: 9, cuda graph: False\n"
    )
    trace = parse_logs([str(log)])
    assert trace.parse_stats["graph_disabled_lines"] == 1
    assert trace.meta["graph_disabled"][0]["text"].startswith("Disable prefill CUDA graph because LoRA")


# ---- property: generated lines in any field order / wrapper round-trip -----------------
_PREFIXES = st.sampled_from(
    [
        "",
        "    ",
        "sglang  | ",
        "2025-02-04 21:29:21 ",
        "[2025-03-11 16:16:58] ",
        "⏎ ",
        " 50%|#####     | 2/4 [00:01<00:01,  1.73it/s]",
        "[2025-07-02 11:36:23 handler.py:169 INFO] ",
    ]
)
_STAMPS = st.sampled_from(["2025-02-04 05:29:21", "16:43:29", "2026-09-24 01:47:50.615", None])
_RANKS = st.sampled_from([None, "TP0", "DP7 TP7", "PP0 ATTN_CP1 TP1 EP1", "DP0 TP0 EP0"])
_HEADS = st.sampled_from(["Prefill batch.", "Prefill batch,", "Prefill batch [17],"])
_EXTRA = [
    "cache hit rate: 12.50%",
    "token usage: 0.05",
    "full token usage: 0.43",
    "mamba usage: 0.72",
    "swa token usage: 0.10",
    "#pending-token: 669940",
    "#unbootstrapped-req: 0",
    "#transferring-req: 2",
    "waiting-image-req: 3",
    "input throughput (token/s): 12345.67",
    "MFU: 41.2%",
]


@settings(max_examples=300, deadline=None)
@given(
    prefix=_PREFIXES,
    stamp=_STAMPS,
    rank=_RANKS,
    head=_HEADS,
    nums=st.tuples(*[st.integers(0, 10**6) for _ in range(6)]),
    graph=st.sampled_from([None, "cuda graph: True", "cuda graph: False", "npu graph: True", "cpu graph: False"]),
    extras=st.lists(st.sampled_from(_EXTRA), max_size=5, unique=True),
    order=st.randoms(use_true_random=False),
    trailing=st.sampled_from(["", ",", ", "]),
)
def test_generated_prefill_lines_round_trip(prefix, stamp, rank, head, nums, graph, extras, order, trailing):
    seq, tok, cached, running, queue, replay = nums
    fields = [
        f"#new-seq: {seq}",
        f"#new-token: {tok}",
        f"#cached-token: {cached}",
        f"#running-req: {running}",
        f"#queue-req: {queue}",
        f"#replay-token: {replay}",
    ] + extras
    if graph:
        fields.append(graph)
    order.shuffle(fields)
    bracket = ""
    inner = " ".join(x for x in (stamp, rank) if x)
    if inner:
        bracket = f"[{inner}] "
    line = f"{prefix}{bracket}{head} " + ", ".join(fields) + trailing
    rec = parse_prefill_text(line)
    assert rec is not None, line
    assert (rec.new_seq, rec.new_token, rec.cached_token, rec.running_req, rec.queue_req, rec.replay_token) == nums
    assert rec.rank == rank
    assert rec.forward_ct == (17 if "[17]" in head else None)
    if graph:
        assert rec.graph == graph.endswith("True") and rec.graph_label == graph.split()[0]
    else:
        assert rec.graph is None
    if stamp is not None:
        assert not math.isnan(rec.timestamp)
    assert rec.forward_tokens(mixed_chunk=True) == tok + (replay if replay > 0 else 0) + (running if running > 0 else 0)


def test_property_fails_on_a_wrong_parser():
    # guard: the property above can fail (a record with a corrupted field is rejected)
    assert parse_prefill_text("[2025-01-01 00:00:00 TP0] Prefill batch, #new-seq: 1, #new-token: 1x") is None
    rec = parse_prefill_text("[2025-01-01 00:00:00 TP0] Prefill batch, #new-token: 7, #new-seq: 3")
    assert (rec.new_seq, rec.new_token) == (3, 7)
    assert np.int64(rec.forward_tokens()) == 7


# ---- chunked scanning: records straddling chunk boundaries ---------------------------
_TRICKY = (
    b"[2026-09-22 01:06:11] Prefill batch, #new-seq: 4, #new-token: 2048,\r\n"
    b"    #cached-token: 10, #running-req: 26,\r\n"
    b"    cuda graph: False\r\n"
    b"[2026-09-22 01:06:12] Decode batch, #running-req: 1, gen throughput (token/s): 3.1\n"
    b"  #running-req: 3, gen throughput (token/s): 1.0\n"
    b"x Decode batch y Prefill batch, #new-seq: 1, #new-token: 2\n"
    b"[2026-01-01 00:00:00] Prefill batch, #new-seq: 1, #new-token: 64,\n"
    b"gen throughput (token/s): 3.2, #running-req: 4\n"
    b"progress\r50%\r[2026-01-01 00:00:01 TP0] Prefill batch [3], #new-seq: 2, #new-token: 7.\n"
    b"[2026-01-01 00:00:02] Disable prefill CUDA graph because LoRA is enabled.\n"
    b"[2026-01-01 00:00:03] Prefill batch, #new-seq: 1, #new-token: x\n"
    b"[2026-01-01 00:00:04 TP0] Prefill batch, #new-seq: 3, #new-token: 9,"  # no final newline
)


def _chunk_cases():
    paths = sorted(p for folder in (SHARED_LOGS, OUR_LOGS) if folder.is_dir() for p in folder.glob("*.log"))
    return [pytest.param(p, id=f"{p.parent.name}/{p.name}") for p in paths] + [pytest.param(None, id="tricky")]


@pytest.mark.parametrize("path", _chunk_cases())
@pytest.mark.parametrize("chunk_size", [1, 7, 64])
def test_small_chunks_give_identical_results(path, chunk_size, tmp_path, monkeypatch):
    import bcgtune.adapters.sglang_log as mod

    if path is None:
        path = tmp_path / "tricky.log"
        path.write_bytes(_TRICKY)
    default = scan_log(str(path))
    monkeypatch.setattr(mod, "CHUNK_SIZE", chunk_size)
    small = scan_log(str(path))
    # repr: records hold NaN timestamps, which never compare equal
    assert repr(small) == repr(default)
    assert small.lines == default.lines > 0


def test_tricky_chunk_content_parsed():
    import tempfile

    with tempfile.NamedTemporaryFile(suffix=".log") as fh:
        fh.write(_TRICKY)
        fh.flush()
        res = scan_log(fh.name)
    assert res.lines == 12 and res.decode_lines == 1 and res.legacy_decode_lines == 1
    assert [(r.line, r.physical_lines, r.new_token) for r in res.records] == [(1, 3, 2048), (6, 1, 2), (7, 2, 64), (9, 1, 7), (12, 1, 9)]
    assert res.records[3].forward_ct == 3 and res.records[3].rank == "TP0"
    assert [m["line"] for m in res.malformed] == [11]
    assert len(res.graph_disabled) == 1
