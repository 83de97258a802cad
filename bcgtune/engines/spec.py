"""A run of the torch engine, described (`EngineSpec`: model, device, dtype, runner, ...),
and the runners it may name. No torch import here: the checks before a run read it
(engines/preflight.py), and engines/build.py builds the engine it describes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import get_args

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
    sim_calibration: str | None = None  # --device sim: the calibration recorded on a GPU that it simulates


def is_simulated(spec: EngineSpec) -> bool:
    """Does the run go to the simulated device (engines/sim)? Decided without torch."""
    return (spec.device or "").strip().lower() == "sim"


def check_runner(runner: str) -> RunnerName:
    if runner not in RUNNERS:
        raise InputError(f"unknown runner {runner!r} ({', '.join(RUNNERS)})", "--runner")
    return runner  # type: ignore[return-value]  # checked against RUNNERS just above
