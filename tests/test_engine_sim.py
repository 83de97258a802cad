"""The simulated device (engines/sim) inside the one resolved engine configuration
(engines/config.py): `--device sim --sim-calibration CAL.json` resolves without torch into a
config whose device is "sim" and which carries its recording, checked against the model,
runner and rank asked for; engines/build.open_engine opens it before torch is needed;
calibrate and tune run on it without torch, and validate computes its outputs with a tiny
stand-in model of the same kind on the CPU."""

import dataclasses
import json
import subprocess
import sys

import pytest
from cli_helpers import assert_one_line_error, cli
from sim_helpers import H200_8B, sim_recording

from bcgtune.engines.config import resolve, standin_config
from bcgtune.engines.spec import EngineSpec
from bcgtune.errors import InputError

ROOT = H200_8B.parents[2]
WORKLOAD = ROOT / "benchmarks" / "data" / "default_workload.json"


def _sim(**kw) -> EngineSpec:
    return EngineSpec(**{"model": "qwen3-8b", "device": "sim", "sim_calibration": str(H200_8B), **kw})


def test_a_calibration_on_the_simulated_device_imports_no_torch():
    code = (
        "import sys\n"
        "from bcgtune.engines.spec import EngineSpec\n"
        "from bcgtune.services import calibrate\n"
        f"spec = EngineSpec(model='qwen3-8b', device='sim', sim_calibration={str(H200_8B)!r}, chunked_prefill_size=8192)\n"
        f"plan = calibrate.calibration_sizes(None, 8192, 512, {str(WORKLOAD)!r}, mix_every=16)\n"
        "r = calibrate.calibrate(plan, spec, warmup=1, repeats=3, model_check=True, check_batches=24, check_eager=True)\n"
        "m = r.calibration.meta\n"
        "print(m['engine']['graph_mode'], m['gpu']['gpu_name'].replace(' ', '_'), m['measurement_key']['device'],\n"
        "      m['model']['num_layers'], r.calibration.model_check is not None, 'torch' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["simulated", "simulated_NVIDIA_H200", "sim", "36", "True", "False"]


def test_the_resolved_config_carries_the_device_and_its_recording():
    cfg = resolve(_sim(), [256, 1024])
    assert (cfg.device, cfg.simulated, cfg.gpu_like, cfg.on_gpu) == ("sim", True, True, False)
    assert cfg.sim_calibration == str(H200_8B) and cfg.dtype == "bf16"  # a GPU's default, as the recording's
    key = cfg.measurement_key()
    assert key["device"] == "sim" and key["sim_calibration"] == str(H200_8B)
    # any model size: nothing is built (an 8B on a machine without a GPU)
    assert cfg.model.params > 8e9


@pytest.mark.parametrize(
    "spec, field, words",
    [
        (_sim(sim_calibration=None), "sim_calibration", "needs --sim-calibration"),
        (EngineSpec(model="tiny", device="cpu", sim_calibration=str(H200_8B)), "sim_calibration", "goes with --device sim"),
        (_sim(model="qwen3-0.6b"), None, "recorded on qwen3-8b, the run asks for --model qwen3-0.6b"),
        (_sim(runner="full"), None, "recorded with the breakable runner"),
        (_sim(tp=2), None, "recorded on one GPU (TP 1), the run asks for one rank of TP 2"),
        (_sim(tp=2, all_reduce="real"), "all_reduce", "no real ones"),
    ],
)
def test_what_the_simulated_device_cannot_replay_is_refused_when_resolving(spec, field, words):
    with pytest.raises(InputError) as exc:
        resolve(spec, [256])
    assert words in exc.value.what
    if field is not None:
        assert exc.value.field == field
    else:
        assert exc.value.where == str(H200_8B)


def test_a_recorded_rank_is_the_rank_a_run_must_ask_for(tmp_path):
    rec = sim_recording(tmp_path / "rank.json", "qwen3-30b-a3b", tp=4)
    cfg = resolve(EngineSpec(model="qwen3-30b-a3b", device="sim", sim_calibration=str(rec), tp=4), [256])
    assert cfg.parallel.tp == 4 and cfg.model.moe
    with pytest.raises(InputError, match="one rank of TP 4, the run asks for one rank of TP 2"):
        resolve(dataclasses.replace(cfg.spec, tp=2), [256])


@pytest.mark.parametrize("where", ["folder", "fifo", "stdin"])
def test_a_recording_that_is_not_a_file_is_one_line_exit_2(tmp_path, where):
    import os

    path = {"folder": str(tmp_path), "stdin": "-"}.get(where)
    if where == "fifo":
        path = str(tmp_path / "fifo")
        os.mkfifo(path)
    r = cli(["capture", "--buckets", "256", "--device", "sim", "--sim-calibration", path])
    assert r.code == 2, r.err
    assert_one_line_error(r)
    assert "must be a calibration file" in r.err


def test_the_session_is_opened_before_torch_and_its_engines_share_the_device():
    from bcgtune.engines.build import open_engine

    cfg = resolve(_sim(), [256, 1024])
    session = open_engine(cfg)
    env = session.report_environment()
    assert env["backend"] == "sim" and env["graph_mode"] == "simulated" and env["torch"] is None
    assert env["simulated"]["calibration"] == str(H200_8B) and env["gpu_memory_gib"] == pytest.approx(139.8)
    assert session.description["name"] == "qwen3-8b" and session.description["num_layers"] == 36
    engine = session.engine
    assert engine.max_tokens == 1024 and engine.segment_count(256) == 37
    engine.capture([256, 1024])
    other = session.new_engine(512)
    assert other.device is engine.device and not other.graphs  # the same device, its own pool
    t0 = engine.device.now_ms()
    engine.replay_call(engine.inputs(200, requests=2), 256)()
    assert engine.device.now_ms() > t0  # a replay takes simulated time


def test_validate_on_the_simulated_device_computes_with_a_stand_in_of_the_same_kind(tmp_path):
    pytest.importorskip("torch")
    from bcgtune.services.validate import run_validate

    rep = run_validate([128, 256], _sim(), sizes_per_bucket=1)
    assert rep.ok and rep.batches_checked > 0
    assert "tiny stand-in model on the CPU" in rep.environment["numerics"]
    assert rep.environment["backend"] == "sim" and rep.model["name"] == "qwen3-8b"
    moe = sim_recording(tmp_path / "moe.json", "qwen3-30b-a3b")
    vl = sim_recording(tmp_path / "vl.json", "qwen3-vl-8b")
    kinds = [
        standin_config(resolve(EngineSpec(model=m, device="sim", sim_calibration=str(r)), [256]), 256).model.name
        for m, r in (("qwen3-8b", H200_8B), ("qwen3-30b-a3b", moe), ("qwen3-vl-8b", vl))
    ]
    assert kinds == ["tiny", "tiny-moe", "qwen3-vl-tiny"]


def test_a_tune_on_the_simulated_device_validates_with_the_stand_in_and_resumes(tmp_path):
    pytest.importorskip("torch")
    state = tmp_path / "state"
    args = ["tune", str(WORKLOAD), "--model", "qwen3-8b", "--device", "sim", "--sim-calibration", str(H200_8B)]
    args += ["--chunked-prefill-size", "8192", "--state-dir", str(state), "--grid", "512", "--mix-every", "16"]
    args += ["--check-batches", "24", "--proof-batches", "24", "--measure-rounds", "1", "--json"]
    r = cli(args)
    assert r.code == 0, r.err[-3000:]
    doc = json.loads(r.out)
    assert doc["engine"]["device"] == "sim" and doc["engine"]["sim_calibration"] == str(H200_8B)
    assert doc["steps"]["validate"]["ok"] and "stand-in" in doc["steps"]["validate"]["numerics"]
    assert doc["steps"]["proof"]["timer"] == "simulated clock" and doc["buckets"]
    assert doc["budget"]["clock"] == "simulated"
    again = cli(args)
    assert again.code == 0, again.err[-3000:]
    assert json.loads(again.out)["resumed"] == ["plan", "calibrate", "optimum", "measure", "validate", "proof"]
