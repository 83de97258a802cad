"""The verdict of `bcgtune validate --server`, from what two launches of one profile answered
(graphs on, graphs off) and what the graphs-on server logged. Pure: no I/O.

Compared per request and position, up to the first top-1 flip (after a flip the contexts
differ and later positions say nothing about graphs): top-1 agreement, |logprob delta| of
the chosen token, and the eager top-1/top-2 gap at a flip. A flip fails only where that gap
exceeds the gap threshold (below it, a flip is bf16 noise: vLLM #55944); a logprob delta
fails where it exceeds the delta tolerance. From the log: the captured buckets and, per
probe phase (text, image), the batches that replayed; the share checked against the least
replay share counts only batches whose size a captured bucket serves under the 2x rule.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from bcgtune.core.document import document_header
from bcgtune.core.sglang.runner_gate import GateState  # doctor's

KIND = "bcgtune.server-validation"
ProbeKind = Literal["text", "image"]
RunnerState = Literal["patched", "replays", "unpatched", "eager-images", "not-applicable", "unknown"]


@dataclass
class Generation:
    """What the server answered for one probe: the text, the chosen token ids with their
    logprobs, and per position the top logprobs as (logprob, token id)."""

    text: str
    ids: list[int]
    logprobs: list[float]
    top: list[list[tuple[float, int]]]


@dataclass
class RequestCompare:
    name: str
    kind: ProbeKind
    positions: int  # positions compared (up to and including the first flip)
    agree: int
    first_flip: int | None
    flip_gap: float | None  # eager top1 - top2 logprob at the flip
    flip_fails: bool
    max_logprob_delta: float
    delta_fails: bool
    identical_text: bool


@dataclass
class PhaseReplay:
    """The batches of one probe phase in the graphs-on log: how many replayed, and of those a
    captured bucket serves (within 2x), how many replayed."""

    batches: int
    replayed: int
    share: float | None
    eligible: int
    replayed_eligible: int
    share_of_eligible: float | None
    sizes: list[int]
    graph: list[int]


@dataclass
class LogReplay:
    """The graphs-on server's log: its captured prefill buckets and each phase's replays."""

    captured: list[int]
    text: PhaseReplay | None = None
    image: PhaseReplay | None = None

    def phase(self, kind: ProbeKind) -> PhaseReplay | None:
        return self.text if kind == "text" else self.image


@dataclass
class GateCheck:
    """What doctor reads from this machine's SGLang source about the multimodal gate."""

    state: GateState
    detail: str
    path: str | None = None


@dataclass
class RunnerCheck:
    verdict: RunnerState
    why: str
    qwen4_exp: bool | None
    speculative: bool
    doctor: GateCheck


@dataclass
class ProbeLaunch:
    """One launch: its command, its log, and the log's line ranges [begin, end) of the start
    ("start") and of each probe phase."""

    launch_command: list[str]
    log: str
    phases: dict[str, list[int]]


@dataclass
class ServerValidation:
    """The report: ok when no request disagrees beyond tolerance, a capture was logged and
    every phase replays at least the least share; `failures` says why not."""

    profile: str
    model: str | None
    backend: str
    probes: int
    gap_threshold: float
    logprob_delta_tolerance: float
    min_replay_share: float
    requests: list[RequestCompare]
    replay: LogReplay
    runner: RunnerCheck
    graphs_on: ProbeLaunch
    graphs_off: ProbeLaunch
    workdir: str
    failures: list[str] = field(default_factory=list)
    header: dict[str, Any] = field(default_factory=lambda: document_header(KIND))

    @property
    def ok(self) -> bool:
        return not self.failures

    @property
    def top1_agreement(self) -> float | None:
        n_pos = sum(c.positions for c in self.requests)
        return sum(c.agree for c in self.requests) / n_pos if n_pos else None

    @property
    def identical_text_rate(self) -> float | None:
        return sum(c.identical_text for c in self.requests) / len(self.requests) if self.requests else None

    @property
    def max_logprob_delta(self) -> float:
        return max((c.max_logprob_delta for c in self.requests), default=0.0)

    def to_json(self) -> dict[str, Any]:
        """validation.json and `validate --server --json`."""
        return {
            **self.header,
            "profile": self.profile,
            "model": self.model,
            "backend": self.backend,
            "probes": self.probes,
            "gap_threshold": self.gap_threshold,
            "logprob_delta_tolerance": self.logprob_delta_tolerance,
            "min_replay_share": self.min_replay_share,
            "top1_agreement": self.top1_agreement,
            "identical_text_rate": self.identical_text_rate,
            "max_logprob_delta": self.max_logprob_delta,
            "requests": [asdict(c) for c in self.requests],
            "captured_buckets": list(self.replay.captured),
            "replay": {k: (asdict(s) if (s := self.replay.phase(k)) is not None else None) for k in ("text", "image")},
            "runner": asdict(self.runner),
            "launches": {"graphs_on": asdict(self.graphs_on), "graphs_off": asdict(self.graphs_off)},
            "workdir": self.workdir,
            "ok": self.ok,
            "failures": list(self.failures),
        }


def compare_outputs(
    names: Sequence[tuple[str, ProbeKind]],
    on: Sequence[Generation],
    off: Sequence[Generation],
    gap_threshold: float,
    delta_tol: float,
) -> list[RequestCompare]:
    """Each probe's graphs-on answer against its graphs-off (eager) answer."""
    out = []
    for (name, kind), a, b in zip(names, on, off):
        n = min(len(a.ids), len(b.ids))
        agree = 0
        flip = None
        deltas = []
        for i in range(n):
            if a.ids[i] != b.ids[i]:
                flip = i
                break
            agree += 1
            deltas.append(abs(a.logprobs[i] - b.logprobs[i]))
        gap = None
        if flip is not None:
            top = b.top[flip] if flip < len(b.top) else []
            if len(top) >= 2:
                gap = top[0][0] - top[1][0]
        flip_fails = flip is not None and (gap is None or gap > gap_threshold)
        mx = max(deltas) if deltas else 0.0
        out.append(
            RequestCompare(
                name,
                kind,
                agree + (1 if flip is not None else 0),
                agree,
                flip,
                gap,
                flip_fails,
                mx,
                mx > delta_tol,
                a.text == b.text,
            )
        )
    return out


def runner_verdict(replay: LogReplay, qwen4: bool | None, speculative: bool, backend: str) -> tuple[RunnerState, str]:
    """Which prefill runner the server's replays show, and why."""
    img, txt = replay.image, replay.text
    if not img or not img.batches:
        return "unknown", "no image batch was probed"
    if backend != "breakable":
        return "not-applicable", f"prefill backend is {backend}: the multimodal gate applies to breakable graphs only"
    if speculative:
        return "not-applicable", "speculative decoding is on: image batches run eager with either runner"
    if img.replayed > 0:
        what: RunnerState = "patched" if qwen4 is not False else "replays"
        return what, "image batches replay" + (
            " (Qwen4-Exp without speculative decoding: the patched runner is in place)" if qwen4 else ""
        )
    if txt and txt.replayed > 0 and img.eligible > 0:
        if qwen4 is False:
            return "eager-images", "image batches run eager while text batches replay (model is not Qwen4-Exp)"
        return "unpatched", "every image batch ran eager while text batches replayed: the prefill runner is unpatched"
    return "unknown", "no batch replayed, or no image batch had a bucket within 2x"


def failures(
    requests: Sequence[RequestCompare], replay: LogReplay, gap_threshold: float, delta_tol: float, min_replay_share: float
) -> list[str]:
    """Why the validation fails, one line each; empty when it passes."""
    reasons = []
    for c in requests:
        if c.flip_fails:
            gap = "unknown" if c.flip_gap is None else f"{c.flip_gap:.2f}"
            reasons.append(f"{c.name}: top-1 flip at position {c.first_flip} with eager gap {gap} > {gap_threshold}")
        if c.delta_fails:
            reasons.append(f"{c.name}: logprob delta {c.max_logprob_delta:.3f} > {delta_tol}")
    if not replay.captured:
        reasons.append("the graphs-on server logged no prefill capture")
    for kind in ("text", "image"):
        s = replay.phase(kind)
        if s and s.eligible and s.share_of_eligible is not None and s.share_of_eligible < min_replay_share:
            reasons.append(
                f"{kind} batches replayed {s.replayed_eligible}/{s.eligible} of those a bucket serves "
                f"({100 * s.share_of_eligible:.0f}% < {100 * min_replay_share:.0f}%)"
            )
    return reasons
