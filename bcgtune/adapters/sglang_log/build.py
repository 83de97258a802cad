"""Trace building: the merged columns of every log into one PrefillTrace, with the forward
token rule applied, sources (sha256 of the bytes read), parse statistics, capture and
startup lines, and how many ranks printed the same batch."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from bcgtune.adapters.sglang_log.columns import _FileResult, _merge_columns
from bcgtune.adapters.sglang_log.grammar import (
    FORWARD_TOKENS_RULE,
    FORWARD_TOKENS_RULE_MIXED,
    MAX_CAPTURES,
    MAX_MALFORMED_SAMPLES,
    MAX_META_EVENTS,
    forward_tokens,
)
from bcgtune.adapters.sglang_log.options import DEFAULT_OPTIONS, ParseOptions
from bcgtune.adapters.sglang_log.parallel import _input_size, _parse_files, _Progress
from bcgtune.core.trace import PrefillTrace
from bcgtune.errors import InputError
from bcgtune.fileio import display_path as _display_path


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
    options: ParseOptions | None = None,
) -> PrefillTrace:
    """Parse SGLang server logs (several files = several ranks or replicas, concatenated in
    the given order; `.gz` and `-` for stdin work) into a PrefillTrace with per-batch
    columns, sources (sha256 of the bytes read, i.e. decompressed for .gz), parse
    statistics, capture lines and startup lines.

    jobs: worker processes for several files (default: the cores this process may use;
    at most one per file); the trace is identical to a serial parse. Inputs smaller than
    options.parallel_min_bytes in all parse serially. progress: called after each chunk with
    (bytes consumed so far, total bytes or None when unknown, e.g. stdin); compressed
    bytes for .gz.

    Raises InputError naming the file when a file cannot be read, is binary, or no input
    holds a prefill line; KeyboardInterrupt stops the workers and is raised here."""
    paths = list(paths)
    if not paths:
        raise InputError("no log file given", "--log")
    if paths.count("-") > 1:
        raise InputError("stdin ('-') can be read once only", "<stdin>")
    sizes = [_input_size(p) for p in paths]
    results = _parse_files(paths, jobs, _Progress(progress, sizes), options or DEFAULT_OPTIONS)
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
