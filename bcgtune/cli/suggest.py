"""`bcgtune suggest-buckets`: the optimal bucket list for a trace, beside the alternatives."""

from __future__ import annotations

from typing import List, Optional

import typer

from bcgtune.cli.app import app


@app.command("suggest-buckets")
def suggest_buckets(
    trace_path: Optional[str] = typer.Argument(
        None,
        metavar="[TRACE]",
        help="JSON trace, size,count CSV or one size per line. Default: simulate the built-in workload (the seeds' benchmark).",
    ),
    max_buckets: int = typer.Option(12, "--max-buckets", "-k", help="At most this many buckets (graphs)."),
    align: Optional[int] = typer.Option(None, "--align", help="Buckets are multiples of this (default: from the layout flags, else 1)."),
    max_bucket: Optional[int] = typer.Option(None, "--max-bucket", help="No bucket above this many tokens."),
    factor: float = typer.Option(2.0, "--padding-factor", help="Replay iff bucket <= factor * tokens (SGLang: 2)."),
    compare: Optional[List[str]] = typer.Option(None, "--compare", help='A list to compare, e.g. "256 512 1024"; optional "name=" prefix. Repeatable.'),
    chunked_prefill_size: Optional[int] = typer.Option(None, "--chunked-prefill-size", help="Max of SGLang's default ladder (default: covers the trace)."),
    objective: str = typer.Option("padding", "--objective", help="padding (fewest eager batches, then fewest padded tokens) or time (needs --calibration)."),
    calibration: Optional[str] = typer.Option(None, "--calibration", help="Calibration JSON from `bcgtune calibrate`, or CSV tokens,eager_ms,graph_ms."),
    max_graph_mem: Optional[float] = typer.Option(None, "--max-graph-mem", help="GiB budget for all graphs (time objective)."),
    candidates: str = typer.Option("auto", "--candidates", help="Time objective's buckets: trace (any size, interpolated replay time), calibration (only measured sizes, at their measured time), auto (calibration if it was measured on a bucket grid, `calibrate --grid`)."),
    tp: int = typer.Option(1, "--tp", "--tp-size", help="Layout: tensor parallel size (alignment)."),
    dp: int = typer.Option(1, "--dp", "--dp-size", help="Layout: data parallel size (alignment with --dp-attention)."),
    dp_attention: bool = typer.Option(False, "--dp-attention", "--enable-dp-attention", help="Layout: DP attention (buckets align to attn TP size)."),
    two_batch_overlap: bool = typer.Option(False, "--two-batch-overlap", "--enable-two-batch-overlap", help="Layout: two-batch overlap (x2)."),
    moe_a2a_backend: str = typer.Option("none", "--moe-a2a-backend", help="Layout: MoE all-to-all backend (not none: align to attn TP size)."),
    moe_dense_tp_size: Optional[int] = typer.Option(None, "--moe-dense-tp-size", help="Layout: set => align to attn TP size."),
    attn_cp_size: int = typer.Option(1, "--attn-cp-size", help="Layout: attention context parallel size (CUDA only)."),
    no_baselines: bool = typer.Option(False, "--no-baselines", help="Skip the KMeans and quantile rows."),
    json_out: bool = typer.Option(False, "--json", help="Print one JSON object (recommended.buckets is the list)."),
    plot: Optional[str] = typer.Option(None, "--plot", help="Write a PNG: size histogram with bucket lines, waste vs K."),
    write_profile: Optional[str] = typer.Option(None, "--write-profile", help="Write the list into this profile's \\[buckets] (atomic; created if missing)."),
    base_profile: Optional[str] = typer.Option(None, "--base-profile", help="Profile (path or built-in name) to create --write-profile from."),
    seed: int = typer.Option(0, "--seed", help="Seed for KMeans; for the default simulation, 0 keeps the workload's own seed."),
) -> None:
    """The optimal bucket list for a trace, compared with SGLang's default ladder and yours."""
    import json

    from bcgtune.cli.render_plan import render_plan_text
    from bcgtune.core.ladder import ParallelLayout, layout_alignment
    from bcgtune.core.plan import SEEDS_HAND_LIST, PlanRequest, make_plan
    from bcgtune.core.replay import parse_bucket_list
    from bcgtune.errors import InputError

    if align is None:
        align = layout_alignment(
            ParallelLayout(
                tp=tp,
                dp=dp,
                enable_dp_attention=dp_attention,
                two_batch_overlap=two_batch_overlap,
                moe_a2a_backend=moe_a2a_backend,
                moe_dense_tp_size=moe_dense_tp_size,
                attn_cp_size=attn_cp_size,
            )
        )
    compares: list[tuple[str, list[int]]] = []
    for i, text in enumerate(compare or [], start=1):
        name, _, lst = text.rpartition("=")
        compares.append((name.strip() or f"--compare #{i}", parse_bucket_list(lst, f"--compare {text!r}")))

    if trace_path is None:
        trace = _default_trace(seed)
        if not any(lst == SEEDS_HAND_LIST for _, lst in compares):
            compares.insert(0, ("seeds' hand list", list(SEEDS_HAND_LIST)))
    else:
        from bcgtune.core.trace import load_trace

        trace = load_trace(trace_path)

    cal = None
    if calibration is not None:
        from bcgtune.core.calibration import load_calibration

        cal = load_calibration(calibration)
    elif objective == "time":
        raise InputError("--objective time needs --calibration FILE")
    if factor < 1:
        raise InputError(f"--padding-factor must be >= 1, got {factor}")

    plan = make_plan(
        trace,
        PlanRequest(
            max_buckets=max_buckets,
            align=align,
            max_bucket=max_bucket,
            factor=factor,
            objective=objective,
            chunked_prefill_size=chunked_prefill_size,
            compare=compares,
            calibration=cal,
            max_graph_mem_gib=max_graph_mem,
            candidates=candidates,
            baselines=not no_baselines,
            seed=seed,
        ),
    )
    if plot:
        from bcgtune.cli.render_plan import plot_plan

        plot_plan(trace, plan, plot)
    if write_profile:
        _write_profile(write_profile, base_profile, plan, trace)
    if json_out:
        typer.echo(json.dumps(plan.to_json_obj()))
    else:
        typer.echo(render_plan_text(plan))
    if plot:
        typer.echo(f"plot written to {plot}", err=True)


def _default_trace(seed: int):
    """The main job's embedded default: the seeds' benchmark, simulated."""
    from dataclasses import replace

    from bcgtune.adapters.simulator import simulate
    from bcgtune.adapters.workload import default_workload

    wl = default_workload()
    return simulate(replace(wl, seed=seed) if seed else wl)


def _write_profile(path: str, base: str | None, plan, trace) -> None:
    import datetime as dt

    from bcgtune import __version__
    from bcgtune.adapters.profiles import write_profile_buckets

    sha = next((s.get("sha256") for s in trace.sources if s.get("sha256")), None)
    provenance = {
        "trace_sha256": sha or "",
        "objective": plan.params["objective"],
        "max_buckets": plan.params["max_buckets"],
        "tool_version": __version__,
        "date": dt.date.today().isoformat(),
    }
    write_profile_buckets(path, plan.recommended["buckets"], provenance, base_profile=base)
    typer.echo(f"wrote {len(plan.recommended['buckets'])} buckets to {path}", err=True)
