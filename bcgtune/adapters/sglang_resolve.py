"""What the installed SGLang will do with a profile's launch, asked of SGLang itself.

`ask_sglang` runs `bcgtune.adapters.sglang_probe` in a child process (its own session,
a deadline, its output kept away from ours) and returns typed answers: the prefill
graphs SGLang's resolution pipeline settles on, whether `serve`'s flag check accepts the
launch, and how the prefill runner's multimodal gate behaves. When SGLang cannot be
asked (not installed, a missing import, the model's config not on this machine, a
crash or the deadline), the resolution falls back to bcgtune's model of SGLang's rules
(`bcgtune.core.ladder.resolve_prefill_capture`) and says why.

Library API:
    resolve_prefill(profile, model=None) -> ResolvedPrefill
    ask_sglang(profile, model=None, runner_sources=(...), check_flags=True) -> SglangAnswers
(rendered by bcgtune/cli/render/doctor.py)
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
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from bcgtune.adapters.hardware import GpuSpec, gpu_for
from bcgtune.adapters.launcher import ServerCommand, build_server_command
from bcgtune.errors import InputError

DEFAULT_TIMEOUT_S = 300.0
FALLBACK_SOURCE = "bcgtune model"
# A small public model config (Qwen/Qwen3-0.6B's config.json) that the runner check
# resolves a launch with: the gate under test keys on the model the stand-in model
# runner reports, not on this one.
_PROBE_CONFIG_DIR = Path(__file__).resolve().parent.parent / "data" / "sglang_probe"
_INT32_MAX = 2**31 - 1


@dataclass(frozen=True)
class ResolvedPrefill:
    """What the server will do with prefill CUDA graphs.

    `backend`: breakable | full | disabled (disabled also when the list is empty);
    `reason`: why; `buckets`: exactly the buckets it captures (empty when off);
    `max_bs`: the ladder maximum SGLang resolves for this launch; `alignment`: the
    multiple buckets are rounded up to at capture; `chunked_prefill_size`: per
    attention-DP rank; `source`: "sglang <version>" or "bcgtune model";
    `fallback_reason`: why SGLang itself was not asked (None when it was);
    `requested`: the profile's list (None: SGLang's default ladder); `notes`: changes
    SGLang makes to what was asked, and what could not be checked."""

    backend: str
    reason: str
    buckets: tuple[int, ...]
    max_bs: int | None
    alignment: int
    chunked_prefill_size: int | None
    source: str
    fallback_reason: str | None = None
    requested: tuple[int, ...] | None = None
    notes: tuple[str, ...] = ()

    @property
    def graphs_on(self) -> bool:
        return self.backend != "disabled" and bool(self.buckets)

    def to_dict(self) -> dict:
        return {
            "backend": self.backend,
            "reason": self.reason,
            "buckets": list(self.buckets),
            "max_bs": self.max_bs,
            "alignment": self.alignment,
            "chunked_prefill_size": self.chunked_prefill_size,
            "source": self.source,
            "fallback_reason": self.fallback_reason,
            "requested": None if self.requested is None else list(self.requested),
            "notes": list(self.notes),
        }


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
    sglang_version: str | None
    resolved: ResolvedPrefill | None
    runners: tuple[RunnerAnswers, ...]
    flags: FlagCheck | None
    error: str | None = None  # why SGLang could not be asked at all
    placeholders: tuple[str, ...] = ()


# --------------------------------------------------------------------------- the model's config
def hf_cache_dir() -> Path:
    """Where huggingface_hub keeps downloads (HF_HUB_CACHE, else HF_HOME/hub, else
    ~/.cache/huggingface/hub), without importing it."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    return Path(os.environ.get("XDG_CACHE_HOME", "~/.cache")).expanduser() / "huggingface" / "hub"


def locate_model_config(model: str | None) -> tuple[Path | None, str | None]:
    """(folder holding config.json, None) for a local model folder or a hub id present
    in the local Hugging Face cache; (None, why) otherwise. Never downloads."""
    if not model:
        return None, "the profile names no model ([profile].model or --model)"
    local = Path(model).expanduser()
    try:
        if local.is_dir():
            if (local / "config.json").is_file():
                return local, None
            return None, f"no config.json in {local}"
    except OSError:
        pass
    parts = model.strip("/").split("/")
    if len(parts) != 2 or not all(parts):
        return None, f"{model!r} is neither a local model folder nor a Hugging Face hub id"
    repo = hf_cache_dir() / ("models--" + "--".join(parts))
    snapshots = repo / "snapshots"
    try:
        ref = (repo / "refs" / "main").read_text(encoding="utf-8").strip()
    except OSError:
        ref = ""
    candidates = [snapshots / ref] if ref else []
    try:
        candidates += sorted(p for p in snapshots.iterdir() if p.is_dir())
    except OSError:
        pass
    for snap in candidates:
        if (snap / "config.json").is_file():
            return snap, None
    return None, f"{model} is not in the local Hugging Face cache ({hf_cache_dir()})"


def _read_config(folder: Path | None) -> dict:
    if folder is None:
        return {}
    try:
        data = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return {}
    return data if isinstance(data, dict) else {}


def _is_mla(config: dict) -> bool:
    """Multi-head latent attention models (DeepSeek-V2/V3 family, Kimi, ...) carry
    kv_lora_rank in their config (SGLang: ModelConfig.attention_arch == MLA)."""
    for cfg in (config, config.get("text_config") if isinstance(config.get("text_config"), dict) else {}):
        if cfg.get("kv_lora_rank"):
            return True
    return False


# --------------------------------------------------------------------------- the child
def _device(profile) -> tuple[dict, list[str]]:
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


def _resolved_from_sglang(launch: dict, version: str, requested, platform: str, explicit: bool) -> ResolvedPrefill | None:
    backend = launch.get("backend")
    captured = _int_list(launch.get("captured"))
    align = _opt_int(launch.get("alignment"))
    if not isinstance(backend, str) or captured is None or align is None or align < 1:
        return None
    effective = backend if captured else "disabled"
    notes = [m for m in launch.get("messages", []) if isinstance(m, str) and "aligning" in m]
    return ResolvedPrefill(
        backend=effective,
        reason=_reason_from_sglang(launch, effective, explicit, platform),
        buckets=captured,
        max_bs=_opt_int(launch.get("max_bs")),
        alignment=align,
        chunked_prefill_size=_opt_int(launch.get("chunked_prefill_size")),
        source=f"sglang {version}",
        requested=requested,
        notes=tuple(n[:300] for n in notes),
    )


def resolve_with_model(
    profile,
    model: str | None = None,
    *,
    fallback_reason: str | None = None,
    config_dir: Path | None = None,
    extra_notes: Sequence[str] = (),
) -> ResolvedPrefill:
    """bcgtune's model of SGLang's rules for the profile (no SGLang needed)."""
    from bcgtune.adapters.sglang_flags import prefill_launch_from_server_flags
    from bcgtune.core.ladder import resolve_prefill_capture

    model = model or profile.model or ""
    spec = gpu_for(getattr(profile, "hardware", None))
    launch = prefill_launch_from_server_flags(
        profile.server,
        platform=profile.platform,
        gpu_memory_gib=spec.memory_gib if spec is not None else None,
        buckets=profile.buckets,
        model_path=model,
        mla=_is_mla(_read_config(config_dir)),
    )
    cap = resolve_prefill_capture(launch)
    notes = list(extra_notes) + list(cap.notes)
    if config_dir is None:
        notes.append("rules that depend on the model's architecture were not checked (its config is not on this machine)")
    return ResolvedPrefill(
        backend=cap.backend if cap.captured else "disabled",
        reason=cap.reason,
        buckets=cap.captured,
        max_bs=cap.max_bs,
        alignment=cap.alignment,
        chunked_prefill_size=cap.chunked_prefill_size,
        source=FALLBACK_SOURCE,
        fallback_reason=fallback_reason,
        requested=tuple(profile.buckets) if profile.buckets is not None else None,
        notes=tuple(notes),
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
        request["device"], notes = _device(profile)
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
            "config_dir": str(_PROBE_CONFIG_DIR),
            "sources": [None if s is None else str(Path(s).resolve()) for s in runner_sources],
        }
    return _ProbeRequest(request, tuple(notes), config_dir, config_why, cmd, refused)


def _resolved_answer(
    result: dict, asked: _ProbeRequest, profile, model: str | None, version: str | None, error: str | None
) -> ResolvedPrefill | None:
    """SGLang's resolution of the launch from the child's answer; else the fallback
    model's, with why SGLang's answer could not be used."""
    launches = result.get("launches")
    launch = launches[0] if isinstance(launches, list) and launches and isinstance(launches[0], dict) else None
    why = error or asked.config_why
    if launch is not None and launch.get("ok") is True:
        resolved = _resolved_from_sglang(
            launch,
            version or "unknown version",
            tuple(profile.buckets) if profile.buckets is not None else None,
            profile.platform,
            _backend_explicit(profile),
        )
        if resolved is not None:
            return replace(resolved, notes=asked.notes + resolved.notes) if asked.notes else resolved
        why = "SGLang's answer was incomplete"
    elif launch is not None:
        why = f"SGLang refused the launch: {launch.get('error')}"
    elif why is None:
        why = "the launch could not be built from the profile"
    return _model_or_none(profile, model, why, asked.config_dir, list(asked.notes))


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


def ask_sglang(
    profile,
    model: str | None = None,
    *,
    runner_sources: Sequence[str | None] = (),
    check_flags: bool = False,
    resolve: bool = True,
    timeout: float = DEFAULT_TIMEOUT_S,
    probe: bool = True,
) -> SglangAnswers:
    """One child process answers everything asked: the resolved prefill capture of the
    profile's launch (`resolve`), serve's flag check (`check_flags`), and the runner gate
    of each of `runner_sources` (None: the installed runner; a path: a copy). `probe`
    False: ask nothing (bcgtune's model of the rules answers, and says so)."""
    model = model or (profile.model if profile is not None else None)
    if not probe:
        return _unasked(profile, model, "--no-sglang-probe", resolve, runner_sources, check_flags)
    if not sglang_installed():
        return _unasked(profile, model, "sglang is not installed", resolve, runner_sources, check_flags)
    asked = _build_request(profile, model, resolve=resolve, check_flags=check_flags, runner_sources=runner_sources)
    if not asked.asks_anything:
        answers = _unasked(profile, model, asked.config_why or "nothing to ask", resolve, runner_sources, False)
        if check_flags and asked.refused is not None:
            answers = replace(answers, flags=_flag_answer(None, asked, None))
        return answers
    result = run_probe(asked.request, timeout=timeout)
    version = result.get("sglang_version") if isinstance(result.get("sglang_version"), str) else None
    error = result.get("error") if isinstance(result.get("error"), str) else None
    resolved = _resolved_answer(result, asked, profile, model, version, error) if resolve and profile is not None else None
    runners = _runner_answers(result.get("runners"), runner_sources, error)
    flags = _flag_answer(result.get("flags"), asked, error) if check_flags else None
    placeholders = result.get("placeholders") if isinstance(result.get("placeholders"), list) else []
    return SglangAnswers(version, resolved, runners, flags, error, tuple(str(p) for p in placeholders))


def _model_or_none(profile, model, why, config_dir, notes) -> ResolvedPrefill | None:
    """The fallback model's answer; None when the launch's own values are invalid (the
    caller reports that, e.g. doctor as a blocking finding)."""
    try:
        return resolve_with_model(profile, model, fallback_reason=why, config_dir=config_dir, extra_notes=notes)
    except InputError:
        return None


def _jsonable(v):
    if isinstance(v, (str, int, float, bool)) or v is None:
        return v
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    return str(v)


def _unasked(profile, model, why: str, resolve: bool, runner_sources, check_flags: bool = False) -> SglangAnswers:
    resolved = None
    if resolve and profile is not None:
        config_dir, _ = locate_model_config(model)
        _, notes = _device(profile)
        resolved = _model_or_none(profile, model, why, config_dir, notes)
    runners = tuple(RunnerAnswers(False, False, {}, why) for _ in runner_sources)
    flags = FlagCheck(None, why) if check_flags and profile is not None else None
    return SglangAnswers(None, resolved, runners, flags, why)


def resolve_prefill(profile, model: str | None = None, *, timeout: float = DEFAULT_TIMEOUT_S) -> ResolvedPrefill:
    """The prefill graphs the server will capture for `profile` (model: overrides
    [profile].model): SGLang's own resolution when it can be asked, else bcgtune's model
    of its rules with the reason."""
    answers = ask_sglang(profile, model, resolve=True, timeout=timeout)
    if answers.resolved is None:  # the launch's values are invalid: say which
        return resolve_with_model(profile, model, fallback_reason=answers.error)
    return answers.resolved
