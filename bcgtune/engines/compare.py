"""Replay against eager, token by token: the comparisons `validate` runs on every batch, and
the pad-invariance check (garbage in the padded rows must not change any real row)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from bcgtune.core.accuracy import GAP_THRESHOLD, MAX_LOGPROB_DELTA
from bcgtune.engines.inputs import PrefillInputs, seeded_generator

if TYPE_CHECKING:
    from bcgtune.engines.base import StaticPrefillEngine


@dataclass
class LogitComparison:
    """Every real token's logits, test vs reference (eager), in figures."""

    tokens: int
    top1_agree: float
    max_abs_diff: float
    max_logprob_delta: float
    wide_gap_tokens: int
    wide_gap_flips: int
    wide_gap_logprob_failures: int
    narrow_gap_flips: int
    last_logits_max_abs_diff: float
    ok: bool

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass
class BatchComparison:
    """LogitComparison summed over the requests of a batch (max of the maxima, sum of the
    counts, top-1 agreement weighted by tokens), plus which requests differ at all (any
    hidden or last-logit difference), which fail the thresholds, and whether the batch is
    bit for bit."""

    tokens: int
    top1_agree: float
    max_abs_diff: float
    max_logprob_delta: float
    wide_gap_tokens: int
    wide_gap_flips: int
    wide_gap_logprob_failures: int
    narrow_gap_flips: int
    last_logits_max_abs_diff: float
    requests: int
    lengths: list[int]
    hidden_max_abs_diff: float
    bitwise: bool
    differing_requests: list[int]
    failing_requests: list[int]
    ok: bool

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass
class PadInvariance:
    """The same batch replayed with zeros, then garbage, in its padded rows."""

    ok: bool
    max_abs_diff: float
    requests: int

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@torch.no_grad()
def compare_logits(
    model: Any,
    hidden_ref: torch.Tensor,
    hidden_test: torch.Tensor,
    last_ref: torch.Tensor,
    last_test: torch.Tensor,
    gap_threshold: float = GAP_THRESHOLD,
    max_logprob_delta: float = MAX_LOGPROB_DELTA,
    chunk: int = 512,
) -> LogitComparison:
    """Every real token's logits, test vs reference (eager). A top-1 flip or a logprob change
    of the reference's top-1 counts as a failure only where the reference's top-1/top-2
    logit gap exceeds `gap_threshold` (vLLM #55944: below ~0.7 flips are bf16 noise)."""
    n = hidden_ref.shape[0]
    agree = 0
    max_abs = 0.0
    max_lp = 0.0
    wide = flips_wide = lp_fail = flips_narrow = 0
    for i in range(0, n, chunk):
        lr = model.logits(hidden_ref[i : i + chunk]).float()
        lt = model.logits(hidden_test[i : i + chunk]).float()
        max_abs = max(max_abs, float((lr - lt).abs().max()))
        top2 = lr.topk(2, dim=-1)
        t1 = top2.indices[:, 0]
        gap = top2.values[:, 0] - top2.values[:, 1]
        # tie-robust: bf16-derived logits often tie at the top, and argmax/topk may then
        # name different indices for identical rows
        same = lt.gather(1, t1[:, None])[:, 0] >= lt.max(-1).values
        agree += int(same.sum())
        lpr = torch.log_softmax(lr, -1).gather(1, t1[:, None])[:, 0]
        lpt = torch.log_softmax(lt, -1).gather(1, t1[:, None])[:, 0]
        dlp = (lpr - lpt).abs()
        max_lp = max(max_lp, float(dlp.max()))
        w = gap > gap_threshold
        wide += int(w.sum())
        flips_wide += int((w & ~same).sum())
        flips_narrow += int((~w & ~same).sum())
        lp_fail += int((w & (dlp > max_logprob_delta)).sum())
    last_diff = float((last_ref.float() - last_test.float()).abs().max())
    return LogitComparison(
        tokens=n,
        top1_agree=agree / n if n else 1.0,
        max_abs_diff=max_abs,
        max_logprob_delta=max_lp,
        wide_gap_tokens=wide,
        wide_gap_flips=flips_wide,
        wide_gap_logprob_failures=lp_fail,
        narrow_gap_flips=flips_narrow,
        last_logits_max_abs_diff=last_diff,
        ok=flips_wide == 0 and lp_fail == 0 and bool(torch.isfinite(last_test.float()).all()),
    )


@torch.no_grad()
def compare_batch(
    model: Any,
    hidden_ref: torch.Tensor,
    hidden_test: torch.Tensor,
    last_ref: torch.Tensor,
    last_test: torch.Tensor,
    lengths: Sequence[int],
    gap_threshold: float = GAP_THRESHOLD,
    max_logprob_delta: float = MAX_LOGPROB_DELTA,
) -> BatchComparison:
    """compare_logits per request of a batch (rows split by `lengths`, one last-token logits
    row each), summed up (BatchComparison)."""
    per: list[LogitComparison] = []
    differ: list[int] = []
    max_hidden = 0.0
    start = 0
    for i, length in enumerate(lengths):
        end = start + int(length)
        c = compare_logits(
            model,
            hidden_ref[start:end],
            hidden_test[start:end],
            last_ref[i : i + 1],
            last_test[i : i + 1],
            gap_threshold,
            max_logprob_delta,
        )
        dh = float((hidden_ref[start:end].float() - hidden_test[start:end].float()).abs().max())
        max_hidden = max(max_hidden, dh)
        if dh > 0 or c.last_logits_max_abs_diff > 0 or c.max_abs_diff > 0:
            differ.append(i)
        per.append(c)
        start = end
    tokens = sum(c.tokens for c in per)
    last_diff = _running_max(c.last_logits_max_abs_diff for c in per)
    fail = [i for i, c in enumerate(per) if not c.ok]
    return BatchComparison(
        tokens=tokens,
        top1_agree=sum(c.top1_agree * c.tokens for c in per) / tokens if tokens else 1.0,
        max_abs_diff=_running_max(c.max_abs_diff for c in per),
        max_logprob_delta=_running_max(c.max_logprob_delta for c in per),
        wide_gap_tokens=sum(c.wide_gap_tokens for c in per),
        wide_gap_flips=sum(c.wide_gap_flips for c in per),
        wide_gap_logprob_failures=sum(c.wide_gap_logprob_failures for c in per),
        narrow_gap_flips=sum(c.narrow_gap_flips for c in per),
        last_logits_max_abs_diff=last_diff,
        requests=len(lengths),
        lengths=[int(x) for x in lengths],
        hidden_max_abs_diff=max_hidden,
        bitwise=max_hidden == 0.0 and last_diff == 0.0,
        differing_requests=differ,
        failing_requests=fail,
        ok=not fail,
    )


def _running_max(values: Iterable[float]) -> float:
    """max(0.0, v1, v2, ...) taken left to right, as the per-token loop does."""
    out = 0.0
    for v in values:
        out = max(out, v)
    return out


@torch.no_grad()
def check_pad_invariance(engine: StaticPrefillEngine, x: PrefillInputs, bucket: int, seed: int = 1) -> PadInvariance:
    """Replay the same batch twice, padding zeros then random garbage: every real row must
    be bit-identical (no real token reads a padded row). Either runner."""
    h0, l0, _ = engine.replay(x, bucket)
    h0, l0 = h0.clone(), l0.clone()
    n = x.n
    g = seeded_generator(seed)
    engine._fill(x, bucket)
    if n < bucket:
        if engine.s_inp.dtype == torch.long:
            junk = torch.randint(0, min(engine.model.vocab_size, 150000), (bucket - n,), generator=g)
        else:
            junk = torch.randn((bucket - n, engine.s_inp.shape[1]), generator=g)
        engine.s_inp[n:bucket].copy_(junk.to(engine.s_inp.dtype))
        engine.s_pos[..., n:bucket].copy_(torch.randint(0, 4 * bucket, (bucket - n,), generator=g))
    h1, l1 = engine._replay_filled(x, bucket)
    diff = max(float((h0 - h1).abs().max()), float((l0 - l1).abs().max()))
    return PadInvariance(ok=diff == 0.0, max_abs_diff=diff, requests=x.requests)
