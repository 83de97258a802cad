"""One resolved engine configuration: a run's description (model shape, device, dtype,
attention backend, runner, tensor-parallel rank, MoE routing, seed) resolved and checked once,
before torch is imported or anything is built, into one frozen `EngineConfig` that the
engines (engines/build.py) and the services read. Nothing after `resolve` decides a default or
parses a piece of the spec again.

Stage 1, here (no torch): every "auto" folded, every default applied (the launch's model, TP
and chunk under the options given), every check of a run that is knowable before torch:
the model's shape and the slice one rank runs, the sizes within its context and the chunked
prefill ceiling, a GPU for anything larger than the CPU can run; on the simulated device
(device "sim", engines/sim) the recorded calibration it replays, checked against the model,
runner and rank asked for, and no torch at all. Stage 2
(engines/build.open_engine) binds it: the torch device, the kernel probes, the model, the
runner's engine; it confirms what stage 1 decided and never decides it again.

`measurement_key()` is what a measurement depends on: a calibration stores it, `calibrate
--extend` refuses an engine whose key differs from the calibration's, and a resumed `tune`
one whose key differs from its state's. Every field is in the key or in LEFT_OUT_OF_KEY with
the reason (tests/test_engine_config.py holds both lists to the dataclass)."""

from __future__ import annotations

import dataclasses
import glob
import importlib.util
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args

from bcgtune.core.sglang.ladder import default_chunked_prefill_size
from bcgtune.engines.allreduce import AllReduceCurve, load_curve
from bcgtune.engines.choices import (
    DTYPE_ALIASES,
    AllReduceName,
    DtypeName,
    FaultName,
    GraphImplName,
    HfAttentionName,
    ResolvedDtype,
    RoutingName,
    RunnerName,
    SdpaBackendName,
    device_name,
)
from bcgtune.engines.shapes import (
    PRESETS,
    DecoderConfig,
    RankDims,
    config_path,
    has_weights,
    rank_dims,
    read_config,
    shape_from_config,
    sliding_window,
)
from bcgtune.engines.spec import DEFAULT_MODEL, EngineSpec
from bcgtune.errors import ExternalError, InputError

# A CPU dry run builds the model in fp32 and runs forwards of up to thousands of tokens:
# fine for the tiny built-ins and small test checkpoints, minutes to hours (and tens of GB)
# beyond this.
CPU_MAX_PARAMS = 50_000_000
# SGLang's largest default chunked_prefill_size (GPUs of 160 GiB and more), the default
# ceiling for prefill buckets; --chunked-prefill-size raises or lowers it.
DEFAULT_PREFILL_CEILING = default_chunked_prefill_size(float("inf"))
TORCH_HINT = "needs torch: pip install 'bcgtune[gpu]'"
CPU_DRY_RUN = "for a CPU dry run: --model tiny --device cpu"
PadRows = Literal["routed", "masked"]
AllReducePath = Literal["none", "real", "modelled"]


@dataclass(frozen=True)
class Launch:
    """What a server launch (a profile) says about the engine that stands for its rank: the
    model it serves, its TP and EP sizes, its chunked prefill size. An option given on the
    command line wins over each."""

    where: str
    model: str | None = None
    tp: int | None = None
    ep: int | None = None
    chunked_prefill_size: int | None = None


@dataclass(frozen=True)
class ModelRef:
    """The model a run builds, resolved once: a built-in shape, a config.json built by
    bcgtune (random weights), or a checkpoint folder transformers loads."""

    kind: Literal["builtin", "config", "hf"]
    name: str
    path: str | None  # config: the config.json; hf: the folder
    shape: DecoderConfig | None  # what bcgtune builds (builtin, config); None: transformers builds it
    params: int  # the whole model's parameters (estimated for a checkpoint)
    rank_params: int  # what this rank holds
    max_context: int | None
    deepstack_layers: int
    stands_for: str | None  # the Hugging Face model the shape is, when known

    @property
    def moe(self) -> bool:
        return self.shape is not None and self.shape.moe is not None

    def describe(self) -> str:
        kind = {"builtin": "built-in", "config": "from its config", "hf": "a transformers checkpoint"}[self.kind]
        moe = ""
        if self.shape is not None and self.shape.moe is not None:
            m = self.shape.moe
            moe = f", MoE {m.num_experts} experts top {m.top_k}"
        return f"{self.name} ({kind}, ~{self.params / 1e9:.2f}B parameters{moe})"


@dataclass(frozen=True)
class Parallel:
    """The tensor-parallel rank a run stands for, and how its all-reduces are timed."""

    tp: int = 1
    rank: int = 0
    ep: int = 1
    all_reduce: AllReducePath = "none"  # none (TP 1), real (one process per rank), modelled
    curve: AllReduceCurve | None = None  # modelled: the time added per all-reduce
    backend: str | None = None  # real: nccl or gloo
    rendezvous: str | None = None  # real: where the ranks meet (a file), set when they are started
    dims: RankDims | None = None  # what this rank holds (None: a transformers checkpoint, whole)

    def describe(self) -> str:
        if self.tp == 1:
            return "one GPU (TP 1)"
        ep = f", EP {self.ep}" if self.ep > 1 else ""
        if self.all_reduce == "real":
            how = f"all-reduces measured across {self.tp} processes ({self.backend})"
        else:
            assert self.curve is not None
            how = "all-reduces modelled (" + self.curve.describe() + ")"
        return f"rank {self.rank} of TP {self.tp}{ep}: {how}"


@dataclass(frozen=True)
class EngineConfig:
    """A run of the torch engine, resolved (module docstring)."""

    spec: EngineSpec  # as asked, with the launch's model, TP, EP and chunk where none was given
    model: ModelRef
    device: str  # cpu | cuda | cuda:N | sim
    on_gpu: bool
    dtype: ResolvedDtype
    sdpa_backend: str  # flash | efficient | cudnn | math | none
    runner: RunnerName
    causal_fix: bool  # a checkpoint's attention: bcgtune's causal SDPA (True) or transformers' own
    graph_impl: GraphImplName
    capture_warmup: int
    fault: FaultName
    seed: int
    random_weights: bool
    ceiling: int  # the chunked-prefill ceiling: buckets above it never form
    sizes: tuple[int, ...]  # the sizes (buckets) this run was checked for, ascending
    parallel: Parallel
    routing: RoutingName
    pad_rows: PadRows  # MoE: padded rows routed to experts, or masked from routing (as SGLang)
    sim_calibration: str | None = None
    notes: tuple[str, ...] = field(default=())

    @property
    def simulated(self) -> bool:
        """The simulated device (engines/sim): times from a recorded calibration, no torch."""
        return self.device == "sim"

    @property
    def gpu_like(self) -> bool:
        """Graphs captured and timed as on a GPU: a GPU, or the simulated one (the CPU runs the
        same forwards padded-eager, a dry run whose times describe no GPU)."""
        return self.on_gpu or self.simulated

    @property
    def max_tokens(self) -> int:
        """The static buffers' size: the largest size checked."""
        return self.sizes[-1] if self.sizes else 1

    def measurement_key(self) -> dict[str, Any]:
        """The fields a measurement depends on, as JSON (module docstring)."""
        shape = self.model.shape
        p = self.parallel
        return {
            "model": {
                "kind": self.model.kind,
                "name": self.model.name,
                "path": self.model.path,
                "shape": None if shape is None else _plain(dataclasses.asdict(shape)),
            },
            "device": "cuda" if self.device.startswith("cuda") else self.device,
            "dtype": self.dtype,
            "sdpa_backend": self.sdpa_backend,
            "runner": self.runner,
            "causal_fix": self.causal_fix,
            "graph_impl": self.graph_impl,
            "fault": self.fault,
            "seed": self.seed,
            "random_weights": self.random_weights,
            "ceiling": self.ceiling,
            "parallel": {
                "tp": p.tp,
                "rank": p.rank,
                "ep": p.ep,
                "all_reduce": p.all_reduce,
                "curve": None if p.curve is None else p.curve.to_json(),
            },
            "routing": self.routing,
            "pad_rows": self.pad_rows,
            "sim_calibration": self.sim_calibration,
        }

    def checked(self, sizes: Any, what: str = "bucket") -> EngineConfig:
        """The same run checked for `sizes` (resolve's size checks)."""
        sizes_ok = check_sizes(sizes, self.ceiling, self.model, bool(self.spec.chunked_prefill_size), what)
        return dataclasses.replace(self, sizes=sizes_ok)

    def for_rank(self, rank: int, rendezvous: str) -> EngineConfig:
        """The same run on another rank of a real all-reduce (its own slice)."""
        shape = self.model.shape
        dims = rank_dims(shape, self.parallel.tp, rank, self.parallel.ep) if shape is not None else None
        par = dataclasses.replace(self.parallel, rank=rank, rendezvous=rendezvous, dims=dims)
        return dataclasses.replace(self, parallel=par)

    def shape_json(self) -> dict[str, Any]:
        """What a calibration records of the shape it measured (core.plan.shape_check reads it)."""
        shape, p = self.model.shape, self.parallel
        moe = shape.moe if shape is not None else None
        return {
            "model": self.model.name,
            "stands_for": self.model.stands_for,
            "kind": self.model.kind,
            "architecture": shape.architecture if shape is not None else None,
            "params": self.model.params,
            "rank_params": self.model.rank_params,
            "tp": p.tp,
            "ep": p.ep,
            "rank": p.rank,
            "all_reduce": p.all_reduce,
            "moe": None
            if moe is None
            else {
                "experts": moe.num_experts,
                "top_k": moe.top_k,
                "rank_experts": p.dims.experts if p.dims is not None else moe.num_experts,
                "routing": self.routing,
                "pad_rows": self.pad_rows,
            },
        }


# Fields of EngineConfig that are not in the measurement key, each with the reason.
LEFT_OUT_OF_KEY: dict[str, str] = {
    "spec": "the request; each field it resolves to is in the key",
    "on_gpu": "follows from the device",
    "capture_warmup": "warm-up forwards before a capture change no replay's time",
    "sizes": "what is measured, not how: a calibration records its sizes itself",
    "notes": "what resolving said to the user",
}
PARALLEL_LEFT_OUT_OF_KEY: dict[str, str] = {
    "backend": "follows from the device (NCCL on GPUs, gloo on the CPU)",
    "rendezvous": "where one run's ranks meet",
    "dims": "follows from the model's shape, TP, EP and the rank",
}
# Where each field of EngineSpec lands in the key (the key's field, as measurement_key names it),
# and the spec fields that reach the key only through another.
SPEC_IN_KEY: dict[str, str] = {
    "model": "model",
    "device": "device",
    "dtype": "dtype",
    "sdpa_backend": "sdpa_backend",
    "seed": "seed",
    "hf_attention": "causal_fix",
    "random_weights": "random_weights",
    "runner": "runner",
    "chunked_prefill_size": "ceiling",
    "graph_impl": "graph_impl",
    "fault": "fault",
    "tp": "parallel",
    "ep": "parallel",
    "routing": "routing",
    "all_reduce": "parallel",
    "all_reduce_curve": "parallel",
    "sim_calibration": "sim_calibration",
}


def _plain(obj: Any) -> Any:
    """A dataclass's asdict as JSON reads it back (tuples as lists)."""
    if isinstance(obj, dict):
        return {k: _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    return obj


def key_differences(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """The spec fields whose resolved values differ between two measurement keys."""
    changed = {k for k in set(a) | set(b) if _plain(a.get(k)) != _plain(b.get(k))}
    return [f for f, k in SPEC_IN_KEY.items() if k in changed] or sorted(changed)


# ---------------------------------------------------------------------------------------
# stage 1: resolve
# ---------------------------------------------------------------------------------------
def require_torch(device: str | None = None) -> None:
    """torch installed, unless the run goes to the simulated device (which needs none)."""
    if (device or "").strip().lower() == "sim":
        return
    if importlib.util.find_spec("torch") is None:
        raise InputError(TORCH_HINT)


def gpu_device_nodes() -> bool:
    """Could torch see a GPU here at all? False when no NVIDIA or AMD device node exists
    or the visible-devices variables hide every GPU. True means: ask torch."""
    for var in ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES"):
        v = os.environ.get(var)
        if v is not None and v.strip() in ("", "-1"):
            return False
    return any(os.path.exists(p) for p in ("/dev/nvidiactl", "/dev/nvidia0", "/dev/kfd"))


def visible_gpus() -> int:
    """How many GPUs this machine shows, read without torch: the visible-devices list when
    one is set, else the NVIDIA device nodes (or AMD's render nodes)."""
    if not gpu_device_nodes():
        return 0
    for var in ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES"):
        v = os.environ.get(var)
        if v is not None:
            return len([x for x in v.split(",") if x.strip()])
    nvidia = [p for p in glob.glob("/dev/nvidia[0-9]*") if p.removeprefix("/dev/nvidia").isdigit()]
    return len(nvidia) or (len(glob.glob("/dev/dri/renderD*")) if os.path.exists("/dev/kfd") else 0)


def quiet_cpu_threads() -> None:
    """A run on the CPU: OpenMP's threads sleep at the end of each parallel operation
    instead of spinning (OMP_WAIT_POLICY=PASSIVE, unless the environment sets it). The dry
    run's operations are microseconds long, so a thread spinning at each barrier, while the
    thread it waits for has no core, costs more than the operation: on the 2-core
    development machine, shared with other work, capture and calibrate ran 3-4x longer in
    wall time with spinning threads (benchmarks/RESULTS.md). Read when torch loads: no effect
    once it is imported."""
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def _closed(value: str, allowed: Any, field_name: str) -> None:
    names = get_args(allowed)
    if value not in names:
        raise InputError(f"must be {', '.join(names)}, got {str(value)[:40]!r}", field=field_name)


def _known_model(name: str) -> str | None:
    """The built-in shape a Hugging Face model name stands for (`Qwen/Qwen3-30B-A3B-FP8` ->
    qwen3-30b-a3b): its name without the organisation and a quantisation suffix."""
    from bcgtune.core.plan.shape_check import base_model_name

    base = base_model_name(name)
    for key, cfg in PRESETS.items():
        if key == base or (cfg.stands_for and base_model_name(cfg.stands_for) == base):
            return key
    return None


def apply_launch(spec: EngineSpec, launch: Launch | None) -> tuple[EngineSpec, list[str]]:
    """The spec with the launch's model, TP, EP and chunk where the options gave none, and
    what the user should hear about it."""
    notes: list[str] = []
    model = spec.model
    if launch is not None and model is None and launch.model:
        if config_path(launch.model) is not None and os.path.exists(launch.model):
            model = launch.model
        else:
            model = _known_model(launch.model)
            if model is None:
                notes.append(
                    f"the profile's model {launch.model} is not a shape bcgtune knows by name: measuring "
                    f"{DEFAULT_MODEL} instead (give --model PATH/config.json for its shape)"
                )
    out = dataclasses.replace(
        spec,
        model=model or DEFAULT_MODEL,
        tp=spec.tp or (launch.tp if launch else None) or 1,
        ep=spec.ep or (launch.ep if launch else None) or 1,
        chunked_prefill_size=spec.chunked_prefill_size or (launch.chunked_prefill_size if launch else None),
    )
    return out, notes


def _model_ref(spec: EngineSpec, tp: int, ep: int) -> tuple[ModelRef, RankDims | None]:
    model = spec.model or DEFAULT_MODEL
    if model.startswith("hf:") or (
        os.path.isdir(model) and (has_weights(Path(model)) or spec.random_weights) and not model.endswith(".json")
    ):
        return _checkpoint_ref(model.removeprefix("hf:"), spec, tp, ep), None
    cfg_file = config_path(model)
    if cfg_file is not None:
        if not cfg_file.is_file():
            raise InputError("no config.json there (a model is a built-in name, PATH/config.json or a checkpoint folder)", model)
        shape = shape_from_config(read_config(cfg_file, model), _config_name(cfg_file), model)
        kind: Literal["builtin", "config"] = "config"
    elif model in PRESETS:
        shape, kind = PRESETS[model], "builtin"
    else:
        models = f"a built-in shape ({', '.join(PRESETS)}), PATH/config.json, or a checkpoint folder"
        if model.startswith(("/", ".", "~")) or os.path.isdir(os.path.dirname(model) or "\0"):
            # a path that names nothing (an absolute or relative path, or a missing name in a
            # folder that exists): the file error with the whole path; "org/name" stays unknown
            raise InputError(f"no such file or folder (a model is {models})", model[:400])
        raise InputError(f"unknown model {model[:80]!r}: {models}", field="model")
    dims = rank_dims(shape, tp, 0, ep)
    ref = ModelRef(
        kind,
        shape.name,
        str(cfg_file) if kind == "config" else None,
        shape,
        shape.params(),
        shape.rank_params(dims),
        shape.max_context,
        shape.vision.deepstack if shape.vision is not None else 0,
        shape.stands_for,
    )
    return ref, dims


def _config_name(cfg_file) -> str:
    """A config's model name: its folder's name (config.json) or the file's stem."""
    return cfg_file.parent.name if cfg_file.name == "config.json" and cfg_file.parent.name else cfg_file.stem


def _checkpoint_ref(path: str, spec: EngineSpec, tp: int, ep: int) -> ModelRef:
    """A checkpoint folder transformers loads: its shape estimated from config.json (read
    once, bounded), the attention fix checked against a window the config declares."""
    p = Path(path)
    if not p.is_dir() or not (p / "config.json").is_file():
        raise InputError("not a Hugging Face checkpoint folder (needs config.json)", path)
    if tp > 1 or ep > 1:
        raise InputError(
            "a checkpoint loaded through transformers runs whole on one GPU: for a tensor-parallel rank give "
            f"--model {path}/config.json (bcgtune builds its shape, random weights)",
            field="tp" if tp > 1 else "ep",
        )
    if not spec.random_weights and not has_weights(p):
        raise InputError(
            "no weights (*.safetensors / *.bin) in the folder: pass --random-weights for transformers' modules with "
            f"random weights, or --model {path}/config.json for bcgtune's build of its shape",
            path,
        )
    raw = read_config(p / "config.json", path)
    text = raw.get("text_config")
    cfg = {**raw, **text} if isinstance(text, dict) else raw
    if spec.hf_attention == "causal" and (sliding_window(cfg) or cfg.get("attention_chunk_size")):
        raise InputError("sliding-window/chunked attention: the causal-SDPA fix would be wrong; pass --hf-attention sdpa", path)
    try:
        shape = shape_from_config(raw, p.name, path)
        params, ctx = shape.params(), shape.max_context
    except InputError:  # transformers may build what bcgtune's shape does not: estimate
        params, ctx = _estimate_params(cfg), None
    vision = raw.get("vision_config")
    ds = vision.get("deepstack_visual_indexes") if isinstance(vision, dict) else None
    return ModelRef("hf", p.name, str(p), None, params, params, ctx, len(ds) if isinstance(ds, list) else 0, None)


def _estimate_params(cfg: dict[str, Any]) -> int:
    def num(key: str, default: int = 0) -> int:
        v = cfg.get(key, default)
        return v if isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2**40 else default

    h, layers, vocab = num("hidden_size"), num("num_hidden_layers"), num("vocab_size")
    heads = num("num_attention_heads", 1) or 1
    kv = num("num_key_value_heads", heads) or heads
    hd = num("head_dim", h // heads)
    inter = num("intermediate_size")
    experts = num("num_experts") or num("n_routed_experts")
    mlp = 3 * h * (num("moe_intermediate_size", inter) * experts if experts else inter)
    return layers * (h * hd * (2 * heads + 2 * kv) + mlp) + vocab * h * 2


def check_sizes(sizes: Any, ceiling: int, model: ModelRef, chunk_given: bool, what: str = "bucket") -> tuple[int, ...]:
    """Buckets (or calibration sizes) within 1 .. min(ceiling, context): the ceiling is the
    server's chunked prefill size (a larger prefill batch never forms), SGLang's largest
    default when not given."""
    out = sorted({int(b) for b in sizes})
    if not out:
        raise InputError(f"no {what}s given")
    if out[0] < 1:
        raise InputError(f"{what} {out[0]} is not positive")
    if out[-1] > ceiling:
        hint = (
            ""
            if chunk_given
            else " (SGLang's largest default chunked prefill size; pass --chunked-prefill-size N if your server uses more)"
        )
        raise InputError(f"{what} {out[-1]} is above the chunked-prefill ceiling {ceiling}{hint}")
    if model.max_context is not None and out[-1] > model.max_context:
        raise InputError(f"{what} {out[-1]} is above {model.name}'s context of {model.max_context} tokens")
    return tuple(out)


def _device(spec: EngineSpec) -> tuple[str, bool]:
    """The device folded: cpu, cuda or cuda:N (auto: cuda where the machine shows a GPU), or
    the simulated device, which needs no torch."""
    if (spec.device or "").strip().lower() == "sim":
        return "sim", False
    try:
        dev = device_name(spec.device or "auto")
    except ValueError as exc:
        raise InputError(str(exc), field="device") from None
    require_torch()
    if dev == "auto":
        dev = "cuda" if gpu_device_nodes() else "cpu"
    elif dev in ("gpu", "hip", "rocm"):
        dev = "cuda"
    return dev, dev.startswith("cuda")


def _parallel(spec: EngineSpec, dims: RankDims | None, on_gpu: bool) -> Parallel:
    tp, ep = spec.tp or 1, spec.ep or 1
    if tp == 1:
        return Parallel(1, 0, ep, "none", dims=dims)
    mode = spec.all_reduce
    if mode == "auto":
        mode = "real" if on_gpu and visible_gpus() >= tp else "modelled"
    if mode == "real":
        if spec.all_reduce_curve:
            raise InputError("a measured curve is added to a modelled all-reduce, not a real one", field="all_reduce_curve")
        if on_gpu and 0 < visible_gpus() < tp:
            raise ExternalError(f"a real all-reduce over {tp} ranks needs {tp} GPUs and this machine shows {visible_gpus()}")
        return Parallel(tp, 0, ep, "real", backend="nccl" if on_gpu else "gloo", dims=dims)
    curve = load_curve(spec.all_reduce_curve, tp) if spec.all_reduce_curve else AllReduceCurve(tp)
    return Parallel(tp, 0, ep, "modelled", curve=curve, dims=dims)


def resolve(
    spec: EngineSpec,
    sizes: Any = None,
    *,
    what: str = "bucket",
    launch: Launch | None = None,
    warmup: int | None = None,
) -> EngineConfig:
    """`spec` resolved and checked, for a run over `sizes` (None: no sizes checked, for a
    configuration's key alone), under `launch`'s defaults (module docstring)."""
    _closed(spec.runner, RunnerName, "runner")
    _closed(spec.hf_attention, HfAttentionName, "hf_attention")
    _closed(spec.dtype, DtypeName, "dtype")
    _closed(spec.sdpa_backend, SdpaBackendName, "sdpa_backend")
    _closed(spec.graph_impl, GraphImplName, "graph_impl")
    _closed(spec.routing, RoutingName, "routing")
    _closed(spec.all_reduce, AllReduceName, "all_reduce")
    _closed(spec.fault, FaultName, "inject_fault")
    spec, notes = apply_launch(spec, launch)
    tp, ep = int(spec.tp or 1), int(spec.ep or 1)
    model, dims = _model_ref(spec, tp, ep)
    if spec.runner == "breakable" and model.kind == "hf" and spec.hf_attention != "causal":
        raise InputError(
            "the breakable runner needs --hf-attention causal (its attention runs per request)", field="hf_attention"
        )
    if spec.fault != "none" and not model.deepstack_layers:
        raise InputError(f"{spec.fault} needs a model with DeepStack (qwen3-vl-tiny, qwen3-vl-8b)", field="inject_fault")
    ceiling = spec.chunked_prefill_size or DEFAULT_PREFILL_CEILING
    if ceiling < 1:
        raise InputError(f"chunked prefill size must be positive, got {ceiling}", field="chunked_prefill_size")
    checked = () if sizes is None else check_sizes(sizes, ceiling, model, bool(spec.chunked_prefill_size), what)
    if spec.sim_calibration and (spec.device or "").strip().lower() != "sim":  # before torch is looked for
        raise InputError("goes with --device sim (the calibration the simulated device replays)", field="sim_calibration")
    device, on_gpu = _device(spec)
    if device == "sim":
        _check_sim(spec, model, tp, ep)
    asked_cpu = (spec.device or "").strip().lower() == "cpu"
    big = model.rank_params > CPU_MAX_PARAMS
    if big and asked_cpu:
        raise InputError(
            f"--device cpu runs models up to {CPU_MAX_PARAMS // 1_000_000}M parameters and "
            f"{_rank_words(model, tp)} ~{model.rank_params / 1e9:.1f}B; {CPU_DRY_RUN}"
        )
    if big and device != "sim" and not gpu_device_nodes():
        raise ExternalError(
            f"{model.name} (~{model.rank_params / 1e9:.1f}B parameters) needs a CUDA or ROCm GPU "
            f"and this machine shows none; {CPU_DRY_RUN}"
        )
    if device == "cpu":
        quiet_cpu_threads()
    parallel = _parallel(spec, dims, on_gpu)
    if model.moe and spec.routing == "skewed" and model.kind == "hf":
        notes.append("--routing applies to the models bcgtune builds: transformers' own router runs")
    pad_rows: PadRows = "masked" if spec.runner == "full" or ep > 1 else "routed"
    gpu_like = on_gpu or device == "sim"
    dtype: ResolvedDtype = ("bf16" if gpu_like else "fp32") if spec.dtype == "auto" else DTYPE_ALIASES[spec.dtype]
    return EngineConfig(
        spec=spec,
        model=model,
        device=device,
        on_gpu=on_gpu,
        dtype=dtype,
        sdpa_backend="flash" if spec.sdpa_backend == "auto" else spec.sdpa_backend,
        runner=spec.runner,
        causal_fix=spec.hf_attention == "causal",
        graph_impl=spec.graph_impl,
        capture_warmup=(2 if spec.runner == "breakable" else 1) if warmup is None else max(0, int(warmup)),
        fault=spec.fault,
        seed=int(spec.seed),
        random_weights=spec.random_weights or model.kind != "hf",
        ceiling=ceiling,
        sizes=checked,
        parallel=parallel,
        routing=spec.routing,
        pad_rows=pad_rows,
        sim_calibration=spec.sim_calibration,
        notes=tuple(notes),
    )


def _check_sim(spec: EngineSpec, model: ModelRef, tp: int, ep: int) -> None:
    """The simulated device (engines/sim): its recording given and readable, of the runner,
    the model and the rank asked for; any model size (nothing is built); no torch."""
    replays = "the simulated device replays the all-reduces its recording measured"
    if spec.all_reduce == "real":
        raise InputError(f"{replays}: no real ones", field="all_reduce")
    if spec.all_reduce_curve:
        raise InputError(f"{replays}: no curve", field="all_reduce_curve")
    from bcgtune.engines.sim.engine import check_recording

    check_recording(spec.sim_calibration, spec.runner, model.name, tp, ep)


# validate on the simulated device: the stand-in of each kind of model (engines/sim NumericsOnSim)
STANDIN_MODELS = {"dense": "tiny", "moe": "tiny-moe", "vl": "qwen3-vl-tiny"}


def standin_config(cfg: EngineConfig, max_tokens: int) -> EngineConfig:
    """What computes validate's outputs on the simulated device (which computes none): a tiny
    stand-in model of the same kind (dense, MoE, or vision-language with DeepStack) on the CPU
    in fp32, through the same runner, resolved as its own run (it needs torch)."""
    shape = cfg.model.shape
    if cfg.model.deepstack_layers or (shape is not None and shape.vision is not None):
        kind = "vl"
    elif cfg.model.moe:
        kind = "moe"
    else:
        kind = "dense"
    spec = dataclasses.replace(
        cfg.spec,
        model=STANDIN_MODELS[kind],
        device="cpu",
        dtype="fp32",
        sim_calibration=None,
        chunked_prefill_size=None,
        tp=1,
        ep=1,
        all_reduce="auto",
        all_reduce_curve=None,
        random_weights=False,
    )
    return resolve(spec, [max_tokens], warmup=cfg.capture_warmup)


def _rank_words(model: ModelRef, tp: int) -> str:
    return f"{model.name} has" if tp == 1 else f"one TP-{tp} rank of {model.name} holds"
