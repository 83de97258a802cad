"""The simulated device (bcgtune/engines/sim): no torch, a clock of simulated seconds, the
same draws for the same seed, an exact truth that the calls agree with when no noise is
drawn, the noise profile the fit script computes, and the flags it takes refused when wrong."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from cli_helpers import assert_one_line_error, cli

from bcgtune.engines.sim.device import SimDevice
from bcgtune.engines.sim.engine import SimEngine, load_recording
from bcgtune.engines.sim.noise import FITTED, NoiseProfile
from bcgtune.engines.sim.truth import SimTruth

ROOT = Path(__file__).resolve().parents[1]
CAL_8B = str(ROOT / "benchmarks/results/cal_breakable_onephase_grid128_qwen3-8b_h200.json")
CAL_06B = str(ROOT / "benchmarks/results/cal_breakable_interleaved_grid64_qwen3-0.6b_h200.json")
TRACE = str(ROOT / "benchmarks/data/default_workload.json")
QUIET = NoiseProfile(
    rough_sd=0.02, level_sd=0.0, drift_sd=0.0, host_sd=0.0, capture_sd=0.0, graph_sd=0.0, eager_sd=0.0, call_sd_scale=0.0
)


def test_a_calibration_on_the_simulated_device_loads_no_torch():
    code = f"""
import sys
from bcgtune.engines.spec import EngineSpec
from bcgtune.services import calibrate
spec = EngineSpec(model="qwen3-8b", device="sim", sim_calibration={CAL_8B!r}, chunked_prefill_size=8192)
plan = calibrate.calibration_sizes(None, 8192, 512, {TRACE!r}, mix_every=16)
res = calibrate.calibrate(plan, spec, warmup=1, repeats=3, memory=True, model_check=True, check_batches=30)
assert "torch" not in sys.modules, "torch was imported"
print(len(res.calibration.tokens), res.calibration.rounds, res.calibration.model_check is not None)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    sizes, rounds, checked = out.stdout.split()
    assert int(sizes) > 5 and rounds == "3" and checked == "True"


def _engine(profile: NoiseProfile, seed: int = 0) -> SimEngine:
    rec = load_recording(CAL_8B)
    dev = SimDevice(SimTruth(rec.calibration, profile, seed), profile, seed)
    return SimEngine(dev, "breakable", 8192, 2, dict(rec.model))


def test_without_noise_a_call_takes_its_truth_and_the_clock_counts_it():
    eng = _engine(QUIET)
    t = eng.truth
    t0 = eng.device.now_ms()
    eng.capture([512, 2048])
    assert eng.device.now_ms() > t0  # a capture costs device time
    c0 = eng.device.now_ms()
    ms = eng.charge_replay(1500, 2, 2048)
    assert ms == pytest.approx(float(t.graph_ms(2048) + t.breaks_ms(1500, 2)))
    assert eng.device.now_ms() - c0 == pytest.approx(ms)
    assert eng.charge_eager(300, 1) == pytest.approx(float(t.eager_ms(300, 1)))
    tok = np.array([300, 1500, 500, 9000])
    req = np.array([1, 2, 1, 1])
    per = t.batch_ms(tok, req, [512, 2048])
    assert per[3] == pytest.approx(float(t.eager_ms(9000, 1)))  # no bucket within 2x: eager
    assert t.total_ms(tok, req, [512, 2048]) == pytest.approx(float(per.sum()))


def test_the_truth_departs_from_the_recording_by_its_roughness_and_the_seed_sets_the_world():
    rec = load_recording(CAL_8B)
    a, b = SimTruth(rec.calibration, FITTED, 1), SimTruth(rec.calibration, FITTED, 2)
    sizes = np.arange(200, 8000, 37)
    base = rec.calibration.graph_time(sizes)
    rel = a.graph_ms(sizes) / base - 1
    assert 0.005 < float(np.std(rel)) < 0.05
    assert np.array_equal(a.graph_ms(sizes), SimTruth(rec.calibration, FITTED, 1).graph_ms(sizes))
    assert not np.array_equal(a.graph_ms(sizes), b.graph_ms(sizes))


def test_the_same_seed_draws_the_same_times():
    e1, e2 = _engine(FITTED, 7), _engine(FITTED, 7)
    for e in (e1, e2):
        e.capture([1024])
    assert [e1.charge_segments(1024) for _ in range(5)] == [e2.charge_segments(1024) for _ in range(5)]
    e3 = _engine(FITTED, 8)
    e3.capture([1024])
    assert e3.charge_segments(1024) != e1.charge_segments(1024)


def test_a_launch_bound_eager_forward_moves_with_the_host_and_a_compute_bound_one_does_not():
    rec = load_recording(CAL_06B)
    t = SimTruth(rec.calibration, FITTED, 0)
    small, big = 128, 8000
    assert t.eager_at_host(small, 1, 1.3) > t.eager_at_host(small, 1, 1.0) * 1.1
    assert t.eager_at_host(big, 1, 1.3) == pytest.approx(t.eager_at_host(big, 1, 1.0))
    assert t.eager_at_host(small, 1, 1.0) == pytest.approx(float(t.eager_ms(small, 1)))


def test_the_noise_profile_is_the_fit_scripts_output():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from fit_sim_noise import fit

    got = fit()
    for key, value in got.items():
        assert getattr(FITTED, key) == pytest.approx(value), key


@pytest.mark.parametrize(
    "args, flag",
    [
        (["--device", "sim"], "--sim-calibration"),
        (["--sim-calibration", CAL_8B, "--device", "cpu"], "--sim-calibration"),
        (["--device", "sim", "--sim-calibration", "/nonexistent/cal.json"], "cal.json"),
        (["--device", "sim", "--sim-calibration", CAL_8B, "--model", "qwen3-0.6b"], "qwen3-0.6b"),
        (["--device", "sim", "--sim-calibration", CAL_8B, "--model", "qwen3-8b", "--runner", "full"], "--runner full"),
        (["--device", "sim", "--sim-calibration", TRACE, "--model", "qwen3-8b"], "default_workload.json"),
    ],
)
def test_wrong_simulated_device_flags_are_one_line_errors(args, flag, tmp_path):
    r = cli(
        [
            "calibrate",
            "--sizes",
            "256,512",
            "-o",
            tmp_path / "c.json",
            *(["--model", "qwen3-8b"] if "--model" not in args else []),
            *args,
        ]
    )
    assert r.code == 2
    assert_one_line_error(r)
    assert flag in r.err
    assert not (tmp_path / "c.json").exists()


def test_calibrate_through_the_command_line_on_the_simulated_device(tmp_path):
    out = tmp_path / "c.json"
    r = cli(["calibrate", "--sizes", "256,512,1024", "--model", "qwen3-8b", "--device", "sim", "--sim-calibration", CAL_8B,
             "--repeats", "3", "-o", out, "--json"])  # fmt: skip
    assert r.code == 0, r.err[-2000:]
    doc = json.loads(out.read_text())
    assert doc["meta"]["gpu"]["gpu_name"] == "simulated NVIDIA H200" and doc["rounds"] == 3
    assert doc["engine_options"]["sim_calibration"] == CAL_8B
    assert dataclasses.asdict(NoiseProfile()).keys() == FITTED.to_json().keys()
