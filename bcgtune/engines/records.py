"""What a capture records per bucket (engines/base.py captures, the simulated device too):
no torch here, so the simulated device and the services read it without loading torch."""

from __future__ import annotations

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
