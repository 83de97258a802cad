"""suggest-buckets and drift price a launch with SGLang's own answer when it has one (from
the answer cache, or asked with --ask-sglang), capture filter included, and otherwise with
bcgtune's model, saying which answered and what was not checked. A launch whose prefill
graphs are off is priced as nothing captured."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from proc_helpers import run_cli

import bcgtune.adapters.sglang.resolve as sr
from bcgtune.adapters.sglang.resolve import PROBE_CONFIG_DIR
from bcgtune.core.sglang.ladder import sglang_default_ladder
from bcgtune.core.trace.prefill_trace import PrefillTrace
from bcgtune.services.suggest import SuggestRequest, suggest

DATA = Path(__file__).parent / "data"


def _trace_file(tmp_path) -> Path:
    sizes = [100, 200, 300, 700, 1500, 3000, 3500, 4000] * 5  # within the fake answer's chunk (4,096)
    p = tmp_path / "t.json"
    p.write_text(json.dumps(sizes))
    return p


LADDER_4096 = sglang_default_ladder(4096)


def _fake(captured: list[int], max_bs: int):
    def probe(request, timeout=0, **_):
        out = {"sglang_version": "0.5.23", "files": {"launches": []}}
        out["launches"] = [
            {
                "ok": True,
                "backend": "breakable",
                "bs": captured,
                "captured": captured,
                "max_bs": max_bs,
                "alignment": 1,
                "chunked_prefill_size": max_bs,
                "messages": [],
            }
            for _ in request.get("launches", [])
        ]
        probe.calls += 1
        return out

    probe.calls = 0
    return probe


@pytest.fixture
def fake_probe(monkeypatch, tmp_path):
    monkeypatch.setattr(sr, "sglang_installed", lambda: True)
    monkeypatch.setenv("BCGTUNE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("BCGTUNE_SGLANG_PROBE", raising=False)
    probe = _fake(LADDER_4096, 4096)
    monkeypatch.setattr(sr, "run_probe", probe)
    return probe


def test_suggest_uses_sglang_when_asked_then_its_cached_answer(fake_probe):
    trace = PrefillTrace.from_sizes([100, 200, 300, 700, 1500, 3000] * 5)
    first = suggest(SuggestRequest(trace=trace, sglang="cache", baselines=False))
    assert fake_probe.calls == 0 and first.capture.source.kind == "model"
    asked = suggest(SuggestRequest(trace=trace, sglang="ask", baselines=False))
    assert fake_probe.calls == 1 and asked.capture.source.kind == "sglang"
    assert asked.capture.captured == tuple(LADDER_4096) and asked.capture.buckets is None  # SGLang's ladder
    # the default now finds SGLang's answer in the cache, and its ladder is the one compared
    again = suggest(SuggestRequest(trace=trace, baselines=False))
    assert fake_probe.calls == 1 and again.capture.source.cached_at is not None
    assert any(row.buckets == LADDER_4096 for row in again.plan.rows)


def test_the_cli_says_which_answer_priced_the_launch(fake_probe, tmp_path, capsys):
    t = str(_trace_file(tmp_path))
    code, out, err = run_cli(["suggest-buckets", t, "--max-buckets", "4"], capsys)
    first = out.splitlines()[0]
    assert code == 0 and first.startswith(
        "SGLang's capture for this launch (NOT CHECKED by SGLang): bcgtune's model of its rules"
    )
    assert "(no cached answer from SGLang: --ask-sglang asks it" in first
    code, out, err = run_cli(["suggest-buckets", t, "--max-buckets", "4", "--json"], capsys)
    doc = json.loads(out)
    assert (doc["launch_check"], doc["launch_capture"]["launch_check"]) == ("not checked", "not checked")
    assert doc["launch_check_reason"] == "no cached answer from SGLang for this launch"
    code, out, err = run_cli(["suggest-buckets", t, "--max-buckets", "4", "--ask-sglang"], capsys)
    assert code == 0 and "sglang 0.5.23's own answer" in out.splitlines()[0] and "asking the installed SGLang" in err
    code, out, err = run_cli(["suggest-buckets", t, "--max-buckets", "4"], capsys)
    first = out.splitlines()[0]
    assert code == 0 and first.startswith("SGLang's capture for this launch (checked): sglang 0.5.23's own answer (cached ")
    assert "not checked: SGLang's rules on the model (none given)" in first
    code, out, err = run_cli(["suggest-buckets", t, "--max-buckets", "4", "--json"], capsys)
    doc = json.loads(out)
    assert (doc["launch_check"], doc["launch_check_reason"], doc["launch_capture"]["launch_check"]) == (
        "checked",
        None,
        "checked",
    )


def test_the_test_switch_never_starts_sglang(fake_probe, monkeypatch):
    monkeypatch.setenv("BCGTUNE_SGLANG_PROBE", "off")
    trace = PrefillTrace.from_sizes([100, 200, 300] * 5)
    r = suggest(SuggestRequest(trace=trace, sglang="ask", baselines=False))
    assert fake_probe.calls == 0 and r.capture.source.not_asked == "BCGTUNE_SGLANG_PROBE=off"


def test_drift_prices_with_sglangs_answer_and_says_so(fake_probe, tmp_path, capsys):
    prof = tmp_path / "p.toml"
    prof.write_text(
        f'[profile]\nname = "p"\nplatform = "cuda"\nhardware = "h200"\nmodel = "{PROBE_CONFIG_DIR}"\n[server]\ntp-size = 1\n'
    )
    t = str(_trace_file(tmp_path))
    code, out, err = run_cli(["drift", "--profile", str(prof), "--trace", t], capsys)
    assert code in (0, 1) and out.startswith("SGLang's capture for this launch (checked): sglang 0.5.23's own answer")
    code, out, err = run_cli(["drift", "--profile", str(prof), "--trace", t, "--json"], capsys)
    doc = json.loads(out)
    assert doc["deployed"]["metrics"]["buckets"] == LADDER_4096
    assert doc["launch_capture"]["source"] == "sglang 0.5.23" and doc["launch_capture"]["cached_at"]
    assert doc["launch_check"] == "checked"


def test_a_launch_with_graphs_off_prices_nothing(tmp_path, capsys):
    t = str(_trace_file(tmp_path))
    code, out, err = run_cli(["suggest-buckets", t, "--enable-two-batch-overlap", "--tp", "2"], capsys)
    assert code == 0 and "prefill graphs are off for this launch" in out and "two-batch overlap" in out
    assert "no bucket list to suggest" in out and "--cuda-graph-bs-prefill" not in out
    prof = tmp_path / "p.toml"
    code, out, err = run_cli(
        ["suggest-buckets", t, "--chunked-prefill-size", "-1", "--write-profile", str(prof), "--base-profile", "h200"], capsys
    )
    assert code == 0 and "chunked prefill is off" in out and not prof.exists()
    assert f"nothing written to {prof}" in err


@pytest.mark.sglang
def test_suggest_and_drift_with_the_real_sglang_include_the_capture_filter(sglang_probe, tmp_path, capsys):
    """SGLang's own answer, through a real child process: two requests of 2,048 tokens at
    most keep the buckets up to 4,096 (50 of the 58 of an 8,192 ladder)."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text((PROBE_CONFIG_DIR / "config.json").read_text())
    prof = tmp_path / "p.toml"
    prof.write_text(
        f'[profile]\nname = "p"\nplatform = "cuda"\nhardware = "h200"\nmodel = "{model}"\n'
        "[server]\nchunked-prefill-size = 8192\nmax-running-requests = 2\ncontext-length = 2048\n"
    )
    t = str(_trace_file(tmp_path))
    code, out, err = run_cli(["drift", "--profile", str(prof), "--trace", t, "--json"], capsys)
    assert code in (0, 1), err
    doc = json.loads(out)
    assert doc["launch_capture"]["source"] == "sglang 0.5.23"
    current = doc["deployed"]["metrics"]["buckets"]
    assert len(current) == 50 and current[-1] == 4096
    # doctor reads the same answer from the cache
    code, out, err = run_cli(["doctor", "--profile", str(prof), "--json"], capsys)
    rp = json.loads(out)["resolved_prefill"]
    assert (
        rp["cached_at"] is not None and rp["buckets"] == current and "its launch resolution" not in err
    )  # only the parser and the runner are asked
