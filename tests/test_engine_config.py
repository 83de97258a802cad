"""One resolved engine configuration (engines/config.py): every field of the request and of
the resolved value is in the measurement key or left out of it with a reason; each option
that changes a measurement changes the key; `calibrate --extend` and a resumed tune compare
keys (a different --hf-attention is refused, as the extension's help promises); resolving
imports no torch (the simulated device resolves without it), and after it nothing but
engines/config.py reads the request."""

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest
from cli_helpers import assert_one_line_error, cli
from sim_helpers import sim_recording

from bcgtune.engines import config
from bcgtune.engines.config import LEFT_OUT_OF_KEY, SPEC_IN_KEY, EngineConfig, resolve
from bcgtune.engines.spec import EngineSpec
from bcgtune.errors import InputError

DATA = Path(__file__).parent / "data" / "models"


@pytest.fixture()
def no_torch_needed(monkeypatch):
    monkeypatch.setattr(config, "require_torch", lambda device=None: None)


def test_every_field_is_in_the_key_or_left_out_with_a_reason(no_torch_needed):
    cfg = resolve(EngineSpec(model="tiny-moe", device="cpu", tp=2), [16])
    key = cfg.measurement_key()
    fields = {f.name for f in dataclasses.fields(EngineConfig)}
    assert fields == set(key) | set(LEFT_OUT_OF_KEY)
    assert not set(LEFT_OUT_OF_KEY) & set(key) and all(LEFT_OUT_OF_KEY.values())
    par = {f.name for f in dataclasses.fields(config.Parallel)}
    assert par == set(key["parallel"]) | set(config.PARALLEL_LEFT_OUT_OF_KEY)
    assert not set(config.PARALLEL_LEFT_OUT_OF_KEY) & set(key["parallel"])
    # every option of the request lands in one field of the key
    assert set(SPEC_IN_KEY) == {f.name for f in dataclasses.fields(EngineSpec)}
    assert set(SPEC_IN_KEY.values()) <= set(key)
    json.dumps(key)  # stored in calibrations and tune states as it is


# one other valid value per option: each must change the key
OTHER = {
    "model": "tiny",
    "device": "sim",
    "dtype": "bf16",
    "sdpa_backend": "math",
    "seed": 7,
    "hf_attention": "sdpa",
    "random_weights": None,  # a built-in model is random whatever the flag: the flag does not change it
    "runner": "full",
    "chunked_prefill_size": 4096,
    "graph_impl": "bcgtune",
    "fault": None,  # needs a DeepStack model: checked below
    "tp": 4,
    "ep": 2,
    "routing": "uniform",
    "all_reduce": "real",
    "all_reduce_curve": "CURVE",
    "sim_calibration": "cal.json",
}


def test_each_option_that_changes_a_measurement_changes_the_key(no_torch_needed, tmp_path):
    curve = tmp_path / "curve.json"
    curve.write_text(json.dumps({"bytes": [1024, 1048576], "us": [9.0, 30.0]}))
    base = EngineSpec(model="tiny-moe", device="cpu", tp=2, all_reduce="modelled")
    key = resolve(base, [16]).measurement_key()
    # the simulated device replays a recording of the model and rank asked for (engines/sim)
    recordings = [sim_recording(tmp_path / f"rec{i}.json", "tiny-moe", tp=2) for i in (1, 2)]
    assert set(OTHER) == set(SPEC_IN_KEY)
    for name, value in OTHER.items():
        if value is None:
            continue
        value = str(curve) if value == "CURVE" else value
        start, start_key = base, key
        changed = dataclasses.replace(base, **{name: value})
        if name == "all_reduce":
            changed = dataclasses.replace(changed, all_reduce_curve=None)
        if name == "ep":
            changed = dataclasses.replace(changed, tp=2)
        if name == "device":
            changed = dataclasses.replace(changed, sim_calibration=str(recordings[0]))
        if name == "sim_calibration":  # one recording against another, both on the simulated device
            start = dataclasses.replace(base, device="sim", sim_calibration=str(recordings[0]))
            start_key = resolve(start, [16]).measurement_key()
            changed = dataclasses.replace(start, sim_calibration=str(recordings[1]))
        other = resolve(changed, [16]).measurement_key()
        assert config.key_differences(start_key, other), name
        assert SPEC_IN_KEY[name] in {k for k in start_key if start_key[k] != other[k]}, name
    vl = EngineSpec(model="qwen3-vl-tiny", device="cpu")
    assert config.key_differences(
        resolve(vl, [16]).measurement_key(), resolve(dataclasses.replace(vl, fault="drop-deepstack"), [16]).measurement_key()
    ) == ["fault"]


def test_a_profiles_launch_fills_what_the_options_leave(no_torch_needed, monkeypatch):
    monkeypatch.setattr(config, "gpu_device_nodes", lambda: True)  # resolved as on a GPU machine
    launch = config.Launch("p.toml", model="Qwen/Qwen3-30B-A3B-Instruct-2507-FP8", tp=4, ep=None, chunked_prefill_size=8192)
    cfg = resolve(EngineSpec(device="cuda"), [16], launch=launch)
    assert (cfg.model.name, cfg.parallel.tp, cfg.ceiling) == ("qwen3-30b-a3b", 4, 8192)
    assert cfg.parallel.dims is not None and cfg.parallel.dims.heads == 8 and cfg.parallel.dims.kv_heads == 1
    given = resolve(EngineSpec(model="qwen3-8b", device="cuda", tp=2, chunked_prefill_size=4096), [16], launch=launch)
    assert (given.model.name, given.parallel.tp, given.ceiling) == ("qwen3-8b", 2, 4096)  # the options win
    unknown = config.Launch("p.toml", model="Qwen/Qwen3.8-Flash-Next-FP8", tp=1)
    cfg = resolve(EngineSpec(device="cuda"), [16], launch=unknown)
    assert cfg.model.name == "qwen3-8b" and "not a shape bcgtune knows" in cfg.notes[0]


def test_resolving_imports_no_torch_and_the_simulated_device_needs_none(tmp_path):
    rec = sim_recording(tmp_path / "rec.json", "qwen3-moe-tiny", tp=2)  # the model folder's name, one TP-2 rank
    code = (
        "import sys, importlib.util\n"
        "real = importlib.util.find_spec\n"
        "importlib.util.find_spec = lambda n, *a: None if n == 'torch' else real(n, *a)\n"  # torch looks uninstalled
        "from bcgtune.engines.spec import EngineSpec\n"
        "from bcgtune.engines.config import resolve\n"
        f"s = EngineSpec(model={str(DATA / 'qwen3-moe-tiny')!r}, device='sim', sim_calibration={str(rec)!r}, tp=2)\n"
        "c = resolve(s, [16, 64])\n"
        "print(c.device, c.on_gpu, c.sim_calibration == s.sim_calibration, c.parallel.tp, 'torch' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["sim", "False", "True", "2", "False"]


def test_after_resolving_only_the_config_reads_the_request(monkeypatch):
    """Following a request through calibrate: its fields are read in engines/config.py and
    nowhere else (the services, the build and the runners read the resolved value)."""
    pytest.importorskip("torch")
    from bcgtune.services.calibrate import run_calibrate

    readers: set[str] = set()

    @dataclasses.dataclass(frozen=True)
    class Traced(EngineSpec):
        def __getattribute__(self, name):
            if not name.startswith("__"):
                readers.add(sys._getframe(1).f_code.co_filename)
            return super().__getattribute__(name)

    run_calibrate([16, 32], Traced(model="tiny-moe", device="cpu", tp=2), memory=False)
    ours = {str(Path(f).relative_to(Path(config.__file__).parents[2])) for f in readers if "bcgtune" in f}
    assert ours == {"bcgtune/engines/config.py"}, ours


@pytest.fixture()
def known_clock(monkeypatch):
    """Calibrations and extensions timed by a stand-in clock (tests/fake_timer.py): an
    extension's rows timed again agree with the calibration's on a busy machine too."""
    pytest.importorskip("torch")
    from fake_timer import fake_interleaved

    import bcgtune.engines.timing as timing

    monkeypatch.setattr(timing, "time_interleaved", fake_interleaved(timing.time_interleaved, [0.0, 0.01]))


@pytest.fixture()
def tiny_calibration(tmp_path, known_clock):
    out = tmp_path / "cal.json"
    r = cli(["calibrate", "--model", "tiny", "--device", "cpu", "--sizes", "16,32", "--repeats", "2", "-o", str(out)])
    assert r.code == 0, r.err
    return out


@pytest.mark.parametrize(
    "flag, value",
    [("--hf-attention", "sdpa"), ("--tp", "2"), ("--routing", "uniform"), ("--model", "tiny-moe"), ("--seed", "3")],
)
def test_extend_refuses_an_option_that_resolves_differently(tiny_calibration, flag, value):
    before = tiny_calibration.read_bytes()
    r = cli(["calibrate", "--extend", str(tiny_calibration), "--sizes", "48", flag, value])
    assert r.code == 2, r.err
    assert_one_line_error(r)
    assert flag in r.err and "differs from the calibration's engine" in r.err
    assert tiny_calibration.read_bytes() == before


def test_extend_takes_options_that_resolve_alike(tiny_calibration, tmp_path):
    out = tmp_path / "ext.json"
    same = ["--hf-attention", "causal", "--tp", "1"]
    r = cli(["calibrate", "--extend", str(tiny_calibration), "--sizes", "48", *same, "-o", str(out)])
    assert r.code == 0, r.err
    doc = json.loads(out.read_text())
    assert [row["tokens"] for row in doc["rows"]] == [16, 32, 48]
    assert doc["meta"]["shape"]["tp"] == 1 and doc["meta"]["shape"]["model"] == "tiny"


def test_a_changed_config_is_not_extended_as_if_it_were_the_measured_one(tmp_path, known_clock):
    model = tmp_path / "m"
    model.mkdir()
    raw = json.loads((DATA / "qwen3-moe-tiny" / "config.json").read_text())
    (model / "config.json").write_text(json.dumps(raw))
    cal = tmp_path / "cal.json"
    r = cli(["calibrate", "--model", str(model), "--device", "cpu", "--sizes", "16,32", "--repeats", "2", "-o", str(cal)])
    assert r.code == 0, r.err
    raw["num_experts_per_tok"] = 4
    (model / "config.json").write_text(json.dumps(raw))
    r = cli(["calibrate", "--extend", str(cal), "--sizes", "48"])
    assert r.code == 2 and "no longer resolves as it was measured" in r.err and "model" in r.err


def test_a_tune_state_of_another_engine_is_refused(tmp_path, no_torch_needed):
    from bcgtune.services.tune import TuneRequest, _identity

    trace = tmp_path / "t.csv"
    trace.write_text("size,count\n20,3\n")
    a = TuneRequest(trace=str(trace), spec=EngineSpec(model="tiny-moe", device="cpu"), state_dir=str(tmp_path))
    b = dataclasses.replace(a, spec=dataclasses.replace(a.spec, routing="uniform"))
    c = dataclasses.replace(a, spec=dataclasses.replace(a.spec, hf_attention="sdpa"))
    assert _identity(a, "x")["engine"] != _identity(b, "x")["engine"] != _identity(c, "x")["engine"]
    assert _identity(a, "x") == _identity(dataclasses.replace(a), "x")


def test_bad_parallel_and_model_options_are_one_line_errors(tmp_path):
    cases = [
        (["capture", "--buckets", "16", "--model", "tiny", "--device", "cpu", "--tp", "3"], "--tp"),
        (["capture", "--buckets", "16", "--model", "tiny-moe", "--device", "cpu", "--tp", "2", "--ep", "4"], "--ep"),
        (["capture", "--buckets", "16", "--model", "tiny", "--device", "cpu", "--tp", "0"], "--tp"),
        (["capture", "--buckets", "16", "--model", "tiny", "--routing", "even"], "--routing"),
        (["capture", "--buckets", "16", "--model", str(tmp_path / "nothing.json")], "nothing.json"),
        (["capture", "--buckets", "16", "--model", "tiny", "--tp", "2", "--all-reduce-curve", str(tmp_path)], str(tmp_path)),
    ]
    for args, where in cases:
        r = cli(args)
        assert r.code == 2, (args, r.err)
        assert_one_line_error(r)
        assert where in r.err, (args, r.err)


def test_input_error_fields_name_the_options(no_torch_needed):
    with pytest.raises(InputError) as exc:
        resolve(EngineSpec(model="tiny", device="cpu", tp=2, all_reduce="real", all_reduce_curve="x.json"), [16])
    assert exc.value.field == "all_reduce_curve"
