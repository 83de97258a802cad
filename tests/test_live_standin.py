"""Live commands against the stand-in SGLang server (tests/standin/server.py): no GPU.

trace --live runs the REAL sglang.benchmark.serving client (through tests/standin/
bench_client.py, which only pre-registers one GPU-bound import); bench uses the fast client
(tests/standin/fast_client.py) because it runs the client many times."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cli_helpers import HANG_S

ROOT = Path(__file__).resolve().parents[1]
STANDIN = ROOT / "tests" / "standin"
sys.path.insert(0, str(STANDIN))

from proc_helpers import gone
from proc_helpers import pid_alive as _alive  # noqa: E402

pytest.importorskip("tokenizers")  # the stand-in model's tokenizer
from tiny_tokenizer import build_tiny_tokenizer  # noqa: E402


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    d = build_tiny_tokenizer(tmp_path_factory.mktemp("tinymodel"))
    cfg = json.loads((d / "config.json").read_text())
    cfg["architectures"] = ["Qwen4ExpForConditionalGeneration"]  # the stand-in models its gate
    (d / "config.json").write_text(json.dumps(cfg))
    return d


@pytest.fixture
def profile(tmp_path, model_dir):
    p = tmp_path / "standin.toml"
    p.write_text(
        f"""[profile]
name = "standin"
platform = "cuda"
model = "{model_dir}"

[server]
cuda-graph-backend-prefill = "breakable"
chunked-prefill-size = 2048
disable-radix-cache = true

[buckets]
list = [64, 128, 256, 512, 1024, 2048]
"""
    )
    return p


@pytest.fixture
def env(monkeypatch):
    monkeypatch.setenv("BCGTUNE_SERVER_CMD", f"{sys.executable} {STANDIN / 'server.py'}")
    monkeypatch.setenv("BCGTUNE_BENCH_CLIENT", str(STANDIN / "fast_client.py"))
    monkeypatch.setenv("STANDIN_TIME_SCALE", "0.2")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("PYTHONPATH", str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    for k in ("STANDIN_FAIL_AT_START", "STANDIN_DIE_AFTER_REQUESTS", "STANDIN_RUNNER", "STANDIN_GRAPH_NOISE"):
        monkeypatch.delenv(k, raising=False)
    return os.environ


def bcgtune(*args, timeout=HANG_S, **kw):
    return subprocess.run([sys.executable, "-m", "bcgtune", *args], capture_output=True, text=True, timeout=timeout, **kw)


def test_server_fails_to_start(env, profile, tmp_path, monkeypatch):
    monkeypatch.setenv("STANDIN_FAIL_AT_START", "RuntimeError: not enough memory for the KV cache")
    r = bcgtune(
        "trace", "--live", "--profile", str(profile), "--workdir", str(tmp_path / "run"), "--", "--dataset-name", "random-ids"
    )
    assert r.returncode == 3, r.stderr
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in r.stderr
    assert "before it became healthy" in errors[0] and "not enough memory" in errors[0]
    assert f"log: {tmp_path / 'run' / 'server.log'}" in errors[0]


def test_server_dies_mid_benchmark(env, profile, tmp_path, monkeypatch):
    monkeypatch.setenv("STANDIN_DIE_AFTER_REQUESTS", "6")
    r = bcgtune(
        "bench",
        "--profile",
        str(profile),
        "--arm",
        "base:disabled",
        "--arm",
        "tuned:profile",
        "--concurrency",
        "2",
        "--runs",
        "1",
        "--prompts-per-concurrency",
        "4",
        "--no-warmup",
        "--workdir",
        str(tmp_path / "b"),
        "--",
        "--random-input-len",
        "100",
    )
    assert r.returncode == 3, r.stderr
    err = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert len(err) == 1 and "Traceback" not in r.stderr
    assert "during the benchmark" in err[0] and "01-base.server.log" in err[0]


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_interrupt_during_bench_leaves_no_orphans(env, profile, tmp_path, monkeypatch, sig):
    server_pids = tmp_path / "server.pid"
    client_pids = tmp_path / "client.pids"
    monkeypatch.setenv("STANDIN_PID_FILE", str(server_pids))
    monkeypatch.setenv("FASTCLIENT_PID_FILE", str(client_pids))
    monkeypatch.setenv("STANDIN_TIME_SCALE", "20")  # slow enough to be interrupted mid-run
    p = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "bcgtune",
            "bench",
            "--profile",
            str(profile),
            "--arm",
            "base:disabled",
            "--arm",
            "tuned:profile",
            "--concurrency",
            "2",
            "--runs",
            "1",
            "--prompts-per-concurrency",
            "20",
            "--workdir",
            str(tmp_path / "b"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.time() + HANG_S
    while time.time() < deadline and not (client_pids.exists() and client_pids.read_text().strip()):
        time.sleep(0.1)
    assert client_pids.exists(), "the client never started"
    time.sleep(0.3)
    spid = int(server_pids.read_text().split()[0])
    cpid = int(client_pids.read_text().split()[0])
    assert _alive(spid) and _alive(cpid)
    p.send_signal(sig)
    _out, err = p.communicate(timeout=HANG_S)
    assert p.returncode == 130, err
    assert "error: interrupted" in err and "Traceback" not in err
    assert gone(spid), "server left running"
    assert gone(cpid), "client left running"


def test_bench_table_json_plot(env, profile, tmp_path):
    png = tmp_path / "b.png"
    r = bcgtune(
        "bench",
        "--profile",
        str(profile),
        "--arm",
        "base:disabled",
        "--arm",
        "tuned:profile",
        "--order",
        "A,X,X,A",
        "--concurrency",
        "2,4",
        "--runs",
        "1",
        "--prompts-per-concurrency",
        "2",
        "--workdir",
        str(tmp_path / "b"),
        "--json",
        "--plot",
        str(png),
        "--",
        "--random-input-len",
        "300",
        "--random-output-len",
        "4",
    )
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    assert res["kind"] == "bcgtune.bench" and res["complete"]
    assert [ln["arm"] for ln in res["launches"]] == ["base", "tuned", "tuned", "base"]
    assert all(len(ln["runs"]) == 2 for ln in res["launches"])
    m = res["comparisons"]["tuned"]["output_throughput"]
    assert m["noise_source"] == "aa-launches" and m["se_pp"] is not None
    assert [row["concurrency"] for row in m["rows"]] == [2, 4]
    assert png.read_bytes()[:4] == b"\x89PNG"
    saved = json.loads((tmp_path / "b" / "bench.json").read_text())
    assert saved["comparisons"] == res["comparisons"]
    # the launch logs say graphs were off for base and on for tuned
    assert "Capture target prefill" not in (tmp_path / "b" / "01-base.server.log").read_text()
    assert "cuda graph: True" in (tmp_path / "b" / "02-tuned.server.log").read_text()
    from bcgtune.cli.render.bench import render_table
    from bcgtune.core.bench.bench_result import BenchResult

    table = render_table(BenchResult.from_json(res))
    assert table.splitlines()[0].split()[:4] == ["Concurrency", "Output", "tok/s", "base"]


def _probes_file(tmp_path):
    from PIL import Image

    for w, h in ((256, 256), (512, 512)):
        Image.new("RGB", (w, h), (w % 256, 30, 60)).save(tmp_path / f"im{w}.png")
    lines = [
        json.dumps({"text": " ".join(["w5"] * 100), "max_new_tokens": 6}),
        json.dumps({"text": " ".join(["w7"] * 700), "max_new_tokens": 6}),
        json.dumps({"text": "describe w1 w2", "image": "im256.png", "max_new_tokens": 6}),
        json.dumps({"text": "describe w3 w4", "image": "im512.png", "max_new_tokens": 6}),
    ]
    f = tmp_path / "probes.jsonl"
    f.write_text("\n".join(lines) + "\n")
    return f


def _validate_server(capsys, profile, probes, share, *extra):
    """`bcgtune validate --server` in-process: (exit code, stdout, stderr)."""
    from proc_helpers import run_cli

    return run_cli(
        ["validate", "--server", "--profile", str(profile), "--prompts", str(probes), "--min-replay-share", str(share), *extra],
        capsys,
    )


@pytest.mark.parametrize("runner", ["patched", "unpatched"])
def test_validate_server_patched_vs_unpatched(env, profile, tmp_path, monkeypatch, capsys, runner):
    monkeypatch.setenv("STANDIN_RUNNER", runner)
    monkeypatch.chdir(tmp_path)
    probes = _probes_file(tmp_path)
    code, out, err = _validate_server(capsys, profile, probes, 0.9, "--json")
    rep = json.loads(out)
    if runner == "patched":
        assert code == 0, err
        assert rep["ok"] and rep["runner"]["verdict"] == "patched"
        assert rep["replay"]["image"]["replayed"] == 2
    else:
        assert code == 1 and "image batches replayed 0/2" in err
        assert not rep["ok"] and rep["runner"]["verdict"] == "unpatched"
    assert rep["top1_agreement"] == 1.0 and rep["identical_text_rate"] == 1.0
    assert rep["captured_buckets"] == [64, 128, 256, 512, 1024, 2048]
    assert rep["replay"]["text"]["replayed"] == 2


def test_validate_flags_wide_gap_flip(env, profile, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("STANDIN_RUNNER", "patched")
    monkeypatch.setenv("STANDIN_GRAPH_NOISE", "50")  # replayed prefills get very different logits
    monkeypatch.chdir(tmp_path)
    code, out, err = _validate_server(capsys, profile, _probes_file(tmp_path), 0.5)
    assert code == 1 and ("top-1 flip" in err or "logprob delta" in err)
    assert "FAIL" in out


def test_trace_live_with_real_bench_serving_client(env, profile, tmp_path, model_dir, monkeypatch):
    pytest.importorskip("transformers")
    pytest.importorskip("sglang.benchmark")
    monkeypatch.setenv("BCGTUNE_BENCH_CLIENT", str(STANDIN / "bench_client.py"))
    # The client imports transformers and torch (~8 s); let it cache bytecode so that
    # later runs on the same machine skip the compile.
    monkeypatch.delenv("PYTHONDONTWRITEBYTECODE", raising=False)
    out = tmp_path / "trace.json"
    r = bcgtune(
        "trace",
        "--live",
        "--profile",
        str(profile),
        "--workdir",
        str(tmp_path / "run"),
        "-o",
        str(out),
        "--json",
        "--",
        "--backend",
        "sglang",
        "--tokenizer",
        str(model_dir),
        "--dataset-name",
        "random-ids",
        "--random-input-len",
        "300",
        "--random-output-len",
        "4",
        "--num-prompts",
        "8",
        "--max-concurrency",
        "4",
        timeout=HANG_S,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    t = json.loads(out.read_text())
    live = t["meta"]["live"]
    assert t["origin"] == "sglang-live"
    assert live["bench_result"]["completed"] == 8 and live["bench_result"]["backend"] == "sglang"
    assert len(live["profile_sha256"]) == 64 and live["launch_command"][1].endswith("server.py")
    assert "--cuda-graph-bs-prefill" in live["launch_command"]
    assert live["bench_command"][-2] == "--output-file"
    assert t["summary"]["batches"] >= 2
    assert set(t["batches"]["graph"]) <= {0, 1} and 1 in t["batches"]["graph"]
    assert set(t["batches"]["images"]) == {0}
    assert t["captures"][0]["buckets"] == [64, 128, 256, 512, 1024, 2048]
    # the server was stopped
    assert "Received sig" in (tmp_path / "run" / "server.log").read_text()


def test_validate_thresholds_reach_the_server_check(env, profile, tmp_path, monkeypatch, capsys):
    """--gap-threshold / --max-logprob-delta apply to --server: the same noisy run that fails
    above passes when every gap counts as narrow and any logprob change is tolerated."""
    monkeypatch.setenv("STANDIN_RUNNER", "patched")
    monkeypatch.setenv("STANDIN_GRAPH_NOISE", "50")
    monkeypatch.chdir(tmp_path)
    code, out, err = _validate_server(
        capsys, profile, _probes_file(tmp_path), 0.5, "--json", "--gap-threshold", "1e6", "--max-logprob-delta", "1e6"
    )
    rep = json.loads(out)
    assert code == 0, err
    assert rep["ok"] and rep["gap_threshold"] == 1e6
