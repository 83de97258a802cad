"""The torch engine's options: closed sets refused at parse time with the allowed values
listed (before torch is even looked for), empty values refused instead of read as unset,
and what a CPU dry run does differently from a GPU run (no capture warm-up of attention,
one timed round by default, SDPA's tiled flash kernel)."""

import importlib.util
import os
from typing import get_args

import pytest
from cli_helpers import assert_one_line_error, cli

from bcgtune.engines import choices

BAD_CHOICES = [
    ("--graph-impl", "bogus", ("auto", "sglang", "bcgtune")),
    ("--runner", "piecewise", ("breakable", "full")),
    ("--dtype", "fp8", ("auto", "bf16", "fp16", "fp32")),
    ("--sdpa-backend", "fast", ("auto", "flash", "efficient", "cudnn", "math", "none")),
    ("--hf-attention", "eager", ("causal", "sdpa")),
    ("--device", "tpu", ("auto", "cpu", "cuda", "cuda:N")),
    ("--device", "", ("auto", "cpu", "cuda", "cuda:N")),
    ("--device", "cuda:x", ("auto", "cpu", "cuda", "cuda:N")),
]


@pytest.fixture()
def no_torch(monkeypatch):
    """torch looks uninstalled: a command that got past parsing would say 'needs torch'."""
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torch" else real(name, *a))


@pytest.mark.parametrize("flag, value, allowed", BAD_CHOICES)
@pytest.mark.parametrize("command", ["capture", "validate", "calibrate"])
def test_unknown_engine_choices_are_refused_at_parse_time(no_torch, tmp_path, command, flag, value, allowed):
    args = [command, "--model", "tiny", flag, value]
    args += ["-o", str(tmp_path / "cal.json")] if command == "calibrate" else ["--buckets", "16"]
    r = cli(args)
    assert r.code == 2, r.err
    assert_one_line_error(r)
    line = r.err.strip().splitlines()[-1]
    assert flag in line and "needs torch" not in line, line
    assert all(a in line for a in allowed), line
    assert not (tmp_path / "cal.json").exists()


@pytest.mark.parametrize(
    "args, flag",
    [
        (["calibrate", "--model", "tiny", "--sizes", "", "-o", "OUT"], "--sizes"),
        (["calibrate", "--model", "tiny", "--sizes", " , ", "-o", "OUT"], "--sizes"),
        (["calibrate", "--model", "tiny", "--sizes-from", "", "-o", "OUT"], "--sizes-from"),
        (["calibrate", "--model", "tiny", "--grid", "64", "--sizes", "", "-o", "OUT"], "--sizes"),
        (["capture", "--model", "tiny", "--buckets", ""], "--buckets"),
        (["validate", "--model", "tiny", "--buckets", ""], "--buckets"),
        (["validate", "--model", "tiny", "--buckets", "16", "--requests", ""], "--requests"),
    ],
)
def test_empty_values_are_errors_not_defaults(no_torch, tmp_path, args, flag):
    out = tmp_path / "cal.json"
    r = cli([str(out) if a == "OUT" else a for a in args])
    assert r.code == 2, r.err
    assert_one_line_error(r)
    assert flag in r.err and "needs torch" not in r.err
    assert not out.exists()


def test_the_closed_sets_agree_with_the_engine():
    from bcgtune.core.calibration import RUNNERS as CALIBRATION_RUNNERS
    from bcgtune.engines.segmented import IMPLEMENTATIONS

    for enum, literal in (
        (choices.Runner, choices.RunnerName),
        (choices.GraphImpl, choices.GraphImplName),
        (choices.Dtype, choices.DtypeName),
        (choices.SdpaBackend, choices.SdpaBackendName),
        (choices.HfAttention, choices.HfAttentionName),
    ):
        assert tuple(m.value for m in enum) == get_args(literal)
    assert tuple(CALIBRATION_RUNNERS) == get_args(choices.RunnerName)
    assert IMPLEMENTATIONS == get_args(choices.GraphImplName)
    from bcgtune.engines.base import SIDE_INPUT_LABELS

    assert tuple(SIDE_INPUT_LABELS) == get_args(choices.SideInputName)
    assert choices.device_name(" CUDA:3 ") == "cuda:3" and choices.device_name("cpu") == "cpu"
    for bad in ("", "cuda:", "cuda:01", "cuda:-1", "mps", "cpu0"):
        with pytest.raises(ValueError, match="must be auto, cpu, cuda or cuda:N"):
            choices.device_name(bad)


torch = pytest.importorskip("torch")


def test_dtype_names_are_the_loaders():
    from bcgtune.engines.loader import DTYPES

    assert {"auto", *DTYPES} == set(get_args(choices.DtypeName))


def test_cpu_capture_runs_each_buckets_segments_once_without_attention(monkeypatch):
    """No GPU: a capture runs what the graph would hold (the segments), once, and never the
    attention over the whole bucket (its cost grows with the square of the bucket)."""
    import bcgtune.engines.breakable as bk
    from bcgtune.engines.breakable import BreakablePrefillEngine
    from bcgtune.engines.models import build_model, preset

    cpu = torch.device("cpu")
    model = build_model(preset("tiny"), cpu, dtype=torch.float32)
    eng = BreakablePrefillEngine(model, cpu, 256, warmup=5)
    sdpa, bodies = [], []
    real_sdpa, real_body = bk.F.scaled_dot_product_attention, model.body
    monkeypatch.setattr(bk.F, "scaled_dot_product_attention", lambda *a, **k: sdpa.append(1) or real_sdpa(*a, **k))
    monkeypatch.setattr(model, "body", lambda *a: bodies.append(a[0].shape[0]) or real_body(*a))
    recs = eng.capture([64, 256])
    assert all(r.ok for r in recs) and sdpa == [] and bodies == [256, 64]
    from bcgtune.engines.inputs import text_inputs

    eng.replay(text_inputs(model, 200, cpu, requests=2))
    assert len(sdpa) == 2 * model.cfg.num_layers  # replay runs attention on each request's rows


def test_cpu_calibration_defaults_to_one_round_and_sdpa_flash():
    from bcgtune.engines.build import EngineSpec
    from bcgtune.services.calibrate import CPU_ROUNDS, GPU_ROUNDS, run_calibrate

    assert GPU_ROUNDS == (3, 10) and CPU_ROUNDS == (0, 1)
    spec = EngineSpec(model="tiny", device="cpu")
    result = run_calibrate([16, 32], spec, memory=False)
    eng = result.calibration.meta["engine"]
    assert (eng["warmup"], eng["repeats"]) == CPU_ROUNDS and eng["sdpa_backend"] == "flash"
    assert all(len(r) == 1 for r in result.rounds.graph_ms + result.rounds.eager_ms)
    assert result.calibration.meta["capture_s"] == {}  # declared, not captured: the round runs every bucket
    result = run_calibrate([16, 32], spec, warmup=1, repeats=3, memory=False)  # given values are kept
    assert (result.calibration.meta["engine"]["warmup"], result.calibration.meta["engine"]["repeats"]) == (1, 3)
    assert all(len(r) == 3 for r in result.rounds.graph_ms)


def test_a_cpu_run_lets_openmp_threads_sleep_unless_told_otherwise(monkeypatch):
    from bcgtune.engines import preflight

    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    monkeypatch.setattr(preflight, "gpu_device_nodes", lambda: True)
    preflight.check_run("tiny", "auto", [16])  # a GPU may answer: nothing set
    assert "OMP_WAIT_POLICY" not in os.environ
    preflight.check_run("tiny", "cpu", [16])
    assert os.environ["OMP_WAIT_POLICY"] == "PASSIVE"
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    monkeypatch.setattr(preflight, "gpu_device_nodes", lambda: False)
    preflight.check_run("tiny", "auto", [16])  # no GPU here: a CPU run, but the user's choice stands
    assert os.environ["OMP_WAIT_POLICY"] == "ACTIVE"
