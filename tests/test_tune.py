"""`bcgtune tune` on the CPU (the tiny model, a dry run of every step): the JSON of every
step, the resume from the state folder (never measuring again what it has), the profile's
[tuned] record read back by doctor and drift, and hostile inputs. The trace is made here
(a seeded lognormal mix of small batches)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from cli_helpers import assert_one_line_error, cli

from bcgtune.core.trace.prefill_trace import PrefillTrace
from bcgtune.files.trace_file import load_trace, save_trace
from bcgtune.services.tune import _save_state

pytest.importorskip("torch")


def _trace(path, n: int = 16, seed: int = 3) -> str:
    rng = np.random.default_rng(seed)
    tok = np.clip(np.round(rng.lognormal(np.log(70), 0.5, n)), 8, 180).astype(int)
    req = np.minimum(rng.integers(1, 3, n), tok)
    save_trace(PrefillTrace.from_batches({"forward_tokens": tok, "new_seq": req}, origin="simulation"), str(path))
    return str(path)


def _sha(path) -> str:
    import hashlib

    return hashlib.sha256(open(path, "rb").read()).hexdigest()


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    """One plain tune (the command as a user types it, the state folder its default in the
    working folder), then a tune of a given list on the same state (the calibration kept)
    that writes a profile."""
    import os

    d = tmp_path_factory.mktemp("tune")
    trace = _trace(d / "trace.json")
    cwd = os.getcwd()
    os.chdir(d)
    try:
        plain = cli(["tune", "trace.json", "--model", "tiny", "--json"])
    finally:
        os.chdir(cwd)
    assert plain.code == 0, plain.err[-3000:]
    state = d / "bcgtune-tune-trace"
    cal_sha = _sha(state / "calibration.json")
    prof = d / "tuned.toml"
    given = cli(
        ["tune", trace, "--model", "tiny", "--state-dir", state, "--list", "64,128", "--write-profile", prof,
         "--profile", "h200", "--json", "--unchecked"]
    )  # fmt: skip
    assert given.code == 0, given.err[-3000:]
    return {"dir": d, "trace": trace, "state": state, "plain": plain, "given": given, "profile": prof, "cal_sha": cal_sha}


def test_a_profile_for_a_launch_sglang_did_not_check_needs_unchecked(tuned, tmp_path):
    """The launch is checked before anything is measured: h200's model is not on this machine,
    so neither SGLang nor the model can check it; without --unchecked nothing is tuned or
    written, with it the profile says so."""
    state = tmp_path / "s"
    prof = tmp_path / "p.toml"
    r = cli(["tune", tuned["trace"], "--model", "tiny", "--state-dir", state, "--write-profile", prof, "--profile", "h200"])
    assert r.code == 2 and "nothing written" in r.err and "--unchecked" in r.err, r.err[-2000:]
    assert not prof.exists() and not (state / "calibration.json").exists()
    from bcgtune.files.profile_file import load_profile

    assert load_profile(str(tuned["profile"])).provenance["launch_check"].startswith("not checked: ")


def test_every_step_in_the_json(tuned):
    doc = json.loads(tuned["plain"].out)
    steps = doc["steps"]
    assert list(steps) == ["plan", "calibrate", "optimum", "measure", "validate", "proof"]
    assert all(s["done"] and s["wall_s"] >= 0 and s["spent_s"] >= 0 for s in steps.values())
    # the budget: planned after the probe, each later step predicted before it ran
    b = doc["budget"]
    assert (
        b["limit_s"] == 120.0
        and b["predicted_s"] > 0
        and b["spent_s"] == pytest.approx(sum(s["spent_s"] for s in steps.values()), abs=0.01)
    )
    assert all(steps[n]["predicted_s"] is not None for n in ("calibrate", "measure", "validate", "proof"))
    assert "plan for a budget of 120 s" in tuned["plain"].err
    # the whole trace's figures: this trace of 16 batches fits the proof whole
    t = steps["proof"]["trace_estimate"]
    assert t["trace_batches"] == 16 and t["sampled_batches"] == 16 and t["half_pct"] >= 0
    assert steps["proof"]["sample"]["whole_trace"] and steps["proof"]["trace"]["design"]["strata"] == 1
    mc = steps["calibrate"]["model_check"]
    assert mc["batches"] == 16 and len(mc["lists"]) >= 2 and mc["lists"][0]["name"] == "SGLang ladder"
    assert all(c["measured_ms"] > 0 and c["predicted_ms"] > 0 for c in mc["lists"])
    proof = steps["proof"]
    # the optimum too when the recommended list has fewer graphs (the CPU's timings decide)
    assert set(proof["lists"]) - {"optimum"} == {"recommended", "SGLang ladder", "eager"}
    for r in proof["lists"].values():
        assert len(r["measured"]) == 1 and r["measured"][0]["center"] > 0 and r["measured"][0]["half"] is not None
        assert r["predicted"]["half"] is not None and r["predicted"]["model_half"] is not None  # the model error included
    d = proof["recommended_minus_ladder"]
    assert len(d["measured"]) == 1 and d["predicted"]["model_half"] is not None
    assert doc["buckets"] == steps["measure"]["recommended"]["buckets"]
    proof, opt = steps["proof"], steps["measure"]["optimal"]["buckets"]
    if opt not in (doc["buckets"], steps["measure"]["ladder"]["buckets"], []):  # fewer graphs than the optimum: measured
        vs = proof["recommended_minus_optimum"]
        assert proof["lists"]["optimum"]["buckets"] == opt and len(vs["measured"]) == proof["passes"]
        assert vs["margin_ms"] > 0 and 0 <= vs["within_margin"] <= vs["not_beyond_margin"] <= proof["passes"]
        assert 0 <= vs["differing_batches"] <= proof["batches"] and vs["differing_batches"] <= vs["differing_batches_in_trace"]
    else:
        assert "optimum" not in proof["lists"] and proof["recommended_minus_optimum"] is None
    assert steps["measure"]["rounds"] == [] or steps["measure"]["rounds"][0]["sizes"]
    rechecked = steps["measure"]["model_rechecked"]
    if steps["measure"]["rounds"]:  # sizes were added: the model is checked again on the list they made
        assert {c["name"] for c in rechecked["lists"]} == {"SGLang ladder", "recommended", "eager"}
    else:
        assert rechecked is None


def test_given_list_validated_proved_and_calibration_kept(tuned):
    doc = json.loads(tuned["given"].out)
    assert doc["buckets"] == [64, 128]
    assert doc["resumed"] == ["plan", "calibrate"]  # other settings: the calibration kept, the rest run again
    v = doc["steps"]["validate"]
    assert v["ok"] and v["batches_checked"] > 0 and v["buckets"] == [64, 128] and "input_ids" in v["side_inputs"]
    assert doc["steps"]["proof"]["lists"]["recommended"]["graphs"] == 2
    assert "not measured again" not in tuned["given"].err and "[calibrate] done in an earlier run" in tuned["given"].err


def test_resume_after_calibration_does_not_measure_again(tuned, tmp_path):
    state = tmp_path / "state"
    shutil.copytree(tuned["state"], state)
    st = json.loads((state / "state.json").read_text())
    st["steps"] = {k: st["steps"][k] for k in ("plan", "calibrate")}  # as if killed right after the calibration
    _save_state(state / "state.json", st)
    before = _sha(state / "calibration.json")
    r = cli(["tune", tuned["trace"], "--model", "tiny", "--state-dir", state, "--list", "64,128", "--json"])
    assert r.code == 0, r.err[-3000:]
    doc = json.loads(r.out)
    assert doc["resumed"] == ["plan", "calibrate"] and "model check:" not in r.err and "timing " not in r.err
    assert _sha(state / "calibration.json") == before  # no size measured again (64 and 128 are on the grid)
    assert doc["steps"]["proof"]["done"]
    # killed after the calibration file was written, before its step was recorded: kept too
    st["steps"] = {"plan": st["steps"]["plan"]}
    _save_state(state / "state.json", st)
    r = cli(["tune", tuned["trace"], "--model", "tiny", "--state-dir", state, "--list", "64,128", "--json"])
    assert r.code == 0, r.err[-3000:]
    assert "not measured again" in r.err and "model check:" not in r.err
    assert _sha(state / "calibration.json") == before
    # everything done: a rerun measures nothing at all
    r = cli(["tune", tuned["trace"], "--model", "tiny", "--state-dir", state, "--list", "64,128", "--json"])
    assert r.code == 0 and json.loads(r.out)["resumed"] == ["plan", "calibrate", "optimum", "measure", "validate", "proof"]


def test_a_proof_in_another_process_checks_the_model_again(tuned, tmp_path):
    # the calibration's model check ran in another process (a tune killed before its proof
    # and resumed): a level shift between processes is not in its error, so the proof
    # replays the check again in its own process before it predicts the totals
    state = tmp_path / "state"
    shutil.copytree(tuned["state"], state)
    st = json.loads((state / "state.json").read_text())
    st["steps"].pop("proof")
    st["model_checked_in"] = "an earlier process"
    _save_state(state / "state.json", st)
    r = cli(["tune", tuned["trace"], "--model", "tiny", "--state-dir", state, "--list", "64,128", "--json"])
    assert r.code == 0, r.err[-3000:]
    assert "checked again in this one" in r.err
    proof = json.loads(r.out)["steps"]["proof"]
    assert [c["name"] for c in proof["model_rechecked"]["lists"]] == ["SGLang ladder", "recommended", "eager"]
    assert proof["model_rechecked"]["lists"][1]["buckets"] == [64, 128]
    cal = json.loads((state / "calibration.json").read_text())
    assert json.dumps(cal).count('"recommended"') >= 1  # the check is kept in the calibration
    saved = json.loads((state / "state.json").read_text())
    assert saved["model_checked_in"] != "an earlier process"
    # run again: every step done, nothing checked or measured
    again = cli(["tune", tuned["trace"], "--model", "tiny", "--state-dir", state, "--list", "64,128"])
    assert again.code == 0 and "checked again in this one" not in again.err
    assert "model error, checked again in the proof's process (checked by replay on" in again.out


def test_a_proof_in_the_process_of_the_check_does_not_check_again(tuned):
    assert json.loads(tuned["plain"].out)["steps"]["proof"]["model_rechecked"] is None


def test_profile_tuned_record_read_by_doctor_and_drift(tuned):
    from bcgtune.files.profile_file import load_profile

    prof = load_profile(str(tuned["profile"]))
    assert prof.buckets == [64, 128] and prof.tuned is not None
    t = prof.tuned
    assert t["list"] == [64, 128] and t["graphs"] == 2 and t["device"] == "cpu" and t["passes"] == 1
    assert t["calibration_sha256"] == _sha(tuned["state"] / "calibration.json")
    doc = json.loads(tuned["given"].out)
    gain = doc["steps"]["proof"]["recommended_minus_ladder"]["measured_gain_pct"][0]
    assert t["measured_gain_pct"] == pytest.approx(gain, abs=1e-3)
    est = doc["steps"]["proof"]["trace_estimate"]
    assert t["trace_gain_pct"] == pytest.approx(est["gain_pct"], abs=1e-3) and t["trace_batches"] == 16
    assert t["trace_gain_half_pct"] == pytest.approx(est["half_pct"], abs=1e-3)
    r = cli(["doctor", "--profile", tuned["profile"], "--no-sglang-probe", "--json"])
    found = [f for f in json.loads(r.out)["findings"] if f["code"] == "tuned"]
    assert found and found[0]["severity"] == "info" and "tuned on cpu" in found[0]["message"]
    # the trace's figure, and what it was measured on
    assert "over the whole trace (95%; measured on the whole trace" in found[0]["message"]
    r = cli(["drift", "--profile", tuned["profile"], "--trace", tuned["trace"]])
    assert r.code in (0, 1), r.err
    assert "the deployed list was tuned on cpu" in r.out and "over the whole trace" in r.out
    r = cli(["drift", "--profile", tuned["profile"], "--trace", tuned["trace"], "--json"])
    assert json.loads(r.out)["tuned"]["list"] == [64, 128]


def test_a_hand_edited_list_makes_the_record_stale(tuned, tmp_path):
    p = tmp_path / "edited.toml"
    p.write_text(tuned["profile"].read_text().replace("list = [64, 128]\nsource", "list = [64, 192]\nsource", 1))
    r = cli(["doctor", "--profile", p, "--no-sglang-probe", "--json"])
    codes = {f["code"]: f["severity"] for f in json.loads(r.out)["findings"]}
    assert codes.get("tuned-stale") == "warning" and "tuned" not in codes


def test_a_list_written_without_a_tune_drops_the_record(tuned, tmp_path):
    from bcgtune.files.profile_file import load_profile, write_profile_buckets

    p = tmp_path / "again.toml"
    shutil.copy(tuned["profile"], p)
    write_profile_buckets(p, [96], {"objective": "padding"})
    assert load_profile(str(p)).tuned is None


@pytest.mark.parametrize(
    "args, says",
    [
        (["{missing}", "--model", "tiny"], "no such file"),
        (["{dir}", "--model", "tiny"], "folder"),
        (["{trace}", "--model", "tiny", "--write-profile", "{trace}"], "input of this run"),
        (["{trace}", "--model", "no-such-model"], "unknown model"),
        (["{trace}", "--model", "tiny", "--tolerance", "nan"], "--tolerance"),
        (["{trace}", "--model", "tiny", "--chunked-prefill-size", "32"], "above the chunked-prefill ceiling 32"),
        (["{nan}", "--model", "tiny"], "not an integer"),
        (["{empty}", "--model", "tiny"], "empty"),
        (["{state_file}", "--model", "tiny"], "not a prefill trace"),
        (["{trace}", "--model", "tiny", "--state-dir", "{trace}"], "not a folder"),
        (["{trace}", "--model", "tiny", "--list", "0,64"], "--list"),
    ],
)
def test_hostile_inputs(tuned, tmp_path, args, says):
    (tmp_path / "nan.csv").write_text("forward_tokens\nnan\n")
    (tmp_path / "empty.csv").write_text("forward_tokens\n")
    state_file = tmp_path / "state.json"
    shutil.copy(tuned["state"] / "state.json", state_file)
    names = {
        "missing": tmp_path / "missing.json",
        "dir": tmp_path,
        "trace": tuned["trace"],
        "nan": tmp_path / "nan.csv",
        "empty": tmp_path / "empty.csv",
        "state_file": state_file,
    }
    line = [a.format(**names) for a in args]
    if "--state-dir" not in line:
        line += ["--state-dir", str(tmp_path / "st")]
    r = cli(["tune", *line])
    assert r.code == 2, (r.code, r.err[-2000:])
    assert_one_line_error(r)
    assert says in r.err


def test_another_trace_in_the_same_state_is_refused(tuned, tmp_path):
    other = _trace(tmp_path / "other.json", seed=9)
    r = cli(["tune", other, "--model", "tiny", "--state-dir", tuned["state"]])
    assert r.code == 2 and "another trace" in r.err
    assert_one_line_error(r)


def test_h200_tune_script_runs_on_cpu_with_tiny_model(tmp_path):
    """benchmarks/h200_tune.sh (the H200 run) on the tiny model: its plumbing, every step, the
    JSON and the table it writes."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    out = tmp_path / "out"
    env = dict(
        os.environ,
        OUT=str(out),
        TRACE=_trace(tmp_path / "t.json", n=12),
        MODEL="tiny",
        GRID="64",
        MIX_EVERY="1",
        CAL_REPEATS="2",
        CAL_WARMUP="0",
        CHECK="12",
        PROOF="12",
        PROOF_REPEATS="2",
        PASSES="2",
        MEMORY="0",
        WHOLE="1",
        WHOLE_PASSES="1",
        WHOLE_REPEATS="2",
        PATH=str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", ""),
    )
    p = subprocess.run(
        ["bash", "benchmarks/h200_tune.sh"], cwd=root, env=env, capture_output=True, text=True, timeout=600, check=False
    )
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    doc = json.loads((out / "tune_tiny.json").read_text())
    assert doc["steps"]["proof"]["passes"] == 2 and len(doc["steps"]["proof"]["lists"]["eager"]["measured"]) == 2
    assert "recommended - ladder: predicted" in (out / "tune_tiny.txt").read_text()
    assert doc["plan"]["grid"] == 64 and doc["plan"]["given"]  # the knobs given win over the plan
    assert "gain over the ladder on the whole trace:" in (out / "tune_tiny.txt").read_text() and "tune: " in p.stdout
    # the whole trace replayed under the recommended list and the ladder, against the tune's interval
    whole = json.loads((out / "whole_tiny.json").read_text())
    assert whole["batches"] == doc["steps"]["proof"]["of"] and len(whole["passes"]) == 1
    assert whole["lists"]["recommended"] == doc["steps"]["proof"]["lists"]["recommended"]["buckets"]
    assert "inside the tune's interval in" in p.stdout


def test_plot_of_predicted_vs_measured(tuned, tmp_path):
    pytest.importorskip("matplotlib")
    state = tmp_path / "state"
    shutil.copytree(tuned["state"], state)
    png = tmp_path / "tune.png"
    r = cli(["tune", tuned["trace"], "--model", "tiny", "--state-dir", state, "--list", "64,128", "--plot", png])
    assert r.code == 0, r.err[-2000:]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "gain over SGLang's ladder on the whole trace:" in r.out and "wall time of the steps" in r.out
    assert "on the 16 batches replayed: recommended - ladder predicted" in r.out


def test_the_model_is_checked_again_on_a_list_of_added_sizes(tuned, tmp_path):
    # the check replays the sample under the lists given, on the calibration's own model and rounds
    from bcgtune.files.trace_file import load_trace
    from bcgtune.services.calibrate import recheck_model

    cal = tmp_path / "cal.json"
    shutil.copy(tuned["state"] / "calibration.json", cal)
    lists = {"SGLang ladder": [64, 128, 192], "recommended": [96, 180]}
    check = recheck_model(str(cal), load_trace(tuned["trace"]), lists, batches=8)
    assert [c.name for c in check.lists] == ["SGLang ladder", "recommended"]
    assert [c.buckets for c in check.lists] == [[64, 128, 192], [96, 180]]
    assert all(c.predicted_ms > 0 and c.measured_ms > 0 for c in check.lists) and check.batches <= 8


def test_a_trace_of_two_configurations_is_refused_with_a_hint_that_runs(tmp_path):
    import re

    from test_fleet import server_log

    (tmp_path / "a.log").write_text(server_log(8192, [100, 200, 300]))
    (tmp_path / "b.log").write_text(server_log(2048, [120, 220, 320]))
    mixed = tmp_path / "ab.json"
    assert cli(["trace", "--log", tmp_path / "a.log", "--log", tmp_path / "b.log", "-o", mixed, "-q"]).code == 0
    r = cli(["tune", mixed, "--model", "tiny", "--state-dir", tmp_path / "st"])
    assert r.code == 2 and "2 server configurations" in r.err
    assert_one_line_error(r)
    hint = re.search(r"`(bcgtune trace --log LOGS --group N -o one\.json)`", r.err)
    assert hint is not None, r.err
    one = tmp_path / "one.json"  # the hint as printed, LOGS and N filled in
    args = ["trace", "--log", tmp_path / "a.log", "--log", tmp_path / "b.log", "--group", "1", "-o", one, "-q"]
    assert cli(args).code == 0
    assert len(load_trace(str(one)).groups) == 1


def test_a_list_outside_its_interval_that_the_check_did_not_replay_is_named(tuned):
    # eager is priced from the calibration's rounds, never replayed by the model check: when it
    # misses its interval the text says so, and why, instead of leaving a bare count
    from bcgtune.cli.render.tune import format_tune
    from bcgtune.services.tune import TuneResult

    state = json.loads((tuned["state"] / "state.json").read_text())
    proof = state["steps"]["proof"]
    assert proof["lists"]["eager"]["in_model_check"] is True  # a tune's check replays eager too
    proof["lists"]["eager"]["in_model_check"] = False  # as a calibration checked without it
    text = format_tune(TuneResult(state, str(tuned["state"])))
    assert "note: eager measured outside" not in text or proof["lists"]["eager"]["inside"] < proof["passes"]
    proof["lists"]["eager"]["inside"] = 0
    proof["lists"]["SGLang ladder"].update(inside=0, in_model_check=True)  # replayed by the check: no excuse for it
    text = format_tune(TuneResult(state, str(tuned["state"])))
    assert "note: eager measured outside its predicted interval in 1/1 passes" in text
    assert "it is not replayed by the model check" in text and "host's CPU" in text
    assert "note: SGLang ladder measured outside" not in text


def test_a_pass_is_beyond_the_margin_only_when_its_interval_is():
    from bcgtune.core.stats import Interval
    from bcgtune.services.tune import margin_counts

    # the H200 0.6B proof's passes against a 13.1 ms margin: +16 ms whose interval reaches down to -19 ms is
    # above the margin but not measurably beyond it; +40 ± 10 ms is
    passes = [Interval(-11.2, 23.1, None, 5), Interval(16.0, 35.3, None, 5), Interval(40.0, 10.0, None, 5)]
    assert margin_counts(passes, 13.1) == {"within_margin": 1, "not_beyond_margin": 2}
    assert margin_counts([Interval(14.0, None, None, 1)], 13.1) == {"within_margin": 0, "not_beyond_margin": 0}
    assert margin_counts([], 13.1) == {"within_margin": 0, "not_beyond_margin": 0}


def test_batches_two_lists_run_differently():
    import numpy as np

    from bcgtune.services.tune import _differing

    tokens = np.array([300, 700, 1000, 100])
    # 700 replays in 1024 under one list and 768 under the other; 100 runs eager under both (512 > 2 x 100)
    assert _differing(tokens, [512, 1024], [512, 768, 1024]) == 1
    assert _differing(tokens, [512, 1024], [512, 1024]) == 0
    assert _differing(tokens, [], [1024]) == 2  # 700 and 1000 replay in 1024; eager without graphs


def test_the_text_says_when_the_proof_cannot_tell_the_recommended_list_from_the_optimum(tuned):
    from bcgtune.cli.render.tune import format_tune
    from bcgtune.services.tune import TuneResult

    state = json.loads((tuned["state"] / "state.json").read_text())
    proof = state["steps"]["proof"]
    d = proof["recommended_minus_ladder"]
    vs = {"predicted": d["predicted"], "measured": d["measured"], "tolerance_pct": 0.5, "margin_ms": 1.0}
    vs.update(within_margin=1, not_beyond_margin=1, differing_batches=0, differing_batches_in_trace=5)
    proof["recommended_minus_optimum"] = vs
    text = format_tune(TuneResult(state=state, state_dir=str(tuned["state"])))
    assert "both lists replay every batch in the same bucket" in text and "the trace has 5 batches" in text
    vs["differing_batches"] = 3
    text = format_tune(TuneResult(state=state, state_dir=str(tuned["state"])))
    assert "same bucket" not in text and "not measurably beyond it" in text


def test_the_step_table_wraps_its_results_under_their_column(tuned):
    from bcgtune.cli.render.table import table
    from bcgtune.cli.render.tune import format_tune
    from bcgtune.services.tune import TuneResult

    rows = [["calibrate", "8.7", "word " * 50], ["proof", "1.0", ""]]
    lines = table(["step", "wall s", "result"], rows, right={1}, wrap_last=40)
    col = lines[0].index("result")
    assert len(lines) > 4 and all(len(x) <= col + 40 for x in lines)
    assert lines[3].startswith(" " * col) and lines[3][col:].startswith("word") and lines[-1].split() == ["proof", "1.0"]
    state = json.loads((tuned["state"] / "state.json").read_text())
    text = format_tune(TuneResult(state=state, state_dir=str(tuned["state"])))
    head = text.splitlines()[1:3]  # the step table's header and rule
    assert head[0].startswith("step") and len(head[1]) <= head[0].index("result") + 100


def test_a_state_changed_by_hand_is_refused(tuned, tmp_path):
    state = tmp_path / "state"
    shutil.copytree(tuned["state"], state)
    st = json.loads((state / "state.json").read_text())
    st["steps"]["proof"]["recommended_minus_ladder"]["measured_gain_pct"] = ["a lot"]
    (state / "state.json").write_text(json.dumps(st))
    r = cli(["tune", tuned["trace"], "--model", "tiny", "--state-dir", state])
    assert r.code == 2 and "does not match its seal" in r.err and "state.json" in r.err
    assert_one_line_error(r)
    # a state without a seal (written before states had one) is read as before
    st = json.loads((tuned["state"] / "state.json").read_text())
    del st["seal"]
    (state / "state.json").write_text(json.dumps(st))
    r = cli(["tune", tuned["trace"], "--model", "tiny", "--state-dir", state, "--json"])
    assert r.code == 0, r.err[-2000:]
    assert json.loads((state / "state.json").read_text())["seal"]  # sealed again when written


def test_a_calibration_changed_or_gone_under_a_state_is_refused(tuned, tmp_path):
    state = tmp_path / "state"
    shutil.copytree(tuned["state"], state)
    cal = json.loads((state / "calibration.json").read_text())
    cal["created"] = "2000-01-01T00:00:00+00:00"  # edited by hand, still a valid calibration
    (state / "calibration.json").write_text(json.dumps(cal))
    r = cli(["tune", tuned["trace"], "--model", "tiny", "--state-dir", state])
    assert r.code == 2 and "calibration.json changed since this tune recorded it" in r.err
    assert_one_line_error(r)
    # killed between a step's new calibration and its state: the calibration is taken as found
    st = json.loads((state / "state.json").read_text())
    st["calibration_pending"] = True
    _save_state(state / "state.json", st)
    r = cli(["tune", tuned["trace"], "--model", "tiny", "--state-dir", state, "--json"])
    assert r.code == 0, r.err[-2000:]
    assert "calibration_pending" not in json.loads((state / "state.json").read_text())  # recorded as found
    (state / "calibration.json").unlink()
    r = cli(["tune", tuned["trace"], "--model", "tiny", "--state-dir", state])
    assert r.code == 2 and "calibration.json is gone" in r.err
    assert_one_line_error(r)


_LOGS = Path(__file__).parent / "data" / "sglang-logs"


def test_tune_reads_server_logs_and_keeps_their_trace(tmp_path):
    log = str(_LOGS / "05_issue1612_time_only_prefix.log")
    state = tmp_path / "st"
    small = ["--model", "tiny", "--state-dir", str(state), "--grid", "2048", "--check-batches", "4", "--proof-batches", "4"]
    r = cli(["tune", "--log", log, *small, "--json"])
    assert r.code == 0, r.err[-3000:]
    assert "written to" in r.err and (state / "trace.json").is_file()
    doc = json.loads(r.out)
    assert doc["steps"]["proof"]["done"] and load_trace(str(state / "trace.json")).n_batches == 25
    # resumed: the logs parsed again to the same trace, the file kept, every step kept
    again = cli(["tune", "--log", log, *small, "--json"])
    assert again.code == 0 and "(kept)" in again.err
    assert json.loads(again.out)["resumed"] == ["plan", "calibrate", "optimum", "measure", "validate", "proof"]


@pytest.mark.parametrize(
    "args, says",
    [
        (["--log", "{a}", "{b}"], "give --group N"),  # two configurations (a shell glob after one --log)
        (["{a}"], "an SGLang server log, not a trace"),  # a log given as the trace
        (["{trace}", "--group", "0"], "apply to --log"),
        (["{trace}", "{trace}"], "one trace at a time"),
        ([], "give a trace"),
        (["--log", "{a}", "--launch", "chunked_prefill_size=abc"], "--launch"),
        (["--log", "{a}", "--group", "3"], "--group"),
        (["--log", "{st}/trace.json"], "is also an input of this run"),  # a log where the logs' trace goes
    ],
)
def test_tune_refuses_logs_it_cannot_tune(tuned, tmp_path, args, says):
    names = {"a": _LOGS / "05_issue1612_time_only_prefix.log", "b": _LOGS / "01_docker_desktop_outer_timestamp.log"}
    names["trace"] = tuned["trace"]
    names["st"] = tmp_path / "st"
    names["st"].mkdir()
    shutil.copy(names["a"], names["st"] / "trace.json")
    r = cli(["tune", *[a.format(**names) for a in args], "--model", "tiny", "--state-dir", str(tmp_path / "st")])
    assert r.code == 2, (r.code, r.err[-2000:])
    assert_one_line_error(r)
    assert says in r.err


def test_an_old_tuned_record_says_its_gain_is_the_samples():
    """A [tuned] record written before the whole-trace estimate existed keeps its sample gain,
    and its text says what that was measured on."""
    from bcgtune.files.profile_file import tuned_text

    text = tuned_text(
        {"list": [1, 2], "measured_gain_pct": 3.38, "measured_gain_half_pct": 0.44, "passes": 3, "batches": 40, "graphs": 2,
         "device": "NVIDIA H200", "torch": "2.11", "date": "2026-12-02"}
    )  # fmt: skip
    assert "measured gain +3.38% ± 0.44%" in text and "on the 40 batches its proof replayed" in text and "not the trace's" in text
