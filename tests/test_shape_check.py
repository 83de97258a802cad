"""A calibration records the shape it measured; suggest-buckets, drift and doctor warn when a
profile's model or TP differs from it (core/plan/shape_check.py). No torch needed."""

import json
from pathlib import Path

from cli_helpers import cli

from bcgtune.core.plan.shape_check import base_model_name, quantised, shape_notes

DOCS = Path(__file__).parent / "data" / "docs"


def test_model_names_compare_without_organisation_or_packaging():
    assert base_model_name("Qwen/Qwen3-30B-A3B-Instruct-2507-FP8") == "qwen3-30b-a3b"
    assert base_model_name("amd/Qwen3.8-Flash-Next-Quark-MXFP4") == "qwen3.8-flash-next"
    assert base_model_name("/models/Qwen3-8B/") == "qwen3-8b" and base_model_name("qwen3-8b") == "qwen3-8b"
    assert base_model_name("/models/Qwen3-8B/config.json") == "qwen3-8b"
    assert quantised("Qwen/Qwen3.8-Flash-Next-FP8") and not quantised("Qwen/Qwen3-8B")


def _meta(model="qwen3-30b-a3b", stands_for="Qwen/Qwen3-30B-A3B", tp=1, ep=1, experts=128):
    return {"shape": {"model": model, "stands_for": stands_for, "tp": tp, "ep": ep, "moe": {"experts": experts}}}


def test_shape_notes_name_each_difference():
    assert shape_notes(_meta(), "Qwen/Qwen3-30B-A3B", 1, 1) == []
    assert shape_notes(_meta(), None, None) == []  # the launch says nothing
    (note,) = shape_notes(_meta(), "Qwen/Qwen3-30B-A3B-FP8", 1)
    assert "quantised kernels" in note
    notes = shape_notes(_meta(model="qwen3-8b", stands_for="Qwen/Qwen3-8B", experts=None), "Qwen/Qwen3-30B-A3B", 4, 2)
    assert len(notes) == 2 and "another model's time curve" in notes[0] and "TP 1, the launch runs TP 4" in notes[1]
    assert "EP 1, the launch runs EP 2" in shape_notes(_meta(tp=4), "Qwen/Qwen3-30B-A3B", 4, 2)[0]
    assert "records no measured shape" in shape_notes({}, "Qwen/Qwen3-8B", 1)[0]
    assert "records no measured shape" in shape_notes({"shape": {"model": 3}}, "Qwen/Qwen3-8B", 1)[0]  # damaged


def _calibration(tmp_path, **shape):
    doc = json.loads((DOCS / "tiny-cal.json").read_text())
    doc["meta"]["shape"] = _meta(**shape)["shape"]
    path = tmp_path / "cal.json"
    path.write_text(json.dumps(doc))
    return path


def test_drift_and_suggest_buckets_warn_when_the_profile_serves_another_shape(tmp_path):
    cal = _calibration(tmp_path, model="qwen3-8b", stands_for="Qwen/Qwen3-8B", tp=1, experts=None)
    r = cli(["drift", "-p", "mi355x", "--trace", str(DOCS / "small.csv"), "--calibration", str(cal)])
    assert r.code in (0, 1), r.err
    assert "another model's time curve" in r.out and "the launch runs TP 2" in r.out
    r = cli(["drift", "-p", "mi355x", "--trace", str(DOCS / "small.csv"), "--calibration", str(cal), "--json"])
    warnings = json.loads(r.out)["shape_warnings"]
    assert len(warnings) == 2
    r = cli(["suggest-buckets", str(DOCS / "small.csv"), "--objective", "time", "--calibration", str(cal), "--tp", "2"])
    assert r.code == 0, r.err
    assert "warning: the calibration measured one rank of TP 1, the launch runs TP 2" in r.err
    same = _calibration(tmp_path, model="qwen3-8b", stands_for="Qwen/Qwen3-8B", tp=2, experts=None)
    r = cli(["suggest-buckets", str(DOCS / "small.csv"), "--objective", "time", "--calibration", str(same), "--tp", "2"])
    assert r.code == 0 and "warning" not in r.err, r.err


def test_doctor_warns_where_the_calibration_or_tuned_record_measured_another_shape(tmp_path):
    cal = _calibration(tmp_path, model="qwen3-8b", stands_for="Qwen/Qwen3-8B", tp=1, experts=None)
    r = cli(["doctor", "-p", "mi355x", "--calibration", str(cal), "--no-sglang-probe", "--json"])
    findings = {f["code"]: f["message"] for f in json.loads(r.out)["findings"]}
    assert "calibration-shape" in findings and "TP 2" in json.dumps(json.loads(r.out)["findings"])
    r = cli(["doctor", "--calibration", str(cal), "--no-sglang-probe"])
    assert r.code == 2 and "--profile" in r.err
