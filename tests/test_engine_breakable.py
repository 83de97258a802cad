"""The breakable engine on CPU with the tiny models (mode padded-eager: the segments' forward
runs eagerly on the padded bucket, attention on the real rows of each request), the
request mixes of capture/validate/calibrate, and the checks that refuse a GPU command
before torch or a model is loaded."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from cli_helpers import HANG_S

torch = pytest.importorskip("torch")

# after the skip: these import torch
from typer.testing import CliRunner  # noqa: E402

from bcgtune.cli.app import app  # noqa: E402
from bcgtune.engines.breakable import BreakablePrefillEngine  # noqa: E402
from bcgtune.engines.compare import check_pad_invariance, compare_batch  # noqa: E402
from bcgtune.engines.inputs import split_tokens, text_inputs  # noqa: E402
from bcgtune.engines.models import build_model, preset  # noqa: E402
from bcgtune.engines.spec import EngineSpec  # noqa: E402
from bcgtune.errors import ExternalError, InputError  # noqa: E402

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def tiny():
    return build_model(preset("tiny"), CPU, dtype=torch.float32, seed=0)


def test_split_tokens():
    assert split_tokens(10, 3) == (4, 3, 3)
    assert split_tokens(5, 5) == (1, 1, 1, 1, 1)
    r = split_tokens(100, 7, "random", seed=3)
    assert sum(r) == 100 and len(r) == 7 and min(r) >= 1
    assert r == split_tokens(100, 7, "random", seed=3)
    with pytest.raises(InputError, match="cannot hold"):
        split_tokens(3, 4)


def test_multi_request_replay_equals_eager_and_requests_are_independent(tiny):
    eng = BreakablePrefillEngine(tiny, CPU, 128)
    assert eng.mode == "padded-eager" and eng.attention_kind == "sdpa-per-request"
    recs = eng.capture([32, 64, 128])
    assert [r.bucket for r in recs] == [128, 64, 32] and all(r.ok for r in recs)
    for n, r in ((20, 1), (40, 3), (100, 7), (64, 64)):
        x = text_inputs(tiny, n, CPU, seed=n, requests=r, split="random")
        he, le = eng.eager(x)
        he, le = he.clone(), le.clone()
        hr, lr, b = eng.replay(x)
        assert b == eng.bucket_for(n) and le.shape == (r, tiny.vocab_size)
        c = compare_batch(tiny, he, hr, le, lr, x.lengths)
        assert c.ok and c.requests == r and c.failing_requests == []
        assert check_pad_invariance(eng, x, b).ok
        # attention stays inside each request: the first request alone gives its rows
        first = x.lengths[0]
        alone = text_inputs(tiny, first, CPU)
        alone.inp.copy_(x.inp[:first])
        h0, l0 = eng.eager(alone)
        assert torch.allclose(h0, he[:first], atol=1e-5) and torch.allclose(l0[0], le[0], atol=1e-4)


def test_compare_batch_names_the_request_that_differs(tiny):
    x = text_inputs(tiny, 30, CPU, requests=3)
    eng = BreakablePrefillEngine(tiny, CPU, 32)
    he, le = eng.eager(x)
    hr, lr = he.clone(), le.clone()
    hr[12] += 5.0  # a row of the second request (rows 10..19)
    c = compare_batch(tiny, he, hr, le, lr, x.lengths)
    assert c.differing_requests == [1] and not c.bitwise
    assert compare_batch(tiny, he, he.clone(), le, le.clone(), x.lengths).bitwise


def test_segments_alone_skip_attention(tiny, monkeypatch):
    import bcgtune.engines.breakable as bk

    eng = BreakablePrefillEngine(tiny, CPU, 64)
    eng.capture([64])
    calls = []
    real = bk.F.scaled_dot_product_attention
    monkeypatch.setattr(bk.F, "scaled_dot_product_attention", lambda *a, **k: calls.append(1) or real(*a, **k))
    eng.replay_segments(64)  # runs the padded forward without any break
    assert calls == []
    eng.replay(text_inputs(tiny, 40, CPU, requests=2), 64)
    assert len(calls) == 2 * tiny.cfg.num_layers  # with breaks: each request's attention in every layer
    with pytest.raises(InputError, match="not captured"):
        eng.replay_segments(32)


def test_capture_report_validate_and_calibrate_breakable(tmp_path):
    from bcgtune.core.trace.mix import BatchMix
    from bcgtune.files.calibration_file import load_calibration
    from bcgtune.services.calibrate import run_calibrate
    from bcgtune.services.capture import run_capture
    from bcgtune.services.validate import run_validate

    tiny_cpu = EngineSpec(model="tiny", device="cpu")
    rep = run_capture([16, 32], tiny_cpu)
    assert rep.runner == "breakable" and rep.environment["runner"] == "breakable" and rep.graphs == 2
    assert rep.to_json()["graphs"] == 2 and rep.to_json()["kind"] == "bcgtune.capture-report"
    v = run_validate([16, 32], tiny_cpu, requests=(1, 3), sizes_per_bucket=2)
    assert v.ok and v.requests == [1, 3]
    assert {c.comparison.requests for e in v.per_bucket for c in e.checks} == {1, 3}
    assert all(e.pad_invariance is not None and e.pad_invariance.ok and e.pad_invariance.requests == 3 for e in v.per_bucket)
    full = run_validate([16], EngineSpec(model="tiny", device="cpu", runner="full"), requests=(1, 3), sizes_per_bucket=1)
    assert full.requests == [1] and full.runner == "full"
    mix = BatchMix.from_batches([20, 20, 40, 70], [1, 2, 3, 3])
    result = run_calibrate([32, 64], tiny_cpu, mix=mix, warmup=0, repeats=1)
    cal = result.calibration
    assert cal.runner == "breakable" and cal.tokens.tolist() == [32, 64, 70]  # the largest batch gets a bucket
    assert cal.batches.tokens.tolist() == [20, 20, 40, 70] and cal.batches.requests.tolist() == [1, 2, 3, 3]
    assert (cal.batches.breaks_ms >= 0).all() and cal.meta["engine"]["runner"] == "breakable"
    from bcgtune.files.calibration_file import save_calibration

    save_calibration(cal, tmp_path / "c.json")
    back = load_calibration(tmp_path / "c.json")
    assert back.runner == "breakable" and back.batches.requests.tolist() == [1, 2, 3, 3]
    with pytest.raises(InputError, match="JSON only"):
        save_calibration(cal, tmp_path / "c.csv")


def _trace_json(tmp_path):
    from bcgtune.core.trace.prefill_trace import PrefillTrace
    from bcgtune.files.trace_file import save_trace

    t = PrefillTrace.from_batches({"forward_tokens": [20, 20, 40, 70, 90], "new_seq": [1, 2, 3, 3, 4]})
    p = tmp_path / "t.json"
    save_trace(t, str(p))
    return p


def test_cli_calibrate_from_a_trace_measures_its_request_mix(tmp_path):
    from bcgtune.files.calibration_file import load_calibration

    trace = _trace_json(tmp_path)
    out = tmp_path / "cal.json"
    r = CliRunner().invoke(
        app,
        [
            "calibrate",
            "--model",
            "tiny",
            "--sizes-from",
            str(trace),
            "--grid",
            "32",
            "--repeats",
            "1",
            "--warmup",
            "0",
            "--no-memory",
            "-o",
            str(out),
        ],
    )
    assert r.exit_code == 0, r.output
    cal = load_calibration(out)
    assert cal.runner == "breakable"
    assert list(zip(cal.batches.tokens.tolist(), cal.batches.requests.tolist())) == [(20, 1), (20, 2), (40, 3), (70, 3), (90, 4)]
    r = CliRunner().invoke(
        app, ["suggest-buckets", str(trace), "--objective", "time", "--calibration", str(out), "--max-buckets", "2", "--json"]
    )
    assert r.exit_code == 0, r.output
    plan = json.loads(r.output)
    assert set(plan["recommended"]["buckets"]) <= set(cal.tokens.tolist())
    r = CliRunner().invoke(
        app,
        [
            "calibrate",
            "--model",
            "tiny",
            "--sizes",
            "16,32",
            "--runner",
            "full",
            "--repeats",
            "1",
            "--warmup",
            "0",
            "-o",
            str(tmp_path / "f.json"),
        ],
    )
    assert r.exit_code == 0, r.output
    assert load_calibration(tmp_path / "f.json").runner == "full"


def test_cli_capture_and_validate_say_the_runner(tmp_path):
    r = CliRunner().invoke(app, ["capture", "--buckets", "16,32", "--model", "tiny"])
    assert r.exit_code == 0, r.output
    assert "runner breakable" in r.output
    r = CliRunner().invoke(app, ["capture", "--buckets", "16", "--model", "tiny", "--runner", "full"])
    assert r.exit_code == 0 and "runner full" in r.output
    r = CliRunner().invoke(app, ["validate", "--buckets", "16,32", "--model", "tiny", "--requests", "1,2", "--json"])
    assert r.exit_code == 0, r.output
    rep = json.loads(r.stdout.strip().splitlines()[-1])
    assert rep["ok"] and rep["requests"] == [1, 2] and rep["batches_checked"] > 0


def _cli(args, env_extra=None, pre=""):
    env = dict(os.environ, **(env_extra or {}))
    code = (
        f"import sys; {pre}\nfrom bcgtune.cli.app import main\nsys.argv = ['bcgtune', *{args!r}]\n"
        "try:\n    main()\nfinally:\n    print('torch imported:', 'torch' in sys.modules and sys.modules['torch'] is not None)"
    )
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=HANG_S, check=False)


@pytest.mark.parametrize(
    "cmd",
    [["capture", "--buckets", "16"], ["validate", "--buckets", "16"], ["calibrate", "--sizes", "16", "-o", "never-written.json"]],
)
def test_gpu_commands_without_torch_say_how_to_install_it(cmd, tmp_path):
    p = _cli([*cmd, "--model", "tiny"], pre="sys.modules['torch'] = None")
    assert p.returncode == 2, p.stderr
    assert p.stderr.strip().splitlines()[-1] == "error: needs torch: pip install 'bcgtune[gpu]'"


def test_large_model_without_gpu_is_refused_before_torch_loads():
    p = _cli(["capture", "--buckets", "256", "--model", "qwen3-8b"], {"CUDA_VISIBLE_DEVICES": "", "HIP_VISIBLE_DEVICES": ""})
    assert p.returncode == 3, p.stderr
    assert "needs a CUDA or ROCm GPU" in p.stderr and "--model tiny --device cpu" in p.stderr
    assert "torch imported: False" in p.stdout
    p = _cli(["calibrate", "--model", "qwen3-0.6b", "--device", "cpu", "-o", "x.json"])
    assert p.returncode == 2 and "--model tiny --device cpu" in p.stderr and "torch imported: False" in p.stdout


def test_buckets_beyond_the_ceiling_or_the_context_are_refused():
    p = _cli(["capture", "--buckets", "1000000000", "--model", "tiny"])
    assert p.returncode == 2 and "chunked-prefill ceiling 16384" in p.stderr and "torch imported: False" in p.stdout
    p = _cli(["capture", "--buckets", "20000", "--model", "tiny", "--chunked-prefill-size", "32768"])
    assert p.returncode == 2 and "context of 16384" in p.stderr
    p = _cli(["validate", "--buckets", "4096", "--model", "tiny", "--chunked-prefill-size", "2048"])
    assert p.returncode == 2 and "ceiling 2048" in p.stderr


def test_a_config_is_read_without_transformers(tmp_path, monkeypatch):
    from bcgtune.engines import config
    from bcgtune.engines.config import CPU_MAX_PARAMS, resolve

    (tmp_path / "config.json").write_text(
        json.dumps(
            {
                "hidden_size": 4096,
                "num_hidden_layers": 36,
                "vocab_size": 151936,
                "num_attention_heads": 32,
                "num_key_value_heads": 8,
                "head_dim": 128,
                "intermediate_size": 12288,
                "max_position_embeddings": 40960,
            }
        )
    )
    for model in (str(tmp_path), str(tmp_path / "config.json")):  # a folder holding only a config, or the file
        with pytest.raises(InputError, match="context of 40960"):
            resolve(EngineSpec(model=model, device="auto", chunked_prefill_size=131072), [65536])
    with monkeypatch.context() as m:
        m.setattr(config, "gpu_device_nodes", lambda: True)  # resolved as on a GPU machine
        cfg = resolve(EngineSpec(model=str(tmp_path), device="cuda"), [256])
        hf = resolve(EngineSpec(model=f"hf:{tmp_path}", device="cuda", random_weights=True), [256])  # transformers builds it
    assert cfg.model.kind == "config" and 7.5e9 < cfg.model.params < 9e9 and cfg.model.max_context == 40960
    assert resolve(EngineSpec(model="tiny", device="cpu"), [16]).model.params < CPU_MAX_PARAMS
    assert hf.model.kind == "hf" and 7.5e9 < hf.model.params < 9e9
    with pytest.raises(InputError, match="no weights"):
        resolve(EngineSpec(model=f"hf:{tmp_path}", device="cuda"), [256])
    old = os.environ.get("CUDA_VISIBLE_DEVICES")
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    try:
        with pytest.raises(ExternalError, match="needs a CUDA or ROCm GPU"):
            resolve(EngineSpec(model=str(tmp_path), device="auto"), [256])
    finally:
        if old is None:
            del os.environ["CUDA_VISIBLE_DEVICES"]
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = old
    (tmp_path / "config.json").write_text("[1, 2")
    with pytest.raises(InputError, match="not valid JSON"):
        resolve(EngineSpec(model=str(tmp_path)), [16])


def test_hf_checkpoint_under_the_breakable_runner(tmp_path):
    transformers = pytest.importorskip("transformers")
    cfg = transformers.Qwen3Config(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
    )
    cfg.save_pretrained(tmp_path)
    from bcgtune.engines.build import open_engine
    from bcgtune.engines.config import resolve

    model = open_engine(resolve(EngineSpec(model=str(tmp_path), device="cpu", random_weights=True), [64])).model
    eng = BreakablePrefillEngine(model, CPU, 64)
    eng.capture([64])
    x = text_inputs(model, 50, CPU, requests=3, split="random")
    he, le = eng.eager(x)
    he, le = he.clone(), le.clone()
    hr, lr, _ = eng.replay(x)
    assert compare_batch(model, he, hr, le, lr, x.lengths).ok
    # the registered attention keeps requests apart: the last request alone gives its rows
    last = x.lengths[-1]
    alone = text_inputs(model, last, CPU)
    alone.inp.copy_(x.inp[-last:])
    h1, _ = eng.eager(alone)
    assert torch.allclose(h1, he[-last:], atol=1e-5)
    from bcgtune.services.capture import run_capture

    with pytest.raises(InputError, match="hf-attention causal"):
        run_capture([16], EngineSpec(model=str(tmp_path), device="cpu", random_weights=True, hf_attention="sdpa"))


def test_weak_ref_view_shares_memory():
    from bcgtune.engines.segmented import weak_ref_tensor

    t = torch.arange(12.0).reshape(3, 4)[1:]
    w = weak_ref_tensor(t)
    assert w.data_ptr() == t.data_ptr() and w.shape == t.shape and torch.equal(w, t)
    t.add_(1)
    assert torch.equal(w, t)


def test_unknown_runner_and_graph_impl():
    from bcgtune.engines.config import resolve
    from bcgtune.engines.segmented import resolve_impl

    with pytest.raises(InputError, match="must be breakable, full") as exc:
        resolve(EngineSpec(model="tiny", runner="piecewise"), [16])  # type: ignore[arg-type]
    assert exc.value.field == "runner"
    with pytest.raises(InputError, match="graph implementation"):
        resolve_impl("mine")
    assert resolve_impl("bcgtune").name == "bcgtune"
    impl = resolve_impl("auto")  # SGLang's classes where they import, else bcgtune's with the reason
    assert impl.name in ("sglang", "bcgtune") and (impl.name == "sglang" or "does not import" in impl.note)


def test_mix_of_a_simulated_trace_keeps_request_counts():
    from bcgtune.adapters.bench_serving.simulator import simulate
    from bcgtune.core.trace.mix import batch_mix
    from bcgtune.files.workload_file import default_workload

    trace = simulate(default_workload())
    mix = batch_mix(trace)
    assert mix.requests_known and mix.n_batches == trace.n_batches and mix.requests.max() > 1
    sizes, counts = mix.histogram()
    assert np.array_equal(sizes, trace.sizes) and np.array_equal(counts, trace.counts)


def test_cli_calibrate_adds_sizes_to_the_grid(tmp_path):
    """--sizes with --sizes-from measures the given buckets as well as the grid, so a list
    with sizes off the grid (the one a server runs now) is priced at measured times."""
    from bcgtune.files.calibration_file import load_calibration

    trace = _trace_json(tmp_path)
    out = tmp_path / "cal.json"
    r = CliRunner().invoke(
        app,
        [
            "calibrate",
            "--model",
            "tiny",
            "--sizes-from",
            str(trace),
            "--grid",
            "32",
            "--sizes",
            "45,90",
            "--repeats",
            "1",
            "--warmup",
            "0",
            "--no-memory",
            "-o",
            str(out),
        ],
    )
    assert r.exit_code == 0, r.output
    cal = load_calibration(out)
    assert {45, 90} <= set(cal.tokens.tolist()) and 32 in cal.tokens.tolist()
    assert cal.meta["sizes_added"] == [45] and cal.meta["bucket_grid"] == 32  # 90 is the trace's largest size already
    r = CliRunner().invoke(
        app,
        ["suggest-buckets", str(trace), "--objective", "time", "--calibration", str(out), "--compare", "mine=45,90", "--json"],
    )
    assert r.exit_code == 0, r.output


def test_interleaved_timing_runs_every_group_each_round_in_shuffled_order():
    from bcgtune.engines.timing import summarize_ms, time_interleaved

    calls = []
    groups = [[(lambda g=g, i=i: calls.append((g, i))) for i in range(2)] for g in range(6)]
    rounds_done = []
    times = time_interleaved(groups, CPU, warmup=1, repeats=4, seed=3, on_round=lambda d, t: rounds_done.append((d, t)))
    assert rounds_done == [(1, 5), (2, 5), (3, 5), (4, 5), (5, 5)]
    assert len(times) == 6 and all(len(t) == 2 and len(t[0]) == 4 and len(t[1]) == 4 for t in times)
    assert len(calls) == 5 * 12
    for k in range(0, len(calls), 2):  # a group's calls back to back, in order
        assert calls[k][0] == calls[k + 1][0] and (calls[k][1], calls[k + 1][1]) == (0, 1)
    rounds = [[g for g, i in calls[k : k + 12] if i == 0] for k in range(0, len(calls), 12)]
    assert all(sorted(r) == list(range(6)) for r in rounds) and len({tuple(r) for r in rounds}) > 1
    s = summarize_ms([3.0, 1.0, 2.0, 10.0])
    assert s.median_ms == 2.5 and s.repeats == 4 and s.p90_ms == 10.0 and s.p10_ms == 1.0


def test_break_time_is_the_median_of_paired_differences(monkeypatch):
    """breaks(n, r) = median over rounds of (replay - segments alone) measured back to back,
    not median(replay) - median(segments): a drifting clock moves both of a pair alike."""
    import bcgtune.engines.timing as tg
    from bcgtune.core.trace.mix import BatchMix
    from bcgtune.services.calibrate import run_calibrate

    real = tg.time_interleaved

    def fake(groups, device, warmup, repeats, seed=0, on_round=None, host_out=None):
        real(groups, device, 0, 1, seed)  # the calls still run
        assert len(groups) == 2 + 2 * 2  # one phase: both buckets' segments, then per batch eager and the pair
        out = [[[5.0, 6.0, 7.0]], [[5.0, 6.0, 7.0]]]
        for g in groups[2:]:  # batch: eager alone; segments alone then replay, drifting together
            out.append([[50.0, 51.0, 52.0]] if len(g) == 1 else [[10.0, 20.0, 30.0], [12.0, 23.0, 31.0]])
        if host_out is not None:  # the host launched every call for its whole time (as on a CPU)
            host_out[:] = out
        return out

    monkeypatch.setattr(tg, "time_interleaved", fake)
    result = run_calibrate(
        [32, 64],
        EngineSpec(model="tiny", device="cpu"),
        mix=BatchMix.from_batches([20, 40], [1, 2]),
        warmup=0,
        repeats=3,
        memory=False,
    )
    cal = result.calibration
    assert cal.graph_ms.tolist() == [6.0, 6.0]
    assert cal.batches.eager_ms.tolist() == [51.0, 51.0]
    assert cal.batches.breaks_ms.tolist() == [2.0, 2.0]  # median(2, 3, 1); medians apart: 23 - 20 = 3
    # every round's value stays reachable: the paired differences behind each median
    assert result.rounds.breaks_ms == [[2.0, 3.0, 1.0], [2.0, 3.0, 1.0]] and result.rounds.eager_ms[0] == [50.0, 51.0, 52.0]
    assert result.rounds.rows == [32, 64] and result.rounds.graph_ms[0] == [5.0, 6.0, 7.0]
