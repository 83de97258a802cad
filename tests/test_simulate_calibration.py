"""`trace --simulate --calibration`: measured prefill times drive the simulated clock."""

import json
import subprocess
import sys

import numpy as np
from cli_helpers import HANG_S
from typer.testing import CliRunner

from bcgtune.adapters.bench_serving.simulator import simulate
from bcgtune.cli.app import app
from bcgtune.files.calibration_file import load_calibration
from bcgtune.files.workload_file import workload_from_options

runner = CliRunner()
OPTIONS = {"num_prompts": "40", "max_concurrency": "8", "random_input_len": 2048, "random_output_len": 2}


def _write_cal(tmp_path, rows, name="cal.csv"):
    cal = tmp_path / name
    cal.write_text("tokens,eager_ms,graph_ms\n" + "".join(f"{t},{e},{g}\n" for t, e, g in rows))
    return cal


def test_calibrated_step_model_uses_the_measured_times(tmp_path):
    cal = load_calibration(str(_write_cal(tmp_path, [(64, 100.0, 100.0), (8192, 2000.0, 2000.0)])))
    w = workload_from_options(**OPTIONS)
    step = w.step.calibrated(cal)
    sizes = np.array([64, 4128, 8192])
    assert step.prefill_ms(sizes).tolist() == cal.eager_time(sizes).tolist() == [100.0, 1050.0, 2000.0]
    slow, fast = simulate(w, step), simulate(w)
    assert slow.meta["levels"][0]["duration_s"] > 5 * fast.meta["levels"][0]["duration_s"]
    assert slow.meta["workload"]["step"]["prefill_curve"] == "calibrated_eager_ms"
    assert slow.batches["new_token"].sum() == fast.batches["new_token"].sum()


def _levels(tmp_path, cal_rows):
    args = [
        "trace",
        "--simulate",
        "--num-prompts",
        "40",
        "--max-concurrency",
        "8",
        "--random-input-len",
        "2048",
        "--random-output-len",
        "2",
        "-o",
        str(tmp_path / "t.json"),
    ]
    if cal_rows:
        args += ["--calibration", str(_write_cal(tmp_path, cal_rows))]
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output
    meta = json.loads((tmp_path / "t.json").read_text())["meta"]
    return meta


def test_calibration_replaces_the_prefill_step_model(tmp_path):
    fast = _levels(tmp_path, [(64, 1.0, 1.0), (8192, 2.0, 2.0)])
    slow = _levels(tmp_path, [(64, 100.0, 100.0), (8192, 2000.0, 2000.0)])
    assert slow["levels"][0]["duration_s"] > 5 * fast["levels"][0]["duration_s"]
    assert slow["workload"]["step"]["prefill_curve"] == "calibrated_eager_ms"


def test_bad_calibration_is_one_line_error(tmp_path):
    bad = tmp_path / "cal.csv"
    bad.write_text("tokens,eager\n1,2\n")
    p = subprocess.run(
        [sys.executable, "-m", "bcgtune", "trace", "--simulate", "--calibration", str(bad)],
        capture_output=True,
        text=True,
        timeout=HANG_S,
        check=False,
    )
    assert p.returncode == 2
    assert p.stderr.startswith("error: ") and len(p.stderr.strip().splitlines()) == 1 and "cal.csv" in p.stderr
