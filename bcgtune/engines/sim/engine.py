"""The engine of the simulated device: the interface the services drive on a real engine
(engines/base.StaticPrefillEngine: capture, replay and eager calls, graph memory, release),
with every call a draw of the simulated device (device.py) and no tensor computed.

What it simulates: captures (each graph drawn an offset against the mean of its size, the
capture's time on the clock, graph memory from the recording), a breakable replay (its
bucket's segments plus its breaks) or a whole-forward one, an eager forward (its host part
at the host's speed). What it does not: numerics. `validate` on the simulated device runs
the runner's real code on a tiny stand-in model on the CPU (`NumericsOnSim`), charging each
forward to the simulated clock as the simulated GPU would take it; its report says so.

A simulated run is resolved as every run is (engines/config.resolve: the model's shape, the
rank, the recording checked against them, no torch) and opened by engines/build.open_engine,
which assembles its session from `open_sim` before anything imports torch.
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
from bcgtune.engines.records import CaptureRecord, Environment
from bcgtune.engines.sim.device import SimDevice, sim_device
from bcgtune.engines.sim.noise import FITTED, NoiseProfile
from bcgtune.engines.sim.truth import SimTruth
from bcgtune.errors import InputError

SIM_MODE = "simulated"
NEEDS_RECORDING = "--device sim needs --sim-calibration CAL.json (a calibration recorded on a GPU)"


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
    gpu_props: dict[str, Any]  # what the recording says of its GPU (name, memory, compute capability, ...)
    shape: dict[str, Any]  # the shape it measured (engines/config.EngineConfig.shape_json), {} when not recorded

    @property
    def model_name(self) -> str | None:
        name = self.model.get("name")
        return str(name) if isinstance(name, str) and name else None

    @property
    def parallel(self) -> tuple[int, int]:
        """(TP, EP) of the rank it was measured on, as its shape records them (1, 1 without)."""
        shape = self.shape

        def size(key: str) -> int:
            v = shape.get(key)
            return v if isinstance(v, int) and not isinstance(v, bool) and v >= 1 else 1

        return size("tp"), size("ep")


_RECORDINGS: dict[str, SimRecording] = {}


def load_recording(path: str) -> SimRecording:
    """The recorded calibration at `path` (read once per process), checked as every
    calibration is (files.calibration_file)."""
    from bcgtune.fileio import path_kind
    from bcgtune.files.calibration_file import load_calibration

    if path == "-" or path_kind(path) in ("folder", "other"):
        raise InputError("must be a calibration file (the simulated device reads it more than once)", path)
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
    found = meta.get("gpu")
    props: dict[str, Any] = dict(found) if isinstance(found, dict) else {}
    found = meta.get("shape")
    shape: dict[str, Any] = dict(found) if isinstance(found, dict) else {}
    rec = SimRecording(cal, path, digest, model, str(props.get("gpu_name") or "a GPU"), props, shape)
    _RECORDINGS[key] = rec
    return rec


def check_recording(path: str | None, runner: str, model_name: str | None = None, tp: int = 1, ep: int = 1) -> SimRecording:
    """The recording a simulated run times (engines/config.resolve checks it, before anything
    is built): given, readable, of the runner asked for, of the model asked for when it names
    one, and of the rank asked for (a recording made before calibrations recorded their shape
    was measured on one GPU). One line naming the flag otherwise."""
    if not path:
        raise InputError(NEEDS_RECORDING, field="sim_calibration")
    rec = load_recording(path)
    if rec.calibration.runner != runner:
        raise InputError(
            f"this calibration was recorded with the {rec.calibration.runner} runner, the run asks for --runner {runner}",
            path,
        )
    if model_name is not None and rec.model_name is not None and rec.model_name != model_name:
        raise InputError(f"this calibration was recorded on {rec.model_name}, the run asks for --model {model_name}", path)
    was_tp, was_ep = rec.parallel
    if (tp, ep) != (was_tp, was_ep):
        raise InputError(
            f"this calibration was recorded on {_rank_text(was_tp, was_ep)}, the run asks for {_rank_text(tp, ep)}: "
            "the simulated device replays the rank it was recorded on",
            path,
        )
    return rec


def _rank_text(tp: int, ep: int) -> str:
    if tp == 1 and ep == 1:
        return "one GPU (TP 1)"
    return f"one rank of TP {tp}" + (f", EP {ep}" if ep > 1 else "")


def device_of(run: Any, profile: NoiseProfile = FITTED) -> SimDevice:
    """The simulated device a run goes to (one per recording and seed in this process): `run`
    is a resolved run (engines/config.EngineConfig) or anything with its `sim_calibration`
    and `seed`."""
    if not run.sim_calibration:
        raise InputError(NEEDS_RECORDING, field="sim_calibration")
    rec = load_recording(run.sim_calibration)
    seed = int(run.seed)
    return sim_device(rec.sha256, lambda: SimTruth(rec.calibration, profile, seed), profile, seed)


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


def sim_environment(rec: SimRecording, cfg: Any) -> Environment:
    """The run's self-description: a simulated GPU (the recorded one's properties), the
    recording it replays, the seed."""
    import platform

    def prop(key: str, kind: Any) -> Any:
        v = rec.gpu_props.get(key)
        return v if isinstance(v, kind) and not isinstance(v, bool) else None

    return Environment(
        backend="sim",
        torch=None,
        cuda=None,
        hip=None,
        python=platform.python_version(),
        host=platform.node(),
        gpu_name=f"simulated {rec.gpu}",
        gpu_count=1,
        gpu_memory_gib=prop("gpu_memory_gib", (int, float)),
        compute_capability=prop("compute_capability", str),
        multiprocessors=prop("multiprocessors", int),
        driver=None,
        simulated={
            "calibration": rec.path,
            "calibration_sha256": rec.sha256,
            "recorded_on": rec.gpu,
            "seed": int(cfg.seed),
            "noise": FITTED.to_json(),
        },
    )


def model_description(rec: SimRecording, cfg: Any) -> dict[str, Any]:
    """The model the simulated device times: the resolved run's shape (engines/config: the
    model and the rank asked for, which the recording was checked to be), or the recording's
    description where bcgtune does not build the shape (a transformers checkpoint)."""
    source = f"simulated from {os.path.basename(rec.path)} (recorded on {rec.gpu})"
    shape, par = cfg.model.shape, cfg.parallel
    if shape is None:
        desc = dict(rec.model) if rec.model else {"name": cfg.model.name}
        desc["source"] = source
        return desc
    desc = {"source": source, "name": shape.name, "random_weights": True, "seed": cfg.seed, **shape.to_dict()}
    if cfg.model.path:
        desc["config"] = cfg.model.path
    desc["tensor_parallel"] = {"tp": par.tp, "rank": par.rank, "ep": par.ep, "rank_params": cfg.model.rank_params}
    desc["dtype"] = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}.get(cfg.dtype, cfg.dtype)
    return desc


def build_seconds(model: dict[str, Any], profile: NoiseProfile = FITTED) -> float:
    """Simulated seconds to build the model (stated, not fitted: noise.py): the parameters one
    rank holds where the description says, else the model's."""
    tp = model.get("tensor_parallel")
    params = tp.get("rank_params") if isinstance(tp, dict) else None
    params = params if isinstance(params, (int, float)) else model.get("params")
    gp = float(params) / 1e9 if isinstance(params, (int, float)) and params > 0 else 1.0
    return profile.build_s + profile.build_s_per_gparam * gp


@dataclass
class SimOpened:
    """What opening the simulated device gives engines/build.open_engine for its session."""

    engine: SimEngine
    device: SimDevice
    description: dict[str, Any]
    environment: Environment


def open_sim(cfg: Any, max_tokens: int) -> SimOpened:
    """The simulated device's engine for a resolved run (engines/config.EngineConfig whose
    device is "sim"), the model's build time on its clock. No torch."""
    rec = load_recording(cfg.sim_calibration)
    device = device_of(cfg)
    model = model_description(rec, cfg)
    device.spend_s(build_seconds(model))
    engine = SimEngine(device, cfg.runner, max_tokens, cfg.capture_warmup, model)
    return SimOpened(engine, device, model, sim_environment(rec, cfg))


class NumericsOnSim:
    """validate's engine on the simulated device: the runner's own code on a tiny stand-in
    model of the same kind on the CPU (`real`, padded-eager: engines/config.standin_config)
    computes every output compared, and each forward is charged to the simulated clock as the
    simulated GPU takes it. What it checks is the pipeline (static buffers, padding, side
    inputs, the replay rule), not the simulated model's numerics, and the report says so."""

    def __init__(self, sim: SimEngine, real: Any, standin: str):
        self._sim = sim
        self._real = real
        self.standin = standin
        self.standin_text = (
            f"computed by the {standin} stand-in model on the CPU (padded-eager, the runner's own code); "
            "the simulated device times the recorded model and computes no outputs"
        )

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    @property
    def simulated(self) -> bool:
        return True

    @property
    def graphs_enabled(self) -> bool:
        return True

    def fresh(self, max_tokens: int) -> SimEngine:
        return self._sim.fresh(max_tokens)

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
