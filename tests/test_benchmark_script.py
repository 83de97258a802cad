"""The GPU benchmark pipeline (calibrate a grid -> suggest-buckets --objective time ->
gpu_replay four ways) runs end to end on CPU with the tiny model, so a change that breaks
the recorded device command fails here first. Timings on CPU mean nothing; only the plumbing
is checked."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[1]


def test_h200_script_runs_on_cpu_with_tiny_model(tmp_path):
    trace = tmp_path / "t.csv"
    trace.write_text("size,count\n20,3\n40,2\n70,5\n90,1\n")
    out = tmp_path / "out"
    env = dict(os.environ, OUT=str(out), TRACE=str(trace), MODEL="tiny", GRID="16", CAL_REPEATS="1", CAL_WARMUP="0",
               REPEATS="1", MAX_BS="128", PREV="", EXTRA="mine=32,96",
               PATH=str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", ""))
    p = subprocess.run(["bash", "benchmarks/h200_default_workload.sh"], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    cal = json.loads((out / "cal_grid_tiny.json").read_text())
    assert cal["meta"]["bucket_grid"] == 16
    rep = json.loads((out / "gpu_replay_tiny.json").read_text())
    assert set(rep["results"]) == {"eager", "ladder", "tuned", "oracle", "mine"}
    tokens = {r["tokens"] for r in cal["rows"]}
    assert set(rep["tuned_buckets"]) <= tokens  # picked among the measured grid
    assert rep["results"]["mine"]["graphs"] == 2
    assert not (out / "gpu_replay_tiny.json.partial").exists()
