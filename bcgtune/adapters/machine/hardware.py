"""GPUs a profile can name in [profile].hardware: what SGLang would see on one.

SGLang derives launch defaults from the device it runs on: the chunked-prefill size from
the GPU's memory (srt/arg_groups/memory_hook.py), the prefill graph backend from CUDA vs
ROCm (model_executor/cuda_graph_config.py), kernel choices from the compute capability.
bcgtune answers those questions from this table when it resolves a launch on a machine
without that GPU. Memory is the per-device capacity as the vendor's tools report it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GpuSpec:
    name: str  # the device name torch reports
    platform: str  # "cuda" | "rocm"
    memory_gib: float
    capability: tuple[int, int]  # CUDA compute capability; ROCm: torch's major/minor for the arch
    gcn_arch: str = ""  # ROCm only, e.g. gfx950


GPUS: dict[str, GpuSpec] = {
    "a100": GpuSpec("NVIDIA A100-SXM4-80GB", "cuda", 80.0, (8, 0)),
    "h100": GpuSpec("NVIDIA H100 80GB HBM3", "cuda", 80.0, (9, 0)),
    "h200": GpuSpec("NVIDIA H200", "cuda", 141.0, (9, 0)),
    "b200": GpuSpec("NVIDIA B200", "cuda", 180.0, (10, 0)),
    "gb200": GpuSpec("NVIDIA GB200", "cuda", 186.0, (10, 0)),
    "mi300x": GpuSpec("AMD Instinct MI300X", "rocm", 192.0, (9, 4), "gfx942"),
    "mi325x": GpuSpec("AMD Instinct MI325X", "rocm", 256.0, (9, 4), "gfx942"),
    "mi350x": GpuSpec("AMD Instinct MI350X", "rocm", 288.0, (9, 5), "gfx950"),
    "mi355x": GpuSpec("AMD Instinct MI355X", "rocm", 288.0, (9, 5), "gfx950"),
}


def gpu_for(hardware: str | None) -> GpuSpec | None:
    """The spec for a profile's [profile].hardware (case-insensitive), or None."""
    if not hardware:
        return None
    return GPUS.get(hardware.strip().lower())
