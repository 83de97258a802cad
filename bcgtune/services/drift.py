"""drift: are the deployed bucket lists still right for today's traffic?

`drift_for_profile` decides what a profile's launch captures (services/launch.py) and
compares that list with today's optimum under the same graph budget (bcgtune.core.plan.drift),
on the traffic of the server configuration it runs. `drift_fleet` does that for many
profiles, or for every configuration in today's logs against the list its servers logged
capturing, in one table: the fleet needs re-tuning when any row does.

A trace of today's traffic from logs groups its batches by server configuration
(core/trace/groups.py): a profile is judged on the groups whose logged launch settings it
agrees with (every setting both state: model, tp, dp, DP attention, chunk), never on the
traffic of a server launched otherwise.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from bcgtune.core.plan.calibration import Calibration
from bcgtune.core.plan.drift import DEFAULT_THRESHOLD_PCT, DriftReport, check_threshold, check_tolerance, drift_from_plan
from bcgtune.core.sglang.capture import PrefillCapture
from bcgtune.core.trace.prefill_trace import PrefillTrace
from bcgtune.errors import InputError
from bcgtune.services.launch import SglangUse


def load_traffic(logs: list[str] | None, trace_path: str | None) -> PrefillTrace:
    """Today's traffic: server logs (files, folders, globs or URLs; read as a histogram-only
    trace: drift needs counts per size, not every batch) or a trace file (exactly one)."""
    if logs and not trace_path:
        from bcgtune.services.trace import trace_logs

        return trace_logs(list(logs), histogram_only=True)
    if trace_path and not logs:
        from bcgtune.files.trace_file import load_trace

        return load_trace(trace_path)
    raise InputError("give today's traffic as --log FILE... or --trace FILE")


def drift_for_profile(
    profile,
    trace: PrefillTrace,
    *,
    calibration: Calibration | None = None,
    threshold_pct: float = DEFAULT_THRESHOLD_PCT,
    tolerance_pct: float | None = None,
    sglang: SglangUse = "cache",
    say: Callable[[PrefillCapture], None] | None = None,
    progress: Callable[[str], None] | None = None,
) -> DriftReport:
    """The profile's captured list (its [buckets], or SGLang's default ladder for its
    launch) against today's optimum of as many buckets on `trace` (one configuration's).
    `sglang`: when SGLang's own answer for the launch is used (bcgtune.services.launch);
    `say` is given the capture priced, to say whose answer it is; `progress` is told when
    SGLang is asked."""
    from bcgtune.services.launch import capture_for_flags, refuse_refused
    from bcgtune.services.suggest import profile_server_flags

    check_threshold(threshold_pct)
    check_tolerance(tolerance_pct, calibration)
    server = profile_server_flags(profile, trace, traced_chunk=False)  # the launch as deployed
    capture = capture_for_flags(
        server,
        platform=profile.platform,
        buckets=profile.buckets,
        model_path=profile.model or "",
        hardware=profile.hardware or None,
        env=profile.env,
        source=profile.path,
        sglang=sglang,
        say=progress,
    )
    if say is not None:
        say(capture)
    refuse_refused(capture, profile.where)
    if not capture.graphs_on:
        raise InputError(f"the profile runs no prefill graphs: {capture.reason}", profile.where)
    what = "list" if profile.buckets else "SGLang default ladder (no list)"
    name = f"profile {profile.name}'s {what}"
    from bcgtune.services.suggest import ChunkTooSmall

    try:
        plan = _todays_plan(
            trace,
            list(capture.captured),
            name,
            calibration,
            tolerance_pct,
            # the launch priced again: SGLang's answer is cached by now (never asked twice)
            sglang="never" if sglang == "never" else "cache",
            profile=profile,
            profile_as_deployed=True,
        )
    except ChunkTooSmall as exc:
        # the profile's list cannot be judged on batches its server never forms
        raise InputError(
            f"{exc.batches_outgrow()}; set chunked-prefill-size = {exc.wanted} in the profile's [server] "
            f"(suggest-buckets --write-profile with --chunked-prefill-size {exc.wanted} writes it with a list for "
            "this traffic), or trace a server launched as the profile is",
            profile.where,
        ) from None
    report = drift_from_plan(plan, name, threshold_pct)
    report.tuned = getattr(profile, "tuned", None)
    report.shape_warnings = launch_shape_warnings(profile, calibration)
    for line in report.shape_warnings:
        if progress is not None:
            progress(f"warning: {line}")
    return report


def launch_shape_warnings(profile, calibration: Calibration | None) -> list[str]:
    """Where the calibration's measured shape differs from the profile's model or TP/EP
    (core.plan.shape_check); [] without a calibration."""
    from bcgtune.core.plan.shape_check import shape_notes

    if calibration is None or profile is None:
        return []
    server = profile.server or {}
    return shape_notes(calibration.meta, profile.model, _count(server.get("tp_size")), _count(server.get("ep_size")))


def _count(value) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 1


def _todays_plan(
    trace: PrefillTrace,
    deployed: list[int],
    name: str,
    calibration: Calibration | None,
    tolerance_pct: float | None = None,
    **launch,
):
    """suggest-buckets' plan for today's traffic with as many buckets as `deployed` holds, on
    the same launch (a profile's, or the layout a trace records), with `deployed` as a row:
    drift's optimum is the list suggest-buckets gives, priced the same way, and its margin
    (`tolerance_pct`) is suggest-buckets' --tolerance."""
    from bcgtune.services.suggest import SuggestRequest, suggest

    req = SuggestRequest(
        trace=trace,
        max_buckets=max(1, len(deployed)),
        objective="padding" if calibration is None else "time",
        calibration=calibration,
        baselines=False,
        compare=[(name, deployed)],
        tolerance_pct=tolerance_pct,
        **launch,
    )
    result = suggest(req)
    if result.plan is None:
        raise InputError(f"prefill graphs are off for this launch: {result.capture.reason}")
    return result.plan


def drift_for_list(
    trace: PrefillTrace,
    deployed: list[int],
    *,
    server_flags: dict[str, Any] | None = None,
    align: int | None = None,
    calibration: Calibration | None = None,
    threshold_pct: float = DEFAULT_THRESHOLD_PCT,
    name: str = "deployed list",
    tolerance_pct: float | None = None,
) -> DriftReport:
    """A list as SGLang captures it for the launch `server_flags` (None: the layout the trace
    records) against today's optimum of as many buckets, priced as suggest-buckets prices
    that launch; `align` overrides the launch's capture alignment."""
    from bcgtune.core.sglang.ladder import align_buckets
    from bcgtune.services.suggest import SuggestRequest, suggest

    check_threshold(threshold_pct)
    check_tolerance(tolerance_pct, calibration)
    probe = suggest(SuggestRequest(trace=trace, max_buckets=1, baselines=False, server_flags=server_flags or None))
    if probe.plan is None:
        raise InputError(f"prefill graphs are off for this launch: {probe.capture.reason}", field="server_flags")
    use = probe.capture.alignment if align is None else align
    captured = align_buckets(deployed, use)
    plan = _todays_plan(trace, captured, name, calibration, tolerance_pct, server_flags=server_flags or None, align=align)
    return drift_from_plan(plan, name, threshold_pct)


def drift_for_group(
    trace: PrefillTrace,
    group: int,
    *,
    calibration: Calibration | None = None,
    threshold_pct: float = DEFAULT_THRESHOLD_PCT,
    tolerance_pct: float | None = None,
) -> DriftReport:
    """A configuration's logged captured list against today's optimum on its traffic."""
    view = trace.group_view(group) if trace.groups else trace
    cap = view.captured_list()
    if cap is None:
        which = f"group {group} ({trace.groups[group].label()})" if trace.groups else "the trace"
        raise InputError(f"{which} logged no complete prefill capture list: give --profile to judge its deployed list")
    name = f"group {group}'s captured list"
    return drift_from_plan(_todays_plan(view, list(cap.buckets), name, calibration, tolerance_pct), name, threshold_pct)


# ---- many profiles, many configurations -----------------------------------------------------
@dataclass
class DriftRow:
    """One judged list: a profile's or a configuration's, on one configuration's traffic."""

    deployed: str  # "profile h200" or "group 1's captured list"
    group: int | None  # the configuration of today's traffic it was judged on (None: the whole trace)
    configuration: str  # that configuration's label
    batches: int
    report: DriftReport
    profile: str | None = None  # where the profile is (its path or built-in name)
    files: list[str] = field(default_factory=list)  # the logs (or sources) that make the configuration
    matched: str = ""  # how the profile was paired with the configuration: "settings", "--match", "--group", ""


@dataclass
class FleetDrift:
    rows: list[DriftRow]
    unjudged: list[str] = field(default_factory=list)  # configurations no list was judged on, and why
    files: dict[int, list[str]] = field(default_factory=dict)  # each configuration's files

    @property
    def verdict(self) -> str:
        return "re-tune" if any(r.report.verdict == "re-tune" for r in self.rows) else "keep"

    def to_dict(self) -> dict[str, Any]:
        """One row: the report as it always was; several: the fleet."""
        if len(self.rows) == 1 and not self.unjudged:
            return self.rows[0].report.to_dict()
        return {
            "verdict": self.verdict,
            "rows": [{**{k: v for k, v in asdict(r).items() if k != "report"}, "report": r.report.to_dict()} for r in self.rows],
            "unjudged": list(self.unjudged),
            "groups": {str(g): {"files": list(f)} for g, f in self.files.items()},
        }


_MATCH_KEYS = (
    "tp_size", "dp_size", "enable_dp_attention", "attn_dp_size", "chunked_prefill_size", "pp_size", "ep_size",
    "enable_mixed_chunk",
)  # fmt: skip
# What a launch that does not set them runs (SGLang's ServerArgs defaults): a profile that
# states none of these launches so, and a configuration logged otherwise is not its own.
_LAUNCH_DEFAULTS = {
    "tp_size": 1,
    "dp_size": 1,
    "pp_size": 1,
    "ep_size": 1,
    "enable_dp_attention": False,
    "enable_mixed_chunk": False,
}


def profile_launch_settings(profile) -> dict[str, Any]:
    """The launch settings a profile states, as a log would state them (snake-case
    ServerArgs names; tp/dp/ep spelled out), SGLang's defaults for the layout and mixed
    chunk it does not state, with the chunk its GPU sets when it states
    none (SGLang's memory-based default, core.sglang.ladder.default_chunked_prefill_size): that is
    the chunk its servers run, so it tells its configuration apart from another's."""
    from bcgtune.adapters.machine.hardware import gpu_for
    from bcgtune.core.sglang.ladder import default_chunked_prefill_size
    from bcgtune.files.profile_file import snake

    server = {snake(str(k)): v for k, v in profile.server.items()}
    for short, full in (("tp", "tp_size"), ("dp", "dp_size"), ("ep", "ep_size")):
        if short in server and full not in server:
            server[full] = server.pop(short)
    for key, value in _LAUNCH_DEFAULTS.items():
        server.setdefault(key, value)
    gpu = gpu_for(profile.hardware)
    if server.get("chunked_prefill_size") is None and gpu is not None:
        server["chunked_prefill_size"] = default_chunked_prefill_size(gpu.memory_gib)
    return server


def profile_matches(profile, settings: dict[str, Any]) -> bool:
    """A profile's launch agrees with a configuration's logged settings: the same model
    (path, or its last component), and every layout and chunk setting both state. A
    configuration whose logs state no launch settings (rotated logs without their startup
    lines) agrees with no profile: pair it with one by --match."""
    return bool(settings) and disagreement(profile, settings) is None


def disagreement(profile, settings: dict[str, Any]) -> str | None:
    """The first launch setting in which a profile and a configuration's logged settings
    differ (`model X, the logs Y`), or None when every setting both state agrees."""
    server = profile_launch_settings(profile)
    model = profile.model or server.get("model_path")
    logged = settings.get("model_path")
    if isinstance(model, str) and isinstance(logged, str) and model.rstrip("/") != logged.rstrip("/"):
        if os.path.basename(model.rstrip("/")) != os.path.basename(logged.rstrip("/")):
            return f"model {model}, the logs {logged}"
    for key in _MATCH_KEYS:
        if key in server and key in settings and settings[key] is not None and server[key] is not None:
            mine, theirs = server[key], settings[key]
            if isinstance(theirs, bool) or isinstance(mine, bool):
                differ = bool(mine) != bool(theirs)
            else:
                differ = str(mine) != str(theirs)
            if differ:
                return f"{key.replace('_', '-')} {mine}, the logs {theirs}"
    return None


def parse_matches(values: list[str] | None, profiles: list, n_groups: int) -> dict[int, list[int]]:
    """`--match PROFILE=GROUP` values as {profile index: [groups]}. PROFILE is the name in
    the profile's [profile] table, the file or built-in name it was given as, or its
    position among the profiles (0, 1, ...)."""
    from bcgtune.core.trace.groups import check_group_index

    out: dict[int, list[int]] = {}
    if values and not profiles:
        raise InputError("--match pairs a --profile with a configuration: give --profile", "--match")
    for text in values or []:
        who, sep, grp = str(text).rpartition("=")
        if not sep or not who.strip() or not grp.strip().isdigit():
            raise InputError(f"expected PROFILE=GROUP (e.g. h200=0), got {str(text)[:60]!r}", "--match")
        who = who.strip()
        hits = [
            i for i, p in enumerate(profiles) if who in (p.name, str(p.path or ""), getattr(p, "given_as", None)) or who == str(i)
        ]
        if not hits and profiles:
            hits = [i for i, p in enumerate(profiles) if p.path is not None and os.path.basename(str(p.path)) == who]
        if not hits:
            names = ", ".join(p.name for p in profiles) or "none given"
            raise InputError(f"{who!r} names none of the profiles given ({names})", "--match")
        if len(hits) > 1:
            raise InputError(f"{who!r} names {len(hits)} of the profiles given: name one by its file", "--match")
        g = int(grp)
        check_group_index([None] * n_groups, g, "--match")  # type: ignore[list-item]
        out.setdefault(hits[0], [])
        if g not in out[hits[0]]:
            out[hits[0]].append(g)
    return out


def group_files(trace: PrefillTrace) -> dict[int, list[str]]:
    """The files (sources) each configuration's batches come from."""
    names = trace.source_names()
    return {i: [names[s] for s in g.sources if 0 <= s < len(names)] for i, g in enumerate(trace.groups)}


def drift_fleet(
    profiles: list,
    trace: PrefillTrace,
    *,
    groups: list[int] | None = None,
    matches: dict[int, list[int]] | None = None,
    calibration: Calibration | None = None,
    threshold_pct: float = DEFAULT_THRESHOLD_PCT,
    tolerance_pct: float | None = None,
    sglang: SglangUse = "cache",
    say: Callable[[PrefillCapture], None] | None = None,
    progress: Callable[[str], None] | None = None,
) -> FleetDrift:
    """Every deployed list against today's traffic, one row each.

    `groups`: only these configurations are judged (None: all). `matches`: {profile index:
    groups} pairs a profile with configurations it serves, whatever their logged settings
    say (besides the one its settings agree with, if exactly one; when they agree with
    several, only those named). A profile is judged on the configurations among those judged
    whose logged settings it agrees with (profile_matches; a trace of one configuration,
    or none known: that one). One profile with `groups` and no agreement is judged on
    those groups (they name what it serves). A profile that agrees with several
    configurations is refused (say which it serves with --match); one that agrees with none
    is refused when it is the only profile, else left out and named. A configuration that no
    profile serves (its logs lost their startup lines, say) is named as not judged: it does
    not stop the others being judged. No profile: every configuration judged is judged by
    the list its servers logged capturing (one that logged none is named as not judged).
    `sglang`, `say`, `progress`: as drift_for_profile takes them, for each profile's launch."""
    from bcgtune.core.trace.groups import check_group_index

    check_tolerance(tolerance_pct, calibration)
    for g in groups or []:
        check_group_index(trace.groups, g)
    seen: set[str] = set()
    for prof in profiles:  # the same file twice would be judged, and counted in the verdict, twice
        key = os.path.realpath(str(prof.path)) if prof.path is not None else f"profile {prof.name}"
        if key in seen:
            raise InputError("is given twice: give each deployed profile once", prof.where)
        seen.add(key)
    n = len(trace.groups)
    chosen = list(dict.fromkeys(groups)) if groups else list(range(n))
    files = group_files(trace) if n > 1 else {}
    label = {g: trace.groups[g].label() for g in range(n)}
    unjudged: list[str] = []
    if not profiles:
        return _fleet_of_captured_lists(trace, chosen, files, label, calibration, threshold_pct, tolerance_pct)
    plan, left_out = _pairs(profiles, trace, chosen, groups, dict(matches or {}), files, label)
    rows: list[DriftRow] = []
    judged: set[int] = set()
    for i, target, how in plan:
        prof = profiles[i]
        view = trace if target is None else trace.group_view(target)
        rep = drift_for_profile(
            prof,
            view,
            calibration=calibration,
            threshold_pct=threshold_pct,
            tolerance_pct=tolerance_pct,
            sglang=sglang,
            say=say,
            progress=progress,
        )
        if target is not None:
            lab = label[target]
            judged.add(target)
        else:
            lab = trace.groups[0].label() if n == 1 else "the trace"
        rows.append(
            DriftRow(
                f"profile {prof.name}",
                target,
                lab,
                view.n_batches,
                rep,
                profile=str(prof.path or prof.name),
                files=files.get(target, []) if target is not None else [],
                matched=how,
            )
        )
    for g in chosen:
        if n > 1 and g not in judged:
            why = "its logs state no launch settings" if not trace.groups[g].settings else "no profile agrees with it"
            unjudged.append(f"group {g} ({label[g]}; {_files_text(files.get(g, []))}): {why}; pair one with --match PROFILE={g}")
    unjudged += left_out
    if not rows:
        raise InputError(f"no profile was judged: {'; '.join(unjudged)}")
    return FleetDrift(rows, unjudged, files)


def _fleet_of_captured_lists(
    trace: PrefillTrace,
    chosen: list[int],
    files: dict[int, list[str]],
    label: dict[int, str],
    calibration,
    threshold_pct: float,
    tolerance_pct: float | None,
) -> FleetDrift:
    """No profile: each configuration judged by the list its servers logged capturing."""
    n = len(trace.groups)
    rows: list[DriftRow] = []
    unjudged: list[str] = []
    for g in chosen or [0]:
        if n > 1 and trace.group_view(g).captured_list() is None:
            unjudged.append(f"group {g} ({label[g]}): its logs state no complete prefill capture list; give --profile")
            continue
        rep = drift_for_group(trace, g, calibration=calibration, threshold_pct=threshold_pct, tolerance_pct=tolerance_pct)
        lab = label[g] if n else "the trace"
        row = DriftRow(f"group {g}'s captured list", g if n else None, lab, _batches(trace, g), rep, None, files.get(g, []))
        rows.append(row)
    if not rows:
        raise InputError(f"no configuration of today's traffic logged its capture list: {'; '.join(unjudged)}")
    return FleetDrift(rows, unjudged, files)


def _pairs(
    profiles: list, trace: PrefillTrace, chosen: list[int], groups, matches: dict[int, list[int]], files, label
) -> tuple[list[tuple[int, int | None, str]], list[str]]:
    """(profile, configuration or None, how paired) for every list to judge, and the
    profiles left out (see drift_fleet)."""
    n = len(trace.groups)
    plan: list[tuple[int, int | None, str]] = []
    left_out: list[str] = []
    for i, prof in enumerate(profiles):
        if n <= 1:
            plan.append((i, None, ""))
            continue
        agree = [g for g in chosen if profile_matches(prof, trace.groups[g].settings)]
        if i in matches:  # the configurations named, and the one its settings agree with
            named = [g for g in matches[i] if g in chosen]
            plan += [(i, g, "--match") for g in named]
            if len(agree) == 1 and agree[0] not in named:
                plan.append((i, agree[0], "settings"))
            if not named and len(agree) != 1:
                left_out.append(f"profile {prof.name}: the configurations --match names are not among those judged")
            continue
        if len(agree) > 1:
            raise InputError(
                f"profile {prof.name} agrees with {len(agree)} of today's configurations by the settings it states: "
                + "; ".join(f"group {g} ({label[g]}; {_files_text(files.get(g, []))})" for g in agree)
                + f"; say which it serves with --match {prof.name}=N"
                + _apart(prof, [trace.groups[g].settings for g in agree]),
                prof.where,
            )
        if agree:
            plan.append((i, agree[0], "settings"))
        elif groups and len(profiles) == 1:
            plan += [(i, g, "--group") for g in chosen]
        elif len(profiles) == 1 and not matches:
            raise InputError(
                f"profile {prof.name} agrees with none of today's server configurations: "
                + "; ".join(
                    f"group {g} ({label[g]}; {_files_text(files.get(g, []), 1)}): {_why(prof, trace, g)}" for g in chosen[:4]
                )
                + f"; pick the configuration it serves with --match {prof.name}=N (or --group N)",
                prof.where,
            )
        else:
            left_out.append(
                f"profile {prof.name}: agrees with none of the configurations judged ({_differ(prof, trace, chosen)})"
            )
    return plan, left_out


def _differ(profile, trace: PrefillTrace, chosen: list[int]) -> str:
    """Where a profile differs from each configuration: `group 0: model X, the logs Y; ...`."""
    return "; ".join(f"group {g}: {_why(profile, trace, g)}" for g in chosen[:4]) + ("; ..." if len(chosen) > 4 else "")


def _why(profile, trace: PrefillTrace, g: int) -> str:
    settings = trace.groups[g].settings
    return (disagreement(profile, settings) or "agrees") if settings else "its logs state no launch settings"


def _apart(profile, settings: list[dict[str, Any]]) -> str:
    """What would tell configurations apart that a profile agrees with: the settings in which
    they differ, which the profile does not state."""
    keys = sorted({k for s in settings for k in s if len({str(x.get(k)) for x in settings}) > 1})
    if not keys:
        return " (their settings are the same: trace them apart, or give --launch settings that tell them apart)"
    return f" (they differ in {', '.join(k.replace('_', '-') for k in keys[:4])}: state it in the profile)"


def _files_text(names: list[str], most: int = 3) -> str:
    if not names:
        return "no file named"
    shown = ", ".join(os.path.basename(n) or n for n in names[:most])
    return shown + (f" +{len(names) - most} more" if len(names) > most else "")


def _batches(trace: PrefillTrace, g: int) -> int:
    return trace.groups[g].n_batches if trace.groups else trace.n_batches
