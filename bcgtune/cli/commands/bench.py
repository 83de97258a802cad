"""`bcgtune bench`: interleaved A/B launches of profile variants, change vs the baseline with
an A/A noise band (bcgtune/services/bench.py, bcgtune/core/bench/abstats.py)."""

from __future__ import annotations

from typing import Annotated, List, Optional

import typer

from bcgtune.cli import guard
from bcgtune.cli.console import emit, note
from bcgtune.cli.help import examples
from bcgtune.cli.options import JsonFlag, ProfileRef, Quiet, Workdir


@examples(
    "bcgtune bench --profile mi355x --arm base:disabled --arm tuned:profile \\",
    "    --arm ladder:default -- --dataset-name image --random-input-len 1024 \\",
    "    --random-output-len 128",
)
def bench_command(
    profile: ProfileRef,
    arm: Annotated[
        List[str],
        typer.Option(
            "--arm",
            help="NAME:VARIANT, repeatable; the first is the baseline. VARIANT: profile (its list) | disabled (graphs off) | "
            "default (SGLang's ladder) | list=256,512,...",
        ),
    ],
    order: Annotated[
        Optional[str],
        typer.Option(
            "--order",
            help="Launch order: letters A,X,Y,Z,W for the arms in --arm order, or arm names. Default A,X,X,A; A,X,Y,Y,X,A "
            "for three arms.",
            show_default=False,
        ),
    ] = None,
    concurrency: Annotated[
        Optional[str],
        typer.Option("--concurrency", help="Comma list of concurrency levels. Default 4,16,32,64,128.", show_default=False),
    ] = None,
    runs: Annotated[int, typer.Option("--runs", min=1, max=1000, help="Measured runs per concurrency per launch.")] = 2,
    prompts_per_concurrency: Annotated[
        int, typer.Option("--prompts-per-concurrency", min=1, max=100000, help="Prompts per run = this x concurrency.")
    ] = 10,
    no_warmup: Annotated[bool, typer.Option("--no-warmup", help="Skip the warm-up pass of each launch.")] = False,
    workdir: Workdir = None,
    plot_path: Annotated[
        Optional[str],
        typer.Option(
            "--plot", help="Write a PNG: change per concurrency with 2 SE error bars (needs bcgtune[plot]).", show_default=False
        ),
    ] = None,
    bench_args: Annotated[
        Optional[List[str]],
        typer.Argument(
            help="bench_serving arguments after `--` (dataset, lengths, tokenizer), passed unchanged.",
            metavar="[-- BENCH_ARGS...]",
            show_default=False,
        ),
    ] = None,
    as_json: JsonFlag = False,
    quiet: Quiet = False,
) -> None:
    """A/B benchmark of bucket lists on a live server, change beyond A/A noise.

    Interleaved launches; the change against the baseline arm comes with a standard error
    estimated from baseline-vs-baseline launches.
    """
    import os

    from bcgtune.cli.render.bench import plot, render_table
    from bcgtune.services.bench import plan_bench, run_bench

    guard.outputs({"--plot": plot_path}, inputs=[profile] if os.path.exists(profile) else [])
    if plot_path:
        guard.needs("matplotlib", "plot", "--plot")
    if workdir is not None:
        guard.workdir(workdir)
    plan = plan_bench(
        profile, arm, order, concurrency, runs, prompts_per_concurrency, list(bench_args or []), warmup=not no_warmup
    )
    result = run_bench(plan, workdir, say=None if quiet else (lambda m: note(f"bcgtune: {m}")))
    if plot_path:
        plot(result, plot_path)
        note(f"wrote {plot_path}", quiet)
    emit(result.to_json, lambda: render_table(result), as_json=as_json)
