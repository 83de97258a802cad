"""`trace --simulate --calibration`: measured prefill times drive the simulated clock."""

import json
import subprocess
import sys

from typer.testing import CliRunner

from bcgtune.cli.app import app

runner = CliRunner()


def _levels(tmp_path, cal_rows):
    args = ["trace", "--simulate", "--num-prompts", "40", "--max-concurrency", "8", "--random-input-len", "2048", "--random-output-len", "2",
            "-o", str(tmp_path / "t.json")]
    if cal_rows:
        cal = tmp_path / "cal.csv"
        cal.write_text("tokens,eager_ms,graph_ms\n" + "".join(f"{t},{e},{g}\n" for t, e, g in cal_rows))
        args += ["--calibration", str(cal)]
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
    p = subprocess.run([sys.executable, "-m", "bcgtune", "trace", "--simulate", "--calibration", str(bad)],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2
    assert p.stderr.startswith("error: ") and len(p.stderr.strip().splitlines()) == 1 and "cal.csv" in p.stderr
