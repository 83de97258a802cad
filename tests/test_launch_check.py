"""Never a false "ok": every answer about a launch is SGLang's, or says it is not.

doctor's three outcomes (checked and ok: exit 0; blocking: 1; not checked: 5, never
"ok": true) with how to get SGLang's answer; the same launch_check wherever a launch is
judged; a launch SGLang refuses is an error (exit 2, its reason quoted) in every command
that prices or writes it, whether SGLang said so or bcgtune's model of its refusal rules
did. SGLang itself is replaced by a stand-in probe here; the model's refusal rules are
compared with SGLang 0.5.23's own answers in tests/test_sglang_resolve.py (marked sglang).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import tomli_w
from proc_helpers import run_cli

import bcgtune.adapters.sglang.resolve as sr
from bcgtune.adapters.machine.hardware import gpu_for
from bcgtune.adapters.sglang.resolve import PROBE_CONFIG_DIR
from bcgtune.files.profile_file import parse_profile
from bcgtune.services.launch import model_capture

MODELS = Path(__file__).parent / "data" / "models"
MODEL = {
    "plain": PROBE_CONFIG_DIR,
    "dsv3": MODELS / "deepseek-v3-tiny",
    "moe": MODELS / "qwen3-moe-tiny",
}

# Launches SGLang 0.5.23 refuses, with the start of its own reason (its answers, asked on a
# CPU machine with the GPU answered as that GPU: tests/test_sglang_resolve.py asks again
# where sglang is installed)
REFUSED = [
    ("h100", "plain", {"attention-backend": "trtllm_mla"}, "TRTLLM MLA backend is only supported on Blackwell GPUs"),
    (
        "h200",
        "dsv3",
        {"moe-a2a-backend": "mori", "cuda-graph-backend-prefill": "breakable"},
        "SGLANG_MORI_NUM_MAX_DISPATCH_TOKENS_PER_RANK (default 4096) must be >=",
    ),
    ("h200", "moe", {"moe-a2a-backend": "mori"}, "SGLANG_MORI_NUM_MAX_DISPATCH_TOKENS_PER_RANK (default 4096) must be >="),
    (
        "h200",
        "plain",
        {"tp-size": 4, "moe-a2a-backend": "flashinfer_megamoe", "cuda-graph-backend-prefill": "breakable"},
        "FlashInfer MegaMOE is not validated for model architectures ['Qwen3ForCausalLM']",
    ),
    (
        "h200",
        "dsv3",
        {"enable-single-batch-overlap": True, "tp-size": 4, "moe-a2a-backend": "deepep"},
        "SBO (single batch overlap) is not supported on SM90 GPUs",
    ),
    ("h200", "moe", {"tp-size": 2, "moe-a2a-backend": "pplx"}, "moe_a2a_backend='pplx' requires attention DP"),
]


def _profile_text(hw: str, model: str, server: dict, buckets: list[int] | None = None) -> str:
    doc = {
        "profile": {"name": "t", "platform": gpu_for(hw).platform, "hardware": hw, "model": str(MODEL[model])},
        "server": server,
    }
    if buckets:
        doc["buckets"] = {"list": buckets}
    return tomli_w.dumps(doc)


@pytest.mark.parametrize("hw, model, server, reason", REFUSED)
def test_the_model_refuses_what_sglang_refuses(hw, model, server, reason):
    cap = model_capture(parse_profile(_profile_text(hw, model, server), "t.toml"))
    assert cap.refused is not None and cap.refused.startswith(reason), cap.refused
    assert not cap.graphs_on and cap.launch_check == "not checked"


def test_the_rules_stop_where_sglang_accepts():
    # the chunk per rank within MoRI's buffer: accepted (graphs off: mori is not validated for them)
    cap = model_capture(
        parse_profile(_profile_text("h200", "moe", {"moe-a2a-backend": "mori", "chunked-prefill-size": 4096}), "t")
    )
    assert cap.refused is None and not cap.graphs_on
    # a larger buffer from the launch's environment
    text = (
        _profile_text("h200", "moe", {"moe-a2a-backend": "mori"})
        + '[env]\nSGLANG_MORI_NUM_MAX_DISPATCH_TOKENS_PER_RANK = "8192"\n'
    )
    assert model_capture(parse_profile(text, "t")).refused is None
    # trtllm_mla on a Blackwell GPU, single-batch overlap off SM90
    assert model_capture(parse_profile(_profile_text("b200", "dsv3", {"attention-backend": "trtllm_mla"}), "t")).refused is None
    assert model_capture(parse_profile(_profile_text("b200", "dsv3", {"enable-single-batch-overlap": True}), "t")).refused is None
    # a MegaMOE architecture SGLang validated: accepted here, its other checks named
    cap = model_capture(parse_profile(_profile_text("h200", "moe", {"tp-size": 2, "moe-a2a-backend": "flashinfer_megamoe"}), "t"))
    assert cap.refused is None and any("flashinfer_megamoe" in u for u in cap.unchecked)


# ------------------------------------------------------------------ refused: an error wherever it is priced
@pytest.fixture
def trace_file(tmp_path):
    p = tmp_path / "t.json"
    p.write_text(json.dumps([100, 200, 300, 700, 1500, 3000] * 5))
    return p


@pytest.mark.parametrize("hw, model, server, reason", [REFUSED[2], REFUSED[0]])
def test_suggest_drift_and_serve_refuse_a_refused_launch(tmp_path, capsys, trace_file, hw, model, server, reason):
    prof = tmp_path / "p.toml"
    prof.write_text(_profile_text(hw, model, server, [256, 512]))
    for args in (
        ["suggest-buckets", str(trace_file), "--base-profile", str(prof), "--write-profile", str(tmp_path / "out.toml")],
        ["suggest-buckets", str(trace_file), "--write-profile", str(prof)],
        ["drift", "--profile", str(prof), "--trace", str(trace_file)],
        ["serve", "--profile", str(prof), "--dry-run", "--no-sglang-probe"],
    ):
        code, out, err = run_cli(args, capsys)
        line = err.strip().splitlines()[-1]
        assert code == 2 and out == "", (args, code, out, err)
        assert line.startswith("error: SGLang refuses this launch, the server would not start: " + reason), line
        assert "bcgtune's model of SGLang's checks; not checked by SGLang" in line
    assert not (tmp_path / "out.toml").exists()


def _refusing_probe(reason: str):
    def probe(request, timeout=0, **_):
        n = len(request.get("launches", []))
        return {
            "sglang_version": "0.5.23",
            "launches": [{"ok": False, "refused": f"AssertionError: {reason}", "where": "srt/arg_groups/moe_hook.py:567"}] * n,
            "files": {"launches": []},
        }

    return probe


def test_sglangs_own_refusal_is_an_error_not_graphs_off(tmp_path, capsys, monkeypatch, trace_file):
    """--ask-sglang: SGLang refuses the launch; suggest-buckets quotes it and exits 2."""
    monkeypatch.setattr(sr, "sglang_installed", lambda: True)
    monkeypatch.setenv("BCGTUNE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("BCGTUNE_SGLANG_PROBE", raising=False)
    monkeypatch.setattr(sr, "run_probe", _refusing_probe("SGLANG_MORI_NUM_MAX_DISPATCH_TOKENS_PER_RANK (default 4096)"))
    prof = tmp_path / "p.toml"
    prof.write_text(_profile_text("h200", "moe", {"moe-a2a-backend": "mori"}))
    out_prof = tmp_path / "out.toml"
    args = ["suggest-buckets", str(trace_file), "--base-profile", str(prof), "--write-profile", str(out_prof), "--ask-sglang"]
    code, out, err = run_cli(args, capsys)
    line = err.strip().splitlines()[-1]
    assert code == 2 and "graphs are off" not in out + err
    assert "SGLang refuses this launch" in line and "SGLANG_MORI_NUM_MAX_DISPATCH_TOKENS_PER_RANK" in line
    assert "[SGLang 0.5.23's own answer]" in line and not out_prof.exists()


# ------------------------------------------------------------------ doctor's three outcomes
GATE_OK = {"image_spec_off": True, "image_spec_on": False, "text_spec_off": True, "text_spec_on": True}


def _answering_probe(*, timed_out: bool = False):
    def probe(request, timeout=0, **_):
        probe.timeouts.append(timeout)
        if timed_out:
            return {"error": f"{sr.TIMED_OUT} {timeout:g} s"}
        out: dict = {"sglang_version": "0.5.23", "files": {}}
        out["launches"] = [
            {"ok": True, "backend": "breakable", "bs": [256, 512], "captured": [256, 512], "max_bs": 8192, "alignment": 1,
             "chunked_prefill_size": 8192, "messages": []}
            for _ in request.get("launches", [])
        ]  # fmt: skip
        if "flags" in request:
            out["flags"] = {"ok": True}
        if "runners" in request:
            out["runners"] = [
                {"ok": True, "imported": True, "answers": GATE_OK, "slots": []} for _ in request["runners"]["sources"]
            ]
        return out

    probe.timeouts = []
    return probe


@pytest.fixture
def asked(monkeypatch, tmp_path):
    monkeypatch.setattr(sr, "sglang_installed", lambda: True)
    monkeypatch.setenv("BCGTUNE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("BCGTUNE_SGLANG_PROBE", raising=False)
    prof = tmp_path / "p.toml"
    prof.write_text(_profile_text("h200", "plain", {}, [256, 512]))
    return prof


def test_doctor_checked_and_ok_exits_0(asked, capsys, monkeypatch):
    monkeypatch.setattr(sr, "run_probe", _answering_probe())
    # the runner named (without sglang installed doctor finds none of its own to ask about)
    runner = Path(__file__).parent / "data" / "runner" / "patched_as_proposed.py"
    code, out, err = run_cli(["doctor", "--profile", str(asked), "--runner-source", str(runner), "--json"], capsys)
    doc = json.loads(out)
    assert code == 0, err
    assert (doc["outcome"], doc["ok"], doc["launch_check"], doc["not_checked"]) == ("ok", True, "checked", [])


def test_doctor_timed_out_is_not_checked_exit_5_never_ok(asked, capsys, monkeypatch):
    probe = _answering_probe(timed_out=True)
    monkeypatch.setattr(sr, "run_probe", probe)
    code, out, err = run_cli(["doctor", "--profile", str(asked), "--json", "--probe-timeout", "7"], capsys)
    doc = json.loads(out)
    assert code == 5 and probe.timeouts == [7.0]
    assert (doc["outcome"], doc["ok"], doc["launch_check"]) == ("not checked", False, "not checked")
    assert any("SGLang did not answer within 7 s" in n for n in doc["not_checked"])
    assert any("--probe-timeout SECONDS (this run allowed 7 s" in h for h in doc["how_to_check"])
    assert doc["resolved_prefill"]["launch_check"] == "not checked"
    # the text says so too, and the exit line names the outcome
    code, out, err = run_cli(["doctor", "--profile", str(asked)], capsys)
    assert code == 5 and "outcome  NOT CHECKED" in out and "to check: give SGLang longer: --probe-timeout" in out
    assert err.strip().splitlines()[-1].startswith("error: not checked:")


def test_probe_timeout_from_the_environment(asked, capsys, monkeypatch):
    probe = _answering_probe(timed_out=True)
    monkeypatch.setattr(sr, "run_probe", probe)
    monkeypatch.setenv("BCGTUNE_PROBE_TIMEOUT", "11")
    code, _, _ = run_cli(["doctor", "--profile", str(asked), "--json"], capsys)
    assert code == 5 and probe.timeouts == [11.0]
    monkeypatch.setenv("BCGTUNE_PROBE_TIMEOUT", "soon")
    code, out, err = run_cli(["doctor", "--profile", str(asked)], capsys)
    assert code == 2 and "BCGTUNE_PROBE_TIMEOUT" in err
    code, out, err = run_cli(["doctor", "--profile", str(asked), "--probe-timeout", "0"], capsys)
    assert code == 2 and "(--probe-timeout)" in err


def test_doctor_blocking_wins_over_not_checked(asked, capsys, tmp_path):
    """SGLang not asked, and the model knows SGLang refuses the launch: blocking (1)."""
    prof = tmp_path / "r.toml"
    prof.write_text(_profile_text("h200", "moe", {"moe-a2a-backend": "mori"}))
    code, out, err = run_cli(["doctor", "--profile", str(prof), "--no-sglang-probe", "--json"], capsys)
    doc = json.loads(out)
    assert code == 1 and doc["outcome"] == "blocking" and doc["ok"] is False and doc["not_checked"]
    assert any(f["code"] == "launch-refused" for f in doc["findings"])


def test_drift_and_suggest_json_say_whether_sglang_checked(tmp_path, capsys, trace_file):
    prof = tmp_path / "p.toml"
    prof.write_text(_profile_text("h200", "plain", {}, [256, 512, 1024, 4096]))
    code, out, err = run_cli(["drift", "--profile", str(prof), "--trace", str(trace_file), "--json"], capsys)
    doc = json.loads(out)
    assert code in (0, 1) and doc["launch_check"] == "not checked" and doc["launch_check_reason"]
    out_prof = tmp_path / "w.toml"
    args = ["suggest-buckets", str(trace_file), "--base-profile", str(prof), "--write-profile", str(out_prof)]
    code, out, err = run_cli([*args, "--json"], capsys)
    doc = json.loads(out)
    assert code == 0 and doc["launch_check"] == "not checked" and doc["launch_capture"]["launch_check"] == "not checked"
    # the profile written from an unchecked launch says so, in the file and on the terminal
    out_prof.unlink()
    code, out, err = run_cli(args, capsys)
    assert code == 0 and "NOT CHECKED by SGLang" in out.splitlines()[0] and "launch NOT CHECKED by SGLang" in err
    written = parse_profile(out_prof.read_text(), str(out_prof))
    assert written.provenance["launch_check"].startswith("not checked: ")


def test_every_printed_estimate_of_a_first_answer_is_the_measured_one():
    """The help and messages quote one figure, sglang_resolve.PROBE_TIME_TEXT (measured:
    benchmarks/RESULTS.md)."""
    import re

    root = Path(__file__).resolve().parents[1] / "bcgtune"
    figures = {}
    for path in (root / "cli").rglob("*.py"):
        for m in re.finditer(r"\b(\d+-\d+ s)\b", path.read_text(encoding="utf-8")):
            figures[str(path.relative_to(root))] = m.group(1)
    assert len(figures) >= 4 and set(figures.values()) == {sr.PROBE_TIME_TEXT}, figures


def test_drift_reads_the_profiles_local_model(tmp_path, capsys, trace_file):
    """A profile whose model is a local folder with Qwen2.5-VL's config: SGLang keeps that
    architecture off its breakable-prefill allowlist, so drift has no graphs to judge, and
    says why (it does not re-tune a list that is never captured)."""
    prof = tmp_path / "vl.toml"
    prof.write_text(
        tomli_w.dumps(
            {
                "profile": {"name": "vl", "platform": "cuda", "hardware": "h100", "model": str(MODELS / "qwen2.5-vl-tiny")},
                "buckets": {"list": [256, 512, 1024]},
            }
        )
    )
    code, out, err = run_cli(["drift", "--profile", str(prof), "--trace", str(trace_file)], capsys)
    assert code == 2 and "RE-TUNE" not in out.upper()
    assert "runs no prefill graphs" in err and "Qwen2_5_VLForConditionalGeneration" in err


def test_serve_stops_before_starting_a_launch_sglang_refuses(tmp_path, capsys, monkeypatch):
    """serve (not a dry run) resolves the launch in the child that checks its flags: SGLang's
    own refusal stops it before a server start that would fail minutes later."""
    monkeypatch.setattr(sr, "sglang_installed", lambda: True)
    monkeypatch.setenv("BCGTUNE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("BCGTUNE_SGLANG_PROBE", raising=False)
    refusing = _refusing_probe("SGLANG_MORI_NUM_MAX_DISPATCH_TOKENS_PER_RANK (default 4096)")

    def probe(request, timeout=0, **_):
        out = refusing(request, timeout)
        if "flags" in request:
            out["flags"] = {"ok": True}
        return out

    monkeypatch.setattr(sr, "run_probe", probe)
    started = []
    import bcgtune.services.serve as serve_service

    monkeypatch.setattr(serve_service, "run_server", lambda *a, **k: started.append(a))
    prof = tmp_path / "p.toml"
    prof.write_text(_profile_text("h200", "moe", {"moe-a2a-backend": "mori"}))
    code, out, err = run_cli(["serve", "--profile", str(prof), "--log-file", str(tmp_path / "s.log")], capsys)
    assert code == 2 and not started, err
    assert "SGLang refuses this launch" in err and "[SGLang 0.5.23's own answer]" in err


# ------------------------------------------------------------------ the classes the model learned
# (launches SGLang 0.5.23 refuses or turns graphs off for, with the start of its reason; the
# differential test holds the model to SGLang's live answers over 2,000 such launches)
LEARNED_REFUSALS = [
    ("h200", "plain", {"tp-size": 2, "moe-a2a-backend": "deepep_v2"}, "DeepEP v2 MoE is not validated for 'Qwen3ForCausalLM'"),
    ("h200", "moe", {"tp-size": 2, "moe-a2a-backend": "deepep_v2"}, "DeepEP v2 per-rank prefill budget exceeds"),
    ("a100", "plain", {"attention-backend": "trtllm_mha"}, "TRTLLM MHA backend for prefill requires Hopper (SM90)"),
    ("mi300x", "plain", {"decode-attention-backend": "trtllm_mha"}, "TRTLLM MHA backend for decode is only supported"),
    ("mi300x", "plain", {"enable-prefill-cp": True, "cp-strategy": "zigzag"}, "Prefill CP on HIP (ROCm) is only supported"),
    ("h200", "plain", {"enable-prefill-cp": True}, "--cp-strategy must be set when --enable-prefill-cp is enabled"),
    ("h200", "plain", {"cp-strategy": "ring"}, "SGLang's parser refused the launch: argument --cp-strategy: invalid choice"),
]


@pytest.mark.parametrize("hw, model, server, reason", LEARNED_REFUSALS)
def test_the_model_knows_the_refusals_it_learned(hw, model, server, reason):
    cap = model_capture(parse_profile(_profile_text(hw, model, server), "t.toml"))
    assert cap.refused is not None and cap.refused.startswith(reason), cap.refused
    # each cites SGLang's file and function
    assert ".py" in cap.refused and ("prepare_server_args" in cap.refused or "_hook.py, " in cap.refused), cap.refused


def test_the_model_knows_where_sglang_keeps_or_drops_prefill_cp_graphs():
    def cap(hw, server):
        return model_capture(parse_profile(_profile_text(hw, "plain", server), "t.toml"))

    # prefill CP over the whole TP group with a strategy and backend SGLang has no breakable graphs for: off
    c = cap("h200", {"tp-size": 2, "attn-cp-size": 2, "enable-prefill-cp": True, "cp-strategy": "zigzag"})
    assert c.refused is None and not c.graphs_on and "prefill context parallelism" in c.reason and not c.unchecked
    # zigzag with TRTLLM MHA on an SM100 GPU: SGLang's validated pair keeps them
    c = cap(
        "b200",
        {"tp-size": 2, "attn-cp-size": 2, "enable-prefill-cp": True, "cp-strategy": "zigzag", "attention-backend": "trtllm_mha"},
    )
    assert c.refused is None and c.graphs_on and c.backend == "breakable"
    # without attention CP the breakable graphs stay
    assert cap("h200", {"tp-size": 2, "enable-prefill-cp": True, "cp-strategy": "zigzag"}).graphs_on


def test_a_profile_given_is_priced_never_ignored(tmp_path, capsys, trace_file):
    """suggest-buckets --base-profile without --write-profile prices that profile's launch:
    a refused one is exit 2, --json included, and a plain one is priced as that profile."""
    refused = tmp_path / "r.toml"
    refused.write_text(_profile_text("h200", "moe", {"moe-a2a-backend": "mori"}))
    code, out, err = run_cli(["suggest-buckets", str(trace_file), "--base-profile", str(refused), "--json"], capsys)
    assert code == 2 and out == "" and "SGLang refuses this launch" in err and "MORI" in err
    plain = tmp_path / "p.toml"
    plain.write_text(_profile_text("h200", "plain", {"chunked-prefill-size": 4096}))
    code, out, err = run_cli(["suggest-buckets", str(trace_file), "--base-profile", str(plain), "--json"], capsys)
    doc = json.loads(out)
    assert code == 0 and doc["launch_capture"]["chunked_prefill_size"] == 4096, err


def test_write_profile_writes_only_what_was_checked_or_vouched_for(tmp_path, capsys, trace_file):
    """Without SGLang: a launch the model names an unchecked rule for is written only with
    --unchecked, and the file says so; one the model checks whole is written, saying SGLang
    did not check it."""
    named = tmp_path / "named.toml"  # speculative decoding: rules the model does not evaluate
    named.write_text(_profile_text("h200", "plain", {"speculative-algorithm": "NGRAM"}))
    out_prof = tmp_path / "out.toml"
    args = ["suggest-buckets", str(trace_file), "--base-profile", str(named), "--write-profile", str(out_prof)]
    for extra in ([], ["--json"]):
        code, out, err = run_cli([*args, *extra], capsys)
        assert code == 2 and out == "" and not out_prof.exists(), err
        assert "nothing written" in err and "speculative_hook.py" in err and "--unchecked" in err
    code, out, err = run_cli([*args, "--unchecked"], capsys)
    assert code == 0 and parse_profile(out_prof.read_text(), "o").provenance["launch_check"].startswith("not checked: ")
    vouched = tmp_path / "v.toml"
    vouched.write_text(_profile_text("h200", "plain", {}))
    out2 = tmp_path / "out2.toml"
    code, out, err = run_cli(
        ["suggest-buckets", str(trace_file), "--base-profile", str(vouched), "--write-profile", str(out2), "--no-sglang-probe"],
        capsys,
    )
    assert code == 0, err
    assert "NOT CHECKED by SGLang" in out.splitlines()[0] and "--no-sglang-probe" in out.splitlines()[0]
    assert parse_profile(out2.read_text(), "o").provenance["launch_check"].startswith("not checked: ")
    code, out, err = run_cli(["suggest-buckets", str(trace_file), "--unchecked"], capsys)
    assert code == 2 and "(--unchecked)" in err


def test_one_cache_key_per_launch_whatever_the_profile_paths_spelling(tmp_path, monkeypatch):
    from bcgtune.adapters.sglang.launcher import build_server_command
    from bcgtune.files.profile_file import load_profile

    (tmp_path / "p.toml").write_text(_profile_text("h200", "plain", {"tp-size": 2}))
    monkeypatch.chdir(tmp_path)
    relative, absolute = load_profile("p.toml"), load_profile(str(tmp_path / "p.toml"))
    cmds = [build_server_command(p) for p in (relative, absolute)]
    assert cmds[0].sources[1].origin != cmds[1].sources[1].origin  # the spelling shows in messages...
    assert sr.flags_question(cmds[0]).key == sr.flags_question(cmds[1]).key  # ...not in the key
    # the answer names the flag as the command asking spells it
    answer = sr.Answer({"ok": False, "message": "bad", "where": "source #1"})
    assert sr._flag_answer(answer, cmds[1]).where == cmds[1].sources[1].origin
    # the model's config by its content: a copy elsewhere has the same digest
    copy = tmp_path / "copy"
    copy.mkdir()
    (copy / "config.json").write_text((PROBE_CONFIG_DIR / "config.json").read_text())
    assert sr.config_digest(copy) == sr.config_digest(PROBE_CONFIG_DIR)


def test_capture_and_validate_run_what_the_profiles_launch_captures(tmp_path, capsys):
    """--profile on the engine commands prices the profile's launch: a launch SGLang refuses
    is exit 2 before anything is built, one that captures nothing too, and the buckets run
    are the ones it captures."""
    refused = tmp_path / "r.toml"
    refused.write_text(_profile_text("h200", "moe", {"moe-a2a-backend": "mori"}, [256, 512]))
    for cmd in ("capture", "validate"):
        code, out, err = run_cli([cmd, "--profile", str(refused), "--model", "tiny", "--device", "cpu"], capsys)
        assert code == 2 and "SGLang refuses this launch" in err, (cmd, err)
    off = tmp_path / "off.toml"
    off.write_text(_profile_text("mi300x", "plain", {}, [256, 512]))  # breakable graphs are opt-in on ROCm
    code, out, err = run_cli(["capture", "--profile", str(off), "--model", "tiny", "--device", "cpu"], capsys)
    assert code == 2 and "captures no prefill graphs" in err, err
    from bcgtune.cli.commands.engine import _bucket_list

    aligned = tmp_path / "a.toml"  # two-batch overlap: SGLang rounds each bucket up to a multiple of 2
    aligned.write_text(
        _profile_text("h200", "plain", {"enable-two-batch-overlap": True, "cuda-graph-backend-prefill": "full"}, [255, 512])
    )
    assert _bucket_list(None, str(aligned), quiet=True) == [256, 512]


def test_the_wait_for_sglangs_first_answer_is_shown(monkeypatch):
    """A first answer takes 10-20 s: the seconds waited reach the command's progress display
    (a bar on a terminal, nothing in a pipe: cli.console.Sayer)."""
    seen = []

    class Bar:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return None

        def update(self, seconds, total=None):
            seen.append(seconds)

    def say(text):
        seen.append(text)

    say.waiting = lambda label: Bar()  # type: ignore[attr-defined]

    def probe(request, timeout=0, tick=None, **_):
        for s in (0.5, 1.0, 1.5):
            tick(s)
        return {"sglang_version": "0.5.23"}

    monkeypatch.setattr(sr, "run_probe", probe)
    assert sr._probe_with_progress({}, 30.0, say) == {"sglang_version": "0.5.23"}
    assert seen == [0.5, 1.0, 1.5]
    # the real wait ticks while the child runs, and stops it past the limit
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    ticks = []
    with pytest.raises(subprocess.TimeoutExpired):
        sr._wait(proc, 1.2, ticks.append)
    proc.kill()
    proc.wait()
    assert ticks and all(0 < t < 2 for t in ticks)
