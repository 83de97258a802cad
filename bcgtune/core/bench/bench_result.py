"""The result of `bcgtune bench`: each launch of the interleaved A/B order with its measured
client runs, and the comparison of every arm with the baseline (bcgtune/core/bench/abstats.py).
It owns its JSON round trip (bench.json and `bench --json` hold `to_json()`; `from_json`
reads it back, checked). Pure: no I/O."""

from __future__ import annotations

import math
from typing import Any, Literal, get_args

import pydantic

from bcgtune.core.bench.abstats import MetricComparison, compare_arm
from bcgtune.core.document import check_header, document_header
from bcgtune.core.schema import validate

FORMAT_VERSION = 1
KIND = "bcgtune.bench"
VariantKind = Literal["profile", "disabled", "default", "list"]
VARIANT_KINDS: tuple[str, ...] = get_args(VariantKind)
METRICS = {  # result-line key -> (label, higher is better)
    "output_throughput": ("output tok/s", True),
    "mean_ttft_ms": ("TTFT ms", False),
    "mean_tpot_ms": ("TPOT ms", False),
}


_COUNTS = frozenset({"completed", "total_input_tokens", "total_output_tokens"})


class _Model(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")


class BenchArm(_Model):
    """One arm: a variant of the profile (how its server is launched)."""

    name: str
    variant: VariantKind
    buckets: list[int] | None = None


class BenchRun(_Model):
    """One measured client run: the keys bench reads from the benchmark's result line (None
    where the client wrote none)."""

    concurrency: int
    run: int
    output_throughput: float | None = None
    mean_ttft_ms: float | None = None
    mean_tpot_ms: float | None = None
    median_ttft_ms: float | None = None
    median_tpot_ms: float | None = None
    completed: int | None = None
    duration: float | None = None
    total_input_tokens: int | None = None
    total_output_tokens: int | None = None
    request_throughput: float | None = None

    @classmethod
    def from_result_line(cls, concurrency: int, run: int, line: dict[str, Any]) -> BenchRun:
        """The run from the client's result line; a value of the wrong kind counts as absent."""
        values: dict[str, Any] = {}
        for name in cls.model_fields:
            if name in ("concurrency", "run"):
                continue
            v = line.get(name)
            if not isinstance(v, (int, float)) or isinstance(v, bool):
                values[name] = None
            elif name in _COUNTS:
                values[name] = int(v) if math.isfinite(v) and float(v).is_integer() else None
            else:
                values[name] = float(v)
        return cls(concurrency=concurrency, run=run, **values)

    def metric(self, name: str) -> float | None:
        v = getattr(self, name)
        return None if v is None else float(v)


class BenchLaunch(_Model):
    """One server launch of the order and the runs measured on it (warm-up excluded)."""

    index: int
    arm: str
    launch_command: list[str]
    launch_env: dict[str, str]
    server_log: str
    runs: list[BenchRun] = pydantic.Field(default_factory=list)


class BenchResult(_Model):
    """The whole bench: the plan, every launch, and per arm and metric its comparison with
    the baseline arm (the first). `complete` is False while it runs or when it stopped."""

    format_version: int = FORMAT_VERSION
    kind: str = KIND
    tool: str = "bcgtune"
    tool_version: str = ""
    created: str = ""
    complete: bool = False
    profile: str
    profile_path: str
    profile_sha256: str
    arms: list[BenchArm]
    base_arm: str
    order: list[str]
    concurrency: list[int]
    runs: int
    prompts_per_concurrency: int
    warmup: bool
    bench_args: list[str]
    workdir: str
    launches: list[BenchLaunch] = pydantic.Field(default_factory=list)
    comparisons: dict[str, dict[str, MetricComparison]] = pydantic.Field(default_factory=dict)

    @classmethod
    def start(cls, **plan: Any) -> BenchResult:
        """A new result (no launch yet) with the header of now; the first arm is the baseline."""
        header = document_header(KIND, FORMAT_VERSION)
        return cls(**header, base_arm=plan["arms"][0].name, **plan)

    def compare(self) -> None:
        """Recompute every arm's comparison with the baseline from the launches so far."""
        out: dict[str, dict[str, MetricComparison]] = {}
        for arm in (a.name for a in self.arms[1:]):
            out[arm] = {}
            for metric in METRICS:
                a = self.launch_values(arm, metric)
                b = self.launch_values(self.base_arm, metric)
                if a and b:
                    out[arm][metric] = compare_arm(metric, arm, a, self.base_arm, b)
        self.comparisons = out

    def launch_values(self, arm: str, metric: str) -> list[dict[int, list[float]]]:
        """Per launch of `arm`: concurrency -> the metric's values over its runs."""
        out = []
        for launch in self.launches:
            if launch.arm != arm:
                continue
            d: dict[int, list[float]] = {}
            for row in launch.runs:
                v = row.metric(metric)
                if v is not None:
                    d.setdefault(row.concurrency, []).append(v)
            if d:
                out.append(d)
        return out

    def to_json(self) -> dict[str, Any]:
        return self.model_dump()

    @classmethod
    def from_json(cls, obj: Any, where: str = "bench result") -> BenchResult:
        """A result as `to_json` wrote it (bench.json), checked."""
        return validate(cls, check_header(obj, KIND, FORMAT_VERSION, "bench result", where), where)
