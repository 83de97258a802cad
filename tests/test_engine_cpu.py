"""Engine logic on CPU with the tiny models: eager path, padded static-buffer replay
(mode padded-eager), comparisons, pad invariance, image inputs, CLI exit codes."""

import json
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

from typer.testing import CliRunner  # noqa: E402

from bcgtune.cli.app import app  # noqa: E402
from bcgtune.engines.compare import check_pad_invariance, compare_logits  # noqa: E402
from bcgtune.engines.full import FullPrefillEngine  # noqa: E402
from bcgtune.engines.inputs import image_inputs, text_inputs  # noqa: E402
from bcgtune.engines.models import build_model, image_token_count, mrope_positions, preset  # noqa: E402
from bcgtune.engines.sdpa import SdpaRecorder  # noqa: E402
from bcgtune.errors import InputError  # noqa: E402

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def tiny():
    return build_model(preset("tiny"), CPU, dtype=torch.float32, seed=0)


@pytest.fixture(scope="module")
def tiny_vl():
    return build_model(preset("qwen3-vl-tiny"), CPU, dtype=torch.float32, seed=0)


def test_help_does_not_import_torch():
    code = "import sys; from bcgtune.cli.app import app; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_build_is_seeded(tiny):
    again = build_model(preset("tiny"), CPU, dtype=torch.float32, seed=0)
    for a, b in zip(tiny.parameters(), again.parameters()):
        assert torch.equal(a, b)


def test_padded_replay_matches_eager_and_pads_are_invisible(tiny):
    eng = FullPrefillEngine(tiny, CPU, 64)
    recs = eng.capture([16, 32, 64])
    assert [r.bucket for r in recs] == [64, 32, 16]  # largest first
    assert all(r.ok and r.attention_match for r in recs)
    for n in (9, 16, 17, 33, 64):
        x = text_inputs(tiny, n, CPU, seed=n)
        he, le = eng.eager(x)
        hr, lr, b = eng.replay(x)
        assert b == {9: 16, 16: 16, 17: 32, 33: 64, 64: 64}[n]
        c = compare_logits(tiny, he, hr, le, lr)
        assert c.ok and c.top1_agree == 1.0 and c.max_abs_diff < 1e-4
        pi = check_pad_invariance(eng, x, b)
        assert pi.ok and pi.max_abs_diff == 0.0


def test_replay_rule_sends_small_batches_eager(tiny):
    eng = FullPrefillEngine(tiny, CPU, 64)
    eng.capture([64])
    assert eng.bucket_for(40) == 64 and eng.bucket_for(31) is None and eng.bucket_for(65) is None
    with pytest.raises(InputError):
        eng.replay(text_inputs(tiny, 20, CPU))


def test_capture_rejects_bucket_above_static_buffers(tiny):
    eng = FullPrefillEngine(tiny, CPU, 32)
    with pytest.raises(InputError, match="static buffers"):
        eng.capture([64])


def test_compare_counts_wide_gap_flips_only():
    class Ident:
        def logits(self, h):
            return h

    ref = torch.tensor([[5.0, 1.0, 0.0], [1.0, 0.9, 0.0]])
    test = torch.tensor([[1.0, 5.0, 0.0], [0.9, 1.0, 0.0]])  # wide-gap flip, then a narrow one
    c = compare_logits(Ident(), ref, test, ref[-1:], test[-1:], gap_threshold=0.7)
    assert c.wide_gap_tokens == 1 and c.wide_gap_flips == 1 and c.narrow_gap_flips == 1
    assert not c.ok
    c2 = compare_logits(Ident(), ref[1:], test[1:], ref[-1:], test[-1:], gap_threshold=0.7)
    assert c2.ok and c2.top1_agree == 0.0


def test_sdpa_recorder_sees_mask_vs_causal():
    q = torch.randn(1, 2, 4, 8)
    with SdpaRecorder() as rec:
        torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)
        m = torch.ones(4, 4, dtype=torch.bool).tril()
        torch.nn.functional.scaled_dot_product_attention(q, q, q, attn_mask=m)
    s = rec.summary()
    assert any("mask=none is_causal=True" in x for x in s) and any("mask=bool" in x for x in s)
    assert torch.nn.functional.scaled_dot_product_attention is not None


def test_image_inputs_and_mrope(tiny_vl):
    assert image_token_count(tiny_vl, 128, 128) == 16
    assert image_token_count(tiny_vl, 512, 512) == 256
    pos = mrope_positions(3, (2, 2), 2)
    assert pos.tolist() == [[0, 1, 2, 3, 3, 3, 3, 5, 6], [0, 1, 2, 3, 3, 4, 4, 5, 6], [0, 1, 2, 3, 4, 3, 4, 5, 6]]
    assert image_inputs(tiny_vl, 10, 128, CPU) is None  # 16 visual tokens do not fit
    x = image_inputs(tiny_vl, 80, 256, CPU, seed=3)
    assert x.n == 80 and x.visual_tokens == 64 and x.positions.shape == (3, 80)
    eng = FullPrefillEngine(tiny_vl, CPU, 128)
    eng.capture([128])
    x = image_inputs(tiny_vl, 100, 256, CPU, seed=3)
    he, le = eng.eager(x)
    hr, lr, b = eng.replay(x)
    assert b == 128 and compare_logits(tiny_vl, he, hr, le, lr).ok


def test_cli_validate_json_and_exit_codes(tmp_path):
    r = CliRunner().invoke(
        app, ["validate", "--buckets", "16,32", "--model", "qwen3-vl-tiny", "--json", "-o", str(tmp_path / "v.json")]
    )
    assert r.exit_code == 0, r.output
    rep = json.loads(r.stdout.strip().splitlines()[-1])
    assert rep["ok"] and rep["image_sweep"]["new_captures"] == 0 and rep["image_sweep"]["dynamo_recompiles"] == 0
    assert json.loads((tmp_path / "v.json").read_text())["kind"] == "bcgtune.validation-report"


def _main(args):
    """The real entry point in-process (cli_helpers.cli): returncode, stdout, stderr."""
    from cli_helpers import cli

    r = cli(args)
    return subprocess.CompletedProcess(args, r.code, r.out, r.err)


def test_cli_errors_are_one_line():
    r = _main(["capture", "--model", "tiny"])
    assert r.returncode == 2 and r.stderr.strip().startswith("error:") and "Traceback" not in r.stderr
    r = _main(["capture", "--buckets", "16", "--model", "nope"])
    assert r.returncode == 2 and "unknown model 'nope'" in r.stderr and "tiny-moe" in r.stderr
    r = _main(["validate", "--buckets", "16", "--model", "tiny", "--prompts", "p.txt"])
    assert r.returncode == 2 and "--server" in r.stderr
    r = _main(["validate", "--model", "tiny", "--server"])
    assert r.returncode == 2 and "--profile" in r.stderr
    r = _main(["capture", "--buckets", "16", "--model", "tiny", "--device", "cuda"])
    if not torch.cuda.is_available():
        assert r.returncode == 3 and "sees no GPU" in r.stderr


def test_cli_calibrate_writes_loadable_file(tmp_path):
    from bcgtune.files.calibration_file import load_calibration

    out = tmp_path / "cal.json"
    r = CliRunner().invoke(
        app, ["calibrate", "--model", "tiny", "--sizes", "8,32", "--repeats", "2", "--warmup", "0", "-o", str(out)]
    )
    assert r.exit_code == 0, r.output
    cal = load_calibration(out)
    assert cal.tokens.tolist() == [8, 32]
    assert cal.meta["software"]["torch"] == torch.__version__
    assert cal.meta["engine"]["graph_mode"] in ("padded-eager", "cuda-graph")


def test_hf_checkpoint_errors(tmp_path):
    r = _main(["capture", "--buckets", "16", "--model", f"hf:{tmp_path}"])
    assert r.returncode == 2 and "config.json" in r.stderr


def test_hf_tiny_random_checkpoint_cpu(tmp_path):
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
    from bcgtune.engines.spec import EngineSpec

    session = open_engine(resolve(EngineSpec(model=str(tmp_path), device="cpu", random_weights=True, runner="full"), [32]))
    model, desc = session.model, session.description
    assert desc["attention_implementation"] == "bcgtune_causal_sdpa"
    eng = FullPrefillEngine(model, CPU, 32)
    recs = eng.capture([32])
    assert recs[0].ok and recs[0].attention_match
    x = text_inputs(model, 20, CPU)
    he, le = eng.eager(x)
    hr, lr, _ = eng.replay(x)
    assert compare_logits(model, he, hr, le, lr).ok


def test_cli_calibrate_grid_from_trace_feeds_suggest_buckets(tmp_path):
    """calibrate --sizes-from TRACE measures a bucket grid over the trace's range and marks
    it; suggest-buckets --objective time then picks buckets among the measured sizes only."""
    from bcgtune.files.calibration_file import load_calibration

    trace = tmp_path / "t.csv"
    trace.write_text("size,count\n20,3\n40,2\n70,5\n90,1\n")
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
            "16",
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
    assert cal.tokens.tolist() == [20, 32, 48, 64, 80, 90, 96]  # ends 20 and 90, and 32..96 (16: below every size)
    assert cal.meta["bucket_grid"] == 16 and cal.meta["sizes_from"] == str(trace)
    r = CliRunner().invoke(
        app, ["suggest-buckets", str(trace), "--objective", "time", "--calibration", str(out), "--max-buckets", "3", "--json"]
    )
    assert r.exit_code == 0, r.output
    plan = json.loads(r.output)
    assert plan["params"]["candidate_set"] == "calibration"
    assert set(plan["recommended"]["buckets"]) <= set(cal.tokens.tolist())
    r = CliRunner().invoke(
        app,
        [
            "calibrate",
            "--model",
            "tiny",
            "--sizes",
            "8,40",
            "--grid",
            "16",
            "--max-tokens",
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
    assert r.exit_code == 0, r.output  # --sizes adds to the grid; --max-tokens bounds both
    assert load_calibration(out).tokens.tolist() == [8, 16, 32]
