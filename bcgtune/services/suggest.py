"""suggest-buckets: the optimal bucket list for a trace, beside the alternatives.

One function, `suggest`, makes every decision the command line and the Python API share:
which trace (the built-in workload when none is given), which launch (the layout flags given,
else the layout the trace records), what SGLang captures for it (services/launch.py), and
from that the defaults of the plan: the capture alignment, the ladder to compare with and the
largest bucket worth offering.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from bcgtune.core.plan.bucket_plan import MI355X_PR_HAND_LIST, MI355X_PR_HAND_LIST_NAME, assumed_chunked_prefill_size, make_plan
from bcgtune.core.plan.calibration import Calibration
from bcgtune.core.plan.plan_types import BucketPlan, plan_request
from bcgtune.core.sglang.capture import PrefillCapture
from bcgtune.core.sglang.ladder import ceil_to
from bcgtune.core.sglang.replay import DEFAULT_PADDING_FACTOR
from bcgtune.core.trace.prefill_trace import PrefillTrace
from bcgtune.errors import InputError
from bcgtune.services.launch import SglangUse


@dataclass
class SuggestRequest:
    """What to suggest a list for. `trace` None: the built-in workload (the MI355X image
    benchmark of the Qwen multimodal breakable-prefill pull request), simulated, with that
    pull request's hand-tuned list as a comparison row. `server_flags`: the launch's layout
    flags (snake_case SGLang names); None: the layout the trace records, if any. `align`,
    `max_bucket` None: the launch's capture alignment and ladder maximum. `tolerance_pct`
    (time objective): recommend fewer graphs than the best only when the upper end of their
    paired 95% interval against it is within this % of the best's predicted time; None: the
    default margin (core.sglang.constants.DEFAULT_TOLERANCE_PCT). `group`: which server configuration
    of a trace that holds several to price (None: the trace must hold one). `profile`: price
    the launch this profile makes (its [server] flags, platform, GPU and model), as drift and
    serve will judge and launch it; its current list is a comparison row. `sglang`: when
    SGLang's own answer for the launch is used (bcgtune.services.launch: "cache" uses one
    it gave before, "ask" asks it in a child process when there is none)."""

    trace: PrefillTrace | None = None
    max_buckets: int = 12
    align: int | None = None
    max_bucket: int | None = None
    padding_factor: float = DEFAULT_PADDING_FACTOR
    objective: str = "padding"
    calibration: Calibration | None = None
    max_graph_mem_gib: float | None = None
    candidates: str = "auto"
    seed: int = 0
    compare: list[tuple[str, list[int]]] = field(default_factory=list)
    chunked_prefill_size: int | None = None
    kmeans: bool = False
    baselines: bool = True
    server_flags: dict[str, Any] | None = None
    tolerance_pct: float | None = None
    group: int | None = None
    sglang: SglangUse = "cache"
    profile: Any = None  # a launch profile (files: Profile): its launch is priced unless server_flags are given
    # True: price the profile as deployed (a profile that states no chunk runs its GPU's default, as drift
    # judges it); False: a profile about to be written takes the chunk the trace knows (and writes it)
    profile_as_deployed: bool = False


@dataclass
class Suggestion:
    """The outcome: the trace priced, what SGLang captures for the launch, and the plan
    (None when prefill graphs are off for the launch: nothing is priced as if captured).
    `notes`: what the user should know about how it was priced."""

    trace: PrefillTrace
    capture: PrefillCapture
    plan: BucketPlan | None
    server_flags: dict[str, Any]
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        if self.plan is None:
            return {"prefill_graphs": "off", "reason": self.capture.reason, "recommended": None}
        return self.plan.to_json_obj()


def default_trace(seed: int = 0) -> PrefillTrace:
    """The built-in default: the MI355X image benchmark of the Qwen multimodal
    breakable-prefill pull request, simulated (seed 0: the workload's own seed)."""
    from dataclasses import replace

    from bcgtune.adapters.bench_serving.simulator import simulate
    from bcgtune.files.workload_file import default_workload

    wl = default_workload()
    return simulate(replace(wl, seed=seed) if seed else wl)


# Launch settings a log states that set what SGLang captures (its alignment and ladder).
_LOGGED_LAYOUT_KEYS = (
    "tp_size", "dp_size", "attn_dp_size", "enable_dp_attention", "enable_two_batch_overlap", "moe_a2a_backend",
    "moe_dense_tp_size", "attn_cp_size", "enable_dp_lm_head", "disable_attn_tp_gather",
)  # fmt: skip


def logged_layout_flags(trace: PrefillTrace) -> dict[str, Any]:
    """The layout the logs of a one-configuration trace state (its server_args line), as
    launch flags; {} when they state none."""
    if len(trace.groups) != 1:
        return {}
    s = trace.groups[0].settings
    return {k: s[k] for k in _LOGGED_LAYOUT_KEYS if s.get(k) is not None}


def trace_layout_flags(trace: PrefillTrace) -> dict[str, Any]:
    """The DP-attention layout a trace records (a simulated workload's dp size with DP
    attention, or the launch settings its logs state), as launch flags; {} when it records
    none. SGLang needs tp to be a multiple of the attention-DP size: a recorded tp that is
    not becomes the attention-DP size."""
    logged = logged_layout_flags(trace)
    if logged.get("enable_dp_attention") is True or (logged.get("attn_dp_size") or 1) > 1:
        return logged
    workload = trace.meta.get("workload") if isinstance(trace.meta, dict) else None
    if not isinstance(workload, dict) or workload.get("enable_dp_attention") is not True:
        return {}
    dp, tp = workload.get("dp_size"), workload.get("tp_size") or 1
    if not isinstance(dp, int) or isinstance(dp, bool) or dp <= 1 or not isinstance(tp, int) or isinstance(tp, bool):
        return {}
    return {"tp_size": tp if tp >= 1 and tp % dp == 0 else dp, "dp_size": dp, "enable_dp_attention": True}


def _flags_text(flags: dict[str, Any]) -> str:
    """Layout flags as suggest-buckets takes them."""
    names = {"tp_size": "--tp", "dp_size": "--dp", "attn_dp_size": "--attn-dp-size"}
    parts = []
    for k, v in flags.items():
        if k == "enable_dp_attention":
            parts.append("--dp-attention" if v else "")
        elif k in names:
            parts.append(f"{names[k]} {v}")
    return " ".join(p for p in parts if p)


def _launch_flags(req: SuggestRequest, trace: PrefillTrace, notes: list[str]) -> dict[str, Any]:
    """The launch priced: the flags given, else the layout the trace records."""
    if req.server_flags:
        flags = dict(req.server_flags)
        traced = trace_layout_flags(trace)
        if traced.get("enable_dp_attention") and not _attention_dp(flags) > 1:
            notes.append(
                f"note: the trace was simulated with DP attention on {traced['dp_size']} ranks; give "
                f"{_flags_text(traced)} to price its steps (priced per batch now)"
            )
        return flags
    flags = trace_layout_flags(trace)
    if not flags and not logged_layout_flags(trace):
        ranks = _rank_layout(trace)
        if ranks is not None:
            notes.append(
                f"note: the logs come from {ranks['dp_size']} DP ranks and state no launch settings: if the server ran "
                f"DP attention, give {_flags_text(ranks)} to price its steps (priced per batch now)"
            )
    if flags and logged_layout_flags(trace):
        notes.append(
            f"note: the logs state DP attention on {_attention_dp(flags)} ranks: priced as the launch "
            f"{_flags_text(flags)} (give layout flags to price another)"
        )
    elif flags:
        notes.append(
            f"note: the trace was simulated with DP attention on {flags['dp_size']} ranks: priced as the launch "
            f"{_flags_text(flags)} (give layout flags to price another)"
        )
    else:
        flags = logged_layout_flags(trace)  # the layout the logs state: its capture alignment
    return flags


def _rank_layout(trace: PrefillTrace) -> dict[str, Any] | None:
    """The DP-attention launch a log's rank tags point to, when its records carry more
    than one DP rank (only the tags of the batches this trace holds: one configuration's
    view of a fleet's trace keeps its own). SGLang tags a scheduler's lines with its DP rank
    and its global TP rank (srt/managers/scheduler.py, configure_scheduler_process), and
    places DP rank d on TP ranks d * tp/dp .. (d+1) * tp/dp - 1 (srt/runtime_context.py,
    derive_attention_ranks: attn_dp_rank = tp_rank // (tp_size // attn_dp_size)): ranks up
    to `DP7 TP7` are tp 8, dp 8, never tp 64."""
    import re

    import numpy as np

    tags = trace.meta.get("ranks") if isinstance(trace.meta, dict) else None
    if not isinstance(tags, list):
        return None
    col = (trace.batches or {}).get("rank")
    if col is not None:  # only the ranks this trace's batches come from
        seen = {int(i) for i in np.unique(col) if 0 <= int(i) < len(tags)}
        tags = [t for i, t in enumerate(tags) if i in seen]
    elif len(trace.groups) == 1 and trace.meta.get("ranks_from_all_groups"):
        return None  # a histogram-only view of one configuration: whose ranks the tags are is not known
    dps: set[int] = set()
    tps: set[int] = set()
    for tag in tags:
        if isinstance(tag, str):
            dps.update(int(m) for m in re.findall(r"\bDP(\d+)\b", tag))
            tps.update(int(m) for m in re.findall(r"\bTP(\d+)\b", tag))
    if len(dps) < 2:
        return None
    dp = max(dps) + 1
    tp = max(dp, max(tps) + 1 if tps else 1)
    tp = -(-tp // dp) * dp  # SGLang needs tp a multiple of the attention-DP size
    return {"tp_size": tp, "dp_size": dp, "enable_dp_attention": True}


def select_group(trace: PrefillTrace, group: int | None, notes: list[str] | None = None, how: str = "--group N") -> PrefillTrace:
    """The trace of one server configuration. A trace of one configuration (or none known)
    is itself; a trace that mixes several is priced one configuration at a time: `group`
    picks it, and without it the trace is refused with the groups named (never priced
    with one configuration's chunk and ceiling for all); `how` names the way to pick one."""
    from bcgtune.core.trace.groups import check_group_index

    n = len(trace.groups)
    if group is not None:
        check_group_index(trace.groups, group)
        if n <= 1:
            return trace
        view = trace.group_view(group)
        if notes is not None:
            notes.append(f"note: priced group {group} of {n}: {trace.groups[group].label()}")
        return view
    if n > 1:
        raise InputError(
            f"the trace mixes {n} server configurations, each with its own chunk and bucket ceiling: "
            f"{trace.describe_groups()}; price one with {how}, or trace each configuration apart",
            field="group",
        )
    return trace


def attention_dp_of(flags: dict[str, Any]) -> int:
    """Attention-DP ranks of a launch given as snake-case flags (SGLang's layout rules)."""
    from bcgtune.adapters.sglang.flags import layout_from_server_flags

    return layout_from_server_flags(flags).attn_dp_size


_attention_dp = attention_dp_of


def _traced_chunk(trace: PrefillTrace, flags: dict[str, Any]) -> int:
    """The launch's --chunked-prefill-size as the trace knows it. A trace knows the chunk
    of one rank (the server's startup line, a simulation's resolved setting, or the
    smallest default that covers its batches); under DP attention SGLang divides the
    launch value by the attention-DP size, so the launch value is that many times it."""
    return assumed_chunked_prefill_size(trace, None) * max(1, _attention_dp(flags))


def profile_server_flags(
    prof,
    trace: PrefillTrace,
    chunked_prefill_size: int | None = None,
    overrides: dict[str, Any] | None = None,
    *,
    traced_chunk: bool = True,
) -> dict[str, Any]:
    """A profile's [server] flags as priced against a trace, with `overrides` (snake-case
    launch flags) in place of its own: the chunk is the one given, else the profile's, else
    the trace's (per attention-DP rank, times the ranks) when the trace knows it and
    `traced_chunk` (a list about to be written with that chunk: suggest-buckets
    --write-profile), or when the profile's GPU does not set SGLang's memory-based default.
    `traced_chunk` False (the profile as deployed: drift): a profile that states no chunk
    launches with its GPU's default, as doctor and serve --dry-run price it."""
    from bcgtune.adapters.machine.hardware import gpu_for
    from bcgtune.files.profile_file import snake

    server = {snake(str(k)): v for k, v in prof.server.items()}
    server.update(overrides or {})
    if chunked_prefill_size:
        server["chunked_prefill_size"] = chunked_prefill_size
    elif "chunked_prefill_size" not in server and (
        (traced_chunk and trace.chunked_prefill_size()) or gpu_for(prof.hardware) is None
    ):
        server["chunked_prefill_size"] = _traced_chunk(trace, server)
    return server


def _profile_launch(
    req: SuggestRequest, trace: PrefillTrace, notes: list[str], say: Callable[[str], None] | None
) -> tuple[dict[str, Any], PrefillCapture]:
    """The profile's launch and what SGLang captures for it (the list left to choose). The
    chunk: --chunked-prefill-size, else the profile's, else as the trace knows it when the
    profile's GPU does not set SGLang's default (as drift takes it)."""
    from bcgtune.services.launch import capture_for_flags

    prof = req.profile
    server = profile_server_flags(
        prof, trace, req.chunked_prefill_size, dict(req.server_flags or {}), traced_chunk=not req.profile_as_deployed
    )
    if req.server_flags:  # the layout flags given replace the profile's own
        notes.append(
            f"note: priced as profile {prof.name} launches with {_flags_text(dict(req.server_flags))} "
            "in place of its own (written into it with the list)"
        )
    traced = trace_layout_flags(trace)
    if traced and _attention_dp(traced) != _attention_dp(server):
        notes.append(
            f"note: the trace's servers ran {_flags_text(traced)}; priced as profile {prof.name} launches "
            f"(attention DP {_attention_dp(server)}), the launch the list is written for"
        )
    capture = capture_for_flags(
        server,
        platform=prof.platform,
        model_path=prof.model or "",
        hardware=prof.hardware or None,
        env=prof.env,
        source=prof.path,
        sglang=req.sglang,
        say=say,
    )
    largest, chunk = int(trace.sizes[-1]), capture.chunked_prefill_size
    if chunk is not None and 0 < chunk < largest:
        wanted = assumed_chunked_prefill_size(trace, None) * max(1, _attention_dp(server))
        raise ChunkTooSmall(prof.name, largest, chunk, wanted)
    return server, capture


def profile_launch_capture(
    profile,
    trace: PrefillTrace,
    *,
    chunked_prefill_size: int | None = None,
    sglang: SglangUse = "ask",
    say: Callable[[str], None] | None = None,
) -> PrefillCapture:
    """What SGLang captures for the launch `profile` makes as a list for `trace` would be
    priced and written into it (suggest-buckets --write-profile, tune --write-profile):
    SGLang's own answer when it gives one (asked now, as `sglang` allows, and cached for the
    pricing that follows), else bcgtune's model's. A launch SGLang refuses (by its answer,
    or by the model of its checks) raises LaunchRefused."""
    from bcgtune.services.launch import refuse_refused

    trace.validate()
    req = SuggestRequest(trace=trace, profile=profile, chunked_prefill_size=chunked_prefill_size, sglang=sglang)
    _, capture = _profile_launch(req, trace, [], say)
    refuse_refused(capture, profile.where)
    return capture


# The launch settings of a configuration that a profile written for it carries (with its
# model): what drift pairs a profile with a configuration by, and what sets its capture.
_PROFILE_LAUNCH_KEYS = (
    "tp_size", "dp_size", "enable_dp_attention", "attn_dp_size", "pp_size", "ep_size", "chunked_prefill_size",
    "enable_mixed_chunk", *(k for k in _LOGGED_LAYOUT_KEYS if k not in ("tp_size", "dp_size", "attn_dp_size",
                                                                        "enable_dp_attention")),
)  # fmt: skip


def _neutral(value: Any) -> bool:
    """A setting's value that SGLang's defaults give (off, one rank, no backend)."""
    if isinstance(value, bool):
        return value is False
    return value is None or value == "none" or (isinstance(value, int) and value == 1)


def profile_for_trace(prof, trace: PrefillTrace, given: dict[str, Any] | None = None):
    """`prof` as it launches the one configuration `trace` holds, for a list written for that
    traffic: the model and launch settings its logs state (core.trace.groups) in place of the
    profile's own, except those `given` (snake-case flags given on the command line) sets.
    Returns (the profile, the [server] settings it changes, snake case, the model it changes
    to or None): written with the list, they make the profile state the configuration drift
    pairs it with. A trace of several configurations, or of none logged, leaves it as it is."""
    from dataclasses import replace

    from bcgtune.files.profile_file import snake

    if len(trace.groups) != 1:
        return prof, {}, None
    logged = trace.groups[0].settings
    own = {snake(str(k)): v for k, v in prof.server.items()}
    changes: dict[str, Any] = {}
    for key in _PROFILE_LAUNCH_KEYS:
        value = logged.get(key)
        if key in (given or {}) or value is None or own.get(key) == value:
            continue
        if key in own or not _neutral(value) or key == "chunked_prefill_size":
            changes[key] = value
    model = logged.get("model_path")
    model = model if isinstance(model, str) and model.strip() and model != prof.model else None
    if not changes and model is None:
        return prof, {}, None
    server = {k: v for k, v in prof.server.items() if snake(str(k)) not in changes}
    server.update({k.replace("_", "-"): v for k, v in changes.items()})
    return replace(prof, server=server, model=model or prof.model), changes, model


class ChunkTooSmall(InputError):
    """The trace's batches outgrow the chunk a profile launches with: its servers ran a
    larger chunk (`wanted` covers the trace), and the profile's launch never forms such
    batches. The message says what suggest-buckets takes; `batches_outgrow` says what the
    batches and the profile are, for a command that words its own remedy."""

    def __init__(self, profile: str, largest: int, chunk: int, wanted: int):
        self.profile, self.largest, self.chunk, self.wanted = profile, largest, chunk, wanted
        super().__init__(
            f"{self.batches_outgrow()}; give --chunked-prefill-size {wanted} to price (and write) that launch, "
            "or trace a server launched as the profile is",
            field="chunked_prefill_size",
        )

    def batches_outgrow(self) -> str:
        return (
            f"the trace's batches reach {self.largest:,} tokens, above the chunked prefill size profile "
            f"{self.profile} launches with ({self.chunk:,} per attention-DP rank): its servers ran a larger "
            "chunk, and this launch never forms such batches"
        )


def _ceiling(trace: PrefillTrace, capture: PrefillCapture, align: int) -> int | None:
    """The largest bucket worth offering: the ladder's maximum for this launch (no batch is
    larger than the chunk), unless not even the smallest traced batch fits under it."""
    smallest = ceil_to(int(trace.sizes[0]), align)
    return capture.max_bs if smallest <= capture.max_bs else None


def _shape_warnings(req: SuggestRequest, flags: dict[str, Any]) -> list[str]:
    """Where the calibration's measured shape differs from the launch priced: the profile's
    model, the launch's TP and EP (core.plan.shape_check)."""
    from bcgtune.core.plan.shape_check import shape_notes

    if req.calibration is None:
        return []

    def count(key: str) -> int | None:
        v = flags.get(key)
        return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None

    model = req.profile.model if req.profile is not None else None
    tp = count("tp_size") or (1 if req.profile is not None else None)
    return ["warning: " + w for w in shape_notes(req.calibration.meta, model, tp, count("ep_size"))]


def _refuse_contradicted_chunk(trace: PrefillTrace) -> None:
    """A trace whose launch settings give a chunk per attention-DP rank below its largest
    batch: SGLang's scheduler never forms such a batch (srt/managers/schedule_policy.py,
    PrefillAdder's rem_chunk_tokens), so the settings are not those of the servers that
    wrote the logs, and a list capped at that chunk would leave the larger batches eager."""
    known = trace.chunked_prefill_size()
    largest = int(trace.sizes[-1]) if trace.sizes.size else 0
    if known is None or known <= 0 or largest <= known:
        return
    g = trace.groups[0] if len(trace.groups) == 1 else None
    how = "given with trace --launch" if g is not None and g.given else "as the trace states them"
    raise InputError(
        f"the trace's batches reach {largest:,} tokens, above the chunk of {known:,} per attention-DP rank its launch "
        f"settings give ({how}): they are not the settings of the servers that wrote the logs; trace again with the "
        "settings they ran, or give --chunked-prefill-size",
        field="chunked_prefill_size",
    )


def suggest(req: SuggestRequest, *, say: Callable[[str], None] | None = None) -> Suggestion:
    """The optimal list for the request's trace and launch, with its comparison rows."""
    from bcgtune.services.launch import capture_for_flags, refuse_refused

    if req.chunked_prefill_size == 0:
        raise InputError("must be positive, or -1 to turn chunked prefill off", field="chunked_prefill_size")
    if req.tolerance_pct is not None and req.objective != "time":
        raise InputError("applies to the time objective (--objective time --calibration FILE) only", field="tolerance")
    compare = list(req.compare)
    trace = req.trace
    if trace is None:
        trace = default_trace(req.seed)
        if not any(lst == MI355X_PR_HAND_LIST for _, lst in compare):
            compare.insert(0, (MI355X_PR_HAND_LIST_NAME, list(MI355X_PR_HAND_LIST)))
    trace.validate()
    notes: list[str] = []
    trace = select_group(trace, req.group, notes)
    if req.profile is not None:
        flags, capture = _profile_launch(req, trace, notes, say)
        if req.profile.buckets and not any(lst == list(req.profile.buckets) for _, lst in compare):
            compare.append((f"profile {req.profile.name}'s current list", list(req.profile.buckets)))
    else:
        if not req.chunked_prefill_size:
            _refuse_contradicted_chunk(trace)
        flags = _launch_flags(req, trace, notes)
        launch_flags = {**flags, "chunked_prefill_size": req.chunked_prefill_size or _traced_chunk(trace, flags)}
        capture = capture_for_flags(launch_flags, platform="cuda", sglang=req.sglang, say=say)
    refuse_refused(capture, f"profile {req.profile.name}" if req.profile is not None else None)
    notes += _shape_warnings(req, flags)
    if not capture.graphs_on:
        return Suggestion(trace, capture, None, flags, notes)
    align = capture.alignment if req.align is None else req.align
    plan_req = plan_request(
        max_buckets=req.max_buckets,
        align=align,
        layout_align=capture.alignment,
        max_bucket=_ceiling(trace, capture, max(1, align)) if req.max_bucket is None else req.max_bucket,
        padding_factor=req.padding_factor,
        objective=req.objective,
        sglang_ladder=list(capture.captured) if capture.buckets is None else None,
        ladder_max=capture.max_bs,
        compare=compare,
        calibration=req.calibration,
        max_graph_mem_gib=req.max_graph_mem_gib,
        kmeans=req.kmeans and req.baselines,
        quantiles=req.baselines,
        candidates=req.candidates,
        seed=req.seed,
        attention_dp_size=_attention_dp(flags),
        tolerance_pct=req.tolerance_pct,
    )
    return Suggestion(trace, capture, make_plan(trace, plan_req), flags, notes)
