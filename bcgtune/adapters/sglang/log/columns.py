"""Column merging: what one log yields as compact per-batch columns (a few dozen bytes per
batch, picklable, so a worker process returns it), and the columns of several logs merged
in input order with ranks numbered in order of first record (as one serial pass would)."""

from __future__ import annotations

import bisect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from bcgtune.adapters.sglang.log.fastpath import _Block
from bcgtune.adapters.sglang.log.grammar import (
    _GRAPH_LABELS,
    MAX_CAPTURES,
    MAX_MALFORMED_SAMPLES,
    MAX_META_EVENTS,
    MAX_SAMPLE_CHARS,
    forward_tokens,
)
from bcgtune.adapters.sglang.log.options import DEFAULT_OPTIONS, ParseOptions
from bcgtune.adapters.sglang.log.scanner import _at_line, _scan, _Sink
from bcgtune.core.stats import distinct
from bcgtune.core.trace.groups import UNLOGGED_CHUNK_KEY, UNLOGGED_NEW_TOKEN_KEY

MAX_SEGMENTS = 1024  # launches (server_args lines) told apart per file; later ones join the last


class Want(NamedTuple):
    """What a parse keeps: per-batch columns, or only counts per size and request mixes per
    launch (histogram_only: memory flat in the log's length); mixed_chunk: forward tokens
    count the running decode rows (the histogram is made while reading)."""

    mixed_chunk: bool = False
    histogram_only: bool = False
    # launch settings for the launches whose log states none (rotated logs without their
    # server_args and startup lines), as SGLang's server_args line states them (the chunk
    # per attention-DP rank): ((key, value), ...)
    assumed: tuple = ()
    # the launch the log's first lines continue when it states none (a rotated piece: the
    # launch its older piece ended with, see inherit_first): its settings count its forward tokens
    first: dict | None = None

    @classmethod
    def of(cls, mixed_chunk: bool, histogram_only: bool, assumed: dict[str, Any] | None = None) -> "Want":
        return cls(bool(mixed_chunk), bool(histogram_only), tuple(sorted((assumed or {}).items())))


@dataclass
class _FileResult:
    """What one log yields, compact and picklable (a worker process returns it): per-batch
    columns (rank: an index into `ranks`; segment: the launch the batch belongs to), or
    per-launch histograms; counts; capped lists of samples; and each launch's settings."""

    path: str
    xxh128: str
    nbytes: int
    lines: int
    decode_lines: int
    legacy_decode_lines: int
    columns: dict[str, np.ndarray] | None
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
    server_args: list[dict]
    server_args_count: int
    head_cut: int
    head_cut_samples: list[dict]
    glued: int
    glued_samples: list[dict]
    segments: list[dict]  # per launch: {"start", "server_args", "startup", "saturated"}
    records: int  # prefill records read (zero-token ones included)
    untagged: int  # of those, records without a rank tag
    histograms: list[dict] | None = None  # histogram_only: per launch {"tokens", "requests", "counts", "graph", ...}


_COLUMNS = {
    "new_seq": np.int64, "new_token": np.int64, "cached_token": np.int64, "running_req": np.int64,
    "queue_req": np.int64, "replay_token": np.int64, "graph": np.int8, "line": np.int64,
    "timestamp": np.float64, "rank": np.int32, "forward_iter": np.int64, "segment": np.int32,
}  # fmt: skip
# An iteration counter beyond this is not SGLang's (trace columns hold int64 within +-2**62): unknown.
_FORWARD_ITER_MAX = 2**62


def _in_order_of_appearance(values: np.ndarray) -> list[int]:
    """The distinct values, in order of first appearance."""
    if (values == values[0]).all():
        return [int(values[0])]
    uniq, first = np.unique(values, return_index=True)
    return uniq[np.argsort(first)].tolist()


def _runs(seg: np.ndarray) -> list[tuple[int, slice]]:
    """(launch, rows) of each run of a block's launch column: the block is in line order and
    launches start at increasing lines, so each launch's rows are one slice."""
    if not len(seg):
        return []
    if seg[0] == seg[-1]:
        return [(int(seg[0]), slice(0, len(seg)))]
    cuts = [0, *(np.flatnonzero(seg[1:] != seg[:-1]) + 1).tolist(), len(seg)]
    return [(int(seg[a]), slice(a, b)) for a, b in zip(cuts[:-1], cuts[1:])]


def _top_count(u: list[int], at: int, values: np.ndarray) -> None:
    """u[at], u[at + 1]: the largest value seen and how many reach it, updated by `values`."""
    top = int(values.max())
    if top > u[at]:
        u[at], u[at + 1] = top, int(np.count_nonzero(values == top))
    elif top == u[at]:
        u[at + 1] += int(np.count_nonzero(values == top))


def _chunk(startup: dict | None, server_args: dict | None) -> Any:
    return (startup or {}).get("chunked_prefill_size") or (server_args or {}).get("chunked_prefill_size")


def _sample(samples: list[dict], item: dict) -> None:
    if len(samples) < MAX_MALFORMED_SAMPLES:
        samples.append(item)


class _FileSink(_Sink):
    """Counts, capped samples, ranks and graph labels in order of first record, and the
    launches of one log: a `server_args=` line starts one (SGLang logs it once per launch);
    batches before the first belong to launch 0. Each launch also counts its
    chunk-saturated batches (core.trace.groups.mixed_chunk_signature)."""

    def __init__(self, assumed: dict[str, Any] | None = None, mixed_chunk: bool = False, first: dict | None = None) -> None:
        self.assumed = dict(assumed or {})
        self.mixed_chunk = mixed_chunk
        self.first = first
        self.unlogged: dict[int, list[int]] = {}
        self.rank_index: dict[str, int] = {}
        self.graph_labels: dict[str, int] = {}
        self.legacy = self.wrapped = self.n_records = self.untagged = 0
        self.malformed_count = self.capture_count = self.startup_count = self.disabled_count = 0
        self.overlong_count = self.server_args_count = self.head_cut_count = self.glued_count = 0
        self.malformed_samples: list[dict] = []
        self.captures: list[dict] = []
        self.startup_list: list[dict] = []
        self.disabled_list: list[dict] = []
        self.overlong_samples: list[dict] = []
        self.server_args_list: list[dict] = []
        self.head_cut_samples: list[dict] = []
        self.glued_samples: list[dict] = []
        self.seg_starts: list[int] = [0]
        self._seg_array: np.ndarray | None = None
        self.segments: list[dict] = [{"start": 0, "server_args": None, "startup": None, "saturated": {}}]

    def segment_of(self, lines: np.ndarray) -> np.ndarray:
        if self._seg_array is None or len(self._seg_array) != len(self.seg_starts):
            self._seg_array = np.asarray(self.seg_starts)  # seg_starts only grows
        return (np.searchsorted(self._seg_array, lines, side="right") - 1).astype(np.int32)

    def records(self, source: int, b: _Block) -> None:
        labels = b.label[b.label >= 0]
        if labels.size:  # counted in order of first appearance, like the ranks
            for code in _in_order_of_appearance(labels):
                name = _GRAPH_LABELS[code]
                self.graph_labels[name] = self.graph_labels.get(name, 0) + int(np.count_nonzero(labels == code))
        self.legacy += int(np.count_nonzero(b.legacy))
        self.wrapped += int(np.count_nonzero(b.physical_lines > 1))
        self.n_records += len(b.line)
        seg = self.segment_of(b.line)
        runs = _runs(seg)
        self._saturation(b, runs)
        self.block(b, seg, runs)

    def block(self, b: _Block, seg: np.ndarray, runs: list[tuple[int, slice]]) -> None: ...

    def mixed_of(self, s: int) -> bool:
        """Whether launch `s` ran --enable-mixed-chunk: as its server_args line states, else as
        the settings given for a log that states none say, else as --mixed-chunk says (the
        settings _parse_file gives the launch at the end say the same)."""
        seg = self.segments[s]
        stated = seg["server_args"] if seg["server_args"] is not None else self._unstated(s)["server_args"]
        value = stated.get("enable_mixed_chunk")
        return value if isinstance(value, bool) else self.mixed_chunk

    def _unstated(self, s: int) -> dict:
        """What launch `s`, whose log states no server_args, is read by: the launch an older
        piece ended with (for the first one), else the settings given."""
        if s == 0 and self.first is not None:
            return self.first
        return {"server_args": self.assumed, "startup": None}

    def _chunk_of(self, s: int) -> Any:
        seg = self.segments[s]
        if seg["server_args"] is None and s == 0 and self.first is not None:
            return _chunk(seg["startup"] or self.first["startup"], self.first["server_args"])
        if seg["startup"] is None and seg["server_args"] is None:
            return self.assumed.get("chunked_prefill_size")  # given for a log that states no launch
        return _chunk(seg["startup"], seg["server_args"])

    def _saturation(self, b: _Block, runs: list[tuple[int, slice]]) -> None:
        """Batches that filled their launch's chunk: `#new-token == chunk`, or with running
        decode rows `#new-token + #running-req == chunk` (the mixed-chunk signature); each
        run of rows of one launch counted at once."""
        logged = []
        for s, rows in runs:
            chunk = self._chunk_of(s)
            if isinstance(chunk, int) and chunk > 0:
                logged.append((s, rows, chunk))
            else:
                self._unlogged(s, b.new_token[rows], b.running_req[rows])
        if not logged:
            return
        # the rows of every run with a chunk, each beside its run's chunk
        sel = np.concatenate([np.arange(rows.start, rows.stop) for _, rows, _ in logged])
        lengths = [rows.stop - rows.start for _, rows, _ in logged]
        nt, rr = b.new_token[sel], b.running_req[sel]
        chunk = np.repeat(np.array([c for _, _, c in logged], np.int64), lengths)
        at = np.cumsum([0, *lengths[:-1]])  # where each run starts
        full = np.add.reduceat((nt == chunk).astype(np.int64), at).tolist()
        mixed = np.add.reduceat(((rr > 0) & (nt < chunk) & (nt + rr == chunk)).astype(np.int64), at).tolist()
        for (s, _, _), n_full, n_mixed in zip(logged, full, mixed):
            sat = self.segments[s]["saturated"]
            sat["chunk"] = sat.get("chunk", 0) + n_full
            sat["chunk_minus_running"] = sat.get("chunk_minus_running", 0) + n_mixed

    def _unlogged(self, s: int, nt: np.ndarray, rr: np.ndarray) -> None:
        """A launch whose chunk is not logged (rotated logs): the largest #new-token +
        #running-req over batches with running rows and how many batches reach it, and the
        largest #new-token and how many batches reach it (core.trace.groups.unlogged_mixed_chunk
        weighs one against the other)."""
        u = self.unlogged.setdefault(s, [0, 0, 0, 0])  # best sum, batches at it, largest new_token, batches at it
        if not nt.size:
            return
        _top_count(u, 2, nt)
        run = rr > 0
        if run.any():
            _top_count(u, 0, nt[run] + rr[run])

    def finish_unlogged(self) -> None:
        """Each launch without a logged chunk gets its largest sum and its largest #new-token
        counted under the value as key (`unlogged_chunk_<sum>`, `unlogged_new_token_<n>`:
        batches reaching it); a fleet's files add up per value."""
        for s, (top, at, nt_max, nt_at) in self.unlogged.items():
            sat = self.segments[s]["saturated"]
            for key, n in ((f"{UNLOGGED_CHUNK_KEY}{top}", at), (f"{UNLOGGED_NEW_TOKEN_KEY}{nt_max}", nt_at)):
                if n:
                    sat[key] = sat.get(key, 0) + n

    def ranks_of(self, b: _Block) -> np.ndarray:
        """The block's ranks as indices into this sink's ranks (in order of first record)."""
        out = np.full(len(b.rank), -1, np.int32)
        has = b.rank >= 0
        self.untagged += int(len(has) - np.count_nonzero(has))
        if has.any():
            lut = np.full(len(b.rank_names), -1, np.int32)
            for loc in _in_order_of_appearance(b.rank[has]):
                lut[loc] = self.rank_index.setdefault(b.rank_names[loc], len(self.rank_index))
            out[has] = lut[b.rank[has]]
        return out

    def malformed(self, source: int, line: int, text: str) -> None:
        self.malformed_count += 1
        _sample(self.malformed_samples, {"source": source, "line": line, "text": text.strip()[:MAX_SAMPLE_CHARS]})

    def capture(self, cap: dict) -> None:
        self.capture_count += 1
        if len(self.captures) < MAX_CAPTURES:
            self.captures.append(cap)

    def startup(self, d: dict) -> None:
        self.startup_count += 1
        if len(self.startup_list) < MAX_META_EVENTS:
            self.startup_list.append(d)
        seg = self.segments[bisect.bisect_right(self.seg_starts, d["line"]) - 1]
        if seg["startup"] is None:
            seg["startup"] = {k: v for k, v in d.items() if k not in ("source", "line", "rank")}

    def server_args(self, d: dict) -> None:
        self.server_args_count += 1
        if len(self.server_args_list) < MAX_META_EVENTS:
            self.server_args_list.append(d)
        if len(self.segments) < MAX_SEGMENTS and d["line"] > self.seg_starts[-1]:
            self.seg_starts.append(d["line"])
            self.segments.append({"start": d["line"], "server_args": d["settings"], "startup": None, "saturated": {}})
        elif self.segments[-1]["server_args"] is None:
            self.segments[-1]["server_args"] = d["settings"]

    def events(self, kind: str, templates: list, which: np.ndarray, lines: np.ndarray) -> None:
        """Many lines of a few texts at once (scanner._Sink.events): counted in bulk, the
        first ones kept as each single call would."""
        n = len(lines)
        if kind == "capture":
            self.capture_count += n
            self._keep(self.captures, MAX_CAPTURES, templates, which, lines)
        elif kind == "startup":
            self.startup_count += n
            self._keep(self.startup_list, MAX_META_EVENTS, templates, which, lines)
            first = bisect.bisect_right(self.seg_starts, int(lines[0])) - 1
            if first == bisect.bisect_right(self.seg_starts, int(lines[-1])) - 1:  # one launch (lines are in order)
                at = [(first, 0)]
            else:
                seg = np.searchsorted(np.array(self.seg_starts), lines, "right") - 1
                at = list(zip(*(x.tolist() for x in np.unique(seg, return_index=True))))
            for s, j in at:
                if self.segments[s]["startup"] is None:
                    d = templates[int(which[j])][0]
                    self.segments[s]["startup"] = {k: v for k, v in d.items() if k not in ("source", "line", "rank")}
        elif kind == "disabled":
            self.disabled_count += n
            self._keep(self.disabled_list, MAX_META_EVENTS, templates, which, lines)
        elif kind == "head_cut":
            self.head_cut_count += n
            room = max(0, MAX_MALFORMED_SAMPLES - len(self.head_cut_samples))
            for w, line in zip(which[:room].tolist(), lines[:room].tolist()):
                source, _, text = templates[w]
                _sample(self.head_cut_samples, {"source": source, "line": line, "text": text.strip()[:MAX_SAMPLE_CHARS]})
        elif kind == "server_args":  # each may start a launch, until launches and the kept list are full
            for j, (w, line) in enumerate(zip(which.tolist(), lines.tolist())):
                full = len(self.server_args_list) >= MAX_META_EVENTS and len(self.segments) >= MAX_SEGMENTS
                if full and self.segments[-1]["server_args"] is not None:
                    self.server_args_count += n - j  # what a call would do now: count it
                    break
                self.server_args(*_at_line(templates[w], line))
        else:
            super().events(kind, templates, which, lines)

    @staticmethod
    def _keep(kept: list, cap: int, templates: list, which: np.ndarray, lines: np.ndarray) -> None:
        room = max(0, cap - len(kept))
        kept += [_at_line(templates[w], line)[0] for w, line in zip(which[:room].tolist(), lines[:room].tolist())]

    def disabled(self, d: dict) -> None:
        self.disabled_count += 1
        if len(self.disabled_list) < MAX_META_EVENTS:
            self.disabled_list.append(d)

    def overlong(self, source: int, line: int, nbytes: int, head: str) -> None:
        self.overlong_count += 1
        _sample(self.overlong_samples, {"source": source, "line": line, "bytes": nbytes, "text": head})

    def head_cut(self, source: int, line: int, text: str) -> None:
        self.head_cut_count += 1
        _sample(self.head_cut_samples, {"source": source, "line": line, "text": text.strip()[:MAX_SAMPLE_CHARS]})

    def glued(self, source: int, line: int, text: str) -> None:
        self.glued_count += 1
        _sample(self.glued_samples, {"source": source, "line": line, "text": text.strip()[:MAX_SAMPLE_CHARS]})


class _ColumnSink(_FileSink):
    """Per-batch columns (a few dozen bytes per batch, one array per chunk until the end)."""

    def __init__(self, assumed: dict[str, Any] | None = None, mixed_chunk: bool = False, first: dict | None = None) -> None:
        super().__init__(assumed, mixed_chunk, first)
        self.parts: dict[str, list[np.ndarray]] = {k: [] for k in _COLUMNS}

    def columns(self) -> dict[str, np.ndarray]:
        """The columns, each concatenated once (its parts freed as it goes)."""
        out = {}
        for k, dtype in _COLUMNS.items():
            parts = self.parts.pop(k)
            out[k] = parts[0] if len(parts) == 1 else np.concatenate(parts) if parts else np.empty(0, dtype)
            del parts
        return out

    def block(self, b: _Block, seg: np.ndarray, runs: list[tuple[int, slice]]) -> None:
        for k, dtype in _COLUMNS.items():
            if k == "rank":
                col = self.ranks_of(b)
            elif k == "segment":
                col = seg
            elif k == "forward_iter":  # N of `Prefill batch [N],`: the scheduler's iteration, -1 when absent
                col = np.where(b.forward_ct > _FORWARD_ITER_MAX, -1, b.forward_ct).astype(dtype, copy=False)
            else:
                col = getattr(b, k).astype(dtype, copy=False)
            # a view would keep its block's whole parse buffer alive until the end: own the values
            self.parts[k].append(col if col.base is None else col.copy())


class _HistogramSink(_FileSink):
    """Counts per (forward tokens, requests) pair per launch, the graph flag counted per
    launch: memory grows with the distinct pairs, never with the number of batches."""

    wants_timestamps = False  # no column keeps them

    def __init__(self, mixed_chunk: bool, assumed: dict[str, Any] | None = None, first: dict | None = None) -> None:
        super().__init__(assumed, mixed_chunk, first)
        self.pairs = _PairCounter()
        # per launch: [replayed, eager, unflagged] batches, batches without #new-seq, and
        # whether it has a batch of more than 0 forward tokens (then it has a histogram)
        self.graph = np.zeros((MAX_SEGMENTS + 1, 3), np.int64)
        self.unknown_requests = np.zeros(MAX_SEGMENTS + 1, np.int64)
        self.has_batches = np.zeros(MAX_SEGMENTS + 1, np.bool_)
        self.zero = 0

    def block(self, b: _Block, seg: np.ndarray, runs: list[tuple[int, slice]]) -> None:
        self.ranks_of(b)  # ranks in order of first record, as the columns would number them
        fwd = self._forward(b, seg, runs)
        f, r, g = fwd, b.new_seq, b.graph
        keep = fwd > 0
        n_zero = len(keep) - int(np.count_nonzero(keep))
        self.zero += n_zero
        if n_zero:
            seg, f, r, g = seg[keep], f[keep], r[keep], g[keep]
        if not len(seg):
            return
        lo, hi = int(seg.min()), int(seg.max()) + 1
        local = seg.astype(np.int64) - lo
        self.has_batches[lo:hi] |= np.bincount(local, minlength=hi - lo) > 0
        self.unknown_requests[lo:hi] += np.bincount(local[r < 1], minlength=hi - lo)
        # graph is 1, 0 or -1: columns replayed, eager, unflagged
        self.graph[lo:hi] += np.bincount(local * 3 + (1 - g.astype(np.int64)), minlength=3 * (hi - lo)).reshape(-1, 3)
        self.pairs.add(seg, f, np.where(r >= 1, np.minimum(r, f), 1))

    def _forward(self, b: _Block, seg: np.ndarray, runs: list[tuple[int, slice]]) -> np.ndarray:
        """Forward tokens of the block's batches, each by its launch's mixed-chunk setting."""
        mixed = [self.mixed_of(s) for s, _ in runs]
        if not any(mixed) or all(mixed):
            return forward_tokens(b.new_token, b.replay_token, b.running_req, bool(mixed and mixed[0]))
        fwd = forward_tokens(b.new_token, b.replay_token, b.running_req, False)
        for (_, rows), m in zip(runs, mixed):
            if m:
                fwd[rows] += np.maximum(b.running_req[rows], 0)
        return fwd

    def histograms(self) -> list[dict]:
        segs, tokens, requests, counts = self.pairs.result()
        at = np.searchsorted(segs, np.arange(len(self.segments) + 1)).tolist()
        graph = self.graph.tolist()
        out = []
        for s in range(len(self.segments)):
            a, b = at[s], at[s + 1]
            gd = dict(zip(("replayed", "eager", "unflagged"), graph[s])) if self.has_batches[s] else {}
            out.append(
                {"tokens": tokens[a:b], "requests": requests[a:b], "counts": counts[a:b], "graph": gd,
                 "requests_known": not self.unknown_requests[s]}
            )  # fmt: skip
        return out


class _PairCounter:
    """Counts of (launch, tokens, requests) triples, added a block at a time and folded
    together once what waits is larger than what is folded (memory: about twice the
    distinct triples)."""

    def __init__(self) -> None:
        self.segs = np.empty(0, np.int64)
        self.keys = np.empty(0, np.int64)
        self.counts = np.empty(0, np.int64)
        self.waiting: list[tuple[np.ndarray, np.ndarray]] = []
        self.n_waiting = 0

    def add(self, segs: np.ndarray, tokens: np.ndarray, requests: np.ndarray) -> None:
        # one int64 key per pair: tokens below 2**32 and requests below 2**31 (int32 counts)
        key = (np.minimum(tokens, 2**32 - 1) << 31) | np.minimum(requests, 2**31 - 1)
        self.waiting.append((segs.astype(np.int64), key))
        self.n_waiting += len(tokens)
        if self.n_waiting > max(1 << 16, 2 * len(self.keys)):
            self._fold()

    def _fold(self) -> None:
        if not self.waiting:
            return
        segs = np.concatenate([self.segs, *(s for s, _ in self.waiting)])
        keys = np.concatenate([self.keys, *(k for _, k in self.waiting)])
        counts = np.concatenate([self.counts, np.ones(self.n_waiting, np.int64)])
        self.waiting, self.n_waiting = [], 0
        tokens, requests = keys >> 31, keys & (2**31 - 1)
        if len(segs) and segs.max() < 2**21 and tokens.max() < 2**21 and requests.max() < 2**21:  # one int64 per triple
            order = np.argsort((segs << 42) | (tokens << 21) | requests)
        else:
            order = np.lexsort((keys, segs))
        segs, keys, counts = segs[order], keys[order], counts[order]
        new = np.ones(len(keys), np.bool_)
        new[1:] = (segs[1:] != segs[:-1]) | (keys[1:] != keys[:-1])
        starts = np.flatnonzero(new)
        self.segs, self.keys, self.counts = segs[starts], keys[starts], np.add.reduceat(counts, starts)

    def result(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(launches, tokens, requests, counts), by launch then pair."""
        self._fold()
        return self.segs, self.keys >> 31, self.keys & (2**31 - 1), self.counts


def _launches_used(columns: dict[str, np.ndarray] | None, histograms: list[dict] | None) -> set[int]:
    if columns is not None:
        return set(distinct(columns["segment"]).tolist())
    return {i for i, h in enumerate(histograms or []) if h["counts"].size}


def _parse_file(
    path: str,
    source: int,
    progress: Callable[[int], None] | None = None,
    options: ParseOptions = DEFAULT_OPTIONS,
    want: Want = Want(),
) -> _FileResult:
    assumed = dict(want.assumed)
    sink: _FileSink = (
        _HistogramSink(want.mixed_chunk, assumed, want.first)
        if want.histogram_only
        else _ColumnSink(assumed, want.mixed_chunk, want.first)
    )
    (lines, decode, legacy_decode), src = _scan(path, source, sink, progress, options)
    sink.finish_unlogged()
    columns = sink.columns() if isinstance(sink, _ColumnSink) else None
    histograms = sink.histograms() if isinstance(sink, _HistogramSink) else None
    used: set[int] | None = None
    for i, seg in enumerate(sink.segments):
        # the settings of each launch as it is read: its server_args line, else the settings given for
        # logs that state none; --mixed-chunk where neither states enable_mixed_chunk (as mixed_of decides)
        seg["stated"] = seg["server_args"] is not None
        if seg["server_args"] is None:
            seg["server_args"] = dict(assumed)
            if assumed:
                if used is None:
                    used = _launches_used(columns, histograms)
                seg["assumed"] = i in used
        _mixed_fallback(seg, want.mixed_chunk)
    result = _FileResult(
        path=path, xxh128=src.digest.hexdigest(), nbytes=src.nbytes, lines=lines, decode_lines=decode,
        legacy_decode_lines=legacy_decode,
        columns=columns,
        ranks=sorted(sink.rank_index, key=sink.rank_index.__getitem__), graph_labels=sink.graph_labels,
        legacy=sink.legacy, wrapped=sink.wrapped, malformed=sink.malformed_count,
        malformed_samples=sink.malformed_samples, captures=sink.captures, capture_count=sink.capture_count,
        startup=sink.startup_list, startup_count=sink.startup_count, disabled=sink.disabled_list,
        disabled_count=sink.disabled_count, overlong=sink.overlong_count, overlong_samples=sink.overlong_samples,
        server_args=sink.server_args_list, server_args_count=sink.server_args_count,
        head_cut=sink.head_cut_count, head_cut_samples=sink.head_cut_samples,
        glued=sink.glued_count, glued_samples=sink.glued_samples,
        segments=sink.segments, records=sink.n_records, untagged=sink.untagged, histograms=histograms,
    )  # fmt: skip
    if want.first is not None:
        inherit_first(result, want.first, want.mixed_chunk)
    return result


def _mixed_fallback(seg: dict, mixed_chunk: bool) -> None:
    """--mixed-chunk for a launch whose settings do not state enable_mixed_chunk."""
    if not isinstance(seg["server_args"].get("enable_mixed_chunk"), bool) and mixed_chunk:
        seg["server_args"] = {**seg["server_args"], "enable_mixed_chunk": True}


class LaunchEnds(NamedTuple):
    """What the next piece of a rotated log needs of a parse: whether its first launch states
    no server_args (it continues the older piece's last launch), whether it has one launch
    only, and the launch it ends with (settings, startup line, the file that stated them)."""

    first_unstated: bool
    one_launch: bool
    last: dict | None  # None: the log states no launch it ends with


def launch_ends(r: _FileResult) -> LaunchEnds:
    seg = r.segments[-1]
    last = None
    if seg["stated"] or "inherited" in seg:
        last = {"server_args": dict(seg["server_args"]), "startup": seg["startup"], "from": seg.get("inherited", r.path)}
    return LaunchEnds(not r.segments[0]["stated"] and "inherited" not in r.segments[0], len(r.segments) == 1, last)


class Continuations:
    """The launch each rotated piece continues (adapters/sglang/log/rotation.py), known as
    the pieces are parsed, older first: a piece is parsed once the piece before it is, with
    Want.first the launch that one ended with, so its first lines (which state no launch)
    count their forward tokens by it and nothing is read twice."""

    def __init__(self, paths: list[str]) -> None:
        from bcgtune.adapters.sglang.log.rotation import previous_pieces

        self.prev = previous_pieces(paths)
        self.chained = any(p is not None for p in self.prev)
        self.after: dict[int, list[int]] = {}
        for i, p in enumerate(self.prev):
            if p is not None:
                self.after.setdefault(p, []).append(i)
        self.tails: dict[int, dict | None] = {}

    def ready(self) -> list[int]:
        """The pieces that wait for no other (the oldest of each log, and the logs not rotated)."""
        return [i for i, p in enumerate(self.prev) if p is None]

    def want(self, i: int, want: Want) -> Want:
        p = self.prev[i]
        first = self.tails.get(p) if p is not None else None
        return want._replace(first=first) if first is not None else want

    def done(self, i: int, last: dict | None) -> list[int]:
        """Piece i parsed, ending with launch `last` (launch_ends; None: it states none, or it
        failed): the pieces now ready."""
        self.tails[i] = last
        return self.after.get(i, [])


def parse_and_finish(path: str, progress, options: ParseOptions, want: Want, finish=None) -> tuple[dict | None, Any]:
    """(the launch the log ends with, the parse) of one log; `finish(path, result)` makes
    what is returned of the parse (a worker process runs it, so its cost is spread too)."""
    r = _parse_file(path, 0, progress, options, want)
    last = launch_ends(r).last
    return last, (r if finish is None else finish(path, r))


def first_counts_running(r: _FileResult) -> bool:
    return r.segments[0]["server_args"].get("enable_mixed_chunk") is True


def inherit_first(r: _FileResult, first: dict, mixed_chunk: bool) -> None:
    """A log whose first lines state no launch continues `first` (last_launch of its older
    piece): its first launch takes those settings (and startup, unless it logs its own), in
    place of settings given for logs that state none. Its forward tokens must have been
    counted by them (columns are counted later; a histogram is parsed again, `Want.first`)."""
    seg = r.segments[0]
    if seg["stated"]:
        return
    seg["server_args"] = dict(first["server_args"])
    _mixed_fallback(seg, mixed_chunk)
    if seg["startup"] is None:
        seg["startup"] = first["startup"]
    seg.pop("assumed", None)
    seg["inherited"] = first["from"]
