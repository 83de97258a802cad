"""What `bcgtune trace` reports about a trace from server logs: a pure, typed summary
(`summarize`), rendered by bcgtune/cli/render/trace.py. The capture analysis applies SGLang's
replay rule (core/sglang/replay.py) to the traced sizes with the buckets the server logged."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

import numpy as np

from bcgtune.core.sglang.replay import DEFAULT_PADDING_FACTOR, assign_buckets
from bcgtune.core.trace.groups import (
    FORWARD_TOKENS_RULE,
    FORWARD_TOKENS_RULE_BY_LAUNCH,
    FORWARD_TOKENS_RULE_MIXED,
    TraceGroup,
    attention_dp_ranks,
    mixed_chunk_signature,
    unlogged_mixed_chunk,
)
from bcgtune.core.trace.merge import given_differs
from bcgtune.core.trace.prefill_trace import CapturedList, PrefillTrace, source_digest

MAX_SAMPLES_SHOWN = 3


@dataclass
class Percentiles:
    p50: int
    p90: int
    p99: int
    max: int


@dataclass
class GraphFlag:
    """The `cuda graph: True/False` field of prefill lines."""

    flagged_batches: int
    replayed: int
    eager: int
    replayed_pct: float
    labels: dict[str, int]


@dataclass
class BucketUsage:
    bucket: int
    served: int  # batches the rule sends to this bucket
    replayed: int | None = None  # of those, flagged as replayed (logs with the graph flag)
    ran_eager: int | None = None
    unknown: int | None = None


@dataclass(frozen=True)
class CapturedUsage(CapturedList):
    """The captured list and how the traced batches used it."""

    per_bucket: list[BucketUsage]
    servable_batches: int
    not_servable_batches: int
    unused_buckets: list[int]
    not_servable_but_replayed: int | None = None


@dataclass
class Malformed:
    count: int
    samples: list[dict[str, Any]]


@dataclass
class GroupSummary:
    """One server configuration of the trace (core/trace/groups.py)."""

    group: int
    label: str
    settings: dict[str, Any]
    batches: int
    sources: int
    p50: int
    max: int
    captured_buckets: int | None  # graphs its servers logged capturing (the last complete list)
    files: list[str] = field(default_factory=list)  # the logs its batches come from


@dataclass
class TraceSummary:
    batches: int
    distinct_sizes: int
    tokens: int
    percentiles: Percentiles | None
    forward_tokens_rule: str | None
    sources: list[dict[str, Any]]
    lines: int | None
    decode_lines: int | None
    legacy_decode_lines: int | None
    graph: GraphFlag | None
    ranks: dict[str, int]
    captured: CapturedUsage | None
    capture_lines: int
    graph_disabled: list[str]
    malformed: Malformed
    notes: list[str] = field(default_factory=list)
    groups: list[GroupSummary] = field(default_factory=list)
    head_cut: Malformed | None = None  # prefill lines whose head was cut off (not counted)
    glued: Malformed | None = None  # physical lines holding several log lines
    hints: list[str] = field(default_factory=list)  # what to rerun differently
    warnings: list[str] = field(default_factory=list)  # launch settings the batches contradict
    histogram_only: bool = False
    launch: str | None = None  # the one configuration's launch settings, as the logs state them

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _usage(trace: PrefillTrace, cap: CapturedList, factor: float) -> CapturedUsage:
    b = trace.batches or {}
    fwd = b.get("forward_tokens")
    if fwd is None:  # histogram-only trace: weights per size
        sizes, weights, graph = trace.sizes, trace.counts, None
    else:
        sizes, weights = fwd, np.ones(len(fwd), dtype=np.int64)
        graph = b.get("graph")
    chosen, replay = assign_buckets(sizes, cap.buckets, factor)
    rows = []
    for bucket in cap.buckets:
        sel = replay & (chosen == bucket)
        row = BucketUsage(bucket=int(bucket), served=int(weights[sel].sum()))
        if graph is not None:
            g = graph[sel]
            row.replayed, row.ran_eager, row.unknown = int((g == 1).sum()), int((g == 0).sum()), int((g < 0).sum())
        rows.append(row)
    return CapturedUsage(
        **{f.name: getattr(cap, f.name) for f in fields(CapturedList)},
        per_bucket=rows,
        servable_batches=int(weights[replay].sum()),
        not_servable_batches=int(weights[~replay].sum()),
        unused_buckets=[r.bucket for r in rows if r.served == 0],
        not_servable_but_replayed=int(((graph == 1) & ~replay).sum()) if graph is not None else None,
    )


def _graph_flag(trace: PrefillTrace) -> GraphFlag | None:
    graph = (trace.batches or {}).get("graph")
    if graph is None and trace.groups:  # histogram-only: counted per group
        replayed = sum(int(g.graph.get("replayed", 0)) for g in trace.groups)
        flagged = replayed + sum(int(g.graph.get("eager", 0)) for g in trace.groups)
        if not flagged:
            return None
        return GraphFlag(
            flagged,
            replayed,
            flagged - replayed,
            round(100.0 * replayed / flagged, 2),
            dict(trace.meta.get("graph_labels") or {}),
        )
    if graph is None or not (graph >= 0).any():
        return None
    flagged = int((graph >= 0).sum())
    replayed = int((graph == 1).sum())
    return GraphFlag(
        flagged, replayed, flagged - replayed, round(100.0 * replayed / flagged, 2), dict(trace.meta.get("graph_labels") or {})
    )


def _ranks(trace: PrefillTrace) -> dict[str, int]:
    ranks = trace.meta.get("ranks") or []
    rank_col = (trace.batches or {}).get("rank")
    if not ranks or rank_col is None:
        return {}
    counts = np.bincount(rank_col[rank_col >= 0], minlength=len(ranks))
    out = {str(r): int(c) for r, c in zip(ranks, counts.tolist())}
    untagged = int((rank_col < 0).sum())
    if untagged:
        out["(none)"] = untagged
    return out


def _which(trace: PrefillTrace, i: int) -> str:
    return f"group {i} ({trace.groups[i].label()})" if len(trace.groups) > 1 else "the server"


def _notes(trace: PrefillTrace) -> list[str]:
    ps, meta = trace.parse_stats or {}, trace.meta or {}
    notes = []
    overlap = meta.get("rank_overlap") or {}
    per_group = overlap.get("groups") if len(trace.groups) > 1 else None
    if overlap.get("printers", 1) > 1:
        notes.append(
            f"{overlap['printers']} ranks/files print prefill lines; every line is kept as its own "
            "forward (under DP attention each DP rank runs its own batch)"
        )
    for i, o in enumerate(per_group or [overlap]):
        if isinstance(o, dict) and o.get("records_matching_another_printer"):
            where = f" of {_which(trace, i)}" if per_group else ""
            notes.append(
                f"{o['records_matching_another_printer']} records{where} match a record of another "
                "rank/file of it (same second and sizes, from ranks/files nearly all of whose records do): if those are "
                "copies of one batch rather than distinct DP batches, trace one rank only"
            )
    for key, text in (
        ("zero_token_records", "records with 0 forward tokens left out"),
        ("wrapped_prefill_records", "records were wrapped over several lines"),
        ("legacy_prefill_records", "records in the pre-2024 'new fill batch' form"),
        ("overlong_lines", "lines over the line-length limit were skipped"),
    ):
        if ps.get(key):
            notes.append(f"{ps[key]} {text}")
    notes += _given_notes(trace, ps)
    cont = [
        (str(e.get("path")), str(e["launch_from"]))
        for e in ps.get("per_source") or []
        if isinstance(e, dict) and e.get("launch_from")
    ]
    if cont:
        notes.append(
            f"{len(cont)} rotated file(s) state no launch of their own and continue the one their older piece ended with: "
            + _shown([f"{a} (from {b})" for a, b in cont])
        )
    return notes


def _shown(names: list[str], most: int = 3) -> str:
    return ", ".join(names[:most]) + (f" and {len(names) - most} more" if len(names) > most else "")


def _given_notes(trace: PrefillTrace, ps: dict[str, Any]) -> list[str]:
    """Which files took the launch settings given (--launch), and the configuration they
    joined, or why they stayed a configuration of their own."""
    rows = ps.get("per_source") or []
    given = {i for i, e in enumerate(rows) if isinstance(e, dict) and e.get("launch_given")}
    if not given:
        return []
    names = trace.source_names()
    out = []
    for i, g in enumerate(trace.groups):
        mine = [names[s] for s in g.sources if s in given and s < len(names)]
        if not mine:
            continue
        text = f"launch settings given with --launch, not logged, for {len(mine)} file(s): {_shown(mine)}"
        if len(trace.groups) > 1:
            text += f": {_given_outcome(trace, i)}"
        out.append(text)
    return out


def _given_outcome(trace: PrefillTrace, i: int) -> str:
    g = trace.groups[i]
    if not g.given:
        return f"they joined {_which(trace, i)}, the configuration the settings name"
    logged = [(j, h) for j, h in enumerate(trace.groups) if not h.given]
    if not logged:
        return f"they are {_which(trace, i)} (no log states its launch settings)"
    named = [j for j, h in logged if given_differs(g, h) is None]
    if len(named) > 1:
        return (
            f"they name {len(named)} of the configurations the logs state (groups {', '.join(map(str, named))}), so they "
            f"stay {_which(trace, i)}: give a setting that tells those apart"
        )
    reasons = "; ".join(f"group {j}: {given_differs(g, h)}" for j, h in logged[:4])
    return f"they name none of the configurations the logs state, so they stay {_which(trace, i)} ({reasons})"


def _forward_rule(trace: PrefillTrace) -> str | None:
    """How forward tokens were counted, naming only the fields the log had (and, when the
    configurations count them differently, which ones count the running decode rows)."""
    rule = trace.meta.get("forward_tokens_rule")
    if not isinstance(rule, str):
        return None
    if rule == FORWARD_TOKENS_RULE_BY_LAUNCH:
        mixed = [i for i, g in enumerate(trace.groups) if g.settings.get("enable_mixed_chunk") is True]
        if not mixed:
            rule = FORWARD_TOKENS_RULE
        elif len(mixed) == len(trace.groups):
            rule = FORWARD_TOKENS_RULE_MIXED
        else:
            rule = (
                f"{FORWARD_TOKENS_RULE}; + running_req in group{'s' if len(mixed) > 1 else ''} "
                + ", ".join(map(str, mixed))
                + " (mixed chunk)"
            )
    replay = (trace.batches or {}).get("replay_token")
    if "replay_token" in rule and (replay is None or not (replay >= 0).any()):
        rule = rule.replace(" + replay_token", "")
    return rule


def _groups(trace: PrefillTrace) -> list[GroupSummary]:
    out = []
    names = trace.source_names()
    for i, g in enumerate(trace.groups):
        view = trace.group_view(i, batches=False)
        cap = view.captured_list()
        out.append(
            GroupSummary(
                group=i, label=g.label(), settings=dict(g.settings), batches=g.n_batches, sources=len(g.sources),
                p50=view.percentile(50), max=int(g.sizes[-1]), captured_buckets=len(cap.buckets) if cap else None,
                files=[names[s] for s in g.sources if 0 <= s < len(names)],
            )
        )  # fmt: skip
    return out


def _lines(ps: dict[str, Any], count_key: str, samples_key: str) -> Malformed | None:
    n = int(ps.get(count_key) or 0)
    if not n:
        return None
    samples = [
        {"where": f"{s.get('path', s.get('source'))}:{s.get('line')}", "text": s.get("text")}
        for s in (ps.get(samples_key) or [])[:MAX_SAMPLES_SHOWN]
    ]
    return Malformed(count=n, samples=samples)


def _mixed_known(trace: PrefillTrace, g: TraceGroup) -> bool:
    """Whether the group's mixed-chunk setting is known (logged, given, or --mixed-chunk;
    an older trace's one rule for every batch)."""
    if trace.meta.get("forward_tokens_rule") == FORWARD_TOKENS_RULE_BY_LAUNCH:
        return isinstance(g.settings.get("enable_mixed_chunk"), bool)
    return bool(trace.meta.get("mixed_chunk"))


def _hints(trace: PrefillTrace) -> list[str]:
    """What the user should rerun differently: the --mixed-chunk hint for a group whose
    mixed-chunk setting no log states nor was given, when its chunk-saturated batches carry
    the mixed-chunk signature and no chunk explains them otherwise."""
    out = []
    for i, g in enumerate(trace.groups):
        if _mixed_known(trace, g):
            continue
        which = _which(trace, i)
        if g.rank_chunk is not None and mixed_chunk_signature(g.saturated):
            n = g.saturated.get("chunk_minus_running", 0)
            out.append(
                f"{n} chunk-saturated batches of {which} log #new-token + #running-req = the chunk ({g.rank_chunk}): "
                "it ran --enable-mixed-chunk; trace again with --mixed-chunk to count the decode rows in each forward"
            )
        elif g.rank_chunk is None and (found := unlogged_mixed_chunk(g.saturated)) is not None:
            chunk, n = found
            out.append(
                f"{n} batches of {which} log the same largest #new-token + #running-req ({chunk:,}) and no chunk "
                f"explains their sizes otherwise: its chunk is not logged, but it looks like a server with chunk {chunk} "
                f"and --enable-mixed-chunk; trace again with --mixed-chunk --launch chunked_prefill_size={chunk}"
            )
    return out


def _warnings(trace: PrefillTrace) -> list[str]:
    """Launch settings the batches contradict: a chunk per attention-DP rank below the
    largest batch (SGLang's scheduler never forms a batch above it,
    srt/managers/schedule_policy.py, PrefillAdder: rem_chunk_tokens)."""
    out = []
    for i, g in enumerate(trace.groups):
        chunk, largest = g.rank_chunk, int(g.sizes[-1]) if g.sizes.size else 0
        if chunk is None or chunk <= 0 or largest <= chunk:
            continue
        ranks = attention_dp_ranks(g.settings)
        how = "given with --launch" if g.given else "as logged"
        per = f" per attention-DP rank ({g.settings.get('chunked_prefill_size')} / {ranks} ranks)" if ranks > 1 else ""
        out.append(
            f"{_which(trace, i)}: its launch settings ({how}) give a chunk of {chunk:,} tokens{per}, but its batches "
            f"reach {largest:,} tokens: these settings do not describe the servers that wrote the logs"
            + ("; give the settings they ran (--launch)" if g.given else "")
        )
    return out


def _source_summary(s: dict[str, Any]) -> dict[str, Any]:
    """A source's path, the digest of its bytes it records (xxh128, or sha256 in an older
    trace) and its size."""
    out: dict[str, Any] = {"path": s.get("path")}
    digest = source_digest(s)
    if digest:
        out[digest[0]] = digest[1]
    out["bytes"] = s.get("bytes")
    return out


def summarize(trace: PrefillTrace, factor: float = DEFAULT_PADDING_FACTOR) -> TraceSummary:
    """Everything `bcgtune trace` reports. With several server configurations, the
    captured-list analysis is per group (each group's own list): see `groups`."""
    ps = trace.parse_stats or {}
    cap = trace.captured_list() if len(trace.groups) <= 1 else None
    return TraceSummary(
        batches=trace.n_batches,
        distinct_sizes=int(trace.sizes.size),
        tokens=trace.n_tokens,
        percentiles=Percentiles(trace.percentile(50), trace.percentile(90), trace.percentile(99), int(trace.sizes[-1]))
        if trace.n_batches
        else None,
        forward_tokens_rule=_forward_rule(trace),
        sources=[_source_summary(s) for s in trace.sources if isinstance(s, dict)],
        lines=ps.get("lines"),
        decode_lines=ps.get("decode_lines"),
        legacy_decode_lines=ps.get("legacy_decode_lines"),
        graph=_graph_flag(trace),
        ranks=_ranks(trace),
        captured=_usage(trace, cap, factor) if cap is not None else None,
        capture_lines=len(trace.captures),
        graph_disabled=[str(d.get("text")) for d in (trace.meta.get("graph_disabled") or [])][:MAX_SAMPLES_SHOWN],
        malformed=Malformed(
            count=int(ps.get("malformed_prefill_lines", 0)),
            samples=[
                {"where": f"{s.get('path', s.get('source'))}:{s.get('line')}", "text": s.get("text")}
                for s in (ps.get("malformed_samples") or [])[:MAX_SAMPLES_SHOWN]
            ],
        ),
        notes=_notes(trace),
        groups=_groups(trace) if len(trace.groups) > 1 else [],
        launch=trace.groups[0].label() if len(trace.groups) == 1 and trace.groups[0].settings else None,
        head_cut=_lines(ps, "head_cut_lines", "head_cut_samples"),
        glued=_lines(ps, "glued_lines", "glued_samples"),
        hints=_hints(trace),
        warnings=_warnings(trace),
        histogram_only=trace.histogram_only,
    )
