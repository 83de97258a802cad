"""A trace's batches replayed one after another, in trace order, under several bucket lists
(and eager), on one engine: what the calibration's model check and `bcgtune tune`'s proof
run measure.

Every list's buckets are captured once into one pool (a replay does not depend on which
other graphs share it). A timed round runs, for each list in a fresh shuffled order, the
whole sample in trace order: each batch replayed in the bucket SGLang's rule gives it under
that list (core.sglang.replay.assign_buckets), else eagerly. Calls are timed as
engines/timing.time_interleaved times them (CUDA events, a synchronization between calls and
none inside one, as a server's scheduler waits for each step; perf_counter on the CPU). Batch
inputs are made on the host before the rounds, so no forward reads a device tensor back."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from bcgtune.core.sglang.replay import DEFAULT_PADDING_FACTOR, assign_buckets
from bcgtune.errors import ExternalError

EAGER = "eager"


@dataclass
class ListReplay:
    """One list's timings on the sample: per call (batch) and round (ms), the bucket each
    batch replayed in (0: eager), and the figures a report needs."""

    name: str
    buckets: list[int]
    calls_ms: np.ndarray  # batches x rounds
    chosen: np.ndarray  # per batch, its bucket (0 = eager)

    @property
    def round_totals_ms(self) -> np.ndarray:
        return self.calls_ms.sum(axis=0)

    @property
    def measured_ms(self) -> float:
        """The sum of each call's median over rounds (the statistic a prediction uses)."""
        return float(np.median(self.calls_ms, axis=1).sum())

    @property
    def replayed(self) -> int:
        return int((self.chosen > 0).sum())


def engine_for(session_engine: Any, max_tokens: int, spec: Any) -> Any:
    """A fresh engine of the same runner over the same loaded model, with static buffers for
    `max_tokens` (its own pool: graphs of an earlier engine are not shared)."""
    if session_engine.simulated:
        return session_engine.fresh(max_tokens)
    if session_engine.runner == "breakable":
        from bcgtune.engines.breakable import BreakablePrefillEngine

        impl = session_engine.impl.name if session_engine.impl is not None else spec.graph_impl
        return BreakablePrefillEngine(
            session_engine.model,
            session_engine.device,
            max_tokens,
            sdpa_backend=spec.sdpa_backend,
            warmup=session_engine.warmup,
            graph_impl=impl,
        )
    from bcgtune.engines.full import FullPrefillEngine

    return FullPrefillEngine(session_engine.model, session_engine.device, max_tokens, sdpa_backend=spec.sdpa_backend)


def replay_in_order(
    engine: Any,
    lists: dict[str, list[int]],
    tokens: Sequence[int] | np.ndarray,
    requests: Sequence[int] | np.ndarray,
    warmup: int,
    repeats: int,
    seed: int = 0,
    factor: float = DEFAULT_PADDING_FACTOR,
    on_round: Callable[[int, int], None] | None = None,
) -> dict[str, ListReplay]:
    """Each list of `lists` (name -> buckets; [] runs every batch eagerly) replayed on the
    batches (tokens[i], requests[i]) in their order, in `repeats` timed rounds after `warmup`
    untimed ones. Captures the buckets some batch uses (a failed capture: ExternalError);
    the engine must hold the largest of them."""
    from bcgtune.engines import timing

    tok = np.asarray(tokens, dtype=np.int64)
    req = np.asarray(requests, dtype=np.int64)
    if engine.runner == "full":
        req = np.ones_like(req)  # the full engine's one request slot
    chosen: dict[str, np.ndarray] = {}
    for name, bl in lists.items():
        if bl:
            c, ok = assign_buckets(tok, np.asarray(sorted(set(bl)), dtype=np.int64), factor)
            chosen[name] = np.where(ok, c, 0).astype(np.int64)
        else:
            chosen[name] = np.zeros(tok.size, dtype=np.int64)
    used = sorted({int(b) for c in chosen.values() for b in np.unique(c) if b > 0})
    if used:
        if engine.graphs_enabled:
            failed = [r for r in engine.capture(used, record_attention=False) if not r.ok]
            if failed:
                raise ExternalError(f"capture failed at {failed[0].bucket} tokens: {failed[0].error}")
        else:
            engine.declare(used)
    pairs = list(zip(tok.tolist(), req.tolist()))
    inputs = {p: engine.inputs(p[0], seed=seed + p[0], requests=p[1]) for p in dict.fromkeys(pairs)}
    names = list(lists)
    groups: list[list[Callable[[], object]]] = []
    for name in names:
        calls: list[Callable[[], object]] = []
        for p, b in zip(pairs, chosen[name].tolist()):
            calls.append(engine.replay_call(inputs[p], b) if b > 0 else engine.eager_call(inputs[p]))
        groups.append(calls)
    times = timing.time_interleaved(groups, engine.device, warmup, repeats, seed=seed, on_round=on_round)
    out = {}
    for name, t in zip(names, times):
        out[name] = ListReplay(name, sorted(set(lists[name])), np.asarray(t, dtype=np.float64), chosen[name])
    return out
