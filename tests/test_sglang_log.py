"""Golden and property tests of the SGLang log parser (bcgtune/adapters/sglang/log/)."""

from __future__ import annotations

import gzip
import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from cli_helpers import HANG_S
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from bcgtune.adapters.sglang.log import (
    ParseOptions,
    parse_capture_text,
    parse_logs,
    parse_prefill_text,
    parse_prefix,
    parse_startup_text,
    scan_log,
)
from bcgtune.errors import InputError

# public SGLang log excerpts with their expected parse (tests/data/sglang-logs/SOURCES.md)
SHARED_LOGS = Path(__file__).resolve().parent / "data" / "sglang-logs"
OUR_LOGS = Path(__file__).resolve().parent / "data" / "logs"
REPO = Path(__file__).resolve().parents[1]


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
    log.write_text(f"{good}\n{bad}\nnoise\n{bad}\n{good}\n")
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
    assert mixed.groups[0].settings == {"enable_mixed_chunk": True}
    # a launch's own settings win over --mixed-chunk: a log that says it ran without mixed chunk
    stated = tmp_path / "stated.log"
    stated.write_text("[2026-01-01 00:00:00] server_args={'enable_mixed_chunk': False}\n" + log.read_text())
    for hist in (False, True):
        t = parse_logs([str(stated)], mixed_chunk=True, histogram_only=hist)
        assert t.sizes.tolist() == [50, 64, 120] and t.groups[0].settings == {"enable_mixed_chunk": False}


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
    data = src.read_bytes()
    gz = tmp_path / "a.log.gz"
    gz.write_bytes(gzip.compress(data))
    plain = parse_logs([str(src)])
    zipped = parse_logs([str(gz)])
    assert zipped.batches["forward_tokens"].tolist() == plain.batches["forward_tokens"].tolist()
    assert zipped.sources[0]["xxh128"] == plain.sources[0]["xxh128"]  # of the decompressed bytes

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
    from bcgtune.files.trace_file import load_trace, save_trace

    path = SHARED_LOGS / "05_issue1612_time_only_prefix.log"
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
    cap = parse_capture_text(
        "[2025-05-29 23:20:05 TP0] Capture cuda graph end. Time elapsed: 4.10 s. mem usage=2.51 GB. avail mem=15.05 GB."
    )
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
    assert rec.forward_tokens(mixed_chunk=True) == tok + max(0, replay) + max(0, running)


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
def test_small_chunks_give_identical_results(path, chunk_size, tmp_path):
    if path is None:
        path = tmp_path / "tricky.log"
        path.write_bytes(_TRICKY)
    default = scan_log(str(path))
    small = scan_log(str(path), options=ParseOptions(chunk_size=chunk_size))
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
    assert [(r.line, r.physical_lines, r.new_token) for r in res.records] == [
        (1, 3, 2048),
        (6, 1, 2),
        (7, 2, 64),
        (9, 1, 7),
        (12, 1, 9),
    ]
    assert res.records[3].forward_ct == 3 and res.records[3].rank == "TP0"
    assert [m["line"] for m in res.malformed] == [11]
    assert len(res.graph_disabled) == 1


# ---- the fast path equals the per-line parser -----------------------------------------
def _both_paths(path, chunk_size=None):
    """scan_log of `path` through the fast path and through the per-line parser only; the
    fast path on numpy is checked equal to the fast path with the compiled line scanner."""
    opts = ParseOptions() if chunk_size is None else ParseOptions(chunk_size=chunk_size)
    fast = scan_log(str(path), options=replace(opts, small_piece=-1))  # every piece through the fast path
    on_numpy = scan_log(str(path), options=replace(opts, small_piece=-1, compiled=False))
    assert repr(on_numpy) == repr(fast)
    slow = scan_log(str(path), options=replace(opts, fast_path=False))
    return fast, slow


@pytest.mark.parametrize("compiled", [True, False])
def test_pre_2024_records_are_read_by_layout(tmp_path, monkeypatch, compiled):
    """`new fill batch.` records (SGLang before 2024-05) go through the fast path like
    `Prefill batch` ones, by layout, and give what the per-line parser gives; a line that
    also holds another record head is still read per line."""
    import bcgtune.adapters.sglang.log.scanner as mod

    lines = [
        f"[gpu={i % 2}] new fill batch. #seq: {i % 7 + 1}. #cached_token: {i * 37}. #new_token: {i * 13 + 1}. "
        f"#remaining_req: {i % 5}. #running_req: {i % 9}. tree_cache_hit_rate: {i % 100}.{i % 10}0%."
        for i in range(300)
    ]
    lines += ["[gpu=0] new fill batch. #seq: 1. #new_token: 5. Decode batch. #running-req: 1", "new fill batch. #seq: 2"]
    path = tmp_path / "old.log"
    path.write_text("\n".join(lines) + "\n")
    per_line = []
    line = mod._Scanner._line
    monkeypatch.setattr(mod._Scanner, "_line", lambda self, raw, n: (per_line.append(n), line(self, raw, n))[1])
    fast = scan_log(str(path), options=ParseOptions(compiled=compiled, small_piece=-1))
    assert per_line == [301]  # the line with a decode head too; the last one has no #new_token: malformed, by layout
    monkeypatch.setattr(mod._Scanner, "_line", line)
    slow = scan_log(str(path), options=ParseOptions(fast_path=False))
    assert repr(fast) == repr(slow)
    assert len(fast.records) == 301 and all(r.legacy for r in fast.records) and len(fast.malformed) == 1


def test_pre_2024_decode_lines_are_learned_by_layout(tmp_path, monkeypatch):
    """A pre-2024 decode line (no head: `#running-req: 3, ... gen throughput ...`) has its
    own numbers on every line; the compiled scanner knows its text by layout, so the
    per-line parser reads one line per layout, not each line; a line with another needle or
    a "batch" is still known by its exact text."""
    import bcgtune.adapters.sglang.log.scanner as mod

    lines = []
    for i in range(400):
        lines.append(f"[gpu=0] #running-req: {i % 90 + 10}, #token: {i * 7 + 100}, gen throughput (token/s): {i % 50 + 10}.5")
        lines.append(f"[gpu=0] new fill batch. #seq: 1. #cached_token: {i}. #new_token: {i + 1}. #running_req: 2")
    lines += [f"gen throughput {i} graph: {i}" for i in range(10, 13)]  # another needle: by text
    path = tmp_path / "old.log"
    path.write_text("\n".join(lines) + "\n")
    learned = []
    learn = mod._Scanner._learn_rare
    monkeypatch.setattr(mod._Scanner, "_learn_rare", lambda self, k, raw: (learned.append(raw), learn(self, k, raw))[1])
    fast = scan_log(str(path), options=ParseOptions(small_piece=-1))
    from bcgtune.adapters.sglang.log.fastpath import LineTable

    if LineTable is not None:  # (without the compiled scanner, such lines are read per line)
        assert len(learned) < 20, len(learned)  # digit widths give a few layouts; the 3 graph lines their texts
        assert sum(b"graph" in raw for raw in learned) == 3
    monkeypatch.setattr(mod._Scanner, "_learn_rare", learn)
    slow = scan_log(str(path), options=ParseOptions(fast_path=False))
    assert repr(fast) == repr(slow) and fast.legacy_decode_lines == 400


def _same_file_results(a, b):
    """Two _parse_file results of one log are the same (columns compared as arrays)."""
    assert a.columns.keys() == b.columns.keys()
    for k in a.columns:
        assert a.columns[k].dtype == b.columns[k].dtype
        assert np.array_equal(a.columns[k], b.columns[k], equal_nan=k == "timestamp"), k
    assert {**vars(a), "columns": None} == {**vars(b), "columns": None}


def _all_logs():
    paths = sorted(p for folder in (SHARED_LOGS, OUR_LOGS) if folder.is_dir() for p in folder.glob("*.log"))
    return [pytest.param(p, id=f"{p.parent.name}/{p.name}") for p in paths]


@pytest.mark.parametrize("path", _all_logs())
def test_fast_path_equals_per_line_parser_on_every_log(path):
    from bcgtune.adapters.sglang.log.columns import _parse_file

    fast, slow = _both_paths(path)
    assert repr(fast) == repr(slow)  # repr: NaN timestamps never compare equal
    a = _parse_file(str(path), 0)  # the compact columns parse_logs merges
    _same_file_results(a, _parse_file(str(path), 0, options=ParseOptions(fast_path=False)))
    _same_file_results(a, _parse_file(str(path), 0, options=ParseOptions(compiled=False)))


_G_PREFIXES = st.sampled_from(
    ["", "    ", "sglang  | ", "2025-02-04 21:29:21 ", "[2025-03-11 16:16:58] ", "⏎ ", "[x] ", "\ufeff",
     " 50%|#####     | 2/4 [00:01<00:01,  1.73it/s]", "2025-07-02T11:36:23.123Z stdout F ", "progress\r50%\r"]
)  # fmt: skip
_G_STAMPS = st.sampled_from(
    [None, "2025-02-04 05:29:21", "16:43:29", "2026-09-24 01:47:50.615", "2026-01-01 00:00:00,123456",
     "2026-13-45 25:61:61", "2026-01-01T00:00:00", "2026-01-01 0:00:00", "2026-01-01 00:00:00.5"]
)  # fmt: skip
_G_RANKS = st.sampled_from(
    [None, "TP0", "TP12", "DP7 TP7", "PP0 ATTN_CP1 TP1 EP1", "DP10 TP10 EP10", "TP00001", "gpu=0",
     "handler.py:169 INFO", "TP1 TP2 TP3 TP4 TP5", "DP1  TP1", "TP99999999999"]
)  # fmt: skip
_G_HEADS = st.sampled_from(
    ["Prefill batch,", "Prefill batch.", "Prefill batch [17],", "Prefill batch", "Prefill batches:",
     "new fill batch.", "Prefill batch,Prefill batch,"]
)  # fmt: skip
_G_KEYS = st.sampled_from(
    ["#new-seq", "#new-token", "#cached-token", "#running-req", "#queue-req", "#replay-token", "#New_Token",
     "#seq", "#remaining-req", "token usage", "#pending-token", "input throughput (token/s)", "cache hit rate"]
)  # fmt: skip
_G_VALUES = st.one_of(
    st.integers(0, 99999).map(str),
    st.sampled_from(["0", "007", "2147483647", "2147483648", "4294967296", "99999999999999999999999", "-5",
                     "1_000", "+3", " 12 ", "5 (x)", "3.", "0.05", "12.50%", "x", "", "１２"]),
)  # fmt: skip
_G_GRAPHS = st.sampled_from(
    [None, "cuda graph: True", "cuda graph: False", "npu graph: True", "cpu graph: False", "CUDA graph: True",
     "cuda graph: maybe", "cuda graph: True."]
)  # fmt: skip
_G_OTHER = st.sampled_from(
    [
        "[2026-01-01 00:00:00 TP0] Decode batch, #running-req: 1, #token: 5, cuda graph: True, gen throughput (token/s): 1.0",
        '[2026-01-01 00:00:00] INFO:     127.0.0.1:40004 - "POST /v1/completions HTTP/1.1" 200 OK',
        "[2026-01-01 00:00:00 TP0] Capture cuda graph bs [1, 2, 4, 8]",
        "[2026-01-01 00:00:00 TP0] Capture target prefill CUDA graph begin. backend=breakable, num_tokens=[256, 512] (2), "
        "avail mem=10.0 GB",
        "[2026-01-01 00:00:00 TP0] max_total_num_tokens=1000, chunked_prefill_size=8192, context_len=4096",
        "[2026-01-01 00:00:00] Disable prefill CUDA graph because LoRA is enabled.",
        "[gpu=0] #running-req: 1, #token: 2, token usage: 0.00, gen throughput (token/s): 3.1, #queue-req: 0",
        "    #running-req: 3, #queue-req: 1,",
        "    cuda graph: False",
        "  full token usage: 0.4, #queue-req: 2",
        "gen throughput (token/s): 3.2, #running-req: 4",
        "Capturing batches (bs=1 avail_mem=10.55 GB): 100%|██| 36/36",
        "",
        "   ",
        "café ∑ \xff",
        "x Decode batch y Prefill batch, #new-seq: 1, #new-token: 2",
        "batch. #new-seq: 1, #new-token: 32, #cached-token: 0, token usage: 0.01",
        "ll batch [4], #new-seq: 3, #new-token: 5,",
        "[2026-01-01 00:00:00] server_args=ServerArgs(model_path='m', tp_size=2, enable_two_batch_overlap=False, "
        "chunked_prefill_size=8192, disable_cuda_graph=False)",
        "[2026-01-01 00:00:00] server_args={'tp_size': 4, 'dp_size': 4, 'enable_dp_attention': True}",
        "01 00:00:01 DP1 TP1] Prefill batch, #new-seq: 1, #new-token: 2, cuda graph: True",
        "[2026-01-01 00:00:00 TP0] Prefill batch, #new-seq: 1, #new-token: 5[2026-01-01 00:00:00 TP0] Prefill batch, "
        "#new-seq: 2, #new-token: 7,",
        "[2026-01-01 00:00:00 TP0] Decode batch, #running-req: 1, cuda graph: TruePrefill batch, #new-seq: 1, #new-token: 9",
    ]
)


_G_COUNT_KEYS = ["#new-seq", "#new-token", "#cached-token", "#running-req", "#queue-req", "#replay-token"]
_G_ALIASES = {"#new-seq": "#seq", "#new-token": "#New_Token", "#queue-req": "#remaining-req"}
_G_EXTRAS = st.sampled_from(
    ["token usage: 0.05", "#pending-token: 669940", "input throughput (token/s): 1234.56", "cache hit rate: 12.50%",
     "full token usage: 0.43", "#unbootstrapped-req: 0", "waiting-image-req: 3", "MFU: 41.2%"]
)  # fmt: skip
_G_COUNTS = st.one_of(st.integers(0, 99), st.integers(0, 10**6), st.sampled_from([2**31 - 1, 2**31, 10**12]))


@st.composite
def _g_prefill_line(draw):
    """A prefill line in any head, prefix, rank, field order, spacing and ending; mostly
    readable, sometimes with an odd value or key."""
    stamp, rank = draw(_G_STAMPS), draw(_G_RANKS)
    inner = " ".join(x for x in (stamp, rank) if x)
    head = draw(_G_PREFIXES) + (f"[{inner}] " if inner else "") + draw(_G_HEADS)
    fields = []
    for key in _G_COUNT_KEYS:
        if draw(st.integers(0, 9)) < (9 if key in ("#new-seq", "#new-token") else 5):
            if key in _G_ALIASES and draw(st.integers(0, 9)) == 0:
                key = _G_ALIASES[key]
            fields.append(f"{key}: {draw(_G_COUNTS)}")
    fields += draw(st.lists(_G_EXTRAS, max_size=3))
    if draw(st.integers(0, 4)) == 0:  # an odd value or key
        fields.append(f"{draw(_G_KEYS)}: {draw(_G_VALUES)}")
    graph = draw(_G_GRAPHS)
    if graph:
        fields.append(graph)
    fields = draw(st.permutations(fields))
    sep = draw(st.sampled_from([", ", ", ", ",", " , ", ". "]))
    return head + " " + sep.join(fields) + draw(st.sampled_from(["", "", ",", ", ", "\r", "\r\r", ".", " "]))


_G_CONTINUATIONS = st.sampled_from(
    ["    #running-req: 3, #queue-req: 1,", "    cuda graph: False", "  full token usage: 0.4, #queue-req: 2,",
     "gen throughput (token/s): 3.2, #running-req: 4", "#cached-token: 10,", "[2026-01-01 00:00:00] INFO: x"]
)  # fmt: skip


@st.composite
def _g_wrapped(draw):
    """A record ending with `,` and the lines after it (hand-wrapped, or not)."""
    first = draw(_g_prefill_line()).rstrip("\r .,") + draw(st.sampled_from([",", ", ", ",\r"]))
    return "\n".join([first] + draw(st.lists(_G_CONTINUATIONS, min_size=0, max_size=7)))


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    lines=st.lists(st.one_of(_g_prefill_line(), _G_OTHER, _g_wrapped()), min_size=1, max_size=40),
    glue=st.lists(st.integers(0, 39), max_size=3),
    crlf=st.booleans(),
    final_newline=st.booleans(),
    chunk_size=st.sampled_from([None, 7, 64, 333]),
)
def test_fast_path_equals_per_line_parser_generated(tmp_path, lines, glue, crlf, final_newline, chunk_size):
    for i in glue:  # two log lines glued together (concurrent writers)
        if i + 1 < len(lines):
            lines[i : i + 2] = [lines[i] + lines[i + 1]]
    nl = "\r\n" if crlf else "\n"
    path = tmp_path / "g.log"
    path.write_bytes((nl.join(lines) + (nl if final_newline else "")).encode("utf-8", "surrogateescape"))
    fast, slow = _both_paths(path, chunk_size)
    assert repr(fast) == repr(slow)


def test_wrapped_record_after_a_fast_layout(tmp_path):
    # a record of a layout the fast path reads, ending with `,`: the next line decides
    path = tmp_path / "w.log"
    path.write_bytes(
        b"[2026-01-01 00:00:00 TP0] Prefill batch, #new-seq: 5, #new-token: 64,\n"
        b"    #running-req: 3, #queue-req: 1,\n"
        b"    cuda graph: False\n"
        b"[2026-01-01 00:00:00 TP0] Prefill batch, #new-seq: 5, #new-token: 64, \n"
        b"gen throughput (token/s): 3.2, #running-req: 4\n"
        b"[2026-01-01 00:00:01 TP0] Prefill batch, #new-seq: 5, #new-token: 64,\n"
        b"[2026-01-01 00:00:01 TP0] Decode batch, #running-req: 1\n"
    )
    fast, slow = _both_paths(path)
    assert repr(fast) == repr(slow)
    assert [(r.line, r.physical_lines, r.running_req) for r in fast.records] == [(1, 3, 3), (4, 2, 4), (6, 1, -1)]
    assert fast.legacy_decode_lines == 0 and fast.decode_lines == 1


# ---- the compiled line scanner ----------------------------------------------------------
def test_the_compiled_line_scanner_is_built():
    # the install (pip install ., or the test command's editable install) compiles it
    # wherever a C compiler is found; without it the parser is right but slower
    from bcgtune.adapters.sglang.log.fastpath import LineTable

    assert LineTable is not None, "bcgtune/adapters/sglang/log/_lines.c was not compiled at install"


def test_without_the_compiled_scanner_the_parse_is_the_same(tmp_path, monkeypatch):
    # an install where no C compiler was found: the import fails, the numpy path reads
    from bcgtune.adapters.sglang.log import scanner

    path = _corpus(tmp_path, 2)
    built = scan_log(str(path))
    monkeypatch.setattr(scanner, "LineTable", None)
    assert scanner._Scanner(0, scanner._Sink()).table is None
    assert repr(scan_log(str(path))) == repr(built)


def _corpus(tmp_path, copies: int) -> Path:
    """Every log of the repository, one after another, `copies` times: many launches, and
    every rare line's text many times over (what the scanner hands on in bulk)."""
    blob = b"".join(
        p.read_bytes().rstrip(b"\n") + b"\n" for p in sorted(SHARED_LOGS.glob("*.log")) + sorted(OUR_LOGS.glob("*.log"))
    )
    path = tmp_path / "corpus.log"
    path.write_bytes(blob * copies)
    return path


@pytest.mark.parametrize("chunk_size", [None, 4096])
@pytest.mark.parametrize("limits", ["as shipped", "forget every chunk", "small caps"])
@pytest.mark.parametrize("level", [2, 1, 0])  # the compiled scanner's AVX2, SSE2 and line-by-line passes
def test_repeated_texts_in_bulk_equal_the_per_line_parser(tmp_path, monkeypatch, chunk_size, limits, level):
    from functools import partial

    from bcgtune.adapters.sglang.log import columns, fastpath, scanner
    from bcgtune.adapters.sglang.log.columns import Want, _parse_file

    monkeypatch.setattr(scanner, "LineTable", partial(fastpath.LineTable, level=level))

    if limits == "forget every chunk":  # the scanner's texts and the layout plans emptied at every chunk
        monkeypatch.setattr(scanner, "_MAX_TABLE_BYTES", 0)
        monkeypatch.setattr(scanner, "_MAX_FAST_PLANS", 0)
        monkeypatch.setattr(fastpath, "_MAX_FAST_PLANS", 0)
    elif limits == "small caps":  # launches, kept events and samples full early: the rest only counted
        for name, cap in (("MAX_SEGMENTS", 3), ("MAX_META_EVENTS", 2), ("MAX_CAPTURES", 3), ("MAX_MALFORMED_SAMPLES", 1)):
            monkeypatch.setattr(columns, name, cap)
    path = _corpus(tmp_path, 5)
    opts = ParseOptions() if chunk_size is None else ParseOptions(chunk_size=chunk_size)
    paths = {"compiled": opts, "numpy": replace(opts, compiled=False), "per line": replace(opts, fast_path=False)}
    for want in (Want(), Want(histogram_only=True)):
        results = {k: _parse_file(str(path), 0, options=o, want=want) for k, o in paths.items()}
        ref = results.pop("per line")
        for name, r in results.items():
            if want.histogram_only:
                assert repr(r.histograms) == repr(ref.histograms), name
                assert {**vars(r), "histograms": None} == {**vars(ref), "histograms": None}, name
            else:
                _same_file_results(r, ref)
        assert ref.capture_count > 5 and ref.startup_count > 5 and ref.server_args_count > 5
        for name, r in results.items():  # events handed on in bulk own their containers, as single ones do
            lists = [id(c["buckets"]) for c in r.captures if c.get("buckets") is not None]
            settings = [id(d["settings"]) for d in r.server_args]
            assert len(set(lists)) == len(lists) and len(set(settings)) == len(settings) > 1, name
            assert len(lists) > 1 or limits == "small caps", name
        assert len(ref.segments) == 3 if limits == "small caps" else len(ref.segments) > 5


_SOUP = st.lists(
    st.sampled_from(
        [b"batch", b"Prefill ", b"Decode ", b"new fill ", b"n", b"ew fill ", b"\n", b"\r\n", b"7", b"123", b" ", b",",
         b"graph", b"max_total_num_token", b"gen throughput", b"server_args=", b"#new-seq", b"Prefill batch, #new-seq: 4",
         b"\xc3\xa9", b"\xff", b"x" * 40, b"b", b"h", b"#"]
    ),
    max_size=120,
)  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(parts=_SOUP, skip=st.integers(0, 12))
@example(parts=[b"Decode ", b"batch", b"\n"], skip=0)  # heads right at the piece's start
@example(parts=[b"ecode ", b"batch"], skip=0)
@example(parts=[b"Prefill ", b"batch", b", #new-seq: 4"], skip=0)
@example(parts=[b"ew fill ", b"batch", b"\n", b"new fill ", b"batch"], skip=0)
@example(parts=[b"n", b"ew fill ", b"batch"], skip=0)
@example(parts=[b"x" * 40, b"graph", b"x" * 40, b"\n", b"Prefill batch, #new-seq: 4", b"graph"], skip=1)
@example(parts=[b"#running-req: 12, gen throughput: 3.5", b"\n", b"#running-req: 98, gen throughput: 7.1"], skip=0)
@example(parts=[b"gen throughput 1 graph 2", b"\n", b"gen throughput 3 graph 4\ngen throughput 5 server_args=6"], skip=0)
@example(parts=[b"gen throughput 1 batch", b"\n", b"gen throughput 2 batch"], skip=0)
def test_compiled_scanner_finds_what_numpy_finds(parts, skip):
    # line ends, record heads and rare lines of arbitrary bytes, as the numpy path finds
    # them; prefill and pre-2024 lines share a layout id exactly when their digit-masked
    # texts are equal, rare lines a text id exactly when their texts are (by layout when the
    # line holds no "batch" and only needles of the layout set)
    from bcgtune.adapters.sglang.log.fastpath import _RARE_NEEDLES, LineTable, _ChunkLines, _Piece
    from bcgtune.adapters.sglang.log.grammar import _B_NEW_SEQ, _MASK_DIGITS
    from bcgtune.adapters.sglang.log.scanner import _K_DECODE, _K_GLUED, _K_HEAD_CUT, _K_LEGACY, _K_PREFILL, _K_RARE, _Scanner

    data = b"pad" * skip + b"".join(parts)
    start = len(b"pad") * skip
    if len(data) == start:
        return
    piece = _Piece(data, start, len(data))
    c = _ChunkLines(piece)
    heads = c.batch_lines()
    by_layout = 0b0101  # the first and third needles
    scan = (data, start, len(data), _RARE_NEEDLES, _B_NEW_SEQ, 60, 50, by_layout)
    scans = [LineTable(level).scan(*scan) for level in (2, 1, 0)]
    assert scans[0] == scans[1] == scans[2]  # AVX2, SSE2 and line by line find the same
    table = LineTable()
    ends, idx, kind, keys = (np.frombuffer(b, t) for b, t in zip(table.scan(*scan), (np.int64, np.int64, np.uint8, np.int64)))
    assert ends.tolist() == c.ends.tolist()
    for bit, want in (
        (_K_PREFILL, heads.prefill),
        (_K_DECODE, heads.decode),
        (_K_LEGACY, heads.legacy),
        (_K_GLUED, heads.glued),
        (_K_HEAD_CUT, heads.head_cut),
    ):
        assert idx[(kind & bit) != 0].tolist() == want.tolist(), bit
    rare = _Scanner._rare_lines(None, c, heads.prefill, heads.decode)
    got_rare = idx[(kind & _K_RARE) != 0].tolist()
    records = set(heads.prefill.tolist()) | set(heads.decode.tolist()) | set(heads.legacy.tolist())
    assert got_rare == [i for i in rare if i not in records]
    texts = {}
    for i, k, kd in zip(idx.tolist(), keys.tolist(), kind.tolist()):
        record = bool(kd & (_K_PREFILL | _K_LEGACY))  # keyed by layout
        if not record and not kd & _K_RARE:
            assert k == -1
            continue
        line = c.line(i)
        found = {j for j, needle in enumerate(_RARE_NEEDLES) if needle in line}
        masked = record or (b"batch" not in line and not found - {0, 2})
        text = line.translate(_MASK_DIGITS) if masked else line
        if len(line) > (60 if record else 50):
            assert k == -1
            continue
        texts.setdefault((masked, text), set()).add(k)
    assert all(len(ids) == 1 for ids in texts.values())
    assert len({next(iter(ids)) for ids in texts.values()}) == len(texts)


def test_compiled_scanner_refuses_bad_arguments():
    from bcgtune.adapters.sglang.log.fastpath import LineTable

    table = LineTable()
    for args in ((b"ab\n", 2, 1, (), b"x", 10, 10), (b"ab\n", 0, 9, (), b"x", 10, 10), (b"ab\n", -1, 2, (), b"x", 10, 10),
                 (b"ab\n", 0, 3, (b"n",) * 17, b"x", 10, 10), (b"ab\n", 0, 3, (), b"x", -1, 10),
                 (b"ab\n", 0, 3, (), b"x", 1, -10)):  # fmt: skip
        with pytest.raises(ValueError):
            table.scan(*args)
    with pytest.raises(TypeError):
        table.scan("text", 0, 1, (), b"x", 10, 10)
    assert table.scan(b"", 0, 0, (), b"x", 10, 10) == (b"", b"", b"", b"")
    bare = LineTable.__new__(LineTable)  # never initialised: still safe
    assert bare.scan(b"a\n", 0, 2, (), b"x", 10, 10)[0] == (1).to_bytes(8, "little")
    bare.clear()
    assert bare.nkeys == 0
    # the field reader never reads outside the data, whatever the tables say
    from bcgtune.adapters.sglang.log.fastpath import read_fields

    data, one = b"12 345\n", np.zeros((1, 2), np.int64)
    starts, plans = np.array([0], np.int64), np.array([0], np.int64)
    assert np.frombuffer(read_fields(data, 0, starts, plans, np.array([[0, 3]]), np.array([[2, 3]]), 2), np.int64).tolist() == [
        12,
        345,
    ]
    for offsets, lengths, plan, width in ((one + 5, one + 3, plans, 2), (one - 1, one + 1, plans, 2), (one, one + 19, plans, 2),
                                          (one, one + 1, plans + 1, 2), (one, one + 1, plans, 3)):  # fmt: skip
        with pytest.raises(ValueError):
            read_fields(data, 0, starts, plan, offsets, lengths, width)


# ---- hostile inputs: one-line InputError, bounded memory and time ----------------------
def _count_reads(monkeypatch) -> list[int]:
    """Sizes of the blocks parse_logs reads from its inputs."""
    import bcgtune.adapters.sglang.log.scanner as mod

    read = mod._Source.read
    sizes: list[int] = []

    def counting(self, size):
        block = read(self, size)
        sizes.append(len(block))
        return block

    monkeypatch.setattr(mod._Source, "read", counting)
    return sizes


def _nul_inputs(tmp_path):
    sparse = tmp_path / "zeros.log"
    with open(sparse, "wb") as fh:
        fh.truncate(1 << 30)  # 1 GiB of NUL bytes (sparse: costs no disk)
    noise = tmp_path / "noise.bin"
    noise.write_bytes(np.random.default_rng(0).integers(0, 256, 300_000, dtype=np.uint8).tobytes())
    gz = tmp_path / "zeros.log.gz"
    gz.write_bytes(gzip.compress(bytes(2_000_000)))
    return [sparse, noise, gz] + ([Path("/dev/zero")] if Path("/dev/zero").exists() else [])


def test_binary_inputs_refused_after_the_first_chunk(tmp_path, monkeypatch):
    import bcgtune.adapters.sglang.log as mod

    for path in _nul_inputs(tmp_path):
        reads = _count_reads(monkeypatch)
        with pytest.raises(InputError, match="binary data") as ei:
            parse_logs([str(path)])
        assert ei.value.where == str(path) and "\n" not in str(ei.value)
        assert sum(reads) <= mod.CHUNK_SIZE, path  # refused on the first block, whatever follows


@pytest.mark.parametrize("fast", [True, False])
def test_overlong_lines_skipped_counted_and_quoted_short(tmp_path, monkeypatch, fast):
    import bcgtune.adapters.sglang.log as mod

    path = tmp_path / "long.log"
    ok = b"[2026-01-01 00:00:00 TP0] Prefill batch, #new-seq: 1, #new-token: 5\n"
    with open(path, "wb") as fh:
        fh.write(ok)
        fh.write(b"[2026-01-01 00:00:00 TP0] Prefill batch, #new-seq: 1, #new-token: 6, " + b"x" * (3 << 20) + b"\n")
        fh.write(ok)
        fh.write(b"y" * (mod.MAX_LINE_BYTES + 1))  # the last line, without b"\n"
    reads = _count_reads(monkeypatch)
    trace = parse_logs([str(path)], options=ParseOptions(fast_path=fast))
    assert max(reads) <= mod.CHUNK_SIZE
    assert trace.batches["line"].tolist() == [1, 3]
    ps = trace.parse_stats
    assert ps["lines"] == 4 and ps["overlong_lines"] == 2 and ps["malformed_prefill_lines"] == 0
    assert [(s["line"], s["bytes"]) for s in ps["overlong_samples"]] == [
        (2, len(ok) + 1 + (3 << 20)),
        (4, mod.MAX_LINE_BYTES + 1),
    ]
    assert all(len(s["text"]) <= mod.MAX_QUOTE_CHARS for s in ps["overlong_samples"])
    assert ps["overlong_samples"][0]["text"].startswith("[2026-01-01 00:00:00 TP0] Prefill batch")
    assert len(repr(ps)) < 5000  # never the whole line


def test_a_100_mb_line_is_skipped_in_bounded_memory(tmp_path, monkeypatch):
    # the same path as a 100 MB line, at a scale a test can afford: a line 1000 times the
    # line limit is read block by block and never held whole
    import bcgtune.adapters.sglang.log.scanner as mod

    path = tmp_path / "long.log"
    path.write_bytes(b"z" * (1024 * 1000) + b"\n[2026-01-01 00:00:00] Prefill batch, #new-seq: 1, #new-token: 9\n")
    held = []
    chunks = mod._chunks

    def watching(src, size, max_line_bytes):
        for item in chunks(src, size, max_line_bytes):
            held.append(len(item.data) if isinstance(item, mod._Piece) else len(item.head))
            yield item

    monkeypatch.setattr(mod, "_chunks", watching)
    trace = parse_logs([str(path)], options=ParseOptions(max_line_bytes=1024, chunk_size=1024))
    assert max(held) <= 2 * 1024
    assert trace.batches["line"].tolist() == [2] and trace.parse_stats["overlong_lines"] == 1


def _pieces(data: bytes, chunk_size: int, max_line_bytes: int) -> list:
    """What _chunks makes of `data`: each line of its pieces, and each overlong line."""
    import io

    import bcgtune.adapters.sglang.log.scanner as mod

    class Src:
        where = "x.log"
        read = io.BytesIO(data).read

    out: list = []
    for item in mod._chunks(Src(), chunk_size, max_line_bytes):
        if isinstance(item, mod._Piece):
            out += item.data[item.start : item.stop].splitlines(keepends=True)
        else:
            out.append(("overlong", item.head[: max_line_bytes + 1], item.nbytes, item.ended))  # its start
    return out


@settings(max_examples=300, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 150), max_size=40),
    final_newline=st.booleans(),
    factor=st.sampled_from([2, 3, 4, 7]),
    extra=st.integers(0, 9),
)
def test_blocks_larger_than_the_line_limit_find_the_same_overlong_lines(lengths, final_newline, factor, extra):
    """Blocks read larger than the line limit (a line longer than it may sit inside one)
    give the same lines and the same overlong lines as blocks of the limit itself."""
    m = 48
    data = b"\n".join(bytes([97 + i % 26]) * n for i, n in enumerate(lengths)) + b"\n" * final_newline
    assert _pieces(data, factor * m + extra, m) == _pieces(data, m, m)


def test_truncated_and_corrupt_gz_name_the_file(tmp_path):
    data = (OUR_LOGS / "e1_npu_forward_iter.log").read_bytes() * 50
    gz = gzip.compress(data)
    cases = {"cut1.log.gz": gz[:1], "cut10.log.gz": gz[:10], "cut_half.log.gz": gz[: len(gz) // 2], "cut_tail.log.gz": gz[:-4]}
    flipped = bytearray(gz)
    flipped[len(gz) // 2] ^= 0xFF
    cases["flipped.log.gz"] = bytes(flipped)
    cases["header_only.log.gz"] = b"\x1f\x8b\x08\x00garbage" * 3
    for name, blob in cases.items():
        path = tmp_path / name
        path.write_bytes(blob)
        with pytest.raises(InputError) as ei:  # never EOFError, zlib.error or OSError
            parse_logs([str(path)])
        assert ei.value.where == str(path) and "\n" not in str(ei.value), name
        assert len(ei.value.what) < 120, name


@pytest.mark.parametrize("fast", [True, False])
def test_counts_outside_int32_are_malformed(tmp_path, fast):
    path = tmp_path / "big.log"
    head = "[2026-01-01 00:00:00 TP0] Prefill batch"
    path.write_text(
        f"{head}, #new-seq: 1, #new-token: 2147483647, cuda graph: True\n"
        f"{head}, #new-seq: 1, #new-token: 2147483648, cuda graph: True\n"
        f"{head}, #new-seq: 1, #new-token: 99999999999999999999999\n"
        f"{head}, #new-seq: 1, #new-token: 8, #cached-token: 4294967296\n"
        f"{head}, #new-seq: 1, #new-token: 8, #running-req: -3\n"
        f"{head} [99999999999999999999999], #new-seq: 1, #new-token: 8\n"
        f"{head}, #new-seq: 1, #new-token: 1{'0' * 5000}\n"
        f"{head}, #new-seq: 2, #new-token: 64\n"
    )
    trace = parse_logs([str(path)], options=ParseOptions(fast_path=fast))
    assert trace.batches["line"].tolist() == [1, 8]
    assert trace.batches["new_token"].tolist() == [2147483647, 64]
    ps = trace.parse_stats
    assert ps["malformed_prefill_lines"] == 6
    assert [s["line"] for s in ps["malformed_samples"]] == [2, 3, 4, 5, 6]
    assert all(len(s["text"]) <= 300 for s in ps["malformed_samples"])


def test_capture_and_startup_numbers_bounded():
    cap = parse_capture_text("[2026-01-01 00:00:00 TP0] Capture cuda graph bs [1, 99999999999999999999, 4, -2]")
    assert cap["buckets"] == [1, 4] and cap["elided"]
    cap = parse_capture_text(
        "Capture target prefill CUDA graph begin. num_tokens=[256] (99999999999999999999), avail mem=" + "9" * 400 + " GB"
    )
    assert cap["listed_count"] is None and cap["elided"] and cap["avail_mem_gb"] is None
    d = parse_startup_text("[x] max_total_num_tokens=1000, chunked_prefill_size=-1, context_len=99999999999999, mem=1e9 GB")
    assert d["max_total_num_tokens"] == 1000 and d["chunked_prefill_size"] == -1 and "context_len" not in d
    assert parse_startup_text("[x] max_total_num_tokens=99999999999999999999, context_len=4096") is None


def test_folder_missing_file_and_closed_stdin(tmp_path, monkeypatch):
    import io
    import sys

    with pytest.raises(InputError, match="folder") as ei:
        parse_logs([str(tmp_path)])
    assert ei.value.where == str(tmp_path)
    with pytest.raises(InputError, match="no such file"):
        parse_logs([str(tmp_path / "nope.log")])
    monkeypatch.setattr(sys, "stdin", None)  # what Python sets when fd 0 is closed
    with pytest.raises(InputError, match="standard input is closed") as ei:
        parse_logs(["-"])
    assert ei.value.where == "<stdin>"
    closed = io.BytesIO(b"x")
    closed.close()

    class ClosedStdin:
        buffer = closed

    monkeypatch.setattr(sys, "stdin", ClosedStdin())
    with pytest.raises(InputError, match="standard input is closed"):
        parse_logs(["-"])
    with pytest.raises(InputError, match="once"):
        parse_logs(["-", "-"])


_ADVERSARIAL = r"""
import sys, time
import bcgtune.adapters.sglang.log as m
from bcgtune.errors import InputError
n = m.MAX_LINE_BYTES - 100
lines = [
    b"[t] Prefill batch, #new-seq: 1, #new-token: 1,", b"a" + b" " * n,  # continuation check
    b"x Capture target " + b"Capture target aaaa " * (n // 20) + b"graph",
    b"[t] max_total_num_tokens=1, " + b"a" * n,
    b"Capture cuda graph bs " + b"bs[" * (n // 3),
    b"Capture cuda graph bs bs" + b" " * n,
    b"[" * n + b"] Prefill batch, #new-seq: 1, #new-token: 2",
    b"[t] Prefill batch, " + b"#new-seq: " * (n // 10),
    b"avail mem=" + b"1" * n,
    b"[t] Disable prefill CUDA graph " + b"] [" * (n // 3),
]
path = sys.argv[1]
open(path, "wb").write(b"\n".join(lines) + b"\n")
t0 = time.perf_counter()
try:
    m.parse_logs([path])
except InputError:
    pass
print(time.perf_counter() - t0)
"""


def test_adversarial_long_lines_parse_in_linear_time(tmp_path):
    # lines near the length limit built to make a backtracking regex go quadratic; a
    # quadratic pattern takes hours here, the timeout turns that into a failure
    out = subprocess.run(
        [sys.executable, "-c", _ADVERSARIAL, str(tmp_path / "adv.log")],
        capture_output=True, timeout=HANG_S, cwd=REPO, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr.decode()[-2000:]


# ---- Ctrl-C ------------------------------------------------------------------------
def _interrupt(code: str, feed: bytes | None = None) -> tuple[int, str, list[str]]:
    """Run `code` in its own process group, send the group SIGINT (a terminal's Ctrl-C)
    once it has printed a line, and return (exit status, stderr, processes left)."""
    # Ctrl-C as in a terminal, whatever the test runner inherited (a shell's background job
    # starts with SIGINT ignored, and Python then keeps it ignored)
    code = "import signal\nsignal.signal(signal.SIGINT, signal.default_int_handler)\n" + code
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE if feed else None, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, cwd=REPO, start_new_session=True,
    )  # fmt: skip
    if feed:

        def write():
            try:
                while True:
                    proc.stdin.write(feed)
            except (OSError, ValueError):
                pass

        threading.Thread(target=write, daemon=True).start()
    proc.stdout.readline()
    time.sleep(0.5)
    os.killpg(proc.pid, signal.SIGINT)
    try:
        rc = proc.wait(timeout=HANG_S)
    finally:
        proc.kill()
    time.sleep(0.2)
    try:
        os.killpg(proc.pid, 0)
        left = ["a process of the group"]
    except ProcessLookupError:
        left = []
    return rc, proc.stderr.read().decode(), left


@pytest.mark.skipif(not hasattr(os, "killpg"), reason="process groups are POSIX")
def test_ctrl_c_stops_a_long_parse():
    line = b"[2026-01-01 00:00:00 TP0] Prefill batch, #new-seq: 1, #new-token: 5, cuda graph: True\n" * 5000
    code = "from bcgtune.adapters.sglang.log import parse_logs\nprint('go', flush=True)\nparse_logs(['-'])"
    rc, err, left = _interrupt(code, feed=line)
    assert rc in (-signal.SIGINT, 130) and err.rstrip().endswith("KeyboardInterrupt"), err[-2000:]
    assert not left


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="named pipes are POSIX")
def test_ctrl_c_with_workers_running_leaves_no_orphans(tmp_path):
    paths = []
    for i in range(3):  # workers block opening these until interrupted
        os.mkfifo(tmp_path / f"f{i}.log")
        paths.append(str(tmp_path / f"f{i}.log"))
    code = (
        "import bcgtune.adapters.sglang.log as m\nprint('go', flush=True)\n"
        f"m.parse_logs({paths!r}, jobs=3, options=m.ParseOptions(parallel_min_bytes=0))"
    )
    rc, err, left = _interrupt(code)
    assert rc in (-signal.SIGINT, 130) and err.rstrip().endswith("KeyboardInterrupt"), err[-2000:]
    assert err.count("Traceback") == 1  # the workers print nothing
    assert not left


@pytest.mark.skipif(not hasattr(os, "mkfifo") or not sys.platform.startswith("linux"), reason="named pipes, fork")
def test_workers_stopped_by_sigterm_print_nothing(tmp_path):
    """The command's SIGTERM handler turns SIGTERM into KeyboardInterrupt; a forked worker
    must not keep it: stopped by its parent (SIGTERM) it ends quietly, never with a
    traceback on a run that succeeded. The workers block opening named pipes when stopped."""
    paths = []
    for i in range(2):
        os.mkfifo(tmp_path / f"f{i}.log")
        paths.append(str(tmp_path / f"f{i}.log"))
    code = f"""
import signal, time
from bcgtune.cli.app import _sigterm
import bcgtune.adapters.sglang.log.parallel as par
from bcgtune.adapters.sglang.log import ParseOptions
from bcgtune.adapters.sglang.log.columns import Want
signal.signal(signal.SIGTERM, _sigterm)
par._start_method = lambda: "fork"
with par._Workers({paths!r}, [0, 1], 2, [None, None], ParseOptions(), [Want(), Want()]) as w:
    t = time.monotonic()
    while w.taken.value < 2 and time.monotonic() - t < 60:
        time.sleep(0.01)
    time.sleep(0.2)
print([p.exitcode for p in w.procs])
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == f"[{-signal.SIGTERM}, {-signal.SIGTERM}]" and "Traceback" not in r.stderr, r.stderr[-2000:]


# ---- several files in parallel --------------------------------------------------------
def _same_trace(a, b):
    assert a.batches.keys() == b.batches.keys()
    for k in a.batches:
        assert a.batches[k].dtype == b.batches[k].dtype
        assert np.array_equal(a.batches[k], b.batches[k], equal_nan=k == "timestamp"), k
    assert (a.parse_stats, a.meta, a.captures, a.sources) == (b.parse_stats, b.meta, b.captures, b.sources)
    assert a.sizes.tolist() == b.sizes.tolist() and a.counts.tolist() == b.counts.tolist()


def test_parallel_parse_equals_serial(tmp_path, monkeypatch):
    import io
    import sys

    import bcgtune.adapters.sglang.log.parallel as mod

    calls = []
    parallel = mod._parse_parallel
    monkeypatch.setattr(mod, "_parse_parallel", lambda *a: calls.append(a[2]) or parallel(*a))
    gz = tmp_path / "e2.log.gz"
    gz.write_bytes(gzip.compress((OUR_LOGS / "e2_pp_attn_cp_ranks.log").read_bytes()))
    files = sorted(str(p) for p in OUR_LOGS.glob("*.log")) + [str(gz), "-"]
    stdin = (OUR_LOGS / "e1_npu_forward_iter.log").read_bytes()

    class FakeStdin:
        buffer = io.BytesIO(stdin)

        def close(self):  # a worker process closes its inherited stdin
            pass

    monkeypatch.setattr(sys, "stdin", FakeStdin())
    eager = ParseOptions(parallel_min_bytes=0)
    serial = parse_logs(files, jobs=1, options=eager)
    FakeStdin.buffer = io.BytesIO(stdin)
    both = parse_logs(files, jobs=2, options=eager)
    assert calls == [2]
    _same_trace(serial, both)
    assert both.batches["source"].max() == len(files) - 1


def test_parallel_error_is_the_serial_one(tmp_path):
    bad = tmp_path / "bad.log"
    bad.write_bytes(b"\0" * 100)
    files = [str(OUR_LOGS / "e1_npu_forward_iter.log"), str(bad), str(tmp_path / "missing.log")]
    errors = []
    for jobs in (1, 3):
        with pytest.raises(InputError) as ei:
            parse_logs(files, jobs=jobs, options=ParseOptions(parallel_min_bytes=0))
        errors.append(str(ei.value))
    assert errors[0] == errors[1] and str(bad) in errors[0]
    for jobs in (0, -1, "2"):
        with pytest.raises(InputError, match="jobs"):
            parse_logs(files, jobs=jobs)


def test_progress_reports_bytes_read(tmp_path, monkeypatch):
    import io
    import sys

    small = ParseOptions(chunk_size=256)
    files = [OUR_LOGS / "e1_npu_forward_iter.log", OUR_LOGS / "e2_pp_attn_cp_ranks.log"]
    total = sum(p.stat().st_size for p in files)
    calls = []
    parse_logs([str(p) for p in files], progress=lambda done, of: calls.append((done, of)), options=small)
    assert len(calls) > 4 and calls[-1] == (total, total)
    assert all(of == total for _, of in calls)
    assert [d for d, _ in calls] == sorted(d for d, _ in calls)

    class FakeStdin:
        buffer = io.BytesIO(files[0].read_bytes())

    monkeypatch.setattr(sys, "stdin", FakeStdin())
    calls.clear()
    parse_logs(["-"], progress=lambda done, of: calls.append((done, of)), options=small)
    assert calls[-1] == (files[0].stat().st_size, None)


def test_one_forward_token_rule():
    from bcgtune.adapters.sglang.log import (
        FORWARD_TOKENS_RULE_BY_LAUNCH,
        PrefillValues,
        forward_tokens,
    )

    new, replay, running = np.array([100, 50, 64]), np.array([20, -1, -1]), np.array([7, 3, -1])
    assert forward_tokens(new, replay, running).tolist() == [120, 50, 64]
    assert forward_tokens(new, replay, running, mixed_chunk=True).tolist() == [127, 53, 64]
    rec = parse_prefill_text("[t] Prefill batch, #new-seq: 2, #new-token: 100, #running-req: 7, #replay-token: 20")
    assert rec.forward_tokens() == 120 and rec.forward_tokens(mixed_chunk=True) == 127
    from bcgtune.core.trace.summary import summarize

    t = parse_logs([str(OUR_LOGS / "e1_npu_forward_iter.log")])
    assert t.meta["forward_tokens_rule"] == FORWARD_TOKENS_RULE_BY_LAUNCH
    assert summarize(t).forward_tokens_rule == "new_token"  # the log logs no #replay-token
    assert PrefillValues._fields[:2] == ("new_seq", "new_token")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the patched worker travels by fork")
def test_a_dead_worker_is_an_error_not_a_hang(monkeypatch):
    import bcgtune.adapters.sglang.log.parallel as mod
    from bcgtune.errors import ExternalError

    monkeypatch.setattr(mod, "_start_method", lambda: "fork")
    real = mod.parse_and_finish

    def dying(path, *args):
        if path.endswith("e2_pp_attn_cp_ranks.log"):
            os._exit(3)  # killed, say, by the kernel's out-of-memory killer
        return real(path, *args)

    monkeypatch.setattr(mod, "parse_and_finish", dying)
    files = [str(p) for p in sorted(OUR_LOGS.glob("e[123]*.log"))]
    with pytest.raises(ExternalError, match="exit code 3"):
        parse_logs(files, jobs=2, options=ParseOptions(parallel_min_bytes=0))


def test_layouts_differing_in_digit_counts(tmp_path):
    # one field layout, every count any length (a busy server's log): the fast path reads
    # each line at its own offsets, and a first key whose length decides whether the
    # record is readable (at most 61 characters) is read per line
    rng = np.random.default_rng(3)
    lines = []
    for i in range(3000):
        v = [int(x) for x in rng.integers(0, 10 ** rng.integers(1, 10, 8))]
        lines.append(
            f"[2026-08-27 03:{i % 60:02d}:{i % 7:02d}{f'.{i % 1000:03d}' if i % 3 else ''} DP{i % 12} TP{i % 12}] "
            f"Prefill batch, #new-seq: {v[0]}, #new-token: {v[1]:0{i % 4 + 1}d}, #cached-token: {v[2]}, "
            f"token usage: 0.{v[3] % 100:02d}, #running-req: {v[4]}, #queue-req: {v[5]}, #pending-token: {v[6]}, "
            f"cuda graph: {bool(i % 2)}, input throughput (token/s): {v[7] / 7:.2f}"
        )
        if i % 50 == 0:
            key = ("1" * (10 + i // 50 % 8) + "x") * 4  # short digit runs, 44 to 72 characters in all
            lines.append(f"[2026-08-27 03:00:00] Prefill batch, #a{key}: 3, #new-seq: 1, #new-token: 2")
    path = tmp_path / "busy.log"
    path.write_text("\n".join(lines) + "\n")
    fast, slow = _both_paths(path)
    assert repr(fast) == repr(slow)
    assert len(fast.records) > 2000 and len(fast.malformed) > 10


@settings(max_examples=300, deadline=None)
@given(st.lists(st.binary(max_size=30).map(lambda b: bytes(b"0a ,.:"[x % 6] for x in b)), min_size=1, max_size=6))
def test_digit_runs_match_a_regex(texts):
    import re

    from bcgtune.adapters.sglang.log.fastpath import _Runs

    runs = _Runs(texts)
    for i, text in enumerate(texts):
        assert runs.of(i) == [m.span() for m in re.finditer(rb"0+", text)]
        assert runs.shapes[i] == re.sub(rb"0+", b"0", text)
