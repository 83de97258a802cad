"""`bcgtune tune`: options, one call into bcgtune.services.tune, the result rendered (and,
when asked, written into a profile and plotted)."""

from __future__ import annotations

import os
from typing import Annotated, List, Optional

import typer

from bcgtune.cli import guard
from bcgtune.cli.console import emit, note
from bcgtune.cli.help import examples
from bcgtune.cli.options import (
    LAUNCH_HELP,
    LOG_HELP,
    MIXED_CHUNK_HELP,
    PLANNED,
    TOLERANCE_HELP,
    EngineOptions,
    JsonFlag,
    Quiet,
    Unchecked,
    measure_option,
    options,
    tolerance_option,
)
from bcgtune.core.plan.measure_defaults import TUNE_BUDGET_CPU_S, TUNE_BUDGET_S
from bcgtune.engines.preflight import require_torch
from bcgtune.errors import InputError

_MEASURE = "Measurement"


_LOGS = "Server logs instead of a trace"


@examples(
    "bcgtune tune trace.json --model qwen3-8b --write-profile h200.toml",
    "bcgtune tune --log server.log --model qwen3-8b  # from logs, their trace kept",
    "bcgtune tune trace.json --model tiny --json  # a CPU dry run of every step",
)
@options("engine", EngineOptions)
def tune_command(
    traces: Annotated[
        Optional[List[str]],
        typer.Argument(
            metavar="TRACE",
            help="The workload's prefill trace (from bcgtune trace); with --log, more logs.",
            show_default=False,
        ),
    ] = None,
    log: Annotated[Optional[List[str]], typer.Option("--log", help=LOG_HELP, rich_help_panel=_LOGS, show_default=False)] = None,
    group: Annotated[
        Optional[int],
        typer.Option(
            "--group",
            min=0,
            help="With --log: tune this server configuration of the logs (as `trace` numbers them).",
            rich_help_panel=_LOGS,
            show_default=False,
        ),
    ] = None,
    launch: Annotated[
        Optional[List[str]], typer.Option("--launch", help=LAUNCH_HELP, rich_help_panel=_LOGS, show_default=False)
    ] = None,
    mixed_chunk: Annotated[bool, typer.Option("--mixed-chunk", help=MIXED_CHUNK_HELP, rich_help_panel=_LOGS)] = False,
    profile: Annotated[
        Optional[str],
        typer.Option("--profile", "-p", help="Price the launch this profile makes (its flags, GPU, model).", show_default=False),
    ] = None,
    write_profile: Annotated[
        Optional[str],
        typer.Option(
            "--write-profile",
            help="Write the list and a [tuned] record (the proof run's measured gain, graphs, capture time, graph memory, "
            "calibration hash, device, torch, date) into this profile; a new file is made from --profile or the "
            "built-in profile named like it.",
            show_default=False,
        ),
    ] = None,
    state_dir: Annotated[
        Optional[str],
        typer.Option(
            "--state-dir",
            help="Folder of the tune's state and calibration; a tune killed midway resumes from it and never measures "
            "again what it has. Default: ./bcgtune-tune-<trace name>.",
            show_default=False,
        ),
    ] = None,
    budget: Annotated[
        Optional[float],
        typer.Option(
            "--budget",
            min=1.0,
            max=1e6,
            help="Device seconds the whole tune may take (wall time on a GPU or the CPU; the simulated clock with --device "
            "sim). The tune times a few forwards first, then plans every step to fit and prints the plan with each step's "
            f"predicted seconds. Default: {TUNE_BUDGET_S:g} on a GPU or the simulated device, {TUNE_BUDGET_CPU_S:g} on the "
            "CPU (a dry run).",
            rich_help_panel=_MEASURE,
            show_default=False,
        ),
    ] = None,
    grid: Annotated[
        Optional[int],
        typer.Option(
            "--grid",
            min=1,
            max=2**31 - 1,
            help="Bucket grid of the calibration. " + PLANNED,
            rich_help_panel=_MEASURE,
            show_default=False,
        ),
    ] = None,
    # calibrate's options, declared once (cli.options.measure_option)
    mix_every: Annotated[Optional[int], measure_option("mix_every", panel=_MEASURE, planned=True)] = None,
    repeats: Annotated[Optional[int], measure_option("repeats", panel=_MEASURE, planned=True)] = None,
    warmup: Annotated[Optional[int], measure_option("warmup", panel=_MEASURE, planned=True)] = None,
    memory: Annotated[Optional[bool], measure_option("memory", panel=_MEASURE, planned=True)] = None,
    check_batches: Annotated[Optional[int], measure_option("check_batches", panel=_MEASURE, planned=True)] = None,
    bucket_list: Annotated[
        Optional[str],
        typer.Option(
            "--list",
            help="Tune this list instead of the optimizer's (your current one, say): its unmeasured sizes measured, "
            "validated and proved against SGLang's ladder; the optimum is still reported.",
            rich_help_panel=_MEASURE,
            show_default=False,
        ),
    ] = None,
    max_buckets: Annotated[
        int, typer.Option("--max-buckets", "-k", min=1, max=4096, help="Most buckets in the list.", rich_help_panel=_MEASURE)
    ] = 12,
    tolerance: Annotated[
        Optional[float],
        typer.Option(
            "--tolerance",
            callback=tolerance_option,
            help=TOLERANCE_HELP,
            rich_help_panel=_MEASURE,
            show_default=False,
        ),
    ] = None,
    measure_rounds: Annotated[
        int,
        typer.Option(
            "--measure-rounds",
            min=0,
            max=20,
            help="At most this many rounds of measuring the sizes the optimizer wants and the calibration lacks.",
            rich_help_panel=_MEASURE,
        ),
    ] = 3,
    proof_batches: Annotated[
        Optional[int],
        typer.Option(
            "--proof-batches",
            min=1,
            max=10_000_000,
            help="The proof run replays at most this many of the trace's batches: the whole trace when it holds that many, "
            "else a sample stratified by the bucket each list gives a batch, in trace order; what it says about the whole "
            "trace is estimated from it with the sampling error in the interval. " + PLANNED,
            rich_help_panel=_MEASURE,
            show_default=False,
        ),
    ] = None,
    passes: Annotated[
        int,
        typer.Option(
            "--passes",
            min=1,
            max=100,
            help="Independent passes of the proof run (interleaved A/A rounds each).",
            rich_help_panel=_MEASURE,
        ),
    ] = 1,
    proof_repeats: Annotated[
        Optional[int],
        typer.Option(
            "--proof-repeats",
            min=1,
            max=10000,
            help="Timed rounds per proof pass. " + PLANNED,
            rich_help_panel=_MEASURE,
            show_default=False,
        ),
    ] = None,
    no_sglang_probe: Annotated[
        bool,
        typer.Option(
            "--no-sglang-probe",
            help="Never start the installed SGLang (by default it checks the profile's launch before anything is measured: "
            "about 10-20 s once, then cached); answers it gave before are still used.",
        ),
    ] = False,
    unchecked: Unchecked = False,
    plot: Annotated[
        Optional[str],
        typer.Option("--plot", help="Write a PNG of predicted vs measured per list (needs bcgtune[plot]).", show_default=False),
    ] = None,
    as_json: JsonFlag = False,
    quiet: Quiet = False,
    engine: EngineOptions = None,  # type: ignore[assignment]
) -> None:
    """Tune on the GPU in one command: calibrate, optimize, measure, validate, prove.

    Steps, each resumable from --state-dir: calibrate the trace's sizes (with the model
    check), find the time optimum, measure the sizes it wants until the list holds only
    measured sizes, validate the list (replay against eager, side inputs included), then a
    proof run: the list, SGLang's ladder and eager replayed on the trace in interleaved
    rounds, measured totals and gain beside the predicted ones.
    """
    from bcgtune.cli.commands.engine import _spec
    from bcgtune.cli.commands.suggest import _base_profile, _profile_target

    trace, log = _what_to_tune(traces, log, group is not None or bool(launch) or mixed_chunk)
    from bcgtune.core.trace.groups import parse_launch_settings

    settings = parse_launch_settings(list(launch or []), "--launch") if launch else None
    name = trace if trace is not None else log[0]
    given = None
    if bucket_list is not None:
        from bcgtune.core.sglang.replay import parse_bucket_list

        given = parse_bucket_list(bucket_list, "--list")
    stem = "stdin" if name == "-" else os.path.basename(name.rstrip("/")).split(".")[0]
    folder = state_dir or "bcgtune-tune-" + (stem or "trace")
    guard.workdir(folder, "--state-dir")
    target = _profile_target(write_profile) if write_profile else None
    if unchecked and target is None:
        raise InputError("applies to --write-profile (what is written when SGLang did not check the launch)", "--unchecked")
    from bcgtune.services.trace import log_input_files
    from bcgtune.services.tune import STATE_FILES, TRACE_FILE

    inputs = log_input_files(log) if log else [str(trace)]
    # the logs' trace is written there (a new folder holds no input to guard)
    made = {"--state-dir": os.path.join(folder, TRACE_FILE)} if log and os.path.isdir(folder) else {}
    guard.outputs({"--write-profile": target, "--plot": plot, **made}, inputs=[*inputs, *([profile] if profile else [])])
    for flag, path in (("--write-profile", target), ("--plot", plot)):
        inside = path and os.path.realpath(os.path.dirname(os.path.abspath(path))) == os.path.realpath(folder)
        if inside and os.path.basename(str(path)) in STATE_FILES:
            raise InputError("is one of the tune's own state files", flag)
    if plot:
        guard.needs("matplotlib", "plot", "--plot")
    base = None
    if target is not None:
        base = profile if profile is not None and not os.path.exists(target) else None
        if base is None:
            base = _base_profile(target, None) if not os.path.exists(target) else None
    prof = None
    if profile is not None:
        from bcgtune.files.profile_file import load_profile

        prof = load_profile(profile)
    require_torch(engine.device)
    from bcgtune.cli.render.tune import format_tune, plot_tune
    from bcgtune.services import tune

    if log:
        trace = tune.trace_of_logs(
            log, folder, group=group, launch=settings, mixed_chunk=mixed_chunk, say=lambda m: note(m, quiet)
        )
    assert trace is not None
    req = tune.TuneRequest(
        trace=trace,
        spec=_spec(engine),
        state_dir=folder,
        profile=prof,
        grid=grid,
        mix_every=mix_every,
        warmup=warmup,
        repeats=repeats,
        memory=memory,
        check_batches=check_batches,
        max_buckets=max_buckets,
        measure_rounds=measure_rounds,
        proof_batches=proof_batches,
        passes=passes,
        proof_repeats=proof_repeats,
        tolerance_pct=tolerance,
        buckets=given,
        budget_s=budget,
    )
    checked = _check_launch(prof, target, base, trace, engine.chunked_prefill_size, no_sglang_probe, unchecked, quiet)
    result = tune.tune(req, say=lambda m: note(m, quiet))
    if plot:
        plot_tune(result, plot)
        note(f"wrote {plot}", quiet)
    if target is not None and not result.buckets:
        note(f"nothing written to {target}: the list recommended has no graphs (prefill runs eager)", quiet)
    elif target is not None:
        _write(target, base, result, engine.chunked_prefill_size, checked)
        note(f"wrote {len(result.buckets)} buckets and a [tuned] record to {target}", quiet)
    emit(result.to_json, lambda: format_tune(result), as_json=as_json)


def _check_launch(prof, target, base, trace_path: str, chunk, no_probe: bool, unchecked: bool, quiet: bool):
    """Before anything is measured: SGLang checks the launch the list is priced for (--profile)
    or written into (--write-profile), as suggest-buckets does (exit 2 if it refuses it), and
    a profile is written only for a launch SGLang checked or bcgtune's model vouches for,
    else with --unchecked."""
    import os

    from bcgtune.cli.console import Sayer
    from bcgtune.files.profile_file import load_profile
    from bcgtune.files.trace_file import load_trace
    from bcgtune.services.launch import require_vouched, sglang_use
    from bcgtune.services.suggest import profile_launch_capture

    written = None
    if target is not None:
        written = load_profile(target if os.path.exists(target) else base) if (os.path.exists(target) or base) else None
    launch = prof if prof is not None else written
    if launch is None:
        return None
    capture = profile_launch_capture(
        launch,
        load_trace(trace_path),
        chunked_prefill_size=None if prof is not None else chunk,
        sglang=sglang_use(no_probe),
        say=Sayer(quiet),
    )
    if target is not None:
        require_vouched(capture, unchecked_ok=unchecked)
    return capture


def _what_to_tune(traces: list[str] | None, log: list[str] | None, log_options: bool) -> tuple[str | None, list[str]]:
    """(the trace, or None) and the logs (or []) the command line names: one trace, or
    --log with any further arguments (`--log a.log b.log`, a shell glob, gives the rest as
    arguments)."""
    if log:
        return None, list(log) + list(traces or [])
    if log_options:
        raise InputError("--group, --launch and --mixed-chunk apply to --log")
    if not traces:
        raise InputError("give a trace (from bcgtune trace) or --log FILE (an SGLang server log)", "TRACE")
    if len(traces) > 1:
        raise InputError(f"one trace at a time, got {len(traces)} (logs go with --log)", "TRACE")
    if not traces[0].strip():
        raise InputError("no trace given (an empty path)", "TRACE")
    return traces[0], []


def _write(target: str, base: str | None, result, chunk: int | None, checked) -> None:
    """The list into the profile as suggest-buckets --write-profile writes it (with the
    launch flags it was priced for, and whether SGLang checked that launch), and the
    [tuned] record."""
    import datetime as dt

    from bcgtune import __version__
    from bcgtune.files.profile_file import write_profile_buckets
    from bcgtune.services.tune import tuned_record

    provenance = {
        "trace_sha256": result.state["trace"]["sha256"],
        "trace_path": result.state["trace"]["path"],
        "objective": "time",
        "max_buckets": result.state["plan_settings"]["max_buckets"],
        "tool_version": __version__,
        "date": dt.date.today().isoformat(),
        "source": "bcgtune tune",
    }
    if checked is not None:
        from bcgtune.services.launch import launch_check_key

        provenance["launch_check"] = launch_check_key(checked)
    server = {"chunked-prefill-size": chunk} if chunk else {}  # the chunk it was priced for, when given
    write_profile_buckets(target, result.buckets, provenance, base_profile=base, server=server, tuned=tuned_record(result))
