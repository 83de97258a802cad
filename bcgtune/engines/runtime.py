"""Which torch backend runs (CUDA, ROCm/HIP or CPU) and what hardware/software it runs on.

torch's `torch.cuda` API serves NVIDIA CUDA and AMD ROCm (HIP) builds alike; the build is
told apart by `torch.version.cuda` / `torch.version.hip`. The ROCm path uses the same calls
(CUDAGraph, graph_pool_handle, Events, memory_reserved) and is untested here: no AMD GPU
was available to the project.
"""

from __future__ import annotations

import os
import platform
import subprocess
from typing import Any

import torch

from bcgtune.engines.records import Environment  # torch-free: the simulated device makes one too


def backend_name() -> str:
    """'cuda', 'hip' or 'cpu': what `torch.cuda` would drive on this machine."""
    if torch.cuda.is_available():
        return "hip" if getattr(torch.version, "hip", None) else "cuda"
    return "cpu"


def _driver_version(backend: str) -> str | None:
    if backend == "cuda":
        try:
            import pynvml  # type: ignore[import-not-found]  # nvidia-ml-py, optional

            pynvml.nvmlInit()
            v = pynvml.nvmlSystemGetDriverVersion()
            return v.decode() if isinstance(v, bytes) else str(v)
        except Exception:
            pass
        try:
            out = subprocess.run(
                ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=20,
            )
            if out.returncode == 0 and out.stdout.strip():
                return out.stdout.strip().splitlines()[0].strip()
        except (OSError, subprocess.SubprocessError):
            pass
        return None
    if backend == "hip":
        try:
            with open("/sys/module/amdgpu/version") as fh:
                return "amdgpu " + fh.read().strip()
        except OSError:
            pass
        try:
            out = subprocess.run(["rocm-smi", "--showdriverversion"], capture_output=True, text=True, timeout=20)
            for line in out.stdout.splitlines():
                if "version" in line.lower():
                    return line.split(":", 1)[-1].strip()
        except (OSError, subprocess.SubprocessError):
            pass
    return None


def environment(device: torch.device | None = None) -> Environment:
    """Self-description for artifacts: GPU, torch, CUDA or HIP, driver."""
    backend = backend_name() if device is None or device.type == "cuda" else "cpu"
    base: dict[str, Any] = {
        "backend": backend,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "hip": getattr(torch.version, "hip", None),
        "python": platform.python_version(),
        "host": platform.node(),
        "visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES") or os.environ.get("HIP_VISIBLE_DEVICES"),
    }
    if backend in ("cuda", "hip"):
        idx = device.index if device is not None and device.index is not None else torch.cuda.current_device()
        props = torch.cuda.get_device_properties(idx)
        try:
            cudnn = torch.backends.cudnn.version()
        except Exception:
            cudnn = None
        return Environment(
            **base,
            gpu_name=props.name,
            gpu_count=torch.cuda.device_count(),
            gpu_memory_gib=round(props.total_memory / 2**30, 2),
            compute_capability=f"{props.major}.{props.minor}",
            multiprocessors=props.multi_processor_count,
            driver=_driver_version(backend),
            gcn_arch=getattr(props, "gcnArchName", None) if backend == "hip" else None,
            cudnn=cudnn,
        )
    return Environment(**base, cpu=platform.processor() or platform.machine(), threads=torch.get_num_threads())


def dynamo_counters() -> dict[str, int]:
    """Snapshot of torch._dynamo's frame/recompile counters (0s when nothing is compiled)."""
    try:
        from torch._dynamo.utils import counters
    except Exception:
        return {"unique_graphs": 0, "recompiles": 0}
    stats: dict = counters.get("stats", {})
    recompiles = sum(counters.get("recompiles", {}).values()) if "recompiles" in counters else 0
    return {"unique_graphs": int(stats.get("unique_graphs", 0)), "recompiles": int(recompiles)}
