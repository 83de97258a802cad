"""What a run records of itself: each bucket's capture (engines/base.py captures, the
simulated device too) and the environment it ran on (engines/runtime.environment on a GPU
or the CPU, engines/sim on the simulated device). No torch here, so the simulated device
and the services read them without loading torch."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any


@dataclass
class CaptureRecord:
    bucket: int
    ok: bool
    capture_s: float = 0.0  # warm-up + capture, what SGLang's "elapsed" covers
    record_s: float = 0.0  # the capture itself
    pool_growth_gib: float | None = None  # reserved memory still held after empty_cache
    error: str | None = None
    attention_eager: list[str] = field(default_factory=list)
    attention_capture: list[str] = field(default_factory=list)

    @property
    def attention_match(self) -> bool:
        return self.attention_eager == self.attention_capture

    def to_json(self) -> dict[str, Any]:
        return {
            "bucket": self.bucket,
            "ok": self.ok,
            "capture_s": round(self.capture_s, 4),
            "record_s": round(self.record_s, 4),
            "pool_growth_gib": None if self.pool_growth_gib is None else round(self.pool_growth_gib, 4),
            "error": self.error,
            "attention_match": self.attention_match,
            "attention_eager": self.attention_eager,
            "attention_capture": self.attention_capture,
        }


@dataclass(frozen=True)
class Environment:
    """What a run ran on, for its report: the backend and software, the GPU (None fields on
    the CPU) or the CPU; on the simulated device (backend "sim") the GPU its recording was
    measured on and what it replays (`simulated`)."""

    backend: str  # cuda | hip | cpu | sim
    torch: str | None  # None on the simulated device (no torch)
    cuda: str | None
    hip: str | None
    python: str
    host: str
    gpu_name: str | None = None
    gpu_count: int | None = None
    gpu_memory_gib: float | None = None
    compute_capability: str | None = None
    multiprocessors: int | None = None
    driver: str | None = None
    gcn_arch: str | None = None
    cudnn: int | None = None
    cpu: str | None = None
    threads: int | None = None
    visible_devices: str | None = None
    simulated: dict[str, Any] | None = None  # the recording the simulated device replays, its seed and noise

    def to_json(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        gpu_only = ("gpu_count", "gpu_memory_gib", "compute_capability", "multiprocessors", "gcn_arch", "cudnn")
        cpu_only = ("cpu", "threads")
        drop: tuple[str, ...] = gpu_only if self.backend == "cpu" else cpu_only
        if self.simulated is None:
            drop += ("simulated",)
        return {k: v for k, v in out.items() if k not in drop and not (k == "gcn_arch" and self.backend != "hip")}
