"""`bcgtune trace`: a workload's prefill sizes from server logs (and, later, a simulation
or a live run). Parse the options, build the trace in one library call, render."""

from __future__ import annotations

from typing import List, Optional

import typer

from bcgtune.cli.app import app

_SIM = "Simulation (--simulate)"
_CLIENT = "Simulated client (bench_serving's names)"
_SERVER = "Simulated server (SGLang's names)"
_LIVE = "Live run (--live)"


@app.command("trace")
def trace_command(
    log: Optional[List[str]] = typer.Option(
        None, "--log", help="SGLang server log(s), repeatable (one per rank or replica); .gz ok; '-' for stdin."
    ),
    out: Optional[str] = typer.Option(
        None, "-o", "--out", help="Write the trace: JSON, or size,count CSV if OUT ends in .csv."
    ),
    mixed_chunk: bool = typer.Option(
        False, "--mixed-chunk", help="The server ran with --enable-mixed-chunk: add one token per running decode row."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the summary as one JSON object."),
    # ---- --simulate: bench_serving's and SGLang's option names (see adapters/workload.py) ----
    simulate: bool = typer.Option(False, "--simulate", help="Simulate a benchmark instead of reading logs.", rich_help_panel=_SIM),
    workload: Optional[str] = typer.Option(None, "--workload", help="Workload TOML or preset name (seeds-mi355x, chat-text-h200).", rich_help_panel=_SIM),
    profile: Optional[str] = typer.Option(None, "--profile", help="Server settings from a profile (name or TOML).", rich_help_panel=_SIM),
    buckets: Optional[str] = typer.Option(None, "--buckets", help="Also report replay shares for this list ('256 512 ...').", rich_help_panel=_SIM),
    calibration: Optional[str] = typer.Option(None, "--calibration", help="Prefill step times from a calibration (bcgtune calibrate, or CSV tokens,eager_ms,graph_ms) instead of the built-in model.", rich_help_panel=_SIM),
    dataset_name: Optional[str] = typer.Option(None, "--dataset-name", help="random-ids, random or image.", rich_help_panel=_CLIENT),
    num_prompts: Optional[str] = typer.Option(None, "--num-prompts", help="Prompts per run; a comma list gives one per concurrency level.", rich_help_panel=_CLIENT),
    random_input_len: Optional[int] = typer.Option(None, "--random-input-len", rich_help_panel=_CLIENT),
    random_output_len: Optional[int] = typer.Option(None, "--random-output-len", rich_help_panel=_CLIENT),
    random_range_ratio: Optional[float] = typer.Option(None, "--random-range-ratio", help="Lengths uniform on \\[max(floor(L*r),1), L].", rich_help_panel=_CLIENT),
    image_count: Optional[int] = typer.Option(None, "--image-count", rich_help_panel=_CLIENT),
    image_resolution: Optional[str] = typer.Option(None, "--image-resolution", help="4k, 1080p, 720p, 360p, HEIGHTxWIDTH or random:hxw-HxW.", rich_help_panel=_CLIENT),
    max_concurrency: Optional[str] = typer.Option(None, "--max-concurrency", help="One value or a comma list (a sweep, run one after another).", rich_help_panel=_CLIENT),
    request_rate: Optional[float] = typer.Option(None, "--request-rate", help="inf = closed loop; else Poisson arrivals per second.", rich_help_panel=_CLIENT),
    warmup_requests: Optional[int] = typer.Option(None, "--warmup-requests", rich_help_panel=_CLIENT),
    seed: Optional[int] = typer.Option(None, "--seed", rich_help_panel=_CLIENT),
    model_family: Optional[str] = typer.Option(None, "--model-family", help="qwen2-vl, qwen2.5-vl or qwen3-vl (image tokens).", rich_help_panel=_CLIENT),
    tokens_per_image: Optional[int] = typer.Option(None, "--tokens-per-image", help="Fixed tokens per image instead of the family's resize rule.", rich_help_panel=_CLIENT),
    chat_template_tokens: Optional[int] = typer.Option(None, "--chat-template-tokens", help="Template tokens per prompt (default 8 for image, 0 for text).", rich_help_panel=_CLIENT),
    chunked_prefill_size: Optional[int] = typer.Option(None, "--chunked-prefill-size", rich_help_panel=_SERVER),
    max_prefill_tokens: Optional[int] = typer.Option(None, "--max-prefill-tokens", rich_help_panel=_SERVER),
    max_running_requests: Optional[int] = typer.Option(None, "--max-running-requests", rich_help_panel=_SERVER),
    page_size: Optional[int] = typer.Option(None, "--page-size", rich_help_panel=_SERVER),
    enable_mixed_chunk: Optional[bool] = typer.Option(None, "--enable-mixed-chunk", rich_help_panel=_SERVER),
    prefill_decode_interval: Optional[int] = typer.Option(None, "--prefill-decode-interval", rich_help_panel=_SERVER),
    disable_radix_cache: Optional[bool] = typer.Option(None, "--disable-radix-cache", rich_help_panel=_SERVER),
    dp_size: Optional[int] = typer.Option(None, "--dp-size", rich_help_panel=_SERVER),
    # ---- --live: launch the profile's server and run bench_serving (adapters/live.py) ----
    live: bool = typer.Option(False, "--live", help="Launch the --profile server, run `python -m sglang.benchmark.serving` with the args after `--`, trace its log.", rich_help_panel=_LIVE),
    live_dir: Optional[str] = typer.Option(None, "--live-dir", help="Folder for server.log, client.log, bench.jsonl (default ./bcgtune-live-<profile>-<time>).", rich_help_panel=_LIVE),
    bench_args: Optional[List[str]] = typer.Argument(None, help="With --live: bench_serving arguments, after `--`, passed unchanged.", metavar="[-- BENCH_ARGS...]"),
) -> None:
    """Record a workload's prefill forward sizes."""
    from bcgtune.errors import InputError

    if live:
        if log or simulate:
            raise InputError("give one of --log, --simulate or --live", "bcgtune trace")
        if not profile:
            raise InputError("--live needs --profile (the server to launch)", "bcgtune trace")
        from bcgtune.adapters.live import live_trace

        _emit(live_trace(profile, list(bench_args or []), workdir=live_dir), out, as_json)
        return
    if bench_args and log and not simulate:
        # `--log a.log b.log` (a shell glob): click gives one value per --log, the rest arrive here
        log = list(log) + list(bench_args)
        bench_args = None
    if bench_args:
        raise InputError(f"unexpected argument {bench_args[0]!r} (arguments after `--` go with --live)", "bcgtune trace")
    if simulate:
        if log:
            raise InputError("give --log or --simulate, not both", "bcgtune trace")
        _simulate(
            out, as_json, buckets, calibration, workload=workload, profile=profile, dataset_name=dataset_name,
            num_prompts=num_prompts, random_input_len=random_input_len, random_output_len=random_output_len,
            random_range_ratio=random_range_ratio, image_count=image_count, image_resolution=image_resolution,
            max_concurrency=max_concurrency, request_rate=request_rate, warmup_requests=warmup_requests, seed=seed,
            model_family=model_family, tokens_per_image=tokens_per_image, chat_template_tokens=chat_template_tokens,
            chunked_prefill_size=chunked_prefill_size, max_prefill_tokens=max_prefill_tokens,
            max_running_requests=max_running_requests, page_size=page_size, enable_mixed_chunk=enable_mixed_chunk,
            prefill_decode_interval=prefill_decode_interval, disable_radix_cache=disable_radix_cache, dp_size=dp_size,
        )
        return
    if not log:
        raise InputError("give --log FILE (an SGLang server log)", "bcgtune trace")
    trace = _trace_from_logs(log, mixed_chunk)
    _emit(trace, out, as_json)


def _trace_from_logs(paths: List[str], mixed_chunk: bool):
    from bcgtune.adapters.sglang_log import parse_logs
    from bcgtune.errors import InputError

    if sum(1 for p in paths if p == "-") > 1:
        raise InputError("stdin ('-') can be read once only", "--log")
    return parse_logs(list(paths), mixed_chunk=mixed_chunk)


def _emit(trace, out: Optional[str], as_json: bool) -> None:
    """Write the trace (if asked) and print the summary: human text or one JSON object on
    stdout; chatter on stderr."""
    import json

    from bcgtune.cli.render_trace import render_trace_text, trace_summary
    from bcgtune.core.trace import save_trace

    if out:
        save_trace(trace, out)
        typer.echo(f"wrote {out} ({trace.n_batches} batches, {trace.sizes.size} sizes)", err=True)
    if as_json:
        typer.echo(json.dumps(trace_summary(trace), separators=(",", ":")))
    else:
        typer.echo(render_trace_text(trace), nl=False)


def _simulate(out: Optional[str], as_json: bool, buckets: Optional[str], calibration: Optional[str], **options) -> None:
    """`trace --simulate`: options -> Workload (adapters/workload.py) -> one simulation ->
    the log trace's outputs plus image and replay shares."""
    import json

    from bcgtune.adapters.simulator import simulate, simulation_summary
    from bcgtune.adapters.workload import workload_from_options
    from bcgtune.cli.render_trace import trace_summary
    from bcgtune.core.replay import parse_bucket_list
    from bcgtune.core.trace import save_trace

    bucket_list = parse_bucket_list(buckets, "--buckets") if buckets else None
    wl = workload_from_options(**options)
    if calibration:
        from dataclasses import replace

        from bcgtune.core.calibration import load_calibration

        cal = load_calibration(calibration)

        def calibrated_eager_ms(n):
            return cal.eager_time(n)

        wl = replace(wl, step=replace(wl.step, prefill_curve=calibrated_eager_ms))
    trace = simulate(wl)
    extra = simulation_summary(trace, bucket_list)
    if out:
        save_trace(trace, out)
        typer.echo(f"wrote {out} ({trace.n_batches} batches, {trace.sizes.size} sizes)", err=True)
    if as_json:
        typer.echo(json.dumps({**trace_summary(trace), "simulation": extra}, separators=(",", ":")))
        return
    typer.echo(_render_simulation_text(trace, extra), nl=False)


def _render_simulation_text(trace, s: dict) -> str:
    # The log summary's source/graph-flag lines say nothing about a simulation: own header.
    p = [trace.percentile(q) for q in (50, 90, 99)]
    lines = [
        f"simulated workload  {s['workload'] or 'from options (bench_serving defaults otherwise)'}",
        f"prefill batches     {trace.n_batches:,}",
        f"distinct sizes      {trace.sizes.size:,}",
        f"forward tokens      {trace.n_tokens:,}",
        f"size p50/p90/p99/max  {p[0]} / {p[1]} / {p[2]} / {int(trace.sizes[-1])}",
    ]
    for r in s["replay"]:
        lines.append(
            f"  {r['list']}, {r['buckets']} buckets: image batches {100 * r['image_share']:.1f}%; "
            f"replay {100 * r['patched_replay_share']:.1f}% patched runner vs "
            f"{100 * r['unpatched_replay_share']:.1f}% unpatched (image batches eager)"
        )
    lines.append("  concurrency  prompts  batches  image  mean fwd  max fwd  decode steps  sim s")
    for lv in s["levels"]:
        conc = "inf" if lv["max_concurrency"] is None else str(lv["max_concurrency"])
        lines.append(
            f"  {conc:>11}  {lv['num_prompts']:>7}  {lv['batches']:>7}  {lv['image_batches']:>5}  "
            f"{lv['mean_forward_tokens'] if lv['mean_forward_tokens'] is not None else '-':>8}  "
            f"{lv['max_forward_tokens'] if lv['max_forward_tokens'] is not None else '-':>7}  "
            f"{lv['decode_steps']:>12}  {lv['duration_s']:>5.1f}"
        )
    return "\n".join(lines) + "\n"
