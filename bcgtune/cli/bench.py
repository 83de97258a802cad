"""`bcgtune bench`: interleaved A/B launches of profile variants, change vs the baseline with
an A/A noise band (adapters/bench.py, core/abstats.py)."""

from __future__ import annotations

from typing import List, Optional

import typer

from bcgtune.cli.app import app


@app.command("bench", context_settings={"allow_interspersed_args": False})
def bench_command(
    profile: str = typer.Option(..., "--profile", "-p", help="Built-in profile name or a .toml path."),
    arm: List[str] = typer.Option(
        ..., "--arm", help="NAME:VARIANT, repeatable, the first is the baseline. VARIANT: profile | disabled | default | list=256,512,..."
    ),
    order: Optional[str] = typer.Option(None, "--order", help="Launch order, letters A,X,Y,Z,W for the arms in --arm order, or arm names (default A,X,X,A; A,X,Y,Y,X,A for three arms)."),
    concurrency: Optional[str] = typer.Option(None, "--concurrency", help="Comma list (default 4,16,32,64,128)."),
    runs: int = typer.Option(2, "--runs", help="Measured runs per concurrency per launch."),
    prompts_per_concurrency: int = typer.Option(10, "--prompts-per-concurrency", help="Prompts per run = this x concurrency."),
    no_warmup: bool = typer.Option(False, "--no-warmup", help="Skip the warm-up pass of each launch."),
    workdir: Optional[str] = typer.Option(None, "--workdir", help="Folder for logs and bench.json (default ./bcgtune-bench-<profile>-<time>)."),
    as_json: bool = typer.Option(False, "--json", help="Print the result object as JSON."),
    plot_path: Optional[str] = typer.Option(None, "--plot", help="Write a PNG: change per concurrency with 2 SE error bars."),
    bench_args: Optional[List[str]] = typer.Argument(None, help="bench_serving arguments after `--` (dataset, lengths, tokenizer), passed unchanged.", metavar="[-- BENCH_ARGS...]"),
) -> None:
    """A/B benchmark of bucket lists on a live server, the seeds' method."""
    import json

    from bcgtune.adapters.bench import make_plan, plot, render_table, run_bench

    plan = make_plan(profile, arm, order, concurrency, runs, prompts_per_concurrency, list(bench_args or []), warmup=not no_warmup)
    result = run_bench(plan, workdir)
    if plot_path:
        plot(result, plot_path)
        typer.echo(f"wrote {plot_path}", err=True)
    if as_json:
        typer.echo(json.dumps(result, separators=(",", ":")))
    else:
        typer.echo(render_table(result), nl=False)
