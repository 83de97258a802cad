"""Column merging: what one log yields as compact per-batch columns (a few dozen bytes per
batch, picklable, so a worker process returns it), and the columns of several logs merged
in input order with ranks numbered in order of first record (as one serial pass would)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from bcgtune.adapters.sglang_log.fastpath import _INT_COLS, _Block
from bcgtune.adapters.sglang_log.grammar import (
    _GRAPH_LABELS,
    MAX_CAPTURES,
    MAX_MALFORMED_SAMPLES,
    MAX_META_EVENTS,
    MAX_SAMPLE_CHARS,
)
from bcgtune.adapters.sglang_log.options import DEFAULT_OPTIONS, ParseOptions
from bcgtune.adapters.sglang_log.scanner import _scan, _Sink


@dataclass
class _FileResult:
    """What one log yields, compact and picklable (a worker process returns it): per-batch
    columns (rank: an index into `ranks`), counts, and capped lists of samples."""

    path: str
    sha256: str
    nbytes: int
    lines: int
    decode_lines: int
    legacy_decode_lines: int
    columns: dict[str, np.ndarray]
    ranks: list[str]
    graph_labels: dict[str, int]
    legacy: int
    wrapped: int
    malformed: int
    malformed_samples: list[dict]
    captures: list[dict]
    capture_count: int
    startup: list[dict]
    startup_count: int
    disabled: list[dict]
    disabled_count: int
    overlong: int
    overlong_samples: list[dict]


_COLUMNS = {
    "new_seq": np.int64, "new_token": np.int64, "cached_token": np.int64, "running_req": np.int64,
    "queue_req": np.int64, "replay_token": np.int64, "graph": np.int8, "line": np.int64,
    "timestamp": np.float64, "rank": np.int32, "forward_iter": np.int64,
}  # fmt: skip
# An iteration counter beyond this is not SGLang's (trace columns hold int64 within +-2**62): unknown.
_FORWARD_ITER_MAX = 2**62


def _in_order_of_appearance(values: np.ndarray) -> list[int]:
    """The distinct values, in order of first appearance."""
    if (values == values[0]).all():
        return [int(values[0])]
    uniq, first = np.unique(values, return_index=True)
    return uniq[np.argsort(first)].tolist()


class _ColumnSink(_Sink):
    """Per-batch columns (a few dozen bytes per batch, one array per chunk until the end)
    and capped lists."""

    def __init__(self) -> None:
        self.parts: dict[str, list[np.ndarray]] = {k: [] for k in _COLUMNS}
        self.rank_index: dict[str, int] = {}
        self.graph_labels: dict[str, int] = {}
        self.legacy = self.wrapped = 0
        self.malformed_count = self.capture_count = self.startup_count = self.disabled_count = 0
        self.overlong_count = 0
        self.malformed_samples: list[dict] = []
        self.captures: list[dict] = []
        self.startup_list: list[dict] = []
        self.disabled_list: list[dict] = []
        self.overlong_samples: list[dict] = []

    def columns(self) -> dict[str, np.ndarray]:
        """The columns, each concatenated once (its parts freed as it goes)."""
        out = {}
        for k, dtype in _COLUMNS.items():
            parts = self.parts.pop(k)
            out[k] = parts[0] if len(parts) == 1 else np.concatenate(parts) if parts else np.empty(0, dtype)
            del parts
        return out

    def records(self, source: int, b: _Block) -> None:
        for k, dtype in _COLUMNS.items():
            if k == "rank":
                col = self._ranks(b)
            elif k == "forward_iter":  # N of `Prefill batch [N],`: the scheduler's iteration, -1 when absent
                col = np.where(b.forward_ct > _FORWARD_ITER_MAX, -1, b.forward_ct).astype(dtype, copy=False)
            else:
                col = getattr(b, k).astype(dtype, copy=False)
            self.parts[k].append(col)
        labels = b.label[b.label >= 0]
        if labels.size:  # counted in order of first appearance, like the ranks
            for code in _in_order_of_appearance(labels):
                name = _GRAPH_LABELS[code]
                self.graph_labels[name] = self.graph_labels.get(name, 0) + int(np.count_nonzero(labels == code))
        self.legacy += int(np.count_nonzero(b.legacy))
        self.wrapped += int(np.count_nonzero(b.physical_lines > 1))

    def _ranks(self, b: _Block) -> np.ndarray:
        """The block's ranks as indices into this sink's ranks (in order of first record)."""
        out = np.full(len(b.rank), -1, np.int32)
        has = b.rank >= 0
        if has.any():
            lut = np.full(len(b.rank_names), -1, np.int32)
            for loc in _in_order_of_appearance(b.rank[has]):
                lut[loc] = self.rank_index.setdefault(b.rank_names[loc], len(self.rank_index))
            out[has] = lut[b.rank[has]]
        return out

    def malformed(self, source: int, line: int, text: str) -> None:
        self.malformed_count += 1
        if len(self.malformed_samples) < MAX_MALFORMED_SAMPLES:
            self.malformed_samples.append({"source": source, "line": line, "text": text.strip()[:MAX_SAMPLE_CHARS]})

    def capture(self, cap: dict) -> None:
        self.capture_count += 1
        if len(self.captures) < MAX_CAPTURES:
            self.captures.append(cap)

    def startup(self, d: dict) -> None:
        self.startup_count += 1
        if len(self.startup_list) < MAX_META_EVENTS:
            self.startup_list.append(d)

    def disabled(self, d: dict) -> None:
        self.disabled_count += 1
        if len(self.disabled_list) < MAX_META_EVENTS:
            self.disabled_list.append(d)

    def overlong(self, source: int, line: int, nbytes: int, head: str) -> None:
        self.overlong_count += 1
        if len(self.overlong_samples) < MAX_MALFORMED_SAMPLES:
            self.overlong_samples.append({"source": source, "line": line, "bytes": nbytes, "text": head})


def _parse_file(
    path: str,
    source: int,
    progress: Callable[[int], None] | None = None,
    options: ParseOptions = DEFAULT_OPTIONS,
) -> _FileResult:
    sink = _ColumnSink()
    (lines, decode, legacy_decode), src = _scan(path, source, sink, progress, options)
    return _FileResult(
        path=path, sha256=src.sha256.hexdigest(), nbytes=src.nbytes, lines=lines, decode_lines=decode,
        legacy_decode_lines=legacy_decode,
        columns=sink.columns(),
        ranks=sorted(sink.rank_index, key=sink.rank_index.__getitem__), graph_labels=sink.graph_labels,
        legacy=sink.legacy, wrapped=sink.wrapped, malformed=sink.malformed_count,
        malformed_samples=sink.malformed_samples, captures=sink.captures, capture_count=sink.capture_count,
        startup=sink.startup_list, startup_count=sink.startup_count, disabled=sink.disabled_list,
        disabled_count=sink.disabled_count, overlong=sink.overlong_count, overlong_samples=sink.overlong_samples,
    )  # fmt: skip


def _merge_columns(results: list[_FileResult]) -> tuple[dict[str, np.ndarray], list[str]]:
    """One set of columns in input order, with a `source` column and ranks numbered in
    order of first record across the inputs (as one serial pass would)."""
    ranks: dict[str, int] = {}
    parts: dict[str, list[np.ndarray]] = {
        k: [] for k in (*_INT_COLS, "graph", "source", "line", "timestamp", "rank", "forward_iter")
    }
    for i, r in enumerate(results):
        lut = np.array([ranks.setdefault(name, len(ranks)) for name in r.ranks] + [-1], np.int32)
        for k, col in r.columns.items():
            parts[k].append(lut[col] if k == "rank" else col)
        parts["source"].append(np.full(len(r.columns["line"]), i, np.int32))
    types = {"graph": np.int8, "source": np.int32, "timestamp": np.float64, "rank": np.int32}
    cols = {}
    for k in list(parts):
        v = parts.pop(k)
        cols[k] = v[0] if len(v) == 1 else np.concatenate(v) if v else np.empty(0, types.get(k, np.int64))
    return cols, list(ranks)
