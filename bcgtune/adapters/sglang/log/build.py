"""Trace building: what one log yields becomes a trace of its own (file_trace: the forward
token rule applied, its launches grouped by configuration, its source with the XXH3-128 of
the bytes read, parse statistics, capture and startup lines), and the traces of several
logs are merged in input order (core.trace.merge: the same reduce `bcgtune trace merge`
and a distributed run use), so a parse of many files is the merge of their parses."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from bcgtune.adapters.sglang.log.columns import (
    LaunchEnds,
    Want,
    _FileResult,
    first_counts_running,
    inherit_first,
)
from bcgtune.adapters.sglang.log.grammar import MAX_CAPTURES, forward_tokens
from bcgtune.adapters.sglang.log.options import DEFAULT_OPTIONS, ParseOptions
from bcgtune.adapters.sglang.log.parallel import _input_size, _parse_files, _Progress
from bcgtune.adapters.sglang.log.rotation import previous_pieces
from bcgtune.core.stats import distinct
from bcgtune.core.trace.groups import (
    FORWARD_TOKENS_RULE_BY_LAUNCH,
    TraceGroup,
    group_from_batches,
    histogram_of,
    launch_settings,
    pairs_of,
    settings_key,
    sum_counters,
)
from bcgtune.core.trace.merge import join_given, merge_traces, rank_overlap
from bcgtune.core.trace.prefill_trace import PrefillTrace
from bcgtune.errors import InputError
from bcgtune.fileio import display_path as _display_path

__all__ = ["file_trace", "parse_logs", "rank_overlap"]


# The per-batch columns of a log's trace, in order (forward_tokens and group follow).
_COLUMN_ORDER = (
    "new_seq", "new_token", "cached_token", "running_req", "queue_req", "replay_token", "graph", "source", "line",
    "timestamp", "rank", "forward_iter",
)  # fmt: skip


def _no_records_error(paths: list[str], trace: PrefillTrace) -> InputError:
    where = ", ".join(_display_path(p) for p in paths)
    ps = trace.parse_stats
    bad = int(ps.get("malformed_prefill_lines") or 0)
    if bad:
        s = ps["malformed_samples"][0]
        return InputError(f"no readable prefill batch lines found ({bad} malformed, first at {s['path']}:{s['line']})", where)
    return InputError("no prefill batch lines found", where)


def _with_path(items: list[dict], where: str) -> list[dict]:
    return [dict(item, path=where) for item in items]


def _parse_stats(where: str, r: _FileResult, zero: int) -> dict[str, Any]:
    return {
        "lines": r.lines,
        "prefill_records": r.records,
        "decode_lines": r.decode_lines,
        "legacy_decode_lines": r.legacy_decode_lines,
        "capture_lines": r.capture_count,
        "startup_lines": r.startup_count,
        "graph_disabled_lines": r.disabled_count,
        "malformed_prefill_lines": r.malformed,
        "malformed_samples": _with_path(r.malformed_samples, where),
        "legacy_prefill_records": r.legacy,
        "wrapped_prefill_records": r.wrapped,
        "zero_token_records": zero,
        "per_source": [
            {
                "source": 0,
                "path": where,
                "lines": r.lines,
                "prefill_records": r.records,
                "decode_lines": r.decode_lines,
                "legacy_decode_lines": r.legacy_decode_lines,
                "capture_lines": r.capture_count,
                "malformed_prefill_lines": r.malformed,
                "overlong_lines": r.overlong,
                "head_cut_lines": r.head_cut,
                "glued_lines": r.glued,
                **({"launch_given": True} if any(seg.get("assumed") for seg in r.segments) else {}),
                **({"launch_from": _display_path(r.segments[0]["inherited"])} if "inherited" in r.segments[0] else {}),
            }
        ],
        "overlong_lines": r.overlong,
        "overlong_samples": _with_path(r.overlong_samples, where),
        "server_args_lines": r.server_args_count,
        "head_cut_lines": r.head_cut,
        "head_cut_samples": _with_path(r.head_cut_samples, where),
        "glued_lines": r.glued,
        "glued_samples": _with_path(r.glued_samples, where),
    }


def _launches(r: _FileResult) -> list[tuple[dict[str, Any], int | None]]:
    """(launch flags, scheduler chunk) of each launch in the log."""
    return [launch_settings(seg["server_args"], seg["startup"]) for seg in r.segments]


def rotated_firsts(paths: list[str], ends: list[LaunchEnds | None]) -> dict[int, dict]:
    """The launch each rotated piece continues (adapters/sglang/log/rotation.py): a piece
    whose first lines state no launch continues the one its older piece ended with, older
    pieces first so a chain of such pieces passes it on. ends: launch_ends of each parse
    (None: a parse that failed)."""
    prev = previous_pieces(paths)
    firsts: dict[int, dict] = {}
    tails: dict[int, dict | None] = {}
    for i in _chain_order(prev):
        e, p = ends[i], prev[i]
        if e is None:
            continue
        first = tails.get(p) if p is not None and e.first_unstated else None
        if first is not None:
            firsts[i] = first
        tails[i] = first if first is not None and e.one_launch else e.last
    return firsts


def continue_first(r: _FileResult, first: dict, want: Want) -> bool:
    """r's first launch continues `first`; True when r is a histogram counted otherwise."""
    counted = first_counts_running(r)
    inherit_first(r, first, want.mixed_chunk)
    return want.histogram_only and first_counts_running(r) != counted


def _chain_order(prev: list[int | None]) -> list[int]:
    """Indices with each piece after the piece before it."""
    out: list[int] = []
    seen: set[int] = set()
    for i in range(len(prev)):
        chain = []
        j: int | None = i
        while j is not None and j not in seen:
            chain.append(j)
            seen.add(j)
            j = prev[j]
        out += reversed(chain)
    return out


def _given(r: _FileResult, segs: list[int]) -> bool:
    """Whether launches `segs` all took the settings given for logs that state none."""
    return all("assumed" in r.segments[s] for s in segs)


def _configurations(launches, launched: list[int]) -> list[list[int]]:
    """Launches `launched` (ascending) grouped by configuration (equal settings_key), the
    groups in order of first batch."""
    by_key: dict[str, list[int]] = {}
    for s in launched:
        by_key.setdefault(settings_key(*launches[s]), []).append(s)
    return list(by_key.values())


def file_trace(path: str, r: _FileResult) -> PrefillTrace:
    """The trace of one log (its source is source 0): the map step of a parse. Each launch's
    batches count their forward tokens by its own settings (FORWARD_TOKENS_RULE_BY_LAUNCH)."""
    where = _display_path(path)
    launches = _launches(r)
    source: dict[str, Any] = {"path": where, "xxh128": r.xxh128, "bytes": r.nbytes}
    if path.endswith(".gz"):
        source["decompressed"] = True
    meta: dict[str, Any] = {
        "ranks": list(r.ranks),
        "forward_tokens_rule": FORWARD_TOKENS_RULE_BY_LAUNCH,
        "graph_labels": dict(r.graph_labels),
        "startup": list(r.startup),
        "graph_disabled": list(r.disabled),
        "server_args": list(r.server_args),
    }
    if r.capture_count > len(r.captures):
        meta["captures_dropped"] = r.capture_count - len(r.captures)
    common = {"origin": "sglang-log", "sources": [source], "captures": list(r.captures[:MAX_CAPTURES]), "meta": meta}
    if r.columns is not None:
        return _column_trace(r, launches, where, common)
    return _histogram_trace(r, launches, where, common)


def _column_trace(r: _FileResult, launches, where: str, common: dict) -> PrefillTrace:
    assert r.columns is not None
    # the columns move out of the parse result (it is not used again), so that dropping the
    # zero-token records frees each original column as its copy is made
    raw, r.columns = r.columns, None
    segment = raw.pop("segment")
    n = len(segment)
    cols = {k: np.zeros(n, np.int32) if k == "source" else raw.pop(k) for k in _COLUMN_ORDER}
    del raw
    mixed = np.array([flags.get("enable_mixed_chunk") is True for flags, _ in launches], np.bool_)
    fwd = forward_tokens(cols["new_token"], cols["replay_token"], cols["running_req"], False)
    if mixed.any():  # the launches that ran --enable-mixed-chunk also count their running decode rows
        fwd += np.where(mixed[segment], np.maximum(cols["running_req"], 0), 0)
    keep = fwd > 0
    zero = int(n - keep.sum())
    cols["forward_tokens"] = fwd
    del fwd
    if zero:
        for k in list(cols):
            cols[k] = cols[k][keep]
        segment = segment[keep]
    configs = _configurations(launches, distinct(segment).tolist())
    lut = np.full(len(launches) + 1, -1, np.int32)
    for gi, segs in enumerate(configs):
        lut[segs] = gi
    cols["group"] = lut[segment]
    rows_of: list = [slice(None)]  # one configuration: the columns themselves
    if len(configs) > 1:  # each configuration's rows, in line order
        order = np.argsort(cols["group"], kind="stable")
        rows_of = np.split(order, np.searchsorted(cols["group"][order], np.arange(1, len(configs))))
    groups = []
    for segs, sel in zip(configs, rows_of):
        # what merge_groups makes of the launches' own groups, counted once over their rows
        flags, chunk = launches[segs[0]]
        saturated = sum_counters([r.segments[s]["saturated"] for s in segs])
        g = group_from_batches(
            flags, chunk, [0], cols["forward_tokens"][sel], cols["new_seq"][sel], cols["graph"][sel], saturated
        )
        g.given = _given(r, segs)
        groups.append(g)
    trace = PrefillTrace.from_batches(cols, parse_stats=_parse_stats(where, r, zero), **common)
    trace.groups = groups
    return trace


def _histogram_group(r: _FileResult, launches, segs: list[int]) -> TraceGroup:
    """The group of launches `segs` (of one configuration) from their histograms: what
    merge_groups makes of their groups, counted once over all their pairs."""
    assert r.histograms is not None
    hs = [r.histograms[s] for s in segs]
    flags, chunk = launches[segs[0]]
    if len(segs) == 1:
        tokens, requests, counts = hs[0]["tokens"], hs[0]["requests"], hs[0]["counts"]
    else:
        tokens, requests, counts = pairs_of(*(np.concatenate([h[k] for h in hs]) for k in ("tokens", "requests", "counts")))
    sizes, size_counts = histogram_of(tokens, counts)
    return TraceGroup(
        flags, chunk, [0], sizes, size_counts, tokens, requests, counts,
        all(h["requests_known"] for h in hs), sum_counters([h["graph"] for h in hs]),
        sum_counters([r.segments[s]["saturated"] for s in segs]), _given(r, segs),
    )  # fmt: skip


def _histogram_trace(r: _FileResult, launches, where: str, common: dict) -> PrefillTrace:
    assert r.histograms is not None
    launched = [s for s, h in enumerate(r.histograms) if h["counts"].size]
    groups = [_histogram_group(r, launches, segs) for segs in _configurations(launches, launched)]
    zero = r.records - sum(int(g.counts.sum()) for g in groups)
    if groups:
        sizes, counts = histogram_of(np.concatenate([g.sizes for g in groups]), np.concatenate([g.counts for g in groups]))
    else:
        sizes, counts = np.empty(0, np.int64), np.empty(0, np.int64)
    common["meta"]["rank_overlap"] = {"printers": len(r.ranks) + bool(r.untagged), "records_matching_another_printer": None}
    return PrefillTrace(sizes=sizes, counts=counts, parse_stats=_parse_stats(where, r, zero), groups=groups, **common)


def parse_logs(
    paths: list[str],
    mixed_chunk: bool = False,
    *,
    jobs: int | None = None,
    progress: Callable[[int, int | None], None] | None = None,
    options: ParseOptions | None = None,
    histogram_only: bool = False,
    assumed_launch: dict[str, Any] | None = None,
) -> PrefillTrace:
    """Parse SGLang server logs (several files = several ranks or replicas, concatenated in
    the given order; `.gz` and `-` for stdin work) into a PrefillTrace with per-batch
    columns, sources (XXH3-128 of the bytes read, i.e. decompressed for .gz, as `xxh128sum`
    prints it), parse statistics, capture and startup lines, and its batches grouped by the
    launch settings each log states (core.trace.groups).

    jobs: worker processes for several files (default: the cores this process may use;
    at most one per file); the trace is identical to a serial parse. Inputs smaller than
    options.parallel_min_bytes in all parse serially. progress: called after each chunk with
    (bytes consumed so far, total bytes or None when unknown, e.g. stdin); compressed
    bytes for .gz. histogram_only: keep counts per size and request mixes per group, not
    per-batch columns (memory flat in the logs' length). assumed_launch: the settings of the
    launches whose log states none (rotated logs), as a server_args line states them
    (core.trace.groups.logged_form); logged settings always win, and the launches given
    settings join the one logged configuration they name (core.trace.merge.join_given).
    mixed_chunk: count the running decode rows in the forward tokens of launches whose
    settings (logged or given) do not state enable_mixed_chunk.

    Raises InputError naming the file when a file cannot be read, is binary, or no input
    holds a prefill line; KeyboardInterrupt stops the workers and is raised here."""
    paths = list(paths)
    if not paths:
        raise InputError("no log file given", "--log")
    if paths.count("-") > 1:
        raise InputError("stdin ('-') can be read once only", "<stdin>")
    sizes = [_input_size(p) for p in paths]
    want = Want.of(mixed_chunk, histogram_only, assumed_launch)
    # rotated pieces are parsed after the piece before them, by the launch it ended with (Continuations)
    # each log's trace made where it was parsed (a worker process, for several files)
    traces = _parse_files(paths, jobs, _Progress(progress, sizes), options or DEFAULT_OPTIONS, want, file_trace)
    trace = join_given(merge_traces(traces, names=[_display_path(p) for p in paths], same_source_ok=True, consume=True))
    del traces
    if trace.n_batches == 0:
        raise _no_records_error(paths, trace)
    return trace
