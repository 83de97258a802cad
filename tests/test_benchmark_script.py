"""The GPU benchmark pipeline (calibrate on the runner -> suggest-buckets --objective time ->
gpu_replay with predictions) runs end to end on CPU with the tiny model, so a change that
breaks the recorded device command fails here first. Timings on CPU mean nothing; only the
plumbing is checked."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[1]


def _trace(tmp_path) -> Path:
    from bcgtune.core.trace.prefill_trace import PrefillTrace
    from bcgtune.files.trace_file import save_trace

    t = PrefillTrace.from_batches({"forward_tokens": [20, 20, 40, 70, 70, 90], "new_seq": [1, 2, 2, 3, 3, 4]})
    p = tmp_path / "t.json"
    save_trace(t, str(p))
    return p


@pytest.mark.parametrize("runner", ["breakable"])  # the default; the full runner's path is the same script
def test_h200_script_runs_on_cpu_with_tiny_model(tmp_path, runner):
    trace = _trace(tmp_path)
    out = tmp_path / "out"
    env = dict(
        os.environ,
        OUT=str(out),
        TRACE=str(trace),
        MODEL="tiny",
        RUNNER=runner,
        GRID="16",
        CAL_REPEATS="1",
        CAL_WARMUP="0",
        REPEATS="1",
        MAX_BS="128",
        EXTRA="mine=32,96",
        PATH=str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", ""),
    )
    p = subprocess.run(
        ["bash", "benchmarks/h200_default_workload.sh"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    cal = json.loads((out / f"cal_{runner}_tiny.json").read_text())
    assert cal["meta"]["bucket_grid"] == 16 and cal["runner"] == runner
    if runner == "breakable":
        assert cal["batches"]["requests"] == [1, 2, 2, 3, 4]  # the trace's (tokens, requests) mix
    rep = json.loads((out / "gpu_replay_tiny.json").read_text())
    assert rep["runner"] == runner and rep["requests_known"]
    assert set(rep["results"]) == {"eager", "ladder", "tuned", "oracle", "mine"}
    tokens = {r["tokens"] for r in cal["rows"]}
    assert set(rep["tuned_buckets"]) <= tokens  # picked among the measured grid
    assert rep["results"]["mine"]["graphs"] == 2
    assert all("predicted_ms" in r for r in rep["results"].values())
    assert not (out / "gpu_replay_tiny.json.partial").exists()
    # every bucket of every replayed list was measured by the calibration: the ladder's within
    # the trace's range, the extra list and the oracle's sizes (the trace's distinct sizes)
    assert {32, 96, 20, 40, 70, 90} | {b for b in rep["lists"]["ladder"] if 20 <= b <= 128} <= tokens
    assert {24, 40, 70} <= set(cal["meta"]["sizes_added"])  # off the 16-grid: a ladder bucket, oracle sizes


def test_h200_script_aa_mode_runs_on_cpu_with_tiny_model(tmp_path):
    """AA=3: calibrate, suggest, then every list (the optimum, the recommended list, the
    ladder, EXTRA, eager) replayed in three independent passes and checked against its
    predicted interval; the table and the JSON carry each pass's total."""
    trace = _trace(tmp_path)
    out = tmp_path / "out"
    env = dict(
        os.environ,
        OUT=str(out),
        TRACE=str(trace),
        MODEL="tiny",
        GRID="16",
        CAL_REPEATS="3",
        CAL_WARMUP="0",
        REPEATS="2",
        WARMUP="0",
        MAX_BS="128",
        EXTRA="mine=32,96",
        AA="3",
        MEMORY="0",
        PATH=str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", ""),
    )
    p = subprocess.run(
        ["bash", "benchmarks/h200_default_workload.sh"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    cal = json.loads((out / "cal_breakable_tiny.json").read_text())
    assert cal["format_version"] == 4 and cal["rounds"] == 3 and len(cal["rows"][0]["graph_rounds_ms"]) == 3
    plan = json.loads((out / "suggest_tiny.json").read_text())
    rep = json.loads((out / "gpu_replay_aa_tiny.json").read_text())
    assert rep["method"]["passes"] == 3 and rep["bucket_lists"]["tuned"] == plan["optimal"]["buckets"]
    names = set(rep["lists"])
    assert {"ladder", "tuned", "mine", "eager"} <= names and "oracle" not in names
    rec, opt = plan["recommended"]["buckets"], plan["optimal"]["buckets"]
    assert ("recommended" in names) == (rec not in ([], opt))
    # on a loaded CPU the optimum itself can be no graphs: the recommended list is then eager
    assert rep["recommended"] == ("eager" if not rec else "tuned" if rec == opt else "recommended")
    for name, row in rep["lists"].items():
        assert len(row["runs_ms"]) == 3 and row["predicted_half_ms"] is not None and 0 <= row["inside"] <= 3, name
        assert all(len(r) == 2 for r in rep["passes"][name]["round_totals_ms"])
    d = rep["difference"]
    assert d["vs"] == "ladder" and len(d["runs_ms"]) == 3 and d["se_ms"] is not None
    text = (out / "gpu_replay_aa_tiny.txt").read_text()
    assert "predicted s (95%)" in text and "- ladder: predicted" in text and "eager inside its predicted interval" in text
