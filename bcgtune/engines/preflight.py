"""Checks that run before torch is imported or a model is built, so a GPU command that
cannot work says so at once: torch missing, no GPU for a large model, a bucket beyond the
model's context or the chunked-prefill ceiling. No torch import here (importing it alone
takes seconds on a small machine)."""

from __future__ import annotations

import importlib.util
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import get_args

from bcgtune.core.sglang.ladder import default_chunked_prefill_size
from bcgtune.engines.choices import HfAttentionName
from bcgtune.engines.spec import EngineSpec, check_runner
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
_CONFIG_MAX_BYTES = 4 << 20


@dataclass(frozen=True)
class ModelShape:
    name: str
    params: int  # estimated parameter count
    max_context: int | None  # context length (tokens), when the model states one


def require_torch(device: str | None = None) -> None:
    """torch installed, unless the run goes to the simulated device (which needs none)."""
    if (device or "").strip().lower() == "sim":
        return
    if importlib.util.find_spec("torch") is None:
        raise InputError(TORCH_HINT)


def _hf_shape(path: str) -> ModelShape:
    p = Path(path)
    cfg_path = p / "config.json"
    if not p.is_dir() or not cfg_path.is_file():
        raise InputError("not a Hugging Face checkpoint folder (needs config.json)", path)
    try:
        with open(cfg_path, "rb") as fh:
            raw = fh.read(_CONFIG_MAX_BYTES + 1)
    except OSError as exc:
        raise InputError(f"cannot read config.json: {exc.strerror}", path) from None
    if len(raw) > _CONFIG_MAX_BYTES:
        raise InputError("config.json is larger than 4 MiB", path)
    try:
        cfg = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise InputError("config.json is not valid JSON", path) from None
    if not isinstance(cfg, dict):
        raise InputError("config.json must hold an object", path)
    text = cfg.get("text_config")
    if isinstance(text, dict):  # multimodal configs nest the language model's shape
        cfg = {**cfg, **text}

    def num(key, default=0):
        v = cfg.get(key, default)
        return v if isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2**40 else default

    h, layers, vocab = num("hidden_size"), num("num_hidden_layers"), num("vocab_size")
    heads = num("num_attention_heads", 1) or 1
    kv = num("num_key_value_heads", heads) or heads
    hd = num("head_dim", h // heads if heads else 0)
    inter = num("intermediate_size")
    experts = num("num_experts") or num("n_routed_experts")
    mlp = 3 * h * (num("moe_intermediate_size", inter) * experts if experts else inter)
    tie = bool(cfg.get("tie_word_embeddings", False))
    params = layers * (h * hd * (2 * heads + 2 * kv) + mlp) + vocab * h * (1 if tie else 2)
    ctx = num("max_position_embeddings") or None
    return ModelShape(p.name, int(params), ctx)


def model_shape(spec: str) -> ModelShape:
    """Name, size and context of a --model value, read without building it."""
    if spec.startswith("hf:") or os.path.isdir(spec):
        return _hf_shape(spec.removeprefix("hf:"))
    from bcgtune.engines.presets import preset

    cfg = preset(spec)
    return ModelShape(cfg.name, cfg.params(), cfg.max_context)


def gpu_device_nodes() -> bool:
    """Could torch see a GPU here at all? False when no NVIDIA or AMD device node exists
    or the visible-devices variables hide every GPU. True means: ask torch."""
    for var in ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES"):
        v = os.environ.get(var)
        if v is not None and v.strip() in ("", "-1"):
            return False
    return any(os.path.exists(p) for p in ("/dev/nvidiactl", "/dev/nvidia0", "/dev/kfd"))


def check_buckets(buckets, shape: ModelShape, chunked_prefill_size: int | None, what: str = "bucket") -> list[int]:
    """Buckets (or calibration sizes) within 1 .. min(ceiling, context): the ceiling is the
    server's chunked prefill size (a larger prefill batch never forms), SGLang's largest
    default when not given."""
    ceiling = chunked_prefill_size or DEFAULT_PREFILL_CEILING
    if ceiling < 1:
        raise InputError(f"chunked prefill size must be positive, got {ceiling}", "--chunked-prefill-size")
    out = sorted({int(b) for b in buckets})
    if not out:
        raise InputError(f"no {what}s given")
    if out[0] < 1:
        raise InputError(f"{what} {out[0]} is not positive")
    if out[-1] > ceiling:
        hint = (
            ""
            if chunked_prefill_size
            else " (SGLang's largest default chunked prefill size; pass --chunked-prefill-size N if your server uses more)"
        )
        raise InputError(f"{what} {out[-1]} is above the chunked-prefill ceiling {ceiling}{hint}")
    if shape.max_context is not None and out[-1] > shape.max_context:
        raise InputError(f"{what} {out[-1]} is above {shape.name}'s context of {shape.max_context} tokens")
    return out


def check_run(spec: EngineSpec, buckets, what: str = "bucket") -> ModelShape:
    """Every check of a run that is knowable before torch, in one step: the runner and the
    attention it can run, torch installed, the model's shape, the buckets (or sizes) within
    its context and the chunked prefill ceiling, and a GPU for anything larger than the tiny
    models. engines/build.py then builds what passed."""
    check_runner(spec.runner)
    if spec.hf_attention not in get_args(HfAttentionName):
        raise InputError(f"must be causal or sdpa, got {spec.hf_attention[:40]!r}", "--hf-attention")
    is_hf = spec.model.startswith("hf:") or os.path.isdir(spec.model)
    if spec.runner == "breakable" and is_hf and spec.hf_attention != "causal":
        raise InputError("the breakable runner needs --hf-attention causal (its attention runs per request)", "--hf-attention")
    from bcgtune.engines.spec import is_simulated

    if spec.sim_calibration and not is_simulated(spec):
        raise InputError("--sim-calibration goes with --device sim", "--sim-calibration")
    if is_simulated(spec):  # a simulated GPU: no torch, any model size (engines/sim)
        from bcgtune.engines.sim.engine import check_sim_spec

        shape = model_shape(spec.model)
        check_sim_spec(spec, shape.name)
        check_buckets(buckets, shape, spec.chunked_prefill_size, what)
        return shape
    require_torch()
    shape = model_shape(spec.model)
    check_buckets(buckets, shape, spec.chunked_prefill_size, what)
    dev = (spec.device or "auto").lower()
    big = shape.params > CPU_MAX_PARAMS
    if big and dev == "cpu":
        raise InputError(
            f"--device cpu runs models up to {CPU_MAX_PARAMS // 1_000_000}M parameters and "
            f"{shape.name} has ~{shape.params / 1e9:.1f}B; {CPU_DRY_RUN}"
        )
    if big and (dev in ("auto", "cuda", "gpu", "hip", "rocm") or dev.startswith("cuda:")) and not gpu_device_nodes():
        raise ExternalError(
            f"{shape.name} (~{shape.params / 1e9:.1f}B parameters) needs a CUDA or ROCm GPU "
            f"and this machine shows none; {CPU_DRY_RUN}"
        )
    if dev == "cpu" or (dev == "auto" and not gpu_device_nodes()):
        quiet_cpu_threads()
    return shape


def quiet_cpu_threads() -> None:
    """A run on the CPU: OpenMP's threads sleep at the end of each parallel operation
    instead of spinning (OMP_WAIT_POLICY=PASSIVE, unless the environment sets it). The dry
    run's operations are microseconds long, so a thread spinning at each barrier, while the
    thread it waits for has no core, costs more than the operation: on the 2-core
    development machine, shared with other work, capture and calibrate ran 3-4x longer in
    wall time with spinning threads (benchmarks/RESULTS.md). Read when torch loads: no effect
    once it is imported."""
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def refuse_cpu_for_large(shape: ModelShape, device_type: str) -> None:
    """After torch resolved the device: a large model on the CPU is refused, not built."""
    if device_type == "cpu" and shape.params > CPU_MAX_PARAMS:
        raise ExternalError(
            f"{shape.name} (~{shape.params / 1e9:.1f}B parameters) needs a CUDA or ROCm GPU and torch sees none; {CPU_DRY_RUN}"
        )
