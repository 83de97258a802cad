"""From a description of the run (`EngineSpec`: model, device, dtype, runner, ...) to a
ready engine: the device resolved, the model built or loaded, the runner's engine made,
and the run's self-description (hardware, software, engine) for its report."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from bcgtune.engines.spec import RUNNER_HELP, EngineSpec, check_runner, is_simulated


@dataclass
class EngineSession:
    """A built engine with what its reports say about it."""

    engine: Any  # BreakablePrefillEngine | FullPrefillEngine
    model: dict[str, Any]  # the model's description (shape, source, dtype)
    environment: dict[str, Any]  # hardware, software and engine settings


def open_engine(
    spec: EngineSpec, max_tokens: int, shape: Any, warmup: int | None = None, numerics: bool = False
) -> EngineSession:
    """The engine of `spec` with static buffers for `max_tokens` (the model built on the
    resolved device); `shape` is the ModelShape engines.preflight.check_run returned for
    `spec`, whose checks ran before this (a large model on a CPU that torch resolved "auto"
    to is refused here, before it is built). On the simulated device (engines/sim) no torch
    is loaded; `numerics` asks for an engine that computes outputs (validate's)."""
    if is_simulated(spec):
        from bcgtune.engines.sim.engine import open_sim

        return open_sim(spec, max_tokens, warmup, numerics=numerics)
    import torch

    from bcgtune.engines.loader import load_model, parse_dtype
    from bcgtune.engines.preflight import refuse_cpu_for_large
    from bcgtune.engines.runtime import environment, resolve_device
    from bcgtune.engines.sdpa import check_sdpa_backend, resolved_sdpa_backend

    runner = check_runner(spec.runner)  # checked by preflight.check_run already: narrows the type
    device = resolve_device(spec.device)
    refuse_cpu_for_large(shape, device.type)  # the one check that needs torch's answer on the device
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
