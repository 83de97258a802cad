"""What SGLang will capture for a launch: the one answer every command prices with.

Two sources answer: SGLang's own resolution, asked in a child process
(bcgtune.adapters.sglang_resolve), and bcgtune's model of its rules
(bcgtune.core.ladder.resolve_prefill_capture), which says which of SGLang's rules it could
not check. `answers_for_profile` decides which one answers a profile's launch (doctor and
`serve --dry-run`); `capture_for_flags` answers a launch given as flags (suggest-buckets,
drift).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from bcgtune.core.ladder import CaptureSource, PrefillCapture, resolve_prefill_capture
from bcgtune.errors import InputError


def capture_for_flags(
    flags: Mapping[str, Any],
    *,
    platform: str = "cuda",
    buckets: list[int] | tuple[int, ...] | None = None,
    model_path: str = "",
    gpu_memory_gib: float | None = None,
) -> PrefillCapture:
    """The prefill graphs SGLang captures for a launch given as flags (a profile's [server]
    table, or the layout flags of suggest-buckets), with the profile's bucket list."""
    from bcgtune.adapters.sglang_flags import prefill_launch_from_server_flags

    launch = prefill_launch_from_server_flags(
        flags, platform=platform, buckets=buckets, model_path=model_path, gpu_memory_gib=gpu_memory_gib
    )
    return resolve_prefill_capture(launch)


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
    from bcgtune.adapters.hardware import gpu_for
    from bcgtune.adapters.model_config import is_mla, read_model_config
    from bcgtune.adapters.sglang_flags import prefill_launch_from_server_flags

    model = model or profile.model or ""
    spec = gpu_for(getattr(profile, "hardware", None))
    launch = prefill_launch_from_server_flags(
        profile.server,
        platform=profile.platform,
        gpu_memory_gib=spec.memory_gib if spec is not None else None,
        buckets=profile.buckets,
        model_path=model,
        mla=is_mla(read_model_config(config_dir)),
    )
    cap = resolve_prefill_capture(launch)
    notes = list(extra_notes) + list(cap.notes)
    if config_dir is None:
        notes.append("rules that depend on the model's architecture were not checked (its config is not on this machine)")
    return replace(
        cap,
        backend=cap.backend if cap.captured else "disabled",
        notes=tuple(notes),
        source=CaptureSource("model", not_asked=not_asked),
        requested=tuple(profile.buckets) if profile.buckets is not None else None,
    )


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


def answers_for_profile(
    profile,
    model: str | None = None,
    *,
    probe: bool = True,
    runner_sources: Sequence[str | None] = (),
    check_flags: bool = False,
    resolve: bool = True,
    ask=None,
) -> LaunchAnswers:
    """Ask SGLang (one child process answers the capture, the flag check and every runner
    asked about) unless `probe` is False; the model answers the capture when SGLang did not.
    `ask`: how SGLang is asked (sglang_resolve.ask_sglang)."""
    from bcgtune.adapters import sglang_resolve as sr

    model = model or (profile.model if profile is not None else None)
    if not probe:
        answers = sr.unasked(profile, model, "--no-sglang-probe", runner_sources, check_flags)
    else:
        answers = (ask or sr.ask_sglang)(profile, model, runner_sources=runner_sources, check_flags=check_flags, resolve=resolve)
    capture, invalid = None, None
    if resolve and profile is not None:
        if answers.capture is not None:
            capture = replace(answers.capture, notes=answers.notes + answers.capture.notes)
        else:
            try:
                capture = model_capture(
                    profile,
                    model,
                    not_asked=answers.capture_error or answers.error,
                    config_dir=answers.config_dir,
                    extra_notes=answers.notes,
                )
            except InputError as exc:
                invalid = exc
    return LaunchAnswers(capture, invalid, answers.flags, answers.runners, answers.sglang_version)


def capture_for_profile(profile, model: str | None = None, *, probe: bool = True) -> PrefillCapture:
    """The prefill graphs the server will capture for `profile` (model: overrides
    [profile].model): SGLang's own resolution when it can be asked, else bcgtune's model
    of its rules with the reason. Raises InputError when the launch's values are invalid."""
    answers = answers_for_profile(profile, model, probe=probe)
    if answers.capture is None:
        raise answers.invalid or InputError("the launch could not be resolved", profile.where)
    return answers.capture
