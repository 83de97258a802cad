"""`bcgtune doctor`: the runner-gate classification on the real sglang 0.5.23 source and
on a copy patched as shared/seeds/000 describes, plus absent/unknown; profile findings;
exit codes and --json."""

import json
from pathlib import Path

import pytest

from bcgtune.adapters.doctor import (
    find_runner_source,
    model_is_qwen4_exp,
    profile_findings,
    runner_gate_state,
    sglang_info,
)
from bcgtune.adapters.profiles import load_profile, parse_profile
from bcgtune.cli.app import main
from proc_helpers import run_cli

UNPATCHED_INIT = "self._qwen_bcg_mtp_draft = qwen_bcg and model_runner.is_draft_worker"
PATCHED_INIT = "self._qwen_bcg_multimodal_eager = (\n            qwen_bcg and model_runner.spec_algorithm.is_speculative()\n        )"
UNPATCHED_GATE = """        if contains_mm_inputs and (
            self._qwen_bcg_hc_sidechannel or self._qwen_bcg_mtp_draft
        ):
            return False"""
PATCHED_GATE = """        if contains_mm_inputs and self._qwen_bcg_multimodal_eager:
            return False"""


@pytest.fixture(scope="module")
def real_runner() -> Path:
    info = sglang_info()
    if not info.get("installed"):
        pytest.skip("sglang not installed")
    path = find_runner_source(info["path"])
    if info.get("version") != "0.5.23":
        pytest.skip(f"needs sglang 0.5.23, found {info.get('version')}")
    return path


def test_real_0_5_23_runner_is_unpatched(real_runner):
    g = runner_gate_state(real_runner)
    assert g.state == "unpatched" and "_qwen_bcg_hc_sidechannel" in g.detail and g.path == str(real_runner)


def _patched_copy(real_runner, tmp_path) -> Path:
    src = real_runner.read_text()
    assert src.count(UNPATCHED_INIT) == 1 and src.count(UNPATCHED_GATE) == 1
    out = tmp_path / "prefill_cuda_graph_runner.py"
    out.write_text(src.replace(UNPATCHED_INIT, PATCHED_INIT).replace(UNPATCHED_GATE, PATCHED_GATE))
    return out


def test_patched_copy(real_runner, tmp_path):
    g = runner_gate_state(_patched_copy(real_runner, tmp_path))
    assert g.state == "patched", g.detail


def test_patched_flag_not_from_speculative_is_unknown(real_runner, tmp_path):
    p = _patched_copy(real_runner, tmp_path)
    p.write_text(p.read_text().replace("model_runner.spec_algorithm.is_speculative()", "True"))
    assert runner_gate_state(p).state == "unknown"


def test_absent_gate(tmp_path):
    p = tmp_path / "r.py"
    p.write_text(
        "class PrefillCudaGraphRunner:\n"
        "    def __init__(self, model_runner):\n        self.x = 1\n"
        "    def can_replay_locally(self, *, contains_mm_inputs=False, num_tokens=None):\n"
        "        if num_tokens is None:\n            return True\n        return True\n"
    )
    assert runner_gate_state(p).state == "absent"


@pytest.mark.parametrize(
    "text, detail",
    [
        (None, "not found"),
        ("def broken(:\n", "cannot parse"),
        ("class Other:\n    pass\n", "PrefillCudaGraphRunner not found"),
        ("class PrefillCudaGraphRunner:\n    def __init__(self):\n        pass\n", "can_replay_locally"),
        (
            "class PrefillCudaGraphRunner:\n"
            "    def __init__(self, mr):\n        self._qwen_bcg_new = True\n"
            "    def can_replay_locally(self, *, contains_mm_inputs=False):\n"
            "        if contains_mm_inputs and self._qwen_bcg_new:\n            return False\n        return True\n",
            "unrecognized gate",
        ),
    ],
)
def test_unknown_cases(tmp_path, text, detail):
    p = tmp_path / "r.py"
    if text is not None:
        p.write_text(text)
    g = runner_gate_state(p)
    assert g.state == "unknown" and detail in g.detail
    assert runner_gate_state(None).state == "unknown"


# ------------------------------------------------------------------ profile findings
def _gate(state):
    from bcgtune.adapters.doctor import GateReport

    return GateReport(state, "", None)


def _codes(findings):
    return {(f.severity, f.code) for f in findings}


def _profile(server="", buckets="", platform="cuda", model="amd/Qwen3.8-Flash-Next-Quark-MXFP4"):
    text = f'[profile]\nname = "t"\nplatform = "{platform}"\nmodel = "{model}"\n[server]\n{server}\n'
    if buckets:
        text += f"[buckets]\nlist = {buckets}\n"
    return parse_profile(text, "t.toml")


def test_mi355x_findings_by_gate():
    prof = load_profile("mi355x")
    assert _codes(profile_findings(prof, _gate("unpatched"))) == {("blocking", "qwen-mm-unpatched-runner")}
    assert profile_findings(prof, _gate("patched")) == []  # seeds' list: no gaps, alignment 1
    assert _codes(profile_findings(prof, _gate("unknown"))) == {("warning", "qwen-mm-gate-unknown")}


def test_speculative_warning_even_when_patched():
    prof = _profile('cuda-graph-backend-prefill = "breakable"\nspeculative-algorithm = "NGRAM"')
    assert ("warning", "speculative-mm-eager") in _codes(profile_findings(prof, _gate("patched")))


def test_rocm_backend_not_explicit():
    prof = _profile("tp-size = 2", "[256, 512]", platform="rocm")
    assert _codes(profile_findings(prof, _gate("patched"))) == {("blocking", "rocm-prefill-backend-unset")}
    prof = _profile("tp-size = 2", platform="rocm")
    assert _codes(profile_findings(prof, _gate("patched"))) == {("warning", "rocm-prefill-backend-unset")}
    prof = _profile("cuda-graph-config = '{\"prefill\": {\"backend\": \"breakable\"}}'", platform="rocm")
    assert profile_findings(prof, _gate("patched")) == []


def test_bucket_gap_and_alignment():
    prof = _profile("tp-size = 8\nattn-dp-size = 2", "[102, 256, 1024]", model="meta-llama/Llama-3.1-8B")
    found = {f.code: f for f in profile_findings(prof, _gate("unpatched"))}
    assert set(found) == {"bucket-gap", "bucket-alignment", "model-unknown"}
    assert found["model-unknown"].severity == "info"
    assert "256->1024 (sizes 257..511 run eager)" in found["bucket-gap"].message
    assert "[102]" in found["bucket-alignment"].message and "multiples of 4" in found["bucket-alignment"].message
    assert "[102, 256, 1024]" not in found["bucket-alignment"].message


def test_model_detection(tmp_path):
    assert model_is_qwen4_exp("amd/Qwen3.8-Flash-Next-Quark-MXFP4") is True
    assert model_is_qwen4_exp("meta-llama/Llama-3.1-8B") is None
    d = tmp_path / "m"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    assert model_is_qwen4_exp(str(d)) is False
    (d / "config.json").write_text(json.dumps({"architectures": ["Qwen4ExpForConditionalGeneration"]}))
    assert model_is_qwen4_exp(str(d)) is True


# ------------------------------------------------------------------ CLI


def test_cli_json_and_exit_codes(real_runner, tmp_path, capsys):
    code, out, err = run_cli(["doctor", "--profile", "mi355x", "--json"], capsys)
    assert code == 1 and "error: 1 blocking finding: qwen-mm-unpatched-runner (doctor)" in err
    obj = json.loads(out)
    assert obj["ok"] is False and obj["prefill_runner_gate"]["state"] == "unpatched"
    assert obj["sglang"]["version"] == "0.5.23" and obj["profile"] == "mi355x"
    assert obj["findings"][0]["severity"] == "blocking"

    patched = _patched_copy(real_runner, tmp_path)
    code, out, err = run_cli(["doctor", "--profile", "mi355x", "--runner-source", str(patched)], capsys)
    assert code == 0, err
    assert "prefill runner multimodal gate: patched" in out and "no findings" in out

    code, out, _ = run_cli(["doctor"], capsys)
    assert code == 0 and "sglang   0.5.23" in out
