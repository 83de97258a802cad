"""Replay against eager, token by token: the comparisons `validate` runs on every batch, which
side inputs a replay reads (probed by zeroing each one), and the pad-invariance check
(garbage in the padded rows must not change any real row).

The pad-invariance rule. A dense model's real rows never read a padded row, so they must be
bit-identical whatever the padding holds. A model with MoE layers routes its padded rows as
SGLang does (engines/moe.py: routed on the breakable runner at plain TP, masked on full and
under expert parallelism), and SGLang's fused MoE computes every output row from its own
hidden row, so in SGLang padded rows change no real row's bits either; the experts' GEMMs
here are not bound to that (on the CPU an expert that got one row takes BLAS's
matrix-vector path, which rounds differently), so for an MoE model the check asks what a
padded row could change that SGLang's server would not: (1) the experts each real row is
routed to, in every MoE layer, must not change, except where the router's last choice was
within rounding of the next (ROUTING_GAP, relative to the score), and (2) every real token's
answer must agree within the thresholds validate applies to replay against eager (no top-1
flip or logprob change where the top-1/top-2 gap is wide). Its bit-for-bit result is
reported beside, and never fails a bucket; a real row whose expert or answer a padded row
changed always does. Routing is observed where the forward runs in Python (the CPU's
padded-eager replay); a captured graph's is not observed, and the report says so."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from bcgtune.core.bench.accuracy import GAP_THRESHOLD, MAX_LOGPROB_DELTA
from bcgtune.engines.choices import SideInputName
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


# A router's last choice within this share of its score of the next one is a tie that
# rounding decides (module docstring), by the dtype the router's input has.
ROUTING_GAP = {torch.float32: 1e-4, torch.float16: 2.0**-8, torch.bfloat16: 2.0**-5}


@dataclass
class PadInvariance:
    """The same batch replayed with zeros, then garbage, in its padded rows (module
    docstring: `rule` "bitwise" for dense models, "moe" for MoE models)."""

    ok: bool
    max_abs_diff: float
    requests: int
    rule: str = "bitwise"
    bitwise: bool = True
    # MoE: real rows whose experts a padded row changed beyond a tie (None: not observed,
    # the replay ran a captured graph), and whether every real token's answer agreed
    routing_changes: int | None = None
    answers_agree: bool | None = None

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass
class SideInputUse:
    """One side input of a batch (engines/base.py SIDE_INPUT_LABELS): whether the batch
    carries it (DeepStack: image batches only) and whether replay read it, probed by replaying
    the batch with it zeroed in the static buffers (None: it cannot change this batch's
    output, e.g. positions when every request has one token). Replay must read exactly what
    the batch carries: a carried input left unread was dropped; an uncarried one read is a
    previous batch's, left behind."""

    name: SideInputName
    given: bool
    replay_used: bool | None

    @property
    def label(self) -> str:
        from bcgtune.engines.base import SIDE_INPUT_LABELS

        return SIDE_INPUT_LABELS[self.name]

    @property
    def problem(self) -> str | None:
        if self.replay_used is None or self.replay_used == self.given:
            return None
        if self.given:
            return f"replay dropped {self.label}"
        return f"replay read {self.label} the batch does not carry (a previous batch's)"

    @property
    def ok(self) -> bool:
        return self.problem is None

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "given": self.given, "replay_used": self.replay_used, "ok": self.ok}


def _carries(x: PrefillInputs, name: SideInputName) -> tuple[bool, bool]:
    """(the batch carries side input `name`, zeroing it could change the batch's output)."""
    if name == "deepstack":
        given = x.deepstack is not None and bool(x.deepstack.any())
        return given, True
    if name in ("positions", "mrope_positions"):  # relative within a request: one token cannot tell
        return True, max(x.lengths) > 1
    return True, bool(x.inp.any())


@torch.no_grad()
def probe_side_inputs(
    engine: StaticPrefillEngine, x: PrefillInputs, bucket: int, hidden: torch.Tensor, logits: torch.Tensor
) -> list[SideInputUse]:
    """Which of the engine's side inputs replay reads for batch x in `bucket`, given the
    batch's plain replay (`hidden`, `logits`, copies): the batch replayed once per side input
    with that input zeroed, the real rows compared exactly with the plain replay. Leaves the
    static buffers as the batch's plain fill, as its replay did."""
    out = []
    for name in engine.side_inputs():
        given, can_matter = _carries(x, name)
        used: bool | None = None
        if can_matter:
            h1, l1, _ = engine.replay(x, bucket, neutral=(name,))
            used = not (torch.equal(hidden, h1) and torch.equal(logits, l1))
        out.append(SideInputUse(name, given, used))
    engine._fill(x, bucket)
    return out


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


@contextlib.contextmanager
def _routing_of(layers: list[Any]) -> Iterator[list[list[tuple[torch.Tensor, torch.Tensor]]]]:
    """Each MoE layer's routing of the forwards run inside (engines/moe.py MoELayer.record)."""
    records: list[list[tuple[torch.Tensor, torch.Tensor]]] = [[] for _ in layers]
    for layer, rec in zip(layers, records):
        layer.record = rec
    try:
        yield records
    finally:
        for layer in layers:
            layer.record = None


def _routing_changes(zero: list[list[Any]], junk: list[list[Any]], n: int, top_k: int, gap: float) -> int | None:
    """Real rows (of n) whose chosen experts differ between the two replays in any MoE
    layer, where the zero-padded replay's last choice was no tie (module docstring)."""
    if not zero or any(len(a) != 1 or len(b) != 1 for a, b in zip(zero, junk)):
        return None
    changed = torch.zeros(n, dtype=torch.bool)
    for (ids0, chosen0), (ids1, _) in ((a[0], b[0]) for a, b in zip(zero, junk)):
        differ = (ids0[:n].sort(dim=-1).values != ids1[:n].sort(dim=-1).values).any(dim=-1).cpu()
        if chosen0.shape[1] > top_k:
            last, following = chosen0[:n, top_k - 1].float(), chosen0[:n, top_k].float()
            clear = ((last - following) > gap * last.abs().clamp_min(1e-30)).cpu()
        else:
            clear = torch.ones(n, dtype=torch.bool)
        changed |= differ & clear
    return int(changed.sum())


@torch.no_grad()
def check_pad_invariance(
    engine: StaticPrefillEngine,
    x: PrefillInputs,
    bucket: int,
    seed: int = 1,
    gap_threshold: float = GAP_THRESHOLD,
    max_logprob_delta: float = MAX_LOGPROB_DELTA,
) -> PadInvariance:
    """Replay the same batch twice, padding zeros then random garbage: every real row must
    be bit-identical (no real token reads a padded row); for an MoE model, the rule of the
    module docstring. Either runner."""
    layers = engine.model.moe_layers() if hasattr(engine.model, "moe_layers") else []
    with _routing_of(layers) as zero_routing:
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
        if engine.s_deepstack is not None:
            engine.s_deepstack[n:bucket].copy_(torch.randn((bucket - n, engine.s_deepstack.shape[1]), generator=g))
    with _routing_of(layers) as junk_routing:
        h1, l1 = engine._replay_filled(x, bucket)
    diff = max(float((h0 - h1).abs().max()), float((l0 - l1).abs().max()))
    if not layers:
        return PadInvariance(ok=diff == 0.0, max_abs_diff=diff, requests=x.requests, bitwise=diff == 0.0)
    answers = compare_batch(engine.model, h0, h1, l0, l1, x.lengths, gap_threshold, max_logprob_delta)
    gap = ROUTING_GAP.get(engine.dtype, 1e-4)
    changes = _routing_changes(zero_routing, junk_routing, n, layers[0].moe.top_k, gap)
    return PadInvariance(
        ok=answers.ok and not changes,
        max_abs_diff=diff,
        requests=x.requests,
        rule="moe",
        bitwise=diff == 0.0,
        routing_changes=changes,
        answers_agree=answers.ok,
    )
