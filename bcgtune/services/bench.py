"""`bcgtune bench`: interleaved A/B server launches with an A/A noise band, the method of the
Qwen multimodal breakable-prefill pull request, automated.

Arms are profile variants (live.parse_variant: NAME:profile | NAME:disabled | NAME:default |
NAME:list=...). Launches follow an interleaved order (default A,X,X,A for two arms and
A,X,Y,Y,X,A for three: letters A, X, Y, Z, W name the arms in the order given, arm names
work too); the first arm is the baseline. Each launch runs a warm-up pass (one client run at
the first concurrency, discarded), then `runs` measured client runs per concurrency with
prompts = prompts_per_concurrency x concurrency, `--request-rate inf --max-concurrency C`
(closed loop). The statistics (change vs the baseline, SE from A/A launches) are in
bcgtune/core/bench/abstats.py; the result type in bcgtune/core/bench/bench_result.py.

Everything a run produced lands in the work folder: one server log per launch, the client's
output, its result lines, and bench.json (rewritten atomically after every run, so an
interrupted bench keeps what it measured).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated

from pydantic import Field

from bcgtune.adapters.sglang.live import (
    Variant,
    apply_variant,
    build_launch,
    client_command,
    parse_variant,
    read_result_line,
    run_client,
    running_server,
    terminate_as_interrupt,
)
from bcgtune.core.bench.bench_result import BenchArm, BenchLaunch, BenchResult, BenchRun
from bcgtune.core.schema import REQUESTS_MAX, parse_int_list
from bcgtune.errors import ExternalError, InputError

LETTERS = "AXYZW"
_CONTROLLED = {"--max-concurrency", "--num-prompts", "--request-rate", "--output-file"}
DEFAULT_CONCURRENCY = (4, 16, 32, 64, 128)
# Launches one bench may make: each takes minutes (a server start), so more is a typo.
LAUNCHES_MAX = 100
# One concurrency level: at most as many requests in flight as a run may send.
_Concurrency = Annotated[int, Field(strict=True, ge=1, le=REQUESTS_MAX)]
# Client runs in one launch (concurrency levels x runs): each takes seconds to minutes.
RUNS_PER_LAUNCH_MAX = 10_000

Say = Callable[[str], None]


@dataclass
class BenchPlan:
    profile: str
    arms: list[Variant]
    order: list[str]  # arm names, one per launch
    concurrency: list[int]
    runs: int = 2
    prompts_per_concurrency: int = 10
    warmup: bool = True
    bench_args: list[str] = field(default_factory=list)


def default_order(n_arms: int) -> str:
    if n_arms == 1:
        return "A,A"
    if n_arms == 2:
        return "A,X,X,A"
    mid = LETTERS[1:n_arms]
    return ",".join(["A", *mid, *reversed(mid), "A"])


def parse_order(text: str, arms: Sequence[Variant]) -> list[str]:
    names = [a.name for a in arms]
    out = []
    toks = [t.strip() for t in text.split(",")]
    if len(toks) > LAUNCHES_MAX:
        raise InputError(f"{len(toks):,} launches in the order, at most {LAUNCHES_MAX}", "--order")
    for tok in toks:
        if not tok:
            raise InputError(f"empty entry in order {text!r}", "--order")
        if tok in names:
            out.append(tok)
        elif len(tok) == 1 and tok in LETTERS and LETTERS.index(tok) < len(arms):
            out.append(names[LETTERS.index(tok)])
        else:
            letters = ", ".join(f"{LETTERS[i]}={n}" for i, n in enumerate(names[: len(LETTERS)]))
            raise InputError(f"order entry {tok!r} names no arm ({letters})", "--order")
    missing = [n for n in names if n not in out]
    if missing:
        raise InputError(f"arm {missing[0]!r} is never launched in order {text!r}", "--order")
    return out


def plan_bench(
    profile: str,
    arms: Sequence[str],
    order: str | None,
    concurrency: str | None,
    runs: int,
    prompts_per_concurrency: int,
    bench_args: Sequence[str],
    warmup: bool = True,
) -> BenchPlan:
    """The plan from the command's values: arms, launch order, concurrency levels (None: the
    default sweep; an empty list or an empty item is refused)."""
    if len(arms) < 2:
        raise InputError("give at least two --arm (the first is the baseline)", "--arm")
    variants = [parse_variant(a) for a in arms]
    names = [v.name for v in variants]
    if len(set(names)) != len(names):
        raise InputError("arm names must differ", "--arm")
    if runs < 1:
        raise InputError("runs must be >= 1", "--runs")
    if prompts_per_concurrency < 1:
        raise InputError("prompts per concurrency must be >= 1", "--prompts-per-concurrency")
    for a in bench_args:
        if a.split("=", 1)[0] in _CONTROLLED:
            raise InputError(
                f"{a.split('=', 1)[0]} is set by bench per run; leave it out of the bench_serving args", "bench args"
            )
    seq = parse_order(order if order is not None else default_order(len(variants)), variants)
    concs = (
        parse_int_list(concurrency, "--concurrency", item=_Concurrency, empty_items=False, max_items=RUNS_PER_LAUNCH_MAX)
        if concurrency is not None
        else list(DEFAULT_CONCURRENCY)
    )
    if len(concs) * runs > RUNS_PER_LAUNCH_MAX:
        raise InputError(
            f"{len(concs):,} concurrency levels x {runs:,} runs is {len(concs) * runs:,} client runs a launch, "
            f"at most {RUNS_PER_LAUNCH_MAX:,}",
            "--runs",
        )
    if max(concs) * prompts_per_concurrency > REQUESTS_MAX:
        raise InputError(
            f"concurrency {max(concs):,} x {prompts_per_concurrency:,} prompts is more than {REQUESTS_MAX:,} prompts a run",
            "--prompts-per-concurrency",
        )
    return BenchPlan(profile, variants, seq, concs, runs, prompts_per_concurrency, warmup, list(bench_args))


def _run_args(plan: BenchPlan, c: int) -> list[str]:
    return [
        *plan.bench_args,
        "--max-concurrency",
        str(c),
        "--num-prompts",
        str(plan.prompts_per_concurrency * c),
        "--request-rate",
        "inf",
    ]


def _steps(plan: BenchPlan) -> list[tuple[int, int]]:
    """(concurrency, run) of one launch in order; run -1 is the warm-up."""
    steps = [(plan.concurrency[0], -1)] if plan.warmup else []
    return steps + [(c, r) for c in plan.concurrency for r in range(plan.runs)]


def run_bench(
    plan: BenchPlan, workdir: str | os.PathLike[str] | None = None, health_timeout: float = 1800.0, say: Say | None = None
) -> BenchResult:
    """Run every launch of the plan; return the result (also written to <workdir>/bench.json
    after every run). `say`: progress callback (one line each)."""

    def note(msg: str) -> None:
        if say is not None:
            say(msg)

    from bcgtune.fileio import atomic_write_json, sha256_file
    from bcgtune.files.profile_file import load_profile, resolve_profile_path

    profile = load_profile(plan.profile)
    ppath = resolve_profile_path(plan.profile)
    folder = Path(workdir) if workdir else Path.cwd() / f"bcgtune-bench-{profile.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    folder.mkdir(parents=True, exist_ok=True)
    variants = {v.name: v for v in plan.arms}
    result = BenchResult.start(
        profile=profile.name,
        profile_path=str(ppath),
        profile_sha256=sha256_file(str(ppath)),
        arms=[BenchArm(name=v.name, variant=v.kind, buckets=v.buckets) for v in plan.arms],
        order=plan.order,
        concurrency=plan.concurrency,
        runs=plan.runs,
        prompts_per_concurrency=plan.prompts_per_concurrency,
        warmup=plan.warmup,
        bench_args=plan.bench_args,
        workdir=str(folder),
    )
    out_json = folder / "bench.json"
    total = len(plan.order)
    with terminate_as_interrupt():
        for i, arm in enumerate(plan.order):
            tag = f"{i + 1:02d}-{arm}"
            launch = build_launch(apply_variant(profile, variants[arm]), folder / f"{tag}.server.log")
            entry = BenchLaunch(
                index=i, arm=arm, launch_command=launch.argv, launch_env=launch.env, server_log=str(launch.log_path)
            )
            result.launches.append(entry)
            with running_server(launch, label=f"launch {i + 1}/{total} ({arm})", timeout=health_timeout, say=say) as server:
                for c, r in _steps(plan):
                    what = "warm-up" if r < 0 else f"run {r + 1}/{plan.runs}"
                    note(f"launch {i + 1}/{total} ({arm}): concurrency {c}, {what}")
                    name = f"{tag}.c{c}.{'warmup' if r < 0 else f'r{r + 1}'}"
                    res_file = folder / f"{name}.jsonl"
                    argv = client_command(_run_args(plan, c), launch.base_url, res_file)
                    run_client(argv, server=server, launch=launch, log_path=folder / f"{name}.client.log", echo=False)
                    if r < 0:
                        continue
                    line = read_result_line(res_file, folder / f"{name}.client.log")
                    if not line.get("completed"):
                        raise ExternalError(f"benchmark run completed no request (concurrency {c})", str(res_file))
                    entry.runs.append(BenchRun.from_result_line(c, r + 1, line))
                    result.compare()
                    atomic_write_json(out_json, result.to_json())
    result.complete = True
    result.compare()
    atomic_write_json(out_json, result.to_json())
    return result
