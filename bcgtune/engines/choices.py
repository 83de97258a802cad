"""The closed sets of the torch engine's options and the syntax of --device: read by the
command line at parse time (so an unknown value is refused with the allowed ones listed,
before torch loads) and by the engine. No torch import here."""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Literal

RunnerName = Literal["breakable", "full"]
GraphImplName = Literal["auto", "sglang", "bcgtune"]
DtypeName = Literal["auto", "bf16", "bfloat16", "fp16", "float16", "fp32", "float32"]
SdpaBackendName = Literal["auto", "flash", "efficient", "cudnn", "math", "none"]
HfAttentionName = Literal["causal", "sdpa"]
# Negative controls for `validate`: a replay that breaks one side input on purpose.
FaultName = Literal["none", "drop-deepstack", "stale-deepstack"]
# The inputs a captured forward reads beside its weights (engines/base.py SIDE_INPUT_LABELS).
SideInputName = Literal["input_ids", "input_embeds", "positions", "mrope_positions", "deepstack"]
# How an engine runs its buckets: graphs on a GPU, the same static-buffer forward without one.
GraphMode = Literal["breakable-cuda-graph", "cuda-graph", "padded-eager", "simulated"]


# The same sets as enumerations, the form typer turns into a parse-time choice.
class Runner(StrEnum):
    breakable = "breakable"
    full = "full"


class GraphImpl(StrEnum):
    auto = "auto"
    sglang = "sglang"
    bcgtune = "bcgtune"


class Dtype(StrEnum):
    auto = "auto"
    bf16 = "bf16"
    bfloat16 = "bfloat16"
    fp16 = "fp16"
    float16 = "float16"
    fp32 = "fp32"
    float32 = "float32"


class SdpaBackend(StrEnum):
    auto = "auto"
    flash = "flash"
    efficient = "efficient"
    cudnn = "cudnn"
    math = "math"
    none = "none"


class HfAttention(StrEnum):
    causal = "causal"
    sdpa = "sdpa"


class Fault(StrEnum):
    none = "none"
    drop_deepstack = "drop-deepstack"
    stale_deepstack = "stale-deepstack"


DEVICE_WORDS = ("auto", "cpu", "cuda", "gpu", "hip", "rocm", "sim")  # gpu, hip, rocm: the torch.cuda device
DEVICE_HELP = "auto, cpu, cuda or cuda:N (gpu, hip and rocm mean cuda), or sim (a simulated GPU: --sim-calibration)"
_CUDA_INDEX = re.compile(r"cuda:(0|[1-9][0-9]{0,3})")


def device_name(spec: str) -> str:
    """`spec` lower-cased if it names a device torch can be asked for, else ValueError."""
    name = spec.strip().lower()
    if name in DEVICE_WORDS or _CUDA_INDEX.fullmatch(name):
        return name
    shown = spec if len(spec) <= 40 else spec[:40] + "..."
    raise ValueError(f"must be {DEVICE_HELP}, got {shown!r}")
