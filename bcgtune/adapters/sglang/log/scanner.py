"""Streaming input and the scanner: an input opened (a file, `.gz`, `-` for stdin), read in
bounded blocks cut at line ends (overlong lines skipped, binary input refused), and walked
line by line (the per-line parser) or chunk by chunk (the fast path), handing records and
events to a sink. scan_log lists everything one log yields."""

from __future__ import annotations

import gzip
import re
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from itertools import repeat
from typing import Any, NamedTuple

import numpy as np

from bcgtune.adapters.sglang.log.fastpath import (
    _F_CT,
    _F_RANK,
    _F_STAMP,
    _FAST,
    _GENERAL,
    _INT_COLS,
    _MAX_FAST_PLANS,
    _MAX_RANK_RUNS,
    _N_STAMP,
    _NF,
    _PLANS,
    _RARE_NEEDLES,
    LineTable,
    _BatchLines,
    _Block,
    _block_of,
    _ChunkLines,
    _decode,
    _merge_blocks,
    _Piece,
    _rank_names,
    _read_digits,
    _stamps,
    read_fields,
)
from bcgtune.adapters.sglang.log.grammar import (
    _B_BATCH,
    _B_CAPTURE,
    _B_DECODE,
    _B_GRAPH,
    _B_LEGACY_DECODE,
    _B_LEGACY_PREFILL,
    _B_NEW_SEQ,
    _B_PREFILL,
    _B_SERVER_ARGS,
    _B_STARTUP,
    _CONTINUATION_RE,
    _GRAPH_LABELS,
    _HEAD_CUT_RE,
    _MASK_DIGITS,
    _MAX_PLAN_KEY,
    INT32_MAX,
    MAX_CONTINUATION_LINES,
    MAX_LINE_BYTES,
    MAX_QUOTE_CHARS,
    MAX_SAMPLE_CHARS,
    PrefillRecord,
    PrefillValues,
    _cached,
    _disable_text,
    _prefill_values,
    _quote,
    parse_capture_text,
    parse_server_args_text,
    parse_startup_text,
)
from bcgtune.adapters.sglang.log.options import DEFAULT_OPTIONS, ParseOptions
from bcgtune.adapters.sglang.log.remote import RemoteFile, is_url
from bcgtune.core.stats import distinct
from bcgtune.errors import InputError
from bcgtune.fileio import display_path as _display_path
from bcgtune.fileio import log_digest, open_binary


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
    server_args: list[dict] = field(default_factory=list)
    head_cut: list[dict] = field(default_factory=list)
    glued: list[dict] = field(default_factory=list)
    lines: int = 0
    xxh128: str = ""  # XXH3-128 of the bytes read, as `xxh128sum` prints it
    bytes: int = 0


# ---- the scanner --------------------------------------------------------------------
class _Sink:
    """Receives what the scanner finds. parse_logs keeps compact columns; scan_log lists."""

    wants_timestamps = True  # False: the fast path's records may carry NaN for their time

    def records(self, source: int, block: _Block) -> None: ...
    def malformed(self, source: int, line: int, text: str) -> None: ...
    def capture(self, cap: dict) -> None: ...
    def startup(self, d: dict) -> None: ...
    def disabled(self, d: dict) -> None: ...
    def overlong(self, source: int, line: int, nbytes: int, head: str) -> None: ...
    def server_args(self, d: dict) -> None: ...
    def head_cut(self, source: int, line: int, text: str) -> None: ...
    def glued(self, source: int, line: int, text: str) -> None: ...

    def events(self, kind: str, templates: list, which: np.ndarray, lines: np.ndarray) -> None:
        """The calls `kind(*templates[w])` for w in `which`, each at its line of `lines`
        (in line order): the same event of many lines of one text, handed at once. A sink
        may count them in bulk; by default each is one call. Events of one kind reach a
        sink in line order, and a launch's server_args line before the startup lines after
        it; events of other kinds may come in another order between them."""
        method = getattr(self, kind)
        for w, line in zip(which.tolist(), lines.tolist()):
            method(*_at_line(templates[w], line))


_LINE_MARK = -(2**62) + 17  # the line number a rare text is parsed at once, then replaced
_EVENT_KINDS = ("server_args", "capture", "startup", "disabled", "head_cut")  # server_args first: it starts launches


class _Args(tuple):
    """An event's arguments recorded at _LINE_MARK, with where _at_line puts the line and
    what it copies: `marks`, the positions of _LINE_MARK; `dicts`, each dict argument's
    position, whether it has a "line" key, and its keys holding a list or a dict."""

    marks: tuple[int, ...]
    dicts: tuple[tuple[int, bool, tuple[str, ...]], ...]

    @classmethod
    def of(cls, args: tuple) -> _Args:
        out = cls(args)
        out.marks = tuple(i for i, a in enumerate(args) if type(a) is not dict and a == _LINE_MARK)
        out.dicts = tuple(
            (i, "line" in a, tuple(k for k, v in a.items() if type(v) in (dict, list)))
            for i, a in enumerate(args) if type(a) is dict
        )  # fmt: skip
        return out


def _at_line(args: tuple, line: int) -> tuple:
    """The event arguments recorded at _LINE_MARK, at `line`; the dicts, and the lists and
    dicts in them, copied (each event owns its own, as the per-line parser makes them)."""
    if not isinstance(args, _Args):
        args = _Args.of(args)
    out = list(args)
    for i in args.marks:
        out[i] = line
    for i, has_line, copied in args.dicts:
        d = out[i] = args[i].copy()
        if has_line:
            d["line"] = line
        for k in copied:
            d[k] = d[k].copy()
    return tuple(out)


class _InLineOrder(_Sink):
    """The sink while the per-line parser reads a chunk's lines: an event of a kind that
    rare lines are batched as (_EVENT_KINDS) comes after the batched rare lines before it
    (_Scanner._emit_rare). Other calls go straight on (records and malformed lines are
    handed on later, merged by line; head-cut and glued lines are counted apart)."""

    def __init__(self, scanner: _Scanner, sink: _Sink) -> None:
        self.scanner, self.sink = scanner, sink

    def records(self, source: int, block: _Block) -> None:
        self.sink.records(source, block)

    def malformed(self, source: int, line: int, text: str) -> None:
        self.sink.malformed(source, line, text)

    def overlong(self, source: int, line: int, nbytes: int, head: str) -> None:
        self.sink.overlong(source, line, nbytes, head)

    def glued(self, source: int, line: int, text: str) -> None:
        self.sink.glued(source, line, text)

    def events(self, kind: str, templates: list, which: np.ndarray, lines: np.ndarray) -> None:
        self.sink.events(kind, templates, which, lines)

    def capture(self, cap: dict) -> None:
        self.scanner._emit_rare(cap["line"])
        self.sink.capture(cap)

    def startup(self, d: dict) -> None:
        self.scanner._emit_rare(d["line"])
        self.sink.startup(d)

    def disabled(self, d: dict) -> None:
        self.scanner._emit_rare(d["line"])
        self.sink.disabled(d)

    def server_args(self, d: dict) -> None:
        self.scanner._emit_rare(d["line"])
        self.sink.server_args(d)

    def head_cut(self, source: int, line: int, text: str) -> None:
        self.scanner._emit_rare(line)
        self.sink.head_cut(source, line, text)


class _Recorder(_Sink):
    """The sink calls of one line (the per-line parser run on a rare line's text once)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple]] = []
        self.other = False  # a call no rare line of one text can repeat (records, ...)

    def records(self, source, block) -> None:
        self.other = True

    def malformed(self, source, line, text) -> None:
        self.other = True

    def overlong(self, source, line, nbytes, head) -> None:
        self.other = True

    def glued(self, source, line, text) -> None:
        self.other = True

    def capture(self, cap: dict) -> None:
        self.calls.append(("capture", (cap,)))

    def startup(self, d: dict) -> None:
        self.calls.append(("startup", (d,)))

    def disabled(self, d: dict) -> None:
        self.calls.append(("disabled", (d,)))

    def server_args(self, d: dict) -> None:
        self.calls.append(("server_args", (d,)))

    def head_cut(self, source: int, line: int, text: str) -> None:
        self.calls.append(("head_cut", (source, line, text)))


class _Scanner:
    """Walks a log chunk by chunk (each chunk holds whole lines), physical lines split on
    b"\\n" only. Results are those of a line-by-line walk through _line, whichever path
    a chunk takes."""

    def __init__(self, source: int, sink: _Sink, options: ParseOptions = DEFAULT_OPTIONS):
        self.source = source
        self.sink = sink
        self.fast = options.fast_path
        self.small_piece = options.small_piece
        self.lines = 0  # b"\n" seen in earlier chunks
        self.open_line = False  # the input so far ends inside a line (no final b"\n")
        self.decode = 0
        self.legacy_decode = 0
        self.pending: list[bytes] | None = None  # a prefill record that may continue
        self.pending_line = 0
        # per-line parser output of the current chunk, merged with the fast path's by line
        self._recs: list[tuple[int, int, PrefillValues]] = []
        self._bad: list[tuple[int, str]] = []
        self._values_cache: dict[str, PrefillValues | None] = {}
        # the compiled line scanner, and what its text ids stand for (grown as ids come)
        self.table = LineTable() if self.fast and options.compiled and LineTable is not None else None
        self._batched: tuple | None = None  # (lines, text ids, lines read per line, base, position) of a chunk
        self._forget_texts()

    def _forget_texts(self) -> None:
        if self.table is not None:
            self.table.clear()
        self._plans_generation = _PLANS.generation
        self._key_pid = np.empty(0, np.int64)  # plan of a layout id; _UNKNOWN: not looked up
        self._rare_kind = np.empty(0, np.int8)  # a rare text's one event (index in _EVENT_KINDS), _NO_EVENT, _PER_LINE, _UNKNOWN
        self._rare_legacy = np.empty(0, np.int64)  # pre-2024 decode lines it counts (0 or 1)
        self._rare_args: list = []  # its event's arguments, at _LINE_MARK

    def feed(self, piece: _Piece) -> None:
        """`piece` holds whole lines; only the input's last piece may lack the final b"\\n".
        A lone short line (one across two blocks) costs less through the per-line parser."""
        size = piece.stop - piece.start
        if self.fast and (size > self.small_piece or piece.data.count(b"\n", piece.start, piece.stop - 1)):
            self._feed_fast(piece)
        else:
            self._feed_lines(piece.data[piece.start : piece.stop])
            self._emit(None, [])

    def overlong(self, head: bytes, nbytes: int, ended: bool) -> None:
        """A line of `nbytes` bytes (more than the line limit) was skipped; `ended`: a b"\\n"
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
        keys = rare = None
        if self.table is not None:
            c, heads, keys, rare = self._scan_compiled(piece)
        else:
            c = _ChunkLines(piece)
            heads = _with_old_records(c.batch_lines())
        prefill, decode = heads.prefill, heads.decode
        self.decode += len(decode)  # corrected for lines that are prefill records
        base = self.lines + 1  # line number of the chunk's first line
        per_line = heads.legacy.tolist() + heads.glued.tolist() + heads.head_cut.tolist()
        if rare is None:
            per_line += self._rare_lines(c, prefill, decode)
        if self.pending is not None:
            per_line.append(0)  # the first line may continue the previous chunk's record
        with _PLANS.lock:
            pid = self._plan_lines(c, heads, per_line, keys)
            batched = None if rare is None else self._rare_batch(c, rare, per_line)
            seen = self._per_line(c, sorted(set(per_line)), base, batched)
            fast = ~seen[prefill]
            rows, pid = prefill[fast], pid[fast]
            kind, _, has_decode = _PLANS.tables()[:3]
            self.decode -= int(np.count_nonzero(has_decode[pid]))
            ok = kind[pid] == _FAST
            block, bad = self._read_records(c, rows[ok], pid[ok], base)
        bad = np.sort(np.concatenate([bad, rows[~ok]])).tolist()
        self._emit(block, [(base + i, _decode(c.line(i))) for i in bad])
        self.lines += c.newline_count
        self.open_line = piece.data[piece.stop - 1] != 10

    def _scan_compiled(self, piece: _Piece):
        """The chunk's lines through the compiled scanner: (lines, heads, layout ids of the
        prefill lines, (line, text id) of the lines holding a rare needle)."""
        assert self.table is not None
        if self.table.nbytes > _MAX_TABLE_BYTES:
            self._forget_texts()
        raw = self.table.scan(
            piece.data, piece.start, piece.stop, _RARE_NEEDLES, _B_NEW_SEQ, _MAX_PLAN_KEY, _MAX_RARE_TEXT, _LAYOUT_RARE
        )
        ends, idx, kind, key = (np.frombuffer(b, t) for b, t in zip(raw, (np.int64, np.int64, np.uint8, np.int64)))
        c = _ChunkLines(piece, ends)
        # the fast path's candidates: prefill lines, and pre-2024 ones without another head
        # (a pre-2024 line beside a prefill or decode head is read per line)
        legacy = (kind & _K_LEGACY) != 0
        old_only = legacy & ((kind & (_K_PREFILL | _K_DECODE)) == 0)
        is_prefill = ((kind & _K_PREFILL) != 0) | old_only
        heads = _BatchLines(
            idx[is_prefill], idx[(kind & _K_DECODE) != 0], idx[legacy & ~old_only], idx[(kind & _K_GLUED) != 0],
            idx[(kind & _K_HEAD_CUT) != 0],
        )  # fmt: skip
        is_rare = (kind & _K_RARE) != 0
        return c, heads, key[is_prefill], (idx[is_rare], key[is_rare])

    def _grow_ids(self) -> None:
        assert self.table is not None
        n = max(self.table.nkeys, 1)  # (index 0 stands in for lines without an id)
        if n > len(self._key_pid):
            size = max(n, 2 * len(self._key_pid), 256)
            grow = size - len(self._key_pid)
            self._key_pid = np.concatenate([self._key_pid, np.full(grow, _UNKNOWN, np.int64)])
            self._rare_kind = np.concatenate([self._rare_kind, np.full(grow, _UNKNOWN, np.int8)])
            self._rare_legacy = np.concatenate([self._rare_legacy, np.zeros(grow, np.int64)])
            self._rare_args += [None] * grow

    def _rare_batch(self, c: _ChunkLines, rare: tuple[np.ndarray, np.ndarray], per_line: list[int]):
        """The chunk's rare lines whose events are known by their text (each text parsed
        once by the per-line parser): (lines, text ids), in order, for _per_line to hand
        on in bulk. The others (no text id, an event no text id can stand for, or a line
        the per-line parser reads anyway) are added to `per_line`."""
        lines, keys = rare
        if not len(lines):
            return None
        self._grow_ids()
        known = keys >= 0
        todo = known & (self._rare_kind[np.where(known, keys, 0)] == _UNKNOWN)
        if todo.any():
            u, first = np.unique(keys[todo], return_index=True)
            for k, i in zip(u.tolist(), lines[todo][first].tolist()):
                self._learn_rare(k, c.line(i))
        kind = np.where(known, self._rare_kind[np.where(known, keys, 0)], _PER_LINE)
        own = kind == _PER_LINE
        if per_line:
            read = np.zeros(c.n + 1, np.bool_)  # (index c.n: the line a record may continue on)
            read[per_line] = True
            own |= read[lines]
        if own.any():
            per_line += lines[own].tolist()
            lines, keys = lines[~own], keys[~own]
        return (lines, keys) if len(lines) else None

    def _learn_rare(self, key: int, raw: bytes) -> None:
        """What the per-line parser does with text `raw` when no record is open: at most one
        sink event and a count of pre-2024 decode lines; _PER_LINE when it does more."""
        saved = (self.sink, self.pending, self.pending_line, self._recs, self._bad, self.decode, self.legacy_decode)
        rec = _Recorder()
        self.sink, self.pending, self._recs, self._bad = rec, None, [], []
        try:
            self._line(raw, _LINE_MARK)
            alone = self.pending is None and not self._recs and not self._bad and self.decode == saved[5]
            legacy = self.legacy_decode - saved[6]
        finally:
            self.sink, self.pending, self.pending_line, self._recs, self._bad, self.decode, self.legacy_decode = saved
        kind = _NO_EVENT
        if not alone or rec.other or len(rec.calls) > 1 or legacy not in (0, 1):
            kind = _PER_LINE
        elif rec.calls:
            name, args = rec.calls[0]
            marks = sum(a == _LINE_MARK for a in args) + sum(isinstance(a, dict) and a.get("line") == _LINE_MARK for a in args)
            kind = _EVENT_KINDS.index(name) if marks == 1 else _PER_LINE
            self._rare_args[key] = _Args.of(args)
        self._rare_kind[key] = kind
        self._rare_legacy[key] = legacy

    def _emit_rare(self, upto: int | None) -> None:
        """Hand on the batched rare lines (self._batched) before line number `upto` (all
        when None) that the per-line parser did not read, grouped by event in line order."""
        assert self._batched is not None
        lines, keys, seen, base, r = self._batched
        k = len(lines) if upto is None else int(np.searchsorted(lines, upto - base))
        if k <= r:
            return
        self._batched = (lines, keys, seen, base, k)
        sel, ks = lines[r:k], keys[r:k]
        read = seen[sel]
        if read.any():
            sel, ks = sel[~read], ks[~read]
        if len(sel):
            self.legacy_decode += int(self._rare_legacy[ks].sum())
            kind = self._rare_kind[ks]
            counts = np.bincount(kind[kind >= 0], minlength=len(_EVENT_KINDS)).tolist()
            for code, name in enumerate(_EVENT_KINDS):
                if counts[code] == len(kind):
                    self.sink.events(name, self._rare_args, ks, base + sel)
                elif counts[code]:
                    m = kind == code
                    self.sink.events(name, self._rare_args, ks[m], base + sel[m])

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
        found: list[int] = []
        for needle in _RARE_NEEDLES:  # the first hit of each needle on each line
            p = text.find(needle)
            while p >= 0:
                found.append(p)
                e = text.find(b"\n", p)
                p = -1 if e < 0 else text.find(needle, e + 1)
        if not found:
            return []
        pos = np.array(found, np.int64)
        sep = np.cumsum(hi - lo + 1) - 1  # offset in `text` of the b"\n" after each run
        r = np.searchsorted(sep, pos, "right")
        at = lo[r] + pos - (sep[r] - (hi[r] - lo[r]))  # offsets in the chunk
        return distinct(np.searchsorted(c.ends, at)).tolist()

    def _plan_lines(self, c: _ChunkLines, heads: _BatchLines, per_line: list[int], ids: np.ndarray | None) -> np.ndarray:
        """Plan ids of the prefill lines (`ids`: their layout ids from the compiled
        scanner); adds to `per_line` those the fast path cannot read (layouts read per line,
        records that may continue on the next line)."""
        prefill = heads.prefill
        if not len(prefill):
            return np.empty(0, np.int64)
        if len(_PLANS.index) > _MAX_FAST_PLANS:
            _PLANS.clear()
        if ids is None:
            pid = self._plans_of(c.lines(prefill))
        else:
            pid = self._plans_by_id(c, prefill, ids)
        kind, pending, has_decode = _PLANS.tables()[:3]
        pk = kind[pid]
        per_line += prefill[(pk == _GENERAL) | has_decode[pid]].tolist()  # glued to a decode line: per line
        nxt = prefill[pending[pid] & (pk != _GENERAL)] + 1  # the line after a record that ends with ","
        if len(nxt):
            head = np.zeros(c.n + 1, np.bool_)  # a record head: it holds b"batch", so it continues nothing
            for rows in (prefill, heads.decode, heads.legacy):
                head[rows] = True
            for i in nxt[~head[nxt]].tolist():
                if i >= c.n or (_B_BATCH not in c.line(i) and _CONTINUATION_RE.match(c.line(i))):
                    per_line.append(i - 1)  # it may continue: only the per-line parser knows
        return pid

    @staticmethod
    def _plans_of(lines: list[bytes]) -> np.ndarray:
        keys = list(map(bytes.translate, lines, repeat(_MASK_DIGITS)))
        pids = list(map(_PLANS.index.get, keys))
        if None in pids:
            _PLANS.resolve(keys, lines, pids)
        return np.fromiter(pids, np.int64, len(pids))

    def _plans_by_id(self, c: _ChunkLines, prefill: np.ndarray, ids: np.ndarray) -> np.ndarray:
        """Plan ids of prefill lines of layout ids `ids` (-1: no id, a line too long to
        cache: read per line), each layout looked up once."""
        if self._plans_generation != _PLANS.generation:  # the plans were emptied: look up again
            self._key_pid[:] = _UNKNOWN
            self._plans_generation = _PLANS.generation
        self._grow_ids()
        has = ids >= 0
        pid = np.where(has, self._key_pid[np.where(has, ids, 0)], 0)
        todo = pid == _UNKNOWN
        if todo.any():
            u, first = np.unique(ids[todo], return_index=True)
            self._key_pid[u] = self._plans_of(c.lines(prefill[todo][first]))
            pid = np.where(has, self._key_pid[np.where(has, ids, 0)], 0)
        return pid

    def _per_line(self, c: _ChunkLines, ids: list[int], base: int, batched=None) -> np.ndarray:
        """Run the per-line parser on lines `ids` (and on the lines after any that leaves
        a record open), in order; the batched rare lines (_rare_batch) are handed on in
        bulk, those before a line whose event is of a kind they give first (events of one
        kind in line order). Returns which lines the per-line parser saw."""
        seen = np.zeros(c.n, np.bool_)
        sink = self.sink
        if batched is not None:
            self._batched = (*batched, seen, base, 0)
            self.sink = _InLineOrder(self, sink)
        try:
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
        finally:
            self.sink = sink
        if batched is not None:
            self._emit_rare(None)
            self._batched = None
        return seen

    def _read_records(self, c: _ChunkLines, rows, pid, base) -> tuple[_Block | None, np.ndarray]:
        """The records of prefill lines `rows` of fast layouts `pid`, read at the layouts'
        offsets; and the rows whose counts fall outside int32 (malformed)."""
        if not len(rows):
            return None, np.empty(0, np.int64)
        _, _, _, graph, label, template, offsets, lengths, legacy = _PLANS.tables()
        if self.table is not None:  # the compiled scanner's reader
            raw = read_fields(c.data, c.off, c.starts[rows], pid, offsets, lengths, _NF)
            vals = np.frombuffer(raw, np.int64).reshape(len(rows), _NF)
            lens = lengths[:, _F_STAMP : _F_STAMP + _N_STAMP][pid]  # what _stamps reads of them
        else:
            lens = lengths[pid]
            vals = _read_digits(c.buf, (offsets[pid] + c.starts[rows][:, None]).ravel(), lens.ravel()).reshape(lens.shape)
            lens = lens[:, _F_STAMP : _F_STAMP + _N_STAMP]
        bad = np.empty(0, np.int64)
        if vals[:, : len(_INT_COLS)].max(initial=0) > INT32_MAX:
            good = ~(vals[:, : len(_INT_COLS)] > INT32_MAX).any(axis=1)
            bad = rows[~good]
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
            graph=graph[pid], label=label[pid], rank=rank, rank_names=names,
            timestamp=_stamps(vals, lens) if self.sink.wants_timestamps else np.full(len(rows), np.nan),
            forward_ct=vals[:, _F_CT], legacy=legacy[pid],
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
                glued = _B_DECODE in raw or raw.count(_B_PREFILL) + raw.count(_B_LEGACY_PREFILL) > 1
                if glued:
                    if _B_DECODE in raw:
                        self.decode -= 1  # counted as a decode line, but a prefill record
                    self._glued(raw, lineno)
                elif raw.rstrip().endswith(b","):
                    self.pending = [raw]
                    self.pending_line = lineno
                else:
                    self._prefill(_decode(raw), lineno, 1)
            elif _B_DECODE in raw:
                pass
            elif _B_NEW_SEQ in raw and _HEAD_CUT_RE.search(raw):
                self.sink.head_cut(self.source, lineno, _decode(raw))
            elif _B_SERVER_ARGS in raw:  # its keys hold "batch" (enable_two_batch_overlap)
                self._server_args(raw, lineno)
        elif _B_SERVER_ARGS in raw:
            self._server_args(raw, lineno)
        elif _B_GRAPH in raw:
            self._graph_line(raw, lineno)
        elif _B_STARTUP in raw:
            d = parse_startup_text(_decode(raw), self.source, lineno)
            if d is not None:
                self.sink.startup(d)
        elif _B_LEGACY_DECODE in raw and b"#running-req" in raw:
            self.legacy_decode += 1

    def _server_args(self, raw: bytes, lineno: int) -> None:
        d = parse_server_args_text(_decode(raw), self.source, lineno)
        if d is not None:
            self.sink.server_args(d)

    def _glued(self, raw: bytes, lineno: int) -> None:
        """A physical line holding a prefill record and another record (concurrent
        writers): each prefill record is read from its head up to the next record's own
        prefix, with its own prefix, or else the line's leading one (so it keeps its rank
        tag). The line is counted; its last record may continue on the next line."""
        self.sink.glued(self.source, lineno, _decode(raw))
        heads = sorted(m.start() for m in _RECORD_HEAD_RE.finditer(raw))
        starts = [0] + [_own_prefix(raw, heads[k - 1], heads[k]) for k in range(1, len(heads))]
        lead = raw[: heads[0]]
        for k, head in enumerate(heads):
            if raw.startswith(_B_DECODE, head):
                continue
            piece = raw[starts[k] : starts[k + 1] if k + 1 < len(heads) else len(raw)]
            if starts[k] == head:
                piece = lead + piece
            if k + 1 == len(heads) and piece.rstrip().endswith(b","):
                self.pending = [piece]
                self.pending_line = lineno
            else:
                self._prefill(_decode(piece), lineno, 1)

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
        assert pending is not None
        text = " ".join(_decode(p).strip() if i else _decode(p) for i, p in enumerate(pending))
        self._prefill(text, self.pending_line, len(pending))

    def _prefill(self, text: str, lineno: int, physical_lines: int) -> None:
        # a record read per line (wrapped over lines, glued, of a layout not planned) is remembered
        # by its text: the same text is the same record (its values are immutable)
        v = _cached(self._values_cache, text, _prefill_values)
        if v is None:
            self._bad.append((lineno, text))
        else:
            self._recs.append((lineno, physical_lines, v))


def _with_old_records(heads: _BatchLines) -> _BatchLines:
    """The fast path's candidates (as _scan_compiled gives them): the prefill lines and the
    pre-2024 ones without a prefill or decode head; the other pre-2024 lines stay to be
    read per line."""
    if not len(heads.legacy):
        return heads
    other = np.isin(heads.legacy, heads.prefill) | np.isin(heads.legacy, heads.decode)
    return heads._replace(prefill=np.union1d(heads.prefill, heads.legacy[~other]), legacy=heads.legacy[other])


# the kinds of a line from the compiled scanner (bits, _lines.c)
_K_PREFILL, _K_DECODE, _K_LEGACY, _K_GLUED, _K_HEAD_CUT, _K_RARE = 1, 2, 4, 8, 16, 32
_UNKNOWN, _NO_EVENT, _PER_LINE = -2, -3, -4  # a text id not looked up yet; a rare text with no event; one read per line
_MAX_TABLE_BYTES = 16 << 20  # the compiled scanner's texts: emptied past this (flat memory)
_MAX_RARE_TEXT = 1 << 16  # a longer rare line is read per line (a launch's settings fit)
# A line whose only needle is this one and that holds no "batch" is a pre-2024 decode line or
# nothing to the per-line parser, whatever its digits: its text is known by its layout (each
# such line of an old log has its own numbers).
_LAYOUT_RARE = 1 << _RARE_NEEDLES.index(_B_LEGACY_DECODE)

_RECORD_HEAD_RE = re.compile(rb"Prefill batch|new fill batch|Decode batch")
_PREFIX_BEFORE_RE = re.compile(rb"\[[^\[\]]*+\]\s*+$")


def _own_prefix(raw: bytes, prev: int, head: int) -> int:
    """Where the record whose head is at `head` starts: at its own `[...]` prefix right
    before the head, if one follows the previous head; else at the head."""
    at = raw.rfind(b"[", prev, head)
    if at > prev and _PREFIX_BEFORE_RE.match(raw, at, head):
        return at
    return head


# ---- reading ------------------------------------------------------------------------
class _Overlong(NamedTuple):
    head: bytes  # its first bytes (quoted by MAX_QUOTE_CHARS characters at most)
    nbytes: int
    ended: bool  # a b"\n" closed it (else the input ended inside it)


# What reading a broken input raises: I/O errors, gzip.BadGzipFile (an OSError), a
# truncated .gz (EOFError), corrupt deflate data (zlib.error), a closed stream (ValueError).
_READ_ERRORS = (OSError, EOFError, zlib.error, ValueError)


class _Source:
    """One input opened for reading (fileio.open_binary: `-` is stdin, `.gz` decompressed;
    a URL through fsspec, remote.RemoteFile):
    its bytes are counted and hashed (XXH3-128, log_digest) as they are read, and every open or read
    error is a one-line InputError naming it."""

    def __init__(self, path: str):
        self.path = path
        self.where = _display_path(path)
        try:
            self.raw = RemoteFile(path) if is_url(path) else open_binary(path)
        except _READ_ERRORS as exc:
            raise InputError(f"cannot read: {_quote(str(exc) or type(exc).__name__)}", self.where) from None
        self.digest = log_digest()
        self.nbytes = 0

    def read(self, size: int) -> bytes:
        try:
            block = self.raw.read(size)
        except _READ_ERRORS as exc:
            raise InputError(f"cannot read: {_quote(str(exc) or type(exc).__name__)}", self.where) from None
        self.digest.update(block)
        self.nbytes += len(block)
        return block

    def position(self) -> int:
        """Bytes of the input consumed so far (of the compressed file for .gz)."""
        f: Any = self.raw.fileobj if isinstance(self.raw, gzip.GzipFile) else self.raw  # RemoteFile: its own tell
        try:
            return int(f.tell())
        except (OSError, ValueError, AttributeError):
            return self.nbytes

    def close(self) -> None:
        if self.path != "-":
            self.raw.close()


def _chunks(src: _Source, chunk_size: int, max_line_bytes: int = MAX_LINE_BYTES) -> Iterator[_Piece | _Overlong]:
    """The input as pieces of whole lines, mostly the blocks read themselves (no copy),
    with an _Overlong in place of each line longer than max_line_bytes. Memory: one block
    plus one line of at most max_line_bytes. Refuses binary data (a NUL byte in the first
    block)."""
    size = max(1, chunk_size)
    carry = b""  # a line not ended yet
    skip: list | None = None  # [head, bytes so far] of an overlong line being skipped
    first = True
    while True:
        read = src.read(size)
        if not read:
            break
        if first:
            first = False
            if b"\0" in read:
                raise InputError("binary data, not a text log (NUL bytes in its first chunk)", src.where)
        for block in _blocks(read, max_line_bytes):
            start = 0
            if skip is not None or carry:
                nl = block.find(b"\n")
                if nl < 0:
                    if skip is not None:
                        skip[1] += len(block)
                    else:
                        carry += block
                        if len(carry) > max_line_bytes:
                            skip, carry = [carry[: 4 * MAX_QUOTE_CHARS], len(carry)], b""
                    continue
                if skip is not None:
                    yield _Overlong(skip[0], skip[1] + nl, True)
                    skip = None
                elif len(carry) + nl > max_line_bytes:  # quoted from its start, wherever the block cut it
                    head = carry[: 4 * MAX_QUOTE_CHARS] + block[: max(0, 4 * MAX_QUOTE_CHARS - len(carry))]
                    yield _Overlong(head, len(carry) + nl, True)
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


def _blocks(read: bytes, max_line_bytes: int) -> tuple[bytes, ...] | list[bytes]:
    """A block read, as blocks in which no line can be longer than max_line_bytes unseen:
    itself when every aligned window of max_line_bytes // 2 bytes in it holds a b"\n" (then
    no run without one reaches max_line_bytes - 1 bytes), else cut in pieces of
    max_line_bytes (where a line longer than that spans blocks, and _chunks sees it)."""
    if len(read) <= max_line_bytes:
        return (read,)
    half = max(1, max_line_bytes // 2)
    if all(read.find(b"\n", a, a + half) >= 0 for a in range(0, len(read) - half + 1, half)):
        return (read,)
    return [read[a : a + max_line_bytes] for a in range(0, len(read), max_line_bytes)]


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

    def server_args(self, d: dict) -> None:
        self.r.server_args.append(d)

    def head_cut(self, source: int, line: int, text: str) -> None:
        self.r.head_cut.append({"source": source, "line": line, "text": text.strip()[:MAX_SAMPLE_CHARS]})

    def glued(self, source: int, line: int, text: str) -> None:
        self.r.glued.append({"source": source, "line": line, "text": text.strip()[:MAX_SAMPLE_CHARS]})


def _scan(
    path: str,
    source: int,
    sink: _Sink,
    progress: Callable[[int], None] | None = None,
    options: ParseOptions = DEFAULT_OPTIONS,
):
    """Feed one input through a scanner into `sink`. Returns ((physical lines, decode
    lines, legacy decode lines), the closed _Source)."""
    src = _Source(path)
    try:
        scanner = _Scanner(source, sink, options)
        for item in _chunks(src, options.chunk_size, options.max_line_bytes):
            if type(item) is _Piece:
                scanner.feed(item)
            else:
                scanner.overlong(*item)
            if progress is not None:
                progress(src.position())
        return scanner.finish(), src
    finally:
        src.close()


def scan_log(path: str, source: int = 0, *, options: ParseOptions | None = None) -> ScanResult:
    """Parse one log into plain lists (records, captures, ...). For tests and small logs."""
    res = ScanResult()
    (res.lines, res.decode_lines, res.legacy_decode_lines), src = _scan(
        path, source, _ListSink(res), None, options or DEFAULT_OPTIONS
    )
    res.xxh128 = src.digest.hexdigest()
    res.bytes = src.nbytes
    return res
