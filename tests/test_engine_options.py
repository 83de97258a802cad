"""The torch engine's options, without torch: closed sets refused at parse time with the
allowed values listed (before torch is even looked for), empty values refused instead of read
as unset, and a run on the CPU letting OpenMP threads sleep. What a CPU dry run does with
torch is tests/test_engine_cpu_dry_run.py."""

import importlib.util
import os
from typing import get_args

import pytest
from cli_helpers import assert_one_line_error, cli

from bcgtune.engines import choices
from bcgtune.errors import InputError

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
    from bcgtune.core.plan.calibration import RUNNERS as CALIBRATION_RUNNERS

    for enum, literal in (
        (choices.Runner, choices.RunnerName),
        (choices.GraphImpl, choices.GraphImplName),
        (choices.Dtype, choices.DtypeName),
        (choices.SdpaBackend, choices.SdpaBackendName),
        (choices.HfAttention, choices.HfAttentionName),
    ):
        assert tuple(m.value for m in enum) == get_args(literal)
    assert tuple(CALIBRATION_RUNNERS) == get_args(choices.RunnerName)
    assert choices.device_name(" CUDA:3 ") == "cuda:3" and choices.device_name("cpu") == "cpu"
    for bad in ("", "cuda:", "cuda:01", "cuda:-1", "mps", "cpu0"):
        with pytest.raises(ValueError, match="must be auto, cpu, cuda or cuda:N"):
            choices.device_name(bad)


def test_a_cpu_run_lets_openmp_threads_sleep_unless_told_otherwise(monkeypatch):
    from bcgtune.engines import config
    from bcgtune.engines.spec import EngineSpec

    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    monkeypatch.setattr(config, "require_torch", lambda device=None: None)  # the check runs before torch loads
    monkeypatch.setattr(config, "gpu_device_nodes", lambda: True)
    config.resolve(EngineSpec(model="tiny", device="auto"), [16])  # a GPU answers: nothing set
    assert "OMP_WAIT_POLICY" not in os.environ
    config.resolve(EngineSpec(model="tiny", device="cpu"), [16])
    assert os.environ["OMP_WAIT_POLICY"] == "PASSIVE"
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    monkeypatch.setattr(config, "gpu_device_nodes", lambda: False)
    config.resolve(EngineSpec(model="tiny", device="auto"), [16])  # no GPU here: a CPU run, but the user's choice stands
    assert os.environ["OMP_WAIT_POLICY"] == "ACTIVE"


def test_a_runs_checks_are_one_step_before_anything_is_built(monkeypatch):
    # the runner, the attention it can run, the model, the sizes and the device: all refused by
    # config.resolve, before torch loads or a model is built, each naming its option's field
    from bcgtune.engines import config
    from bcgtune.engines.spec import EngineSpec

    monkeypatch.setattr(config, "require_torch", lambda device=None: None)
    for spec, field, match in (
        (EngineSpec(model="tiny", runner="piecewise"), "runner", "must be breakable, full"),  # type: ignore[arg-type]
        (EngineSpec(model="tiny", hf_attention="flash"), "hf_attention", "must be causal, sdpa"),  # type: ignore[arg-type]
        (EngineSpec(model="tiny", routing="even"), "routing", "must be uniform, skewed"),  # type: ignore[arg-type]
        (EngineSpec(model="tiny", tp=3), "tp", "do not divide over 3 ranks"),
        (EngineSpec(model="tiny-moe", tp=2, ep=4), "ep", "multiple of the expert parallel size"),
        (EngineSpec(model="nope"), "model", "unknown model"),
    ):
        with pytest.raises(InputError, match=match) as exc:
            config.resolve(spec, [16])
        assert exc.value.field == field
    with pytest.raises(InputError, match="above the chunked-prefill ceiling"):
        config.resolve(EngineSpec(model="tiny", chunked_prefill_size=64), [128])
    assert config.resolve(EngineSpec(model="tiny", device="cpu"), [16]).model.name == "tiny"
