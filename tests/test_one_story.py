"""One story across commands: for traces from the simulator and from server logs (plain and
DP attention), suggest-buckets (command line and Python API), a profile it writes, drift on
that profile, the API's drift, and doctor tell the same story about the same list and the
same traffic, and every hint a command prints runs as printed."""

from __future__ import annotations

import json
import re
import shlex
import tomllib
from pathlib import Path

import pytest
from cli_helpers import cli

import bcgtune

DATA = Path(__file__).resolve().parent / "data"
SIMULATE = ["--dataset-name", "random", "--num-prompts", "120", "--random-input-len", "1500"]
SIMULATE += ["--random-output-len", "30", "--max-concurrency", "24", "--chunked-prefill-size", "4096"]
SOURCES = {
    "simulation": ["trace", "--simulate", *SIMULATE],
    "simulation, DP attention": ["trace", "--simulate", *SIMULATE, "--dp-size", "4", "--enable-dp-attention"],
    "server log": ["trace", "--log", str(DATA / "sglang-logs" / "24_newest_decode_graph_end_startup_and_load.log")],
    "server log, DP attention": ["trace", "--log", str(DATA / "logs" / "e7_dp_attention_two_ranks.log")],
}
K = "6"


@pytest.fixture(scope="module", params=list(SOURCES))
def traced(request, tmp_path_factory):
    path = tmp_path_factory.mktemp("story") / "t.json"
    r = cli([*SOURCES[request.param], "-o", str(path), "-q"])
    assert r.code == 0, r.err
    return request.param, path


def _json(r) -> dict:
    assert r.code in (0, 1), r.err
    return json.loads(r.out)


def _hints(text: str) -> list[list[str]]:
    """Command lines a note asks the user to run or to add: `give FLAGS to ...` and
    `bcgtune ...` commands in backquotes or on a line of their own."""
    out = []
    for m in re.finditer(r"give ((?:--[\w-]+(?: [\w.:/-]+)?\s?)+?) to ", text):
        out.append(["+", *shlex.split(m.group(1))])
    commands = "trace|suggest-buckets|drift|capture|validate|calibrate|serve|doctor|bench"
    for m in re.finditer(rf"(?:^|`)\s*(bcgtune (?:{commands})\b[^`\n]*)", text, flags=re.M):
        out.append(shlex.split(m.group(1)))
    return out


def test_suggest_api_profile_drift_and_doctor_agree(traced, tmp_path):
    _, traced = traced
    # the command line and the API make the same decisions
    cli_plan = _json(cli(["suggest-buckets", str(traced), "-k", K, "--json"]))
    trace = bcgtune.load_trace(str(traced))
    api_plan = bcgtune.suggest_buckets(trace, max_buckets=int(K))
    listed = cli_plan["recommended"]["buckets"]
    assert api_plan.recommended.buckets == listed
    assert (api_plan.dp_attention is None) == (cli_plan["dp_attention"] is None)

    # the API's drift on that list and traffic: nothing to re-tune, the same optimum
    report = bcgtune.drift(trace, listed)
    assert report.verdict == "keep", report.reason
    assert report.optimum.metrics.buckets == listed == report.deployed.metrics.buckets

    # a profile written with the list launches what was priced: drift on it agrees
    prof = tmp_path / "p.toml"
    write = ["--write-profile", str(prof), "--base-profile", "h200", "--json", "--unchecked"]
    args = ["suggest-buckets", str(traced), "-k", K, *write]
    written = cli(args)
    if written.code == 2:  # the trace's batches outgrow the profile's chunk: the error says what to give
        m = re.search(r"give --chunked-prefill-size (\d+) to", written.err)
        assert m, written.err
        assert not prof.exists()  # nothing half-written
        written = cli([*args, "--chunked-prefill-size", m.group(1)])
        assert tomllib.loads(prof.read_text())["server"]["chunked-prefill-size"] == int(m.group(1))
    written_list = _json(written)["recommended"]["buckets"]
    assert tomllib.loads(prof.read_text())["buckets"]["list"] == written_list
    r = cli(["drift", "--profile", str(prof), "--trace", str(traced), "--json"])
    assert r.code == 0, r.out + r.err
    rep = json.loads(r.out)
    assert rep["verdict"] == "keep"
    assert rep["deployed"]["metrics"]["buckets"] == written_list == rep["optimum"]["metrics"]["buckets"]

    # doctor has no traffic: it judges no list against traffic it has not seen
    d = cli(["doctor", "--profile", str(prof), "--no-sglang-probe", "--json"])
    findings = json.loads(d.out)["findings"]
    for f in findings:
        if f["code"].startswith("bucket"):
            assert f["severity"] == "info", f
            assert "drift --profile" in f["message"]


def test_every_hint_runs_as_printed(traced, tmp_path):
    source, traced = traced
    runs = [
        ["suggest-buckets", str(traced), "-k", K],
        ["suggest-buckets", str(traced), "-k", K, "--tp", "2"],  # a layout the trace may contradict
        ["drift", "--trace", str(traced), "--profile", "h200"],
    ]
    seen = 0
    for args in runs:
        r = cli(args)
        # a trace from servers with a larger chunk than the profile's is refused, with what to set
        mismatch = args[0] == "drift" and r.code == 2 and "chunked-prefill-size = " in r.err
        assert r.code in (0, 1) or mismatch, (args, r.err)
        for hint in _hints(r.out + "\n" + r.err):
            if hint[0] == "+":  # flags to add to the same command
                again = cli([*args[:2], *hint[1:]] if args[0] == "suggest-buckets" else [*args, *hint[1:]])
            elif hint[:2] == ["bcgtune", "calibrate"]:
                continue  # needs torch and minutes; its options are checked by its own tests
            else:
                words = [str(traced) if w in ("TRACE", "T", "trace.json") else w for w in hint[1:]]
                words = ["h200" if w == "P" else w for w in words]
                again = cli(words)
            assert again.code in (0, 1), (args, hint, again.err)
            assert "error:" not in again.err, (args, hint, again.err)
            seen += 1
    if "DP attention" in source:  # priced per batch with --tp 2: the hint gives the trace's layout
        assert seen >= 1


def test_layout_flags_given_with_a_written_profile_are_written_into_it(tmp_path):
    """A list priced for a layout the profile does not launch would be judged wrong by drift
    on that profile: the layout flags given are written into the profile with the list."""
    traced = tmp_path / "t.json"
    assert cli([*SOURCES["simulation, DP attention"], "-o", str(traced), "-q"]).code == 0
    prof = tmp_path / "p.toml"
    layout = ["--tp", "4", "--dp", "4", "--dp-attention"]
    write = ["--write-profile", str(prof), "--base-profile", "h200", "--json", "--unchecked"]
    r = cli(["suggest-buckets", str(traced), "-k", K, *layout, *write])
    plan = _json(r)
    assert "in place of its own" in r.err and plan["dp_attention"] is not None
    server = tomllib.loads(prof.read_text())["server"]
    assert (server["tp-size"], server["dp-size"], server["enable-dp-attention"]) == (4, 4, True)
    d = cli(["drift", "--profile", str(prof), "--trace", str(traced), "--json"])
    assert d.code == 0, d.out + d.err
    rep = json.loads(d.out)
    assert rep["deployed"]["metrics"]["buckets"] == plan["recommended"]["buckets"] == rep["optimum"]["metrics"]["buckets"]
