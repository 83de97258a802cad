"""Streaming parser of SGLang scheduler logs -> PrefillTrace.

SGLang prints one line per prefill batch (attn-TP rank 0 of each DP rank), e.g. (0.5.23):

    [2026-08-27 03:46:54 TP0] Prefill batch, #new-seq: 9, #new-token: 8192, #cached-token: 0,
        token usage: 0.03, #running-req: 1, #queue-req: 0, #pending-token: 6993,
        cuda graph: True, input throughput (token/s): 413282.46

(one physical line in a real log). Over the versions the head changed (`Prefill batch.`,
`Prefill batch,`, `Prefill batch [iter],`, pre-2024 `new fill batch. #seq: n. #new_token: n.`),
fields were added, reordered and renamed, and users' copies carry wrappers (docker compose
`name | `, Docker Desktop timestamps, collector brackets, indentation, tqdm output glued in
front, CRLF, hand-wrapped records). So a record is found by its head and read as a bag of
`key: value` fields, never by position.

Memory stays flat in the input size: lines are streamed, only per-batch numbers are kept, in
`array` columns (a few dozen bytes per batch), and every list of samples is capped.
Speed: every line first meets cheap `bytes in` tests; regexes only run on candidate lines.
"""

from __future__ import annotations

import datetime as _dt
import re
from array import array
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator

import numpy as np

from bcgtune.core.trace import PrefillTrace
from bcgtune.errors import InputError
from bcgtune.fileio import iter_byte_lines

# ---- limits (flat memory whatever the log) -----------------------------------------
MAX_MALFORMED_SAMPLES = 5
MAX_SAMPLE_CHARS = 300
MAX_CAPTURES = 4096
MAX_META_EVENTS = 256
MAX_CONTINUATION_LINES = 6

# ---- byte-level pre-filters ---------------------------------------------------------
_B_BATCH = b"batch"
_B_PREFILL = b"Prefill batch"
_B_LEGACY_PREFILL = b"new fill batch"
_B_DECODE = b"Decode batch"
_B_GRAPH = b"graph"
_B_CAPTURE = b"Capture "
_B_STARTUP = b"max_total_num_token"
_B_LEGACY_DECODE = b"gen throughput"

# ---- regexes (run on candidate lines only) ------------------------------------------
_BRACKET_RE = re.compile(r"\[([^\[\]]*)\]")
_STAMP_RE = re.compile(
    r"^\s*(?:(\d{4})-(\d{2})-(\d{2})[ T])?(\d{1,2}):(\d{2}):(\d{2})(?:[.,](\d{1,6}))?(?=\s|$)\s*(.*)$"
)
_LOOSE_STAMP_RE = re.compile(r"(\d{4})-(\d{2})-(\d{2})[ T](\d{1,2}):(\d{2}):(\d{2})(?:[.,](\d{1,6}))?")
# Rank parts of SGLang's prefix (DP, PP, ATTN_CP, MOE_DP, TP, EP, ...) and the 2024 `gpu=0`.
_RANK_TOKEN_RE = re.compile(r"^(?:[A-Z][A-Z_]*\d+|gpu(?:_id)?=\d+)$")
_HEAD_TAIL_RE = re.compile(r"^\s*(?:\[\s*(\d+)\s*\])?\s*[.,:;]?")
_KEY_OK_RE = re.compile(r"^#?[A-Za-z][\w /()-]{0,60}$")
_LEGACY_SPLIT_RE = re.compile(r"\.\s+|,\s*")
# A hand-wrapped record continues on a line that starts with a field (`#running-req: 3,`,
# `full token usage: 0.4,`), possibly indented, never with a log prefix.
_CONTINUATION_RE = re.compile(rb"^\s*(?:#[A-Za-z][\w-]*|[a-z][a-z ]*(?:\([^)]*\))?)\s*:\s*\S")
_CAPTURE_NEW_RE = re.compile(
    r"Capture (target|draft) ([A-Za-z_][\w ]*?) (?:CUDA|cuda|NPU|npu|CPU|cpu) graph (begin|end)\b(.*)"
)
_CAPTURE_OLD_RE = re.compile(r"Capture (?:cuda|CUDA|npu|NPU|cpu|CPU) graph (begin|end|bs)\b(.*)")
_LIST_RE = re.compile(r"(num_tokens|bs)\s*=?\s*\[([^\]]*)\](?:\s*\((\d+)\))?")
_BS_OLD_RE = re.compile(r"\[([^\]]*)\]")
_BACKEND_RE = re.compile(r"backend=([\w-]+)")
_AVAIL_RE = re.compile(r"avail[ _]mem\s*=\s*([\d.]+)\s*GB")
_MEM_USAGE_RE = re.compile(r"mem usage\s*=\s*([\d.]+)\s*GB")
_ELAPSED_RE = re.compile(r"(?:elapsed\s*=|Time elapsed:)\s*([\d.]+)\s*s")
_PER_REQ_RE = re.compile(r"num_tokens_per_req=(\d+)")
_KV_RE = re.compile(r"(\w+)=([-\d.]+)(\s*GB)?")
_ELLIPSIS = {"…", "...", "..", "⋯"}

_INT_FIELDS = {
    "new-seq": "new_seq",
    "seq": "new_seq",  # pre-2024 `new fill batch. #seq: n.`
    "new-token": "new_token",
    "cached-token": "cached_token",
    "running-req": "running_req",
    "queue-req": "queue_req",
    "remaining-req": "queue_req",  # pre-2024 name of the waiting queue after the batch
    "replay-token": "replay_token",
}
_GRAPH_FIELDS = {"cuda graph": "cuda", "npu graph": "npu", "cpu graph": "cpu"}
_EPOCH_ORDINAL = _dt.date(1970, 1, 1).toordinal()


# ---- records ------------------------------------------------------------------------
@dataclass(slots=True)
class PrefillRecord:
    """One prefill batch as logged. Missing integer fields are -1; `graph` is None when
    the record carries no `<device> graph:` flag."""

    source: int
    line: int  # 1-based physical line where the record starts
    new_seq: int
    new_token: int
    cached_token: int = -1
    running_req: int = -1
    queue_req: int = -1
    replay_token: int = -1
    graph: bool | None = None
    graph_label: str | None = None  # "cuda", "npu" or "cpu"
    timestamp: float = float("nan")
    rank: str | None = None
    forward_ct: int | None = None  # N of `Prefill batch [N],`
    physical_lines: int = 1
    legacy: bool = False  # pre-2024 `new fill batch` form

    def forward_tokens(self, mixed_chunk: bool = False) -> int:
        """Tokens of the forward pass: #new-token, plus #replay-token when logged, plus one
        token per running decode row when the server mixes decode into prefill."""
        n = self.new_token
        if self.replay_token > 0:
            n += self.replay_token
        if mixed_chunk and self.running_req > 0:
            n += self.running_req
        return n


@dataclass
class ScanResult:
    """Everything one log yields, as plain lists (for tests and small logs; parse_logs
    keeps compact columns instead)."""

    records: list[PrefillRecord] = field(default_factory=list)
    decode_lines: int = 0
    legacy_decode_lines: int = 0
    captures: list[dict] = field(default_factory=list)
    startup: list[dict] = field(default_factory=list)
    graph_disabled: list[dict] = field(default_factory=list)
    malformed: list[dict] = field(default_factory=list)
    lines: int = 0
    sha256: str = ""
    bytes: int = 0


# ---- line-level parsers (pure functions of one logical line) -----------------------
_prefix_cache: dict[str, tuple[float, str | None]] = {}


def parse_prefix(head: str) -> tuple[float, str | None]:
    """Cached front of _parse_prefix: lines of one second and rank share their head."""
    hit = _prefix_cache.get(head)
    if hit is None:
        if len(_prefix_cache) > 2048:
            _prefix_cache.clear()
        hit = _prefix_cache[head] = _parse_prefix(head)
    return hit


def _parse_prefix(head: str) -> tuple[float, str | None]:
    """Timestamp (seconds; since the epoch, or since midnight for time-only prefixes; NaN
    if none) and rank tag of the text before a log message. SGLang's own bracket is the
    last `[...]` that holds only a time and/or rank parts; brackets of other loggers
    (`[2025-07-02 11:36:23 handler.py:169 INFO]`) or tqdm (`[00:01<00:03, 1.1s/it]`) are
    skipped, though their time serves when SGLang's bracket carries none."""
    fallback_ts = float("nan")
    for content in reversed(_BRACKET_RE.findall(head)):
        m = _STAMP_RE.match(content)
        if m:
            rest = m.group(8)
            ts = _stamp_seconds(m)
        else:
            rest, ts = content, float("nan")
        tokens = rest.split()
        if tokens and not all(_RANK_TOKEN_RE.match(t) for t in tokens):
            if m and fallback_ts != fallback_ts:
                fallback_ts = ts
            continue
        if m is None and not tokens:
            continue
        return ts, (" ".join(tokens) if tokens else None)
    if fallback_ts == fallback_ts:
        return fallback_ts, None
    m = _LOOSE_STAMP_RE.search(head)
    if m:
        return _stamp_seconds_loose(m), None
    return float("nan"), None


_stamp_cache: dict[tuple, float] = {}


def _to_seconds(y, mo, d, h, mi, s, frac) -> float:
    key = (y, mo, d, h, mi, s)
    base = _stamp_cache.get(key)
    if base is None:
        if len(_stamp_cache) > 4096:
            _stamp_cache.clear()
        base = float(int(h) * 3600 + int(mi) * 60 + int(s))
        if y is not None:
            try:
                days = _dt.date(int(y), int(mo), int(d)).toordinal() - _EPOCH_ORDINAL
            except ValueError:
                days = 0
            base += days * 86400.0
        _stamp_cache[key] = base
    if frac:
        return base + int(frac) / (10 ** len(frac))
    return base


def _stamp_seconds(m: re.Match) -> float:
    return _to_seconds(m.group(1), m.group(2), m.group(3), m.group(4), m.group(5), m.group(6), m.group(7))


def _stamp_seconds_loose(m: re.Match) -> float:
    return _to_seconds(*m.groups())


def parse_prefill_text(text: str, source: int = 0, line: int = 0) -> PrefillRecord | None:
    """Parse one logical prefill record (a physical line, or a hand-wrapped record joined
    with spaces). None when it holds the head but not a readable #new-seq and #new-token."""
    idx = text.find("Prefill batch")
    legacy = False
    if idx < 0:
        idx = text.find("new fill batch")
        if idx < 0:
            return None
        legacy = True
        tail = text[idx + 14 :]
    else:
        tail = text[idx + 13 :]
    m = _HEAD_TAIL_RE.match(tail)
    forward_ct = int(m.group(1)) if m.group(1) else None
    tail = tail[m.end() :]
    # str.split/partition instead of a field regex: 3-4x faster on a 250-char line
    parts = _LEGACY_SPLIT_RE.split(tail) if legacy else tail.split(",")
    first = parts[0].partition(":")
    if not first[1] or not _KEY_OK_RE.match(first[0].strip()):
        # a real record's fields follow the head directly; prose that mentions
        # "Prefill batch" does not (it is then counted as malformed, not dropped)
        return None
    values: dict[str, int] = {}
    graph = None
    graph_label = None
    for part in parts:
        k, sep, v = part.partition(":")
        if not sep:
            continue
        k = k.strip()
        if k[:1] == "#":
            key = k[1:]
            name = _INT_FIELDS.get(key)
            if name is None:
                name = _INT_FIELDS.get(key.lower().replace("_", "-"))
                if name is None:
                    continue
            if name in values:
                continue
            try:
                values[name] = int(v)
            except ValueError:
                v = v.split(None, 1)[0].rstrip(".;") if v.strip() else v
                try:
                    values[name] = int(v)
                except ValueError:
                    return None
        elif graph_label is None:
            label = _GRAPH_FIELDS.get(k) or _GRAPH_FIELDS.get(k.lower())
            if label is None:
                continue
            v = v.strip().rstrip(".;")
            if v == "True":
                graph = True
            elif v == "False":
                graph = False
            else:
                return None
            graph_label = label
    if "new_token" not in values or "new_seq" not in values:
        return None
    if values["new_token"] < 0 or values["new_seq"] < 0:
        return None
    ts, rank = parse_prefix(text[:idx])
    return PrefillRecord(
        source=source,
        line=line,
        new_seq=values["new_seq"],
        new_token=values["new_token"],
        cached_token=values.get("cached_token", -1),
        running_req=values.get("running_req", -1),
        queue_req=values.get("queue_req", -1),
        replay_token=values.get("replay_token", -1),
        graph=graph,
        graph_label=graph_label,
        timestamp=ts,
        rank=rank,
        forward_ct=forward_ct,
        legacy=legacy,
    )


def _parse_list(body: str) -> tuple[list[int], bool]:
    out: list[int] = []
    elided = False
    for tok in re.split(r"[,\s]+", body.strip()):
        if not tok:
            continue
        if tok in _ELLIPSIS or tok.strip(".…") == "":
            elided = True
            continue
        try:
            out.append(int(tok))
        except ValueError:
            elided = True
    return out, elided


def parse_capture_text(text: str, source: int = 0, line: int = 0) -> dict | None:
    """A CUDA-graph capture log line -> dict, or None if it is not one (tqdm progress
    lines `Capturing ...` are not capture lines)."""
    m = _CAPTURE_NEW_RE.search(text)
    if m:
        phase, kind, event, rest = m.group(1), m.group(2).strip().lower(), m.group(3), m.group(4)
        label = f"{phase} {kind} {event}"
    else:
        m = _CAPTURE_OLD_RE.search(text)
        if not m:
            return None
        phase, kind, event, rest = "target", "legacy", m.group(1), m.group(2)
        label = f"cuda graph {event}"
    ts, rank = parse_prefix(text[: m.start()])
    cap: dict[str, Any] = {
        "source": source,
        "line": line,
        "rank": rank,
        "timestamp": None if ts != ts else ts,
        "phase": phase,
        "kind": kind,
        "event": event,
        "label": label,
        "backend": None,
        "buckets": None,
        "bucket_axis": None,
        "elided": False,
        "listed_count": None,
        "num_tokens_per_req": None,
        "elapsed_s": None,
        "mem_usage_gb": None,
        "avail_mem_gb": None,
    }
    b = _BACKEND_RE.search(rest)
    if b:
        cap["backend"] = b.group(1)
    lm = _LIST_RE.search(rest)
    if lm:
        cap["bucket_axis"] = lm.group(1)
        cap["buckets"], cap["elided"] = _parse_list(lm.group(2))
        if lm.group(3):
            cap["listed_count"] = int(lm.group(3))
            if cap["listed_count"] != len(cap["buckets"]):
                cap["elided"] = True
    elif event == "bs":
        om = _BS_OLD_RE.search(rest)
        if om:
            cap["bucket_axis"] = "bs"
            cap["buckets"], cap["elided"] = _parse_list(om.group(1))
    for key, rx in (("avail_mem_gb", _AVAIL_RE), ("mem_usage_gb", _MEM_USAGE_RE), ("elapsed_s", _ELAPSED_RE)):
        fm = rx.search(rest)
        if fm:
            try:
                cap[key] = float(fm.group(1).rstrip("."))
            except ValueError:
                pass
    pm = _PER_REQ_RE.search(rest)
    if pm:
        cap["num_tokens_per_req"] = int(pm.group(1))
    return cap


def parse_startup_text(text: str, source: int = 0, line: int = 0) -> dict | None:
    """`max_total_num_tokens=..., chunked_prefill_size=..., ...` -> dict of its numbers."""
    idx = text.find("max_total_num_token")
    if idx < 0:
        return None
    head = text[:idx].rstrip()
    if head and head[-1] not in "]|":
        # the startup line starts the message; `available_size=.., max_total_num_token=..`
        # inside a 2024 KV-leak warning does not
        return None
    ts, rank = parse_prefix(head)
    out: dict[str, Any] = {"source": source, "line": line, "rank": rank}
    for key, val, gb in _KV_RE.findall(text[idx:]):
        if key == "max_total_num_token":
            key = "max_total_num_tokens"
        val = val.rstrip(".")
        try:
            num: Any = float(val) if (gb or "." in val) else int(val)
        except ValueError:
            continue
        out[key + ("_gb" if gb else "")] = num
    if "max_total_num_tokens" not in out:
        return None
    return out


def _disable_text(text: str, source: int, line: int) -> dict | None:
    for marker in ("Disable prefill CUDA graph", "Disable prefill cuda graph", "CUDA graph is incompatible"):
        idx = text.find(marker)
        if idx >= 0:
            ts, rank = parse_prefix(text[:idx])
            start = text.rfind("]", 0, idx) + 1 if rank or ts == ts else idx
            msg = text[start:].strip()
            return {"source": source, "line": line, "rank": rank, "text": msg[:MAX_SAMPLE_CHARS]}
    return None


# ---- the scanner --------------------------------------------------------------------
class _Sink:
    """Receives what the scanner finds. parse_logs keeps compact columns; scan_log lists."""

    def prefill(self, rec: PrefillRecord) -> None: ...
    def malformed(self, source: int, line: int, text: str) -> None: ...
    def capture(self, cap: dict) -> None: ...
    def startup(self, d: dict) -> None: ...
    def disabled(self, d: dict) -> None: ...


def _decode(raw: bytes) -> str:
    return raw.decode("utf-8", "replace").rstrip("\r\n")


def _scan(lines: Iterable[bytes], source: int, sink: _Sink) -> tuple[int, int, int]:
    """Walk physical lines; returns (lines, decode lines, legacy decode lines)."""
    decode = legacy_decode = 0
    pending: list[bytes] | None = None  # a prefill record that may continue on the next line
    pending_line = 0
    lineno = 0

    def flush() -> None:
        text = " ".join(_decode(p).strip() if i else _decode(p) for i, p in enumerate(pending))
        rec = parse_prefill_text(text, source, pending_line)
        if rec is None:
            sink.malformed(source, pending_line, text)
        else:
            rec.physical_lines = len(pending)
            sink.prefill(rec)

    for lineno, raw in enumerate(lines, 1):
        if pending is not None:
            if (
                len(pending) < MAX_CONTINUATION_LINES
                and _B_BATCH not in raw
                and _CONTINUATION_RE.match(raw)
            ):
                pending.append(raw)
                if not raw.rstrip().endswith(b","):
                    flush()
                    pending = None
                continue
            flush()
            pending = None
        if _B_BATCH in raw:
            if _B_PREFILL in raw or _B_LEGACY_PREFILL in raw:
                if raw.rstrip().endswith(b","):
                    pending = [raw]
                    pending_line = lineno
                    continue
                text = _decode(raw)
                rec = parse_prefill_text(text, source, lineno)
                if rec is None:
                    sink.malformed(source, lineno, text)
                else:
                    sink.prefill(rec)
            elif _B_DECODE in raw:
                decode += 1
        elif _B_GRAPH in raw:
            if _B_CAPTURE in raw:
                cap = parse_capture_text(_decode(raw), source, lineno)
                if cap is not None:
                    sink.capture(cap)
            elif b"isable" in raw or b"incompatible" in raw:
                d = _disable_text(_decode(raw), source, lineno)
                if d is not None:
                    sink.disabled(d)
        elif _B_STARTUP in raw:
            d = parse_startup_text(_decode(raw), source, lineno)
            if d is not None:
                sink.startup(d)
        elif _B_LEGACY_DECODE in raw and b"#running-req" in raw:
            legacy_decode += 1
    if pending is not None:
        flush()
    return lineno, decode, legacy_decode


class _ListSink(_Sink):
    def __init__(self, result: ScanResult):
        self.r = result

    def prefill(self, rec):
        self.r.records.append(rec)

    def malformed(self, source, line, text):
        self.r.malformed.append({"source": source, "line": line, "text": text.strip()[:MAX_SAMPLE_CHARS]})

    def capture(self, cap):
        self.r.captures.append(cap)

    def startup(self, d):
        self.r.startup.append(d)

    def disabled(self, d):
        self.r.graph_disabled.append(d)


def scan_log(path: str, source: int = 0) -> ScanResult:
    """Parse one log into plain lists (records, captures, ...). For tests and small logs."""
    lines, reader = iter_byte_lines(path)
    res = ScanResult()
    res.lines, res.decode_lines, res.legacy_decode_lines = _scan(lines, source, _ListSink(res))
    res.sha256 = reader.sha256.hexdigest()
    res.bytes = reader.nbytes
    return res


def iter_prefill_records(path: str, source: int = 0) -> Iterator[PrefillRecord]:
    """The prefill records of one log, in order (other line kinds are skipped)."""
    yield from scan_log(path, source).records


# ---- compact accumulation for whole traces ------------------------------------------
class _ColumnSink(_Sink):
    def __init__(self) -> None:
        self.new_seq = array("q")
        self.new_token = array("q")
        self.cached_token = array("q")
        self.running_req = array("q")
        self.queue_req = array("q")
        self.replay_token = array("q")
        self.graph = array("b")
        self.source = array("i")
        self.line = array("q")
        self.timestamp = array("d")
        self.rank = array("i")
        self.rank_index: dict[str, int] = {}
        self.graph_labels: dict[str, int] = {}
        self.legacy = 0
        self.wrapped = 0
        self.malformed_count = 0
        self.malformed_samples: list[dict] = []
        self.captures: list[dict] = []
        self.captures_dropped = 0
        self.startup_list: list[dict] = []
        self.startup_count = 0
        self.disabled_list: list[dict] = []
        self.disabled_count = 0
        self.per_source_prefill: dict[int, int] = {}
        self.per_source_malformed: dict[int, int] = {}
        self.per_source_capture: dict[int, int] = {}

    def prefill(self, rec: PrefillRecord) -> None:
        self.new_seq.append(rec.new_seq)
        self.new_token.append(rec.new_token)
        self.cached_token.append(rec.cached_token)
        self.running_req.append(rec.running_req)
        self.queue_req.append(rec.queue_req)
        self.replay_token.append(rec.replay_token)
        self.graph.append(-1 if rec.graph is None else int(rec.graph))
        self.source.append(rec.source)
        self.line.append(rec.line)
        self.timestamp.append(rec.timestamp)
        if rec.rank is None:
            self.rank.append(-1)
        else:
            idx = self.rank_index.get(rec.rank)
            if idx is None:
                idx = self.rank_index[rec.rank] = len(self.rank_index)
            self.rank.append(idx)
        if rec.graph_label is not None:
            self.graph_labels[rec.graph_label] = self.graph_labels.get(rec.graph_label, 0) + 1
        if rec.legacy:
            self.legacy += 1
        if rec.physical_lines > 1:
            self.wrapped += 1
        self.per_source_prefill[rec.source] = self.per_source_prefill.get(rec.source, 0) + 1

    def malformed(self, source: int, line: int, text: str) -> None:
        self.malformed_count += 1
        self.per_source_malformed[source] = self.per_source_malformed.get(source, 0) + 1
        if len(self.malformed_samples) < MAX_MALFORMED_SAMPLES:
            self.malformed_samples.append({"source": source, "line": line, "text": text.strip()[:MAX_SAMPLE_CHARS]})

    def capture(self, cap: dict) -> None:
        self.per_source_capture[cap["source"]] = self.per_source_capture.get(cap["source"], 0) + 1
        if len(self.captures) < MAX_CAPTURES:
            self.captures.append(cap)
        else:
            self.captures_dropped += 1

    def startup(self, d: dict) -> None:
        self.startup_count += 1
        if len(self.startup_list) < MAX_META_EVENTS:
            self.startup_list.append(d)

    def disabled(self, d: dict) -> None:
        self.disabled_count += 1
        if len(self.disabled_list) < MAX_META_EVENTS:
            self.disabled_list.append(d)


def _display_path(path: str) -> str:
    return "<stdin>" if path == "-" else path


def parse_logs(paths: list[str], mixed_chunk: bool = False) -> PrefillTrace:
    """Parse SGLang server logs (several files = several ranks or replicas, concatenated in
    the given order; `.gz` and `-` for stdin work) into a PrefillTrace with per-batch
    columns, sources (sha256 of the bytes read, i.e. decompressed for .gz), parse
    statistics, capture lines and startup lines. Raises InputError naming the file when a
    file cannot be read, and when no input holds a prefill line."""
    if not paths:
        raise InputError("no log file given", "--log")
    sink = _ColumnSink()
    sources: list[dict] = []
    per_source: list[dict] = []
    total_lines = total_decode = total_legacy_decode = 0
    for i, path in enumerate(paths):
        lines, reader = iter_byte_lines(path)
        n_lines, n_decode, n_legacy_decode = _scan(lines, i, sink)
        total_lines += n_lines
        total_decode += n_decode
        total_legacy_decode += n_legacy_decode
        src = {"path": _display_path(path), "sha256": reader.sha256.hexdigest(), "bytes": reader.nbytes}
        if path.endswith(".gz"):
            src["decompressed"] = True
        sources.append(src)
        per_source.append(
            {
                "source": i,
                "path": _display_path(path),
                "lines": n_lines,
                "prefill_records": sink.per_source_prefill.get(i, 0),
                "decode_lines": n_decode,
                "legacy_decode_lines": n_legacy_decode,
                "capture_lines": sink.per_source_capture.get(i, 0),
                "malformed_prefill_lines": sink.per_source_malformed.get(i, 0),
            }
        )
    n = len(sink.new_token)
    if n == 0:
        where = ", ".join(_display_path(p) for p in paths)
        if sink.malformed_count:
            s = sink.malformed_samples[0]
            raise InputError(
                f"no readable prefill batch lines found ({sink.malformed_count} malformed, first at "
                f"{_display_path(paths[s['source']])}:{s['line']})",
                where,
            )
        raise InputError("no prefill batch lines found", where)

    cols = {
        "new_seq": np.frombuffer(sink.new_seq, dtype=np.int64),
        "new_token": np.frombuffer(sink.new_token, dtype=np.int64),
        "cached_token": np.frombuffer(sink.cached_token, dtype=np.int64),
        "running_req": np.frombuffer(sink.running_req, dtype=np.int64),
        "queue_req": np.frombuffer(sink.queue_req, dtype=np.int64),
        "replay_token": np.frombuffer(sink.replay_token, dtype=np.int64),
        "graph": np.frombuffer(sink.graph, dtype=np.int8),
        "source": np.frombuffer(sink.source, dtype=np.int32),
        "line": np.frombuffer(sink.line, dtype=np.int64),
        "timestamp": np.frombuffer(sink.timestamp, dtype=np.float64),
        "rank": np.frombuffer(sink.rank, dtype=np.int32),
    }
    fwd = cols["new_token"] + np.maximum(cols["replay_token"], 0)
    if mixed_chunk:
        fwd = fwd + np.maximum(cols["running_req"], 0)
    keep = fwd > 0
    zero = int(n - keep.sum())
    cols["forward_tokens"] = fwd
    if zero:
        cols = {k: v[keep] for k, v in cols.items()}
    ranks = sorted(sink.rank_index, key=sink.rank_index.get)
    for m in sink.malformed_samples:
        m["path"] = _display_path(paths[m["source"]])
    parse_stats = {
        "lines": total_lines,
        "prefill_records": n,
        "decode_lines": total_decode,
        "legacy_decode_lines": total_legacy_decode,
        "capture_lines": len(sink.captures) + sink.captures_dropped,
        "startup_lines": sink.startup_count,
        "graph_disabled_lines": sink.disabled_count,
        "malformed_prefill_lines": sink.malformed_count,
        "malformed_samples": sink.malformed_samples,
        "legacy_prefill_records": sink.legacy,
        "wrapped_prefill_records": sink.wrapped,
        "zero_token_records": zero,
        "per_source": per_source,
    }
    meta = {
        "ranks": ranks,
        "mixed_chunk": bool(mixed_chunk),
        "forward_tokens_rule": "new_token + replay_token" + (" + running_req (mixed chunk)" if mixed_chunk else ""),
        "graph_labels": sink.graph_labels,
        "startup": sink.startup_list,
        "graph_disabled": sink.disabled_list,
        "rank_overlap": rank_overlap(cols, len(ranks)),
    }
    if sink.captures_dropped:
        meta["captures_dropped"] = sink.captures_dropped
    trace = PrefillTrace.from_batches(
        cols,
        origin="sglang-log",
        sources=sources,
        parse_stats=parse_stats,
        captures=sink.captures,
        meta=meta,
    )
    return trace


def rank_overlap(cols: dict[str, np.ndarray], n_ranks: int) -> dict:
    """How many ranks (or files) print prefill lines, and how many records look like the
    same batch printed by several of them (same second, #new-seq, #new-token,
    #cached-token). Under DP attention each DP rank prints its own batch, so these are real
    distinct forwards; a match across ranks is only a hint that lines were duplicated."""
    who = cols["source"].astype(np.int64) * (1 << 20) + (cols["rank"].astype(np.int64) + 1)
    uniq_who = np.unique(who)
    out = {"printers": int(uniq_who.size), "records_matching_another_printer": 0}
    if uniq_who.size < 2 or not len(who):
        return out
    ts = cols["timestamp"]
    sec = np.where(np.isnan(ts), -1, np.floor(np.nan_to_num(ts, nan=-1.0))).astype(np.int64)
    keys = (who, cols["cached_token"], cols["new_token"], cols["new_seq"], sec)
    order = np.lexsort(keys)
    k = np.stack([a[order] for a in (sec, cols["new_seq"], cols["new_token"], cols["cached_token"])])
    w = who[order]
    new_group = np.ones(len(w), dtype=bool)
    new_group[1:] = (k[:, 1:] != k[:, :-1]).any(axis=0)
    gid = np.cumsum(new_group) - 1
    # a group spans several printers iff its first and last `who` differ (sorted by who last)
    first = np.zeros(gid[-1] + 1, dtype=np.int64)
    last = np.zeros(gid[-1] + 1, dtype=np.int64)
    first[gid[::-1]] = w[::-1]
    last[gid] = w
    multi = first != last
    out["records_matching_another_printer"] = int(multi[gid].sum())
    return out
