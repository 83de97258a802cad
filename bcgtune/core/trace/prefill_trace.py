"""PrefillTrace: a workload's prefill forward sizes, the input of every optimizer.

A trace is at heart a histogram of forward token counts (`sizes`, `counts`). Traces parsed
from logs or simulated also carry compact per-batch columns (numpy arrays of equal length)
and provenance (sources with sha256, parse statistics, captured buckets, simulation
parameters). Pure data: no files, no printing, no flags, no torch/sglang. Reading and
writing trace files (JSON, CSV, a list of sizes) is bcgtune.files.trace_file's job.
"""

from __future__ import annotations

import io
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from bcgtune.core.document import document_header
from bcgtune.core.schema import BATCHES_MAX, TOKENS_MAX, Percent, validate
from bcgtune.core.stats import nearest_rank
from bcgtune.core.trace.groups import TraceGroup, describe_groups, pairs_of
from bcgtune.errors import InputError

FORMAT_VERSION = 1
TRACE_KIND = "bcgtune.prefill-trace"
# How a source's bytes are identified: XXH3-128 (as `xxh128sum` prints it), or sha256 in
# traces written before bcgtune identified logs by XXH3-128.
SOURCE_DIGESTS = ("xxh128", "sha256")


def source_digest(source: Any) -> tuple[str, str] | None:
    """(algorithm, hex digest) of a trace source's bytes, None when it records none."""
    if isinstance(source, dict):
        for algo in SOURCE_DIGESTS:
            value = source.get(algo)
            if isinstance(value, str) and value:
                return algo, value
    return None


# Per-batch columns a trace may carry, with their numpy dtype. Flags use -1 for "unknown".
BATCH_COLUMNS: dict[str, str] = {
    "forward_tokens": "int64",  # tokens in the forward pass: what picks the bucket
    "new_seq": "int64",  # requests in the batch
    "new_token": "int64",
    "cached_token": "int64",
    "running_req": "int64",
    "queue_req": "int64",
    "replay_token": "int64",
    "graph": "int8",  # 1 replayed, 0 eager, -1 unknown (line carried no flag)
    "images": "int8",  # 1 batch carries image inputs, 0 not, -1 unknown
    "source": "int32",  # index into `sources`
    "line": "int64",  # 1-based physical line of the record in its source
    "timestamp": "float64",  # seconds since epoch (or since midnight for time-only prefixes); NaN if absent
    "rank": "int32",  # index into meta["ranks"] (e.g. "TP0", "DP7 TP7"); -1 if none
    "time_s": "float64",  # simulated start time of the batch
    "forward_iter": "int64",  # N of a `Prefill batch [N],` line (the scheduler's iteration); -1 if none
    "step": "int64",  # simulated DP-attention step (one scheduler iteration of every rank)
    "group": "int32",  # index into `groups` (the server configuration of the batch's log)
}


@dataclass(frozen=True)
class CapturedList:
    """The prefill bucket list a server logged at capture: the last complete `target
    prefill` list (after restarts, the one the server runs now), with how many capture
    lines listed a list and how many different lists there were."""

    buckets: list[int]
    backend: str | None
    source: int | None
    line: int | None
    capture_lines: int
    distinct_lists: int


@dataclass
class PrefillTrace:
    sizes: np.ndarray  # distinct forward sizes, ascending, int64, > 0
    counts: np.ndarray  # batches per size, int64, > 0
    batches: dict[str, np.ndarray] | None = None
    origin: str = "histogram"
    sources: list[dict[str, Any]] = field(default_factory=list)
    parse_stats: dict[str, Any] = field(default_factory=dict)
    captures: list[dict[str, Any]] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)
    groups: list[TraceGroup] = field(default_factory=list)  # server configurations (logs); [] when unknown

    # ---- construction -------------------------------------------------------------
    @classmethod
    def from_sizes(cls, forward_tokens, **kw) -> "PrefillTrace":
        """Histogram from per-batch forward sizes (any iterable of ints)."""
        arr = np.asarray(forward_tokens, dtype=np.int64)
        if arr.ndim != 1:
            raise InputError("forward sizes must be a flat list", field="sizes")
        sizes, counts = np.unique(arr, return_counts=True) if arr.size else (arr, arr)
        return cls(sizes=sizes.astype(np.int64), counts=counts.astype(np.int64), **kw)

    @classmethod
    def from_batches(cls, batches: dict[str, Any], **kw) -> "PrefillTrace":
        cols = {}
        n = None
        for name, values in batches.items():
            if name not in BATCH_COLUMNS:
                raise InputError(f"unknown batch column {name!r}", field="batches")
            arr = np.asarray(values, dtype=BATCH_COLUMNS[name])
            if n is None:
                n = len(arr)
            elif len(arr) != n:
                raise InputError(f"batch column {name!r} has {len(arr)} rows, expected {n}", field="batches")
            cols[name] = arr
        if "forward_tokens" not in cols:
            raise InputError("batches need a forward_tokens column", field="batches")
        t = cls.from_sizes(cols["forward_tokens"], **kw)
        t.batches = cols
        return t

    # ---- views --------------------------------------------------------------------
    @property
    def n_batches(self) -> int:
        return int(self.counts.sum())

    @property
    def n_tokens(self) -> int:
        return int((self.sizes * self.counts).sum())

    def percentile(self, q: float) -> int:
        """Nearest-rank percentile of the per-batch forward size (0 <= q <= 100)."""
        from fractions import Fraction

        if isinstance(q, (str, bytes, bool)):  # pydantic would read '50' as 50
            raise InputError(f"must be a number within 0..100, got {type(q).__name__} {q!r:.40}", field="q")
        if not isinstance(q, Fraction):
            q = validate(Percent, q.item() if isinstance(q, np.generic) else q, field="q")
        if self.n_batches == 0:
            raise InputError("trace is empty")
        return int(nearest_rank(self.sizes, self.counts, q, presorted=True))

    @property
    def histogram_only(self) -> bool:
        """No per-batch columns: counts per size (and per group, with request mixes) only."""
        return self.batches is None

    def request_mix(self):
        """The (tokens, requests) mix the groups carry (core.trace.mix.BatchMix), for a trace
        without per-batch columns; None when it has columns or no group."""
        if self.batches is not None or not self.groups:
            return None
        from bcgtune.core.trace.mix import BatchMix

        gs = self.groups
        tokens, requests, counts = pairs_of(
            np.concatenate([g.mix_tokens for g in gs]),
            np.concatenate([g.mix_requests for g in gs]),
            np.concatenate([g.mix_counts for g in gs]),
        )
        if tokens.size == 0:
            return None
        return BatchMix(tokens, requests, counts, requests_known=all(g.requests_known for g in gs))

    def source_names(self) -> list[str]:
        return [str(s.get("path", f"source {i}")) if isinstance(s, dict) else f"source {i}" for i, s in enumerate(self.sources)]

    def describe_groups(self) -> str:
        return describe_groups(self.groups, self.source_names())

    def own_sources(self) -> list[Any]:
        """The sources its batches come from: a one-configuration view of a fleet's trace
        (group_view) keeps the fleet's sources for its indices, but holds only its group's."""
        if len(self.groups) == 1 and self.groups[0].sources:
            return [self.sources[s] for s in self.groups[0].sources if 0 <= s < len(self.sources)]
        return list(self.sources)

    def group_view(self, index: int, batches: bool = True) -> "PrefillTrace":
        """The trace of one group: its batches (columns when the trace has them), its
        sources' captures and startup lines, and only that group (batches False: not its
        per-batch columns, for what its histogram tells)."""
        g = self.groups[index]
        own = set(g.sources)
        cols = None
        if self.batches is not None and batches:
            col = self.batches.get("group")
            keep = col == index if col is not None else np.ones(len(self.batches["forward_tokens"]), bool)
            cols = {k: v[keep] for k, v in self.batches.items()}
            cols["group"] = np.zeros(int(keep.sum()), np.int32)
        meta = dict(self.meta)
        if cols is None and len(self.groups) > 1:
            meta["ranks_from_all_groups"] = True  # the rank tags are the whole trace's, not this group's
        for key in ("startup", "graph_disabled", "server_args"):
            if isinstance(meta.get(key), list):
                meta[key] = [d for d in meta[key] if not isinstance(d, dict) or d.get("source") in own]
        return PrefillTrace(
            sizes=g.sizes.copy(),
            counts=g.counts.copy(),
            batches=cols,
            origin=self.origin,
            sources=self.sources,
            parse_stats=self.parse_stats,
            captures=[c for c in self.captures if c.get("source") in own],
            meta=meta,
            groups=[g],
        )

    def captured_list(self) -> CapturedList | None:
        """The list the traced server captured (see CapturedList); None when no complete
        target prefill list was logged."""
        lists = [
            c
            for c in self.captures
            if c.get("kind") == "prefill" and c.get("phase") == "target" and c.get("buckets") and not c.get("elided")
        ]
        if not lists:
            return None
        last = lists[-1]
        return CapturedList(
            buckets=sorted({int(b) for b in last["buckets"]}),
            backend=last.get("backend"),
            source=last.get("source"),
            line=last.get("line"),
            capture_lines=len(lists),
            distinct_lists=len({tuple(c["buckets"]) for c in lists}),
        )

    def chunked_prefill_size(self) -> int | None:
        """chunked_prefill_size the traced server ran with (one scheduler's, as logged), when
        the trace knows it: from its one group's settings, the log's startup line, or the
        simulated workload's resolved settings."""
        if len(self.groups) == 1 and self.groups[0].rank_chunk:
            return int(self.groups[0].rank_chunk)
        if len(self.groups) > 1:  # one chunk only if every configuration ran it; never the first one's
            chunks = {g.rank_chunk for g in self.groups}
            one = chunks.pop() if len(chunks) == 1 else None
            return int(one) if one else None
        for st in self.meta.get("startup") or []:
            if isinstance(st, dict) and st.get("chunked_prefill_size"):
                return int(st["chunked_prefill_size"])
        workload = self.meta.get("workload")
        resolved = workload.get("resolved") if isinstance(workload, dict) else None
        if isinstance(resolved, dict) and resolved.get("chunked_prefill_size"):
            return int(resolved["chunked_prefill_size"])
        return None

    def validate(self, where: str | None = None) -> "PrefillTrace":
        s, c = self.sizes, self.counts
        if s.size == 0:
            raise InputError("trace is empty: no prefill batches", where)
        if s.shape != c.shape:
            raise InputError("histogram sizes and counts differ in length", where)
        if (s <= 0).any():
            raise InputError(f"forward size must be positive, got {int(s[s <= 0][0])}", where)
        if (s > TOKENS_MAX).any():
            raise InputError(f"forward size {int(s[s > TOKENS_MAX][0])} is above SGLang's int32 token counts", where)
        if (c <= 0).any():
            raise InputError(f"count must be positive, got {int(c[c <= 0][0])}", where)
        if (c > BATCHES_MAX).any():
            raise InputError(f"count {int(c[c > BATCHES_MAX][0])} is above {BATCHES_MAX}", where)
        if (np.diff(s) <= 0).any():
            raise InputError("histogram sizes must be distinct and ascending", where)
        return self

    # ---- serialisation ------------------------------------------------------------
    def to_json_obj(self) -> dict[str, Any]:
        return {
            **document_header(TRACE_KIND, FORMAT_VERSION),
            "origin": self.origin,
            "sources": self.sources,
            "parse_stats": self.parse_stats,
            "captures": self.captures,
            "meta": self.meta,
            "summary": {
                "batches": self.n_batches,
                "distinct_sizes": int(self.sizes.size),
                "tokens": self.n_tokens,
            },
            "histogram": {"sizes": self.sizes.tolist(), "counts": self.counts.tolist()},
            "groups": [g.to_json_obj() for g in self.groups],
            "batches": None if self.batches is None else {k: _column_to_json(v) for k, v in self.batches.items()},
        }

    def to_csv(self) -> str:
        buf = io.StringIO()
        buf.write("size,count\n")
        for s, c in zip(self.sizes.tolist(), self.counts.tolist()):
            buf.write(f"{s},{c}\n")
        return buf.getvalue()


def _column_to_json(arr: np.ndarray) -> list:
    if arr.dtype.kind == "f":
        return [None if np.isnan(x) else round(float(x), 3) for x in arr.tolist()]
    return arr.tolist()
