"""`bcgtune capture`: one prefill graph per bucket on the GPU (largest first, one shared
pool, as SGLang captures them), with each capture's time, memory and error."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from bcgtune.core.plan.calibration import Runner
from bcgtune.engines.spec import EngineSpec

if TYPE_CHECKING:
    from bcgtune.engines.base import CaptureRecord
    from bcgtune.engines.config import EngineConfig, Launch

CAPTURE_KIND = "bcgtune.capture-report"


@dataclass
class BucketCapture:
    """One bucket's capture (engines/base.py CaptureRecord, times and memory rounded as
    reported) and, on the breakable runner, how many graph segments it holds."""

    bucket: int
    ok: bool
    capture_s: float
    record_s: float
    pool_growth_gib: float | None
    error: str | None
    attention_match: bool
    attention_eager: list[str]
    attention_capture: list[str]
    segments: int | None = None

    def to_json(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        if self.segments is None:
            del out["segments"]
        return out

    @classmethod
    def of(cls, rec: CaptureRecord, segments: int | None) -> BucketCapture:
        return cls(segments=segments, **rec.to_json())


@dataclass
class CaptureReport:
    """What `capture` measured: per bucket, and in total."""

    header: dict[str, Any]  # core.document.document_header
    environment: dict[str, Any]
    model: dict[str, Any]
    runner: Runner
    buckets: list[int]
    capture_s_total: float  # rounded as reported
    pool_gib_total: float | None  # None without graphs (a CPU dry run)
    per_bucket: list[BucketCapture] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what resolving the run said

    @property
    def graphs(self) -> int:
        return sum(r.ok for r in self.per_bucket)

    @property
    def failed(self) -> int:
        return sum(not r.ok for r in self.per_bucket)

    @property
    def attention_mismatches(self) -> int:
        return sum(1 for r in self.per_bucket if r.ok and not r.attention_match)

    def to_json(self) -> dict[str, Any]:
        return {
            **self.header,
            "environment": self.environment,
            "model": self.model,
            "runner": self.runner,
            "buckets": self.buckets,
            "graphs": self.graphs,
            "failed": self.failed,
            "capture_s_total": self.capture_s_total,
            "pool_gib_total": self.pool_gib_total,
            "attention_mismatches": self.attention_mismatches,
            "per_bucket": [r.to_json() for r in self.per_bucket],
            "notes": self.notes,
        }


def run_capture(
    buckets: Iterable[int],
    spec: EngineSpec,
    warmup: int | None = None,
    progress: Callable[[Any], None] | None = None,
    launch: Launch | None = None,
) -> CaptureReport:
    """Capture every bucket of `buckets` on the engine `spec` describes (under `launch`'s
    model, TP and chunk where the spec gives none). `warmup`: eager runs before each capture
    (default: 2 on the breakable runner, as SGLang, 1 on full); `progress(record)` after each
    bucket."""
    from bcgtune.engines.config import resolve
    from bcgtune.services.ranks import run_ranks

    cfg = resolve(spec, buckets, launch=launch, warmup=warmup)
    return run_ranks(cfg, _capture, progress=progress)


def _capture(cfg: EngineConfig, progress: Callable[[Any], None] | None = None) -> CaptureReport:
    from bcgtune.core.document import document_header
    from bcgtune.engines.build import open_engine

    session = open_engine(cfg)
    engine = session.engine
    bl = list(cfg.sizes)
    before = engine.reserved_gib()
    t0 = time.perf_counter()
    recs = engine.capture(bl, on_record=progress)
    total = time.perf_counter() - t0
    after = engine.reserved_gib()
    per = [
        BucketCapture.of(r, engine.segment_count(r.bucket) if cfg.runner == "breakable" else None)
        for r in sorted(recs, key=lambda r: r.bucket)
    ]
    return CaptureReport(
        header=document_header(CAPTURE_KIND),
        environment=session.report_environment(),
        model=session.description,
        runner=cfg.runner,
        buckets=bl,
        capture_s_total=round(total, 3),
        pool_gib_total=round(after - before, 4) if engine.graphs_enabled else None,
        per_bucket=per,
        notes=list(cfg.notes),
    )
