"""Merging traces: several traces in, one out, provenance and server configurations kept.

The log parser's map step yields one trace per log; merge_traces is its reduce step, and
`bcgtune trace merge` applies it to trace files. It is associative (any grouping of the
inputs, in the same order, gives the same trace) because everything it does is
concatenation in input order, sums, first-N caps of concatenations, and numbering in order
of first appearance; what depends on all the batches together (which records several
printers share) is recomputed from the merged columns. Inputs that cannot be one trace are
refused with a message that says why: a simulation beside logs, different forward-token
rules, per-batch columns beside a histogram-only trace (unless asked to keep histograms
only), different column sets, the same log twice. Pure: no I/O, no printing.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from bcgtune.core.stats import distinct
from bcgtune.core.trace.groups import (
    FORWARD_TOKENS_RULE_BY_LAUNCH,
    MAX_GROUPS,
    TraceGroup,
    group_from_batches,
    histogram_of,
    launch_settings,
    merge_groups,
)
from bcgtune.core.trace.prefill_trace import PrefillTrace, source_digest
from bcgtune.errors import InputError

# The caps of the log parser (bcgtune/adapters/sglang/log/grammar.py takes them from here).
SAMPLES_MAX = 5  # malformed, overlong, head-cut and glued line samples
CAPTURES_MAX = 4096
EVENTS_MAX = 256  # startup, server_args and graph-disabled lines kept in meta
_LOG_ORIGINS = ("sglang-log",)
_HISTOGRAM_ORIGINS = ("histogram", "sizes")
_EVENT_KEYS = ("startup", "graph_disabled", "server_args")


def merge_traces(
    traces: list[PrefillTrace],
    *,
    names: list[str] | None = None,
    histogram_only: bool = False,
    same_source_ok: bool = False,
    consume: bool = False,
) -> PrefillTrace:
    """One trace of `traces`, in order. names: how messages call each input (file names).
    histogram_only: drop per-batch columns (needed when some inputs have none).
    same_source_ok: accept one log in several inputs (the log parser reads what it is
    given; trace files holding the same log are refused: its batches would count twice).
    consume: the inputs' per-batch columns are taken (each freed once merged: the memory of
    the columns once, not twice); the inputs are not to be used again."""
    if not traces:
        raise InputError("no trace to merge")
    names = names or [f"input {i + 1}" for i in range(len(traces))]
    _check(traces, names, histogram_only, same_source_ok)
    traces = [with_groups(t) for t in traces]
    keep_columns = not histogram_only and all(t.batches is not None for t in traces)
    offsets = np.cumsum([0] + [len(t.sources) for t in traces[:-1]]).tolist()
    ranks, rank_luts = _numbering([t.meta.get("ranks") or [] for t in traces])
    groups, group_luts = _merged_groups(traces, offsets)
    out = PrefillTrace(
        sizes=np.empty(0, np.int64),
        counts=np.empty(0, np.int64),
        origin=traces[0].origin if traces[0].origin in _LOG_ORIGINS else "histogram",
        sources=[dict(s) for t in traces for s in t.sources],
        parse_stats=_merge_stats([t.parse_stats for t in traces], offsets),
        captures=[],
        meta={},
        groups=groups,
    )
    out.sizes, out.counts = histogram_of(np.concatenate([t.sizes for t in traces]), np.concatenate([t.counts for t in traces]))
    captures = [_shifted(c, off) for t, off in zip(traces, offsets) for c in t.captures]
    out.captures = captures[:CAPTURES_MAX]
    out.meta = _merge_meta(traces, offsets, ranks, len(captures) - len(out.captures))
    if keep_columns:
        out.batches = _merge_columns(traces, offsets, rank_luts, group_luts, consume)
        out.meta["rank_overlap"] = rank_overlap(out.batches, len(ranks), len(groups)) if "rank" in out.batches else None
    elif out.origin in _LOG_ORIGINS:
        printers = sum(_printers(t) for t in traces)
        out.meta["rank_overlap"] = {"printers": printers, "records_matching_another_printer": None}
    return out


def _printers(t: PrefillTrace) -> int:
    """Ranks or files that printed the trace's prefill lines (sources are disjoint, so the
    printers of several traces add up)."""
    b = t.batches
    if b is not None and "source" in b and "rank" in b:
        who = b["source"].astype(np.int64) * (1 << 20) + (b["rank"].astype(np.int64) + 1)
        return int(distinct(who).size)
    return int((t.meta.get("rank_overlap") or {}).get("printers") or 0)


def with_groups(t: PrefillTrace) -> PrefillTrace:
    """A trace from logs written before traces kept their server configurations: one group
    of every batch, with the chunk its startup line states."""
    if t.groups or t.origin not in _LOG_ORIGINS or t.sizes.size == 0:
        return t
    startup = next((s for s in t.meta.get("startup") or [] if isinstance(s, dict)), None)
    settings, chunk = launch_settings(None, startup)
    sources = list(range(len(t.sources)))
    if t.batches is not None and "forward_tokens" in t.batches:
        b = t.batches
        fwd = b["forward_tokens"]
        g = group_from_batches(settings, chunk, sources, fwd, b.get("new_seq", np.ones_like(fwd)), b.get("graph"))
        batches: dict[str, np.ndarray] | None = {**b, "group": np.zeros(len(fwd), np.int32)}
    else:
        g = TraceGroup(
            settings, chunk, sources, t.sizes.copy(), t.counts.copy(), t.sizes.copy(), np.ones_like(t.sizes),
            t.counts.copy(), requests_known=False,
        )  # fmt: skip
        batches = t.batches
    return PrefillTrace(
        sizes=t.sizes, counts=t.counts, batches=batches, origin=t.origin, sources=t.sources,
        parse_stats=t.parse_stats, captures=t.captures, meta=t.meta, groups=[g],
    )  # fmt: skip


# ---- compatibility --------------------------------------------------------------------
def _check(traces: list[PrefillTrace], names: list[str], histogram_only: bool, same_source_ok: bool) -> None:
    kinds = [_kind(t, n) for t, n in zip(traces, names)]
    if len(set(kinds)) > 1:
        a = kinds.index("log")
        b = next(i for i, k in enumerate(kinds) if k != kinds[a])
        raise InputError(
            f"{names[a]} is a trace from server logs, {names[b]} a plain histogram: merge traces of one kind "
            "(a histogram knows no server configuration)"
        )
    rules = {t.meta.get("forward_tokens_rule") for t in traces}
    if len(rules) > 1:
        raise InputError(
            "the traces count forward tokens differently ("
            + " vs ".join(sorted(map(str, rules)))
            + "): "
            + (
                "trace the older one's logs again with this bcgtune (it counts each launch by its own settings)"
                if FORWARD_TOKENS_RULE_BY_LAUNCH in rules
                else "parse every log with the same --mixed-chunk setting"
            )
        )
    with_cols = [t.batches is not None for t in traces]
    if any(with_cols) and not all(with_cols) and not histogram_only:
        a, b = with_cols.index(True), with_cols.index(False)
        raise InputError(
            f"{names[a]} has per-batch columns, {names[b]} is histogram-only: merge with --histogram-only "
            "to keep counts per size and request mixes only"
        )
    if all(with_cols) and not histogram_only:
        sets = [frozenset(t.batches or {}) for t in traces]
        if len(set(sets)) > 1:
            i = next(i for i, s in enumerate(sets) if s != sets[0])
            diff = sorted(sets[0] ^ sets[i])
            raise InputError(
                f"{names[0]} and {names[i]} carry different per-batch columns ({', '.join(diff)}): merge with --histogram-only"
            )
    seen: dict[tuple, str] = {}
    for t, n in zip(traces, names):
        for s in t.sources:
            digest = source_digest(s)
            if digest and not same_source_ok:
                key = (*digest, s.get("bytes"))
                if key in seen:
                    raise InputError(
                        f"the same log ({s.get('path')}, {digest[0]} {digest[1][:12]}...) is in {seen[key]} and {n}: "
                        "its batches would count twice"
                    )
                seen[key] = n


def _kind(t: PrefillTrace, name: str) -> str:
    if t.origin in _LOG_ORIGINS:
        return "log"
    if t.origin in _HISTOGRAM_ORIGINS:
        return "histogram"
    raise InputError(
        f"{name} is a {t.origin} trace: only traces from server logs (or plain histograms) merge; "
        "a simulation is one run (simulate the combined workload instead)"
    )


# ---- numbering ------------------------------------------------------------------------
def _numbering(lists: list[list[str]]) -> tuple[list[str], list[np.ndarray]]:
    """Names numbered in order of first appearance, and per input a lookup table from its
    index to the merged one (with -1 kept at the end for "none")."""
    index: dict[str, int] = {}
    luts = [np.array([index.setdefault(str(n), len(index)) for n in names] + [-1], np.int32) for names in lists]
    return list(index), luts


def _merged_groups(traces: list[PrefillTrace], offsets: list[int]) -> tuple[list[TraceGroup], list[np.ndarray]]:
    order: dict[str, list[TraceGroup]] = {}
    index: dict[str, int] = {}
    luts = []
    for t, off in zip(traces, offsets):
        lut = []
        for g in t.groups:
            key = g.key()
            order.setdefault(key, []).append(TraceGroup(**{**vars(g), "sources": [s + off for s in g.sources]}))
            lut.append(index.setdefault(key, len(index)))
        luts.append(np.array(lut + [-1], np.int32))
    if len(order) > MAX_GROUPS:
        raise InputError(f"the traces hold {len(order)} server configurations, at most {MAX_GROUPS} merge")
    return [merge_groups(members) for members in order.values()], luts


# ---- parts ----------------------------------------------------------------------------
def _merge_columns(traces, offsets, rank_luts, group_luts, consume: bool = False) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    for k in list(traces[0].batches):
        parts = []
        for t, off, rl, gl in zip(traces, offsets, rank_luts, group_luts):
            col = t.batches.pop(k) if consume else t.batches[k]
            if k == "source":
                col = (col + off).astype(col.dtype)
            elif k == "rank":
                col = rl[col]
            elif k == "group":
                col = gl[col]
            parts.append(col)
        out[k] = np.concatenate(parts) if len(parts) > 1 else parts[0]
        del parts
    return out


def _shifted(item: Any, offset: int) -> Any:
    """A record of one input (capture, startup line, sample) with its source index shifted."""
    if isinstance(item, dict) and isinstance(item.get("source"), int) and not isinstance(item.get("source"), bool):
        return {**item, "source": item["source"] + offset}
    return item


def _merge_stats(stats: list[dict[str, Any]], offsets: list[int]) -> dict[str, Any]:
    """Counts summed, samples concatenated (first SAMPLES_MAX kept), per-source rows
    concatenated: keys in order of first appearance."""
    out: dict[str, Any] = {}
    keys = list(dict.fromkeys(k for s in stats for k in s))
    for k in keys:
        values: list[tuple[Any, int]] = [(s.get(k), off) for s, off in zip(stats, offsets) if k in s]
        if all(isinstance(v, int) and not isinstance(v, bool) for v, _ in values):
            out[k] = sum(v for v, _ in values)
        elif all(isinstance(v, list) for v, _ in values):
            merged = [_shifted(x, off) for v, off in values for x in v]
            out[k] = merged if k == "per_source" else merged[:SAMPLES_MAX]
        elif all(isinstance(v, dict) for v, _ in values):
            out[k] = _sum_dicts([v for v, _ in values])
        else:
            out[k] = values[0][0]
    return out


def _sum_dicts(items: list[dict]) -> dict:
    out: dict = {}
    for d in items:
        for k, v in d.items():
            if isinstance(v, int) and not isinstance(v, bool) and isinstance(out.get(k, 0), int):
                out[k] = out.get(k, 0) + v
            else:
                out.setdefault(k, v)
    return out


def _merge_meta(traces: list[PrefillTrace], offsets: list[int], ranks: list[str], dropped: int) -> dict[str, Any]:
    meta: dict[str, Any] = {}
    for t in traces:  # keys of one input only (a workload, a live run's settings): the first one's
        for k, v in t.meta.items():
            meta.setdefault(k, v)
    meta["ranks"] = ranks
    labels: dict[str, int] = {}
    for t in traces:
        for name, n in (t.meta.get("graph_labels") or {}).items():
            labels[name] = labels.get(name, 0) + int(n)
    if any("graph_labels" in t.meta for t in traces):
        meta["graph_labels"] = labels
    for key in _EVENT_KEYS:
        if any(key in t.meta for t in traces):
            meta[key] = [_shifted(e, off) for t, off in zip(traces, offsets) for e in t.meta.get(key) or []][:EVENTS_MAX]
    dropped += sum(int(t.meta.get("captures_dropped") or 0) for t in traces)
    meta.pop("captures_dropped", None)
    if dropped:
        meta["captures_dropped"] = dropped
    meta.pop("rank_overlap", None)
    return meta


# A printer nearly all of whose records match another printer's prints copies of one batch
# (every TP rank writing the same line, a log collected twice); below it, the matches are
# coincidences of independent servers (same second, same sizes: chunk-saturated batches).
COPY_SHARE = 0.9


def rank_overlap(cols: dict[str, np.ndarray], n_ranks: int, n_groups: int | None = None) -> dict:
    """How many ranks (or files) print prefill lines, and how many records look like the
    same batch printed by several of them: the same configuration (group), second,
    #new-seq, #new-token and #cached-token, from printers at least COPY_SHARE of whose
    records match another's. Under DP attention each DP rank prints its own batch, so such
    records may be distinct forwards; a match is only a hint that lines were duplicated.
    With several configurations, `groups` gives the same per configuration."""
    rank = cols["rank"].astype(np.int64) + 1
    who = cols["source"].astype(np.int64) * (int(rank.max(initial=0)) + 1) + rank
    group = cols.get("group")
    group = np.zeros(len(who), np.int64) if group is None else group.astype(np.int64)
    n_groups = int(group.max()) + 1 if n_groups is None and len(group) else (n_groups or 0)
    uniq_who, who_i = _dense(who)
    # a printer of a configuration: (group, who) numbered densely
    pairs, pair_i = _dense(group * (uniq_who.size + 1) + who_i)
    out: dict[str, Any] = {"printers": int(uniq_who.size), "records_matching_another_printer": 0}
    copies = np.zeros(max(n_groups, 1), np.int64)
    if uniq_who.size >= 2 and len(who):
        ts = cols["timestamp"]
        sec = np.where(np.isnan(ts), -1, np.floor(np.nan_to_num(ts, nan=-1.0))).astype(np.int64)
        # records alike (group, second, sizes) share the high bits of one 64-bit word (a hash
        # of the five values), the printer is in its low bits: one sort of the words finds
        # them (a lexsort of five keys cost 0.5 s per million records); records that differ
        # share the high bits by a chance of about 2^-40 per pair, and that could only add a match
        bits = max(1, int(pairs.size - 1).bit_length())
        mask = np.uint64((1 << bits) - 1)
        word = np.sort(
            (_mix(group, sec, cols["new_seq"], cols["new_token"], cols["cached_token"]) & ~mask) | pair_i.astype(np.uint64)
        )
        high, low = word >> np.uint64(bits), (word & mask).astype(np.int64)
        starts = np.flatnonzero(np.concatenate(([True], high[1:] != high[:-1])))
        # a key spans several printers iff its least and greatest printer differ (sorted by printer last)
        ends = np.append(starts[1:], len(word)) - 1
        matched = np.repeat(low[starts] != low[ends], np.diff(np.append(starts, len(word))))
        per_pair = np.bincount(low, weights=matched, minlength=pairs.size)
        share = per_pair / np.bincount(low, minlength=pairs.size)
        kept = np.where(share >= COPY_SHARE, per_pair, 0).astype(np.int64)
        out["records_matching_another_printer"] = int(kept.sum())
        copies = np.bincount(pairs // (uniq_who.size + 1), weights=kept, minlength=max(n_groups, 1)).astype(np.int64)
    if n_groups > 1:
        printers = np.bincount(pairs // (uniq_who.size + 1), minlength=n_groups)
        out["groups"] = [
            {"printers": int(p), "records_matching_another_printer": int(c)} for p, c in zip(printers.tolist(), copies.tolist())
        ]
    return out


def _dense(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """np.unique(values, return_inverse=True) of non-negative integers, by counting when
    they are few (a printer's number: sources times ranks), else by sorting."""
    top = int(values.max(initial=-1)) + 1
    if top > 1 << 24:
        return np.unique(values, return_inverse=True)
    used = np.bincount(values, minlength=top) > 0
    lut = np.cumsum(used) - 1
    return np.flatnonzero(used), lut[values]


_MULTIPLIERS = (0x9E3779B97F4A7C15, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9, 0xD6E8FEB86659FD93, 0xFF51AFD7ED558CCD)


def _mix(*columns: np.ndarray) -> np.ndarray:
    """One 64-bit hash per row of integer columns (multiply-xorshift, wrapping)."""
    h = np.zeros(len(columns[0]), np.uint64)
    with np.errstate(over="ignore"):
        for col, m in zip(columns, _MULTIPLIERS):
            h ^= col.astype(np.int64).view(np.uint64) * np.uint64(m)
            h ^= h >> np.uint64(29)
            h *= np.uint64(0xBF58476D1CE4E5B9)
    return h


def join_given(trace: PrefillTrace) -> PrefillTrace:
    """The trace with each configuration whose settings were given for logs that state none
    (rotated logs read with `--launch`) joined to the one configuration its logs state
    that those settings name: every setting given agrees with the logged one (a setting
    the logs do not state is not a disagreement), the chunk per attention-DP rank too, and
    the forward tokens are counted alike (enable_mixed_chunk, unstated meaning SGLang's
    default, off). Settings that name no logged configuration, or several, stay a group of
    their own (core.trace.summary says which). The last step of a parse, after the merge of
    its files: a pairwise merge cannot know every configuration yet."""
    groups = trace.groups
    if not any(g.given for g in groups):
        return trace
    target: dict[int, int] = {}
    for i, g in enumerate(groups):
        if g.given:
            hits = [j for j, h in enumerate(groups) if not h.given and given_names(g, h)]
            if len(hits) == 1:
                target[i] = hits[0]
    if not target:
        return trace
    members: dict[int, list[int]] = {j: [j] for j in range(len(groups)) if j not in target}
    for i, j in target.items():
        members[j].append(i)
    kept = sorted(members)
    lut = np.zeros(len(groups) + 1, np.int32)
    lut[-1] = -1
    new_groups = []
    for new, j in enumerate(kept):
        lut[members[j]] = new
        merged = merge_groups([groups[m] for m in members[j]])
        merged.sources = sorted(set(merged.sources))
        merged.given = groups[j].given
        new_groups.append(merged)
    batches = trace.batches
    meta = dict(trace.meta)
    if batches is not None and "group" in batches:
        batches = {**batches, "group": lut[batches["group"]]}
        if "rank" in batches and "source" in batches:
            meta["rank_overlap"] = rank_overlap(batches, len(meta.get("ranks") or []), len(new_groups))
    return PrefillTrace(
        sizes=trace.sizes, counts=trace.counts, batches=batches, origin=trace.origin, sources=trace.sources,
        parse_stats=trace.parse_stats, captures=trace.captures, meta=meta, groups=new_groups,
    )  # fmt: skip


def given_names(given: TraceGroup, logged: TraceGroup) -> bool:
    """Whether settings given for logs that state none name a logged configuration (see
    join_given)."""
    return given_differs(given, logged) is None


def given_differs(given: TraceGroup, logged: TraceGroup) -> str | None:
    """The first setting in which settings given disagree with a logged configuration
    (`enable_mixed_chunk true, the logs false`), or None when they name it."""
    mine, theirs = given.settings, logged.settings
    for key, value in mine.items():
        if key != "enable_mixed_chunk" and theirs.get(key) is not None and theirs[key] != value:
            return f"{key} {_text(value)}, the logs {_text(theirs[key])}"
    a, b = mine.get("enable_mixed_chunk") is True, theirs.get("enable_mixed_chunk") is True
    if a != b:
        return f"enable_mixed_chunk {_text(a)}, the logs {_text(b)}"
    if given.rank_chunk is not None and logged.rank_chunk is not None and given.rank_chunk != logged.rank_chunk:
        return f"a chunk of {given.rank_chunk} per attention-DP rank, the logs {logged.rank_chunk}"
    return None


def _text(value: Any) -> str:
    return "true" if value is True else "false" if value is False else str(value)
