"""Ask the installed SGLang itself what it will do with a profile's launch.

`ask_sglang` runs `bcgtune.adapters.sglang_probe` in a child process (its own session,
a deadline, its output kept away from ours) and returns typed answers: the prefill
graphs SGLang's resolution pipeline settles on, whether `serve`'s flag check accepts the
launch, and how the prefill runner's multimodal gate behaves. It never substitutes a
model for an answer: when SGLang cannot answer, the answer says why, and the caller
(bcgtune.services.launch) decides what to say instead.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bcgtune.adapters.hardware import GpuSpec, gpu_for
from bcgtune.adapters.launcher import ServerCommand, build_server_command
from bcgtune.adapters.model_config import locate_model_config
from bcgtune.core.ladder import CaptureSource, PrefillBackend, PrefillCapture
from bcgtune.errors import InputError

DEFAULT_TIMEOUT_S = 300.0
# A small public model config (Qwen/Qwen3-0.6B's config.json) that the runner check
# resolves a launch with: the gate under test keys on the model the stand-in model
# runner reports, not on this one.
PROBE_CONFIG_DIR = Path(__file__).resolve().parent.parent / "data" / "sglang_probe"
_INT32_MAX = 2**31 - 1
_BACKENDS: tuple[PrefillBackend, ...] = ("breakable", "full", "disabled")


@dataclass(frozen=True)
class RunnerAnswers:
    """The prefill runner's own answers, or why there are none. `imported`: whether the
    runner module imported (False: callers fall back to reading its source)."""

    ok: bool
    imported: bool | None
    answers: dict[str, bool] = field(default_factory=dict)
    error: str | None = None


@dataclass(frozen=True)
class FlagCheck:
    """serve's flag check run on the launch: ok, or the message and where (the profile
    key); ok None when it could not run."""

    ok: bool | None
    message: str | None = None
    where: str | None = None


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
    return {
        "platform": platform,
        "name": spec.name,
        "memory_gib": spec.memory_gib,
        "capability": list(spec.capability),
        "gcn_arch": spec.gcn_arch,
    }, notes


def sglang_installed() -> bool:
    try:
        return importlib.util.find_spec("sglang") is not None
    except (ImportError, ValueError):
        return False


def run_probe(request: dict, *, timeout: float = DEFAULT_TIMEOUT_S) -> dict:
    """Run the probe child on `request`; its JSON answer, or {"error": why}. The child's
    own output goes to a temporary file and only its last line is ever quoted."""
    pkg_root = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ)
    env["PYTHONPATH"] = pkg_root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["HF_HUB_OFFLINE"] = "1"
    env["TRANSFORMERS_OFFLINE"] = "1"
    with tempfile.TemporaryDirectory(prefix="bcgtune-probe-") as tmp:
        req_path, out_path, log_path = (Path(tmp) / n for n in ("request.json", "result.json", "child.log"))
        req_path.write_text(json.dumps(request), encoding="utf-8")
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "bcgtune.adapters.sglang_probe", str(req_path), str(out_path)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=tmp,
                start_new_session=True,
            )
            try:
                rc = proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                _kill(proc)
                return {"error": f"SGLang did not answer within {timeout:g} s"}
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
    from bcgtune.core.ladder import sglang_default_ladder

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


def _backend_explicit(profile) -> bool:
    from bcgtune.adapters.sglang_flags import prefill_graph_json

    s = profile.server
    return bool(
        "backend" in prefill_graph_json(s)
        or s.get("cuda_graph_backend_prefill")
        or s.get("disable_prefill_cuda_graph") is True
        or s.get("disable_cuda_graph") is True
    )


@dataclass(frozen=True)
class _ProbeRequest:
    """What one child process is asked (`request`: the device, and the launches, flag
    check and runners asked about), with what building it found: `notes` on the device,
    the model's config folder or why it is not on this machine, and serve's command for
    the profile or why serve refuses it."""

    request: dict[str, Any]
    notes: tuple[str, ...]
    config_dir: Path | None
    config_why: str | None
    cmd: ServerCommand | None
    refused: InputError | None

    @property
    def asks_anything(self) -> bool:
        return len(self.request) > 1  # more than the device


def _build_request(
    profile, model: str | None, *, resolve: bool, check_flags: bool, runner_sources: Sequence[str | None]
) -> _ProbeRequest:
    request: dict[str, Any] = {}
    notes: list[str] = []
    if profile is not None:
        request["device"], notes = device_for(profile)
    else:
        request["device"] = {"platform": "cuda", "name": "NVIDIA H200", "memory_gib": 141.0, "capability": [9, 0]}
    config_dir, config_why = locate_model_config(model) if (resolve and profile is not None) else (None, None)
    cmd = None
    refused: InputError | None = None
    if profile is not None and (resolve or check_flags):
        try:
            cmd = build_server_command(profile, model=model)
        except InputError as exc:  # serve refuses before any flag is checked
            refused = exc
    if resolve and profile is not None and config_dir is not None and cmd is not None:
        argv = list(cmd.argv[3:])
        argv[argv.index("--model-path") + 1] = str(config_dir)
        request["launches"] = [argv]
    if check_flags and cmd is not None:
        request["flags"] = {
            "argv": cmd.argv,
            "sources": [
                {"flag": s.flag, "origin": s.origin, "value": _jsonable(s.value), "from_profile": s.from_profile}
                for s in cmd.sources
            ],
        }
    if runner_sources:
        request["runners"] = {
            "config_dir": str(PROBE_CONFIG_DIR),
            "sources": [None if s is None else str(Path(s).resolve()) for s in runner_sources],
        }
    return _ProbeRequest(request, tuple(notes), config_dir, config_why, cmd, refused)


def _capture_answer(
    result: dict, asked: _ProbeRequest, profile, version: str | None, error: str | None
) -> tuple[PrefillCapture | None, str | None]:
    """SGLang's resolution of the launch from the child's answer, or why there is none."""
    launches = result.get("launches")
    launch = launches[0] if isinstance(launches, list) and launches and isinstance(launches[0], dict) else None
    if launch is not None and launch.get("ok") is True:
        capture = capture_from_sglang(
            launch,
            version or "unknown version",
            tuple(profile.buckets) if profile.buckets is not None else None,
            profile.platform,
            _backend_explicit(profile),
        )
        if capture is None:
            return None, "SGLang's answer was incomplete"
        return capture, None
    if launch is not None:
        return None, f"SGLang refused the launch: {launch.get('error')}"
    return None, error or asked.config_why or "the launch could not be built from the profile"


def _runner_answers(raw: Any, runner_sources: Sequence[str | None], error: str | None) -> tuple[RunnerAnswers, ...]:
    """The child's answer for each runner asked about, in order; a missing one says why."""
    runners = []
    for i, _src in enumerate(runner_sources):
        r = raw[i] if isinstance(raw, list) and i < len(raw) and isinstance(raw[i], dict) else None
        if r is None:
            runners.append(RunnerAnswers(False, None, {}, error or "no answer from the SGLang check"))
            continue
        answers = r.get("answers") if isinstance(r.get("answers"), dict) else {}
        runners.append(
            RunnerAnswers(
                ok=r.get("ok") is True,
                imported=r.get("imported") if isinstance(r.get("imported"), bool) else None,
                answers={k: v for k, v in answers.items() if isinstance(k, str) and isinstance(v, bool)},
                error=str(r["error"])[:400] if r.get("error") else None,
            )
        )
    return tuple(runners)


def _flag_answer(raw: Any, asked: _ProbeRequest, error: str | None) -> FlagCheck | None:
    """serve's flag check: refused before any flag was checked, SGLang's verdict, or why
    there is none (None when there was no command to check)."""
    if asked.refused is not None:
        return FlagCheck(False, asked.refused.what, asked.refused.where)
    if asked.cmd is None:
        return None
    if isinstance(raw, dict) and raw.get("ok") is True:
        return FlagCheck(True)
    if isinstance(raw, dict) and raw.get("ok") is False:
        return FlagCheck(False, str(raw.get("message"))[:400], str(raw.get("where") or "")[:200] or None)
    return FlagCheck(None, error or (str(raw.get("error")) if isinstance(raw, dict) else "no answer"))


def unasked(profile, model: str | None, why: str, runner_sources: Sequence[str | None], check_flags: bool) -> SglangAnswers:
    """The answers when SGLang is not asked: each says why."""
    notes: list[str] = []
    config_dir = None
    if profile is not None:
        _, notes = device_for(profile)
        config_dir, _ = locate_model_config(model)
    runners = tuple(RunnerAnswers(False, False, {}, why) for _ in runner_sources)
    flags = FlagCheck(None, why) if check_flags and profile is not None else None
    return SglangAnswers(None, None, runners, flags, why, capture_error=why, notes=tuple(notes), config_dir=config_dir)


def ask_sglang(
    profile,
    model: str | None = None,
    *,
    runner_sources: Sequence[str | None] = (),
    check_flags: bool = False,
    resolve: bool = True,
    timeout: float = DEFAULT_TIMEOUT_S,
) -> SglangAnswers:
    """One child process answers everything asked: the resolved prefill capture of the
    profile's launch (`resolve`), serve's flag check (`check_flags`), and the runner gate
    of each of `runner_sources` (None: the installed runner; a path: a copy)."""
    model = model or (profile.model if profile is not None else None)
    if not sglang_installed():
        return unasked(profile, model, "sglang is not installed", runner_sources, check_flags)
    asked = _build_request(profile, model, resolve=resolve, check_flags=check_flags, runner_sources=runner_sources)
    if not asked.asks_anything:
        answers = unasked(profile, model, asked.config_why or "nothing to ask", runner_sources, False)
        if check_flags and asked.refused is not None:
            return SglangAnswers(
                None,
                None,
                answers.runners,
                _flag_answer(None, asked, None),
                answers.error,
                answers.capture_error,
                notes=answers.notes,
                config_dir=answers.config_dir,
            )
        return answers
    result = run_probe(asked.request, timeout=timeout)
    version = result.get("sglang_version") if isinstance(result.get("sglang_version"), str) else None
    error = result.get("error") if isinstance(result.get("error"), str) else None
    capture, capture_error = (None, None)
    if resolve and profile is not None:
        capture, capture_error = _capture_answer(result, asked, profile, version, error)
    runners = _runner_answers(result.get("runners"), runner_sources, error)
    flags = _flag_answer(result.get("flags"), asked, error) if check_flags else None
    raw_placeholders = result.get("placeholders")
    placeholders = raw_placeholders if isinstance(raw_placeholders, list) else []
    return SglangAnswers(
        version,
        capture,
        runners,
        flags,
        error,
        capture_error,
        tuple(str(p) for p in placeholders),
        asked.notes,
        asked.config_dir,
    )


def _jsonable(v):
    if isinstance(v, (str, int, float, bool)) or v is None:
        return v
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    return str(v)
