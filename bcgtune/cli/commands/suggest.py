"""`bcgtune suggest-buckets`: the optimal bucket list for a trace, beside the alternatives."""

from __future__ import annotations

import datetime as dt
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, List, Optional

import typer

from bcgtune import __version__
from bcgtune.cli import guard
from bcgtune.cli.console import emit, note, out, out_json
from bcgtune.cli.help import examples
from bcgtune.cli.options import TOLERANCE_HELP, JsonFlag, LayoutOptions, Quiet, Unchecked, options, tolerance_option
from bcgtune.core.sglang.constants import CANDIDATE_SETS, DEFAULT_PADDING_FACTOR, OBJECTIVES
from bcgtune.errors import InputError

if TYPE_CHECKING:
    from bcgtune.core.plan.plan_types import BucketPlan
    from bcgtune.core.sglang.capture import PrefillCapture
    from bcgtune.core.trace.prefill_trace import PrefillTrace

_OPT = "Optimizer"
_CMP = "Comparison rows"
_OUT = "Output"

Objective = Enum("Objective", {v: v for v in OBJECTIVES}, type=str)  # type: ignore[misc]
Candidates = Enum("Candidates", {v: v for v in CANDIDATE_SETS}, type=str)  # type: ignore[misc]


@examples(
    "bcgtune suggest-buckets              # the built-in MI355X image workload",
    "bcgtune suggest-buckets trace.json -k 8 --align 64",
    "bcgtune suggest-buckets trace.json --objective time --calibration cal.json",
    "bcgtune suggest-buckets trace.json --write-profile h200.toml  # from h200",
)
@options("layout", LayoutOptions)
def suggest_buckets_command(
    trace_path: Annotated[
        Optional[str],
        typer.Argument(
            metavar="TRACE",
            help="JSON trace (bcgtune trace -o), size,count CSV, JSON array of sizes or one size per line; '-' for stdin. "
            "Default: simulate the built-in workload (the image benchmark of the Qwen multimodal breakable-prefill PR on "
            "MI355X).",
            show_default=False,
        ),
    ] = None,
    max_buckets: Annotated[
        int, typer.Option("--max-buckets", "-k", help="At most this many buckets (graphs).", rich_help_panel=_OPT)
    ] = 12,
    align: Annotated[
        Optional[int],
        typer.Option(
            "--align",
            help="Buckets are multiples of this. Default: the layout's capture alignment (1 unless the layout flags say "
            "otherwise).",
            rich_help_panel=_OPT,
            show_default=False,
        ),
    ] = None,
    max_bucket: Annotated[
        Optional[int],
        typer.Option(
            "--max-bucket", help="No bucket above this many tokens. Default: none.", rich_help_panel=_OPT, show_default=False
        ),
    ] = None,
    padding_factor: Annotated[
        float,
        typer.Option("--padding-factor", help="Replay iff bucket <= factor x tokens (SGLang's rule: 2).", rich_help_panel=_OPT),
    ] = DEFAULT_PADDING_FACTOR,
    objective: Annotated[
        Objective,
        typer.Option(
            "--objective",
            help="padding (fewest eager batches, then fewest padded tokens) or time (least predicted prefill time; needs "
            "--calibration).",
            rich_help_panel=_OPT,
        ),
    ] = Objective("padding"),
    calibration: Annotated[
        Optional[str],
        typer.Option(
            "--calibration",
            help="Calibration from `bcgtune calibrate` (JSON) or a tokens,eager_ms,graph_ms CSV: prices every row in "
            "predicted ms.",
            rich_help_panel=_OPT,
            show_default=False,
        ),
    ] = None,
    max_graph_mem_gib: Annotated[
        Optional[float],
        typer.Option(
            "--max-graph-mem",
            help="GiB budget for all graphs (time objective; the calibration's memory model).",
            rich_help_panel=_OPT,
            show_default=False,
        ),
    ] = None,
    tolerance: Annotated[
        Optional[float],
        typer.Option(
            "--tolerance",
            callback=tolerance_option,
            help="Time objective. " + TOLERANCE_HELP,
            rich_help_panel=_OPT,
            show_default=False,
        ),
    ] = None,
    candidates: Annotated[
        Candidates,
        typer.Option(
            "--candidates",
            help="Time objective's buckets: trace (any size, interpolated replay time), calibration (measured sizes only, at "
            "their measured time; sizes it did not measure are searched too and named, with the command that measures "
            "them), auto (calibration when it was measured on a bucket grid: `calibrate --grid`).",
            rich_help_panel=_OPT,
        ),
    ] = Candidates("auto"),
    seed: Annotated[
        int,
        typer.Option(
            "--seed", help="Seed for KMeans; for the default simulation, 0 keeps the workload's own seed.", rich_help_panel=_OPT
        ),
    ] = 0,
    compare: Annotated[
        Optional[List[str]],
        typer.Option(
            "--compare",
            help='A list to compare, e.g. "256 512 1024", optionally "NAME=256 512 1024". Repeatable.',
            rich_help_panel=_CMP,
            show_default=False,
        ),
    ] = None,
    chunked_prefill_size: Annotated[
        Optional[int],
        typer.Option(
            "--chunked-prefill-size",
            min=-1,
            max=2**31 - 1,
            help="The server's chunked prefill size (-1: off), which sets SGLang's ladder and the largest useful bucket. "
            "Default: from the trace, else the smallest SGLang default that covers it.",
            rich_help_panel=_CMP,
            show_default=False,
        ),
    ] = None,
    kmeans: Annotated[
        bool,
        typer.Option(
            "--kmeans", help="Also compare scikit-learn's KMeans (imports scikit-learn: a few seconds).", rich_help_panel=_CMP
        ),
    ] = False,
    no_baselines: Annotated[
        bool, typer.Option("--no-baselines", help="Leave out the quantile (and KMeans) rows.", rich_help_panel=_CMP)
    ] = False,
    as_json: JsonFlag = False,
    plot: Annotated[
        Optional[str],
        typer.Option(
            "--plot",
            help="Write a PNG: the size histogram with the buckets, and waste vs K (needs bcgtune[plot]).",
            rich_help_panel=_OUT,
            show_default=False,
        ),
    ] = None,
    write_profile: Annotated[
        Optional[str],
        typer.Option(
            "--write-profile",
            help="Write the list into this profile's [buckets] (atomic). A missing file is created from --base-profile, or "
            "from the built-in profile of the same name (h200 -> ./h200.toml). The installed SGLang checks the launch first "
            "(exit 2 if it refuses it).",
            rich_help_panel=_OUT,
            show_default=False,
        ),
    ] = None,
    base_profile: Annotated[
        Optional[str],
        typer.Option(
            "--base-profile",
            help="Profile (built-in name or path) whose launch is priced (its flags, GPU, model), and which a missing "
            "--write-profile is created from.",
            rich_help_panel=_OUT,
            show_default=False,
        ),
    ] = None,
    group: Annotated[
        Optional[int],
        typer.Option(
            "--group",
            min=0,
            help="A trace from logs of several server configurations: price this one (bcgtune trace lists them).",
            rich_help_panel=_OPT,
            show_default=False,
        ),
    ] = None,
    ask_sglang: Annotated[
        bool,
        typer.Option(
            "--ask-sglang",
            help="For a trace priced without a profile: ask the installed SGLang about the launch (in a child process: "
            "about 10-20 s once, then cached). With --write-profile or --base-profile it is asked anyway.",
            rich_help_panel=_OPT,
        ),
    ] = False,
    no_sglang_probe: Annotated[
        bool,
        typer.Option(
            "--no-sglang-probe",
            help="Never start the installed SGLang: answers it gave before are still used, otherwise bcgtune's model of its "
            "rules answers and the output says the launch is not checked.",
            rich_help_panel=_OPT,
        ),
    ] = False,
    unchecked: Unchecked = False,
    quiet: Quiet = False,
    layout: LayoutOptions = None,
) -> None:
    """The optimal bucket list for a trace, compared with SGLang's default ladder and yours."""
    from bcgtune.cli.console import Sayer
    from bcgtune.cli.render.launch import capture_line
    from bcgtune.cli.render.plan import plot_plan, render_plan_text
    from bcgtune.files.trace_file import load_trace
    from bcgtune.services.launch import launch_check_json, require_vouched, sglang_use
    from bcgtune.services.suggest import SuggestRequest, suggest

    profile_path = _profile_target(write_profile) if write_profile else None
    guard.outputs({"--plot": plot, "--write-profile": profile_path})
    if plot:
        guard.needs("matplotlib", "plot", "--plot")
    if objective.value == "time" and calibration is None:
        raise InputError("the time objective needs --calibration FILE", "--objective time")
    if unchecked and not profile_path:
        raise InputError("applies to --write-profile (what is written when SGLang did not check the launch)", "--unchecked")
    base = _base_profile(profile_path, base_profile) if profile_path else base_profile
    if profile_path:
        target = _target_profile(profile_path, base)
    else:  # --base-profile alone: its launch is priced, nothing is written
        from bcgtune.files.profile_file import load_profile

        target = load_profile(base_profile) if base_profile is not None else None

    compares = [_compare_arg(text, i) for i, text in enumerate(compare or [], start=1)]
    if chunked_prefill_size == 0:
        raise InputError("must be positive, or -1 to turn chunked prefill off", "--chunked-prefill-size")
    trace = None if trace_path is None else load_trace(trace_path)
    target, launch_changes, model = _for_traffic(target, trace, group, layout, chunked_prefill_size)
    cal = None
    if calibration is not None:
        from bcgtune.files.calibration_file import load_calibration

        cal = load_calibration(calibration)
    req = SuggestRequest(
        trace=trace,
        max_buckets=max_buckets,
        align=align,
        max_bucket=max_bucket,
        padding_factor=padding_factor,
        objective=objective.value,
        calibration=cal,
        max_graph_mem_gib=max_graph_mem_gib,
        candidates=candidates.value,
        seed=seed,
        compare=compares,
        chunked_prefill_size=chunked_prefill_size,
        kmeans=kmeans,
        baselines=not no_baselines,
        server_flags=layout.flags() or None,
        tolerance_pct=tolerance,
        group=group,
        sglang=sglang_use(no_sglang_probe, ask=ask_sglang or target is not None),
        profile=target,
    )
    try:
        result = suggest(req, say=Sayer(quiet))
    except InputError as exc:
        if exc.field == "attention_dp_size":
            raise InputError(exc.what, "--dp / --attn-dp-size") from None
        raise
    for line in result.notes:
        note(line, quiet)
    plan = result.plan
    if plan is None:
        _graphs_off(result.capture, as_json, capture_line(result.capture))
        if profile_path:
            note(f"nothing written to {profile_path}: this launch captures no prefill graphs", quiet)
        return
    if plot:
        plot_plan(result.trace, plan, plot)
        note(f"wrote {plot}", quiet)
    if profile_path:
        require_vouched(result.capture, unchecked_ok=unchecked)
        # the launch the list was priced for: the layout flags and chunk given, in the profile
        server = {k.replace("_", "-"): v for k, v in {**launch_changes, **(layout.flags() or {})}.items()}
        chunk = _priced_chunk(result, chunked_prefill_size)
        if chunk is not None:
            server["chunked-prefill-size"] = chunk
        _write_profile(profile_path, base, plan, result.trace, server, result.capture, model)
        note(f"wrote {len(plan.recommended.buckets)} buckets to {profile_path}{_unchecked_note(result.capture)}", quiet)
        _say_launch_changes(profile_path, launch_changes, model, quiet)
        _say_if_drift_cannot_pair(profile_path, result.trace, group, quiet)
    emit(
        lambda: {**plan.to_json_obj(), **launch_check_json(result.capture), "launch_capture": result.capture.to_json()},
        lambda: capture_line(result.capture) + "\n" + render_plan_text(plan),
        as_json=as_json,
    )


def _for_traffic(target, trace, group: int | None, layout, chunk: int | None) -> tuple[Any, dict, str | None]:
    """The profile priced (and written) as it launches the traffic's configuration: the
    model and launch its logs state, except the flags given here (services.suggest.
    profile_for_trace); with the settings and model it changes."""
    if target is None or trace is None:
        return target, {}, None
    from bcgtune.services.suggest import profile_for_trace, select_group

    given = {**(layout.flags() or {}), **({"chunked_prefill_size": chunk} if chunk else {})}
    return profile_for_trace(target, select_group(trace, group), given)


def _say_launch_changes(profile_path: str, changes: dict, model: str | None, quiet: bool) -> None:
    if changes or model:
        what = ([f"model {model}"] if model else []) + [
            f"{k.replace('_', '-')} {str(v).lower() if isinstance(v, bool) else v}" for k, v in changes.items()
        ]
        note(f"note: {profile_path} launches as the logs of the traffic state: {', '.join(what)}", quiet)


def _priced_chunk(result, given: int | None) -> int | None:
    """The launch's --chunked-prefill-size the list was priced with, written into the
    profile even when it is the GPU's default, so the profile states the configuration it
    serves (drift matches a profile to today's configurations by it): the value given, else
    the one priced (the profile's own, or the trace's), else the capture's (per attention-DP
    rank, times the ranks)."""
    from bcgtune.services.suggest import attention_dp_of

    if given is not None:
        return given
    chunk = result.server_flags.get("chunked_prefill_size")
    if isinstance(chunk, int) and not isinstance(chunk, bool):
        return chunk
    rank = result.capture.chunked_prefill_size
    if isinstance(rank, int) and rank > 0:
        return rank * max(1, attention_dp_of(result.server_flags))
    return None


def _say_if_drift_cannot_pair(path: str, trace: PrefillTrace, group: int | None, quiet: bool) -> None:
    """A note when the profile written differs from the launch settings its trace's logs
    state (a base profile's model, say): drift pairs a profile with today's configuration by
    those settings, and would not pair this one by itself."""
    from bcgtune.files.profile_file import load_profile
    from bcgtune.services.drift import disagreement

    if len(trace.groups) != 1 or not trace.groups[0].settings:
        return
    prof = load_profile(path)
    differ = disagreement(prof, trace.groups[0].settings)
    if differ:
        at = "N" if group is None else str(group)
        note(
            f"note: {path} differs from the launch its logs state ({differ}): over logs of several "
            "configurations drift will not pair it with this one by itself; set it in the profile, or pair them "
            f"with drift --match {prof.name}={at}",
            quiet,
        )


def _graphs_off(capture: PrefillCapture, as_json: bool, source: str) -> None:
    if as_json:
        from bcgtune.services.launch import launch_check_json

        out_json(
            {
                "prefill_graphs": "off",
                "reason": capture.reason,
                "recommended": None,
                **launch_check_json(capture),
                "launch_capture": capture.to_json(),
            }
        )
    else:
        out(f"{source}\nprefill graphs are off for this launch: {capture.reason}\nno bucket list to suggest")


def _compare_arg(text: str, i: int) -> tuple[str, list[int]]:
    from bcgtune.core.sglang.replay import parse_bucket_list

    name, _, lst = text.rpartition("=")
    return (name.strip()[:60] or f"--compare #{i}", parse_bucket_list(lst, f"--compare {text[:60]!r}"))


def _profile_target(value: str) -> str:
    """`--write-profile h200` means ./h200.toml; anything with a folder or a suffix is a path."""
    from bcgtune.fileio import path_kind

    if "/" in value or value.endswith(".toml") or path_kind(value) is not None:
        return value
    return value + ".toml"


def _base_profile(path: str, base: str | None) -> str | None:
    """The profile a missing --write-profile file is created from: --base-profile, else the
    built-in profile named like the file."""
    from bcgtune.fileio import path_kind
    from bcgtune.files.profile_file import builtin_profile_names

    if path_kind(path) is not None:
        return base
    if base is not None:
        return base
    stem = Path(path).stem
    if stem in builtin_profile_names():
        return stem
    names = ", ".join(builtin_profile_names())
    raise InputError(
        f"{path} does not exist: give --base-profile (a built-in profile: {names}; or a path) to create it from",
        "--write-profile",
    )


def _target_profile(path: str, base: str | None):
    """The profile the list is written into, as it launches now (the file, or the profile it
    is created from): suggest-buckets prices that launch, so drift agrees with the list."""
    from bcgtune.fileio import path_kind
    from bcgtune.files.profile_file import load_profile

    return load_profile(path if path_kind(path) is not None or base is None else base)


def _unchecked_note(capture: PrefillCapture) -> str:
    """What a written profile's note adds when SGLang did not check the launch."""
    if capture.checked:
        return ""
    return f" (launch NOT CHECKED by SGLang: {capture.not_checked_reason}; the file says so in [buckets].launch_check)"


def _write_profile(
    path: str,
    base: str | None,
    plan: BucketPlan,
    trace: PrefillTrace,
    server: dict,
    capture: PrefillCapture,
    model: str | None = None,
) -> None:
    """Write the list, and the server flags it was priced with (layout flags and a chunk
    given on the command line), into the profile, so the profile launches what was priced;
    [buckets].launch_check says whether SGLang itself checked that launch."""
    from bcgtune.files.profile_file import trace_digest_provenance, write_profile_buckets
    from bcgtune.services.launch import launch_check_key

    provenance = {
        **trace_digest_provenance(trace.own_sources()),
        "objective": plan.request.objective,
        "max_buckets": plan.request.max_buckets,
        "tool_version": __version__,
        "date": dt.date.today().isoformat(),
        "launch_check": launch_check_key(capture),
    }
    write_profile_buckets(path, plan.recommended.buckets, provenance, base_profile=base, server=server, model=model)
