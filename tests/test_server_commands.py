"""The server-run commands without a server: what they refuse before launching anything
(prompts files, bench plans), their typed results (bench's JSON round trip, the server
validation's verdict), and the validation pipeline with its launches replaced."""

from __future__ import annotations

import json
import math

import pytest
from cli_helpers import assert_one_line_error, cli, digest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bcgtune.core.bench.abstats import MetricComparison, RowStat
from bcgtune.core.bench.bench_result import BenchArm, BenchLaunch, BenchResult, BenchRun
from bcgtune.core.bench.server_validation import (
    Generation,
    LogReplay,
    PhaseReplay,
    ProbeLaunch,
    compare_outputs,
    failures,
    runner_verdict,
)
from bcgtune.errors import InputError


# ---- validate --server: the prompts file ------------------------------------------------
@pytest.fixture(autouse=True)
def no_server_launch(monkeypatch):
    """No test here launches a server: a run that gets past its inputs stops at the launch."""
    import bcgtune.adapters.sglang.live_validate as lv

    def no_launch(*a, **k):
        raise InputError("reached the launch")

    monkeypatch.setattr(lv, "run_probes", no_launch)


def _validate_prompts(path) -> object:
    return cli(["validate", "--server", "--profile", "h200", "--prompts", str(path), "--workdir", str(path) + ".run"])


@pytest.mark.parametrize(
    "content, words",
    [
        (b"caf\xe9 au lait\n", "not UTF-8"),
        (b'{"text": 5}\n', "string 'text'"),
        (b'{"text": "a", "image": 5}\n', "'image' must be"),
        (b'{"text": "a", "image": ["x.png"]}\n', "'image' must be"),
        (b'{"text": "a", "max_new_tokens": true}\n', "max_new_tokens"),
        (b'{"text": "a", "max_new_tokens": 1e3}\n', "max_new_tokens"),
        (b'{"text": "a", "max_new_tokens": 99999999999}\n', "max_new_tokens"),
        (b'{"text": "a", "image": "missing.png"}\n', "no such image"),
        (b'{"text": "a", "image": "."}\n', "no such image"),
        (b'{"text": ' + b"[" * 100_000 + b"]" * 100_000 + b"}\n", "nested too deeply"),
        (b'{"text": "a", "max_new_tokens": NaN}\n', "invalid JSON"),
        (b"\x00\x01binary", "binary data"),
        (b"# only a comment\n\n", "holds no prompt"),
    ],
)
def test_bad_prompts_files_are_one_line_errors_before_any_launch(tmp_path, content, words):
    p = tmp_path / "prompts.jsonl"
    p.write_bytes(content)
    r = _validate_prompts(p)
    assert r.code == 2, (r.code, r.err[-500:])
    assert_one_line_error(r)
    assert words in r.err and str(p) in r.err, r.err
    assert not (tmp_path / "prompts.jsonl.run").exists()  # refused before the work folder


@pytest.mark.parametrize("name", ["", "nowhere.jsonl"])
def test_missing_prompts_file_is_refused(tmp_path, name):
    r = cli(["validate", "--server", "--profile", "h200", "--prompts", name, "--workdir", str(tmp_path / "run")])
    assert r.code == 2
    assert_one_line_error(r)


_json_lines = st.lists(
    st.dictionaries(
        st.sampled_from(["text", "image", "max_new_tokens", "x"]),
        st.recursive(
            st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
            lambda c: st.lists(c, max_size=3),
            max_leaves=5,
        ),
        max_size=4,
    ).map(lambda d: json.dumps(d, allow_nan=True)),
    max_size=4,
).map(lambda lines: "\n".join(lines).encode())


@settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.binary(max_size=400) | _json_lines)
def test_hostile_prompts_files_never_crash(tmp_path, data):
    p = tmp_path / "p.txt"
    p.write_bytes(data)
    before = digest([p])
    r = _validate_prompts(p)
    assert r.code == 2, (r.code, r.err[-500:])
    assert_one_line_error(r)
    assert digest([p]) == before


def test_prompts_file_reading(tmp_path):
    from bcgtune.adapters.sglang.live_validate import load_probes

    (tmp_path / "im.png").write_bytes(b"\x89PNG\r\n\x1a\n....")
    p = tmp_path / "p.jsonl"
    p.write_text(
        "# comment\nplain prompt\n"
        + json.dumps({"text": "look", "image": "im.png", "max_new_tokens": 3, "note": "ignored"})
        + "\n"
        + json.dumps({"text": "t", "image": "data:image/png;base64,AAAA"})
        + "\n",
        encoding="utf-8",
    )
    probes = load_probes(str(p))
    assert [(q.name, q.kind, q.max_new_tokens) for q in probes] == [
        ("line-2", "text", 16),
        ("line-3", "image", 3),
        ("line-4", "image", 16),
    ]
    assert probes[1].image is not None and probes[1].image.startswith("data:image/png;base64,")
    assert probes[2].image == "data:image/png;base64,AAAA"


# ---- validate --server: the pipeline with its launches replaced ----------------------------
def _gen(text: str, ids: list[int]) -> Generation:
    return Generation(text=text, ids=ids, logprobs=[-0.1] * len(ids), top=[[(-0.1, i), (-5.0, i + 1)] for i in ids])


def test_each_comparison_keeps_its_own_probe_when_text_and_image_lines_mix(tmp_path, monkeypatch):
    """The probes go text first, then images; a prompts file that mixes them must still
    label each answer with its own probe (the third line is the one that flips)."""
    import bcgtune.adapters.machine.model_config as model_config
    import bcgtune.adapters.sglang.live_validate as lv
    from bcgtune.services.server_validation import server_validation

    (tmp_path / "im.png").write_bytes(b"\x89PNG....")
    p = tmp_path / "p.jsonl"
    p.write_text("first text\n" + json.dumps({"text": "an image", "image": "im.png"}) + "\nthird text flips\n")
    sent: list[list[str]] = []

    def fake_run_probes(profile, probes, log_path, label, say=None):
        order = [q for q in probes if q.kind == "text"] + [q for q in probes if q.kind == "image"]
        sent.append([q.name for q in order])
        graphs_on = label.startswith("graphs-on")
        outs = [_gen(q.text, [1, 2, 3] if not (graphs_on and "flips" in q.text) else [1, 9, 3]) for q in order]
        return outs, ProbeLaunch(launch_command=["x"], log=str(log_path), phases={"start": [0, 0]})

    monkeypatch.setattr(lv, "run_probes", fake_run_probes)
    monkeypatch.setattr(lv, "log_replay", lambda log, phases: LogReplay(captured=[64, 128]))
    monkeypatch.setattr(model_config, "model_is_qwen4_exp", lambda model: True)
    rep = server_validation("h200", prompts=str(p), workdir=tmp_path / "run")
    assert sent[0] == ["line-1", "line-3", "line-2"]
    by_name = {c.name: c for c in rep.requests}
    assert by_name["line-3"].first_flip == 1 and by_name["line-3"].kind == "text"
    assert by_name["line-1"].first_flip is None and by_name["line-2"].first_flip is None
    assert by_name["line-2"].kind == "image"
    saved = json.loads((tmp_path / "run" / "validation.json").read_text())
    assert saved == json.loads(json.dumps(rep.to_json()))
    assert saved["kind"] == "bcgtune.server-validation" and saved["ok"] is rep.ok


def _phase(batches, replayed, eligible, replayed_eligible) -> PhaseReplay:
    return PhaseReplay(
        batches=batches,
        replayed=replayed,
        share=replayed / batches if batches else None,
        eligible=eligible,
        replayed_eligible=replayed_eligible,
        share_of_eligible=replayed_eligible / eligible if eligible else None,
        sizes=[100] * batches,
        graph=[1] * replayed + [0] * (batches - replayed),
    )


def test_runner_verdicts():
    text, img_eager, img_replay = _phase(4, 4, 4, 4), _phase(2, 0, 2, 0), _phase(2, 2, 2, 2)
    assert runner_verdict(LogReplay([64], text, img_eager), True, False, "breakable")[0] == "unpatched"
    assert runner_verdict(LogReplay([64], text, img_eager), False, False, "breakable")[0] == "eager-images"
    assert runner_verdict(LogReplay([64], text, img_replay), True, False, "breakable")[0] == "patched"
    assert runner_verdict(LogReplay([64], text, img_replay), False, False, "breakable")[0] == "replays"
    assert runner_verdict(LogReplay([64], text, img_replay), True, True, "breakable")[0] == "not-applicable"
    assert runner_verdict(LogReplay([64], text, img_replay), True, False, "full")[0] == "not-applicable"
    assert runner_verdict(LogReplay([64], text, None), True, False, "breakable")[0] == "unknown"


def test_comparison_and_failures():
    names = [("a", "text"), ("b", "text"), ("c", "image")]
    eager = [_gen("x", [1, 2]), _gen("y", [1, 2]), _gen("z", [5])]
    graphs = [_gen("x", [1, 2]), _gen("y2", [1, 7]), _gen("z", [5])]
    graphs[2].logprobs = [-0.9]  # a logprob delta of 0.8
    cmp = compare_outputs(names, graphs, eager, gap_threshold=0.7, delta_tol=0.5)
    assert [(c.positions, c.agree, c.first_flip, c.identical_text) for c in cmp] == [
        (2, 2, None, True),
        (2, 1, 1, False),
        (1, 1, None, True),
    ]
    assert cmp[1].flip_gap == pytest.approx(4.9) and cmp[1].flip_fails
    assert cmp[2].delta_fails and math.isclose(cmp[2].max_logprob_delta, 0.8)
    why = failures(cmp, LogReplay([], None, _phase(4, 1, 4, 1)), 0.7, 0.5, 0.9)
    assert len(why) == 4 and "no prefill capture" in why[2] and "image batches replayed 1/4" in why[3]


# ---- bench ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "extra, flag",
    [
        (["--concurrency", "4,,8"], "--concurrency"),
        (["--concurrency", "4,"], "--concurrency"),
        (["--concurrency", ""], "--concurrency"),
        (["--order", ""], "--order"),
        (["--order", "A,,X"], "--order"),
        (["--order", ",".join(["A", "X"] * 60)], "--order"),
        (["--concurrency", ",".join(["4"] * 1000), "--runs", "100"], "--runs"),
        (["--concurrency", "99999999999999999999"], "--concurrency"),
        (["--concurrency", "0"], "--concurrency"),
        (["--concurrency", "5000000", "--prompts-per-concurrency", "10"], "--prompts-per-concurrency"),
    ],
)
def test_bench_plan_refuses_empty_and_runaway_values_before_launching(extra, flag):
    r = cli(["bench", "--profile", "h200", "--arm", "a:disabled", "--arm", "b:default", *extra])
    assert r.code == 2 and f"({flag})" in r.err, r.err
    assert_one_line_error(r)


def _bench_result() -> BenchResult:
    res = BenchResult.start(
        profile="h200",
        profile_path="/p/h200.toml",
        profile_sha256="0" * 64,
        arms=[BenchArm(name="base", variant="disabled"), BenchArm(name="tuned", variant="list", buckets=[64, 128])],
        order=["base", "tuned", "tuned", "base"],
        concurrency=[4],
        runs=1,
        prompts_per_concurrency=10,
        warmup=True,
        bench_args=[],
        workdir="/w",
    )
    for i, (arm, thr) in enumerate([("base", 100.0), ("tuned", 120.0), ("tuned", 118.0), ("base", 102.0)]):
        line = {"output_throughput": thr, "mean_ttft_ms": 50, "mean_tpot_ms": "oops", "completed": 40.0, "duration": True}
        run = BenchRun.from_result_line(4, 1, line)
        res.launches.append(BenchLaunch(index=i, arm=arm, launch_command=["s"], launch_env={}, server_log="l", runs=[run]))
    res.compare()
    return res


def test_bench_result_reads_what_it_writes():
    res = _bench_result()
    run = res.launches[0].runs[0]
    assert (run.completed, run.mean_tpot_ms, run.duration, run.mean_ttft_ms) == (40, None, None, 50.0)
    doc = json.loads(json.dumps(res.to_json()))
    assert doc["kind"] == "bcgtune.bench" and doc["base_arm"] == "base"
    back = BenchResult.from_json(doc)
    assert back == res
    cmp = back.comparisons["tuned"]["output_throughput"]
    assert isinstance(cmp, MetricComparison) and isinstance(cmp.rows[0], RowStat)
    assert cmp.rows[0].change_pct == pytest.approx(100 * (119 - 101) / 101)
    assert "mean_tpot_ms" not in back.comparisons["tuned"]  # no numeric values to compare


@pytest.mark.parametrize(
    "change",
    [
        {"kind": "bcgtune.trace"},
        {"format_version": 2},
        {"arms": [{"name": "a", "variant": "bogus"}]},
        {"launches": [{"index": 0}]},
        {"comparisons": {"tuned": {"output_throughput": {"rows": "x"}}}},
    ],
)
def test_bench_result_refuses_what_it_did_not_write(change):
    doc = {**_bench_result().to_json(), **change}
    with pytest.raises(InputError):
        BenchResult.from_json(doc, "bench.json")


def test_bench_table_renders_from_the_type():
    from bcgtune.cli.render.bench import render_table

    text = render_table(_bench_result())
    assert text.splitlines()[0].split()[:4] == ["Concurrency", "Output", "tok/s", "base"]
    assert "tuned: mean output throughput change +17.8%" in text
