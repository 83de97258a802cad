"""A run of the torch engine as asked for (`EngineSpec`: model, device, dtype, runner, TP,
...), and the runners it may name. No torch import here: engines/config.py resolves and
checks a spec, once, into the EngineConfig everything after it reads."""

from __future__ import annotations

from dataclasses import dataclass
from typing import get_args

from bcgtune.engines.choices import (
    AllReduceName,
    DtypeName,
    FaultName,
    GraphImplName,
    HfAttentionName,
    RoutingName,
    RunnerName,
    SdpaBackendName,
)

RUNNERS: tuple[str, ...] = get_args(RunnerName)
RUNNER_HELP: dict[str, str] = {
    "breakable": "SGLang's breakable prefill runner (its default on CUDA): captured segments, attention eager between them",
    "full": "SGLang's `full` prefill backend with one request slot: one whole-forward graph per bucket",
}
DEFAULT_MODEL = "qwen3-8b"


@dataclass(frozen=True)
class EngineSpec:
    """Which model the torch engine builds and how it runs, as asked (None: not given, the
    launch's or bcgtune's default applies)."""

    # a built-in shape, a Hugging Face config.json (PATH/config.json, or a folder holding only
    # one: its shape built with random weights), or a checkpoint folder (hf:PATH or PATH);
    # None: the profile's model when bcgtune can build it, else qwen3-8b
    model: str | None = None
    device: str = "auto"  # auto, cuda, cuda:N, cpu, sim (a simulated GPU: engines/sim)
    dtype: DtypeName = "auto"
    sdpa_backend: SdpaBackendName = "auto"
    seed: int = 0
    hf_attention: HfAttentionName = "causal"  # checkpoint folders: bcgtune's fixed causal SDPA, or transformers' own
    random_weights: bool = False
    runner: RunnerName = "breakable"
    chunked_prefill_size: int | None = None
    graph_impl: GraphImplName = "auto"
    fault: FaultName = "none"  # a negative control: a replay that breaks one side input on purpose
    tp: int | None = None  # tensor-parallel size (None: the profile's tp-size, else 1)
    ep: int | None = None  # expert-parallel size (None: the profile's ep-size, else 1)
    routing: RoutingName = "skewed"  # MoE layers: how tokens spread over the experts
    all_reduce: AllReduceName = "auto"  # TP > 1: timed across processes, or added from a curve
    all_reduce_curve: str | None = None  # a measured all-reduce curve (bytes, microseconds) to add
    sim_calibration: str | None = None  # --device sim: the calibration recorded on a GPU that it simulates
