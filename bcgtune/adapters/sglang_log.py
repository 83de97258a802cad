"""Streaming parser of SGLang scheduler logs -> PrefillTrace.

SGLang prints one line per prefill batch (attn-TP rank 0 of each DP rank), e.g. (0.5.23,
python/sglang/srt/managers/scheduler_components/metrics_reporter.py, report_prefill_stats):

    [2026-08-27 03:46:54 TP0] Prefill batch, #new-seq: 9, #new-token: 8192, #cached-token: 0,
        token usage: 0.03, #running-req: 1, #queue-req: 0, #pending-token: 6993,
        cuda graph: True, input throughput (token/s): 413282.46

(one physical line in a real log). Over the versions the head changed (`Prefill batch.`,
`Prefill batch,`, `Prefill batch [iter],`, pre-2024 `new fill batch. #seq: n. #new_token: n.`),
fields were added, reordered and renamed, and users' copies carry wrappers (docker compose
`name | `, Docker Desktop timestamps, collector brackets, indentation, tqdm output glued in
front, CRLF, hand-wrapped records). So a record is found by its head and read as a bag of
`key: value` fields, never by position.

Bounded: the input is streamed in chunks of whole lines; a line longer than MAX_LINE_BYTES is
skipped and counted (quoted by its first few dozen characters only); a binary input (NUL
bytes in its first chunk) is refused; a record whose counts fall outside SGLang's int32
token counts is counted as malformed. Only per-batch numbers are kept, in compact columns
(a few dozen bytes per batch), and every list of samples is capped.

Speed: each chunk goes through a fast path (_Scanner._feed_fast) that finds prefill and
decode lines with numpy, looks each prefill line up by its layout (the line with its ASCII
digits masked), and reads the numbers of a known layout at fixed offsets, vectorised. A
layout's plan comes from the general per-record parser itself: _prefix_layout on the text
before "Prefill batch" (one plan per masked head) and _plan on the text after it (one plan
per tail shape: masked, each digit run collapsed, since _plan decides by where digits are,
not by how many), so both agree by construction (and tests/test_sglang_log.py compares
them on every log and on generated ones). Every line a plan does not fully cover (non-ASCII
text, a record that may continue on the next line, capture, startup and other rare lines)
goes through the general per-line parser (_Scanner._line), in line order. Several files
parse in worker processes (parse_logs(..., jobs=N)) into one merged trace identical to the
serial parse.
"""

from __future__ import annotations

import datetime as _dt
import gzip
import hashlib
import math
import multiprocessing
import os
import queue
import re
import signal
import sys
import threading
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from itertools import repeat
from operator import itemgetter
from typing import Any, NamedTuple, Self

import numpy as np

from bcgtune.core.trace import PrefillTrace
from bcgtune.errors import BcgError, ExternalError, InputError
from bcgtune.fileio import display_path as _display_path
from bcgtune.fileio import open_binary

# ---- limits (flat memory and bounded time whatever the input) ----------------------
MAX_MALFORMED_SAMPLES = 5
MAX_SAMPLE_CHARS = 300
MAX_QUOTE_CHARS = 80  # an overlong line or a read error is quoted by this much at most
MAX_CAPTURES = 4096
MAX_META_EVENTS = 256
MAX_CONTINUATION_LINES = 6
MAX_LINE_BYTES = 1 << 20  # a longer physical line is skipped (counted, never kept whole)
CHUNK_SIZE = 1 << 20  # bytes read at a time (at most MAX_LINE_BYTES); chunks hold whole lines
# SGLang counts tokens and requests in int32 (e.g. the extend lengths handed to the
# forward batch); a logged count above this is a corrupt record, not a batch.
INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1

# ---- byte-level markers -------------------------------------------------------------
_B_BATCH = b"batch"
_B_PREFILL = b"Prefill batch"
_B_LEGACY_PREFILL = b"new fill batch"
_B_DECODE = b"Decode batch"
_B_GRAPH = b"graph"
_B_CAPTURE = b"Capture "
_B_STARTUP = b"max_total_num_token"
_B_LEGACY_DECODE = b"gen throughput"

# ---- regexes (run on candidate lines only; each is linear in the line length) --------
_BRACKET_RE = re.compile(r"\[([^\[\]]*)\]")
_STAMP_RE = re.compile(r"^\s*(?:(\d{4})-(\d{2})-(\d{2})[ T])?(\d{1,2}):(\d{2}):(\d{2})(?:[.,](\d{1,6}))?(?=\s|$)\s*(.*)$")
_LOOSE_STAMP_RE = re.compile(r"(\d{4})-(\d{2})-(\d{2})[ T](\d{1,2}):(\d{2}):(\d{2})(?:[.,](\d{1,6}))?")
# Rank parts of SGLang's prefix (DP, PP, ATTN_CP, MOE_DP, TP, EP, ...) and the 2024 `gpu=0`.
_RANK_TOKEN_RE = re.compile(r"^(?:[A-Z][A-Z_]*\d+|gpu(?:_id)?=\d+)$")
_HEAD_TAIL_RE = re.compile(r"^\s*(?:\[\s*(\d+)\s*\])?\s*[.,:;]?")
_KEY_OK_RE = re.compile(r"^#?[A-Za-z][\w /()-]{0,60}$")
_LEGACY_SPLIT_RE = re.compile(r"\.\s+|,\s*")
# A hand-wrapped record continues on a line that starts with a field (`#running-req: 3,`,
# `full token usage: 0.4,`), possibly indented, never with a log prefix. (Possessive
# quantifiers: the same matches, without quadratic backtracking on a long line of spaces.)
_CONTINUATION_RE = re.compile(rb"^\s*+(?:#[A-Za-z][\w-]*+|[a-z][a-z ]*+(?:\([^)]*+\))?)\s*+:\s*\S")
_CAPTURE_NEW_RE = re.compile(
    r"Capture (target|draft) ([A-Za-z_][\w ]{0,80}?) (?:CUDA|cuda|NPU|npu|CPU|cpu) graph (begin|end)\b(.*)"
)
_CAPTURE_OLD_RE = re.compile(r"Capture (?:cuda|CUDA|npu|NPU|cpu|CPU) graph (begin|end|bs)\b(.*)")
_LIST_RE = re.compile(r"(num_tokens|bs)\s*+=?\s*\[([^\[\]]*)\](?:\s*\((\d+)\))?")
_BS_OLD_RE = re.compile(r"\[([^\[\]]*)\]")
_BACKEND_RE = re.compile(r"backend=([\w-]+)")
_AVAIL_RE = re.compile(r"avail[ _]mem\s*=\s*([\d.]+)\s*GB")
_MEM_USAGE_RE = re.compile(r"mem usage\s*=\s*([\d.]+)\s*GB")
_ELAPSED_RE = re.compile(r"(?:elapsed\s*=|Time elapsed:)\s*([\d.]+)\s*s")
_PER_REQ_RE = re.compile(r"num_tokens_per_req=(\d+)")
_KV_RE = re.compile(r"(\w{1,64})=([-\d.]+)(\s*GB)?")
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
_GRAPH_LABELS = ("cuda", "npu", "cpu")
_EPOCH_ORDINAL = _dt.date(1970, 1, 1).toordinal()


def _quote(text: str, limit: int = MAX_QUOTE_CHARS) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


# ---- the forward-token rule ---------------------------------------------------------
FORWARD_TOKENS_RULE = "new_token + replay_token"
FORWARD_TOKENS_RULE_MIXED = FORWARD_TOKENS_RULE + " + running_req (mixed chunk)"


def forward_tokens(new_token, replay_token, running_req, mixed_chunk: bool = False):
    """Tokens of a logged prefill batch's forward pass: #new-token, plus #replay-token when
    logged (SGLang counts both in its input throughput), plus one token per running decode
    request when the server mixes decode into prefill (--enable-mixed-chunk). Missing
    fields are -1 and count as 0. Works on ints and on numpy columns alike."""
    n = new_token + np.maximum(replay_token, 0)
    if mixed_chunk:
        n = n + np.maximum(running_req, 0)
    return n


# ---- records ------------------------------------------------------------------------
class PrefillValues(NamedTuple):
    """The numbers of one prefill record (missing integer fields are -1)."""

    new_seq: int
    new_token: int
    cached_token: int
    running_req: int
    queue_req: int
    replay_token: int
    graph: bool | None
    graph_label: str | None  # "cuda", "npu" or "cpu"
    timestamp: float
    rank: str | None
    forward_ct: int | None  # N of `Prefill batch [N],`
    legacy: bool  # pre-2024 `new fill batch` form


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
        """Tokens of the forward pass (see the module's `forward_tokens`)."""
        return int(forward_tokens(self.new_token, self.replay_token, self.running_req, mixed_chunk))


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
    overlong: list[dict] = field(default_factory=list)
    lines: int = 0
    sha256: str = ""
    bytes: int = 0


# ---- log prefixes: time and rank ----------------------------------------------------
class _PrefixLayout(NamedTuple):
    """Where the time and rank sit in the text before a log message: spans (start, end)
    of year, month, day, hour, minute, second, fraction (year-day and fraction may be
    None), or stamp=None; the span of the rank text, or None."""

    stamp: tuple | None
    rank: tuple[int, int] | None


def _prefix_layout(head: str) -> _PrefixLayout:
    """SGLang's own bracket is the last `[...]` that holds only a time and/or rank parts;
    brackets of other loggers (`[2025-07-02 11:36:23 handler.py:169 INFO]`) or tqdm
    (`[00:01<00:03, 1.1s/it]`) are skipped, though their time serves when SGLang's bracket
    carries none; without brackets, the first date-time in the text serves.

    The layout depends on the text only through which characters are ASCII digits, never
    on their values (the fast path relies on this to reuse one layout for many lines)."""
    fallback = None
    for bm in reversed(list(_BRACKET_RE.finditer(head))):
        base = bm.start(1)
        content = bm.group(1)
        m = _STAMP_RE.match(content)
        if m:
            stamp: tuple | None = tuple(None if m.start(g) < 0 else (base + m.start(g), base + m.end(g)) for g in range(1, 8))
            rest_start, rest_end = m.span(8)
        else:
            stamp, rest_start, rest_end = None, 0, len(content)
        tokens = content[rest_start:rest_end].split()
        if tokens and not all(_RANK_TOKEN_RE.match(t) for t in tokens):
            if m and fallback is None:
                fallback = stamp
            continue
        if m is None and not tokens:
            continue
        return _PrefixLayout(stamp, (base + rest_start, base + rest_end) if tokens else None)
    if fallback is not None:
        return _PrefixLayout(fallback, None)
    m = _LOOSE_STAMP_RE.search(head)
    if m:
        return _PrefixLayout(tuple(None if m.start(g) < 0 else m.span(g) for g in range(1, 8)), None)
    return _PrefixLayout(None, None)


def _prefix_values(layout: _PrefixLayout, head: str) -> tuple[float, str | None]:
    if layout.stamp is None:
        ts = float("nan")
    else:
        ts = _to_seconds(*(None if sp is None else head[sp[0] : sp[1]] for sp in layout.stamp))
    rank = None if layout.rank is None else " ".join(head[layout.rank[0] : layout.rank[1]].split())
    return ts, rank


_prefix_cache: dict[str, tuple[float, str | None]] = {}


def parse_prefix(head: str) -> tuple[float, str | None]:
    """Timestamp (seconds; since the epoch, or since midnight for time-only prefixes; NaN
    if none) and rank tag of the text before a log message (see _prefix_layout). Cached:
    lines of one second and rank share their head."""
    hit = _prefix_cache.get(head)
    if hit is None:
        if len(_prefix_cache) > 2048:
            _prefix_cache.clear()
        hit = _prefix_cache[head] = _prefix_values(_prefix_layout(head), head)
    return hit


_stamp_cache: dict[tuple, float] = {}


def _days_since_epoch(y, mo, d) -> int:
    """Days from 1970-01-01 to the date; 0 for an impossible date (2026-13-45)."""
    try:
        return _dt.date(int(y), int(mo), int(d)).toordinal() - _EPOCH_ORDINAL
    except ValueError:
        return 0


def _to_seconds(y, mo, d, h, mi, s, frac) -> float:
    key = (y, mo, d, h, mi, s)
    base = _stamp_cache.get(key)
    if base is None:
        if len(_stamp_cache) > 4096:
            _stamp_cache.clear()
        base = float(int(h) * 3600 + int(mi) * 60 + int(s))
        if y is not None:
            base += _days_since_epoch(y, mo, d) * 86400.0
        _stamp_cache[key] = base
    if frac:
        return base + int(frac) / (10 ** len(frac))
    return base


# ---- prefill records: the general per-record parser ---------------------------------
def parse_prefill_text(text: str, source: int = 0, line: int = 0) -> PrefillRecord | None:
    """Parse one logical prefill record (a physical line, or a hand-wrapped record joined
    with spaces). None when it holds the head but not a readable #new-seq and #new-token,
    or when a count lies outside SGLang's int32 token counts."""
    v = _prefill_values(text)
    if v is None:
        return None
    return _record(source, line, 1, v)


def _record(source: int, line: int, physical_lines: int, v: PrefillValues) -> PrefillRecord:
    return PrefillRecord(
        source, line, v.new_seq, v.new_token, v.cached_token, v.running_req, v.queue_req, v.replay_token,
        v.graph, v.graph_label, v.timestamp, v.rank, v.forward_ct, physical_lines, v.legacy,
    )  # fmt: skip


_MASK_DIGITS = bytes.maketrans(b"0123456789", b"0000000000")
_MASK_DIGITS_STR = str.maketrans("0123456789", "0000000000")
_MAX_PLAN_KEY = 2000  # longer tails are planned every time, not cached (flat memory)
_plan_cache: dict[tuple[bool, bytes], tuple | None] = {}


def _head_index(text: str) -> tuple[int, bool]:
    """(index just after the record's head, legacy form), or (-1, False)."""
    idx = text.find("Prefill batch")
    if idx >= 0:
        return idx, False
    idx = text.find("new fill batch")
    return idx, idx >= 0


def _prefill_values(text: str) -> PrefillValues | None:
    """The numbers of a record, or None for a malformed one.

    Speed: what the field parser decides (which `,`-part holds which field, the graph flag,
    malformed or not) depends only on the text after the head with its ASCII digits masked:
    digits are never separators, whitespace or key characters that a field name could
    match, and int() accepts or rejects a string whatever its digit values. So the
    decisions are computed once per layout (_plan) as character spans, and each record of
    a known layout costs a dict look-up and a few int() of slices."""
    idx, legacy = _head_index(text)
    if idx < 0:
        return None
    tail = text[idx + (14 if legacy else 13) :]
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
    counts = [-1 if sp is None else int(tail[sp[0] : sp[1]]) for sp in spans]
    for sp, n in zip(spans, counts):
        if sp is not None and not 0 <= n <= INT32_MAX:
            return None  # negative, or beyond int32: a corrupt record, not a batch
    forward_ct = None if ct is None else int(tail[ct[0] : ct[1]])
    if forward_ct is not None and forward_ct > INT64_MAX:
        return None
    ts, rank = parse_prefix(text[:idx])
    return PrefillValues(*counts, graph, graph_label, ts, rank, forward_ct, legacy)


# Field order of a plan's integer spans.
_PLAN_INTS = ("new_seq", "new_token", "cached_token", "running_req", "queue_req", "replay_token")
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
            name = _int_field_name(k[1:])
            if name is None or name in spans:
                continue
            span = _int_span(tail, v, vstart, end)
            if span is None:
                return None
            spans[name] = span
        elif graph_label is None:
            label = _GRAPH_FIELDS.get(k) or _GRAPH_FIELDS.get(k.lower())
            if label is None:
                continue
            graph = {"True": True, "False": False}.get(v.strip().rstrip(".;"))
            if graph is None:
                return None
            graph_label = label
    if "new_token" not in spans or "new_seq" not in spans:
        return None
    return tuple(spans.get(n) for n in _PLAN_INTS), graph, graph_label, ct


def _int_field_name(key: str) -> str | None:
    """The record field a `#key` holds (`#new-token`, `#new_token`, `#seq`, ...), or None."""
    name = _INT_FIELDS.get(key)
    return name if name is not None else _INT_FIELDS.get(key.lower().replace("_", "-"))


def _int_span(tail: str, v: str, vstart: int, end: int) -> tuple[int, int] | None:
    """Where an integer field's number stands in `tail`: the whole value, or its first word
    minus a trailing `.;` (`#new-token: 5 (x)`, `#seq: 3.`); None when it is no integer."""
    try:
        int(v)
        return (vstart, end)
    except ValueError:
        pass
    span = (vstart, end)
    if v.strip():
        lead = len(v) - len(v.lstrip())
        word = v.split(None, 1)[0].rstrip(".;")
        span = (vstart + lead, vstart + lead + len(word))
    try:
        int(tail[span[0] : span[1]])
    except ValueError:
        return None
    return span


# ---- capture, startup and disable lines ---------------------------------------------
def _count(text: str) -> int | None:
    """A non-negative count within SGLang's int32 token counts, or None."""
    try:
        n = int(text)
    except ValueError:  # not an integer, or more digits than int() reads
        return None
    return n if 0 <= n <= INT32_MAX else None


def _int32(text: str) -> int | None:
    """An integer within int32 (startup settings such as chunked_prefill_size=-1), or None."""
    try:
        n = int(text)
    except ValueError:
        return None
    return n if -INT32_MAX - 1 <= n <= INT32_MAX else None


def _finite(text: str) -> float | None:
    try:
        x = float(text)
    except ValueError:
        return None
    return x if math.isfinite(x) else None


def _parse_list(body: str) -> tuple[list[int], bool]:
    out: list[int] = []
    elided = False
    for tok in re.split(r"[,\s]+", body.strip()):
        if not tok:
            continue
        if tok in _ELLIPSIS or tok.strip(".…") == "":
            elided = True
            continue
        n = _count(tok)
        if n is None:
            elided = True  # unreadable or out of range: the list is not complete
        else:
            out.append(n)
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
        "timestamp": None if math.isnan(ts) else ts,
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
            cap["listed_count"] = _count(lm.group(3))
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
            cap[key] = _finite(fm.group(1).rstrip("."))
    pm = _PER_REQ_RE.search(rest)
    if pm:
        cap["num_tokens_per_req"] = _count(pm.group(1))
    return cap


def parse_startup_text(text: str, source: int = 0, line: int = 0) -> dict | None:
    """`max_total_num_tokens=..., chunked_prefill_size=..., ...` -> dict of its numbers
    (integers within int32, finite floats; others are left out)."""
    idx = text.find("max_total_num_token")
    if idx < 0:
        return None
    head = text[:idx].rstrip()
    if head and head[-1] not in "]|":
        # the startup line starts the message; `available_size=.., max_total_num_token=..`
        # inside a 2024 KV-leak warning does not
        return None
    _ts, rank = parse_prefix(head)
    out: dict[str, Any] = {"source": source, "line": line, "rank": rank}
    for key, val, gb in _KV_RE.findall(text[idx:]):
        if key == "max_total_num_token":
            key = "max_total_num_tokens"
        val = val.rstrip(".")
        num = _finite(val) if (gb or "." in val) else _int32(val)
        if num is not None:
            out[key + ("_gb" if gb else "")] = num
    if "max_total_num_tokens" not in out:
        return None
    return out


def _disable_text(text: str, source: int, line: int) -> dict | None:
    for marker in ("Disable prefill CUDA graph", "Disable prefill cuda graph", "CUDA graph is incompatible"):
        idx = text.find(marker)
        if idx >= 0:
            ts, rank = parse_prefix(text[:idx])
            start = text.rfind("]", 0, idx) + 1 if rank or not math.isnan(ts) else idx
            msg = text[start:].strip()
            return {"source": source, "line": line, "rank": rank, "text": msg[:MAX_SAMPLE_CHARS]}
    return None


# ---- record blocks: what the scanner hands its sink ---------------------------------
class _Block(NamedTuple):
    """Prefill records of one stretch of input, in line order, as equal-length columns
    (counts -1 when missing; graph 1/0/-1; label an index into _GRAPH_LABELS or -1; rank
    an index into rank_names or -1; forward_ct -1 when absent)."""

    line: np.ndarray
    physical_lines: np.ndarray
    new_seq: np.ndarray
    new_token: np.ndarray
    cached_token: np.ndarray
    running_req: np.ndarray
    queue_req: np.ndarray
    replay_token: np.ndarray
    graph: np.ndarray
    label: np.ndarray
    timestamp: np.ndarray
    rank: np.ndarray
    rank_names: list
    forward_ct: np.ndarray
    legacy: np.ndarray


_INT_COLS = ("new_seq", "new_token", "cached_token", "running_req", "queue_req", "replay_token")
_COLUMN_TYPES = {"graph": np.int8, "label": np.int8, "timestamp": np.float64, "rank": np.int32, "legacy": np.bool_}


def _block_of(records: list[tuple[int, int, PrefillValues]]) -> _Block:
    """A block from the general parser's (line, physical lines, values) records."""
    names: dict[str | None, int] = {None: -1}
    cols: dict[str, list] = {k: [] for k in _Block._fields if k != "rank_names"}
    for line, phys, v in records:
        cols["line"].append(line)
        cols["physical_lines"].append(phys)
        for k in _INT_COLS:
            cols[k].append(getattr(v, k))
        cols["graph"].append(-1 if v.graph is None else int(v.graph))
        cols["label"].append(-1 if v.graph_label is None else _GRAPH_LABELS.index(v.graph_label))
        cols["timestamp"].append(v.timestamp)
        cols["rank"].append(names.setdefault(v.rank, len(names) - 1))
        cols["forward_ct"].append(-1 if v.forward_ct is None else v.forward_ct)
        cols["legacy"].append(v.legacy)
    arrays = {k: np.array(x, dtype=_COLUMN_TYPES.get(k, np.int64)) for k, x in cols.items()}
    return _Block(rank_names=[n for n in names if n is not None], **arrays)


def _merge_blocks(a: _Block | None, b: _Block | None) -> _Block | None:
    """The records of both blocks, in line order."""
    if a is None or not len(a.line):
        return b
    if b is None or not len(b.line):
        return a
    shift = len(a.rank_names)
    cols = {}
    for k in _Block._fields:
        if k == "rank_names":
            continue
        x, y = getattr(a, k), getattr(b, k)
        if k == "rank":
            y = np.where(y >= 0, y + shift, -1).astype(np.int32)
        cols[k] = np.concatenate([x, y])
    order = np.argsort(cols["line"], kind="stable")
    return _Block(rank_names=a.rank_names + b.rank_names, **{k: v[order] for k, v in cols.items()})


# ---- the fast path: layouts of prefill lines -----------------------------------------
# Numbers read from a line of a known layout, at fixed offsets: the counts of _PLAN_INTS,
# the forward count, year, month, day, hour, minute, second, fraction of the time, and up
# to four digit runs of the rank (`DP3 TP3 EP3`).
_NF = 18
_F_CT = 6
_F_STAMP = 7
_F_RANK = 14
_MAX_RANK_RUNS = 4
_MAX_FIELD_DIGITS = np.array([10] * _F_CT + [18])  # longer: past int32 (int64), or zeros
_FAST, _MALFORMED, _GENERAL = 0, 1, 2
_MAX_FAST_PLANS = 1 << 15  # about 20 MiB at most (keys and table rows)
_DIGIT_RUN_RE = re.compile(r"[0-9]+")


def _head_layout(head: str) -> tuple | None:
    """(offsets, lengths, rank) of the time fields and rank digit runs of the text before
    "Prefill batch" (_prefix_layout), or None when its rank has too many or too long digit
    runs for the fast path. Decided by where digits are and how many (the time patterns
    count them): one result per digit-masked head."""
    layout = _prefix_layout(head)
    offsets, lengths = [0] * _NF, [0] * _NF
    for f, sp in enumerate(layout.stamp or ()):
        if sp is not None:
            offsets[_F_STAMP + f], lengths[_F_STAMP + f] = sp[0], sp[1] - sp[0]
    rank = None
    if layout.rank is not None:
        rtext = head[layout.rank[0] : layout.rank[1]]
        runs = [m.span() for m in _DIGIT_RUN_RE.finditer(rtext)]
        if len(runs) > _MAX_RANK_RUNS or any(e - s > 10 for s, e in runs):
            return None
        for f, (s, e) in enumerate(runs):
            offsets[_F_RANK + f], lengths[_F_RANK + f] = layout.rank[0] + s, e - s
        rank = (rtext.translate(_MASK_DIGITS_STR), tuple(runs))
    return offsets, lengths, rank


class _TailPlan(NamedTuple):
    kind: int  # _FAST, _MALFORMED or _GENERAL
    runs: tuple  # digit-run index of each count field and of the forward count, or -1
    graph: int
    label: int
    exact_only: bool  # the first key holds digits: its length matters (_KEY_OK_RE)


_NO_RUNS = (-1,) * (_F_CT + 1)


def _tail_plan(tail: str, runs: list[tuple[int, int]]) -> _TailPlan:
    """_plan of a record's text after "Prefill batch", each field read as the index of its
    digit run in `runs`. _plan decides by where digits are, not by how many (int() and the
    key test look at the other characters; no run here has more than 18 digits, so int()
    never refuses one for its length), except in the first key (_KEY_OK_RE counts its
    characters): so the result holds for every tail with the same digit-masked text once
    each run is collapsed to one digit, unless `exact_only`."""
    m = _HEAD_TAIL_RE.match(tail)
    first_key = tail[m.end() :].split(",", 1)[0].partition(":")[0]
    exact_only = _DIGIT_RUN_RE.search(first_key) is not None
    plan = _plan(tail, False)
    if plan is None:
        return _TailPlan(_MALFORMED, _NO_RUNS, -1, -1, exact_only)
    spans, graph, label, ct = plan
    run_at = {s: j for j, (s, _) in enumerate(runs)}
    index = []
    for sp in spans + (ct,):
        if sp is None:
            index.append(-1)
            continue
        value = tail[sp[0] : sp[1]]
        start = sp[0] + len(value) - len(value.lstrip())
        j = run_at.get(start, -1)
        if j < 0 or runs[j][1] != start + len(value.strip()):
            return _TailPlan(_GENERAL, _NO_RUNS, -1, -1, exact_only)  # `1_000`, `+5`: per line
        index.append(j)
    return _TailPlan(
        _FAST, tuple(index), -1 if graph is None else int(graph),
        -1 if label is None else _GRAPH_LABELS.index(label), exact_only,
    )  # fmt: skip


_GENERAL_TAIL = _TailPlan(_GENERAL, _NO_RUNS, -1, -1, False)


class _Runs:
    """The digit runs of several digit-masked texts (digits are b"0" there, and only
    they), found together with numpy: start and end of each run (offsets in its text),
    each text's first run and run count, and each text with its runs collapsed to one
    b"0" (its shape)."""

    def __init__(self, masked: list[bytes]):
        lens = np.fromiter(map(len, masked), np.int64, len(masked))
        base = np.cumsum(lens + 1) - (lens + 1)  # where each text starts once joined
        joined = b"\n".join(masked)
        buf = np.frombuffer(joined, np.uint8)
        digit = buf == 48
        before = np.concatenate(([False], digit[:-1]))
        after = np.concatenate((digit[1:], [False]))
        starts = np.flatnonzero(digit & ~before)
        ends = np.flatnonzero(digit & ~after) + 1
        self.first = np.searchsorted(starts, base)
        self.count = np.searchsorted(starts, base + lens) - self.first
        self.text = np.repeat(np.arange(len(masked)), self.count)  # of each run
        self.starts, self.ends = starts - base[self.text], ends - base[self.text]
        self.shapes = buf[~(digit & before)].tobytes().split(b"\n")

    def of(self, i: int) -> list[tuple[int, int]]:
        """The runs of text i."""
        a, b = self.first[i], self.first[i] + self.count[i]
        return list(zip(self.starts[a:b].tolist(), self.ends[a:b].tolist()))


class _Plans:
    """Layout plans of prefill lines, by digit-masked line, as rows of numpy tables grown
    in place: how the general parser reads every line of that layout, from the plan of its
    head (_head_layout, by the masked head) and of its tail (_tail_plan, by the masked
    tail's shape). Bounded: emptied (between chunks) past _MAX_FAST_PLANS layouts; plan 0
    means "per line"."""

    def __init__(self) -> None:
        self.lock = threading.Lock()  # one scanner at a time (threads share the plans)
        self.clear()

    def clear(self) -> None:
        self.index: dict[bytes, int] = {}
        self.head_ids: dict[bytes, int] = {}  # masked head -> row of the head table
        self.head_rows: list[tuple] = []  # (fast path can read it, offsets, lengths, rank template)
        self._head_arrays: tuple | None = None
        self.tails: dict[bytes, _TailPlan] = {}  # tail shape -> its plan
        self.templates: dict[tuple, int] = {}  # rank texts with masked digits, and runs
        self.template_list: list[tuple] = []
        self.rank_names: dict[tuple, str] = {}
        self.n = 1
        # kind, pending, has_decode, graph, label, rank template, offsets, lengths
        self._rows: list[np.ndarray] = [np.zeros(256, t) for t in (np.int8, np.bool_, np.bool_, np.int8, np.int8, np.int64)] + [
            np.zeros((256, _NF), np.int64),
            np.zeros((256, _NF), np.int64),
        ]
        self._rows[0][0] = _GENERAL
        self._rows[5][0] = -1

    def tables(self) -> list[np.ndarray]:
        """[kind, pending, has_decode, graph, label, rank template, offsets, lengths], one
        row per plan (views: fetch again after resolve)."""
        return [t[: self.n] for t in self._rows]

    def resolve(self, keys: list[bytes], lines: list[bytes], pids: list) -> None:
        """Fill the None entries of `pids` (plans of `keys`, the digit-masked `lines`),
        planning the new layouts together."""
        new: dict[bytes, int] = {}
        for j, pid in enumerate(pids):
            if pid is None:
                key = keys[j]
                if len(key) > _MAX_PLAN_KEY:
                    pids[j] = 0  # planned per line, not cached (flat memory)
                elif key not in new:
                    new[key] = j
        if new:
            rows = list(new.values())
            ids = self._plan([keys[j] for j in rows], [lines[j] for j in rows])
            self.index.update(zip(new, ids))
        for j, pid in enumerate(pids):
            if pid is None:
                pids[j] = self.index[keys[j]]

    def _plan(self, keys: list[bytes], lines: list[bytes]) -> range:
        """Plan new layouts (distinct masked lines `keys` of raw `lines`); returns their ids."""
        n = len(keys)
        at = np.fromiter(map(bytes.find, lines, repeat(_B_PREFILL)), np.int64, n)
        ok = np.fromiter(map(bytes.isascii, lines), np.bool_, n) & (at >= 0)  # else per line
        cut = np.maximum(at, 0)
        # heads: by masked head, into the head table
        masked_heads = list(map(bytes.__getitem__, keys, map(slice, cut.tolist())))
        head_ids = list(map(self.head_ids.get, masked_heads))
        for i in [i for i, h in enumerate(head_ids) if h is None]:
            head_ids[i] = self.head_ids.get(masked_heads[i])  # planned for an earlier line?
            if head_ids[i] is None:
                head_ids[i] = self._new_head(masked_heads[i], lines[i][: cut[i]])
        hid = np.array(head_ids, np.int64)
        h_ok, h_offsets, h_lengths, h_template = self._head_table()
        # tails, as _decode leaves them (the line's final b"\r" dropped): by shape
        tails = list(
            map(bytes.rstrip, map(bytes.__getitem__, keys, map(slice, (cut + 13).tolist(), repeat(None))), repeat(b"\r"))
        )
        runs = _Runs(tails)
        long = np.zeros(n, np.bool_)
        long[runs.text[runs.ends - runs.starts > 18]] = True
        plans = list(map(self.tails.get, runs.shapes))
        for i in np.flatnonzero(ok).tolist():
            if plans[i] is None:  # (or planned for an earlier line of this call)
                plans[i] = self.tails.get(runs.shapes[i])
            if plans[i] is None or plans[i].exact_only or long[i]:
                plans[i] = self._new_tail(lines[i][cut[i] + 13 :].rstrip(b"\r"), runs, i, store=not long[i])
        plans = [p if p is not None else _GENERAL_TAIL for p in plans]
        t_kind = np.fromiter(map(itemgetter(0), plans), np.int8, n)
        field_runs = np.array(list(map(itemgetter(1), plans)), np.int64).reshape(n, _F_CT + 1)
        kind = np.where(ok & h_ok[hid], t_kind, _GENERAL).astype(np.int8)
        fast = kind == _FAST
        # the count fields: offsets and lengths of their runs in each line
        has = (field_runs >= 0) & fast[:, None]
        g = np.where(has, runs.first[:, None] + field_runs, 0)
        start = runs.starts[g] if len(runs.starts) else np.zeros_like(g)
        length = np.where(has, runs.ends[g] - start, 0) if len(runs.starts) else np.zeros_like(g)
        kind[fast & (length > _MAX_FIELD_DIGITS).any(axis=1)] = _GENERAL
        fast = kind == _FAST
        offsets = np.where(fast[:, None], h_offsets[hid], 0)
        lengths = np.where(fast[:, None], h_lengths[hid], 0)
        offsets[:, : _F_CT + 1] = np.where(has, cut[:, None] + 13 + start, 0)
        lengths[:, : _F_CT + 1] = length
        graph = np.where(fast, np.fromiter(map(itemgetter(2), plans), np.int8, n), -1).astype(np.int8)
        label = np.where(fast, np.fromiter(map(itemgetter(3), plans), np.int8, n), -1).astype(np.int8)
        template = np.where(fast, h_template[hid], -1)
        pending = np.fromiter(map(bytes.endswith, map(bytes.rstrip, lines), repeat(b",")), np.bool_, n)
        has_decode = np.fromiter(map(bytes.__contains__, lines, repeat(_B_DECODE)), np.bool_, n)
        return self._append(kind, pending, has_decode, graph, label, template, offsets, lengths)

    def _new_head(self, masked: bytes, raw: bytes) -> int:
        """Plan a head (_head_layout) into the head table; returns its row."""
        layout = _head_layout(raw.decode("ascii")) if raw.isascii() else None
        row: tuple = (False, [0] * _NF, [0] * _NF, -1)
        if layout is not None:
            tid = -1
            if layout[2] is not None:
                tid = self.templates.setdefault(layout[2], len(self.template_list))
                if tid == len(self.template_list):
                    self.template_list.append(layout[2])
            row = (True, layout[0], layout[1], tid)
        self.head_rows.append(row)
        self._head_arrays = None
        self.head_ids[masked] = len(self.head_rows) - 1
        return len(self.head_rows) - 1

    def _head_table(self) -> tuple:
        """The head table as arrays: (fast path can read it, offsets, lengths, template)."""
        if self._head_arrays is None:
            ok, offsets, lengths, template = zip(*self.head_rows)
            self._head_arrays = (
                np.array(ok, np.bool_), np.array(offsets, np.int64).reshape(-1, _NF),
                np.array(lengths, np.int64).reshape(-1, _NF), np.array(template, np.int64),
            )  # fmt: skip
        return self._head_arrays

    def _new_tail(self, tail: bytes, runs: _Runs, i: int, store: bool) -> _TailPlan:
        """_tail_plan of text i of `runs`, kept by its shape if `store` and the shape
        decides it."""
        plan = _tail_plan(tail.decode("ascii"), runs.of(i))
        shape = runs.shapes[i]
        if store and not plan.exact_only and len(shape) <= _MAX_PLAN_KEY:
            self.tails[shape] = plan
        return plan

    def _append(self, *columns: np.ndarray) -> range:
        n0, n = self.n, self.n + len(columns[0])
        if n > len(self._rows[0]):
            size = max(2 * len(self._rows[0]), n)
            grown = [np.zeros((size,) + t.shape[1:], t.dtype) for t in self._rows]
            for new, old in zip(grown, self._rows):
                new[:n0] = old[:n0]
            self._rows = grown
        for table, column in zip(self._rows, columns):
            table[n0:n] = column
        self.n = n
        return range(n0, n)

    def rank_name(self, tid: int, runs: tuple) -> str:
        """The rank text of template `tid` with its digit runs set to `runs`."""
        key = (tid, runs)
        name = self.rank_names.get(key)
        if name is None:
            text, spans = self.template_list[tid]
            parts, prev = [], 0
            for (s, e), v in zip(spans, runs):
                parts += [text[prev:s], f"{v:0{e - s}d}"]  # the run's own digits, zeros kept
                prev = e
            name = self.rank_names[key] = " ".join(("".join(parts) + text[prev:]).split())
        return name


_PLANS = _Plans()
_FAST_PATH = True  # False: every line through the per-line parser (tests compare both)
_SMALL_PIECE = 16 << 10


class _ChunkLines:
    """The lines of a piece as offsets, without copies: line i is
    data[off + starts[i] : off + ends[i]] (ends[i] is its b"\\n", or the piece's end for
    an unterminated last line); `buf` holds the piece's bytes."""

    def __init__(self, piece: _Piece):
        self.data, self.off = piece.data, piece.start
        self.buf = np.frombuffer(piece.data, np.uint8, piece.stop - piece.start, piece.start)
        self.newlines = np.flatnonzero(self.buf == 10)
        self.ends = self.newlines if piece.data[piece.stop - 1] == 10 else np.append(self.newlines, len(self.buf))
        self.starts = np.concatenate(([0], self.ends[:-1] + 1))
        self.n = len(self.ends)

    def line(self, i: int) -> bytes:
        return self.data[self.off + self.starts[i] : self.off + self.ends[i]]

    def lines(self, ids: np.ndarray) -> list[bytes]:
        return self.spans(self.starts[ids], self.ends[ids])

    def spans(self, lo: np.ndarray, hi: np.ndarray) -> list[bytes]:
        """data of the piece's byte ranges [lo, hi)."""
        return list(map(self.data.__getitem__, map(slice, (lo + self.off).tolist(), (hi + self.off).tolist())))

    def batch_lines(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Indices of the lines holding "Prefill batch", "Decode batch" and "new fill
        batch": one numpy search for "batch", then the 8 bytes before each hit compared
        as one little-endian word."""
        pos = _find_all(self.buf, _BATCH_NEEDLE)
        pos = pos[pos >= 8]
        word = self.buf[pos[:, None] + _BEFORE_8].view("<u8").ravel()
        prefill = pos[word == _W_PREFILL]
        decode = pos[(word >> 8) == _W_DECODE]
        legacy = pos[word == _W_LEGACY]
        legacy = legacy[(legacy >= 9) & (self.buf[legacy - 9] == ord("n"))]
        return _line_ids(self.ends, prefill), _line_ids(self.ends, decode), _line_ids(self.ends, legacy)


_BATCH_NEEDLE = np.frombuffer(_B_BATCH, np.uint8)
_BEFORE_8 = np.arange(-8, 0)
_W_PREFILL = int.from_bytes(b"Prefill ", "little")  # the 8 bytes before "batch"
_W_DECODE = int.from_bytes(b"Decode ", "little")  # the last 7 of them
_W_LEGACY = int.from_bytes(b"ew fill ", "little")  # after an "n"


def _find_all(buf: np.ndarray, needle: np.ndarray) -> np.ndarray:
    """Start offsets of every occurrence of `needle` in `buf` (uint8 arrays)."""
    n = len(buf) - len(needle) + 1
    if n <= 0:
        return np.empty(0, np.int64)
    cand = np.flatnonzero(buf[:n] == needle[0])
    for k in range(1, len(needle)):
        if not cand.size:
            break
        cand = cand[buf[cand + k] == needle[k]]
    return cand


def _line_ids(ends: np.ndarray, pos: np.ndarray) -> np.ndarray:
    """Distinct indices of the lines holding the offsets `pos` (sorted); ends[i] is the
    offset of the b"\\n" ending line i."""
    ids = np.searchsorted(ends, pos)
    if ids.size > 1:
        ids = ids[np.concatenate(([True], ids[1:] != ids[:-1]))]
    return ids


def _read_digits(buf: np.ndarray, pos: np.ndarray, length: np.ndarray) -> np.ndarray:
    """Values of the ASCII digit runs buf[pos:pos+length] (-1 where length is 0); runs of
    one length are read together as a matrix of digits."""
    out = np.full(pos.shape, -1, np.int64)
    counts = np.bincount(length, minlength=1)
    counts[0] = 0  # absent fields
    for n in np.flatnonzero(counts).tolist():
        sel = np.flatnonzero(length == n)
        digits = buf[pos[sel][:, None] + _DIGIT_STEPS[:n]].astype(np.int64) - 48
        out[sel] = digits @ _POWERS[-n:]
    return out


_DIGIT_STEPS = np.arange(18)
_POWERS = 10 ** np.arange(17, -1, -1, dtype=np.int64)


def _rank_names(tid: np.ndarray, runs: np.ndarray) -> tuple[np.ndarray, list[str]]:
    """Rank of each row (an index into the returned names) from its rank template and
    the values of the template's digit runs (-1 past them)."""
    runs = np.maximum(runs, 0)  # a template has a fixed number of runs: 0 is unambiguous
    if (tid == tid[0]).all() and (runs == runs[0]).all():  # one rank (e.g. TP0 only)
        uniq_rows = [(int(tid[0]), tuple(runs[0].tolist()))]
        inv = np.zeros(len(tid), np.int64)
    elif runs.max(initial=0) < 4096 and tid.max() < 32768:  # one int64 key per row
        code = tid << 48
        for k in range(_MAX_RANK_RUNS):
            code |= runs[:, k] << (36 - 12 * k)
        uniq, inv = np.unique(code, return_inverse=True)
        uniq_rows = [(c >> 48, tuple((c >> (36 - 12 * k)) & 4095 for k in range(_MAX_RANK_RUNS))) for c in uniq.tolist()]
    else:
        uniq2, inv = np.unique(np.column_stack([tid, runs]), axis=0, return_inverse=True)
        uniq_rows = [(r[0], tuple(r[1:])) for r in uniq2.tolist()]
    names = [_PLANS.rank_name(t, r) for t, r in uniq_rows]
    return inv.ravel().astype(np.int32), names


_days_cache: dict[int, float] = {}


def _stamps(vals: np.ndarray, lens: np.ndarray) -> np.ndarray:
    """_to_seconds of the time fields read by the fast path (NaN where the line has no
    time), with the same float operations in the same order."""
    has = lens[:, _F_STAMP + 3] > 0  # an hour
    if not has.any():
        return np.full(len(vals), np.nan)
    every = has.all()
    v = vals if every else vals[has]
    n = lens if every else lens[has]
    t = (v[:, _F_STAMP + 3] * 3600 + v[:, _F_STAMP + 4] * 60 + v[:, _F_STAMP + 5]).astype(np.float64)
    dated = n[:, _F_STAMP] > 0
    if dated.any():
        codes = v[:, _F_STAMP] * 10000 + v[:, _F_STAMP + 1] * 100 + v[:, _F_STAMP + 2]
        if dated.all() and (codes == codes[0]).all():
            t += _days(int(codes[0])) * 86400.0
        else:
            uniq, inv = np.unique(codes[dated], return_inverse=True)
            t[dated] += np.array([_days(c) for c in uniq.tolist()])[inv.ravel()] * 86400.0
    frac = n[:, _F_STAMP + 6]
    with_frac = frac > 0
    if with_frac.any():
        t[with_frac] += v[with_frac, _F_STAMP + 6] / (10.0 ** frac[with_frac])
    if every:
        return t
    ts = np.full(len(vals), np.nan)
    ts[has] = t
    return ts


def _days(code: int) -> float:
    """_days_since_epoch of a yyyymmdd code, cached."""
    d = _days_cache.get(code)
    if d is None:
        if len(_days_cache) > 4096:
            _days_cache.clear()
        d = _days_cache[code] = float(_days_since_epoch(code // 10000, code // 100 % 100, code % 100))
    return d


# Lines without "Prefill batch", "Decode batch" or "new fill batch" that the per-line
# parser acts on hold one of these: capture and disable lines "graph", startup lines
# "max_total_num_token", pre-2024 decode lines "gen throughput".
_RARE_NEEDLES = (_B_GRAPH, _B_STARTUP, _B_LEGACY_DECODE)


def _decode(raw: bytes) -> str:
    return raw.decode("utf-8", "replace").rstrip("\r\n")


# ---- the scanner --------------------------------------------------------------------
class _Sink:
    """Receives what the scanner finds. parse_logs keeps compact columns; scan_log lists."""

    def records(self, source: int, block: _Block) -> None: ...
    def malformed(self, source: int, line: int, text: str) -> None: ...
    def capture(self, cap: dict) -> None: ...
    def startup(self, d: dict) -> None: ...
    def disabled(self, d: dict) -> None: ...
    def overlong(self, source: int, line: int, nbytes: int, head: str) -> None: ...


class _Scanner:
    """Walks a log chunk by chunk (each chunk holds whole lines), physical lines split on
    b"\\n" only. Results are those of a line-by-line walk through _line, whichever path
    a chunk takes."""

    def __init__(self, source: int, sink: _Sink):
        self.source = source
        self.sink = sink
        self.fast = _FAST_PATH
        self.lines = 0  # b"\n" seen in earlier chunks
        self.open_line = False  # the input so far ends inside a line (no final b"\n")
        self.decode = 0
        self.legacy_decode = 0
        self.pending: list[bytes] | None = None  # a prefill record that may continue
        self.pending_line = 0
        # per-line parser output of the current chunk, merged with the fast path's by line
        self._recs: list[tuple[int, int, PrefillValues]] = []
        self._bad: list[tuple[int, str]] = []

    def feed(self, piece: _Piece) -> None:
        """`piece` holds whole lines; only the input's last piece may lack the final b"\\n".
        A lone short line (one across two blocks) costs less through the per-line parser."""
        size = piece.stop - piece.start
        if self.fast and (size > _SMALL_PIECE or piece.data.count(b"\n", piece.start, piece.stop - 1)):
            self._feed_fast(piece)
        else:
            self._feed_lines(piece.data[piece.start : piece.stop])
            self._emit(None, [])

    def overlong(self, head: bytes, nbytes: int, ended: bool) -> None:
        """A line of `nbytes` bytes (more than MAX_LINE_BYTES) was skipped; `ended`: a b"\\n"
        closed it (else the input ended inside it)."""
        if self.pending is not None:
            self._flush()
        self._emit(None, [])
        self.sink.overlong(self.source, self.lines + 1, nbytes, _quote(_decode(head)))
        self.lines += ended
        self.open_line = not ended

    def finish(self) -> tuple[int, int, int]:
        """(physical lines, decode lines, legacy decode lines)."""
        if self.pending is not None:
            self._flush()
        self._emit(None, [])
        return self.lines + self.open_line, self.decode, self.legacy_decode

    # -- the fast path ---------------------------------------------------------------
    def _feed_fast(self, piece: _Piece) -> None:
        c = _ChunkLines(piece)
        prefill, decode, legacy = c.batch_lines()
        self.decode += len(decode)  # corrected for lines that are prefill records
        base = self.lines + 1  # line number of the chunk's first line
        per_line = legacy.tolist() + self._rare_lines(c, prefill, decode)
        if self.pending is not None:
            per_line.append(0)  # the first line may continue the previous chunk's record
        with _PLANS.lock:
            pid = self._plan_lines(c, prefill, per_line)
            seen = self._per_line(c, sorted(set(per_line)), base)
            fast = ~seen[prefill]
            rows, pid = prefill[fast], pid[fast]
            kind, _, has_decode = _PLANS.tables()[:3]
            self.decode -= int(np.count_nonzero(has_decode[pid]))
            ok = kind[pid] == _FAST
            block, bad = self._read_records(c, rows[ok], pid[ok], base)
        bad = np.sort(np.concatenate([bad, rows[~ok]])).tolist()
        self._emit(block, [(base + i, _decode(c.line(i))) for i in bad])
        self.lines += len(c.newlines)
        self.open_line = piece.data[piece.stop - 1] != 10

    def _rare_lines(self, c: _ChunkLines, prefill: np.ndarray, decode: np.ndarray) -> list[int]:
        """Indices of the chunk's lines, other than prefill and decode lines, that the
        per-line parser must see (those holding one of _RARE_NEEDLES)."""
        other = np.ones(c.n + 2, np.bool_)
        other[prefill + 1] = False
        other[decode + 1] = False
        other[0] = other[-1] = False
        edges = np.flatnonzero(other[1:] != other[:-1])
        if not len(edges):
            return []
        lo = c.starts[edges[0::2]]  # runs of other lines, as byte ranges
        hi = c.ends[edges[1::2] - 1]
        text = b"\n".join(c.spans(lo, hi))
        hits = [n for n in _RARE_NEEDLES if n in text]
        if not hits:
            return []
        sep = np.cumsum(hi - lo + 1) - 1  # offset in `text` of the b"\n" after each run
        found = set()
        for needle in hits:
            p = text.find(needle)
            while p >= 0:
                r = int(np.searchsorted(sep, p, "right"))
                at = int(lo[r] + p - (sep[r] - (hi[r] - lo[r])))  # offset in the chunk
                i = int(np.searchsorted(c.ends, at))
                found.add(i)
                p = text.find(needle, p + int(c.ends[i]) - at + 1)  # from the next line
        return sorted(found)

    def _plan_lines(self, c: _ChunkLines, prefill: np.ndarray, per_line: list[int]) -> np.ndarray:
        """Plan ids of the prefill lines; adds to `per_line` those the fast path cannot read
        (layouts read per line, records that may continue on the next line)."""
        if not len(prefill):
            return np.empty(0, np.int64)
        if len(_PLANS.index) > _MAX_FAST_PLANS:
            _PLANS.clear()
        pf = c.lines(prefill)
        keys = list(map(bytes.translate, pf, repeat(_MASK_DIGITS)))
        pids = list(map(_PLANS.index.get, keys))
        if None in pids:
            _PLANS.resolve(keys, pf, pids)
        pid = np.fromiter(pids, np.int64, len(pids))
        kind, pending = _PLANS.tables()[:2]
        pk = kind[pid]
        per_line += prefill[pk == _GENERAL].tolist()
        for j in np.flatnonzero(pending[pid] & (pk != _GENERAL)).tolist():
            i = int(prefill[j]) + 1
            if i >= c.n or (_B_BATCH not in c.line(i) and _CONTINUATION_RE.match(c.line(i))):
                per_line.append(i - 1)  # it may continue: only the per-line parser knows
        return pid

    def _per_line(self, c: _ChunkLines, ids: list[int], base: int) -> np.ndarray:
        """Run the per-line parser on lines `ids` (and on the lines after any that leaves
        a record open), in order. Returns which lines it saw."""
        seen = np.zeros(c.n, np.bool_)
        last = -1
        for i in ids:
            if i <= last:
                continue
            while True:
                self._line(c.line(i), base + i)
                seen[i] = True
                last = i
                i += 1
                if self.pending is None or i >= c.n:
                    break
        return seen

    def _read_records(self, c: _ChunkLines, rows, pid, base) -> tuple[_Block | None, np.ndarray]:
        """The records of prefill lines `rows` of fast layouts `pid`, read at the layouts'
        offsets; and the rows whose counts fall outside int32 (malformed)."""
        if not len(rows):
            return None, np.empty(0, np.int64)
        _, _, _, graph, label, template, offsets, lengths = _PLANS.tables()
        lens = lengths[pid]
        vals = _read_digits(c.buf, (offsets[pid] + c.starts[rows][:, None]).ravel(), lens.ravel()).reshape(lens.shape)
        good = ~(vals[:, : len(_INT_COLS)] > INT32_MAX).any(axis=1)
        bad = rows[~good]
        if not good.all():
            rows, pid, vals, lens = rows[good], pid[good], vals[good], lens[good]
        rank = np.full(len(rows), -1, np.int32)
        names: list[str] = []
        tid = template[pid]
        ranked = tid >= 0
        if ranked.any():
            rank[ranked], names = _rank_names(tid[ranked], vals[ranked, _F_RANK : _F_RANK + _MAX_RANK_RUNS])
        cols = {k: vals[:, f] for f, k in enumerate(_INT_COLS)}
        block = _Block(
            line=base + rows, physical_lines=np.ones(len(rows), np.int64), **cols,
            graph=graph[pid], label=label[pid], timestamp=_stamps(vals, lens), rank=rank, rank_names=names,
            forward_ct=vals[:, _F_CT], legacy=np.zeros(len(rows), np.bool_),
        )  # fmt: skip
        return block, bad

    def _emit(self, block: _Block | None, bad: list[tuple[int, str]]) -> None:
        """Hand the chunk's records and malformed lines (fast path and per-line parser
        merged by line) to the sink."""
        if self._recs:
            block = _merge_blocks(block, _block_of(self._recs))
            self._recs = []
        if block is not None and len(block.line):
            self.sink.records(self.source, block)
        if self._bad:
            bad = sorted(bad + self._bad)
            self._bad = []
        for line, text in bad:
            self.sink.malformed(self.source, line, text)

    # -- the per-line parser ---------------------------------------------------------
    def _feed_lines(self, chunk: bytes) -> None:
        """Every line of the chunk through _line (the reference the fast path equals)."""
        lines = chunk.split(b"\n")
        base = self.lines + 1
        for i in range(len(lines) - (not lines[-1])):
            raw = lines[i]
            if _B_DECODE in raw:
                self.decode += 1  # a prefill record is corrected in _line
            self._line(raw, base + i)
        self.lines += len(lines) - 1
        self.open_line = bool(lines[-1])

    def _line(self, raw: bytes, lineno: int) -> None:
        if self.pending is not None and self._continues(raw):
            return
        if _B_BATCH in raw:
            if _B_PREFILL in raw or _B_LEGACY_PREFILL in raw:
                if _B_DECODE in raw:
                    self.decode -= 1  # counted as a decode line, but a prefill record
                if raw.rstrip().endswith(b","):
                    self.pending = [raw]
                    self.pending_line = lineno
                    return
                self._prefill(_decode(raw), lineno, 1)
        elif _B_GRAPH in raw:
            self._graph_line(raw, lineno)
        elif _B_STARTUP in raw:
            d = parse_startup_text(_decode(raw), self.source, lineno)
            if d is not None:
                self.sink.startup(d)
        elif _B_LEGACY_DECODE in raw and b"#running-req" in raw:
            self.legacy_decode += 1

    def _continues(self, raw: bytes) -> bool:
        """A hand-wrapped record in progress: True when `raw` continues it (and is taken);
        else the record is complete and `raw` is a line of its own."""
        assert self.pending is not None
        if len(self.pending) < MAX_CONTINUATION_LINES and _B_BATCH not in raw and _CONTINUATION_RE.match(raw):
            self.pending.append(raw)
            if not raw.rstrip().endswith(b","):
                self._flush()
            return True
        self._flush()
        return False

    def _graph_line(self, raw: bytes, lineno: int) -> None:
        """A capture line, or a line saying prefill graphs are disabled."""
        if _B_CAPTURE in raw:
            cap = parse_capture_text(_decode(raw), self.source, lineno)
            if cap is not None:
                self.sink.capture(cap)
        elif b"isable" in raw or b"incompatible" in raw:
            d = _disable_text(_decode(raw), self.source, lineno)
            if d is not None:
                self.sink.disabled(d)

    def _flush(self) -> None:
        pending, self.pending = self.pending, None
        text = " ".join(_decode(p).strip() if i else _decode(p) for i, p in enumerate(pending))
        self._prefill(text, self.pending_line, len(pending))

    def _prefill(self, text: str, lineno: int, physical_lines: int) -> None:
        v = _prefill_values(text)
        if v is None:
            self._bad.append((lineno, text))
        else:
            self._recs.append((lineno, physical_lines, v))


# ---- reading ------------------------------------------------------------------------
class _Overlong(NamedTuple):
    head: bytes  # its first bytes (quoted by MAX_QUOTE_CHARS characters at most)
    nbytes: int
    ended: bool  # a b"\n" closed it (else the input ended inside it)


# What reading a broken input raises: I/O errors, gzip.BadGzipFile (an OSError), a
# truncated .gz (EOFError), corrupt deflate data (zlib.error), a closed stream (ValueError).
_READ_ERRORS = (OSError, EOFError, zlib.error, ValueError)


class _Source:
    """One input opened for reading (fileio.open_binary: `-` is stdin, `.gz` decompressed):
    its bytes are counted and hashed (sha256) as they are read, and every open or read
    error is a one-line InputError naming it."""

    def __init__(self, path: str):
        self.path = path
        self.where = _display_path(path)
        try:
            self.raw = open_binary(path)
        except _READ_ERRORS as exc:
            raise InputError(f"cannot read: {_quote(str(exc) or type(exc).__name__)}", self.where) from None
        self.sha256 = hashlib.sha256()
        self.nbytes = 0

    def read(self, size: int) -> bytes:
        try:
            block = self.raw.read(size)
        except _READ_ERRORS as exc:
            raise InputError(f"cannot read: {_quote(str(exc) or type(exc).__name__)}", self.where) from None
        self.sha256.update(block)
        self.nbytes += len(block)
        return block

    def position(self) -> int:
        """Bytes of the input consumed so far (of the compressed file for .gz)."""
        f = self.raw.fileobj if isinstance(self.raw, gzip.GzipFile) else self.raw
        try:
            return f.tell()
        except (OSError, ValueError, AttributeError):
            return self.nbytes

    def close(self) -> None:
        if self.path != "-":
            self.raw.close()


class _Piece(NamedTuple):
    """Whole lines: data[start:stop] (only the input's last piece may lack its b"\\n")."""

    data: bytes
    start: int
    stop: int


def _chunks(src: _Source, chunk_size: int) -> Iterator[_Piece | _Overlong]:
    """The input as pieces of whole lines, mostly the blocks read themselves (no copy),
    with an _Overlong in place of each line longer than MAX_LINE_BYTES. Memory: one block
    plus one line of at most MAX_LINE_BYTES. Refuses binary data (a NUL byte in the first
    block)."""
    size = max(1, min(chunk_size, MAX_LINE_BYTES))
    carry = b""  # a line not ended yet
    skip: list | None = None  # [head, bytes so far] of an overlong line being skipped
    first = True
    while True:
        block = src.read(size)
        if not block:
            break
        if first:
            first = False
            if b"\0" in block:
                raise InputError("binary data, not a text log (NUL bytes in its first chunk)", src.where)
        start = 0
        if skip is not None or carry:
            nl = block.find(b"\n")
            if nl < 0:
                if skip is not None:
                    skip[1] += len(block)
                else:
                    carry += block
                    if len(carry) > MAX_LINE_BYTES:
                        skip, carry = [carry[: 4 * MAX_QUOTE_CHARS], len(carry)], b""
                continue
            if skip is not None:
                yield _Overlong(skip[0], skip[1] + nl, True)
                skip = None
            elif len(carry) + nl > MAX_LINE_BYTES:
                yield _Overlong(carry[: 4 * MAX_QUOTE_CHARS], len(carry) + nl, True)
            else:
                line = carry + block[: nl + 1]  # the one line across two blocks
                yield _Piece(line, 0, len(line))
            carry, start = b"", nl + 1
        cut = block.rfind(b"\n", start) + 1
        if cut > start:
            yield _Piece(block, start, cut)
        else:
            cut = start
        carry = block[cut:]
    if skip is not None:
        yield _Overlong(skip[0], skip[1], False)
    elif carry:
        yield _Piece(carry, 0, len(carry))


# ---- what a log yields --------------------------------------------------------------
class _ListSink(_Sink):
    def __init__(self, result: ScanResult):
        self.r = result

    def records(self, source: int, b: _Block) -> None:
        names = b.rank_names
        for line, phys, s, t, c, run, q, rep, g, lab, ts, rk, ct, leg in zip(
            b.line.tolist(), b.physical_lines.tolist(), *(getattr(b, k).tolist() for k in _INT_COLS),
            b.graph.tolist(), b.label.tolist(), b.timestamp.tolist(), b.rank.tolist(), b.forward_ct.tolist(),
            b.legacy.tolist(),
        ):  # fmt: skip
            self.r.records.append(
                PrefillRecord(
                    source,
                    line,
                    s,
                    t,
                    c,
                    run,
                    q,
                    rep,
                    None if g < 0 else bool(g),
                    None if lab < 0 else _GRAPH_LABELS[lab],
                    ts,
                    None if rk < 0 else names[rk],
                    None if ct < 0 else ct,
                    phys,
                    leg,
                )
            )

    def malformed(self, source: int, line: int, text: str) -> None:
        self.r.malformed.append({"source": source, "line": line, "text": text.strip()[:MAX_SAMPLE_CHARS]})

    def capture(self, cap: dict) -> None:
        self.r.captures.append(cap)

    def startup(self, d: dict) -> None:
        self.r.startup.append(d)

    def disabled(self, d: dict) -> None:
        self.r.graph_disabled.append(d)

    def overlong(self, source: int, line: int, nbytes: int, head: str) -> None:
        self.r.overlong.append({"source": source, "line": line, "bytes": nbytes, "text": head})


def _scan(path: str, source: int, sink: _Sink, progress: Callable[[int], None] | None = None):
    """Feed one input through a scanner into `sink`. Returns ((physical lines, decode
    lines, legacy decode lines), the closed _Source)."""
    src = _Source(path)
    try:
        scanner = _Scanner(source, sink)
        for item in _chunks(src, CHUNK_SIZE):
            if type(item) is _Piece:
                scanner.feed(item)
            else:
                scanner.overlong(*item)
            if progress is not None:
                progress(src.position())
        return scanner.finish(), src
    finally:
        src.close()


def scan_log(path: str, source: int = 0) -> ScanResult:
    """Parse one log into plain lists (records, captures, ...). For tests and small logs."""
    res = ScanResult()
    (res.lines, res.decode_lines, res.legacy_decode_lines), src = _scan(path, source, _ListSink(res))
    res.sha256 = src.sha256.hexdigest()
    res.bytes = src.nbytes
    return res


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


def _parse_file(path: str, source: int, progress: Callable[[int], None] | None = None) -> _FileResult:
    sink = _ColumnSink()
    (lines, decode, legacy_decode), src = _scan(path, source, sink, progress)
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


# ---- several files: serial or in worker processes ------------------------------------
PARALLEL_MIN_BYTES = 32 << 20  # less input than this parses serially (workers cost more)
_MAX_JOBS_PER_CORE = 4


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _input_size(path: str) -> int | None:
    """Bytes of a regular file (compressed size for .gz); None for stdin and others."""
    if path == "-":
        return None
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return None
    return st.st_size if os.path.isfile(path) else None


class _Progress:
    """Bytes consumed per input, reported as (done, total) to the caller's callback."""

    def __init__(self, callback: Callable[[int, int | None], None] | None, sizes: list[int | None]):
        self.callback = callback
        self.sizes = sizes
        self.total = None if None in sizes else sum(sizes)  # type: ignore[arg-type]
        self.done = [0] * len(sizes)

    def update(self, i: int, position: int) -> None:
        self.done[i] = position
        if self.callback is not None:
            self.callback(sum(self.done), self.total)

    def finished(self, i: int) -> None:
        size = self.sizes[i]
        self.update(i, size if size is not None else self.done[i])


def _parse_files(paths: list[str], jobs: int | None, progress: _Progress) -> list[_FileResult]:
    if jobs is not None and (not isinstance(jobs, int) or jobs < 1):
        raise InputError(f"jobs must be a positive integer, got {_quote(repr(jobs))}", "jobs")
    files = [i for i, p in enumerate(paths) if p != "-"]
    n = min(jobs or _cores(), len(files), _MAX_JOBS_PER_CORE * _cores())
    big = sum(progress.sizes[i] or 0 for i in files) >= PARALLEL_MIN_BYTES
    if n < 2 or not big or multiprocessing.current_process().daemon:
        out = []
        for i, path in enumerate(paths):
            out.append(_parse_file(path, i, lambda pos, i=i: progress.update(i, pos)))
            progress.finished(i)
        return out
    return _parse_parallel(paths, files, n, progress)


def _worker(paths: list[str], order: list[int], taken, results, done) -> None:
    """A worker process: parse the next file of `order` not taken yet, until none is left;
    send (index, _FileResult or the parts of its InputError) on `results`."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    while True:
        with taken.get_lock():
            k = taken.value
            taken.value += 1
        if k >= len(order):
            return
        i = order[k]

        def report(pos: int, i: int = i) -> None:
            done[i] = pos

        try:
            out: Any = _parse_file(paths[i], i, report)
        except BcgError as exc:  # re-raised in the parent, with its file and line
            out = (type(exc), exc.what, exc.where)
        results.put((i, out))


def _start_method() -> str:
    # fork is fast and safe while this process runs one thread; otherwise start clean
    # interpreters (the workers import this module, nothing else of the caller's)
    if sys.platform.startswith("linux") and threading.active_count() == 1:
        return "fork"
    return "spawn"


class _Workers:
    """`jobs` processes parsing `files` (biggest first), started with Ctrl-C ignored. As a
    context manager it stops them all on the way out, whatever happened (no orphans)."""

    def __init__(self, paths: list[str], files: list[int], jobs: int, sizes: list[int | None]):
        ctx = multiprocessing.get_context(_start_method())
        order = sorted(files, key=lambda i: -(sizes[i] or 0))
        self.done = ctx.RawArray("q", len(paths))
        self.results = ctx.Queue()
        taken = ctx.Value("q", 0)
        self.procs = [
            ctx.Process(target=_worker, args=(paths, order, taken, self.results, self.done), daemon=True) for _ in range(jobs)
        ]
        main = threading.current_thread() is threading.main_thread()
        old = signal.signal(signal.SIGINT, signal.SIG_IGN) if main else None
        try:
            for proc in self.procs:
                proc.start()
        finally:
            if main:
                signal.signal(signal.SIGINT, old)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        for proc in self.procs:
            if proc.is_alive():
                proc.terminate()
        for proc in self.procs:
            proc.join(timeout=2)
            if proc.is_alive():
                proc.kill()
                proc.join()
        self.results.close()

    def next_result(self, timeout: float) -> tuple[int, Any] | None:
        """(index, result) of a finished file, or None after `timeout` seconds. Raises
        ExternalError when a worker died without sending its result."""
        try:
            return self.results.get(timeout=timeout)
        except queue.Empty:
            for proc in self.procs:
                if proc.exitcode not in (None, 0):
                    raise ExternalError(f"a log parsing process stopped (exit code {proc.exitcode})") from None
            if not any(proc.is_alive() for proc in self.procs) and self.results.empty():
                raise ExternalError("the log parsing processes stopped before their last result") from None
            return None


def _parse_parallel(paths: list[str], files: list[int], jobs: int, progress: _Progress) -> list[_FileResult]:
    """Files in `jobs` worker processes, stdin in this one; results in input order, and
    the first error in input order is raised (as a serial parse would). Ctrl-C reaches
    this process only: it stops the workers and raises KeyboardInterrupt."""
    results: list[Any] = [None] * len(paths)
    with _Workers(paths, files, jobs, progress.sizes) as workers:
        if "-" in paths:
            i = paths.index("-")
            try:
                results[i] = _parse_file("-", i, lambda pos: progress.update(i, pos))
            except BcgError as exc:
                results[i] = (type(exc), exc.what, exc.where)
            progress.finished(i)
        first = 0  # results[:first] are known and fine
        while first < len(paths):
            if results[first] is not None:
                if isinstance(results[first], tuple):
                    cls, what, where = results[first]
                    raise cls(what, where)
                first += 1
                continue
            got = workers.next_result(0.2)
            if got is None:
                for j in files:
                    progress.done[j] = max(progress.done[j], workers.done[j])
                progress.update(files[0], progress.done[files[0]])
            else:
                results[got[0]] = got[1]
                progress.finished(got[0])
    return results


# ---- the merged trace ---------------------------------------------------------------
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


def _first(results: list[_FileResult], attr: str, limit: int, paths: list[str] | None = None) -> list[dict]:
    out: list[dict] = []
    for r in results:
        for item in getattr(r, attr)[: limit - len(out)]:
            out.append(dict(item, path=_display_path(paths[item["source"]])) if paths else item)
    return out


def _no_records_error(paths: list[str], results: list[_FileResult]) -> InputError:
    where = ", ".join(_display_path(p) for p in paths)
    bad = sum(r.malformed for r in results)
    if bad:
        s = _first(results, "malformed_samples", 1)[0]
        return InputError(
            f"no readable prefill batch lines found ({bad} malformed, first at {_display_path(paths[s['source']])}:{s['line']})",
            where,
        )
    return InputError("no prefill batch lines found", where)


def _parse_stats(paths: list[str], results: list[_FileResult], n: int, zero: int) -> dict:
    per_source = [
        {
            "source": i,
            "path": _display_path(p),
            "lines": r.lines,
            "prefill_records": len(r.columns["line"]),
            "decode_lines": r.decode_lines,
            "legacy_decode_lines": r.legacy_decode_lines,
            "capture_lines": r.capture_count,
            "malformed_prefill_lines": r.malformed,
            "overlong_lines": r.overlong,
        }
        for i, (p, r) in enumerate(zip(paths, results))
    ]
    return {
        "lines": sum(r.lines for r in results),
        "prefill_records": n,
        "decode_lines": sum(r.decode_lines for r in results),
        "legacy_decode_lines": sum(r.legacy_decode_lines for r in results),
        "capture_lines": sum(r.capture_count for r in results),
        "startup_lines": sum(r.startup_count for r in results),
        "graph_disabled_lines": sum(r.disabled_count for r in results),
        "malformed_prefill_lines": sum(r.malformed for r in results),
        "malformed_samples": _first(results, "malformed_samples", MAX_MALFORMED_SAMPLES, paths),
        "legacy_prefill_records": sum(r.legacy for r in results),
        "wrapped_prefill_records": sum(r.wrapped for r in results),
        "zero_token_records": zero,
        "per_source": per_source,
        "overlong_lines": sum(r.overlong for r in results),
        "overlong_samples": _first(results, "overlong_samples", MAX_MALFORMED_SAMPLES, paths),
    }


def _build_trace(paths: list[str], results: list[_FileResult], mixed_chunk: bool) -> PrefillTrace:
    cols, ranks = _merge_columns(results)
    n = len(cols["new_token"])
    if n == 0:
        raise _no_records_error(paths, results)
    fwd = forward_tokens(cols["new_token"], cols["replay_token"], cols["running_req"], mixed_chunk)
    keep = fwd > 0
    zero = int(n - keep.sum())
    cols["forward_tokens"] = fwd
    if zero:
        cols = {k: v[keep] for k, v in cols.items()}
    labels: dict[str, int] = {}
    for r in results:
        for name, count in r.graph_labels.items():
            labels[name] = labels.get(name, 0) + count
    captures = _first(results, "captures", MAX_CAPTURES)
    meta = {
        "ranks": ranks,
        "mixed_chunk": bool(mixed_chunk),
        "forward_tokens_rule": FORWARD_TOKENS_RULE_MIXED if mixed_chunk else FORWARD_TOKENS_RULE,
        "graph_labels": labels,
        "startup": _first(results, "startup", MAX_META_EVENTS),
        "graph_disabled": _first(results, "disabled", MAX_META_EVENTS),
        "rank_overlap": rank_overlap(cols, len(ranks)),
    }
    dropped = sum(r.capture_count for r in results) - len(captures)
    if dropped:
        meta["captures_dropped"] = dropped
    sources = []
    for p, r in zip(paths, results):
        src: dict[str, Any] = {"path": _display_path(p), "sha256": r.sha256, "bytes": r.nbytes}
        if p.endswith(".gz"):
            src["decompressed"] = True
        sources.append(src)
    return PrefillTrace.from_batches(
        cols,
        origin="sglang-log",
        sources=sources,
        parse_stats=_parse_stats(paths, results, n, zero),
        captures=captures,
        meta=meta,
    )


def parse_logs(
    paths: list[str],
    mixed_chunk: bool = False,
    *,
    jobs: int | None = None,
    progress: Callable[[int, int | None], None] | None = None,
) -> PrefillTrace:
    """Parse SGLang server logs (several files = several ranks or replicas, concatenated in
    the given order; `.gz` and `-` for stdin work) into a PrefillTrace with per-batch
    columns, sources (sha256 of the bytes read, i.e. decompressed for .gz), parse
    statistics, capture lines and startup lines.

    jobs: worker processes for several files (default: the cores this process may use;
    at most one per file); the trace is identical to a serial parse. Inputs smaller than
    PARALLEL_MIN_BYTES in all parse serially. progress: called after each chunk with
    (bytes consumed so far, total bytes or None when unknown, e.g. stdin); compressed
    bytes for .gz.

    Raises InputError naming the file when a file cannot be read, is binary, or no input
    holds a prefill line; KeyboardInterrupt stops the workers and is raised here."""
    paths = list(paths)
    if not paths:
        raise InputError("no log file given", "--log")
    if paths.count("-") > 1:
        raise InputError("stdin ('-') can be read once only", "<stdin>")
    results = _parse_files(paths, jobs, _Progress(progress, [_input_size(p) for p in paths]))
    return _build_trace(paths, results, mixed_chunk)


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
