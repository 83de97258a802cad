"""From a description of the run (`EngineSpec`: model, device, dtype, runner, ...) to a
ready engine: the device resolved, the model built or loaded, the runner's engine made,
and the run's self-description (hardware, software, engine) for its report."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, get_args

from bcgtune.engines.choices import DtypeName, FaultName, GraphImplName, HfAttentionName, RunnerName, SdpaBackendName
from bcgtune.errors import InputError

RUNNERS: tuple[str, ...] = get_args(RunnerName)
RUNNER_HELP: dict[str, str] = {
    "breakable": "SGLang's breakable prefill runner (its default on CUDA): captured segments, attention eager between them",
    "full": "SGLang's `full` prefill backend with one request slot: one whole-forward graph per bucket",
}


@dataclass(frozen=True)
class EngineSpec:
    """Which model the torch engine builds and how it runs."""

    model: str = "qwen3-8b"  # a built-in shape or a Hugging Face checkpoint folder (hf:PATH or PATH)
    device: str = "auto"  # auto, cuda, cuda:N, cpu
    dtype: DtypeName = "auto"
    sdpa_backend: SdpaBackendName = "auto"
    seed: int = 0
    hf_attention: HfAttentionName = "causal"  # checkpoint folders: bcgtune's fixed causal SDPA, or transformers' own
    random_weights: bool = False
    runner: RunnerName = "breakable"
    chunked_prefill_size: int | None = None
    graph_impl: GraphImplName = "auto"
    fault: FaultName = "none"  # a negative control: a replay that breaks one side input on purpose


def check_runner(runner: str) -> RunnerName:
    if runner not in RUNNERS:
        raise InputError(f"unknown runner {runner!r} ({', '.join(RUNNERS)})", "--runner")
    return runner  # type: ignore[return-value]  # checked against RUNNERS just above


@dataclass
class EngineSession:
    """A built engine with what its reports say about it."""

    engine: Any  # BreakablePrefillEngine | FullPrefillEngine
    model: dict[str, Any]  # the model's description (shape, source, dtype)
    environment: dict[str, Any]  # hardware, software and engine settings


def open_engine(spec: EngineSpec, max_tokens: int, shape: Any, warmup: int | None = None) -> EngineSession:
    """The engine of `spec` with static buffers for `max_tokens` (the model built on the
    resolved device); `shape` is preflight's ModelShape (a large model on the CPU is refused
    here, before it is built)."""
    import torch

    from bcgtune.engines.loader import load_model, parse_dtype
    from bcgtune.engines.preflight import refuse_cpu_for_large
    from bcgtune.engines.runtime import environment, resolve_device
    from bcgtune.engines.sdpa import check_sdpa_backend, resolved_sdpa_backend

    runner = check_runner(spec.runner)
    device = resolve_device(spec.device)
    refuse_cpu_for_large(shape, device.type)
    is_hf = spec.model.startswith("hf:") or os.path.isdir(spec.model)
    if spec.hf_attention not in get_args(HfAttentionName):
        raise InputError(f"must be causal or sdpa, got {spec.hf_attention[:40]!r}", "--hf-attention")
    if runner == "breakable" and is_hf and spec.hf_attention != "causal":
        raise InputError("the breakable runner needs --hf-attention causal (its attention runs per request)", "--hf-attention")
    dtype = parse_dtype(spec.dtype, device)
    check_sdpa_backend(spec.sdpa_backend, device, dtype)
    torch.manual_seed(spec.seed)
    model, desc = load_model(
        spec.model, device, dtype, spec.sdpa_backend, spec.seed, spec.hf_attention == "causal", spec.random_weights
    )
    engine: Any
    if runner == "breakable":
        from bcgtune.engines.breakable import BreakablePrefillEngine

        engine = BreakablePrefillEngine(
            model,
            device,
            max_tokens,
            sdpa_backend=spec.sdpa_backend,
            warmup=2 if warmup is None else warmup,
            graph_impl=spec.graph_impl,
            fault=spec.fault,
        )
    else:
        from bcgtune.engines.full import FullPrefillEngine

        engine = FullPrefillEngine(
            model, device, max_tokens, sdpa_backend=spec.sdpa_backend, warmup=1 if warmup is None else warmup, fault=spec.fault
        )
    env = environment(device)
    env["graph_mode"] = engine.mode
    env["runner"] = runner
    env["runner_matches"] = RUNNER_HELP[runner]
    env["graph_impl"] = engine.graph_impl
    if runner == "breakable":
        env["attention"] = engine.attention_kind
        if engine.impl is not None and engine.impl.note:
            env["graph_impl_note"] = engine.impl.note
    env["sdpa_backend"] = resolved_sdpa_backend(spec.sdpa_backend)
    return EngineSession(engine, desc, env)
