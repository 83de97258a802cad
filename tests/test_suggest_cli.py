import json
import os
import subprocess
import sys

import numpy as np
import pytest
from cli_helpers import HANG_S
from typer.testing import CliRunner

from bcgtune.cli.app import app
from bcgtune.core.sglang.ladder import sglang_default_ladder
from bcgtune.core.sglang.replay import evaluate_list
from bcgtune.core.trace.prefill_trace import PrefillTrace
from bcgtune.files.trace_file import load_trace, save_trace

runner = CliRunner()


def run_cli(*args):
    """The real entry point in a subprocess: exit code, stdout, stderr."""
    p = subprocess.run([sys.executable, "-m", "bcgtune", *args], capture_output=True, text=True, timeout=HANG_S)
    return p.returncode, p.stdout, p.stderr


@pytest.fixture
def trace_csv(tmp_path):
    rng = np.random.default_rng(0)
    x = np.clip(rng.lognormal(7, 0.7, 3000).astype(int), 8, 8192)
    t = PrefillTrace.from_sizes(x)
    path = tmp_path / "t.csv"
    save_trace(t, str(path))
    return path, t


def test_json_output_recommended_is_optimal_and_rows_present(trace_csv):
    path, t = trace_csv
    r = runner.invoke(
        app,
        [
            "suggest-buckets",
            str(path),
            "--max-buckets",
            "8",
            "--json",
            "--kmeans",
            "--compare",
            "mine=256 512 1024 2048 4096 8192",
        ],
    )
    assert r.exit_code == 0, r.output
    obj = json.loads(r.stdout)
    assert obj["format_version"] == 1
    rec = obj["recommended"]["buckets"]
    assert 1 <= len(rec) <= 8
    names = [row["name"] for row in obj["comparison"]]
    assert names[0] == "bcgtune (optimal)"
    assert any(n.startswith("SGLang default ladder") for n in names)
    assert "mine" in names and any(n.startswith("KMeans") for n in names) and any(n.startswith("quantiles") for n in names)
    opt = obj["comparison"][0]
    for row in obj["comparison"]:
        if row["graphs"] <= 8:  # nothing with as many graphs beats the optimum
            assert (opt["eager_batches"], opt["padded_tokens"]) <= (row["eager_batches"], row["padded_tokens"])
    ladder = next(r for r in obj["comparison"] if r["kind"] == "sglang-default")
    assert ladder["buckets"] == sglang_default_ladder(8192)
    m = evaluate_list(t.sizes, t.counts, rec)
    assert m.padded_tokens == opt["padded_tokens"]
    assert len(obj["curve"]) == 8
    assert obj["recommended"]["flag"] == "--cuda-graph-bs-prefill " + " ".join(map(str, rec))


def test_human_output_ends_with_paste_ready_flag(trace_csv):
    path, _ = trace_csv
    r = runner.invoke(app, ["suggest-buckets", str(path), "-k", "6", "--no-baselines"])
    assert r.exit_code == 0, r.output
    last = r.stdout.strip().splitlines()[-1]
    assert last.startswith("--cuda-graph-bs-prefill ")
    assert "waste vs number of buckets" in r.stdout
    assert "smallest K that replays every batch" in r.stdout


def test_alignment_from_layout_and_max_bucket(trace_csv):
    path, _ = trace_csv
    # DP attention with tp 8, dp 2: attention TP size 4 -> every bucket a multiple of 4
    r = runner.invoke(
        app, ["suggest-buckets", str(path), "--json", "--tp", "8", "--dp", "2", "--dp-attention", "--max-bucket", "4096"]
    )
    assert r.exit_code == 0, r.output
    obj = json.loads(r.stdout)
    assert obj["params"]["align"] == 4
    assert all(b % 4 == 0 and b <= 4096 for b in obj["recommended"]["buckets"])


def test_plain_and_json_trace_inputs_agree(tmp_path, trace_csv):
    _, t = trace_csv
    plain = tmp_path / "sizes.txt"
    plain.write_text("# one size per line\n" + "\n".join(str(s) for s, c in zip(t.sizes, t.counts) for _ in range(c)) + "\n")
    js = tmp_path / "t.json"
    save_trace(t, str(js))
    outs = []
    for p in (plain, js):
        r = runner.invoke(app, ["suggest-buckets", str(p), "--json", "--no-baselines"])
        assert r.exit_code == 0, r.output
        outs.append(json.loads(r.stdout)["recommended"]["buckets"])
    assert outs[0] == outs[1]
    assert load_trace(str(js)).n_batches == t.n_batches


def test_plot_writes_png(tmp_path, trace_csv):
    path, _ = trace_csv
    png = tmp_path / "plan.png"
    r = runner.invoke(app, ["suggest-buckets", str(path), "-k", "4", "--plot", str(png), "--no-baselines"])
    assert r.exit_code == 0, r.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    "content,args,needle",
    [
        (None, [], "no such file"),
        ("", [], "empty"),
        ("size,count\n", [], "empty"),
        ("12\nabc\n", [], "not an integer"),
        ("12\n-5\n", [], "greater than or equal to 1"),
        ("size,count\n10,x\n", [], "not an integer"),
        ("100\n200\n", ["--max-buckets", "0"], "max-buckets"),
        ("100\n200\n", ["--align", "0"], "align"),
        ("100\n200\n", ["--max-bucket", "50"], "max-bucket"),
        ("100\n200\n", ["--compare", "1 2 x"], "--compare"),
        ("100\n200\n", ["--objective", "time"], "calibration"),
        ('{"format_version": 99, "histogram": {"sizes": [1], "counts": [1]}}', [], "format_version"),
    ],
)
def test_bad_input_is_one_line_error(tmp_path, content, args, needle):
    path = tmp_path / "trace.txt"
    if content is not None:
        path.write_text(content)
    code, out, err = run_cli("suggest-buckets", str(path), *args)
    assert code == 2, (out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert needle in lines[0]
    assert "Traceback" not in err


def test_help_imports_no_torch_sglang_or_sklearn():
    code = (
        "import sys\n"
        "from bcgtune.cli.app import main\n"
        "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
        "for cmd in ['trace', 'suggest-buckets']:\n"
        "    try:\n        main([cmd, '--help'])\n    except SystemExit:\n        pass\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'sglang', 'sklearn', 'matplotlib', "
        "'transformers'))\n"
        "print('HEAVY', bad)\n"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=HANG_S)
    assert p.returncode == 0, p.stderr
    assert "HEAVY []" in p.stdout, p.stdout[-500:]


def test_write_profile_creates_from_base_and_serve_uses_it(tmp_path, trace_csv):
    from bcgtune.files.profile_file import load_profile

    path, _ = trace_csv
    prof = tmp_path / "tuned.toml"
    r = runner.invoke(
        app,
        [
            "suggest-buckets",
            str(path),
            "-k",
            "5",
            "--json",
            "--no-baselines",
            "--write-profile",
            str(prof),
            "--base-profile",
            "mi355x",
            "--unchecked",
        ],
    )
    assert r.exit_code == 0, r.output
    rec = json.loads(r.stdout)["recommended"]["buckets"]
    p = load_profile(str(prof))
    assert p.buckets == rec
    # the rest of the base profile is kept; the chunk priced is written (the MI355X's default, 16384)
    assert p.server == {**load_profile("mi355x").server, "chunked_prefill_size": 16384}
    # updating an existing profile replaces only the list
    r = runner.invoke(
        app, ["suggest-buckets", str(path), "-k", "3", "--json", "--no-baselines", "--write-profile", str(prof), "--unchecked"]
    )
    assert r.exit_code == 0, r.output
    assert load_profile(str(prof)).buckets == json.loads(r.stdout)["recommended"]["buckets"]


def test_padding_result_points_to_the_time_objective(trace_csv, tmp_path):
    path, _ = trace_csv
    r = runner.invoke(app, ["suggest-buckets", str(path), "--max-buckets", "8"])
    assert r.exit_code == 0 and "padded tokens are a proxy" in r.stdout and "--objective time" in r.stdout
    cal = _calibration_csv(tmp_path)
    r = runner.invoke(app, ["suggest-buckets", str(path), "--max-buckets", "8", "--objective", "time", "--calibration", str(cal)])
    assert r.exit_code == 0 and "padded tokens are a proxy" not in r.stdout


def _calibration_csv(tmp_path):
    # replay time with a tile dip at 1024 (cheaper than 960), eager flat: a grid calibration
    rows = [(t, 30.0, 4.0 + t / 100.0 - (2.0 if t % 1024 == 0 else 0.0)) for t in range(64, 8193, 64)]
    cal = tmp_path / "cal.csv"
    cal.write_text("tokens,eager_ms,graph_ms\n" + "".join(f"{t},{e},{g}\n" for t, e, g in rows))
    return cal


def test_candidates_calibration_picks_measured_sizes(tmp_path, trace_csv):
    path, _ = trace_csv
    cal = _calibration_csv(tmp_path)
    base = ["suggest-buckets", str(path), "--objective", "time", "--calibration", str(cal), "--max-buckets", "6", "--json"]
    auto = json.loads(runner.invoke(app, base).stdout)
    assert auto["params"]["candidate_set"] == "trace"  # a CSV carries no grid mark
    r = runner.invoke(app, base + ["--candidates", "calibration"])
    assert r.exit_code == 0, r.output
    got = json.loads(r.stdout)
    assert got["params"]["candidate_set"] == "calibration"
    assert all(b % 64 == 0 for b in got["recommended"]["buckets"])
    # priced by the measured model, the trace-model list is no better (the optimum is exact)
    from bcgtune.core.plan.optimizer import predicted_time_ms
    from bcgtune.files.calibration_file import load_calibration

    t = load_trace(str(path))
    c = load_calibration(str(cal))
    mine = predicted_time_ms(t.sizes, t.counts, got["recommended"]["buckets"], c, candidates="calibration")
    assert got["recommended"]["predicted_ms"] == pytest.approx(mine)
    other = predicted_time_ms(t.sizes, t.counts, auto["recommended"]["buckets"], c, candidates="calibration")
    assert mine <= other + 1e-6
    assert 1024 in got["recommended"]["buckets"]  # the dip is taken
    rc, _, err = run_cli(*base[:-1], "--candidates", "rows")
    assert rc == 2 and "--candidates" in err and err.count("\n") == 1
    rc, _, err = run_cli("suggest-buckets", str(path), "--candidates", "calibration")
    assert rc == 2 and "--calibration" in err


def test_help_keeps_literal_brackets():
    """Rich markup would swallow '[buckets]' and '[a, b]' in help texts; they are escaped."""
    import os

    env = dict(os.environ, COLUMNS="250", TERM="dumb")
    for cmd, needle in (
        ("suggest-buckets", "profile's [buckets]"),
        ("trace", "[max(floor(L*r),1), L]"),
        ("validate", "[buckets].list"),
        ("serve", "[profile].model"),
    ):
        p = subprocess.run(
            [sys.executable, "-m", "bcgtune", cmd, "--help"], capture_output=True, text=True, env=env, timeout=HANG_S
        )
        assert p.returncode == 0 and needle in p.stdout, (cmd, p.stdout[-500:])


def test_time_objective_with_interpolated_candidates_says_so(tmp_path, trace_csv):
    path, _ = trace_csv
    cal = _calibration_csv(tmp_path)
    base = ["suggest-buckets", str(path), "--objective", "time", "--calibration", str(cal), "--max-buckets", "4"]
    assert "--grid 64" in runner.invoke(app, base).stdout
    assert "--grid 64" not in runner.invoke(app, base + ["--candidates", "calibration"]).stdout


def test_the_default_run_imports_no_renderer_or_service_it_does_not_draw(tmp_path):
    # the first line of suggest-buckets is drawn by cli/render/launch.py; doctor's renderer,
    # doctor's service and the server launcher belong to other commands
    code = (
        "import sys\n"
        "from bcgtune.cli.app import main\n"
        "try:\n    main(['suggest-buckets'])\nexcept SystemExit:\n    pass\n"
        "bad = sorted(m for m in sys.modules if m in ('bcgtune.cli.render.doctor', 'bcgtune.services.doctor',"
        " 'bcgtune.adapters.sglang.runner_source', 'bcgtune.engines.build', 'torch', 'sglang', 'sklearn'))\n"
        "print('LOADED', bad)\n"
    )
    env = {**os.environ, "BCGTUNE_SGLANG_PROBE": "off", "BCGTUNE_CACHE_DIR": str(tmp_path)}
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, env=env)
    assert p.returncode == 0, p.stderr
    assert "LOADED []" in p.stdout, p.stdout[-500:]


def test_a_server_log_given_as_a_trace_says_what_it_is(tmp_path):
    from pathlib import Path

    from cli_helpers import cli

    log = Path(__file__).parent / "data" / "sglang-logs" / "02_gke_indented_dp7_tp7.log"
    r = cli(["suggest-buckets", str(log)])
    assert r.code == 2 and "an SGLang server log, not a trace" in r.err and "trace --log" in r.err
    # a JSON trace quotes malformed prefill lines among its parse figures: still read as a trace
    bad = tmp_path / "server.log"
    bad.write_text(
        "[2026-08-27 00:00:01 TP0] Prefill batch. #new-seq: 1, #new-token: 700, #cached-token: 0, #running-req: 0, "
        "#queue-req: 0\n[2026-08-27 00:00:02 TP0] Prefill batch. #new-seq: 1, #new-token: x\n"
    )
    out = tmp_path / "t.json"
    assert cli(["trace", "--log", str(bad), "-o", str(out), "--quiet"]).code == 0
    assert "Prefill batch" in out.read_text()
    assert cli(["suggest-buckets", str(out), "--quiet"]).code == 0


def test_a_trace_whose_comments_name_log_lines_is_still_a_trace(tmp_path):
    from cli_helpers import cli

    p = tmp_path / "sizes.txt"
    p.write_text("# Prefill batch sizes from server.log (Decode batch lines left out)\n700\n1200  # one prefill batch\n")
    r = cli(["suggest-buckets", str(p), "--quiet"])
    assert r.code == 0, r.err[-1000:]
