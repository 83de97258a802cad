"""`bcgtune tune`'s budget on the simulated device (an H200 calibration of the Qwen3-8B
shape): the plan is printed first, the default tune spends at most its budget in simulated
device seconds, each step within 25% of the prediction made before it ran, and options the
user gives are kept with a note when they alone exceed the budget."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_helpers import assert_one_line_error, cli

ROOT = Path(__file__).resolve().parents[1]
CAL_8B = str(ROOT / "benchmarks/results/cal_breakable_onephase_grid128_qwen3-8b_h200.json")
CAL_06B = str(ROOT / "benchmarks/results/cal_breakable_interleaved_grid64_qwen3-0.6b_h200.json")
TRACE = str(ROOT / "benchmarks/data/default_workload.json")
SIM_8B = ["--model", "qwen3-8b", "--device", "sim", "--sim-calibration", CAL_8B, "--chunked-prefill-size", "8192"]


def _within(steps: dict) -> list[str]:
    """The steps whose spent device seconds are more than 25% off their prediction."""
    out = []
    for name, st in steps.items():
        p, s = st.get("predicted_s"), st.get("spent_s")
        if p is not None and p > 1.0 and abs(s / p - 1.0) > 0.25:
            out.append(f"{name}: predicted {p:.1f} s, spent {s:.1f} s")
    return out


def test_the_default_tune_fits_its_budget_and_prints_its_plan_first(tmp_path):
    pytest.importorskip("torch")  # validate's numerics on the CPU stand-in
    r = cli(["tune", TRACE, *SIM_8B, "--state-dir", tmp_path / "s", "--json"])
    assert r.code == 0, r.err[-3000:]
    first = r.err.splitlines()[:6]
    assert first[0].startswith("[plan] started") and any("plan for a budget of 600 s" in ln for ln in first), first
    doc = json.loads(r.out)
    b = doc["budget"]
    assert b["limit_s"] == 600.0 and b["clock"] == "simulated" and 0 < b["spent_s"] <= 600.0
    assert b["predicted_s"] <= 600.0
    assert not _within(doc["steps"]), _within(doc["steps"])
    assert doc["steps"]["validate"]["ok"] is True
    assert set(doc["plan"]) >= {"grid", "mix_every", "repeats", "check_batches", "proof_batches", "predicted"}


@pytest.mark.parametrize("seed", [11, 12, 13])
def test_each_step_within_a_quarter_of_its_prediction(seed, tmp_path):
    from bcgtune.engines.spec import EngineSpec
    from bcgtune.services import tune

    spec = EngineSpec(model="qwen3-8b", device="sim", sim_calibration=CAL_8B, chunked_prefill_size=8192, seed=seed)
    res = tune.tune(tune.TuneRequest(trace=TRACE, spec=spec, state_dir=str(tmp_path), validate=False))
    assert res.budget["spent_s"] <= 600.0
    assert not _within(res.steps), _within(res.steps)
    assert res.steps["validate"]["ok"] is None and "not run" in res.steps["validate"]["note"]


def test_options_given_are_kept_with_a_note_when_they_exceed_the_budget(tmp_path):
    r = cli(
        ["tune", TRACE, "--model", "qwen3-0.6b", "--device", "sim", "--sim-calibration", CAL_06B, "--chunked-prefill-size",
         "8192", "--state-dir", tmp_path / "s", "--repeats", "40", "--grid", "64", "--budget", "60", "--json"]
    )  # fmt: skip
    assert r.code == 0, r.err[-3000:]
    doc = json.loads(r.out)
    assert doc["plan"]["repeats"] == 40 and doc["plan"]["grid"] == 64 and set(doc["plan"]["given"]) >= {"grid", "repeats"}
    assert any("--grid" in n and "--repeats" in n and "beyond the budget of 60 s" in n for n in doc["budget"]["notes"])
    assert "note: the options given" in r.err


@pytest.mark.parametrize("value", ["0", "-5", "nan", "inf", "1e400", "ten"])
def test_a_budget_that_is_not_a_number_of_seconds_is_refused(value, tmp_path):
    r = cli(["tune", TRACE, *SIM_8B, "--state-dir", tmp_path / "s", "--budget", value])
    assert r.code == 2 and "--budget" in r.err, r.err[-1000:]
    assert_one_line_error(r)
    assert not (tmp_path / "s").exists()
