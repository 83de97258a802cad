"""Group a trace's prefill records into DP-attention steps (bcgtune.core.plan.dp_steps).

Under DP attention each attention-DP rank prints its own prefill line (its attention-TP rank
0 logs; the prefix carries `DPn`, srt/managers/scheduler.py `configure_scheduler_process`),
and the ranks run every scheduler iteration together. Which lines belong to one iteration is
read, in this order of preference, from:

  1. a simulated trace's `step` column: exact.
  2. the iteration counter of `Prefill batch [N],` (SGLANG_LOG_FORWARD_ITERS): `N` is the
     scheduler's `forward_ct` as of the batch's run (scheduler.py `run_batch`), and every
     rank runs a batch (an idle one if it has no work) in every iteration where any rank
     has work, so ranks count alike: equal N on different ranks is one step. Exact. A
     counter that goes back on a rank (a restart) starts a new epoch of steps.
  3. millisecond timestamps (SGLANG_LOG_MS): the ranks print one step's lines within
     milliseconds of each other (they synchronize every iteration), and one rank's lines
     are at least a forward apart. Records sorted by time form a step while they lie
     within `tolerance` of the step's first record and no rank repeats; the tolerance is
     20 ms or half the shortest gap between two lines of one rank, whichever is smaller.
     A good guess on one host; ranks on hosts whose clocks disagree by more than the
     tolerance are split into separate steps.
  4. timestamps to the second (SGLang's default): the records of one second form a step
     when no rank printed twice in that second; a guess (two ranks' lines in one second
     may come from different steps up to a second apart). In seconds where some rank
     printed twice, the records are not grouped.

A record that cannot be grouped (no DP tag, no counter or timestamp, a rank already seen in
its step, a second with repeats) is priced as a step of its own, the other ranks idle, and
counted in `ungrouped`. When the same DP rank appears in several files, each file is taken
as a different server (replicas); otherwise the files are the ranks of one server. Logs do
not say which ranks were decoding during another rank's prefill step (SGLang converts their
decode rows to one-token extends that vote and pad like the others): such ranks count as
idle, with a vote of yes and the whole bucket as padding. The simulator records them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from bcgtune.core.plan.dp_steps import RANKS_MAX, DPSteps
from bcgtune.errors import InputError

_DP_TAG_RE = re.compile(r"(?:^|\s)DP(\d+)(?=\s|$)")
MS_TOLERANCE_S = 0.020
_EPOCH = 1 << 40  # keys: epoch * _EPOCH + counter (counters stay far below)

RULE_SIMULATED = "simulated lockstep iterations"
RULE_ITERATION = "iteration counters of the prefill lines (Prefill batch [N])"
RULE_MS = "millisecond timestamps"
RULE_SECONDS = "timestamps to the second (a guess: lines of one second form a step when no rank printed twice in it)"


@dataclass(frozen=True)
class StepGrouping:
    """The steps of a trace, or why there are none. `records`: prefill records read;
    `ungrouped`: of them, records priced as a step of their own; `decode_votes`: decoding
    ranks' rows in prefill steps (simulated traces) that vote and pad with the step."""

    steps: DPSteps | None
    rule: str | None
    records: int
    ungrouped: int = 0
    decode_votes: int = 0
    reason: str | None = None


def dp_index(tag: str | None) -> int | None:
    """The DP rank in an SGLang log prefix's rank tag ('DP3 TP3' -> 3), or None."""
    if not tag:
        return None
    m = _DP_TAG_RE.search(tag)
    return int(m.group(1)) if m else None


def group_steps(trace, ranks: int, tolerance_s: float | None = None) -> StepGrouping:
    """Steps of `trace` (a PrefillTrace) on `ranks` attention-DP ranks; see the module
    docstring for the rules. Raises InputError when the trace names a DP rank >= ranks."""
    if not 1 <= ranks <= RANKS_MAX:
        raise InputError(f"must be within 1..{RANKS_MAX}, got {ranks}", field="attention_dp_size")
    cols = trace.batches or {}
    tokens = cols.get("forward_tokens")
    if tokens is None or len(tokens) == 0:
        return StepGrouping(None, None, 0, reason="the trace is a size histogram: it has no per-batch rank information")
    tokens = np.asarray(tokens, dtype=np.int64)
    n = tokens.size
    requests = np.asarray(cols["new_seq"], dtype=np.int64) if "new_seq" in cols else np.ones(n, dtype=np.int64)
    requests = np.where(requests >= 1, np.minimum(requests, tokens), 1)
    tags = list((trace.meta or {}).get("ranks") or [])
    rank_col = np.asarray(cols["rank"], dtype=np.int64) if "rank" in cols else np.full(n, -1, dtype=np.int64)
    dp_of_tag = np.array([-1 if (d := dp_index(t)) is None else d for t in tags] + [-1], dtype=np.int64)
    dp = dp_of_tag[np.where((rank_col >= 0) & (rank_col < len(tags)), rank_col, len(tags))]
    if not (dp >= 0).any():
        return StepGrouping(
            None,
            None,
            n,
            reason="no record carries a DP rank tag (`DPn` in the log line's prefix), "
            "so records cannot be grouped into steps across ranks",
        )
    if int(dp.max()) >= ranks:
        raise InputError(
            f"the trace has records of DP rank {int(dp.max())}, but the layout has {ranks} attention-DP ranks",
            field="attention_dp_size",
        )
    source = np.asarray(cols["source"], dtype=np.int64) if "source" in cols else np.zeros(n, dtype=np.int64)
    tagged = dp >= 0
    # a DP rank logged in several files: each file is its own server
    pairs = np.unique(np.stack([dp[tagged], source[tagged]]), axis=1)
    server = source if np.unique(pairs[0]).size < pairs.shape[1] else np.zeros(n, dtype=np.int64)

    decode_key = np.zeros(0, dtype=np.int64)
    decode_rows = np.zeros(0, dtype=np.int64)
    if "step" in cols:
        rule = RULE_SIMULATED
        key = np.asarray(cols["step"], dtype=np.int64)
        ok = tagged & (key >= 0)
        votes = ((trace.meta or {}).get("dp_attention") or {}).get("decode_votes") or {}
        if votes:
            decode_key = np.asarray(votes.get("step", []), dtype=np.int64)
            decode_rows = np.asarray(votes.get("rows", []), dtype=np.int64)
            decode_rank = np.asarray(votes.get("rank", []), dtype=np.int64)
            if not (decode_key.size == decode_rows.size == decode_rank.size) or (decode_rank >= ranks).any():
                raise InputError("the trace's decode votes do not fit its steps and ranks", field="attention_dp_size")
    elif "forward_iter" in cols and (np.asarray(cols["forward_iter"])[tagged] >= 0).all():
        rule = RULE_ITERATION
        key = _epochs(np.asarray(cols["forward_iter"], dtype=np.int64), dp, server, tagged)
        ok = tagged
    elif "timestamp" in cols and np.isfinite(np.asarray(cols["timestamp"], dtype=np.float64)[tagged]).any():
        ts = np.asarray(cols["timestamp"], dtype=np.float64)
        ok = tagged & np.isfinite(ts)
        if (ts[ok] != np.floor(ts[ok])).any():
            rule = RULE_MS
            key, ok = _time_clusters(ts, dp, server, ok, tolerance_s)
        else:
            rule = RULE_SECONDS
            key, ok = _seconds(ts, dp, server, ok)
    else:
        return StepGrouping(
            None,
            None,
            n,
            reason="the records carry DP rank tags but neither iteration counters nor "
            "timestamps, so records of one step cannot be matched across ranks",
        )
    key = np.where(ok, key, 0)
    # one vote per (server, step, rank): a repeat is not grouped
    cand = np.flatnonzero(ok)
    order = cand[np.lexsort((cand, dp[cand], key[cand], server[cand]))]
    srt = np.stack([server[order], key[order], dp[order]])
    repeat = np.zeros(n, dtype=bool)
    repeat[order[1:]] = (srt[:, 1:] == srt[:, :-1]).all(axis=0)
    ok = ok & ~repeat
    alone = ~ok
    ungrouped = int(alone.sum())
    # step keys: (server, key) for grouped records, a fresh key for each ungrouped one
    _, gid = np.unique(np.stack([server[ok], key[ok]]), axis=1, return_inverse=True)
    gid = np.asarray(gid).reshape(-1)
    step_id = np.empty(n, dtype=np.int64)
    step_id[ok] = gid
    n_grouped = int(gid.max()) + 1 if gid.size else 0
    step_id[alone] = n_grouped + np.arange(ungrouped)
    all_key, all_tok, all_req = step_id, tokens, requests
    if decode_key.size:
        # decode votes of simulated steps: map their step keys onto the grouped steps
        known = {int(k): int(g) for k, g in zip(key[ok].tolist(), gid.tolist())}
        mapped = np.array([known.get(int(k), -1) for k in decode_key.tolist()], dtype=np.int64)
        keep = (mapped >= 0) & (decode_rows > 0)
        all_key = np.concatenate([all_key, mapped[keep]])
        all_tok = np.concatenate([all_tok, decode_rows[keep]])
        all_req = np.concatenate([all_req, decode_rows[keep]])
        n_dec = int(keep.sum())
    else:
        n_dec = 0
    steps = DPSteps.from_votes(all_key, all_tok, ranks, all_req)
    return StepGrouping(steps, rule, n, ungrouped=ungrouped, decode_votes=n_dec)


def _epochs(counter: np.ndarray, dp: np.ndarray, server: np.ndarray, tagged: np.ndarray) -> np.ndarray:
    """Counter keys with an epoch per rank: a counter lower than the rank's previous one (a
    restarted server) starts the next epoch."""
    key = counter.copy()
    idx = np.flatnonzero(tagged)
    order = idx[np.lexsort((idx, dp[idx], server[idx]))]
    c = counter[order]
    same = np.concatenate([[False], (dp[order][1:] == dp[order][:-1]) & (server[order][1:] == server[order][:-1])])
    back = same & np.concatenate([[False], c[1:] < c[:-1]])
    # epoch = backward jumps so far within the (server, rank) run
    run = np.cumsum(~same)
    jumps = np.cumsum(back)
    first = np.zeros(run.max() + 1 if run.size else 1, dtype=np.int64)
    first[run[::-1]] = (jumps - back)[::-1]  # jumps before each run's first record
    epoch = jumps - first[run]
    key[order] = epoch * _EPOCH + c
    return key


def _time_clusters(
    ts: np.ndarray, dp: np.ndarray, server: np.ndarray, ok: np.ndarray, tolerance_s: float | None
) -> tuple[np.ndarray, np.ndarray]:
    """Millisecond stamps: per server, records in time order form a step while within the
    tolerance of the step's first record and no rank repeats."""
    key = np.full(ts.size, -1, dtype=np.int64)
    idx = np.flatnonzero(ok)
    order = idx[np.lexsort((idx, ts[idx], server[idx]))]
    tol = MS_TOLERANCE_S if tolerance_s is None else float(tolerance_s)
    # half the shortest gap between two lines of one rank (ranks run one step at a time)
    o2 = idx[np.lexsort((ts[idx], dp[idx], server[idx]))]
    same = (dp[o2][1:] == dp[o2][:-1]) & (server[o2][1:] == server[o2][:-1])
    gaps = np.diff(ts[o2])[same]
    gaps = gaps[gaps > 0]
    if gaps.size and tolerance_s is None:
        tol = min(tol, float(gaps.min()) / 2)
    step = -1
    first_t = -np.inf
    seen: set[int] = set()
    cur_server = None
    for i in order.tolist():
        r = int(dp[i])
        if server[i] != cur_server or ts[i] - first_t > tol or r in seen:
            step += 1
            first_t = ts[i]
            seen = set()
            cur_server = server[i]
        seen.add(r)
        key[i] = step
    return key, ok.copy()


def _seconds(ts: np.ndarray, dp: np.ndarray, server: np.ndarray, ok: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Whole-second stamps: one step per (server, second) where no rank printed twice; the
    records of other seconds are not grouped."""
    sec = np.where(ok, ts, 0).astype(np.int64)
    idx = np.flatnonzero(ok)
    trip = np.stack([server[idx], sec[idx], dp[idx]])
    _, inv, cnt = np.unique(trip, axis=1, return_inverse=True, return_counts=True)
    twice = cnt[np.asarray(inv).reshape(-1)] > 1
    pair = np.stack([server[idx], sec[idx]])
    _, pinv = np.unique(pair, axis=1, return_inverse=True)
    pinv = np.asarray(pinv).reshape(-1)
    bad_pair = np.zeros(pinv.max() + 1 if pinv.size else 1, dtype=bool)
    np.logical_or.at(bad_pair, pinv, twice)
    good = ok.copy()
    good[idx] = ~bad_pair[pinv]
    return sec, good
