"""Facts about this machine's Python, torch and sglang that doctor reports, and the prefill
graph backend SGLang would default to here. Nothing here imports torch or sglang (each
takes seconds): their versions and builds are read from their installed files.
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
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


def _torch_build() -> dict[str, str | None] | None:
    """torch's version and its CUDA / HIP runtime from torch/version.py, read without
    importing torch (seconds); None when torch is not installed."""
    import ast
    import importlib.util

    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / "version.py"
    found: dict[str, str | None] = {"__version__": None, "cuda": None, "hip": None}
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError):
        return found
    for node in tree.body:
        target = node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else None
        if isinstance(node, ast.AnnAssign):
            target = node.target
        value = getattr(node, "value", None)
        if isinstance(target, ast.Name) and target.id in found and isinstance(value, ast.Constant):
            found[target.id] = value.value if isinstance(value.value, str) else None
    return found


def _hidden_by_env(var: str) -> bool:
    v = os.environ.get(var)
    return v is not None and v.strip() in ("", "-1")


def _nvidia_gpus() -> tuple[list[Gpu], str | None]:
    """GPUs nvidia-smi lists (name, memory), or why none could be listed."""
    if _hidden_by_env("CUDA_VISIBLE_DEVICES"):
        return [], None
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return [], "nvidia-smi not found"
    try:
        out = subprocess.run(
            [exe, "--query-gpu=name,memory.total", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return [], f"nvidia-smi failed: {type(exc).__name__}"
    gpus = []
    for line in out.stdout.splitlines():
        name, _, mib = line.rpartition(",")
        try:
            gpus.append(Gpu(name.strip(), round(float(mib) / 1024, 1)))
        except ValueError:
            continue
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible and gpus:
        wanted = [v.strip() for v in visible.split(",") if v.strip().isdigit()]
        gpus = [gpus[int(i)] for i in wanted if int(i) < len(gpus)] or gpus
    return gpus, None if out.returncode == 0 else "nvidia-smi found no GPU"


def _amd_gpus() -> tuple[list[Gpu], str | None]:
    """AMD GPUs the kernel driver lists (/sys/class/kfd topology: one node per GPU, CPUs
    have gpu_id 0), without ROCm's tools; memory is not read."""
    if _hidden_by_env("HIP_VISIBLE_DEVICES") or _hidden_by_env("ROCR_VISIBLE_DEVICES"):
        return [], None
    nodes = Path("/sys/class/kfd/kfd/topology/nodes")
    gpus = []
    try:
        for node in sorted(nodes.iterdir()):
            gpu_id = (node / "gpu_id").read_text().strip()
            if gpu_id and gpu_id != "0":
                name = (node / "name").read_text().strip() or "AMD GPU"
                gpus.append(Gpu(name, 0.0))
    except OSError:
        return [], "no AMD GPU driver found"
    return gpus, None


def torch_info() -> TorchInfo:
    """torch's version, CUDA or HIP runtime and GPUs, without importing torch (which takes
    seconds): the build from torch/version.py, the GPUs from nvidia-smi (CUDA builds) or
    the AMD kernel driver (ROCm builds), as CUDA_VISIBLE_DEVICES / HIP_VISIBLE_DEVICES
    leave them visible."""
    build = _torch_build()
    if build is None:
        return TorchInfo(installed=False, error="torch is not installed")
    cuda, hip = build["cuda"], build["hip"]
    gpus: list[Gpu] = []
    why = None
    if cuda:
        gpus, why = _nvidia_gpus()
    elif hip:
        gpus, why = _amd_gpus()
    return TorchInfo(
        installed=True,
        version=build["__version__"] or "unknown",
        cuda=cuda,
        hip=hip,
        gpus=tuple(gpus),
        gpu_available=bool(gpus),
        gpu_error=why,
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
