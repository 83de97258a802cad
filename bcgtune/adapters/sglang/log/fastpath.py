"""The fast path: prefill lines found with numpy, looked up by their layout (the line with
its ASCII digits masked), and their numbers read at fixed offsets, vectorised. A layout's
plan comes from the general per-record parser itself (grammar._prefix_layout on the text
before "Prefill batch", grammar._plan on the text after it), so both agree by
construction; tests/test_sglang_log.py compares them on every log and on generated ones.
Also the record blocks (equal-length columns) that the scanner hands its sink."""

from __future__ import annotations

import re
import threading
from itertools import repeat
from operator import itemgetter
from typing import Any, NamedTuple

import numpy as np

from bcgtune.core.stats import distinct

try:  # the compiled line scanner (_lines.c), built where a C compiler was found at install
    from bcgtune.adapters.sglang.log._lines import LineTable, read_fields
except ImportError:  # the numpy path gives the same results
    LineTable = None  # type: ignore[misc,assignment]
    read_fields = None  # type: ignore[assignment]

from bcgtune.adapters.sglang.log.grammar import (
    _B_BATCH,
    _B_DECODE,
    _B_GRAPH,
    _B_LEGACY_DECODE,
    _B_LEGACY_PREFILL,
    _B_NEW_SEQ,
    _B_PREFILL,
    _B_SERVER_ARGS,
    _B_STARTUP,
    _GRAPH_LABELS,
    _HEAD_TAIL_RE,
    _MASK_DIGITS_STR,
    _MAX_PLAN_KEY,
    PrefillValues,
    _days_since_epoch,
    _plan,
    _prefix_layout,
)


class _Piece(NamedTuple):
    """Whole lines: data[start:stop] (only the input's last piece may lack its b"\\n"):
    what the scanner reads and hands the fast path."""

    data: bytes
    start: int
    stop: int


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
_BLOCK_COLUMNS = tuple(k for k in _Block._fields if k != "rank_names")
_COLUMN_TYPES = {"graph": np.int8, "label": np.int8, "timestamp": np.float64, "rank": np.int32, "legacy": np.bool_}


def _block_of(records: list[tuple[int, int, PrefillValues]]) -> _Block:
    """A block from the general parser's (line, physical lines, values) records."""
    names: dict[str | None, int] = {None: -1}
    line, phys, values = zip(*records)
    v = dict(zip(PrefillValues._fields, zip(*values)))  # each field's values, in record order
    cols: dict[str, Any] = {"line": line, "physical_lines": phys, **{k: v[k] for k in _INT_COLS}}
    cols["graph"] = [-1 if g is None else int(g) for g in v["graph"]]
    cols["label"] = [-1 if x is None else _GRAPH_LABELS.index(x) for x in v["graph_label"]]
    cols["timestamp"] = v["timestamp"]
    cols["rank"] = [names.setdefault(r, len(names) - 1) for r in v["rank"]]
    cols["forward_ct"] = [-1 if x is None else x for x in v["forward_ct"]]
    cols["legacy"] = v["legacy"]
    arrays: dict[str, np.ndarray] = {k: np.array(cols[k], dtype=_COLUMN_TYPES.get(k, np.int64)) for k in _BLOCK_COLUMNS}
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
        cols[k] = (x, y)
    order = np.argsort(b.line, kind="stable")  # each block in line order, one line in one block
    at = np.searchsorted(a.line, b.line[order]) + np.arange(len(order))  # b's rows in the merged block
    from_a = np.ones(len(a.line) + len(order), np.bool_)
    from_a[at] = False
    merged = {}
    for k, (x, y) in cols.items():
        out = merged[k] = np.empty(len(from_a), x.dtype)
        out[from_a] = x
        out[at] = y[order]
    return _Block(rank_names=a.rank_names + b.rank_names, **merged)


# ---- the fast path: layouts of prefill lines -----------------------------------------
# Numbers read from a line of a known layout, at fixed offsets: the counts of _PLAN_INTS,
# the forward count, year, month, day, hour, minute, second, fraction of the time, and up
# to four digit runs of the rank (`DP3 TP3 EP3`).
_NF = 18
_F_CT = 6
_F_STAMP = 7
_N_STAMP = 7  # year, month, day, hour, minute, second, fraction
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


def _tail_plan(tail: str, runs: list[tuple[int, int]], legacy: bool = False) -> _TailPlan:
    """_plan of a record's text after "Prefill batch", each field read as the index of its
    digit run in `runs`. _plan decides by where digits are, not by how many (int() and the
    key test look at the other characters; no run here has more than 18 digits, so int()
    never refuses one for its length), except in the first key (_KEY_OK_RE counts its
    characters): so the result holds for every tail with the same digit-masked text once
    each run is collapsed to one digit, unless `exact_only`."""
    m = _HEAD_TAIL_RE.match(tail)
    assert m is not None  # every part of the pattern is optional
    first_key = tail[m.end() :].split(",", 1)[0].partition(":")[0]
    exact_only = _DIGIT_RUN_RE.search(first_key) is not None
    plan = _plan(tail, legacy)
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
        self.generation = getattr(self, "generation", -1) + 1  # plan ids of earlier ones are gone
        self.index: dict[bytes, int] = {}
        self.head_ids: dict[bytes, int] = {}  # masked head -> row of the head table
        self.head_rows: list[tuple] = []  # (fast path can read it, offsets, lengths, rank template)
        self._head_arrays: tuple | None = None
        self.tails: dict[tuple[bool, bytes], _TailPlan] = {}  # (pre-2024 form, tail shape) -> its plan
        self.templates: dict[tuple, int] = {}  # rank texts with masked digits, and runs
        self.template_list: list[tuple] = []
        self.rank_names: dict[tuple, str] = {}
        self.n = 1
        # kind, pending, has_decode, graph, label, rank template, offsets, lengths, pre-2024 form
        self._rows: list[np.ndarray] = [np.zeros(256, t) for t in (np.int8, np.bool_, np.bool_, np.int8, np.int8, np.int64)] + [
            np.zeros((256, _NF), np.int64),
            np.zeros((256, _NF), np.int64),
            np.zeros(256, np.bool_),
        ]
        self._rows[0][0] = _GENERAL
        self._rows[5][0] = -1

    def tables(self) -> list[np.ndarray]:
        """[kind, pending, has_decode, graph, label, rank template, offsets, lengths, pre-2024
        form], one row per plan (views: fetch again after resolve)."""
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
        # the pre-2024 head where the line has no "Prefill batch" (grammar._head_index)
        old = np.fromiter(map(bytes.find, lines, repeat(_B_LEGACY_PREFILL)), np.int64, n)
        legacy = (at < 0) & (old >= 0)
        at = np.where(legacy, old, at)
        heads = np.fromiter(map(bytes.count, lines, repeat(_B_PREFILL)), np.int64, n) + np.fromiter(
            map(bytes.count, lines, repeat(_B_LEGACY_PREFILL)), np.int64, n
        )
        # else per line (two heads: records glued on one line)
        ok = np.fromiter(map(bytes.isascii, lines), np.bool_, n) & (at >= 0) & (heads == 1)
        cut = np.maximum(at, 0)
        body = cut + np.where(legacy, len(_B_LEGACY_PREFILL), len(_B_PREFILL))  # where the tail starts
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
        tails = list(map(bytes.rstrip, map(bytes.__getitem__, keys, map(slice, body.tolist(), repeat(None))), repeat(b"\r")))
        runs = _Runs(tails)
        long = np.zeros(n, np.bool_)
        long[runs.text[runs.ends - runs.starts > 18]] = True
        shapes = [(bool(x), s) for x, s in zip(legacy.tolist(), runs.shapes)]  # the two forms split differently
        found: list[_TailPlan | None] = list(map(self.tails.get, shapes))
        for i in np.flatnonzero(ok).tolist():
            known = found[i] or self.tails.get(shapes[i])  # (or planned for an earlier line of this call)
            if known is None or known.exact_only or long[i]:
                known = self._new_tail(lines[i][body[i] :].rstrip(b"\r"), runs, i, shapes[i], store=not long[i])
            found[i] = known
        plans: list[_TailPlan] = [p if p is not None else _GENERAL_TAIL for p in found]
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
        offsets[:, : _F_CT + 1] = np.where(has, body[:, None] + start, 0)
        lengths[:, : _F_CT + 1] = length
        graph = np.where(fast, np.fromiter(map(itemgetter(2), plans), np.int8, n), -1).astype(np.int8)
        label = np.where(fast, np.fromiter(map(itemgetter(3), plans), np.int8, n), -1).astype(np.int8)
        template = np.where(fast, h_template[hid], -1)
        pending = np.fromiter(map(bytes.endswith, map(bytes.rstrip, lines), repeat(b",")), np.bool_, n)
        has_decode = np.fromiter(map(bytes.__contains__, lines, repeat(_B_DECODE)), np.bool_, n)
        return self._append(kind, pending, has_decode, graph, label, template, offsets, lengths, legacy & fast)

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

    def _new_tail(self, tail: bytes, runs: _Runs, i: int, shape: tuple[bool, bytes], store: bool) -> _TailPlan:
        """_tail_plan of text i of `runs` (the pre-2024 form when shape[0]), kept by its
        shape if `store` and the shape decides it."""
        plan = _tail_plan(tail.decode("ascii"), runs.of(i), shape[0])
        if store and not plan.exact_only and len(shape[1]) <= _MAX_PLAN_KEY:
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


_PLANS = _Plans()  # shared by every scanner of this process (a cache: one lock, bounded)


class _ChunkLines:
    """The lines of a piece as offsets, without copies: line i is
    data[off + starts[i] : off + ends[i]] (ends[i] is its b"\\n", or the piece's end for
    an unterminated last line); `buf` holds the piece's bytes."""

    def __init__(self, piece: _Piece, ends: np.ndarray | None = None):
        """`ends`: the line ends, where the compiled scanner found them."""
        self.data, self.off = piece.data, piece.start
        self.buf = np.frombuffer(piece.data, np.uint8, piece.stop - piece.start, piece.start)
        terminated = piece.data[piece.stop - 1] == 10
        if ends is None:
            newlines = np.flatnonzero(self.buf == 10)
            ends = newlines if terminated else np.append(newlines, len(self.buf))
        self.ends = ends
        self.newline_count = len(ends) - (not terminated)  # the b"\n" of the piece
        self.starts = np.concatenate(([0], self.ends[:-1] + 1))
        self.n = len(self.ends)

    def line(self, i: int) -> bytes:
        return self.data[self.off + self.starts[i] : self.off + self.ends[i]]

    def lines(self, ids: np.ndarray) -> list[bytes]:
        return self.spans(self.starts[ids], self.ends[ids])

    def spans(self, lo: np.ndarray, hi: np.ndarray) -> list[bytes]:
        """data of the piece's byte ranges [lo, hi)."""
        return list(map(self.data.__getitem__, map(slice, (lo + self.off).tolist(), (hi + self.off).tolist())))

    def batch_lines(self) -> _BatchLines:
        """The lines holding record heads: one numpy search for "batch", then the 8 bytes
        before each hit compared as one little-endian word (see _BatchLines)."""
        pos = _find_all(self.buf, _BATCH_NEEDLE)
        early = pos[pos < 8]  # at the piece's start: fewer than 8 bytes before
        pos = pos[pos >= 8]
        word = self.buf[pos[:, None] + _BEFORE_8].view("<u8").ravel()
        is_prefill = word == _W_PREFILL
        is_decode = (word >> 8) == _W_DECODE
        is_legacy = (word == _W_LEGACY) & (pos >= 9)
        is_legacy[is_legacy] = self.buf[pos[is_legacy] - 9] == ord("n")
        prefill, decode, legacy = pos[is_prefill], pos[is_decode], pos[is_legacy]
        other = pos[~(is_prefill | is_decode | is_legacy)]
        if early.size:
            if early[-1] == 7 and self.buf[:7].tobytes() == b"Decode ":
                decode, early = np.concatenate(([7], decode)), early[:-1]
            other = np.concatenate((early, other))
        hits = np.searchsorted(self.ends, prefill)
        glued = distinct(hits[1:][hits[1:] == hits[:-1]])  # two prefill heads on one line
        prefill_ids, decode_ids, legacy_ids = (_line_ids(self.ends, x) for x in (prefill, decode, legacy))
        cut = _line_ids(self.ends, other)
        if cut.size:
            mask = np.zeros(self.n, np.bool_)
            mask[cut] = True
            mask[prefill_ids] = mask[decode_ids] = mask[legacy_ids] = False
            cut = np.flatnonzero(mask)
            cut = cut[[_B_NEW_SEQ in self.line(i) for i in cut.tolist()]] if cut.size else cut
        return _BatchLines(prefill_ids, decode_ids, legacy_ids, glued, cut)


class _BatchLines(NamedTuple):
    """Line indices: prefill, decode and pre-2024 prefill heads; prefill lines holding two
    prefill heads (glued lines); and lines that may hold a prefill record whose head was
    cut off (another "batch" and a "#new-seq"), for the per-line parser to decide."""

    prefill: np.ndarray
    decode: np.ndarray
    legacy: np.ndarray
    glued: np.ndarray
    head_cut: np.ndarray


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
        uniq, inv = _distinct(code)
        uniq_rows = [(c >> 48, tuple((c >> (36 - 12 * k)) & 4095 for k in range(_MAX_RANK_RUNS))) for c in uniq.tolist()]
    else:
        uniq2, inv = np.unique(np.column_stack([tid, runs]), axis=0, return_inverse=True)
        uniq_rows = [(r[0], tuple(r[1:])) for r in uniq2.tolist()]
    names = [_PLANS.rank_name(t, r) for t, r in uniq_rows]
    return inv.ravel().astype(np.int32), names


_days_cache: dict[int, float] = {}


def _distinct(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """np.unique(values, return_inverse=True) of a 1-D integer array, by a sort and a
    search (half the time of unique's stable argsort on a chunk's few distinct values)."""
    s = np.sort(values)
    keep = np.ones(len(s), np.bool_)
    keep[1:] = s[1:] != s[:-1]
    uniq = s[keep]
    return uniq, np.searchsorted(uniq, values)


def _stamps(vals: np.ndarray, lens: np.ndarray) -> np.ndarray:
    """_to_seconds of the time fields read by the fast path (NaN where the line has no
    time), with the same float operations in the same order. `lens`: the lengths of the
    time fields (_N_STAMP columns from _F_STAMP)."""
    has = lens[:, 3] > 0  # an hour
    if not has.any():
        return np.full(len(vals), np.nan)
    every = has.all()
    v = vals if every else vals[has]
    n = lens if every else lens[has]
    t = (v[:, _F_STAMP + 3] * 3600 + v[:, _F_STAMP + 4] * 60 + v[:, _F_STAMP + 5]).astype(np.float64)
    dated = n[:, 0] > 0
    if dated.any():
        codes = v[:, _F_STAMP] * 10000 + v[:, _F_STAMP + 1] * 100 + v[:, _F_STAMP + 2]
        if dated.all() and (codes == codes[0]).all():
            t += _days(int(codes[0])) * 86400.0
        else:
            uniq, inv = _distinct(codes[dated])
            t[dated] += np.array([_days(c) for c in uniq.tolist()])[inv.ravel()] * 86400.0
    frac = n[:, 6]
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
# "max_total_num_token", pre-2024 decode lines "gen throughput", launch settings
# "server_args=".
_RARE_NEEDLES = (_B_GRAPH, _B_STARTUP, _B_LEGACY_DECODE, _B_SERVER_ARGS)


def _decode(raw: bytes) -> str:
    return raw.decode("utf-8", "replace").rstrip("\r\n")
