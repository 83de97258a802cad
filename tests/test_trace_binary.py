"""The binary trace form (`-o NAME.npz`): it reads back as the JSON form does (every column
in its own type, the document's provenance, configurations and votes), through the commands
that read traces; and a damaged or hostile archive is one clear error, never a traceback or
an unbounded read."""

from __future__ import annotations

import io
import json
import zipfile

import numpy as np
import pytest
from cli_helpers import assert_one_line_error, cli

from bcgtune.core.trace.prefill_trace import BATCH_COLUMNS
from bcgtune.errors import InputError
from bcgtune.files import trace_file
from bcgtune.files.trace_file import load_trace, save_trace

LOGS = "tests/data/sglang-logs"


def _one_line(r, says: str) -> None:
    assert r.code == 2, r.err
    assert_one_line_error(r)
    assert says in r.err, r.err


def _same(a, b) -> None:
    assert np.array_equal(a.sizes, b.sizes) and np.array_equal(a.counts, b.counts)
    assert (a.batches is None) == (b.batches is None)
    if a.batches is not None:
        assert list(a.batches) == list(b.batches)
        for k, col in a.batches.items():
            assert col.dtype == b.batches[k].dtype == np.dtype(BATCH_COLUMNS[k]), k
            if col.dtype.kind == "f":  # JSON keeps simulated times to the millisecond, the binary form exactly
                assert np.allclose(col, b.batches[k], rtol=0, atol=5e-4, equal_nan=True), k
            else:
                assert np.array_equal(col, b.batches[k]), k
    ja, jb = a.to_json_obj(), b.to_json_obj()
    for j, t in ((ja, a), (jb, b)):
        j.pop("created", None)
        if t.origin == "simulation":  # no sources of its own: each file names itself
            j.pop("sources", None)
    assert ja == jb


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    d = tmp_path_factory.mktemp("binary")
    made = {}
    for name, args in {
        "logs": ["--log", LOGS],
        "histogram": ["--log", LOGS, "--histogram-only"],
        "dp": ["--simulate", "--workload", "mi355x-multimodal-pr", "--dp-size", "4", "--enable-dp-attention", "--tp-size", "4"],
    }.items():
        for ext in ("json", "npz"):
            r = cli(["trace", *args, "-o", d / f"{name}.{ext}", "-q"])
            assert r.code == 0, r.err
        made[name] = d
    return d


@pytest.mark.parametrize("name", ["logs", "histogram", "dp"])
def test_reads_back_as_the_json_form(traces, name):
    _same(load_trace(str(traces / f"{name}.json")), load_trace(str(traces / f"{name}.npz")))


def test_columns_are_narrowed_and_smaller_than_json(traces):
    with zipfile.ZipFile(traces / "logs.npz") as zf:
        names = zf.namelist()
        assert names[0] == "document.npy" and "batches.forward_tokens.npy" in names
        header = zf.open("batches.graph.npy").read(128)
        assert b"|i1" in header  # -1/0/1 flags stored one byte each
    assert (traces / "logs.npz").stat().st_size < (traces / "logs.json").stat().st_size
    # the same trace gives the same bytes (no clock in the archive)
    t = load_trace(str(traces / "logs.npz"))
    a, b = traces / "again1.npz", traces / "again2.npz"
    save_trace(t, str(a)), save_trace(t, str(b))
    assert a.read_bytes() == b.read_bytes()


def test_commands_read_it(traces, tmp_path):
    for ext in ("json", "npz"):
        r = cli(["suggest-buckets", traces / f"logs.{ext}", "--group", "4", "--json"])
        assert r.code == 0, r.err
    j = json.loads(cli(["suggest-buckets", traces / "logs.json", "--group", "4", "--json"]).out)
    n = json.loads(cli(["suggest-buckets", traces / "logs.npz", "--group", "4", "--json"]).out)
    assert j["recommended"]["buckets"] == n["recommended"]["buckets"]
    r = cli(["trace", "merge", traces / "logs.npz", traces / "logs.json", "-o", tmp_path / "twice.npz", "-q"])
    assert r.code == 2 and "twice" in r.err  # the same logs twice, as with two JSON files
    parts = sorted(f"{LOGS}/{n}" for n in ("02_gke_indented_dp7_tp7.log", "26_doc_hand_wrapped_prefill.log"))
    for i, log in enumerate(parts):
        for ext in ("json", "npz"):
            assert cli(["trace", "--log", log, "-o", tmp_path / f"p{i}.{ext}", "-q"]).code == 0
    for ext in ("json", "npz"):
        r = cli(["trace", "merge", tmp_path / f"p0.{ext}", tmp_path / f"p1.{ext}", "-o", tmp_path / f"m.{ext}", "-q"])
        assert r.code == 0, r.err
    _same(load_trace(str(tmp_path / "m.json")), load_trace(str(tmp_path / "m.npz")))


def _archive(path, members: dict[str, bytes]) -> str:
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return str(path)


def _npy(arr) -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array(buf, np.asarray(arr), allow_pickle=True)
    return buf.getvalue()


def _members(traces) -> dict[str, bytes]:
    with zipfile.ZipFile(traces / "logs.npz") as zf:
        return {n: zf.read(n) for n in zf.namelist()}


@pytest.mark.parametrize(
    "change, says",
    [
        (lambda m: m.pop("document.npy"), "no document.npy"),
        (lambda m: m.update({"document.npy": b"not numpy"}), "document.npy: not a numpy array"),
        (lambda m: m.update({"document.npy": _npy(np.zeros(3))}), "document.npy: must hold bytes"),
        (lambda m: m.update({"document.npy": _npy(np.frombuffer(b"{}", np.uint8))}), "format_version"),
        (lambda m: m.update({"batches.forward_tokens.npy": _npy(np.array([1, 2]))}), "has 2 rows"),
        (
            lambda m: m.update({"batches.line.npy": _npy(np.array([{"a": 1}] * 73, dtype=object))}),
            "one-dimensional array of numbers",
        ),
        (lambda m: m.update({"batches.line.npy": _npy(np.ones((73, 2), np.int64))}), "one-dimensional"),
        (lambda m: m.update({"batches.graph.npy": _npy(np.full(73, 7, np.int8))}), "batches.graph[0]: must be within -1..1"),
        (lambda m: m.update({"batches.line.npy": _npy(np.full(73, 1.5))}), "holds floats"),
        (lambda m: m.update({"batches.timestamp.npy": _npy(np.full(73, np.inf))}), "must be finite"),
        (
            lambda m: m.update({"batches.forward_tokens.npy": _npy(np.zeros(73, np.int64))}),
            "forward_tokens[0]: must be within 1..",
        ),
        (
            lambda m: m.update({"batches.forward_tokens.npy": _npy(np.full(73, 5, np.int64))}),
            "does not give the document's histogram",
        ),
        (lambda m: m.update({"batches.line.npy": _npy(np.ones(73, np.complex64))}), "not integers or floats"),
        (
            lambda m: m.update({"batches.forward_tokens.npy": _npy(np.zeros(73, np.uint16))}),
            "forward_tokens[0]: must be within 1..",
        ),
        (lambda m: m.update({"batches.line.npy": _npy(np.full(73, 2**63, np.uint64))}), "batches.line[0]: must be within"),
        (lambda m: m.update({"batches.group.npy": _npy(np.full(73, 9, np.int32))}), "batches.group: must be within 0..4"),
    ],
)
def test_a_damaged_archive_is_one_line(traces, tmp_path, change, says):
    m = _members(traces)
    change(m)
    p = _archive(tmp_path / "bad.npz", m)
    r = cli(["suggest-buckets", p])
    _one_line(r, says)


def test_a_claimed_size_beyond_the_limit_is_not_read(traces, tmp_path, monkeypatch):
    # the header claims 10^12 rows: refused from the header, before any allocation
    m = _members(traces)
    big = io.BytesIO()
    np.lib.format.write_array_header_2_0(big, {"descr": "<i8", "fortran_order": False, "shape": (10**12,)})
    assert big.getvalue().startswith(b"\x93NUMPY\x02\x00")
    m["batches.line.npy"] = big.getvalue()
    p = _archive(tmp_path / "claims.npz", m)
    with pytest.raises(InputError, match="has 1,000,000,000,000 rows, the histogram counts 73 batches"):
        load_trace(p)
    monkeypatch.setattr(trace_file, "MAX_BINARY_COLUMN_BYTES", 100)
    with pytest.raises(InputError, match="more than a trace may hold"):
        load_trace(str(traces / "logs.npz"))


def test_truncated_and_not_an_archive(traces, tmp_path):
    data = (traces / "logs.npz").read_bytes()
    cut = tmp_path / "cut.npz"
    cut.write_bytes(data[: len(data) // 2])
    _one_line(cli(["suggest-buckets", cut]), "cut.npz")
    fake = tmp_path / "fake.npz"
    fake.write_bytes(b"PK\x03\x04" + b"\x00" * 100)
    r = cli(["suggest-buckets", fake])
    _one_line(r, "not a binary trace")
    # a text trace named .npz is read as what it holds
    text = tmp_path / "sizes.npz"
    text.write_text("100\n200\n")
    assert cli(["suggest-buckets", text]).code == 0


def test_a_failed_write_leaves_the_old_file(traces, tmp_path, monkeypatch):
    out = tmp_path / "keep.npz"
    out.write_bytes(b"old")
    t = load_trace(str(traces / "logs.npz"))

    def boom(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(np.lib.format, "write_array", boom)
    with pytest.raises(KeyboardInterrupt):
        save_trace(t, str(out))
    assert out.read_bytes() == b"old" and sorted(p.name for p in tmp_path.iterdir()) == ["keep.npz"]


def test_read_from_a_pipe(traces):
    import os
    import subprocess
    import sys

    env = dict(os.environ, PYTHONPATH=os.getcwd())
    cmd = [sys.executable, "-m", "bcgtune", "suggest-buckets", "-", "--group", "4", "--json"]
    piped = subprocess.run(cmd, input=(traces / "logs.npz").read_bytes(), capture_output=True, env=env, timeout=600)
    assert piped.returncode == 0, piped.stderr[-2000:]
    direct = json.loads(cli(["suggest-buckets", traces / "logs.npz", "--group", "4", "--json"]).out)
    assert json.loads(piped.stdout)["recommended"]["buckets"] == direct["recommended"]["buckets"]
