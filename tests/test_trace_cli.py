"""`bcgtune trace --log`: CLI behaviour (CliRunner) and one-line errors (subprocess)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import xxhash
from cli_helpers import HANG_S
from typer.testing import CliRunner

from bcgtune.cli.app import app
from bcgtune.cli.render.trace import render_trace_text
from bcgtune.core.trace.summary import summarize
from bcgtune.files.trace_file import load_trace

# public SGLang log excerpts with their expected parse (tests/data/sglang-logs/SOURCES.md)
SHARED_LOGS = Path(__file__).resolve().parent / "data" / "sglang-logs"
OUR_LOGS = Path(__file__).resolve().parent / "data" / "logs"
REPO = Path(__file__).resolve().parents[1]

LOAD_LOG = (
    "[2026-08-27 03:45:55] Capture target prefill CUDA graph begin. backend=breakable, num_tokens=[4, 8, 16, 32, 64], avail "
    "mem=12.59 GB\n"
    "[2026-08-27 03:46:18] Capture target prefill CUDA graph end. elapsed=22.96 s, mem usage=1.71 GB, avail mem=10.88 GB.\n"
    "[2026-08-27 03:46:31] Prefill batch, #new-seq: 1, #new-token: 6, #cached-token: 0, cuda graph: True\n"
    "[2026-08-27 03:46:32] Prefill batch, #new-seq: 1, #new-token: 7, #cached-token: 0, cuda graph: False\n"
    "[2026-08-27 03:46:33] Prefill batch, #new-seq: 1, #new-token: 30, #cached-token: 0, cuda graph: True\n"
    "[2026-08-27 03:46:34] Prefill batch, #new-seq: 1, #new-token: 1, #cached-token: 0, cuda graph: False\n"
    "[2026-08-27 03:46:35] Prefill batch, #new-seq: 1, #new-token: 500, #cached-token: 0, cuda graph: False\n"
    "[2026-08-27 03:46:36] Decode batch, #running-req: 1, #token: 0, token usage: 0.00, cuda graph: True\n"
    "[2026-08-27 03:46:37] Prefill batch, #new-seq: 1, #new-token: zz\n"
)


@pytest.fixture()
def load_log(tmp_path):
    p = tmp_path / "server.log"
    p.write_text(LOAD_LOG)
    return p


def test_summary_json_and_bucket_usage(load_log):
    res = CliRunner().invoke(app, ["trace", "--log", str(load_log), "--json"])
    assert res.exit_code == 0, res.output
    s = json.loads(res.stdout)
    assert s["batches"] == 5 and s["distinct_sizes"] == 5 and s["tokens"] == 544
    assert s["percentiles"] == {"p50": 7, "p90": 500, "p99": 500, "max": 500}
    assert s["graph"]["replayed"] == 2 and s["graph"]["flagged_batches"] == 5
    cap = s["captured"]
    assert cap["buckets"] == [4, 8, 16, 32, 64] and cap["backend"] == "breakable"
    rows = {r["bucket"]: r for r in cap["per_bucket"]}
    assert rows[8] == {"bucket": 8, "served": 2, "replayed": 1, "ran_eager": 1, "unknown": 0}
    assert rows[32]["served"] == 1 and rows[32]["replayed"] == 1
    assert cap["not_servable_batches"] == 2  # n=1 (bucket 4 > 2x) and n=500 (above max)
    assert cap["unused_buckets"] == [4, 16, 64]
    assert s["malformed"]["count"] == 1 and s["malformed"]["samples"][0]["where"].endswith("server.log:9")
    assert s["decode_lines"] == 1


def test_human_summary_and_outputs(load_log, tmp_path):
    out_json = tmp_path / "trace.json"
    res = CliRunner().invoke(app, ["trace", "--log", str(load_log), "-o", str(out_json)])
    assert res.exit_code == 0, res.output
    text = res.stdout
    assert "prefill batches  5" in text
    assert "size p50/p90/p99/max  7 / 500 / 500 / 500" in text
    assert "40.0% replayed" in text
    assert "captured buckets 5" in text
    assert "malformed prefill lines  1" in text and "server.log:9" in text
    trace = load_trace(str(out_json))
    assert trace.origin == "sglang-log" and trace.n_batches == 5
    assert trace.sources[0]["bytes"] == len(LOAD_LOG.encode())
    # the log's identity is its XXH3-128, as `xxh128sum` prints it (xxhash 0.8 gives
    # 6bba86c7e069f56d5a10b435f1c8e49c for b"hello\n": the same function, checked here too)
    assert trace.sources[0]["xxh128"] == xxhash.xxh3_128(LOAD_LOG.encode()).hexdigest()
    assert xxhash.xxh3_128(b"hello\n").hexdigest() == "6bba86c7e069f56d5a10b435f1c8e49c"
    out_csv = tmp_path / "trace.csv"
    res = CliRunner().invoke(app, ["trace", "--log", str(load_log), "--out", str(out_csv), "--mixed-chunk"])
    assert res.exit_code == 0
    assert out_csv.read_text().splitlines()[:3] == ["size,count", "1,1", "6,1"]


def test_several_logs_and_ranks():
    files = [OUR_LOGS / "e1_npu_forward_iter.log", OUR_LOGS / "e2_pp_attn_cp_ranks.log"]
    args = ["trace", "--json"]
    for f in files:
        args += ["--log", str(f)]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    s = json.loads(res.stdout)
    assert s["batches"] == 18 and len(s["sources"]) == 2
    assert s["ranks"]["(none)"] == 2 and s["ranks"]["PP0 ATTN_CP1 TP1 EP1"] == 1
    assert any("ranks/files print prefill lines" in n for n in s["notes"])
    assert s["graph"]["labels"] == {"npu": 18}


def test_render_is_pure(load_log):
    from bcgtune.adapters.sglang.log import parse_logs

    trace = parse_logs([str(load_log)])
    assert render_trace_text(summarize(trace)) == render_trace_text(summarize(trace))
    assert summarize(trace) == summarize(trace)


def test_no_log_option_is_an_error():
    res = CliRunner().invoke(app, ["trace"])
    assert res.exit_code != 0


def _run(*args, stdin: bytes | None = None):
    return subprocess.run(
        [sys.executable, "-m", "bcgtune", *args],
        cwd=REPO,
        input=stdin,
        capture_output=True,
        timeout=HANG_S,
        check=False,
    )


@pytest.mark.parametrize("kind", ["missing", "empty", "no_prefill", "folder", "nul", "truncated_gz", "corrupt_gz", "huge_count"])
def test_bad_input_one_line_error_exit_2(tmp_path, kind):
    import gzip

    gz = gzip.compress(LOAD_LOG.encode() * 20)
    if kind == "missing":
        path = tmp_path / "missing.log"
    elif kind == "folder":
        path = tmp_path
    elif kind == "nul":
        path = tmp_path / "zeros.log"
        with open(path, "wb") as fh:
            fh.truncate(1 << 30)  # 1 GiB of NUL bytes, sparse
    elif kind.endswith("gz"):
        path = tmp_path / f"{kind}.log.gz"
        path.write_bytes(gz[: len(gz) // 2] if kind == "truncated_gz" else gz[:20] + bytes(64) + gz[84:])
    elif kind == "huge_count":  # the only record is corrupt: malformed, not an overflow
        path = tmp_path / "huge.log"
        path.write_text("[2026-01-01 00:00:00] Prefill batch, #new-seq: 1, #new-token: 99999999999999999999999\n")
    else:
        path = tmp_path / f"{kind}.log"
        path.write_text("" if kind == "empty" else "[2026-01-01 00:00:00] Decode batch, #running-req: 1\nhello\n")
    proc = _run("trace", "--log", str(path))
    err = proc.stderr.decode()
    assert proc.returncode == 2, err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert "Traceback" not in err
    assert str(path) in err
    assert proc.stdout == b""


def test_closed_stdin_one_line_error():
    import os

    proc = subprocess.run(
        [sys.executable, "-m", "bcgtune", "trace", "--log", "-"], cwd=REPO, capture_output=True, timeout=HANG_S,
        stdin=subprocess.DEVNULL, preexec_fn=lambda: os.close(0), check=False,
    )  # fmt: skip
    err = proc.stderr.decode()
    assert proc.returncode == 2 and err.count("\n") == 1 and "standard input is closed" in err, err


def test_stdin_and_gz_via_subprocess(tmp_path):
    import gzip

    gz = tmp_path / "server.log.gz"
    gz.write_bytes(gzip.compress(LOAD_LOG.encode()))
    a = _run("trace", "--log", str(gz), "--json")
    b = _run("trace", "--log", "-", "--json", stdin=LOAD_LOG.encode())
    assert a.returncode == 0 and b.returncode == 0, (a.stderr, b.stderr)
    sa, sb = json.loads(a.stdout), json.loads(b.stdout)
    assert sa["batches"] == sb["batches"] == 5
    assert sa["sources"][0]["xxh128"] == sb["sources"][0]["xxh128"]


def test_shared_golden_through_cli():
    path = SHARED_LOGS / "24_newest_decode_graph_end_startup_and_load.log"
    res = CliRunner().invoke(
        app, ["trace", "--log", str(path), "--log", str(SHARED_LOGS / "22_newest_prefill_graph_capture_begin.log"), "--json"]
    )
    s = json.loads(res.stdout)
    assert s["batches"] == 14 and s["decode_lines"] == 13
    assert len(s["captured"]["buckets"]) == 58
    assert s["captured"]["servable_batches"] == 13  # the 1-token batch cannot replay (bucket 4 > 2x)


@pytest.mark.parametrize(
    "name,content,sizes,counts",
    [
        ("bom.csv", "\ufeffsize,count\r\n100,2\r\n200,3\r\n", [100, 200], [2, 3]),  # spreadsheet export
        ("swapped.csv", "count,size\n2,100\n3,200\n", [100, 200], [2, 3]),
        ("onecol.csv", "size\n100\n200\n100\n", [100, 200], [2, 1]),
        ("tokens.csv", "tokens,count,note\n300,4,x\n", [300], [4]),
        ("list.json", "[100, 200, 100]", [100, 200], [2, 1]),
    ],
)
def test_trace_inputs_users_have(tmp_path, name, content, sizes, counts):
    from bcgtune.files.trace_file import load_trace

    p = tmp_path / name
    p.write_bytes(content.encode("utf-8"))
    t = load_trace(str(p))
    assert t.sizes.tolist() == sizes and t.counts.tolist() == counts


@pytest.mark.parametrize(
    "content,needle",
    [
        ("batches,foo\n1,2\n", "needs a 'size' column"),
        ("count,size\n2,100\n3\n", ":3"),
        ('[1, "a"]', "valid integer"),
        ("[]", "empty"),
    ],
)
def test_trace_input_errors_name_the_problem(tmp_path, content, needle):
    from bcgtune.errors import InputError
    from bcgtune.files.trace_file import load_trace

    p = tmp_path / "t.csv"
    p.write_text(content)
    with pytest.raises(InputError) as ei:
        load_trace(str(p))
    assert needle in str(ei.value)
