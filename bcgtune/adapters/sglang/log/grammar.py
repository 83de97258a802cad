"""The grammar of SGLang's log records: limits, markers, the forward-token rule, log prefixes
(time and rank), prefill records read as a bag of `key: value` fields, and capture,
startup and disable lines. Pure functions of text: the scanner calls them line by line,
and the fast path (fastpath.py) plans whole layouts with them, so both agree by
construction."""

from __future__ import annotations

import datetime as _dt
import math
import re
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from bcgtune.core.trace.groups import SETTING_KEYS
from bcgtune.core.trace.merge import CAPTURES_MAX, EVENTS_MAX, SAMPLES_MAX

# ---- limits (flat memory and bounded time whatever the input) ----------------------
MAX_MALFORMED_SAMPLES = SAMPLES_MAX  # samples of malformed, overlong, head-cut and glued lines
MAX_SAMPLE_CHARS = 300
MAX_QUOTE_CHARS = 80  # an overlong line or a read error is quoted by this much at most
MAX_CAPTURES = CAPTURES_MAX
MAX_META_EVENTS = EVENTS_MAX  # startup, server_args and graph-disabled lines kept
MAX_CONTINUATION_LINES = 6
MAX_LINE_BYTES = 1 << 20  # a longer physical line is skipped (counted, never kept whole)
CHUNK_SIZE = 4 << 20  # bytes read at a time; the pieces parsed hold whole lines
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
_B_SERVER_ARGS = b"server_args="
_B_NEW_SEQ = b"#new-seq"

# ---- regexes (run on candidate lines only; each is linear in the line length) --------
_BRACKET_RE = re.compile(r"\[([^\[\]]*)\]")
_STAMP_RE = re.compile(r"^\s*(?:(\d{4})-(\d{2})-(\d{2})[ T])?(\d{1,2}):(\d{2}):(\d{2})(?:[.,](\d{1,6}))?(?=\s|$)\s*(.*)$")
_LOOSE_STAMP_RE = re.compile(r"(\d{4})-(\d{2})-(\d{2})[ T](\d{1,2}):(\d{2}):(\d{2})(?:[.,](\d{1,6}))?")
# Rank parts of SGLang's prefix (DP, PP, ATTN_CP, MOE_DP, TP, EP, ...) and the 2024 `gpu=0`.
_RANK_TOKEN_RE = re.compile(r"^(?:[A-Z][A-Z_]*\d+|gpu(?:_id)?=\d+)$")
_HEAD_TAIL_RE = re.compile(r"^\s*(?:\[\s*(\d+)\s*\])?\s*[.,:;]?")
_KEY_OK_RE = re.compile(r"^#?[A-Za-z][\w /()-]{0,60}$")
_LEGACY_SPLIT_RE = re.compile(r"\.\s+|,\s*")
# SGLang's prefix whose `[` was lost (a line glued to other text, a cut copy): a time,
# rank parts and the closing `]`, as in `...01 00:00:01 DP1 TP1] Prefill batch`.
_OPEN_PREFIX_RE = re.compile(
    r"(?:(\d{4})-(\d{2})-(\d{2})[ T])?(\d{1,2}):(\d{2}):(\d{2})(?:[.,](\d{1,6}))?"
    r"((?:[ \t]++(?:[A-Z][A-Z_]*+\d++|gpu(?:_id)?+=\d++))++)[ \t]*+\]"
)
# A prefill record whose head was cut off: `batch. #new-seq: 1, #new-token: 32, ...`.
_HEAD_CUT_RE = re.compile(rb"batch(?:\s*+\[\s*+\d++\s*+\])?\s*+[.,:;]\s*+#new-seq\s*+:")
# A key and its value in SGLang's logged launch settings: `server_args=ServerArgs(tp_size=2,
# ...)` (before 0.5) or `server_args={'tp_size': 2, ...}` (0.5.x, ServerArgs.resolved_dict).
_SERVER_ARG_RE = re.compile(r"['\"]?\b([a-z][a-z0-9_]{0,63})['\"]?\s*+[=:]\s*+('[^']{0,400}'|\"[^\"]{0,400}\"|[-\w.]{1,40})")
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
    m = _last(_OPEN_PREFIX_RE, head)
    if m is not None:  # SGLang's prefix without its `[`: a glued or cut line keeps its rank
        return _PrefixLayout(tuple(None if m.start(g) < 0 else m.span(g) for g in range(1, 8)), m.span(8))
    if fallback is not None:
        return _PrefixLayout(fallback, None)
    m = _LOOSE_STAMP_RE.search(head)
    if m:
        return _PrefixLayout(tuple(None if m.start(g) < 0 else m.span(g) for g in range(1, 8)), None)
    return _PrefixLayout(None, None)


def _last(rx: re.Pattern, text: str) -> re.Match | None:
    """The last match of `rx` in `text` (matches do not overlap)."""
    last = None
    for last in rx.finditer(text):  # noqa: B007 (the loop keeps the last match)
        pass
    return last


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
    plan: tuple | None | bool = _plan_cache.get(key, False)
    if plan is False:
        plan = _plan(tail, legacy)
        if len(key[1]) <= _MAX_PLAN_KEY:
            if len(_plan_cache) > 4096:
                _plan_cache.clear()
            _plan_cache[key] = plan
    if plan is None or isinstance(plan, bool):
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
    s, t, c, run, q, rep = counts
    return PrefillValues(s, t, c, run, q, rep, graph, graph_label, ts, rank, forward_ct, legacy)


# Field order of a plan's integer spans.
_PLAN_INTS = ("new_seq", "new_token", "cached_token", "running_req", "queue_req", "replay_token")
_COMMA_RE = re.compile(",")


def _plan(tail: str, legacy: bool) -> tuple | None:
    """The field parser proper, on the text after the head. Returns None for a malformed
    record, else (spans of _PLAN_INTS fields in `tail` or None each, graph, graph_label,
    span of the `[N]` forward count or None): a bag of `key: value` fields, found by key,
    never by position."""
    m = _HEAD_TAIL_RE.match(tail)
    assert m is not None  # every part of the pattern is optional
    ct = m.span(1) if m.group(1) else None
    # parts split on `,` (`. ` or `,` in the pre-2024 form), as (start, end) spans
    parts = []
    prev = m.end()
    for cut in (_LEGACY_SPLIT_RE if legacy else _COMMA_RE).finditer(tail, prev):
        parts.append((prev, cut.start()))
        prev = cut.end()
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
    lines `Capturing ...` are not capture lines). What follows the log prefix is read once
    per distinct text (every rank prints the same capture lines)."""
    idx = text.find("Capture ")
    if idx < 0:
        return None
    hit = _cached(_capture_cache, text[idx:], _capture_body)
    if hit is None:
        return None
    at, fields = hit
    ts, rank = parse_prefix(text[: idx + at])
    cap: dict[str, Any] = {"source": source, "line": line, "rank": rank, "timestamp": None if math.isnan(ts) else ts}
    cap.update(fields)
    if cap["buckets"] is not None:
        cap["buckets"] = list(cap["buckets"])
    return cap


_capture_cache: dict[str, Any] = {}
_startup_cache: dict[str, Any] = {}
_server_args_cache: dict[str, Any] = {}
# at most 1,024 bodies of at most 16,384 characters each (16 MiB) per kind of line
_BODY_CACHE_MAX = 1024
_BODY_CACHE_CHARS = 16384
_MISS = object()


def _cached(cache: dict[str, Any], body: str, parse) -> Any:
    """parse(body), remembered for bodies seen before (bounded: cleared when full; a long
    body is parsed every time, never kept)."""
    if len(body) > _BODY_CACHE_CHARS:
        return parse(body)
    hit = cache.get(body, _MISS)
    if hit is _MISS:
        if len(cache) >= _BODY_CACHE_MAX:
            cache.clear()
        hit = cache[body] = parse(body)
    return hit


def _capture_body(text: str) -> tuple[int, dict[str, Any]] | None:
    """(where the message starts in `text`, its fields but source, line, rank and timestamp)."""
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
    cap: dict[str, Any] = {
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
    return m.start(), cap


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
    values = _cached(_startup_cache, text[idx:], _startup_body)
    if values is None:
        return None
    _ts, rank = parse_prefix(head)
    out: dict[str, Any] = {"source": source, "line": line, "rank": rank}
    out.update(values)
    return out


def _startup_body(text: str) -> dict[str, Any] | None:
    out: dict[str, Any] = {}
    for key, val, gb in _KV_RE.findall(text):
        if key == "max_total_num_token":
            key = "max_total_num_tokens"
        val = val.rstrip(".")
        num = _finite(val) if (gb or "." in val) else _int32(val)
        if num is not None:
            out[key + ("_gb" if gb else "")] = num
    return out if "max_total_num_tokens" in out else None


# The launch settings a log states, as SGLang's server flags name them (ServerArgs fields):
# what sets a server's prefill batches and what it captures, the settings that tell
# configurations apart (core.trace.groups). Values are the resolved ones (SGLang logs
# server_args after resolution: chunked_prefill_size is then the scheduler's, already
# divided by the attention-DP size).
LAUNCH_KEYS = SETTING_KEYS
_LAUNCH_KEY_SET = frozenset(LAUNCH_KEYS)


def _setting(value: str) -> Any:
    """A logged setting's value: a quoted string (at most MAX_SAMPLE_CHARS), True/False,
    an integer within int32; None for None and anything else."""
    if value[:1] in "'\"":
        return value[1:-1][:MAX_SAMPLE_CHARS]
    if value in ("True", "False"):
        return value == "True"
    return _int32(value)


def parse_server_args_text(text: str, source: int = 0, line: int = 0) -> dict | None:
    """SGLang's startup line `server_args=ServerArgs(...)` or `server_args={...}` -> the
    LAUNCH_KEYS it states (first value of each), with source, line and rank; None when it
    states none of them (srt/entrypoints/engine.py logs it once per launch)."""
    idx = text.find("server_args=")
    if idx < 0:
        return None
    body = text[idx + 12 :]
    if not (body.startswith("ServerArgs(") or body.startswith("{")):
        return None
    settings = _cached(_server_args_cache, body, _server_args_body)
    if settings is None:
        return None
    _ts, rank = parse_prefix(text[:idx])
    return {"source": source, "line": line, "rank": rank, "settings": dict(settings)}


def _server_args_body(body: str) -> dict[str, Any] | None:
    settings: dict[str, Any] = {}
    for key, value in _SERVER_ARG_RE.findall(body):
        if key in _LAUNCH_KEY_SET and key not in settings:
            settings[key] = _setting(value)
    return settings or None


def _disable_text(text: str, source: int, line: int) -> dict | None:
    for marker in ("Disable prefill CUDA graph", "Disable prefill cuda graph", "CUDA graph is incompatible"):
        idx = text.find(marker)
        if idx >= 0:
            ts, rank = parse_prefix(text[:idx])
            start = text.rfind("]", 0, idx) + 1 if rank or not math.isnan(ts) else idx
            msg = text[start:].strip()
            return {"source": source, "line": line, "rank": rank, "text": msg[:MAX_SAMPLE_CHARS]}
    return None
