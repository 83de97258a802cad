"""`bcgtune trace`: a workload's prefill sizes from server logs, a simulation, or a live run.
Parse the options, build the trace in one library call, render."""

from __future__ import annotations

import os
from dataclasses import asdict
from typing import TYPE_CHECKING, Annotated, Any, List, Optional

import typer

from bcgtune.cli import guard
from bcgtune.cli.console import Progress, note, out, out_json
from bcgtune.cli.help import examples
from bcgtune.cli.options import LAUNCH_HELP, LOG_HELP, MIXED_CHUNK_HELP, JsonFlag, Quiet, Workdir, options
from bcgtune.cli.schema_options import OptionSpec, option_set
from bcgtune.cli.simulate_options_table import CLIENT_OPTIONS, SERVER_OPTIONS
from bcgtune.errors import InputError

if TYPE_CHECKING:
    from bcgtune.core.trace.prefill_trace import PrefillTrace

_SIM = "Simulation (--simulate)"
_LIVE = "Live run (--live)"


def _given(self: Any) -> dict[str, Any]:
    """The simulator's options the user set (workload and profile apart)."""
    return {k: v for k, v in asdict(self).items() if v is not None and k not in ("workload", "profile")}


# bench_serving's client options and SGLang's server flags, as the simulator takes them (None:
# the workload's or the tool's default): generated from the workload schema's fields that
# carry a command-line help line (bcgtune/core/sim/workload.py), under the fields' names, into
# bcgtune/cli/simulate_options_table.py by scripts/gen_option_tables.py.
SimulateOptions: Any = option_set(
    "SimulateOptions",
    [
        OptionSpec(
            "workload",
            str,
            None,
            ("--workload",),
            "Workload TOML or built-in preset (mi355x-multimodal-pr, chat-text-h200).",
            panel=_SIM,
            show_default=False,
        ),
        OptionSpec(
            "profile",
            str,
            None,
            ("--profile",),
            "Take the server settings from a profile (built-in name or .toml); with --live, the server to launch.",
            panel=_SIM,
            show_default=False,
        ),
        *CLIENT_OPTIONS,
        *SERVER_OPTIONS,
    ],
    namespace={"given": _given},
)


@examples(
    "bcgtune trace --log server.log -o trace.json",
    "bcgtune trace --log rank0.log.gz rank1.log.gz -j 2 --json",
    "bcgtune trace --log https://logs.example.com/today.log.gz --histogram-only \\",
    "    -o today.json",
    "bcgtune trace --log s3://bucket/sglang/today/ --cluster local:8 -o fleet.npz",
    "bcgtune trace --log today/ --group 1 -o one.json   # one configuration alone",
    "bcgtune trace --log rotated.log --launch chunked_prefill_size=8192 \\",
    "    --launch tp_size=8 -o t.json   # logs that lost their start-up lines",
    "bcgtune trace merge monday.json tuesday.json -o week.json",
    "bcgtune trace --simulate --workload mi355x-multimodal-pr -o trace.json",
    "bcgtune trace --simulate --dataset-name random --random-input-len 2048 \\",
    "    --max-concurrency 32 --num-prompts 320",
    "bcgtune trace --simulate --dp-size 4 --enable-dp-attention -o trace.json",
    "bcgtune trace --live --profile h200 -- --dataset-name random --num-prompts 200",
)
@options("sim", SimulateOptions)
def trace_command(
    log: Annotated[
        Optional[List[str]],
        typer.Option(
            "--log",
            help=LOG_HELP,
            show_default=False,
        ),
    ] = None,
    out_path: Annotated[
        Optional[str],
        typer.Option(
            "-o",
            "--out",
            help="Write the trace: versioned JSON when the name ends in .json; binary (per-batch columns a few bytes each, "
            "read back fast) when it ends in .npz; size,count CSV when it ends in .csv (.gz: compressed); any other name: "
            "binary for per-batch columns of 100,000 batches or more, else JSON (the choice is printed).",
            show_default=False,
        ),
    ] = None,
    mixed_chunk: Annotated[
        bool,
        typer.Option("--mixed-chunk", help=MIXED_CHUNK_HELP),
    ] = False,
    launch: Annotated[
        Optional[List[str]],
        typer.Option(
            "--launch",
            help=LAUNCH_HELP,
            show_default=False,
        ),
    ] = None,
    jobs: Annotated[
        Optional[int],
        typer.Option(
            "--jobs",
            "-j",
            min=1,
            max=256,
            help="Log files parsed in parallel (default: the number of cores).",
            show_default=False,
        ),
    ] = None,
    histogram_only: Annotated[
        bool,
        typer.Option(
            "--histogram-only",
            help="Keep counts per size and request mixes per server configuration, not per-batch columns "
            "(memory flat in the logs' length; enough for suggest-buckets and drift).",
        ),
    ] = False,
    group: Annotated[
        Optional[int],
        typer.Option(
            "--group",
            min=0,
            help="Write only this server configuration of the logs (as `trace` numbers them): its logs are parsed "
            "again on their own, so the trace's sources, statistics and batches are that configuration's.",
            show_default=False,
        ),
    ] = None,
    cluster: Annotated[
        Optional[str],
        typer.Option(
            "--cluster",
            help="Parse the logs on a Dask cluster: local (a worker per core), local:N, or a scheduler address "
            "(tcp://host:8786); the trace is histogram-only. Needs bcgtune[cluster].",
            show_default=False,
        ),
    ] = None,
    simulate: Annotated[
        bool,
        typer.Option(
            "--simulate",
            help="Simulate a bench_serving run against SGLang's scheduler instead of reading logs.",
            rich_help_panel=_SIM,
        ),
    ] = False,
    buckets: Annotated[
        Optional[str],
        typer.Option(
            "--buckets",
            help="With --simulate: also report replay shares for this list ('256 512 ...').",
            rich_help_panel=_SIM,
            show_default=False,
        ),
    ] = None,
    calibration: Annotated[
        Optional[str],
        typer.Option(
            "--calibration",
            help="With --simulate: prefill step times from a calibration (bcgtune calibrate, or a tokens,eager_ms,graph_ms "
            "CSV) instead of the built-in model.",
            rich_help_panel=_SIM,
            show_default=False,
        ),
    ] = None,
    live: Annotated[
        bool,
        typer.Option(
            "--live",
            help="Launch the --profile server, run `python -m sglang.benchmark.serving` with the arguments after `--`, trace "
            "its log.",
            rich_help_panel=_LIVE,
        ),
    ] = False,
    workdir: Workdir = None,
    bench_args: Annotated[
        Optional[List[str]],
        typer.Argument(
            help="With --live: bench_serving arguments, after `--`, passed unchanged.",
            metavar="[-- BENCH_ARGS...]",
            show_default=False,
        ),
    ] = None,
    as_json: JsonFlag = False,
    quiet: Quiet = False,
    sim: SimulateOptions = None,
) -> None:
    """Record a workload's prefill sizes: from server logs, a simulation, or a live run."""
    modes = [m for m, on in (("--log", bool(log)), ("--simulate", simulate), ("--live", live)) if on]
    if bench_args and log and not simulate and not live:
        # `--log a.log b.log` (a shell glob): click gives one value per --log, the rest arrive here
        log = list(log) + list(bench_args)
        bench_args = None
    if len(modes) > 1:
        raise InputError(f"give one of --log, --simulate or --live, not {' and '.join(modes)}")
    if not modes:
        raise InputError("give --log FILE (an SGLang server log), --simulate or --live")
    if bench_args and not live:
        raise InputError(f"unexpected argument {bench_args[0][:60]!r} (arguments after `--` go with --live)")
    if (histogram_only or cluster or group is not None or launch) and not log:
        raise InputError("--histogram-only, --group, --launch and --cluster apply to --log")
    from bcgtune.core.trace.groups import parse_launch_settings

    given = parse_launch_settings(list(launch or []), "--launch") if launch else None
    if cluster and group is not None:
        raise InputError("--group applies to logs parsed on this machine, not with --cluster", "--group")
    if not simulate and (sim.given() or sim.workload is not None or buckets is not None or calibration is not None):
        raise InputError(
            "simulation options (workload, client and server settings, --buckets, --calibration) apply with --simulate"
        )
    from bcgtune.services.trace import log_input_files

    inputs = log_input_files(list(log or [])) + [p for p in (sim.workload, calibration, sim.profile) if p and os.path.exists(p)]
    guard.outputs({"-o": out_path}, inputs=inputs)
    if workdir is not None:
        guard.workdir(workdir)
    if live:
        _live(sim.profile, list(bench_args or []), workdir, out_path, as_json, quiet)
    elif simulate:
        _simulate(sim, buckets, calibration, out_path, as_json, quiet)
    elif cluster:
        from bcgtune.services.trace import trace_on_cluster

        with Progress(f"parsing logs on {cluster}", unit=" logs", quiet=quiet) as bar:
            trace = trace_on_cluster(list(log or []), cluster, mixed_chunk=mixed_chunk, progress=bar.update, launch=given)
        _emit(trace, out_path, as_json, quiet)
    else:
        _logs(list(log or []), mixed_chunk, jobs, histogram_only, out_path, as_json, quiet, group, given)


def _logs(
    paths: list[str],
    mixed_chunk: bool,
    jobs: int | None,
    histogram_only: bool,
    out_path: str | None,
    as_json: bool,
    quiet: bool,
    group: int | None = None,
    launch: dict[str, Any] | None = None,
) -> None:
    from bcgtune.services.trace import trace_logs

    if sum(1 for p in paths if p == "-") > 1:
        raise InputError("standard input ('-') can be read once only", "--log")
    with Progress("parsing logs", unit=" MB", scale=1e6, quiet=quiet) as bar:
        trace = trace_logs(
            paths, mixed_chunk=mixed_chunk, jobs=jobs, histogram_only=histogram_only, progress=bar.update, launch=launch,
            group=group,
        )  # fmt: skip
    if launch:
        # a setting given with --launch that every log states itself: the logs' values win
        groups = trace.groups or []
        stated = [k for k, v in launch.items() if groups and all(g.settings.get(k, v) != v for g in groups)]
        given = any(isinstance(e, dict) and e.get("launch_given") for e in trace.parse_stats.get("per_source") or [])
        if not given or len(stated) == len(launch):
            note("note: --launch not used: every log states its own launch settings, and those win", quiet)
        elif stated:
            note(f"note: --launch {', '.join(stated)} not used: every log states its own value, and those win", quiet)
    _emit(trace, out_path, as_json, quiet)


def _emit(trace: PrefillTrace, out_path: str | None, as_json: bool, quiet: bool) -> None:
    from bcgtune.cli.render.trace import render_trace_text
    from bcgtune.core.trace.summary import summarize
    from bcgtune.files.trace_file import AUTO_BINARY_BATCHES, save_trace, trace_form

    if out_path:
        save_trace(trace, out_path)
        form, chosen = trace_form(trace, out_path)
        how = ""
        if chosen:
            how = (
                "; binary: per-batch columns of this many batches write and read several times faster so (a name "
                "ending in .json writes JSON)"
                if form == "binary"
                else "; JSON (a name ending in .npz writes the binary form)"
            )
        note(f"wrote {out_path} ({trace.n_batches:,} batches, {trace.sizes.size:,} sizes{how})", quiet)
        if trace.batches is not None and trace.n_batches >= AUTO_BINARY_BATCHES and form == "json" and not chosen:
            note("a binary trace (-o NAME.npz, or a name without .json) of per-batch columns is several times smaller and "
                 "faster to write and read", quiet)  # fmt: skip
    summary = summarize(trace)
    if as_json:
        out_json(summary.to_dict())
    else:
        out(render_trace_text(summary), nl=False)


def _simulate(sim: Any, buckets: str | None, calibration: str | None, out_path: str | None, as_json: bool, quiet: bool) -> None:
    """Options -> one simulation -> the trace's outputs plus image and replay shares."""
    from bcgtune.cli.render.simulation import render_simulation_text
    from bcgtune.core.sglang.replay import parse_bucket_list
    from bcgtune.files.trace_file import save_trace
    from bcgtune.services.simulate import SimulationRequest, simulate_trace

    req = SimulationRequest(
        workload=sim.workload,
        profile=sim.profile,
        options=sim.given(),
        calibration=calibration,
        buckets=parse_bucket_list(buckets, "--buckets") if buckets is not None else None,
    )
    with Progress("simulating", unit=" requests, warm-up included", quiet=quiet) as bar:
        result = simulate_trace(req, progress=bar.update)
    trace = result.trace
    if out_path:
        save_trace(trace, out_path)
        note(f"wrote {out_path} ({trace.n_batches:,} batches, {trace.sizes.size:,} sizes)", quiet)
    if as_json:
        out_json(result.to_json())
    else:
        out(render_simulation_text(trace, result.simulation), nl=False)


def _live(
    profile: str | None, bench_args: list[str], workdir: str | None, out_path: str | None, as_json: bool, quiet: bool
) -> None:
    from bcgtune.services.live_trace import live_trace

    if profile is None:
        raise InputError("--live needs --profile (the server to launch)")
    result = live_trace(profile, bench_args, workdir=workdir, say=None if quiet else note)
    _emit(result.trace, out_path, as_json, quiet)
