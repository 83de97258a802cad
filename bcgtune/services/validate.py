"""`bcgtune validate` on the torch engine: padded graph replay against eager on identical
multi-request batches, bucket by bucket, and an image sweep on VL models."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from bcgtune.core.bench.accuracy import GAP_THRESHOLD, MAX_LOGPROB_DELTA
from bcgtune.core.plan.calibration import Runner
from bcgtune.engines.choices import FaultName, SideInputName
from bcgtune.engines.spec import EngineSpec
from bcgtune.errors import InputError

if TYPE_CHECKING:
    from bcgtune.engines.base import CaptureRecord, StaticPrefillEngine
    from bcgtune.engines.compare import BatchComparison, PadInvariance, SideInputUse
    from bcgtune.engines.inputs import PrefillInputs

VALIDATION_KIND = "bcgtune.validation-report"
DEFAULT_IMAGE_PX = (128, 256, 512)
DEFAULT_VALIDATE_REQUESTS = (1, 4)


@dataclass
class BatchCheck:
    """One batch run eagerly and replayed: the comparison, its size, the bucket used, and
    every side input of the batch with whether replay read it (engines/compare.py)."""

    comparison: BatchComparison
    n: int
    bucket: int
    kind: str  # "text" | "image:<px>" | "text after image"
    side_inputs: list[SideInputUse] = field(default_factory=list)
    visual_tokens: int | None = None  # image batches
    image_px: int | None = None

    @property
    def problems(self) -> list[str]:
        return [s.problem for s in self.side_inputs if s.problem]

    @property
    def ok(self) -> bool:
        return self.comparison.ok and not self.problems

    def to_json(self) -> dict[str, Any]:
        out = {**self.comparison.to_json(), "n": self.n, "bucket": self.bucket, "kind": self.kind}
        if self.image_px is not None:
            out.update(visual_tokens=self.visual_tokens, image_px=self.image_px)
        out["side_inputs"] = [s.to_json() for s in self.side_inputs]
        out["ok"] = self.ok
        return out


@dataclass
class SkippedImage:
    """An image size that no size replaying in the bucket can hold."""

    bucket: int
    image_px: int
    visual_tokens: int
    skipped: str = "bucket too small for the image"

    ok = True

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass
class BucketValidation:
    """One bucket: its capture, the text batches checked in it, pad invariance."""

    bucket: int
    captured: bool
    error: str | None
    attention_match: bool
    attention_eager: list[str]
    attention_capture: list[str]
    checks: list[BatchCheck]
    pad_invariance: PadInvariance | None
    sizes: list[int] | None  # None when the capture failed
    ok: bool

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "bucket": self.bucket,
            "captured": self.captured,
            "error": self.error,
            "attention_match": self.attention_match,
            "attention_eager": self.attention_eager,
            "attention_capture": self.attention_capture,
            "checks": [c.to_json() for c in self.checks],
        }
        if self.sizes is not None:
            out["pad_invariance"] = None if self.pad_invariance is None else self.pad_invariance.to_json()
            out["sizes"] = self.sizes
        out["ok"] = self.ok
        return out


@dataclass
class ImageSweep:
    """Image batches replayed in every captured bucket they fit, compared with eager, and
    no new capture or torch.compile recompilation on the way; then, in each of those
    buckets, a text batch replayed right after the bucket's last image batch, as long as it
    (covering every image row), which must not see that image's side inputs."""

    image_px: list[int]
    new_captures: int
    dynamo_recompiles: int
    dynamo_new_graphs: int
    checks: list[BatchCheck | SkippedImage]
    text_after_image: list[BatchCheck] = field(default_factory=list)
    torch_compile_used: bool = False

    @property
    def ok(self) -> bool:
        return (
            self.new_captures == 0
            and self.dynamo_recompiles == 0
            and all(r.ok for r in self.checks)
            and all(t.ok for t in self.text_after_image)
        )

    @property
    def done(self) -> list[BatchCheck]:
        return [r for r in self.checks if isinstance(r, BatchCheck)]

    def to_json(self) -> dict[str, Any]:
        return {
            "image_px": self.image_px,
            "new_captures": self.new_captures,
            "dynamo_recompiles": self.dynamo_recompiles,
            "dynamo_new_graphs": self.dynamo_new_graphs,
            "torch_compile_used": self.torch_compile_used,
            "checks": [r.to_json() for r in self.checks],
            "text_after_image": [t.to_json() for t in self.text_after_image],
            "ok": self.ok,
        }


@dataclass
class ValidationReport:
    """What `validate` checked, per bucket, and its verdict."""

    header: dict[str, Any]
    environment: dict[str, Any]
    model: dict[str, Any]
    runner: Runner
    buckets: list[int]
    requests: list[int]
    gap_threshold: float
    max_logprob_delta: float
    per_bucket: list[BucketValidation]
    image_sweep: ImageSweep | None
    injected_fault: FaultName = "none"
    side_inputs: list[SideInputName] = field(default_factory=list)  # the model's, by name

    @property
    def checks(self) -> list[BatchCheck]:
        return [c for e in self.per_bucket for c in e.checks]

    @property
    def batches_checked(self) -> int:
        return len(self.checks)

    @property
    def bitwise_batches(self) -> int:
        return sum(1 for c in self.checks if c.comparison.bitwise)

    @property
    def ok(self) -> bool:
        return all(e.ok for e in self.per_bucket) and (self.image_sweep is None or self.image_sweep.ok)

    @property
    def failed_buckets(self) -> list[int]:
        return [e.bucket for e in self.per_bucket if not e.ok]

    def problems(self) -> list[str]:
        """What failed, one line per kind of failure, each naming the side input at fault."""
        out = []
        if self.failed_buckets:
            out.append("buckets " + ", ".join(map(str, self.failed_buckets)) + " failed")
        groups = [("text batches", self.checks)]
        sw = self.image_sweep
        if sw is not None:
            groups += [("image batches", sw.done), ("text batches after an image batch", sw.text_after_image)]
            if sw.new_captures or sw.dynamo_recompiles:
                out.append(f"image sweep: {sw.new_captures} new captures, {sw.dynamo_recompiles} recompilations")
        for what, checks in groups:
            counts: dict[str, int] = {}
            for c in checks:
                for p in c.problems:
                    counts[p] = counts.get(p, 0) + 1
            out += [f"{what}: {p} in {k} of {len(checks)}" for p, k in counts.items()]
            failing = sum(1 for c in checks if not c.comparison.ok)
            if failing and what != "text batches":
                out.append(f"{what}: {failing} of {len(checks)} differ from eager beyond the thresholds")
        return out or (["image sweep failed"] if not self.ok else [])

    def to_json(self) -> dict[str, Any]:
        return {
            **self.header,
            "environment": self.environment,
            "model": self.model,
            "runner": self.runner,
            "buckets": self.buckets,
            "requests": self.requests,
            "gap_threshold": self.gap_threshold,
            "max_logprob_delta": self.max_logprob_delta,
            "injected_fault": self.injected_fault,
            "side_inputs": self.side_inputs,
            "batches_checked": self.batches_checked,
            "bitwise_batches": self.bitwise_batches,
            "per_bucket": [e.to_json() for e in self.per_bucket],
            "image_sweep": None if self.image_sweep is None else self.image_sweep.to_json(),
            "ok": self.ok,
        }


@dataclass(frozen=True)
class _Thresholds:
    gap_threshold: float
    max_logprob_delta: float


def _sizes_in_bucket(b: int, prev: int, k: int, rng: np.random.Generator) -> list[int]:
    """Sizes that replay in bucket b: (max(b/2, prev), b], ends included, k in all."""
    lo = max(b // 2, prev) + 1
    if lo > b:
        return []
    picks = {lo, b}
    if k > 2 and b - lo > 1:
        picks.update(int(x) for x in rng.integers(lo + 1, b, size=k - 2))
    return sorted(picks)[: max(k, 2)]


def _request_counts(requests: Iterable[int], runner: str) -> list[int]:
    """The request counts each validated size is split into (the full runner holds one)."""
    req_list = sorted({int(r) for r in requests})
    if not req_list or req_list[0] < 1:
        raise InputError("request counts must be positive integers", "--requests")
    return [1] if runner == "full" else req_list


def _replay_vs_eager(engine: StaticPrefillEngine, x: PrefillInputs, th: _Thresholds, kind: str, **image: int) -> BatchCheck:
    """One batch run eagerly and replayed: the token-level comparison, the bucket used, and
    which side inputs replay read (probed after the comparison; the static buffers end as
    the batch's own fill, so the next batch meets what this one left)."""
    from bcgtune.engines.compare import compare_batch, probe_side_inputs

    he, le = engine.eager(x)
    he, le = he.clone(), le.clone()
    hr, lr, used = engine.replay(x)
    comparison = compare_batch(engine.model, he, hr, le, lr, x.lengths, th.gap_threshold, th.max_logprob_delta)
    side = probe_side_inputs(engine, x, used, hr.clone(), lr.clone())
    return BatchCheck(comparison, n=x.n, bucket=used, kind=kind, side_inputs=side, **image)


def _validate_bucket(
    engine: StaticPrefillEngine,
    b: int,
    rec: CaptureRecord,
    prev: int,
    req_list: list[int],
    rng: np.random.Generator,
    *,
    sizes_per_bucket: int,
    seed: int,
    th: _Thresholds,
) -> BucketValidation:
    """One bucket's entry: text batches of sizes that replay in it (each split into every
    request count that fits) compared with eager, and the pad-invariance check."""
    from bcgtune.engines.compare import check_pad_invariance
    from bcgtune.engines.inputs import text_inputs

    checks: list[BatchCheck] = []
    pad = None
    sizes = None
    if rec.ok:
        sizes = _sizes_in_bucket(b, prev, sizes_per_bucket, rng)
        for n in sizes:
            for r in (r for r in req_list if r <= n):
                x = text_inputs(engine.model, n, engine.device, seed=seed * 7919 + n, requests=r, split="random")
                checks.append(_replay_vs_eager(engine, x, th, "text"))
        if sizes:
            r_pad = min(req_list[-1], sizes[0])
            x = text_inputs(engine.model, sizes[0], engine.device, seed=seed + 17, requests=r_pad, split="random")
            pad = check_pad_invariance(engine, x, b, seed=seed)
    ok = rec.ok and rec.attention_match and all(c.ok for c in checks) and (pad is None or pad.ok)
    return BucketValidation(
        bucket=b,
        captured=rec.ok,
        error=rec.error,
        attention_match=rec.attention_match,
        attention_eager=rec.attention_eager,
        attention_capture=rec.attention_capture,
        checks=checks,
        pad_invariance=pad,
        sizes=sizes,
        ok=bool(ok),
    )


def _image_sweep(
    engine: StaticPrefillEngine,
    buckets: list[int],
    image_px: Sequence[int],
    rng: np.random.Generator,
    *,
    seed: int,
    th: _Thresholds,
) -> ImageSweep:
    """Image batches of each size in `image_px` replayed in every captured bucket they fit:
    compared with eager, and no new capture or torch.compile recompilation on the way."""
    from bcgtune.engines.inputs import image_inputs, text_inputs
    from bcgtune.engines.models import image_token_count
    from bcgtune.engines.runtime import dynamo_counters

    captures_before = engine.capture_count
    dyn_before = dynamo_counters()
    rows: list[BatchCheck | SkippedImage] = []
    after: list[BatchCheck] = []
    prev = 0
    for b in buckets:
        if b not in engine.graphs:
            prev = b
            continue
        lo = max(b // 2, prev) + 1
        last: BatchCheck | None = None
        for px in image_px:
            vis = image_token_count(engine.model, px, px)
            n_min = max(lo, vis + 3)
            if n_min > b:
                rows.append(SkippedImage(bucket=b, image_px=px, visual_tokens=vis))
                continue
            n = int(rng.integers(n_min, b + 1))
            x = image_inputs(engine.model, n, px, engine.device, seed=seed + px + b)
            assert x is not None  # n >= vis + 3
            last = _replay_vs_eager(engine, x, th, x.kind, visual_tokens=vis, image_px=px)
            rows.append(last)
        if last is not None:
            # straight after the image batch, a text batch as long, in the same bucket
            t = text_inputs(engine.model, last.n, engine.device, seed=seed + 31 * b)
            after.append(_replay_vs_eager(engine, t, th, "text after image"))
        prev = b
    dyn_after = dynamo_counters()
    return ImageSweep(
        image_px=list(image_px),
        new_captures=engine.capture_count - captures_before,
        dynamo_recompiles=dyn_after["recompiles"] - dyn_before["recompiles"],
        dynamo_new_graphs=dyn_after["unique_graphs"] - dyn_before["unique_graphs"],
        checks=rows,
        text_after_image=after,
    )


def run_validate(
    buckets: Iterable[int],
    spec: EngineSpec,
    sizes_per_bucket: int = 3,
    gap_threshold: float = GAP_THRESHOLD,
    max_logprob_delta: float = MAX_LOGPROB_DELTA,
    image_px: Sequence[int] = DEFAULT_IMAGE_PX,
    images: bool | None = None,
    progress: Callable[[BucketValidation], None] | None = None,
    requests: Iterable[int] = DEFAULT_VALIDATE_REQUESTS,
) -> ValidationReport:
    """Replay vs eager on identical batches, per bucket: sizes in (b/2, b] (ends included),
    each as batches of every request count in `requests` (a seeded random split into
    requests; the full runner holds one request, so it checks r = 1 only). Per batch: the
    token-level comparison (core.bench.accuracy thresholds), whether it is bit for bit, and which
    requests differ or fail; per bucket a pad-invariance check (garbage in the padded rows
    must not change any real row). `images` (default: on for VL models): the image sweep."""
    from bcgtune.core.document import document_header
    from bcgtune.engines.build import open_engine
    from bcgtune.engines.preflight import check_run

    shape = check_run(spec, buckets)
    req_list = _request_counts(requests, spec.runner)
    bl = sorted({int(b) for b in buckets})
    session = open_engine(spec, max(bl), shape, numerics=True)
    engine = session.engine
    recs = {r.bucket: r for r in engine.capture(bl)}
    is_vl = (
        getattr(engine.model, "input_kind", "ids") == "embeds"
        and getattr(getattr(engine.model, "cfg", None), "vision", None) is not None
    )
    do_images = is_vl if images is None else bool(images)
    if do_images and not is_vl:
        raise InputError("--images needs a VL model (e.g. --model qwen3-vl-8b)")
    if spec.fault != "none" and not do_images:
        raise InputError(f"{spec.fault} shows on image batches: drop --no-images", "--inject-fault")
    rng = np.random.default_rng(spec.seed)
    th = _Thresholds(gap_threshold, max_logprob_delta)
    per_bucket = []
    for prev, b in zip([0, *bl], bl):
        entry = _validate_bucket(
            engine, b, recs[b], prev, req_list, rng, sizes_per_bucket=sizes_per_bucket, seed=spec.seed, th=th
        )
        per_bucket.append(entry)
        if progress is not None:
            progress(entry)
    sweep = _image_sweep(engine, bl, image_px, rng, seed=spec.seed, th=th) if do_images else None
    return ValidationReport(
        header=document_header(VALIDATION_KIND),
        environment=session.environment,
        model=session.model,
        runner=spec.runner,
        buckets=bl,
        requests=req_list,
        gap_threshold=gap_threshold,
        max_logprob_delta=max_logprob_delta,
        per_bucket=per_bucket,
        image_sweep=sweep,
        injected_fault=spec.fault,
        side_inputs=engine.side_inputs(),
    )
