"""`bcgtune trace`: a workload's prefill sizes from server logs, a simulation, or a live run.
Parse the options, build the trace in one library call, render."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Annotated, List, Optional

import typer

from bcgtune.cli import guard
from bcgtune.cli.console import Progress, note, out, out_json
from bcgtune.cli.help import examples
from bcgtune.cli.options import JsonFlag, Quiet, Workdir, options
from bcgtune.errors import InputError

if TYPE_CHECKING:
    from bcgtune.core.trace import PrefillTrace

_SIM = "Simulation (--simulate)"
_CLIENT = "Simulated client (bench_serving's names and defaults)"
_SERVER = "Simulated server (SGLang's names; default: SGLang's own)"
_LIVE = "Live run (--live)"


@dataclass
class SimulateOptions:
    """bench_serving's client options and SGLang's server flags, as the simulator takes them
    (None: the workload's or the tool's default). Field names are the simulator's."""

    workload: Annotated[
        Optional[str],
        typer.Option(
            "--workload",
            help="Workload TOML or built-in preset (mi355x-multimodal-pr, chat-text-h200).",
            rich_help_panel=_SIM,
            show_default=False,
        ),
    ] = None
    profile: Annotated[
        Optional[str],
        typer.Option(
            "--profile",
            help="Take the server settings from a profile (built-in name or .toml); with --live, the server to launch.",
            rich_help_panel=_SIM,
            show_default=False,
        ),
    ] = None
    dataset_name: Annotated[
        Optional[str],
        typer.Option(
            "--dataset-name", help="random (default), random-ids or image.", rich_help_panel=_CLIENT, show_default=False
        ),
    ] = None
    num_prompts: Annotated[
        Optional[str],
        typer.Option(
            "--num-prompts",
            help="Prompts per run (default 1000); a comma list gives one per concurrency level.",
            rich_help_panel=_CLIENT,
            show_default=False,
        ),
    ] = None
    random_input_len: Annotated[
        Optional[int],
        typer.Option(
            "--random-input-len", help="Longest input (default 1024 tokens).", rich_help_panel=_CLIENT, show_default=False
        ),
    ] = None
    random_output_len: Annotated[
        Optional[int],
        typer.Option(
            "--random-output-len", help="Longest output (default 1024 tokens).", rich_help_panel=_CLIENT, show_default=False
        ),
    ] = None
    random_range_ratio: Annotated[
        Optional[float],
        typer.Option(
            "--random-range-ratio",
            help="Lengths uniform on [max(floor(L*r),1), L] (default 0).",
            rich_help_panel=_CLIENT,
            show_default=False,
        ),
    ] = None
    image_count: Annotated[
        Optional[int],
        typer.Option(
            "--image-count",
            help="Images per request for --dataset-name image (default 1).",
            rich_help_panel=_CLIENT,
            show_default=False,
        ),
    ] = None
    image_resolution: Annotated[
        Optional[str],
        typer.Option(
            "--image-resolution",
            help="4k, 1080p (default), 720p, 360p, HEIGHTxWIDTH or random:hxw-HxW.",
            rich_help_panel=_CLIENT,
            show_default=False,
        ),
    ] = None
    max_concurrency: Annotated[
        Optional[str],
        typer.Option(
            "--max-concurrency",
            help="One value or a comma list (a sweep, run one after another). Default: unbounded.",
            rich_help_panel=_CLIENT,
            show_default=False,
        ),
    ] = None
    request_rate: Annotated[
        Optional[float],
        typer.Option(
            "--request-rate",
            help="inf (default: closed loop) or Poisson arrivals per second.",
            rich_help_panel=_CLIENT,
            show_default=False,
        ),
    ] = None
    warmup_requests: Annotated[
        Optional[int],
        typer.Option(
            "--warmup-requests", help="Warm-up requests before each run (default 1).", rich_help_panel=_CLIENT, show_default=False
        ),
    ] = None
    seed: Annotated[
        Optional[int],
        typer.Option("--seed", help="bench_serving's seed (default 42).", rich_help_panel=_CLIENT, show_default=False),
    ] = None
    model_family: Annotated[
        Optional[str],
        typer.Option(
            "--model-family",
            help="Image tokens by qwen2-vl, qwen2.5-vl or qwen3-vl (default) resizing.",
            rich_help_panel=_CLIENT,
            show_default=False,
        ),
    ] = None
    tokens_per_image: Annotated[
        Optional[int],
        typer.Option(
            "--tokens-per-image",
            help="Fixed tokens per image instead of the family's resize rule.",
            rich_help_panel=_CLIENT,
            show_default=False,
        ),
    ] = None
    chat_template_tokens: Annotated[
        Optional[int],
        typer.Option(
            "--chat-template-tokens",
            help="Template tokens per prompt (default 8 for image, 0 for text).",
            rich_help_panel=_CLIENT,
            show_default=False,
        ),
    ] = None
    chunked_prefill_size: Annotated[
        Optional[int],
        typer.Option(
            "--chunked-prefill-size",
            help="Default: SGLang's for the GPU memory (8192 on an H200).",
            rich_help_panel=_SERVER,
            show_default=False,
        ),
    ] = None
    max_prefill_tokens: Annotated[
        Optional[int], typer.Option("--max-prefill-tokens", help="Default 16384.", rich_help_panel=_SERVER, show_default=False)
    ] = None
    max_running_requests: Annotated[
        Optional[int],
        typer.Option("--max-running-requests", help="Default: no cap by count.", rich_help_panel=_SERVER, show_default=False),
    ] = None
    page_size: Annotated[
        Optional[int], typer.Option("--page-size", help="Default 1.", rich_help_panel=_SERVER, show_default=False)
    ] = None
    enable_mixed_chunk: Annotated[
        Optional[bool],
        typer.Option(
            "--enable-mixed-chunk",
            help="Mix decode rows into prefill batches (default off).",
            rich_help_panel=_SERVER,
            show_default=False,
        ),
    ] = None
    prefill_decode_interval: Annotated[
        Optional[int],
        typer.Option(
            "--prefill-decode-interval",
            help="Decode steps forced after each prefill (default 0).",
            rich_help_panel=_SERVER,
            show_default=False,
        ),
    ] = None
    disable_radix_cache: Annotated[
        Optional[bool],
        typer.Option(
            "--disable-radix-cache", help="As the server flag (default off).", rich_help_panel=_SERVER, show_default=False
        ),
    ] = None
    dp_size: Annotated[
        Optional[int],
        typer.Option("--dp-size", help="Data parallel schedulers (default 1).", rich_help_panel=_SERVER, show_default=False),
    ] = None
    enable_dp_attention: Annotated[
        Optional[bool],
        typer.Option(
            "--enable-dp-attention",
            "--dp-attention",
            help="DP attention: the --dp-size ranks share the chunk and run every iteration together; each batch records its step (default off).",
            rich_help_panel=_SERVER,
            show_default=False,
        ),
    ] = None

    def given(self) -> dict:
        """The simulator's options the user set (workload and profile apart)."""
        return {k: v for k, v in asdict(self).items() if v is not None and k not in ("workload", "profile")}


@examples(
    "bcgtune trace --log server.log -o trace.json",
    "bcgtune trace --log rank0.log.gz --log rank1.log.gz -j 2 --json",
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
            "--log", help="SGLang server log(s), repeatable (one per rank or replica); .gz ok; '-' for stdin.", show_default=False
        ),
    ] = None,
    out_path: Annotated[
        Optional[str],
        typer.Option(
            "-o",
            "--out",
            help="Write the trace: versioned JSON, or size,count CSV when the name ends in .csv.",
            show_default=False,
        ),
    ] = None,
    mixed_chunk: Annotated[
        bool,
        typer.Option(
            "--mixed-chunk", help="The logged server ran with --enable-mixed-chunk: add one token per running decode row."
        ),
    ] = False,
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
            help="With --simulate: prefill step times from a calibration (bcgtune calibrate, or a tokens,eager_ms,graph_ms CSV) instead of the built-in model.",
            rich_help_panel=_SIM,
            show_default=False,
        ),
    ] = None,
    live: Annotated[
        bool,
        typer.Option(
            "--live",
            help="Launch the --profile server, run `python -m sglang.benchmark.serving` with the arguments after `--`, trace its log.",
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
    sim: SimulateOptions = None,  # type: ignore[assignment]
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
    if not simulate and (sim.given() or sim.workload or buckets or calibration):
        raise InputError(
            "simulation options (workload, client and server settings, --buckets, --calibration) apply with --simulate"
        )
    inputs = list(log or []) + [p for p in (sim.workload, calibration, sim.profile) if p and os.path.exists(p)]
    guard.outputs({"-o": out_path}, inputs=inputs)
    if workdir is not None:
        guard.workdir(workdir)
    if live:
        _live(sim.profile, list(bench_args or []), workdir, out_path, as_json, quiet)
    elif simulate:
        _simulate(sim, buckets, calibration, out_path, as_json, quiet)
    else:
        _logs(list(log or []), mixed_chunk, jobs, out_path, as_json, quiet)


def _logs(paths: list[str], mixed_chunk: bool, jobs: int | None, out_path: str | None, as_json: bool, quiet: bool) -> None:
    from bcgtune.adapters.sglang_log import parse_logs

    if sum(1 for p in paths if p == "-") > 1:
        raise InputError("standard input ('-') can be read once only", "--log")
    with Progress("parsing logs", unit=" MB", scale=1e6, quiet=quiet) as bar:
        trace = parse_logs(paths, mixed_chunk=mixed_chunk, jobs=jobs, progress=bar.update)
    _emit(trace, out_path, as_json, quiet)


def _emit(trace: PrefillTrace, out_path: str | None, as_json: bool, quiet: bool) -> None:
    from bcgtune.cli.render.trace import render_trace_text
    from bcgtune.core.trace import save_trace
    from bcgtune.core.trace_summary import summarize

    if out_path:
        save_trace(trace, out_path)
        note(f"wrote {out_path} ({trace.n_batches:,} batches, {trace.sizes.size:,} sizes)", quiet)
    summary = summarize(trace)
    if as_json:
        out_json(summary.to_dict())
    else:
        out(render_trace_text(summary), nl=False)


def _simulate(
    sim: SimulateOptions, buckets: str | None, calibration: str | None, out_path: str | None, as_json: bool, quiet: bool
) -> None:
    """Options -> Workload -> one simulation -> the trace's outputs plus image and replay shares."""
    from dataclasses import replace

    from bcgtune.adapters.simulator import simulate, simulation_summary
    from bcgtune.adapters.workload import workload_from_options
    from bcgtune.cli.render.simulation import render_simulation_text
    from bcgtune.core.replay import parse_bucket_list
    from bcgtune.core.trace import save_trace
    from bcgtune.core.trace_summary import summarize

    bucket_list = parse_bucket_list(buckets, "--buckets") if buckets else None
    wl = workload_from_options(workload=sim.workload, profile=sim.profile, **sim.given())
    if calibration:
        from bcgtune.core.calibration import load_calibration

        wl = replace(wl, step=wl.step.calibrated(load_calibration(calibration)))
    with Progress("simulating", unit=" requests, warm-up included", quiet=quiet) as bar:
        trace = simulate(wl, progress=bar.update)
    summary = simulation_summary(trace, bucket_list)
    if out_path:
        save_trace(trace, out_path)
        note(f"wrote {out_path} ({trace.n_batches:,} batches, {trace.sizes.size:,} sizes)", quiet)
    if as_json:
        out_json({**summarize(trace).to_dict(), "simulation": summary.to_dict()})
    else:
        out(render_simulation_text(trace, summary), nl=False)


def _live(
    profile: str | None, bench_args: list[str], workdir: str | None, out_path: str | None, as_json: bool, quiet: bool
) -> None:
    from bcgtune.adapters.live import live_trace

    if not profile:
        raise InputError("--live needs --profile (the server to launch)")
    trace = live_trace(profile, bench_args, workdir=workdir, say=None if quiet else note)
    _emit(trace, out_path, as_json, quiet)
