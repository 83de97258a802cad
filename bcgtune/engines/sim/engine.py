"""The engine of the simulated device: the interface the services drive on a real engine
(engines/base.StaticPrefillEngine: capture, replay and eager calls, graph memory, release),
with every call a draw of the simulated device (device.py) and no tensor computed.

What it simulates: captures (each graph drawn an offset against the mean of its size, the
capture's time on the clock, graph memory from the recording), a breakable replay (its
bucket's segments plus its breaks) or a whole-forward one, an eager forward (its host part
at the host's speed). What it does not: numerics. `validate` on the simulated device runs
the runner's real code on a tiny stand-in model on the CPU (`NumericsOnSim`), charging each
forward to the simulated clock as the simulated GPU would take it; its report says so.
"""

from __future__ import annotations

import functools
import hashlib
import os
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import numpy as np

from bcgtune.core.sglang.replay import DEFAULT_PADDING_FACTOR, assign_buckets
from bcgtune.engines.records import CaptureRecord
from bcgtune.engines.sim.device import SimDevice, sim_device
from bcgtune.engines.sim.noise import FITTED, NoiseProfile
from bcgtune.engines.sim.truth import SimTruth
from bcgtune.errors import InputError

SIM_MODE = "simulated"


@dataclass(frozen=True)
class SimBatch:
    """A batch on the simulated device: its size and request count (nothing to compute)."""

    n: int
    requests: int = 1
    kind: str = "text"


@dataclass
class SimRecording:
    """A recorded calibration loaded for the simulated device: the calibration, where it
    came from, and its content hash (the key of its simulated devices)."""

    calibration: Any
    path: str
    sha256: str
    model: dict[str, Any]
    gpu: str

    @property
    def model_name(self) -> str | None:
        name = self.model.get("name")
        return str(name) if isinstance(name, str) and name else None


_RECORDINGS: dict[str, SimRecording] = {}


def load_recording(path: str) -> SimRecording:
    """The recorded calibration at `path` (read once per process), checked as every
    calibration is (files.calibration_file)."""
    from bcgtune.files.calibration_file import load_calibration

    key = os.path.realpath(path)
    got = _RECORDINGS.get(key)
    if got is not None:
        return got
    cal = load_calibration(path)
    with open(path, "rb") as fh:
        digest = hashlib.sha256(fh.read()).hexdigest()
    meta = cal.meta if isinstance(cal.meta, dict) else {}
    found = meta.get("model")
    model: dict[str, Any] = found if isinstance(found, dict) else {}
    gpu = (meta.get("gpu") or {}).get("gpu_name") if isinstance(meta.get("gpu"), dict) else None
    rec = SimRecording(cal, path, digest, model, str(gpu or "a GPU"))
    _RECORDINGS[key] = rec
    return rec


def check_sim_spec(spec: Any, model_name: str | None = None) -> SimRecording:
    """The recording a simulated run times: given, readable, of the runner asked for, and of
    the model asked for when it names one (one line naming the flag otherwise)."""
    path = getattr(spec, "sim_calibration", None)
    if not path:
        raise InputError("--device sim needs --sim-calibration CAL.json (a calibration recorded on a GPU)", "--sim-calibration")
    rec = load_recording(path)
    if rec.calibration.runner != spec.runner:
        raise InputError(
            f"this calibration was recorded with the {rec.calibration.runner} runner, the run asks for --runner {spec.runner}",
            path,
        )
    if model_name is not None and rec.model_name is not None and rec.model_name != model_name:
        raise InputError(f"this calibration was recorded on {rec.model_name}, the run asks for --model {model_name}", path)
    return rec


def device_of(spec: Any, profile: NoiseProfile = FITTED) -> SimDevice:
    """The simulated device a spec runs on (one per recording and seed in this process)."""
    rec = check_sim_spec(spec)
    return sim_device(rec.sha256, lambda: SimTruth(rec.calibration, profile, spec.seed), profile, spec.seed)


class SimEngine:
    """The simulated device's engine (the interface of engines/base.StaticPrefillEngine)."""

    simulated = True
    graphs_enabled = True
    mode = SIM_MODE
    graph_impl = SIM_MODE
    attention_kind = SIM_MODE

    def __init__(self, device: SimDevice, runner: str, max_tokens: int, warmup: int, model: dict[str, Any]):
        if max_tokens < 1:
            raise InputError(f"max tokens must be positive, got {max_tokens}")
        self.device, self.runner, self.max_tokens = device, runner, int(max_tokens)
        self.warmup = max(0, int(warmup))
        self.padding_factor = DEFAULT_PADDING_FACTOR
        self.model = SimpleNamespace(**model)
        self.impl = SimpleNamespace(name=SIM_MODE, note=None)
        self.graphs: dict[int, float] = {}  # bucket -> this capture's offset
        self.capture_count = 0
        layers = model.get("num_layers")
        self._segments = int(layers) + 1 if isinstance(layers, int) and layers > 0 else 1

    @property
    def truth(self) -> SimTruth:
        return self.device.truth

    def fresh(self, max_tokens: int) -> SimEngine:
        """Another engine on the same device, with its own pool (its captures draw anew)."""
        return SimEngine(self.device, self.runner, max_tokens, self.warmup, vars(self.model))

    def inputs(self, n: int, seed: int = 0, requests: int = 1) -> SimBatch:
        if not 1 <= requests <= n:
            raise InputError(f"a batch of {n} tokens cannot hold {requests} requests")
        return SimBatch(int(n), 1 if self.runner == "full" else int(requests))

    # ---- capture ------------------------------------------------------------------
    def capture(self, buckets, record_attention: bool = True, on_record=None) -> list[CaptureRecord]:
        """Capture each bucket, largest first: its time on the clock, a fresh offset, the
        pool's growth as the recording measured graph memory."""
        bl = sorted({int(b) for b in buckets}, reverse=True)
        if not bl:
            raise InputError("no buckets to capture")
        if bl[0] > self.max_tokens:
            raise InputError(f"bucket {bl[0]} exceeds the engine's static buffers ({self.max_tokens} tokens)")
        if bl[-1] < 1:
            raise InputError(f"bucket {bl[-1]} is not positive")
        records = []
        for b in bl:
            if b in self.graphs:
                continue
            before = self.reserved_gib()
            seconds = self.truth.capture_s(b, self.warmup)
            self.device.spend_s(seconds)
            self.graphs[b] = self.device.draw_offset()
            self.capture_count += 1
            rec = CaptureRecord(bucket=b, ok=True, capture_s=seconds, record_s=seconds / (self.warmup + 1))
            rec.pool_growth_gib = self.reserved_gib() - before
            records.append(rec)
            if on_record is not None:
                on_record(rec)
        return records

    def declare(self, buckets) -> None:
        raise RuntimeError("declare() is for padded-eager engines; capture() the buckets on the simulated device")

    def reserved_gib(self) -> float:
        if not self.graphs:
            return 0.0
        return self.truth.pool_gib(max(self.graphs), len(self.graphs))

    def release(self) -> None:
        self.graphs.clear()

    def segment_count(self, bucket: int) -> int:
        return self._segments if self.runner == "breakable" else 1

    def side_inputs(self) -> list[str]:
        return ["input_ids", "positions"]

    def bucket_for(self, n: int) -> int | None:
        if not self.graphs:
            return None
        chosen, replay = assign_buckets(np.asarray([n]), sorted(self.graphs), self.padding_factor)
        return int(chosen[0]) if bool(replay[0]) else None

    def _graph(self, b: int) -> float:
        if b not in self.graphs:
            raise InputError(f"no captured bucket {b} (buckets {sorted(self.graphs)})")
        return self.graphs[b]

    # ---- the calls the timings make --------------------------------------------------
    def charge_segments(self, b: int) -> float:
        off = self._graph(b)
        ms, sd, _ = self.truth.call("segments", 0, 1, b)
        return self.device.run(ms, sd, offset=off)

    def charge_replay(self, n: int, r: int, b: int) -> float:
        off = self._graph(b)
        if n > b:
            raise InputError(f"{n} tokens do not fit bucket {b}")
        g, sd, brk = self.truth.call("replay", n, r, b)
        return self.device.run(g * (1.0 + off) + brk, sd)

    def charge_eager(self, n: int, r: int) -> float:
        _, sd, _ = self.truth.call("eager", n, r)
        return self.device.run_eager(n, r, sd)

    def replay_segments(self, bucket: int) -> None:
        self.charge_segments(int(bucket))

    def replay_call(self, x: SimBatch, b: int):
        return functools.partial(self.charge_replay, x.n, x.requests, int(b))

    def eager_call(self, x: SimBatch):
        return functools.partial(self.charge_eager, x.n, x.requests)


def sim_environment(rec: SimRecording, spec: Any, device: SimDevice, runner: str) -> dict[str, Any]:
    """The run's self-description: a simulated GPU, the recording it replays, the seed."""
    return {
        "backend": "sim",
        "torch": None,
        "cuda": None,
        "hip": None,
        "python": None,
        "host": None,
        "gpu_name": f"simulated {rec.gpu}",
        "gpu_count": 1,
        "driver": None,
        "visible_devices": None,
        "graph_mode": SIM_MODE,
        "runner": runner,
        "graph_impl": SIM_MODE,
        "attention": SIM_MODE,
        "sdpa_backend": SIM_MODE,
        "simulated": {
            "calibration": rec.path,
            "calibration_sha256": rec.sha256,
            "recorded_on": rec.gpu,
            "seed": int(spec.seed),
            "noise": FITTED.to_json(),
        },
    }


def model_description(rec: SimRecording, spec: Any) -> dict[str, Any]:
    """The model the simulated device times: the recording's (its shape and source)."""
    desc = dict(rec.model) if rec.model else {"name": spec.model}
    desc["source"] = f"simulated from {os.path.basename(rec.path)}"
    return desc


def build_seconds(model: dict[str, Any], profile: NoiseProfile = FITTED) -> float:
    """Simulated seconds to build the model (stated, not fitted: noise.py)."""
    params = model.get("params")
    gp = float(params) / 1e9 if isinstance(params, (int, float)) and params > 0 else 1.0
    return profile.build_s + profile.build_s_per_gparam * gp


def open_sim(spec: Any, max_tokens: int, warmup: int | None, numerics: bool = False):
    """The simulated device's engine for `spec` (an EngineSession of engines/build), the
    model's build time on its clock. `numerics`: validate's engine, the stand-in model on
    the CPU computing what the simulated GPU cannot."""
    from bcgtune.engines.build import EngineSession
    from bcgtune.engines.spec import RUNNER_HELP

    rec = check_sim_spec(spec)
    device = device_of(spec)
    model = model_description(rec, spec)
    device.spend_s(build_seconds(model))
    w = (2 if spec.runner == "breakable" else 1) if warmup is None else warmup
    engine: Any = SimEngine(device, spec.runner, max_tokens, w, model)
    env = sim_environment(rec, spec, device, spec.runner)
    env["runner_matches"] = RUNNER_HELP[spec.runner]
    if numerics:
        engine = NumericsOnSim(engine, spec, max_tokens)
        env["numerics"] = engine.standin_text
    return EngineSession(engine, model, env)


class NumericsOnSim:
    """validate's engine on the simulated device: the runner's own code on a tiny stand-in
    model of the same kind on the CPU (padded-eager) computes every output compared, and
    each forward is charged to the simulated clock as the simulated GPU takes it. What it
    checks is the pipeline (static buffers, padding, side inputs, the replay rule), not the
    simulated model's numerics, and the report says so."""

    def __init__(self, sim: SimEngine, spec: Any, max_tokens: int):
        from bcgtune.engines.preflight import require_torch

        require_torch()
        self._sim = sim
        vl = bool(sim.model.__dict__.get("vision"))
        self.standin = "qwen3-vl-tiny" if vl else "tiny"
        self.standin_text = (
            f"computed by the {self.standin} stand-in model on the CPU (padded-eager, the runner's own code); "
            "the simulated device times the recorded model and computes no outputs"
        )
        import dataclasses

        from bcgtune.engines.build import open_engine
        from bcgtune.engines.preflight import check_run

        real_spec = dataclasses.replace(
            spec, model=self.standin, device="cpu", dtype="fp32", sim_calibration=None, chunked_prefill_size=None
        )
        shape = check_run(real_spec, [max_tokens], what="bucket")
        self._real = open_engine(real_spec, max_tokens, shape).engine

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    @property
    def simulated(self) -> bool:
        return True

    @property
    def graphs_enabled(self) -> bool:
        return True

    def capture(self, buckets, record_attention: bool = True, on_record=None) -> list[CaptureRecord]:
        recs = self._sim.capture(buckets, record_attention=False)
        self._real.declare(buckets)
        for r in recs:
            if on_record is not None:
                on_record(r)
        return recs

    def reserved_gib(self) -> float:
        return self._sim.reserved_gib()

    def eager(self, x):
        self._sim.charge_eager(x.n, x.requests)
        return self._real.eager(x)

    def replay(self, x, bucket=None, neutral=()):
        b = bucket if bucket is not None else self._sim.bucket_for(x.n)
        if b is not None and b in self._sim.graphs:
            self._sim.charge_replay(x.n, x.requests, int(b))
        return self._real.replay(x, b, neutral)

    def _replay_filled(self, x, b):
        if b in self._sim.graphs:
            self._sim.charge_segments(int(b))
        return self._real._replay_filled(x, b)

    def release(self) -> None:
        self._sim.release()
        self._real.release()
