"""Ask the installed SGLang itself what it will do with a profile's launch.

`ask_sglang` returns typed answers: the prefill graphs SGLang's resolution pipeline
settles on (a launch it refuses included), whether `serve`'s flag check accepts the
launch, and how the prefill runner's multimodal gate behaves. Each answer comes from the
answer cache (bcgtune.adapters.sglang.answer_cache) when SGLang already answered the same
question, else from `bcgtune.adapters.sglang.probe` run in one child process (its own
session, a deadline, its output kept away from ours), and is then cached. It never
substitutes a model for an answer: when SGLang cannot answer, the answer says why, and
the caller (bcgtune.services.launch) decides what to say instead.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

from bcgtune.adapters.machine.hardware import GpuSpec, gpu_for
from bcgtune.adapters.machine.model_config import locate_model_config
from bcgtune.adapters.sglang.launcher import ServerCommand, build_server_command, die_with_parent
from bcgtune.core.sglang.capture import CaptureSource, PrefillBackend, PrefillCapture
from bcgtune.errors import InputError
from bcgtune.procenv import child_environ

DEFAULT_TIMEOUT_S = 300.0
MAX_TIMEOUT_S = 86_400.0  # a day: a limit, never "wait forever"
# --probe-timeout, else this variable, else DEFAULT_TIMEOUT_S: how long SGLang may take to answer
PROBE_TIMEOUT_ENV = "BCGTUNE_PROBE_TIMEOUT"
# how an answer that ran out of time starts (doctor's advice keys on it)
TIMED_OUT = "SGLang did not answer within"
# What a first answer costs (importing SGLang and resolving in a child process), measured:
# benchmarks/RESULTS.md, "Asking SGLang" and "SGLang's first answer, per GPU kind". A cached
# answer takes well under a second.
PROBE_TIME_TEXT = "10-20 s"  # 10-15 s on an idle 2-core machine; 43-87 s with it busy
# A small public model config (Qwen/Qwen3-0.6B's config.json) that the runner check
# resolves a launch with: the gate under test keys on the model the stand-in model
# runner reports, not on this one.
PROBE_CONFIG_DIR = Path(__file__).resolve().parents[2] / "data" / "sglang_probe"
_INT32_MAX = 2**31 - 1
_BACKENDS: tuple[PrefillBackend, ...] = ("breakable", "full", "disabled")


@dataclass(frozen=True)
class RunnerAnswers:
    """The prefill runner's own answers, or why there are none. `imported`: whether SGLang
    imported the runner module (False: it does not import; None: not tried). `cached_at`:
    when the answer was cached (None: asked just now)."""

    ok: bool
    imported: bool | None
    answers: dict[str, bool] = field(default_factory=dict)
    error: str | None = None
    cached_at: str | None = None
    slots: tuple[str, ...] | None = None  # the inputs it registers a capture slot for
    # the line of can_replay_locally whose `return` gave each answer, and its text
    lines: dict[str, tuple[int, str]] = field(default_factory=dict)
    # an import failure that stops any server (a syntax error, a name SGLang lacks or imports
    # from the module), not one this machine's stand-ins may cause
    stops_server: bool = False


@dataclass(frozen=True)
class FlagCheck:
    """serve's flag check run on the launch: ok, or the message and where (the profile
    key); ok None when it could not run (`message` says why). `version`: the SGLang whose
    parser answered; `cached_at`: when its answer was cached (None: asked just now)."""

    ok: bool | None
    message: str | None = None
    where: str | None = None
    version: str | None = None
    cached_at: str | None = None


@dataclass(frozen=True)
class SglangAnswers:
    """What one child process answered. `capture`: SGLang's own resolution of the launch
    (None: see `capture_error`); `runners`: one answer per runner asked about; `flags`:
    serve's flag check (None: not asked); `error`: why SGLang could not be asked at all;
    `notes`: what building the question found (the profile's GPU); `config_dir`: the
    model's config folder on this machine, if found."""

    sglang_version: str | None
    capture: PrefillCapture | None
    runners: tuple[RunnerAnswers, ...]
    flags: FlagCheck | None
    error: str | None = None
    capture_error: str | None = None
    placeholders: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    config_dir: Path | None = None


# --------------------------------------------------------------------------- the child
def device_for(profile) -> tuple[dict, list[str]]:
    """The GPU SGLang is told it runs on (the profile's [profile].hardware), and notes on
    what is unknown about it."""
    notes: list[str] = []
    spec: GpuSpec | None = gpu_for(getattr(profile, "hardware", None))
    platform = profile.platform
    if spec is not None and spec.platform != platform:
        notes.append(f"[profile].hardware {profile.hardware} is a {spec.platform.upper()} GPU, the profile says {platform}")
    if spec is None:
        if profile.hardware:
            notes.append(f"[profile].hardware {profile.hardware!r} is not a GPU bcgtune knows: its memory is unknown")
        cap = (9, 4) if platform == "rocm" else (9, 0)
        return {"platform": platform, "name": "unknown GPU", "memory_gib": None, "capability": list(cap)}, notes
    return known_device(spec, platform), notes


def known_device(spec: GpuSpec, platform: str | None = None) -> dict:
    """The device SGLang is told it runs on, for a GPU bcgtune knows (`platform`: the
    profile's, else the GPU's own)."""
    return {
        "platform": platform or spec.platform,
        "name": spec.name,
        "memory_gib": spec.memory_gib,
        "capability": list(spec.capability),
        "gcn_arch": spec.gcn_arch,
    }


def sglang_installed() -> bool:
    try:
        return importlib.util.find_spec("sglang") is not None
    except (ImportError, ValueError):
        return False


def probe_timeout(given: float | None = None) -> float:
    """The seconds SGLang may take to answer: `given` (--probe-timeout), else
    $BCGTUNE_PROBE_TIMEOUT, else DEFAULT_TIMEOUT_S. A given limit is finite (a stuck import
    must not hang the command) and at most MAX_TIMEOUT_S."""
    if given is not None:
        if isinstance(given, bool) or not isinstance(given, (int, float)) or not 0 < given <= MAX_TIMEOUT_S:
            raise InputError(f"must be a positive number of seconds, at most {MAX_TIMEOUT_S:g}", field="probe_timeout")
        return float(given)
    from bcgtune.adapters.sglang.answer_cache import env_seconds

    return env_seconds(PROBE_TIMEOUT_ENV, DEFAULT_TIMEOUT_S, zero_allowed=False)


# The child's environment: offline, and without tvm-ffi's optional torch DLPack add-on, which
# it otherwise tries to compile at every import where no built copy is cached (under a
# stand-in ROCm GPU it never is: seconds of CPU for nothing SGLang's resolution uses).
PROBE_CHILD_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TVM_FFI_DISABLE_TORCH_C_DLPACK": "1"}


def run_probe(request: dict, *, timeout: float = DEFAULT_TIMEOUT_S, tick=None) -> dict:
    """Run the probe child on `request`; its JSON answer, or {"error": why}. The child's
    own output goes to a temporary file and only its last line is ever quoted. `tick`, if
    given, is called with the seconds waited so far about twice a second."""
    pkg_root = str(Path(__file__).resolve().parents[3])
    env = child_environ()
    env["PYTHONPATH"] = pkg_root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.update(PROBE_CHILD_ENV)
    with tempfile.TemporaryDirectory(prefix="bcgtune-probe-") as tmp:
        req_path, out_path, log_path = (Path(tmp) / n for n in ("request.json", "result.json", "child.log"))
        req_path.write_text(json.dumps(request), encoding="utf-8")
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "bcgtune.adapters.sglang.probe", str(req_path), str(out_path)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=tmp,
                start_new_session=True,
                preexec_fn=die_with_parent(),
            )
            try:
                rc = _wait(proc, timeout, tick)
            except subprocess.TimeoutExpired:
                _kill(proc)
                return {"error": f"{TIMED_OUT} {timeout:g} s"}
            except BaseException:
                _kill(proc)
                raise
        try:
            text = out_path.read_text(encoding="utf-8")
        except OSError:
            return {"error": f"the SGLang check exited with code {rc} without an answer ({_last_line(log_path)})"}
        try:
            result = json.loads(text)
        except (ValueError, RecursionError):
            return {"error": "the SGLang check wrote an unreadable answer"}
    return result if isinstance(result, dict) else {"error": "the SGLang check wrote an unreadable answer"}


def _wait(proc: subprocess.Popen, timeout: float, tick) -> int:
    """The child's exit code; TimeoutExpired past `timeout` seconds; `tick(waited)` between."""
    if tick is None:
        return proc.wait(timeout=timeout)
    start = time.monotonic()
    while True:
        waited = time.monotonic() - start
        if waited >= timeout:
            raise subprocess.TimeoutExpired(proc.args, timeout)
        try:
            return proc.wait(timeout=min(0.5, timeout - waited))
        except subprocess.TimeoutExpired:
            tick(time.monotonic() - start)


def _kill(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


def _last_line(path: Path) -> str:
    try:
        lines = [ln for ln in path.read_text(encoding="utf-8", errors="replace").splitlines() if ln.strip()]
    except OSError:
        return "no output"
    return lines[-1].strip()[:200] if lines else "no output"


# --------------------------------------------------------------------------- answers
def _int_list(v: Any) -> tuple[int, ...] | None:
    if not isinstance(v, list) or not all(isinstance(x, int) and not isinstance(x, bool) for x in v):
        return None
    if any(not -1 <= x <= _INT32_MAX for x in v):
        return None
    return tuple(v)


def _opt_int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) and abs(v) <= _INT32_MAX else None


def _reason_from_sglang(launch: dict, backend: str, explicit: bool, platform: str) -> str:
    msgs = [m for m in launch.get("messages", []) if isinstance(m, str)]
    if backend == "disabled":
        off = [m for m in msgs if "disabl" in m.lower() or "incompatible" in m.lower()]
        if launch.get("backend") != "disabled" and not launch.get("bs"):
            chunk = launch.get("chunked_prefill_size")
            why = (
                "chunked prefill is off (--chunked-prefill-size -1)"
                if isinstance(chunk, int) and chunk < 1
                else "the list is empty"
            )
            return f"no bucket to capture: {why}; SGLang disables prefill CUDA graphs"
        if off:
            return "SGLang: " + off[-1]
        if explicit:
            return "disabled, chosen at launch"
        if platform == "rocm":
            return "SGLang's default on ROCm (breakable prefill graphs are opt-in there)"
        return "SGLang resolved the prefill backend to disabled"
    if explicit:
        return f"{backend}, chosen at launch"
    return f"{backend}, SGLang's default on {platform.upper()}"


def capture_from_sglang(
    launch: dict, version: str, requested: tuple[int, ...] | None, platform: str, explicit: bool
) -> PrefillCapture | None:
    """SGLang's answer for one launch as a PrefillCapture; None when it is incomplete."""
    from bcgtune.core.sglang.ladder import sglang_default_ladder

    backend = launch.get("backend")
    captured = _int_list(launch.get("captured"))
    listed = _int_list(launch.get("bs"))
    align = _opt_int(launch.get("alignment"))
    if backend not in _BACKENDS or captured is None or listed is None or align is None or align < 1:
        return None
    effective: PrefillBackend = backend if captured else "disabled"
    max_bs = _opt_int(launch.get("max_bs"))
    is_ladder = requested is None and max_bs is not None and max_bs >= 1 and list(listed) == sglang_default_ladder(max_bs)
    notes = [m for m in launch.get("messages", []) if isinstance(m, str) and "aligning" in m]
    return PrefillCapture(
        backend=effective,
        reason=_reason_from_sglang(launch, effective, explicit, platform),
        buckets=None if is_ladder else listed,
        max_bs=max_bs,
        alignment=align,
        captured=captured,
        chunked_prefill_size=_opt_int(launch.get("chunked_prefill_size")),
        notes=tuple(n[:300] for n in notes),
        source=CaptureSource("sglang", sglang_version=version),
        requested=requested,
    )


# --------------------------------------------------------------------------- questions
QuestionKind = Literal["launches", "flags", "runners"]


@dataclass(frozen=True)
class Question:
    """One thing SGLang is asked: `payload` is what the child is sent, `parts` everything
    the answer depends on (its cache key)."""

    kind: QuestionKind
    parts: dict[str, Any]
    payload: Any

    @property
    def key(self) -> str:
        from bcgtune.adapters.sglang.answer_cache import key_of

        return key_of(self.parts)


@dataclass(frozen=True)
class Answer:
    """SGLang's answer to one question (`raw`, as the child wrote it; None: no answer, see
    `why`), and when it was cached (None: asked just now)."""

    raw: dict[str, Any] | None
    sglang_version: str | None = None
    cached_at: str | None = None
    why: str | None = None


_WHAT = {"launches": "its launch resolution", "flags": "its parser", "runners": "its prefill runner"}
# bcgtune's own code that asking depends on: a change to it makes earlier answers stale
_PROBE_CODE = ("probe.py", "launcher.py")
_CONFIG_FILES_MAX_BYTES = 4 * 2**20


@lru_cache(maxsize=1)
def _base_parts() -> dict[str, Any]:
    """What every answer depends on: this interpreter, the SGLang installation (version
    and folder), the torch and transformers it runs with, and bcgtune's probe code."""
    from importlib.metadata import PackageNotFoundError, version

    from bcgtune.adapters.machine.environment import sglang_info
    from bcgtune.adapters.sglang.answer_cache import file_digest

    def v(dist: str) -> str | None:
        try:
            return version(dist)
        except PackageNotFoundError:
            return None

    here = Path(__file__).resolve().parent
    sg = sglang_info()
    return {
        "format": 1,
        "python": sys.executable,
        "sglang": [sg.version, sg.path],
        "torch": v("torch"),
        "transformers": v("transformers"),
        "probe": [file_digest(here / name) for name in _PROBE_CODE],
    }


def config_digest(folder: Path | None) -> str | None:
    """A digest of the model folder's JSON files (config.json and its neighbours up to
    4 MiB each): what SGLang reads when it resolves a launch for that model."""
    if folder is None:
        return None
    import hashlib

    from bcgtune.adapters.sglang.answer_cache import file_digest

    h = hashlib.sha256()
    try:
        files = sorted(p for p in folder.iterdir() if p.suffix == ".json" and p.is_file())
    except OSError:
        return None
    for f in files:
        try:
            if f.stat().st_size > _CONFIG_FILES_MAX_BYTES:
                continue
        except OSError:
            continue
        h.update(f.name.encode() + b"\0" + (file_digest(f) or "unreadable").encode() + b"\0")
    return h.hexdigest()


def launch_question(argv: list[str], device: dict, config_dir: Path, env: dict[str, str] | None = None) -> Question:
    """SGLang's resolution of a launch: its argv (the model as its config folder, a resolved
    path), the environment the server starts with (SGLang reads its SGLANG_* settings as it
    resolves) and the model's config by the digest of its content."""
    env = {str(k): str(v) for k, v in (env or {}).items()}
    return Question(
        "launches",
        {**_base_parts(), "q": "launch", "device": device, "argv": argv, "env": env, "config": config_digest(config_dir)},
        {"argv": argv, "env": env},
    )


# how the child is told where a flag came from: its place in the command's sources. The real
# origin (a profile's path as the user spelled it, a key) is put back from the command asked
# about, so one launch has one cache key whatever the spelling of its profile's path.
_SOURCE_REF = "source #"


def flags_question(cmd: ServerCommand) -> Question:
    payload = {
        "argv": cmd.argv,
        "sources": [
            {"flag": s.flag, "origin": f"{_SOURCE_REF}{i}", "value": _jsonable(s.value), "from_profile": s.from_profile}
            for i, s in enumerate(cmd.sources)
        ],
    }
    return Question("flags", {**_base_parts(), "q": "flags", **payload}, payload)


def _origin(where: str | None, cmd: ServerCommand | None) -> str | None:
    """The flag source a child's answer names (`source #i`), as the command spells it."""
    if where and cmd is not None and where.startswith(_SOURCE_REF):
        try:
            return cmd.sources[int(where[len(_SOURCE_REF) :])].origin
        except (ValueError, IndexError):
            return None
    return where


def runner_question(source: str | None, device: dict) -> Question:
    """The installed runner (source None) or a copy; keyed by the file's content."""
    from bcgtune.adapters.sglang.answer_cache import file_digest
    from bcgtune.adapters.sglang.runner_source import find_runner_source

    path = Path(source).resolve() if source is not None else find_runner_source()
    parts = {
        **_base_parts(),
        "q": "runner",
        "device": device,
        "installed": source is None,
        "runner": file_digest(path) if path is not None else None,
        "probe_config": file_digest(PROBE_CONFIG_DIR / "config.json"),
    }
    return Question("runners", parts, None if source is None else str(path))


def _request(questions: Sequence[Question], device: dict) -> dict[str, Any]:
    request: dict[str, Any] = {"device": device}
    for q in questions:
        if q.kind == "launches":
            request.setdefault("launches", []).append(q.payload)
        elif q.kind == "flags":
            request["flags"] = q.payload
        else:
            request.setdefault("runners", {"config_dir": str(PROBE_CONFIG_DIR), "sources": []})["sources"].append(q.payload)
    return request


def _split(result: dict, questions: Sequence[Question]) -> list[dict[str, Any] | None]:
    """The child's answer to each question, in order (None where it gave none)."""
    out: list[dict[str, Any] | None] = []
    seen = {"launches": 0, "runners": 0}
    for q in questions:
        if q.kind == "flags":
            raw = result.get("flags")
        else:
            items = result.get(q.kind)
            i = seen[q.kind]
            seen[q.kind] += 1
            raw = items[i] if isinstance(items, list) and i < len(items) else None
        out.append(raw if isinstance(raw, dict) else None)
    return out


def _cacheable(kind: QuestionKind, raw: dict[str, Any] | None) -> bool:
    """An answer worth keeping: SGLang's verdict (a launch resolved or refused, flags
    accepted or refused, a runner that answered or does not import), not a failure to ask."""
    if raw is None:
        return False
    if raw.get("ok") is True:
        return True
    if kind == "launches":
        return raw.get("refused") is not None
    if kind == "flags":
        return raw.get("ok") is False and "message" in raw
    return raw.get("imported") is False


def _probe_with_progress(request: dict, limit: float, say) -> dict:
    """run_probe, with the wait shown where `say` offers a progress display (`say.waiting`,
    a label -> context manager with update(seconds): a bar on a terminal, nothing
    elsewhere)."""
    waiting = getattr(say, "waiting", None)
    if waiting is None:
        return run_probe(request, timeout=limit)
    with waiting("waiting for SGLang's answer") as bar:
        return run_probe(request, timeout=limit, tick=bar.update)


def _stamps(result: dict, kind: QuestionKind) -> list[Any]:
    files = result.get("files")
    stamps = files.get(kind) if isinstance(files, dict) else None
    return stamps if isinstance(stamps, list) else []


def ask(
    questions: Sequence[Question],
    device: dict,
    *,
    probe: bool = True,
    refresh: bool = False,
    not_asked: str = "not asked",
    timeout: float | None = None,
    cache=None,
    say=None,
) -> list[Answer]:
    """SGLang's answer to each question: from the answer cache (unless `refresh`), else
    asked of SGLang in one child process (when `probe`), and cached. Another bcgtune asking
    at the same time is waited for, and its answers used."""
    from bcgtune.adapters.sglang.answer_cache import AnswerCache

    cache = cache if cache is not None else AnswerCache()
    answers: dict[int, Answer] = {}
    started = time.time()

    def from_cache(i: int, q: Question, newer_than: float | None) -> None:
        hit = cache.get(q.key)
        if hit is not None and (newer_than is None or hit.created >= newer_than):
            version = hit.answer.get("sglang_version")
            answers[i] = Answer(hit.answer.get("answer"), version if isinstance(version, str) else None, hit.created_text)

    if not refresh:
        for i, q in enumerate(questions):
            from_cache(i, q, None)
    missing = [i for i in range(len(questions)) if i not in answers]
    if missing and not probe:
        for i in missing:
            answers[i] = Answer(None, why=not_asked)
        missing = []
    if missing:
        from bcgtune.adapters.sglang.answer_cache import CacheLocked

        try:
            with cache.asking(on_wait=say):
                for i in missing:  # answered by another bcgtune while this one waited
                    from_cache(i, questions[i], started if refresh else None)
                missing = [i for i in missing if i not in answers]
                if missing:
                    asked = [questions[i] for i in missing]
                    limit = probe_timeout(timeout)
                    if say is not None:
                        what = ", ".join(sorted({_WHAT[q.kind] for q in asked}))
                        say(
                            f"bcgtune: asking the installed SGLang ({what}); a first answer takes {PROBE_TIME_TEXT} "
                            f"(at most {limit:g} s: doctor's --probe-timeout, or ${PROBE_TIMEOUT_ENV}), then it is cached"
                        )
                    result = _probe_with_progress(_request(asked, device), limit, say)
                    version = result.get("sglang_version") if isinstance(result.get("sglang_version"), str) else None
                    error = result.get("error") if isinstance(result.get("error"), str) else None
                    for i, q, raw in zip(missing, asked, _split(result, asked)):
                        answers[i] = Answer(raw, version, None, None if raw is not None else (error or "no answer from SGLang"))
                        if _cacheable(q.kind, raw):
                            cache.put(q.key, {"sglang_version": version, "answer": raw}, _stamps(result, q.kind), q.parts)
        except CacheLocked as exc:  # another bcgtune held it past the wait: no answer, and why
            for i in missing:
                answers.setdefault(i, Answer(None, why=str(exc)))
    return [answers[i] for i in range(len(questions))]


# --------------------------------------------------------------------------- a profile's launch
def _backend_explicit(profile) -> bool:
    from bcgtune.adapters.sglang.flags import prefill_graph_json

    s = profile.server
    return bool(
        "backend" in prefill_graph_json(s)
        or s.get("cuda_graph_backend_prefill")
        or s.get("disable_prefill_cuda_graph") is True
        or s.get("disable_cuda_graph") is True
    )


def _capture_answer(answer: Answer, profile) -> tuple[PrefillCapture | None, str | None]:
    """SGLang's resolution of the launch from its answer, or why there is none. A launch
    SGLang refuses is an answer: nothing is captured, and `refused` says why."""
    raw = answer.raw
    requested = tuple(profile.buckets) if profile.buckets is not None else None
    source = CaptureSource("sglang", sglang_version=answer.sglang_version, cached_at=answer.cached_at)
    if raw is None:
        return None, answer.why
    if raw.get("ok") is True:
        capture = capture_from_sglang(
            raw, answer.sglang_version or "unknown version", requested, profile.platform, _backend_explicit(profile)
        )
        if capture is None:
            return None, "SGLang's answer was incomplete"
        return replace(capture, source=source), None
    if raw.get("refused"):
        where = str(raw.get("where") or "SGLang")[:120]
        if raw.get("function"):
            where += f", {str(raw['function'])[:80]}"
        why = f"{str(raw['refused'])[:400]} ({where})"
        off = PrefillCapture("disabled", f"SGLang refuses this launch: {why}", None, None, 1, (), None)
        return replace(off, source=source, requested=requested, refused=why), None
    return None, f"SGLang could not resolve the launch here: {str(raw.get('error'))[:300]}"


def _runner_answer(answer: Answer) -> RunnerAnswers:
    r = answer.raw
    if r is None:
        return RunnerAnswers(False, None, {}, answer.why or "no answer from the SGLang check")
    raw_answers = r.get("answers")
    answers = raw_answers if isinstance(raw_answers, dict) else {}
    return RunnerAnswers(
        ok=r.get("ok") is True,
        imported=r.get("imported") if isinstance(r.get("imported"), bool) else None,
        answers={k: v for k, v in answers.items() if isinstance(k, str) and isinstance(v, bool)},
        error=str(r["error"])[:400] if r.get("error") else None,
        cached_at=answer.cached_at,
        slots=tuple(str(x) for x in r["slots"]) if isinstance(r.get("slots"), list) else None,
        lines=_answer_lines(r.get("lines")),
        stops_server=r.get("stops_server") is True,
    )


def _answer_lines(raw: Any) -> dict[str, tuple[int, str]]:
    out: dict[str, tuple[int, str]] = {}
    for k, v in raw.items() if isinstance(raw, dict) else ():
        if isinstance(k, str) and isinstance(v, dict) and isinstance(v.get("line"), int):
            out[k] = (v["line"], str(v.get("text") or "")[:200])
    return out


def _flag_answer(answer: Answer, cmd: ServerCommand | None = None) -> FlagCheck:
    """serve's flag check from SGLang's answer, or why there is none (`cmd`: the command
    asked about, whose flag sources the answer names)."""
    raw = answer.raw
    if isinstance(raw, dict) and raw.get("ok") is True:
        return FlagCheck(True, version=answer.sglang_version, cached_at=answer.cached_at)
    if isinstance(raw, dict) and raw.get("ok") is False and "message" in raw:
        return FlagCheck(
            False,
            str(raw.get("message"))[:400],
            (_origin(str(raw.get("where") or ""), cmd) or "")[:200] or None,
            version=answer.sglang_version,
            cached_at=answer.cached_at,
        )
    why = answer.why or (str(raw.get("error")) if isinstance(raw, dict) else "no answer")
    return FlagCheck(None, why)


def check_flags(
    cmd: ServerCommand, *, probe: bool = True, refresh: bool = False, not_asked: str = "not asked", say=None
) -> FlagCheck:
    """serve's flag check of a command against the installed SGLang's parser (cached)."""
    if not sglang_installed():
        return FlagCheck(None, "sglang is not installed")
    (answer,) = ask([flags_question(cmd)], _DEFAULT_DEVICE, probe=probe, refresh=refresh, not_asked=not_asked, say=say)
    return _flag_answer(answer, cmd)


_DEFAULT_DEVICE = {"platform": "cuda", "name": "NVIDIA H200", "memory_gib": 141.0, "capability": [9, 0]}


def unasked(profile, model: str | None, why: str, runner_sources: Sequence[str | None], check_flags: bool) -> SglangAnswers:
    """The answers when SGLang is not asked: each says why."""
    notes: list[str] = []
    config_dir = None
    if profile is not None:
        _, notes = device_for(profile)
        config_dir, _ = locate_model_config(model)
    runners = tuple(RunnerAnswers(False, None, {}, why) for _ in runner_sources)
    flags = FlagCheck(None, why) if check_flags and profile is not None else None
    return SglangAnswers(None, None, runners, flags, why, capture_error=why, notes=tuple(notes), config_dir=config_dir)


def ask_sglang(
    profile,
    model: str | None = None,
    *,
    runner_sources: Sequence[str | None] = (),
    check_flags: bool = False,
    resolve: bool = True,
    timeout: float | None = None,
    probe: bool = True,
    refresh: bool = False,
    not_asked: str = "not asked",
    say=None,
    flags_cmd: ServerCommand | None = None,
) -> SglangAnswers:
    """SGLang's answers for a profile: the resolved prefill capture of its launch
    (`resolve`), serve's flag check (`check_flags`; of `flags_cmd` when given, e.g. with
    serve's --port and extra arguments), and the runner gate of each of
    `runner_sources` (None: the installed runner; a path: a copy). Each comes from the
    answer cache, or, when `probe`, from one child process that answers every question
    not cached; `not_asked` says why SGLang was not asked when it is not."""
    model = model or (profile.model if profile is not None else None)
    if not sglang_installed():
        return unasked(profile, model, "sglang is not installed", runner_sources, check_flags)
    device, notes = device_for(profile) if profile is not None else (dict(_DEFAULT_DEVICE), [])
    config_dir, config_why = locate_model_config(model) if (resolve and profile is not None) else (None, None)
    cmd, serve_refusal = None, None
    if profile is not None and (resolve or check_flags):
        try:
            cmd = build_server_command(profile, model=model)
        except InputError as exc:  # serve refuses before any flag is checked
            serve_refusal = exc
    questions: list[Question] = []
    if resolve and config_dir is not None and cmd is not None:
        argv = list(cmd.argv[3:])
        argv[argv.index("--model-path") + 1] = str(config_dir)
        questions.append(launch_question(argv, device, config_dir, getattr(profile, "env", None)))
    checked_cmd = flags_cmd if flags_cmd is not None else cmd
    if check_flags and checked_cmd is not None:
        questions.append(flags_question(checked_cmd))
    questions += [runner_question(src, device) for src in runner_sources]
    got = dict(
        zip(
            [id(q) for q in questions],
            ask(questions, device, probe=probe, refresh=refresh, not_asked=not_asked, timeout=timeout, say=say),
        )
    )
    by_kind = {q.kind: got[id(q)] for q in questions if q.kind != "runners"}
    # without the model's config on this machine SGLang cannot resolve the launch at all:
    # that is the reason, whether or not it could have been started
    capture, capture_error = None, config_why or (serve_refusal.what if serve_refusal is not None else None)
    if "launches" in by_kind:
        capture, capture_error = _capture_answer(by_kind["launches"], profile)
    flags = None
    if check_flags and serve_refusal is not None and flags_cmd is None:
        flags = FlagCheck(False, serve_refusal.what, serve_refusal.where)
    elif "flags" in by_kind:
        flags = _flag_answer(by_kind["flags"], checked_cmd)
    runners = tuple(_runner_answer(got[id(q)]) for q in questions if q.kind == "runners")
    versions = [a.sglang_version for a in got.values() if a.sglang_version]
    errors = [a.why for a in got.values() if a.raw is None and a.why]
    return SglangAnswers(
        versions[0] if versions else None,
        capture,
        runners,
        flags,
        errors[0] if errors else None,
        capture_error,
        (),
        tuple(notes),
        config_dir,
    )


def _jsonable(v):
    if isinstance(v, (str, int, float, bool)) or v is None:
        return v
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    return str(v)
