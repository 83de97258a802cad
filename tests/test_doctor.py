"""`bcgtune doctor`: the runner gate classified by the runner's own behaviour (copies of
the 0.5.23 runner in tests/data/runner, see SOURCES.md there), the `ast` reading kept as
the fallback, profile findings on what the server will resolve, serve's flag refusals as
blocking findings, exit codes and --json."""

import json
from pathlib import Path

import pytest
from proc_helpers import run_cli

from bcgtune.adapters.machine.environment import sglang_info
from bcgtune.adapters.machine.model_config import model_is_qwen4_exp
from bcgtune.adapters.sglang.resolve import (
    PROBE_CONFIG_DIR,
    FlagCheck,
    RunnerAnswers,
    run_probe,
    sglang_installed,
)
from bcgtune.adapters.sglang.runner_source import GateReport, find_runner_source, runner_gate_state
from bcgtune.core.sglang.capture import CaptureSource, PrefillCapture
from bcgtune.files.profile_file import load_profile, parse_profile
from bcgtune.services.doctor import classify_gate, gate_report, profile_findings, run_doctor

RUNNERS = Path(__file__).parent / "data" / "runner"
EXPECTED = {
    "unpatched_0.5.23.py": "unpatched",
    "patched_as_proposed.py": "patched",
    "patched_nested_if.py": "patched",
    "patched_local_variable.py": "patched",
    "patched_renamed_flag.py": "patched",
    "patched_check_in_gate.py": "patched",
    "inverted_condition.py": "inverted",
    "refusal_removed.py": "refusal-removed",
    "never_true_condition.py": "refusal-removed",
    "text_refusing.py": "refuses-text",
    "unimportable.py": "not checked",  # the import fails: not run, and the server would not start
    "patched_with_deepstack_slot.py": "patched",
    "renamed_runner_class.py": "not checked",  # SGLang imports the class from it: the server would not start
    "patched_check_in_helper.py": "patched",
}
# what each copy's source reads as, reported beside "not checked": a reading is never a
# verdict, and it never blocks
EXPECTED_READING = {
    "unpatched_0.5.23.py": "unpatched",
    "patched_as_proposed.py": "patched",
    "patched_nested_if.py": "patched",
    "patched_local_variable.py": "patched",
    "patched_renamed_flag.py": "patched",
    "patched_check_in_gate.py": "patched",
    "inverted_condition.py": "inverted",
    "refusal_removed.py": "refusal-removed",
    "never_true_condition.py": "refusal-removed",
    "text_refusing.py": "refuses-text",
    "unimportable.py": "patched",
    "patched_with_deepstack_slot.py": "patched",
    "renamed_runner_class.py": None,  # no PrefillCudaGraphRunner to read
    "patched_check_in_helper.py": "refusal-removed",  # the check moved into a helper: misread, never blocks
}
H200 = {"platform": "cuda", "name": "NVIDIA H200", "memory_gib": 141.0, "capability": [9, 0]}


def test_every_runner_copy_has_an_expectation():
    assert sorted(p.name for p in RUNNERS.glob("*.py")) == sorted(EXPECTED) == sorted(EXPECTED_READING)


@pytest.mark.parametrize("name", sorted(EXPECTED_READING))
def test_copies_classified_by_reading(name):
    g = gate_report(RunnerAnswers(False, None, {}, "--no-sglang-probe"), RUNNERS / name)
    reads = EXPECTED_READING[name]
    assert (g.state, g.reads_as, g.method) == ("not checked", reads, "source reading"), g.detail
    assert reads is None or g.detail.startswith(f"reads as {reads}")
    assert "not run: --no-sglang-probe" in g.detail


# ------------------------------------------------------------------ the gate, by behaviour
@pytest.fixture(scope="module")
def runner_answers():
    """One child process builds every copy's PrefillCudaGraphRunner and asks it."""
    if not sglang_installed():
        pytest.skip("sglang not installed")
    names = sorted(EXPECTED)
    result = run_probe(
        {
            "device": H200,
            "runners": {"config_dir": str(PROBE_CONFIG_DIR), "sources": [str(RUNNERS / n) for n in names] + [None]},
        },
        timeout=600,
    )
    assert "error" not in result, result["error"]
    return dict(zip(names + ["installed"], result["runners"]))


@pytest.mark.sglang
@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_copies_classified_by_behaviour(runner_answers, name):
    r = runner_answers[name]
    g = gate_report(_runner(r), RUNNERS / name)
    assert (g.state, g.method) == (EXPECTED[name], "behaviour"), (r, g.detail)
    if EXPECTED[name] == "not checked":
        # it could not be run: the reason, and SGLang's import of it fails whatever the machine
        assert r["imported"] is False and r["stops_server"] is True and "does not import" in g.detail
        return
    if EXPECTED[name] == "refuses-text":
        # by running it: the line of can_replay_locally that refused the text batch
        assert "run: text_spec_off at line" in g.detail and "_qwen_bcg_multimodal_eager" in g.detail, g.detail
        return
    assert r["ok"], r.get("error")
    # every other copy still replays text batches, with and without speculative decoding
    assert r["answers"]["text_spec_off"] and r["answers"]["text_spec_on"]


def _runner(r: dict) -> RunnerAnswers:
    from bcgtune.adapters.sglang.resolve import Answer, _runner_answer

    return _runner_answer(Answer(r))


@pytest.mark.sglang
def test_installed_0_5_23_runner_is_unpatched_by_behaviour(runner_answers):
    if sglang_info().version != "0.5.23":
        pytest.skip("needs sglang 0.5.23")
    r = runner_answers["installed"]
    assert r["ok"] and r["answers"] == {
        "image_spec_off": False,
        "text_spec_off": True,
        "image_spec_on": False,
        "text_spec_on": True,
    }


def test_classification_table():
    def ans(img_off, img_on, text=True):
        return {"image_spec_off": img_off, "image_spec_on": img_on, "text_spec_off": text, "text_spec_on": text}

    assert classify_gate(ans(True, False))[0] == "patched"
    assert classify_gate(ans(False, False))[0] == "unpatched"
    assert classify_gate(ans(True, True))[0] == "refusal-removed"
    assert classify_gate(ans(False, True))[0] == "inverted"
    assert classify_gate(ans(True, False, text=False))[0] == "refuses-text"  # no text batch replays
    state, detail = classify_gate({"image_spec_off": False, "image_spec_on": False, "text_spec_off": False, "text_spec_on": True})
    assert state == "refuses-text" and "speculative decoding off" in detail and "on, image batches run eager" in detail
    assert classify_gate({"image_spec_off": True})[0] == "unknown"


def test_a_runner_that_imports_but_cannot_run_is_not_checked_with_the_reason():
    g = gate_report(RunnerAnswers(False, True, {}, "cannot run the runner: KeyError: 'x'"), "r.py")
    assert (g.state, g.method) == ("not checked", "behaviour") and "KeyError" in g.detail


# ------------------------------------------------------------------ the ast reading (fallback)
def _src(name):
    return RUNNERS / name


def test_reading_when_the_runner_was_not_run(tmp_path):
    g = gate_report(RunnerAnswers(False, None, {}, "sglang is not installed"), _src("unpatched_0.5.23.py"))
    assert (g.state, g.reads_as, g.method) == ("not checked", "unpatched", "source reading")
    assert g.detail.startswith("reads as unpatched") and "not run: sglang is not installed" in g.detail
    # a reading never says patched: running could contradict it
    g = gate_report(None, _src("patched_as_proposed.py"))
    assert (g.state, g.reads_as) == ("not checked", "patched") and "not run" in g.detail


def test_a_runner_sglang_cannot_import_is_not_checked_with_the_reason():
    g = gate_report(RunnerAnswers(False, False, {}, "the runner module does not import: ImportError: x"), "r.py")
    assert (g.state, g.method) == ("not checked", "behaviour") and "does not import: ImportError: x" in g.detail


def test_reading_shapes(tmp_path):
    g = runner_gate_state(_src("unpatched_0.5.23.py"))
    assert (g.state, g.reads_as) == ("not checked", "unpatched")
    # right copies written differently all read as patched, and are never called patched
    for name in ("patched_as_proposed.py", "patched_local_variable.py", "patched_nested_if.py"):
        g = runner_gate_state(_src(name))
        assert (g.state, g.reads_as) == ("not checked", "patched"), name
    p = tmp_path / "r.py"
    p.write_text(
        "class PrefillCudaGraphRunner:\n"
        "    def __init__(self, model_runner):\n        self.x = 1\n"
        "    def can_replay_locally(self, *, contains_mm_inputs=False, num_tokens=None):\n"
        "        return True\n"
    )
    assert (runner_gate_state(p).state, runner_gate_state(p).reads_as) == ("not checked", "absent")
    for text, detail in [
        (None, "not found"),
        ("def broken(:\n", "cannot parse"),
        ("class Other:\n    pass\n", "PrefillCudaGraphRunner not found"),
        ("class PrefillCudaGraphRunner:\n    def __init__(self):\n        pass\n", "can_replay_locally"),
    ]:
        q = tmp_path / "q.py"
        if text is not None:
            q.write_text(text)
        elif q.exists():
            q.unlink()
        g = runner_gate_state(q)
        assert (g.state, g.reads_as) == ("not checked", None) and detail in g.detail
    assert runner_gate_state(None).state == "not checked"


# ------------------------------------------------------------------ profile findings
def _gate(state):
    return GateReport(state, "", None, method="behaviour")


def _codes(findings):
    return {(f.severity, f.code) for f in findings}


def _profile(server="", buckets="", platform="cuda", model="amd/Qwen3.8-Flash-Next-Quark-MXFP4"):
    text = f'[profile]\nname = "t"\nplatform = "{platform}"\nmodel = "{model}"\n[server]\n{server}\n'
    if buckets:
        text += f"[buckets]\nlist = {buckets}\n"
    return parse_profile(text, "t.toml")


def _resolved(backend="breakable", buckets=(256, 512), alignment=1, notes=(), chunk=8192, reason="x"):
    return PrefillCapture(
        backend,
        reason,
        tuple(buckets),
        8192,
        alignment,
        tuple(buckets),
        chunk,
        notes=tuple(notes),
        source=CaptureSource("sglang", "0.5.23"),
    )


def test_mi355x_findings_by_gate():
    prof = load_profile("mi355x")
    res = _resolved(buckets=prof.buckets, chunk=16384)
    assert _codes(profile_findings(prof, _gate("unpatched"), resolved=res)) == {("blocking", "qwen-mm-unpatched-runner")}
    assert profile_findings(prof, _gate("patched"), resolved=res) == []
    assert _codes(profile_findings(prof, _gate("unknown"), resolved=res)) == {("warning", "qwen-mm-gate-unknown")}
    assert _codes(profile_findings(prof, _gate("refuses-text"), resolved=res)) == {("blocking", "qwen-mm-gate-refuses-text")}
    assert _codes(profile_findings(prof, _gate("not checked"), resolved=res)) == {("warning", "qwen-mm-gate-not-checked")}
    assert _codes(profile_findings(prof, _gate("refusal-removed"), resolved=res)) == {
        ("blocking", "qwen-mm-gate-refusal-removed")
    }
    assert _codes(profile_findings(prof, _gate("inverted"), resolved=res)) == {("blocking", "qwen-mm-gate-inverted")}


def test_no_runner_finding_for_graphs_never_captured():
    # two-batch overlap with no explicit backend: SGLang turns breakable graphs off
    prof = _profile("enable-two-batch-overlap = true", "[256, 512]")
    off = _resolved("disabled", (), 2, reason="SGLang: Breakable CUDA graph is incompatible with two-batch overlap")
    codes = _codes(profile_findings(prof, _gate("unpatched"), resolved=off))
    assert codes == {("blocking", "buckets-dead")}
    # without a list there is nothing dead and nothing to warn about
    assert profile_findings(_profile("enable-two-batch-overlap = true"), _gate("unpatched"), resolved=off) == []
    # and the fallback model reaches the same verdict on its own
    assert _codes(profile_findings(prof, _gate("unpatched"))) == {("blocking", "buckets-dead")}


def test_deepep_rounding_is_reported():
    prof = _profile('tp-size = 2\nmoe-a2a-backend = "deepep"', "[100, 300, 1000]")
    found = {f.code: f for f in profile_findings(prof, _gate("patched"))}  # fallback model
    assert "bucket-rounded" in found and "100->104, 300->304" in found["bucket-rounded"].message
    assert "[104, 304, 1000]" in found["bucket-rounded"].message


def test_speculative_warning_even_when_patched():
    prof = _profile('cuda-graph-backend-prefill = "breakable"\nspeculative-algorithm = "NGRAM"')
    assert ("warning", "speculative-mm-eager") in _codes(profile_findings(prof, _gate("patched")))


def test_rocm_backend_not_explicit():
    prof = _profile("tp-size = 2", "[256, 512]", platform="rocm")
    assert _codes(profile_findings(prof, _gate("patched"))) == {("blocking", "rocm-prefill-backend-unset")}
    prof = _profile("tp-size = 2", platform="rocm")
    assert _codes(profile_findings(prof, _gate("patched"))) == {("warning", "rocm-prefill-backend-unset")}
    prof = _profile('cuda-graph-config = \'{"prefill": {"backend": "breakable"}}\'', platform="rocm")
    assert profile_findings(prof, _gate("patched")) == []


def test_bucket_gap_alignment_and_chunk():
    prof = _profile("tp-size = 8\nattn-dp-size = 2", "[102, 256, 1024, 8000]", model="meta-llama/Llama-3.1-8B")
    found = {f.code: f for f in profile_findings(prof, _gate("unpatched"))}
    assert set(found) == {"bucket-gap", "bucket-rounded", "bucket-above-chunk", "model-unknown"}
    assert found["model-unknown"].severity == "info"
    assert "256->1024 (sizes 257..511 run eager)" in found["bucket-gap"].message
    assert "102->104" in found["bucket-rounded"].message and "multiples of 4" in found["bucket-rounded"].message
    assert "[8000]" in found["bucket-above-chunk"].message and "(2048)" in found["bucket-above-chunk"].message


def test_bucket_gap_names_only_sizes_that_run_eager():
    # 202 <= 2 x 101: every size from 101 replays in 202, so 100->202 leaves no gap
    # although 202 is more than twice 100; 202->500 leaves 203..249 eager (500 > 2 x 249)
    prof = _profile('cuda-graph-backend-prefill = "breakable"', "[100, 202, 500]", model="meta-llama/Llama-3.1-8B")
    found = {f.code: f for f in profile_findings(prof, _gate("patched"), resolved=_resolved(buckets=(100, 202, 500)))}
    assert found["bucket-gap"].message.startswith(
        "neighbouring buckets more than 2x apart: 202->500 (sizes 203..249 run eager); "
    )
    # doctor has no traffic: it says so, and does not warn
    assert found["bucket-gap"].severity == "info" and "doctor has no traffic" in found["bucket-gap"].message
    found = {f.code for f in profile_findings(prof, _gate("patched"), resolved=_resolved(buckets=(100, 202)))}
    assert "bucket-gap" not in found


def test_flag_refusal_is_blocking():
    prof = _profile('cuda-graph-backend-prefill = "breakable"')
    refused = FlagCheck(False, "--mem-frac is an abbreviation of --mem-fraction-static", "t.toml: [server].mem-frac")
    found = {f.code: f for f in profile_findings(prof, _gate("patched"), flags=refused)}
    assert found["flag-refused"].severity == "blocking" and "[server].mem-frac" in found["flag-refused"].message
    found = {f.code: f for f in profile_findings(prof, _gate("patched"), flags=FlagCheck(None, "sglang is not installed"))}
    assert found["flags-unchecked"].severity == "info"


def test_model_detection(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    assert model_is_qwen4_exp("amd/Qwen3.8-Flash-Next-Quark-MXFP4") is True
    assert model_is_qwen4_exp("meta-llama/Llama-3.1-8B") is None
    d = tmp_path / "m"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    assert model_is_qwen4_exp(str(d)) is False
    (d / "config.json").write_text(json.dumps({"architectures": ["Qwen4ExpForConditionalGeneration"]}))
    assert model_is_qwen4_exp(str(d)) is True
    snap = tmp_path / "hub" / "models--org--q" / "snapshots" / "r1"
    snap.mkdir(parents=True)
    (snap / "config.json").write_text(json.dumps({"architectures": ["Qwen4ExpForConditionalGeneration"]}))
    assert model_is_qwen4_exp("org/q") is True  # from the local Hugging Face cache


def test_doctor_without_sglang_falls_back(monkeypatch):
    import bcgtune.adapters.sglang.resolve as sr
    import bcgtune.services.doctor as doc
    from bcgtune.adapters.machine.environment import SglangInfo

    monkeypatch.setattr(sr, "sglang_installed", lambda: False)
    monkeypatch.setattr(doc, "sglang_info", lambda: SglangInfo(installed=False))
    report = run_doctor(load_profile("mi355x"), runner_path=RUNNERS / "unpatched_0.5.23.py")
    g = report.prefill_runner_gate
    assert (g.state, g.reads_as, g.method) == ("not checked", "unpatched", "source reading")
    assert "sglang is not installed" in g.detail
    assert report.resolved_prefill.source.label == "bcgtune model"
    assert report.resolved_prefill.captured == (256, 512, 768, 1024, 1280, 1408, 2560, 2752, 3840, 4096, 5376)
    found = {f.code: f for f in report.findings}
    # a reading warns, never blocks: nothing ran
    assert (
        found["qwen-mm-gate-not-checked"].severity == "warning"
        and "reads as unpatched" in found["qwen-mm-gate-not-checked"].message
    )
    assert "qwen-mm-unpatched-runner" not in found and not report.blocking
    assert found["flags-unchecked"].severity == "info" and "sglang is not installed" in found["flags-unchecked"].message
    # no verdict without SGLang: not checked, never ok, and how to get the answer
    doc_json = report.to_json()
    assert (report.outcome, doc_json["ok"], doc_json["launch_check"]) == ("not checked", False, "not checked")
    assert len(report.not_checked) == 3 and any("install sglang" in h for h in report.how_to_check)
    assert doc_json["resolved_prefill"]["launch_check"] == "not checked"


def test_doctor_reports_a_profile_serve_refuses_before_any_flag(monkeypatch):
    import bcgtune.adapters.sglang.resolve as sr

    monkeypatch.setattr(sr, "sglang_installed", lambda: True)
    monkeypatch.setattr(sr, "run_probe", lambda request, timeout, **_: {"sglang_version": "0.5.23", "runners": []})
    prof = parse_profile('[profile]\nname = "t"\nplatform = "cuda"\n', "t.toml")  # no model: serve refuses
    report = run_doctor(prof, runner_path=RUNNERS / "unpatched_0.5.23.py")
    found = {f.code: f for f in report.findings}
    assert found["flag-refused"].severity == "blocking" and "no model" in found["flag-refused"].message


# ------------------------------------------------------------------ CLI, SGLang asked
@pytest.mark.sglang
def test_cli_json_resolved_prefill_and_exit_code(capsys, sglang_probe):
    code, out, err = run_cli(["doctor", "--profile", "mi355x", "--json"], capsys)
    assert code == 1 and "error: 1 blocking finding: qwen-mm-unpatched-runner (doctor)" in err
    obj = json.loads(out)
    gate = obj["prefill_runner_gate"]
    assert (obj["ok"], gate["state"], gate["method"]) == (False, "unpatched", "behaviour")
    assert gate["answers"]["text_spec_off"] is True and gate["answers"]["image_spec_off"] is False
    rp = obj["resolved_prefill"]
    assert rp["backend"] == "breakable" and rp["buckets"] == [256, 512, 768, 1024, 1280, 1408, 2560, 2752, 3840, 4096, 5376]
    # the model's config is not on this machine: the fallback says so
    assert rp["source"] == "bcgtune model" and "not in the local Hugging Face cache" in rp["fallback_reason"]


@pytest.mark.sglang
def test_cli_doctor_reports_what_serve_refuses(tmp_path, capsys, sglang_probe):
    prof = tmp_path / "abbrev.toml"
    prof.write_text(
        '[profile]\nname = "abbrev"\nplatform = "cuda"\nhardware = "h200"\n'
        f'model = "{PROBE_CONFIG_DIR}"\n[server]\ntp = 2\nmem-frac = 0.8\n[buckets]\nlist = [256, 512]\n'
    )
    code, out, err = run_cli(["doctor", "--profile", str(prof), "--runner-source", str(RUNNERS / "patched_nested_if.py")], capsys)
    assert code == 1 and "flag-refused" in err
    assert "prefill runner multimodal gate: patched (behaviour)" in out
    assert "--mem-frac is an abbreviation of --mem-fraction-static" in out and "[server].mem-frac" in out
    assert "prefill graphs (checked by SGLang: sglang 0.5.23):" in out and "captures   2 graphs, 256..512" in out
    # serve refuses the same profile
    code, _, err = run_cli(["serve", "--profile", str(prof), "--dry-run"], capsys)
    assert code == 2 and "--mem-frac is an abbreviation of --mem-fraction-static" in err


def test_find_runner_source_path():
    info = sglang_info()
    if info.installed:
        assert find_runner_source(info.path).name == "prefill_cuda_graph_runner.py"
    assert find_runner_source("") is None


def test_a_launch_value_the_model_cannot_take_is_blocking_not_a_crash(monkeypatch):
    import bcgtune.adapters.sglang.resolve as sr
    import bcgtune.services.doctor as doc
    from bcgtune.adapters.machine.environment import SglangInfo

    monkeypatch.setattr(sr, "sglang_installed", lambda: False)
    monkeypatch.setattr(doc, "sglang_info", lambda: SglangInfo(installed=False))
    prof = _profile('tp-size = "two"')
    report = run_doctor(prof, runner_path=RUNNERS / "unpatched_0.5.23.py")
    found = {f.code: f for f in report.findings}
    assert found["launch-invalid"].severity == "blocking" and "'two'" in found["launch-invalid"].message
    assert report.resolved_prefill is None


def test_effective_prefill_backend_follows_the_model():
    from bcgtune.adapters.sglang.flags import effective_prefill_backend

    assert effective_prefill_backend({}, "cuda") == ("breakable", False)
    assert effective_prefill_backend({}, "rocm") == ("disabled", False)
    assert effective_prefill_backend({"cuda_graph_backend_prefill": "breakable"}, "rocm") == ("breakable", True)
    assert effective_prefill_backend({"enable_two_batch_overlap": True}, "cuda") == ("disabled", False)
    assert effective_prefill_backend({"disable_prefill_cuda_graph": True}, "cuda") == ("disabled", True)


# ------------------------------------------------------------------ launches that would not start
def test_a_refused_launch_blocks(monkeypatch):
    prof = _profile('cuda-graph-backend-prefill = "breakable"', "[256, 512]")
    refused = PrefillCapture(
        "disabled",
        "SGLang refuses this launch",
        None,
        None,
        1,
        (),
        None,
        source=CaptureSource("sglang", "0.5.23"),
        refused="AssertionError: Flashinfer MoE A2A requires ... (srt/arg_groups/moe_hook.py:475)",
    )
    found = {f.code: f for f in profile_findings(prof, _gate("patched"), resolved=refused)}
    assert set(found) == {"launch-refused"} and found["launch-refused"].severity == "blocking"
    assert "would not start" in found["launch-refused"].message and "moe_hook.py:475" in found["launch-refused"].message


def test_the_model_blocks_a_launch_it_knows_sglang_refuses(tmp_path):
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "max_position_embeddings": 4096}))
    prof = _profile("context-length = 8192", model=str(model))
    found = {f.code: f for f in profile_findings(prof, _gate("patched"))}  # bcgtune's model
    assert found["launch-refused"].severity == "blocking" and "4096" in found["launch-refused"].message


def test_an_unimportable_runner_blocks_with_or_without_a_profile():
    from bcgtune.services.doctor import _runner_findings

    why = "the runner module does not import: ImportError: cannot import name 'x' from 'sglang.srt.utils'"
    runner = RunnerAnswers(False, False, {}, why, stops_server=True)
    (f,) = _runner_findings(gate_report(runner, "r.py"), runner)
    assert (f.severity, f.code) == ("blocking", "runner-does-not-import") and "would not start" in f.message
    # a module this machine lacks may be there on the server: not checked, never a verdict
    runner = RunnerAnswers(False, False, {}, "the runner module does not import: ModuleNotFoundError: x", stops_server=False)
    g = gate_report(runner, "r.py")
    assert _runner_findings(g, runner) == [] and g.state == "not checked"


@pytest.mark.sglang
def test_cli_doctor_blocks_what_sglang_refuses_and_a_runner_it_cannot_import(tmp_path, capsys, sglang_probe, monkeypatch):
    monkeypatch.chdir(tmp_path)
    model = tmp_path / "models" / "plain"
    model.mkdir(parents=True)
    (model / "config.json").write_text((PROBE_CONFIG_DIR / "config.json").read_text())
    prof = tmp_path / "p.toml"
    # a relative model folder: SGLang is asked from another working directory
    prof.write_text(
        '[profile]\nname = "p"\nplatform = "cuda"\nhardware = "h200"\nmodel = "models/plain"\n[server]\ncontext-length = 100000\n'
    )
    code, out, err = run_cli(
        ["doctor", "--profile", str(prof), "--runner-source", str(RUNNERS / "unimportable.py"), "--json"], capsys
    )
    assert code == 1, err
    obj = json.loads(out)
    codes = {f["code"] for f in obj["findings"] if f["severity"] == "blocking"}
    assert codes == {"launch-refused", "runner-does-not-import"}
    rp = obj["resolved_prefill"]
    assert rp["source"] == "sglang 0.5.23" and "context_length" in rp["refused"] and "model_config.py" in rp["refused"]
    assert obj["prefill_runner_gate"]["state"] == "not checked"
    # asked again: every answer from the cache, none of SGLang started
    code, out2, err = run_cli(["doctor", "--profile", str(prof), "--runner-source", str(RUNNERS / "unimportable.py")], capsys)
    assert code == 1 and "answer cached" in out2 and "asking the installed SGLang" not in err


# ------------------------------------------------------------------ DeepStack visual inputs
DEEPSTACK_VL = Path(__file__).parent / "data" / "models" / "qwen3-vl-deepstack-tiny"


def _breakable(buckets=(256, 512)):
    return PrefillCapture("breakable", "x", tuple(buckets), 8192, 1, tuple(buckets), 8192)


def test_deepstack_warning_by_behaviour_and_by_reading():
    from bcgtune.services.doctor import _deepstack_findings

    model = str(DEEPSTACK_VL)
    plain_slots = ("input_ids", "positions", "out_cache_loc", "mrope_positions", "input_embeds")
    ran = RunnerAnswers(True, True, {}, slots=plain_slots)
    (f,) = _deepstack_findings(model, ran, RUNNERS / "unpatched_0.5.23.py", _breakable())
    assert (f.severity, f.code) == ("warning", "deepstack-not-preserved")
    assert "by behaviour" in f.message and "[0, 1, 2]" in f.message
    with_slot = RunnerAnswers(True, True, {}, slots=(*plain_slots, "input_deepstack_embeds"))
    assert _deepstack_findings(model, with_slot, RUNNERS / "unpatched_0.5.23.py", _breakable()) == []
    # not run: a reading of the source, which says so
    not_run = RunnerAnswers(False, None, {}, "sglang is not installed")
    (f,) = _deepstack_findings(model, not_run, RUNNERS / "unpatched_0.5.23.py", _breakable())
    assert "reads as registering none, not run: sglang is not installed" in f.message
    assert _deepstack_findings(model, not_run, RUNNERS / "patched_with_deepstack_slot.py", _breakable()) == []
    # no DeepStack in the model, or no breakable graphs: nothing to say
    assert _deepstack_findings(str(PROBE_CONFIG_DIR), ran, None, _breakable()) == []
    off = PrefillCapture("disabled", "x", None, 8192, 1, (), 8192)
    assert _deepstack_findings(model, ran, None, off) == []


@pytest.mark.sglang
def test_cli_doctor_deepstack_by_the_runners_behaviour(tmp_path, capsys, sglang_probe):
    prof = tmp_path / "vl.toml"
    prof.write_text(
        f'[profile]\nname = "vl"\nplatform = "cuda"\nhardware = "h200"\nmodel = "{DEEPSTACK_VL}"\n'
        '[server]\ncuda-graph-backend-prefill = "breakable"\n'
    )
    code, out, err = run_cli(["doctor", "--profile", str(prof), "--json"], capsys)
    found = {f["code"]: f for f in json.loads(out)["findings"]}
    assert "by behaviour" in found["deepstack-not-preserved"]["message"], (code, err)
    code, out, err = run_cli(
        ["doctor", "--profile", str(prof), "--runner-source", str(RUNNERS / "patched_with_deepstack_slot.py"), "--json"],
        capsys,
    )
    assert "deepstack-not-preserved" not in {f["code"] for f in json.loads(out)["findings"]}, err


def test_a_list_suggest_buckets_chose_is_not_judged_without_traffic(tmp_path, capsys, monkeypatch):
    """The README's flow: suggest-buckets writes a list for a trace; doctor on that profile
    reports its gaps as information, saying it has no traffic to judge them, and nothing
    blocks or warns about them."""
    monkeypatch.chdir(tmp_path)
    sizes = [7, 508, 509, 1024, 3000, 8000] * 3
    (tmp_path / "t.json").write_text(json.dumps(sizes))
    code, _, err = run_cli(
        ["suggest-buckets", "t.json", "--max-buckets", "3", "--write-profile", "h200.toml", "--unchecked"], capsys
    )
    assert code == 0, err
    code, out, err = run_cli(["doctor", "--profile", "h200.toml", "--no-sglang-probe", "--json"], capsys)
    gap = [f for f in json.loads(out)["findings"] if f["code"] == "bucket-gap"]
    assert gap and gap[0]["severity"] == "info" and "chosen by suggest-buckets" in gap[0]["message"]


@pytest.mark.parametrize("kind", ["missing", "folder", "device", "huge"])
def test_runner_source_that_is_not_a_runner_file_is_refused(tmp_path, capsys, kind):
    target = {"missing": tmp_path / "nope.py", "folder": tmp_path, "device": Path("/dev/null")}.get(kind)
    if kind == "huge":
        target = tmp_path / "huge.py"
        with open(target, "wb") as fh:
            fh.truncate(5 * 2**20)
    code, out, err = run_cli(["doctor", "--no-sglang-probe", "--runner-source", str(target)], capsys)
    assert code == 2 and out == "", err
    line = err.strip().splitlines()[-1]
    assert line.startswith("error: ") and f"(--runner-source {target})" in line, line


def test_a_copy_is_judged_by_running_it_never_by_reading_its_class_names(tmp_path, capsys):
    """The renamed-class copy is not refused as input for what its text defines: SGLang runs
    it (or, where it cannot, the copy is not checked, with the reason: exit 5)."""
    code, out, err = run_cli(
        ["doctor", "--no-sglang-probe", "--runner-source", str(RUNNERS / "renamed_runner_class.py"), "--json"], capsys
    )
    doc = json.loads(out)
    assert code == 5 and doc["prefill_runner_gate"]["state"] == "not checked" and doc["outcome"] == "not checked", err
    assert "defines no class" not in out + err


@pytest.mark.sglang
def test_a_runner_lacking_a_name_sglang_imports_from_it_does_not_start(runner_answers):
    """The class renamed: the gate would answer, but SGLang's own runner package imports
    PrefillCudaGraphRunner from the module, so the server never starts."""
    r = runner_answers["renamed_runner_class.py"]
    assert r["imported"] is False and "PrefillCudaGraphRunner" in r["error"], r
    assert "srt/model_executor/runner/__init__.py" in r["error"]


def test_every_name_sglang_imports_from_the_runner_is_found():
    if not sglang_installed():
        pytest.skip("sglang not installed")
    from bcgtune.adapters.sglang.probe import sglang_imports_from_runner

    found = sglang_imports_from_runner()
    # the runner package's own import; the context-parallel module's is only for type checking
    assert ("PrefillCudaGraphRunner", "srt/model_executor/runner/__init__.py") in found
    assert not any(where.startswith("srt/layers/cp/") for _, where in found)
