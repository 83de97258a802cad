"""What SGLang will capture for a launch: the one answer every command prices with.

Two sources answer. SGLang's own resolution, asked in a child process
(bcgtune.adapters.sglang.resolve) and kept in the answer cache
(bcgtune.adapters.sglang.answer_cache), is used whenever it is available. Otherwise bcgtune's
model of its rules answers (bcgtune.core.sglang.capture.resolve_prefill_capture) and names what it
could not check, and the answer says why SGLang's own was not used.

When SGLang is asked (`sglang`):
  "ask"    the cache, else SGLang in a child process (sglang_resolve.PROBE_TIME_TEXT the
           first time, at most --probe-timeout), cached: wherever a command writes a
           profile or judges a launch (doctor, serve, drift, tune, suggest-buckets with a
           profile), by default
  "off"    the user switched asking off (--no-sglang-probe): the cache only, and an answer
           without it says so
  "cache"  the cache only: an answer SGLang gave before is used, nothing is started
           (suggest-buckets' list for a trace alone, which writes nothing: --ask-sglang asks)
  "never"  the model only
Where SGLang did not check a launch, --write-profile writes only what the model vouches for
(no rule named as not checked), else only with --unchecked (`require_vouched`), and the
profile records it ([buckets].launch_check).
BCGTUNE_SGLANG_PROBE=off never starts SGLang ("ask" reads the cache only); the test suite
sets it so that ordinary tests run on the model.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

from bcgtune.core.sglang.capture import CaptureSource, PrefillCapture, resolve_prefill_capture
from bcgtune.errors import InputError

SglangUse = Literal["ask", "off", "cache", "never"]
PROBE_ENV = "BCGTUNE_SGLANG_PROBE"
# why SGLang's own answer is missing when only the cache was read
NOT_CACHED = "no cached answer from SGLang for this launch"
SWITCHED_OFF = "asking SGLang was switched off (--no-sglang-probe)"


def sglang_use(no_probe: bool, *, ask: bool = True) -> SglangUse:
    """How a command asks SGLang: "off" with --no-sglang-probe, else "ask" (or "cache"
    where the command does not ask by default)."""
    return "off" if no_probe else ("ask" if ask else "cache")


def probe_time_text() -> str:
    """What a first answer from SGLang costs, as measured (sglang_resolve.PROBE_TIME_TEXT)."""
    from bcgtune.adapters.sglang.resolve import PROBE_TIME_TEXT

    return PROBE_TIME_TEXT


def probe_switched_off() -> bool:
    """BCGTUNE_SGLANG_PROBE=off (or 0, no, false): never start SGLang."""
    return os.environ.get(PROBE_ENV, "").strip().lower() in ("0", "off", "no", "false")


def _may_start(use: SglangUse, skipped_by: str | None) -> tuple[bool, str]:
    """(whether SGLang may be started, why it is not when it is not)."""
    if use == "ask" and skipped_by is None and not probe_switched_off():
        return True, ""
    if skipped_by is not None:
        return False, skipped_by
    if use == "off":
        return False, SWITCHED_OFF
    if use == "ask":
        return False, f"{PROBE_ENV}=off"
    return False, NOT_CACHED


def _model_launch(
    flags: Mapping[str, Any],
    *,
    platform: str,
    buckets,
    model_path: str,
    gpu_memory_gib: float | None,
    hardware: str | None,
    env: Mapping[str, str] | None,
    config_dir: Path | None,
):
    from bcgtune.adapters.machine.hardware import gpu_for
    from bcgtune.adapters.machine.model_config import read_model_config
    from bcgtune.adapters.sglang.flags import prefill_launch_from_server_flags

    spec = gpu_for(hardware)
    return prefill_launch_from_server_flags(
        flags,
        platform=platform,
        gpu_memory_gib=spec.memory_gib if spec is not None and gpu_memory_gib is None else gpu_memory_gib,
        buckets=buckets,
        model_path=model_path,
        model_config=read_model_config(config_dir) if config_dir is not None else None,
        gpu_capability=spec.capability if spec is not None else None,
        env=env,
    )


def model_capture(
    profile,
    model: str | None = None,
    *,
    not_asked: str | None = None,
    config_dir: Path | None = None,
    extra_notes: Sequence[str] = (),
) -> PrefillCapture:
    """bcgtune's model of SGLang's rules for a profile's launch (no SGLang needed). Raises
    InputError when the launch's own values are invalid."""
    from bcgtune.adapters.machine.model_config import locate_model_config

    model = model or profile.model or ""
    if config_dir is None and model:
        config_dir, _ = locate_model_config(model)
    try:
        launch = _model_launch(
            profile.server,
            platform=profile.platform,
            buckets=profile.buckets,
            model_path=model,
            gpu_memory_gib=None,
            hardware=getattr(profile, "hardware", None),
            env=getattr(profile, "env", None),
            config_dir=config_dir,
        )
    except InputError as e:
        where = getattr(profile, "where", None)
        if not where or (e.where and ("/" in e.where or ":" in e.where)):
            raise
        # a launch flag's value: named as the profile's file and key
        key = (e.where or e.field or "").replace("_", "-")
        raise InputError(e.what, f"{where}: [server].{key}" if key else where) from None
    cap = resolve_prefill_capture(launch)
    return replace(
        cap,
        backend=cap.backend if cap.graphs_on else "disabled",
        notes=tuple(extra_notes) + cap.notes,
        source=CaptureSource("model", not_asked=not_asked),
        requested=tuple(profile.buckets) if profile.buckets is not None else None,
    )


def capture_for_flags(
    flags: Mapping[str, Any],
    *,
    platform: str = "cuda",
    buckets: list[int] | tuple[int, ...] | None = None,
    model_path: str = "",
    gpu_memory_gib: float | None = None,
    hardware: str | None = None,
    env: Mapping[str, str] | None = None,
    sglang: SglangUse = "cache",
    refresh: bool = False,
    say=None,
    source: Any = None,
) -> PrefillCapture:
    """The prefill graphs SGLang captures for a launch given as flags (a profile's [server]
    table, or the layout flags of suggest-buckets), with the launch's bucket list.
    `hardware`: the GPU ([profile].hardware); `model_path`: the model (its config, when on
    this machine, decides the rules on its architecture; without one SGLang is asked about
    a plain dense model, and the answer says so). `sglang`: when SGLang's own answer is
    used (see the module's docstring); `source`: the profile file the flags come from (named
    in errors)."""
    from bcgtune.files.profile_file import Profile, snake

    profile = Profile(
        name="launch",
        path=Path(source) if source is not None else None,
        platform=platform,
        hardware=hardware or "",
        model=model_path or None,
        server={snake(str(k)): v for k, v in flags.items()},
        buckets=list(buckets) if buckets is not None else None,
        env=dict(env or {}),
    )
    if gpu_memory_gib is not None and not hardware:
        # a GPU known only by its memory: the model answers (SGLang is told about a GPU)
        launch = _model_launch(
            flags,
            platform=platform,
            buckets=buckets,
            model_path=model_path,
            gpu_memory_gib=gpu_memory_gib,
            hardware=None,
            env=env,
            config_dir=None,
        )
        cap = resolve_prefill_capture(launch)
        return replace(cap, source=CaptureSource("model", not_asked="the GPU is known only by its memory"))
    return answers_for_profile(profile, sglang=sglang, refresh=refresh, stand_in_model=not model_path, say=say).capture_or_raise()


@dataclass(frozen=True)
class LaunchAnswers:
    """Everything known about a profile's launch. `capture`: what it captures (SGLang's
    own answer, or the model's with why); None with `invalid` when the launch's own values
    are invalid. `flags`: serve's flag check (None: not asked). `runners`: the runner gate
    answers asked for. `sglang_version`: the SGLang that answered, if any."""

    capture: PrefillCapture | None
    invalid: InputError | None
    flags: Any
    runners: tuple[Any, ...]
    sglang_version: str | None

    def capture_or_raise(self) -> PrefillCapture:
        if self.capture is None:
            raise self.invalid or InputError("the launch could not be resolved")
        return self.capture


def answers_for_profile(
    profile,
    model: str | None = None,
    *,
    sglang: SglangUse = "ask",
    skipped_by: str | None = None,
    refresh: bool = False,
    runner_sources: Sequence[str | None] = (),
    check_flags: bool = False,
    resolve: bool = True,
    stand_in_model: bool = False,
    timeout: float | None = None,
    ask=None,
    say=None,
    flags_cmd=None,
) -> LaunchAnswers:
    """SGLang's answers for a profile's launch (the capture, serve's flag check, each runner
    asked about), from the cache or one child process as `sglang` allows; the model answers
    the capture when SGLang did not. `skipped_by`: the user's reason not to start SGLang
    (e.g. --no-sglang-probe); `stand_in_model`: the profile names no model, so SGLang is
    asked about a plain dense one (Qwen3-0.6B's config) and the answer says so. `ask`: how
    SGLang is asked (sglang_resolve.ask_sglang); `flags_cmd`: the command whose flags are
    checked (default: the profile's own launch)."""
    from bcgtune.adapters.sglang import resolve as sr

    model = model or (profile.model if profile is not None else None)
    asked_profile, asked_model = profile, model
    if stand_in_model and profile is not None:
        asked_profile = replace(profile, model=str(sr.PROBE_CONFIG_DIR))
        asked_model = asked_profile.model
    start, why = _may_start(sglang, skipped_by)
    if sglang == "never":
        answers = sr.unasked(profile, model, skipped_by or "not asked", runner_sources, check_flags)
    else:
        more = {} if timeout is None else {"timeout": timeout}
        answers = (ask or sr.ask_sglang)(
            asked_profile,
            asked_model,
            runner_sources=runner_sources,
            check_flags=check_flags,
            resolve=resolve,
            probe=start,
            refresh=refresh,
            not_asked=why,
            say=say,
            flags_cmd=flags_cmd,
            **more,
        )
    capture, invalid = None, None
    if resolve and profile is not None:
        capture, invalid = _capture(profile, model, answers, stand_in_model)
    return LaunchAnswers(capture, invalid, answers.flags, answers.runners, answers.sglang_version)


STAND_IN_NOTE = "SGLang's rules on the model (none given)"


def _capture(profile, model, answers, stand_in_model: bool) -> tuple[PrefillCapture | None, InputError | None]:
    if answers.capture is not None:
        cap = replace(answers.capture, notes=answers.notes + answers.capture.notes)
        return (_stand_in(cap) if stand_in_model else cap), None
    try:
        cap = model_capture(
            profile,
            model,
            not_asked=answers.capture_error or answers.error,
            config_dir=None if stand_in_model else answers.config_dir,
            extra_notes=answers.notes,
        )
    except InputError as exc:
        return None, exc
    return (_stand_in(cap) if stand_in_model else cap), None


def _stand_in(cap: PrefillCapture) -> PrefillCapture:
    """No model was given: one entry says the rules on it were not checked."""
    from bcgtune.core.sglang.capture import ARCH_UNCHECKED

    rest = tuple(u for u in cap.unchecked if not u.startswith(ARCH_UNCHECKED))
    return replace(cap, unchecked=(STAND_IN_NOTE, *rest))


class LaunchRefused(InputError):
    """SGLang refuses the launch (the server would not start): an error wherever the launch
    is priced or written, never "graphs off"."""


def refuse_refused(capture: PrefillCapture, where: str | None = None) -> None:
    """Raise LaunchRefused when SGLang refuses the launch, quoting its reason and whose
    answer it is (SGLang's own, or bcgtune's model of its checks and why SGLang did not
    answer)."""
    if capture.refused is None:
        return
    if capture.checked:
        whose = f"SGLang {capture.source.sglang_version or ''}'s own answer".replace("  ", " ")
    else:
        whose = f"bcgtune's model of SGLang's checks; not checked by SGLang: {capture.not_checked_reason}"
    raise LaunchRefused(f"SGLang refuses this launch, the server would not start: {capture.refused!s} [{whose}]", where)


class LaunchNotChecked(InputError):
    """A profile would be written for a launch SGLang did not check, while bcgtune's model
    names rules of SGLang's it could not check for it: written only with --unchecked."""


def require_vouched(capture: PrefillCapture, *, unchecked_ok: bool, where: str = "--write-profile") -> None:
    """Whatever a command writes, SGLang has seen, or the file says plainly that it has not:
    a launch SGLang checked is written; one it did not check only when bcgtune's model names
    no rule it could not check for it, or with --unchecked (`unchecked_ok`); either way the
    profile records [buckets].launch_check."""
    if capture.checked or not capture.unchecked or unchecked_ok:
        return
    rules = "; ".join(capture.unchecked)
    raise LaunchNotChecked(
        f"nothing written: SGLang did not check this launch ({capture.not_checked_reason}), and bcgtune's model could "
        f"not check {len(capture.unchecked)} of SGLang's rules for it: {rules[:600]}. Let SGLang check it (sglang "
        "installed, without --no-sglang-probe), or pass --unchecked to write it anyway (the profile then records "
        '[buckets].launch_check = "not checked: ...")',
        where,
    )


def launch_check_key(capture: PrefillCapture) -> str:
    """[buckets].launch_check of a profile written from a priced launch."""
    return "checked" if capture.checked else f"not checked: {capture.not_checked_reason}"[:2000]


def launch_check_json(capture: PrefillCapture) -> dict[str, Any]:
    """The fields every --json that judges a launch carries: whether SGLang checked it."""
    return {"launch_check": capture.launch_check, "launch_check_reason": capture.not_checked_reason}


def capture_for_profile(
    profile,
    model: str | None = None,
    *,
    sglang: SglangUse = "ask",
    skipped_by: str | None = None,
    refresh: bool = False,
    say=None,
) -> PrefillCapture:
    """The prefill graphs the server will capture for `profile` (model: overrides
    [profile].model): SGLang's own resolution when it answers, else bcgtune's model of its
    rules with the reason. Raises InputError when the launch's values are invalid."""
    return answers_for_profile(profile, model, sglang=sglang, skipped_by=skipped_by, refresh=refresh, say=say).capture_or_raise()


def profile_captured_list(profile, *, sglang: SglangUse = "cache", say=None) -> tuple[list[int], PrefillCapture]:
    """The buckets a profile's launch captures (its [buckets].list as SGLang aligns and
    filters it, or SGLang's ladder for the launch when it names none), and whose answer that
    is: what capture, validate and calibrate run for --profile. A launch SGLang refuses raises
    LaunchRefused; one that captures nothing, InputError."""
    capture = capture_for_profile(profile, sglang=sglang, say=say)
    refuse_refused(capture, profile.where)
    if not capture.graphs_on:
        raise InputError(f"the profile's launch captures no prefill graphs: {capture.reason}", profile.where)
    return list(capture.captured), capture


def check_flags(cmd, *, sglang: SglangUse = "ask", skipped_by: str | None = None, refresh: bool = False, say=None):
    """serve's flag check of a launch command against the installed SGLang's parser: cached,
    or asked in a child process as `sglang` allows (bcgtune never imports SGLang itself)."""
    from bcgtune.adapters.sglang import resolve as sr

    start, why = _may_start(sglang, skipped_by)
    return sr.check_flags(cmd, probe=start, refresh=refresh, not_asked=why, say=say)
