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

Memory stays flat in the input size: the input is streamed in chunks of whole lines, only
per-batch numbers are kept, in `array` columns (a few dozen bytes per batch), and every list
of samples is capped.
Speed: C-speed searches over each chunk pick the lines that matter (see _Scanner); decode
lines are only counted; a prefill record's field layout is parsed once (see _prefill_values).
"""

from __future__ import annotations

import datetime as _dt
import gzip
import re
from array import array
from dataclasses import dataclass, field
from typing import Any, Iterator

import numpy as np

from bcgtune.core.trace import PrefillTrace
from bcgtune.errors import InputError
from bcgtune.fileio import HashingReader, open_binary

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
    v = _prefill_values(text)
    if v is None:
        return None
    return PrefillRecord(source, line, *v[:12], legacy=v[12])


# Field order of a plan's integer spans and of _prefill_values' tuple.
_PLAN_INTS = ("new_seq", "new_token", "cached_token", "running_req", "queue_req", "replay_token")
_MASK_DIGITS = bytes.maketrans(b"0123456789", b"0000000000")
_MAX_PLAN_KEY = 2000  # longer tails are planned every time, not cached (flat memory)
_plan_cache: dict[tuple[bool, bytes], tuple | None] = {}


def _prefill_values(text: str) -> tuple | None:
    """(new_seq, new_token, cached_token, running_req, queue_req, replay_token, graph,
    graph_label, timestamp, rank, forward_ct, physical_lines=1, legacy) of a record, or None.

    Speed: what the field parser decides (which `,`-part holds which field, the graph flag,
    malformed or not) depends only on the text after the head with its ASCII digits masked:
    digits are never separators, whitespace or key characters that a field name could
    match, and int() accepts or rejects a string whatever its digit values. So the
    decisions are computed once per layout (_plan) as character spans, and each record of
    a known layout costs a dict look-up and a few int() of slices."""
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
    # masked on the UTF-8 bytes (bytes.translate is ~50x faster than str.translate); the
    # encoding is one-to-one and ASCII digits are the only bytes 0x30-0x39 in it
    key = (legacy, tail.encode("utf-8", "surrogatepass").translate(_MASK_DIGITS))
    plan = _plan_cache.get(key, False)
    if plan is False:
        plan = _plan(tail, legacy)
        if len(key[1]) <= _MAX_PLAN_KEY:
            if len(_plan_cache) > 4096:
                _plan_cache.clear()
            _plan_cache[key] = plan
    if plan is None:
        return None
    spans, graph, graph_label, ct = plan
    new_seq, new_token, cached, running, queue, replay = [-1 if sp is None else int(tail[sp[0] : sp[1]]) for sp in spans]
    if new_token < 0 or new_seq < 0:
        return None
    ts, rank = parse_prefix(text[:idx])
    forward_ct = None if ct is None else int(tail[ct[0] : ct[1]])
    return (new_seq, new_token, cached, running, queue, replay, graph, graph_label, ts, rank, forward_ct, 1, legacy)


_COMMA_RE = re.compile(",")


def _plan(tail: str, legacy: bool) -> tuple | None:
    """The field parser proper, on the text after the head. Returns None for a malformed
    record, else (spans of _PLAN_INTS fields in `tail` or None each, graph, graph_label,
    span of the `[N]` forward count or None): a bag of `key: value` fields, found by key,
    never by position."""
    m = _HEAD_TAIL_RE.match(tail)
    ct = m.span(1) if m.group(1) else None
    # parts split on `,` (`. ` or `,` in the pre-2024 form), as (start, end) spans
    parts = []
    prev = m.end()
    for sep in (_LEGACY_SPLIT_RE if legacy else _COMMA_RE).finditer(tail, prev):
        parts.append((prev, sep.start()))
        prev = sep.end()
    parts.append((prev, len(tail)))
    first = tail[parts[0][0] : parts[0][1]].partition(":")
    if not first[1] or not _KEY_OK_RE.match(first[0].strip()):
        # a real record's fields follow the head directly; prose that mentions
        # "Prefill batch" does not (it is then counted as malformed, not dropped)
        return None
    spans: dict[str, tuple[int, int]] = {}
    graph = None
    graph_label = None
    for start, end in parts:
        k, sep, v = tail[start:end].partition(":")
        if not sep:
            continue
        vstart = start + len(k) + 1
        k = k.strip()
        if k[:1] == "#":
            key = k[1:]
            name = _INT_FIELDS.get(key)
            if name is None:
                name = _INT_FIELDS.get(key.lower().replace("_", "-"))
                if name is None:
                    continue
            if name in spans:
                continue
            span = (vstart, end)
            try:
                int(v)
            except ValueError:
                if v.strip():  # `#new-token: 5 (x)` / `#seq: 3.` -> first word, minus `.;`
                    lead = len(v) - len(v.lstrip())
                    word = v.split(None, 1)[0].rstrip(".;")
                    span = (vstart + lead, vstart + lead + len(word))
                try:
                    int(tail[span[0] : span[1]])
                except ValueError:
                    return None
            spans[name] = span
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
    if "new_token" not in spans or "new_seq" not in spans:
        return None
    return tuple(spans.get(n) for n in _PLAN_INTS), graph, graph_label, ct


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

    def prefill(self, source: int, line: int, physical_lines: int, v: tuple) -> None:
        """v: the tuple of _prefill_values."""
    def malformed(self, source: int, line: int, text: str) -> None: ...
    def capture(self, cap: dict) -> None: ...
    def startup(self, d: dict) -> None: ...
    def disabled(self, d: dict) -> None: ...


def _decode(raw: bytes) -> str:
    return raw.decode("utf-8", "replace").rstrip("\r\n")


CHUNK_SIZE = 8 << 20  # bytes read at a time; chunks are cut after their last "\n"

# Lines that may need a look of their own. A line holding none of these can only be a
# decode line (counted in bulk per chunk), a continuation of a hand-wrapped record (the
# line after a pending record is always looked at) or nothing. Matching more lines than
# needed is harmless: each found line goes through the same per-line dispatch.
_PREFILL_HIT_RE = re.compile(_B_PREFILL)
_RARE_HIT_RES = [
    re.compile(m) for m in (_B_LEGACY_PREFILL, _B_CAPTURE, b"isable", b"incompatible", _B_STARTUP)
]
_LEGACY_DECODE_HIT_RE = re.compile(_B_LEGACY_DECODE)
# One match per line holding "Decode batch"; group 1 says whether "gen throughput" follows.
_DECODE_LINE_RE = re.compile(rb"Decode batch(?:[^\n]*(gen throughput))?[^\n]*")


class _Scanner:
    """Walks a log chunk by chunk: Python only sees the lines that matter, found with
    C-speed searches over the chunk; physical line numbers come from counting b"\n"
    between them. Results are those of a line-by-line walk (lines split on b"\n" only)."""

    def __init__(self, source: int, sink: _Sink):
        self.source = source
        self.sink = sink
        self.lines = 0  # b"\n" seen in earlier chunks
        self.open_line = False  # the input so far ends inside a line (no final b"\n")
        self.decode = 0
        self.legacy_decode = 0
        self.pending: list[bytes] | None = None  # a prefill record that may continue
        self.pending_line = 0

    def feed(self, chunk: bytes) -> None:
        """`chunk` holds whole lines; only the input's last chunk may lack the final b"\n"."""
        found = _DECODE_LINE_RE.findall(chunk)
        # every line with "Decode batch" is a decode line, unless it is a prefill record
        # (corrected in _line); it never continues a wrapped record (that needs no "batch")
        self.decode += len(found)
        hits = [m.start() for m in _PREFILL_HIT_RE.finditer(chunk)]
        more = [rx for rx in _RARE_HIT_RES if rx.pattern in chunk]
        # a legacy decode line has "gen throughput" and no "batch"; when every occurrence
        # sits after "Decode batch" on its own line, this chunk has none
        if chunk.count(_B_LEGACY_DECODE) != len(found) - found.count(b""):
            more.append(_LEGACY_DECODE_HIT_RE)
        if more:
            for rx in more:
                hits.extend(m.start() for m in rx.finditer(chunk))
            hits.sort()
        n = len(chunk)
        pos = 0  # start of the first line not looked at yet
        lineno = self.lines + 1  # its 1-based number
        i = 0
        while True:
            if self.pending is not None and pos < n:
                start = pos  # the line right after a record that may continue there
            else:
                while i < len(hits) and hits[i] < pos:
                    i += 1  # several hits on one line, or inside a line already seen
                if i == len(hits):
                    break
                # rfind gives -1 when the hit's line starts at pos
                start = chunk.rfind(b"\n", pos, hits[i]) + 1 or pos
                lineno += chunk.count(b"\n", pos, start)
            end = chunk.find(b"\n", start)
            if end < 0:
                end = n
            self._line(chunk[start:end], lineno)
            pos = end + 1
            lineno += 1
        self.lines += chunk.count(b"\n")
        self.open_line = not chunk.endswith(b"\n")

    def finish(self) -> tuple[int, int, int]:
        """(physical lines, decode lines, legacy decode lines)."""
        if self.pending is not None:
            self._flush()
        return self.lines + self.open_line, self.decode, self.legacy_decode

    def _line(self, raw: bytes, lineno: int) -> None:
        if self.pending is not None:
            if (
                len(self.pending) < MAX_CONTINUATION_LINES
                and _B_BATCH not in raw
                and _CONTINUATION_RE.match(raw)
            ):
                self.pending.append(raw)
                if not raw.rstrip().endswith(b","):
                    self._flush()
                return
            self._flush()
        if _B_BATCH in raw:
            if _B_PREFILL in raw or _B_LEGACY_PREFILL in raw:
                if _B_DECODE in raw:
                    self.decode -= 1  # counted in bulk by feed(), but a prefill record
                if raw.rstrip().endswith(b","):
                    self.pending = [raw]
                    self.pending_line = lineno
                    return
                self._prefill(_decode(raw), lineno, 1)
        elif _B_GRAPH in raw:
            if _B_CAPTURE in raw:
                cap = parse_capture_text(_decode(raw), self.source, lineno)
                if cap is not None:
                    self.sink.capture(cap)
            elif b"isable" in raw or b"incompatible" in raw:
                d = _disable_text(_decode(raw), self.source, lineno)
                if d is not None:
                    self.sink.disabled(d)
        elif _B_STARTUP in raw:
            d = parse_startup_text(_decode(raw), self.source, lineno)
            if d is not None:
                self.sink.startup(d)
        elif _B_LEGACY_DECODE in raw and b"#running-req" in raw:
            self.legacy_decode += 1

    def _flush(self) -> None:
        pending, self.pending = self.pending, None
        text = " ".join(_decode(p).strip() if i else _decode(p) for i, p in enumerate(pending))
        self._prefill(text, self.pending_line, len(pending))

    def _prefill(self, text: str, lineno: int, physical_lines: int) -> None:
        v = _prefill_values(text)
        if v is None:
            self.sink.malformed(self.source, lineno, text)
        else:
            self.sink.prefill(self.source, lineno, physical_lines, v)


def _read_chunks(path: str, chunk_size: int) -> tuple[Iterator[bytes], HashingReader]:
    """The bytes of `path` in chunks of whole lines (a partial last line is carried over
    to the next read), and the reader that hashes them. Memory: one chunk plus one line."""
    reader = HashingReader(open_binary(path))

    def gen() -> Iterator[bytes]:
        carry: list[bytes] = []
        try:
            while True:
                try:
                    block = reader.read(chunk_size)
                except (OSError, EOFError, gzip.BadGzipFile) as exc:
                    raise InputError(f"cannot read: {exc}", path) from None
                if not block:
                    break
                cut = block.rfind(b"\n") + 1
                if cut == 0:
                    carry.append(block)  # no line end yet: keep reading the same line
                    continue
                yield b"".join(carry) + block[:cut] if carry else block[:cut]
                carry = [block[cut:]]
            rest = b"".join(carry)
            if rest:
                yield rest  # a last line without b"\n"
        finally:
            reader.close()

    return gen(), reader


def _scan_file(path: str, source: int, sink: _Sink) -> tuple[tuple[int, int, int], HashingReader]:
    chunks, reader = _read_chunks(path, CHUNK_SIZE)
    scanner = _Scanner(source, sink)
    for chunk in chunks:
        scanner.feed(chunk)
    return scanner.finish(), reader


class _ListSink(_Sink):
    def __init__(self, result: ScanResult):
        self.r = result

    def prefill(self, source, line, physical_lines, v):
        self.r.records.append(PrefillRecord(source, line, *v[:11], physical_lines, v[12]))

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
    res = ScanResult()
    (res.lines, res.decode_lines, res.legacy_decode_lines), reader = _scan_file(path, source, _ListSink(res))
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

    def prefill(self, source: int, line: int, physical_lines: int, v: tuple) -> None:
        new_seq, new_token, cached, running, queue, replay, graph, graph_label, ts, rank, _, _, legacy = v
        self.new_seq.append(new_seq)
        self.new_token.append(new_token)
        self.cached_token.append(cached)
        self.running_req.append(running)
        self.queue_req.append(queue)
        self.replay_token.append(replay)
        self.graph.append(-1 if graph is None else int(graph))
        self.source.append(source)
        self.line.append(line)
        self.timestamp.append(ts)
        if rank is None:
            self.rank.append(-1)
        else:
            idx = self.rank_index.get(rank)
            if idx is None:
                idx = self.rank_index[rank] = len(self.rank_index)
            self.rank.append(idx)
        if graph_label is not None:
            self.graph_labels[graph_label] = self.graph_labels.get(graph_label, 0) + 1
        if legacy:
            self.legacy += 1
        if physical_lines > 1:
            self.wrapped += 1
        self.per_source_prefill[source] = self.per_source_prefill.get(source, 0) + 1

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
        (n_lines, n_decode, n_legacy_decode), reader = _scan_file(path, i, sink)
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
