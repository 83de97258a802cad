"""Facts about this machine's Python, torch and sglang that doctor reports, and the prefill
graph backend SGLang would default to here.
"""

from __future__ import annotations

import platform
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

PrefillDefault = Literal["breakable", "disabled"]


@dataclass(frozen=True)
class PythonInfo:
    version: str
    executable: str

    def to_json(self) -> dict[str, Any]:
        return {"version": self.version, "executable": self.executable}


@dataclass(frozen=True)
class Gpu:
    name: str
    memory_gib: float

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "memory_gib": self.memory_gib}


@dataclass(frozen=True)
class TorchInfo:
    """torch's version, its CUDA or HIP runtime, and the GPUs it sees. `error`: why torch
    is not usable (not installed, or a broken install)."""

    installed: bool
    version: str | None = None
    cuda: str | None = None
    hip: str | None = None
    gpus: tuple[Gpu, ...] = ()
    gpu_available: bool = False
    error: str | None = None
    gpu_error: str | None = None

    def to_json(self) -> dict[str, Any]:
        if not self.installed:
            return {"installed": False, "error": self.error}
        out: dict[str, Any] = {
            "installed": True,
            "version": self.version,
            "cuda": self.cuda,
            "hip": self.hip,
            "gpus": [g.to_json() for g in self.gpus],
            "gpu_available": self.gpu_available,
        }
        if self.gpu_error:
            out["gpu_error"] = self.gpu_error
        return out


@dataclass(frozen=True)
class SglangInfo:
    """Where sglang is installed and its version, found without importing it."""

    installed: bool
    version: str | None = None
    path: str | None = None

    def to_json(self) -> dict[str, Any]:
        if not self.installed:
            return {"installed": False}
        return {"installed": True, "version": self.version, "path": self.path}


def python_info() -> PythonInfo:
    return PythonInfo(platform.python_version(), sys.executable)


def _one_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}".splitlines()[0]


def torch_info() -> TorchInfo:
    """torch's version, CUDA or HIP runtime and GPUs. torch absent is fine."""
    try:
        import torch
    except Exception as exc:  # ImportError, or a broken install
        return TorchInfo(installed=False, error=_one_line(exc))
    gpus: list[Gpu] = []
    try:
        available = bool(torch.cuda.is_available())
        if available:
            for i in range(torch.cuda.device_count()):
                props = torch.cuda.get_device_properties(i)
                gpus.append(Gpu(props.name, round(props.total_memory / 2**30, 1)))
        gpu_error = None
    except Exception as exc:
        available, gpu_error = False, _one_line(exc)
    return TorchInfo(
        installed=True,
        version=getattr(torch, "__version__", "unknown"),
        cuda=getattr(torch.version, "cuda", None),
        hip=getattr(torch.version, "hip", None),
        gpus=tuple(gpus),
        gpu_available=available,
        gpu_error=gpu_error,
    )


def sglang_info() -> SglangInfo:
    """sglang's version and package folder without importing it (find_spec on a top-level
    package locates it without running its __init__)."""
    import importlib.metadata
    import importlib.util

    try:
        spec = importlib.util.find_spec("sglang")
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        return SglangInfo(installed=False)
    try:
        version: str | None = importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        version = None  # a source checkout on sys.path
    return SglangInfo(installed=True, version=version, path=str(Path(list(spec.submodule_search_locations)[0])))


def default_prefill_backend(torch_: TorchInfo) -> PrefillDefault | None:
    """model_executor/cuda_graph_config.py, default_prefill_backend: breakable when
    is_cuda() (a CUDA build of torch with a visible GPU), else disabled (ROCm: opt-in)."""
    if not torch_.installed:
        return None
    if torch_.cuda and torch_.gpu_available:
        return "breakable"
    return "disabled"
