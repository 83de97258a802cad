"""`bcgtune doctor`: what the installed stack will do with prefill CUDA graphs, before a
10-minute server start-up.

SGLang is asked itself, in a child process (bcgtune.services.launch, through
bcgtune.adapters.sglang.resolve): its argument resolution says which prefill graphs a
profile's launch captures, `serve`'s flag check says whether it would launch at all, and
the prefill runner's own `can_replay_locally`
(srt/model_executor/runner/prefill_cuda_graph_runner.py, built on the CPU with stand-ins
for the GPU) says whether a Qwen4-Exp (Qwen3.8-Flash-Next) image batch and a text batch
replay, with speculative decoding off and on. The gate is classified by those answers
(the states and what each means: bcgtune.core.sglang.runner_gate).

A runner is judged only by running it. One that SGLang does not run (SGLang absent or not
asked), or that cannot be run here (a copy that does not import, or whose runner cannot be
built on the stand-ins), is "not checked" with the reason; what its source reads as
(bcgtune.adapters.sglang.runner_source, `ast`) is reported beside it, never as a verdict. An
import failure that stops any server (a syntax error, a name SGLang lacks or imports from the
copy) blocks.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from bcgtune.adapters.machine.environment import (
    PythonInfo,
    SglangInfo,
    TorchInfo,
    default_prefill_backend,
    python_info,
    sglang_info,
    torch_info,
)
from bcgtune.adapters.machine.model_config import model_is_qwen4_exp
from bcgtune.adapters.sglang.resolve import FlagCheck, RunnerAnswers
from bcgtune.adapters.sglang.runner_source import GateReport, find_runner_source, runner_gate_state
from bcgtune.core.sglang.capture import PrefillCapture
from bcgtune.core.sglang.replay import DEFAULT_PADDING_FACTOR, smallest_replaying_size
from bcgtune.core.sglang.runner_gate import classify_gate
from bcgtune.errors import InputError
from bcgtune.services.launch import SglangUse

Severity = Literal["blocking", "warning", "info"]
Outcome = Literal["ok", "blocking", "not checked"]
BLOCKING: Severity = "blocking"
WARNING: Severity = "warning"
INFO: Severity = "info"


@dataclass(frozen=True)
class Finding:
    severity: Severity
    code: str
    message: str

    def to_json(self) -> dict[str, str]:
        return {"severity": self.severity, "code": self.code, "message": self.message}


@dataclass
class DoctorReport:
    python: PythonInfo
    torch: TorchInfo
    sglang: SglangInfo
    default_prefill_backend: str | None
    prefill_runner_gate: GateReport
    profile: str | None = None
    findings: list[Finding] = field(default_factory=list)
    resolved_prefill: PrefillCapture | None = None
    gate_cached_at: str | None = None
    not_checked: list[str] = field(default_factory=list)
    how_to_check: list[str] = field(default_factory=list)

    @property
    def blocking(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == BLOCKING]

    @property
    def outcome(self) -> Outcome:
        """ "blocking": something would stop or disappoint the server; "not checked": SGLang's
        own answer is missing for part of what doctor judges, so no verdict; "ok": SGLang
        answered everything and nothing blocks."""
        if self.blocking:
            return "blocking"
        return "not checked" if self.not_checked else "ok"

    def to_json(self) -> dict[str, Any]:
        return {
            "python": self.python.to_json(),
            "torch": self.torch.to_json(),
            "sglang": self.sglang.to_json(),
            "default_prefill_backend": self.default_prefill_backend,
            "prefill_runner_gate": self.prefill_runner_gate.to_json(),
            "profile": self.profile,
            "findings": [f.to_json() for f in self.findings],
            "resolved_prefill": None if self.resolved_prefill is None else self.resolved_prefill.to_json(),
            "gate_cached_at": self.gate_cached_at,
            "outcome": self.outcome,
            "launch_check": "not checked" if self.not_checked else "checked",
            "not_checked": list(self.not_checked),
            "how_to_check": list(self.how_to_check),
            "ok": self.outcome == "ok",
        }


# --------------------------------------------------------------------------- the gate, by behaviour
def gate_report(runner: RunnerAnswers | None, path: str | Path | None) -> GateReport:
    """The gate by behaviour when the runner ran (a refusal of a text batch names the line
    of can_replay_locally that returned it). A runner that does not import or cannot be run
    is not checked, with the reason; so is one SGLang did not run, where what its source
    reads as is said beside it (a reading is never a verdict)."""
    where = str(path) if path is not None else None
    if runner is not None and runner.ok:
        state, detail = classify_gate(runner.answers)
        refused = [
            f"{k} at line {n}: {t}"
            for k, (n, t) in sorted(runner.lines.items())
            if k.startswith("text_") and runner.answers.get(k) is False
        ]
        if state == "refuses-text" and refused:
            detail += " (can_replay_locally, run: " + "; ".join(refused)[:400] + ")"
        return GateReport(state, detail, where, method="behaviour", answers=dict(runner.answers))
    if runner is not None and runner.imported is not None:
        what = "does not import" if runner.imported is False else "imports but could not be run here"
        return GateReport(
            "not checked",
            f"the runner {what}: {runner.error}",
            where,
            method="behaviour",
            answers=dict(runner.answers) or None,
        )
    reading = runner_gate_state(path)
    why = runner.error if runner is not None and runner.error else "the runner was not run"
    reading.detail = f"{reading.detail}, not run: {why}"
    return reading


# --------------------------------------------------------------------------- profile checks
def _moved(requested: list[int], captured: tuple[int, ...]) -> list[str]:
    cap = sorted(captured)
    out = []
    for b in sorted(set(requested)):
        i = bisect.bisect_left(cap, b)
        if i < len(cap) and cap[i] != b:
            out.append(f"{b}->{cap[i]}")
    return out


def _flag_findings(flags: FlagCheck | None) -> list[Finding]:
    """serve's flag check: a refusal blocks; a check that could not run is said."""
    if flags is not None and flags.ok is False:
        where = f" ({flags.where})" if flags.where else ""
        return [Finding(BLOCKING, "flag-refused", f"serve refuses this launch: {flags.message}{where}")]
    if flags is not None and flags.ok is None:
        return [Finding(INFO, "flags-unchecked", f"flags not checked against SGLang's parser: {flags.message}")]
    return []


def _prefill_json(server: dict) -> dict:
    from bcgtune.adapters.sglang.flags import prefill_graph_json

    return prefill_graph_json(server)


def _graphs_off_findings(profile, resolved: PrefillCapture) -> list[Finding]:
    """Prefill graphs off: ROCm's default when the backend was not chosen, or a bucket
    list that is never captured."""
    if resolved.graphs_on:
        return []
    server = profile.server
    explicit = any(
        k in server for k in ("cuda_graph_backend_prefill", "disable_prefill_cuda_graph", "disable_cuda_graph")
    ) or "backend" in (_prefill_json(server))
    has_list = profile.buckets is not None
    if profile.platform == "rocm" and not explicit:
        return [
            Finding(
                BLOCKING if has_list else WARNING,
                "rocm-prefill-backend-unset",
                "ROCm: the prefill CUDA-graph backend defaults to disabled (breakable is opt-in); "
                'set cuda-graph-backend-prefill = "breakable" in [server]'
                + (", or the bucket list is never captured" if has_list else ""),
            )
        ]
    if has_list:
        return [
            Finding(BLOCKING, "buckets-dead", f"[buckets].list is never captured: prefill graphs are off ({resolved.reason})")
        ]
    return []


def _qwen_gate_findings(gate: GateReport, qwen: bool | None, spec) -> list[Finding]:
    """With prefill graphs on: whether a Qwen4-Exp model's image prefills replay on this
    runner (`qwen` None: the model could not be identified; `spec`: the speculative
    algorithm in [server])."""
    if qwen is None:
        if gate.state != "unpatched" or gate.method != "behaviour":
            return []
        return [
            Finding(
                INFO,
                "model-unknown",
                "cannot tell whether the model is Qwen4-Exp (its image prefills would run eager on this runner)",
            )
        ]
    if not qwen:
        return []
    out = []
    if gate.state == "not checked":
        # a reading of the source never blocks: only running the runner shows what it does
        out.append(
            Finding(
                WARNING,
                "qwen-mm-gate-not-checked",
                f"the prefill runner's multimodal gate is not checked: {gate.detail}",
            )
        )
    elif gate.state == "refuses-text":
        out.append(
            Finding(
                BLOCKING,
                "qwen-mm-gate-refuses-text",
                f"the prefill runner runs Qwen4-Exp text prefills eager too: {gate.detail}",
            )
        )
    elif gate.state == "unpatched":
        out.append(
            Finding(
                BLOCKING,
                "qwen-mm-unpatched-runner",
                "Qwen4-Exp (Qwen3.8-Flash-Next) multimodal model on an unpatched prefill runner: "
                "every image prefill runs eager (apply the multimodal breakable-prefill patch)",
            )
        )
    elif gate.state in ("refusal-removed", "inverted"):
        out.append(
            Finding(BLOCKING, f"qwen-mm-gate-{gate.state}", f"the prefill runner's multimodal gate is wrong: {gate.detail}")
        )
    elif gate.state == "unknown":
        out.append(Finding(WARNING, "qwen-mm-gate-unknown", f"cannot tell whether image prefills replay: {gate.detail}"))
    if bool(spec) and str(spec).upper() not in ("NONE", "FALSE"):
        out.append(
            Finding(
                WARNING,
                "speculative-mm-eager",
                f"speculative decoding ({spec}) is on: Qwen4-Exp image batches stay eager even on a patched runner",
            )
        )
    return out


def _gap_finding(buckets: list[int], profile) -> list[Finding]:
    """Neighbouring buckets so far apart that the sizes between them replay in neither
    (SGLang's replay rule: bcgtune.core.sglang.replay). doctor has no traffic: whether batches of
    those sizes occur is for suggest-buckets or drift, given a trace, to judge (a list
    suggest-buckets chose for a trace leaves such gaps where that trace had no batches)."""
    gaps = [(x, y, smallest_replaying_size(y)) for x, y in zip(buckets, buckets[1:])]
    spans = ", ".join(f"{x}->{y} (sizes {x + 1}..{lo - 1} run eager)" for x, y, lo in gaps if lo > x + 1)
    if not spans:
        return []
    tuned = getattr(profile, "provenance", {}) or {}
    judged = (
        f"the list was chosen by suggest-buckets for a trace (objective {tuned['objective']}): " if tuned.get("objective") else ""
    )
    return [
        Finding(
            INFO,
            "bucket-gap",
            f"neighbouring buckets more than {DEFAULT_PADDING_FACTOR:g}x apart: {spans}; "
            f"{judged}doctor has no traffic to judge whether batches of those sizes occur "
            "(bcgtune drift --profile P --trace T does)",
        )
    ]


def _above_chunk_finding(buckets: list[int], resolved: PrefillCapture, server: dict) -> list[Finding]:
    """Buckets above the chunk per attention-DP rank: a prefill batch holds at most that
    (schedule_policy.py), plus one token per running request with --enable-mixed-chunk."""
    chunk = resolved.chunked_prefill_size
    if chunk is None or chunk <= 0 or buckets[-1] <= chunk or server.get("enable_mixed_chunk"):
        return []
    over = [x for x in buckets if x > chunk]
    return [
        Finding(
            WARNING,
            "bucket-above-chunk",
            f"buckets {over} exceed the chunked prefill size per rank ({chunk}): "
            "no prefill batch is that large, so they cost capture time and memory for nothing",
        )
    ]


def _rounded_finding(requested: list[int] | None, buckets: list[int], resolved: PrefillCapture) -> list[Finding]:
    """A bucket list that SGLang changes before capture (alignment, DeepEP rounding)."""
    if requested is None or sorted(set(requested)) == buckets:
        return []
    why = []
    if resolved.alignment > 1:
        why.append(f"this layout rounds buckets up to multiples of {resolved.alignment}")
    why += [n for n in resolved.notes if "multiple of 8" in n or "divisible by 8" in n]
    moved = _moved(requested, resolved.captured)
    return [
        Finding(
            WARNING,
            "bucket-rounded",
            f"buckets {', '.join(moved) or 'changed'}: SGLang captures {buckets}" + (f" ({'; '.join(why)})" if why else ""),
        )
    ]


def profile_findings(
    profile,
    gate: GateReport,
    model: str | None = None,
    resolved: PrefillCapture | None = None,
    flags: FlagCheck | None = None,
) -> list[Finding]:
    """What in a profile would disappoint at launch. `resolved`: what the server will do
    (bcgtune's model of SGLang's rules when None); `flags`: serve's flag check on the
    launch (None: not run)."""
    from bcgtune.services.launch import model_capture

    out = _flag_findings(flags)
    model = model or profile.model
    if resolved is None:
        try:
            resolved = model_capture(profile, model, not_asked="not asked")
        except InputError as exc:
            out.append(Finding(BLOCKING, "launch-invalid", f"the launch cannot be resolved: {exc}"))
            return out
    if resolved.refused is not None:
        out.append(
            Finding(
                BLOCKING,
                "launch-refused",
                f"SGLang refuses this launch, the server would not start: {resolved.refused}"
                + ("" if resolved.source.kind == "sglang" else " (bcgtune's model of SGLang's checks)"),
            )
        )
        return out
    qwen = model_is_qwen4_exp(model)
    out += _graphs_off_findings(profile, resolved)
    if resolved.graphs_on:
        buckets = list(resolved.captured)
        out += _qwen_gate_findings(gate, qwen, profile.server.get("speculative_algorithm"))
        out += _gap_finding(buckets, profile)
        out += _above_chunk_finding(buckets, resolved, profile.server)
        out += _rounded_finding(profile.buckets, buckets, resolved)
    return out


def _tuned_findings(profile) -> list[Finding]:
    """The profile's [tuned] record (info), or a warning when [buckets].list is not the list
    it measured (edited by hand since)."""
    tuned = getattr(profile, "tuned", None)
    if not tuned:
        return []
    if list(tuned.get("list") or []) != list(profile.buckets or []):
        return [
            Finding(
                WARNING,
                "tuned-stale",
                f"[tuned] measured the list {tuned.get('list')}, and [buckets].list is {profile.buckets}: its figures "
                "describe another list (run bcgtune tune again)",
            )
        ]
    from bcgtune.files.profile_file import tuned_text

    return [Finding(INFO, "tuned", tuned_text(tuned))]


def _platform_findings(profile, tor: TorchInfo) -> list[Finding]:
    if not tor.installed or not tor.gpu_available:
        return []
    hip = bool(tor.hip)
    if hip == (profile.platform == "rocm"):
        return []
    here = "ROCm" if hip else "CUDA"
    return [Finding(INFO, "platform-mismatch", f"profile is for {profile.platform}, this machine runs {here} torch")]


def _deepstack_findings(
    model: str | None, runner: RunnerAnswers | None, path: str | Path | None, resolved: PrefillCapture | None
) -> list[Finding]:
    """A model with DeepStack visual inputs (Qwen3-VL) replayed from breakable graphs by a
    runner that registers no capture slot for them loses them on image prefills (SGLang's
    fix registers one at capture and copies it at replay). By the runner's behaviour when
    SGLang built it, else a reading of its source."""
    from bcgtune.adapters.machine.model_config import deepstack_indexes, locate_model_config, read_model_config
    from bcgtune.adapters.sglang.runner_source import reads_deepstack_slot

    if resolved is None or not resolved.graphs_on or resolved.backend != "breakable":
        return []
    folder, _ = locate_model_config(model)
    idx = deepstack_indexes(read_model_config(folder))
    if not idx:
        return []
    if runner is not None and runner.ok and runner.slots is not None:
        if any("deepstack" in slot.lower() for slot in runner.slots):
            return []
        how = "by behaviour: the runner SGLang built registers capture slots for " + ", ".join(runner.slots) + " only"
    else:
        reading = reads_deepstack_slot(path)
        if reading is True:
            return []
        why = runner.error if runner is not None and runner.error else "the runner was not run"
        how = f"reads as registering none, not run: {why}" if reading is False else f"cannot read it: {reading}"
    return [
        Finding(
            WARNING,
            "deepstack-not-preserved",
            f"the model declares DeepStack visual inputs (deepstack_visual_indexes {idx}) and the prefill runner "
            f"registers no capture slot for them ({how}): image prefills replayed from breakable graphs lose them "
            "(SGLang's fix preserves DeepStack inputs during replay)",
        )
    ]


def _check_runner_source(path: str | Path) -> None:
    """--runner-source must name a readable text file of reasonable size (one that then fails
    to import or to run is for SGLang to show, not bad input)."""
    import os
    import stat

    where = f"--runner-source {path}"
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise InputError("no such file", where) from None
    except OSError as exc:
        raise InputError(f"cannot read it: {exc.strerror}", where) from None
    if stat.S_ISDIR(st.st_mode):
        raise InputError("is a folder, not a prefill_cuda_graph_runner.py", where)
    if not stat.S_ISREG(st.st_mode):
        raise InputError("is not a regular file (a device, pipe or socket)", where)
    if st.st_size > RUNNER_SOURCE_MAX_BYTES:
        raise InputError(f"is {st.st_size:,} bytes, more than a runner's source ({RUNNER_SOURCE_MAX_BYTES:,})", where)
    if not os.access(path, os.R_OK):
        raise InputError("cannot read it: permission denied", where)
    try:
        with open(path, "rb") as fh:
            data = fh.read(RUNNER_SOURCE_MAX_BYTES + 1)
    except OSError as exc:
        raise InputError(f"cannot read it: {exc.strerror}", where) from None
    if b"\x00" in data:
        raise InputError("binary data, not Python source (a prefill_cuda_graph_runner.py)", where)
    try:
        data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise InputError(f"not UTF-8 text (byte {exc.start}): not Python source", where) from None
    # what the text says (which classes it defines, whether it compiles) is for SGLang to
    # judge by importing and running it: never a verdict read from the text


# SGLang 0.5.23's runner is about 90 kB
RUNNER_SOURCE_MAX_BYTES = 4 * 2**20


def _runner_findings(gate: GateReport, runner: RunnerAnswers | None) -> list[Finding]:
    """Whatever the profile: a runner module whose import failed in SGLang in a way that
    stops any server (a syntax error, a name SGLang lacks or imports from it) stops the
    server. An import failure the stand-ins here may cause leaves the runner not checked."""
    stops = runner is not None and runner.imported is False and runner.stops_server
    if not stops:
        return []
    return [Finding(BLOCKING, "runner-does-not-import", f"the server would not start: {gate.detail} ({gate.path})")]


def run_doctor(
    profile=None,
    *,
    runner_path: str | Path | None = None,
    model: str | None = None,
    sglang: SglangUse = "ask",
    skipped_by: str | None = None,
    refresh: bool = False,
    probe_timeout: float | None = None,
    ask=None,
    say=None,
) -> DoctorReport:
    """Everything doctor reports. SGLang's answers come from the answer cache, else from one
    child process that answers the resolution, the flag check and the runner gate
    (`sglang`, `skipped_by` and `refresh` as bcgtune.services.launch takes them); where
    SGLang did not answer, bcgtune's model and a reading of the runner's source do, and say
    so. `ask`: how SGLang is asked (sglang_resolve.ask_sglang)."""
    from bcgtune.adapters.sglang.resolve import probe_timeout as checked_timeout
    from bcgtune.services.launch import answers_for_profile

    if probe_timeout is not None:
        checked_timeout(probe_timeout)  # finite, positive, at most a day: before anything is read
    if runner_path is not None:
        _check_runner_source(runner_path)
    sg = sglang_info()
    installed_runner = find_runner_source(sg.path) if sg.installed else None
    path = runner_path if runner_path is not None else installed_runner
    answers = answers_for_profile(
        profile,
        model,
        sglang=sglang,
        skipped_by=skipped_by,
        refresh=refresh,
        runner_sources=[None if runner_path is None else str(runner_path)],
        check_flags=profile is not None,
        resolve=profile is not None,
        timeout=probe_timeout,
        ask=ask,
        say=say,
    )
    runner = answers.runners[0] if answers.runners else None
    if runner_path is None and not sg.installed:
        runner = None
    gate = gate_report(runner, path)
    tor = torch_info()
    report = DoctorReport(
        python=python_info(),
        torch=tor,
        sglang=sg,
        default_prefill_backend=default_prefill_backend(tor),
        prefill_runner_gate=gate,
        profile=profile.name if profile is not None else None,
        resolved_prefill=answers.capture,
        gate_cached_at=runner.cached_at if runner is not None and gate.method == "behaviour" else None,
    )
    report.findings = _runner_findings(gate, runner)
    if profile is not None:
        findings = _flag_findings(answers.flags)
        if answers.invalid is not None:
            findings.append(Finding(BLOCKING, "launch-invalid", f"the launch cannot be resolved: {answers.invalid}"))
        else:
            findings = profile_findings(profile, gate, model=model, resolved=answers.capture, flags=answers.flags)
            findings += _deepstack_findings(model or profile.model, runner, path, answers.capture)
        report.findings += findings + _platform_findings(profile, tor) + _tuned_findings(profile)
    report.not_checked = not_checked_parts(profile, answers, gate, runner)
    if report.not_checked:
        report.how_to_check = how_to_check(report.not_checked, skipped_by=skipped_by, timeout=probe_timeout)
    return report


def not_checked_parts(profile, answers, gate: GateReport, runner: RunnerAnswers | None) -> list[str]:
    """What SGLang did not answer of what doctor judges, each with why: its resolution of
    the profile's launch, serve's flag check, and whether it imports and runs the prefill
    runner. Any of them makes the outcome "not checked" (never ok)."""
    out = []
    if profile is not None:
        cap = answers.capture
        if cap is not None and not cap.checked:
            out.append(f"SGLang's resolution of the launch (bcgtune's model answered instead): {cap.not_checked_reason}")
        elif cap is None and answers.invalid is None:
            out.append("SGLang's resolution of the launch: no answer")
        flags = answers.flags
        if flags is not None and flags.ok is None:
            out.append(f"serve's flag check against SGLang's parser: {flags.message}")
    if gate.state == "not checked":
        out.append(f"the prefill runner (imports and multimodal gate): {gate.detail}")
    elif gate.state == "unknown":
        out.append(f"the prefill runner's multimodal gate: {gate.detail}")
    return out


def how_to_check(reasons: list[str], *, skipped_by: str | None = None, timeout: float | None = None) -> list[str]:
    """How to get SGLang's own answer for what was not checked."""
    from bcgtune.adapters.sglang.answer_cache import LOCK_TIMEOUT_ENV, LOCKED_BY
    from bcgtune.adapters.sglang.resolve import PROBE_TIME_TEXT, TIMED_OUT, probe_timeout, sglang_installed
    from bcgtune.services.launch import PROBE_ENV, probe_switched_off

    text = " ".join(reasons)
    out = []
    if not sglang_installed():
        out.append("install sglang (`pip install --no-deps sglang` plus its parser's dependencies is enough: no GPU needed)")
    if skipped_by:
        out.append(f"run without {skipped_by} (a first answer takes {PROBE_TIME_TEXT}, then it is cached)")
    elif probe_switched_off():
        out.append(f"unset {PROBE_ENV} (it is off: SGLang is never started)")
    if TIMED_OUT in text:
        out.append(
            f"give SGLang longer: --probe-timeout SECONDS (this run allowed {probe_timeout(timeout):g} s; "
            f"a first answer takes {PROBE_TIME_TEXT} on a quiet machine)"
        )
    if "local Hugging Face cache" in text or "no config.json in" in text or "names no model" in text:
        out.append(
            "put the model's config.json on this machine (`huggingface-cli download MODEL config.json`), or point "
            "[profile].model / --model-path at a local folder with it: SGLang resolves a launch for its model"
        )
    if LOCKED_BY in text:
        out.append(f"wait for the other bcgtune, or wait longer for it: {LOCK_TIMEOUT_ENV}=SECONDS")
    out.append("an answer SGLang gives is cached: the next run reuses it in under a second (there is none yet for this)")
    return out
