"""The shapes a TP-N MoE server runs, end to end on the CPU: the tiny MoE and a TP-2 rank of
the tiny model (and of the tiny MoE, from a profile's launch) through capture, validate,
calibrate and tune, as a user types the commands."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from cli_helpers import cli

from bcgtune.core.trace.prefill_trace import PrefillTrace
from bcgtune.files.trace_file import save_trace

pytest.importorskip("torch")
DATA = Path(__file__).parent / "data" / "models"


@pytest.fixture(scope="module")
def trace(tmp_path_factory) -> str:
    rng = np.random.default_rng(11)
    tok = np.clip(np.round(rng.lognormal(np.log(60), 0.5, 14)), 8, 150).astype(int)
    req = np.minimum(rng.integers(1, 3, tok.size), tok)
    path = tmp_path_factory.mktemp("trace") / "trace.json"
    save_trace(PrefillTrace.from_batches({"forward_tokens": tok, "new_seq": req}, origin="simulation"), str(path))
    return str(path)


SHAPES = {
    "tiny MoE": ["--model", "tiny-moe"],
    "TP-2 rank of tiny": ["--model", "tiny", "--tp", "2"],
}


@pytest.mark.parametrize("shape", list(SHAPES))
def test_capture_validate_calibrate(shape, trace, tmp_path):
    engine = [*SHAPES[shape], "--device", "cpu"]
    cap = cli(["capture", "--buckets", "32,64,128", *engine, "--json"])
    assert cap.code == 0, cap.err
    assert json.loads(cap.out)["graphs"] == 3
    val = cli(["validate", "--buckets", "32,64,128", *engine, "--sizes-per-bucket", "2", "--json"])
    assert val.code == 0, val.err
    rep = json.loads(val.out)
    assert rep["ok"] and rep["batches_checked"] > 0
    cal = tmp_path / "cal.json"
    r = cli(["calibrate", *engine, "--sizes-from", trace, "--grid", "32", "--repeats", "2", "-o", str(cal)])
    assert r.code == 0, r.err
    meta = json.loads(cal.read_text())["meta"]
    assert meta["shape"]["tp"] == (2 if "--tp" in engine else 1)
    assert (meta["shape"]["moe"] is not None) == ("tiny-moe" in engine)
    assert "modelled" in meta["engine"]["tensor_parallel"] or "TP 1" in meta["engine"]["tensor_parallel"]


@pytest.mark.parametrize("shape", list(SHAPES))
def test_tune(shape, trace, tmp_path):
    state = tmp_path / "state"
    r = cli(["tune", trace, *SHAPES[shape], "--device", "cpu", "--state-dir", str(state), "--measure-rounds", "1", "--json"])
    assert r.code == 0, r.err[-3000:]
    out = json.loads(r.out)
    assert out["steps"]["validate"]["ok"] and out["steps"]["proof"]["lists"]["SGLang ladder"]["measured"]
    engine = out["engine"]
    assert engine["parallel"]["tp"] == (2 if "--tp" in SHAPES[shape] else 1)
    assert engine["routing"] == "skewed" and engine["model"]["name"] in ("tiny", "tiny-moe")


def test_tune_prices_a_profiles_launch_with_its_tp_and_model(trace, tmp_path):
    """A profile whose model is a config.json bcgtune builds and whose launch runs TP 2: tune
    measures that rank without --model or --tp, and its [tuned] record states the shape."""
    prof = tmp_path / "moe.toml"
    prof.write_text(
        "[profile]\n"
        'name = "moe"\nplatform = "cuda"\n'
        f'model = "{DATA / "qwen3-moe-tiny" / "config.json"}"\n'
        "[server]\ntp-size = 2\n"
    )
    out = tmp_path / "tuned.toml"
    # the list is given: on a CPU the optimizer may rightly find that no graph pays, and then
    # nothing is written; what this checks is the shape the tune measured and recorded
    args = ["tune", trace, "--profile", str(prof), "--device", "cpu", "--state-dir", str(tmp_path / "s")]
    args += ["--measure-rounds", "1", "--list", "64,160"]
    # SGLang is not asked in the tests: the launch is written unchecked, as the file then records
    r = cli([*args, "--write-profile", str(out), "--unchecked", "--json"])
    assert r.code == 0, r.err[-3000:]
    engine = json.loads(r.out)["engine"]
    assert engine["parallel"]["tp"] == 2 and engine["model"]["kind"] == "config"
    tuned = out.read_text()
    assert 'model = "qwen3-moe-tiny"' in tuned and "tp_size = 2" in tuned
    r = cli(["doctor", "-p", str(out), "--no-sglang-probe", "--json"])  # the record agrees with the launch
    codes = [f["code"] for f in json.loads(r.out)["findings"]]
    assert "tuned" in codes and "tuned-shape" not in codes
    out.write_text(tuned.replace("tp-size = 2", "tp-size = 4"))
    r = cli(["doctor", "-p", str(out), "--no-sglang-probe", "--json"])
    shape = [f["message"] for f in json.loads(r.out)["findings"] if f["code"] == "tuned-shape"]
    assert shape and "the launch runs TP 4" in shape[0]


def test_the_h200_moe_tp_script_runs_on_cpu_with_tiny_models(trace, tmp_path):
    """benchmarks/h200_moe_tp.sh (the H200 run) on the tiny MoE and tiny dense models: both
    tunes, the dense calibration and the curves' plot (its data as CSV)."""
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    out = tmp_path / "out"
    env = dict(
        os.environ,
        OUT=str(out),
        TRACE=trace,
        MODEL_MOE="tiny-moe",
        MODEL_DENSE="tiny",
        GRID="32",
        MIX_EVERY="1",
        CAL_REPEATS="2",
        CAL_WARMUP="0",
        CHECK="12",
        PROOF="12",
        PROOF_REPEATS="2",
        PASSES="1",
        PATH=str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", ""),
    )
    p = subprocess.run(["bash", "benchmarks/h200_moe_tp.sh"], cwd=root, env=env, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    tp4 = json.loads((out / "tune_moe_tp4.json").read_text())
    assert tp4["engine"]["parallel"]["tp"] == 4 and tp4["engine"]["parallel"]["all_reduce"] == "modelled"
    assert "recommended - ladder: predicted" in (out / "tune_moe_tp1.txt").read_text()
    rows = (out / "curves_moe_tp.csv").read_text().splitlines()
    labels = {r.split(",")[0] for r in rows[1:]}
    assert labels == {"dense", "moe-tp1", "moe-tp4-rank"}
    assert (out / "curves_moe_tp.png").stat().st_size > 1000
    assert "moe_tp: " in p.stdout
    # the part for a host with 2 GPUs: real all-reduces (gloo here) beside modelled ones
    env.update(PARTS="tp2", AR_DEVICE="cpu", HIDDEN="64")
    p = subprocess.run(["bash", "benchmarks/h200_moe_tp.sh"], cwd=root, env=env, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    labels = {r.split(",")[0] for r in (out / "curves_tp2.csv").read_text().splitlines()[1:]}
    assert labels == {"real", "measured-curve", "stated-curve"}
    real = json.loads((out / "cal_tp2_real.json").read_text())["meta"]["engine"]["tensor_parallel"]
    assert "measured across 2 processes (gloo)" in real
