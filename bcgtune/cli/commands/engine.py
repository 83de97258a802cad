"""`bcgtune capture`, `validate` and `calibrate`: prefill graphs on a GPU through torch (CUDA,
or ROCm through the same torch.cuda API). torch and the engine are imported inside the
commands, after a check that torch is installed at all."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from bcgtune.cli import guard
from bcgtune.cli.console import emit, note
from bcgtune.cli.help import examples
from bcgtune.cli.options import AccuracyOptions, EngineOptions, JsonFlag, Quiet, measure_option, options
from bcgtune.core.sglang.constants import DEFAULT_PADDING_FACTOR
from bcgtune.engines.choices import Fault
from bcgtune.engines.preflight import require_torch
from bcgtune.errors import CheckFailed, InputError

if TYPE_CHECKING:
    from bcgtune.engines.spec import EngineSpec

_BUCKETS = "Buckets"

Buckets = Annotated[
    Optional[str],
    typer.Option(
        "--buckets", help="Token buckets, e.g. '256,512,1024' or '256 512 1024'.", rich_help_panel=_BUCKETS, show_default=False
    ),
]
ProfileBuckets = Annotated[
    Optional[str],
    typer.Option(
        "--profile",
        "-p",
        help="Take the buckets from a profile's [buckets].list (built-in name or .toml).",
        rich_help_panel=_BUCKETS,
        show_default=False,
    ),
]
ReportOut = Annotated[
    Optional[str], typer.Option("-o", "--out", help="Also write the report JSON here (atomic).", show_default=False)
]


def _bucket_list(buckets: Optional[str], profile: Optional[str], quiet: bool = False) -> list[int]:
    """--buckets, or the buckets the --profile's launch captures (its list as SGLang aligns and
    filters it, or SGLang's ladder when it names none; a launch SGLang refuses is exit 2)."""
    from bcgtune.core.sglang.replay import parse_bucket_list

    if buckets is not None and profile is not None:
        raise InputError("give --buckets or --profile, not both")
    if buckets is not None:
        return parse_bucket_list(buckets, "--buckets")
    if profile is not None:
        from bcgtune.cli.render.launch import capture_line
        from bcgtune.files.profile_file import load_profile
        from bcgtune.services.launch import profile_captured_list

        prof = load_profile(profile)
        captured, capture = profile_captured_list(prof)
        note(capture_line(capture), quiet)
        if prof.buckets and sorted(set(prof.buckets)) != captured:
            note(f"note: the profile lists {sorted(set(prof.buckets))}; its launch captures {captured}", quiet)
        return captured
    raise InputError("give --buckets LIST or --profile P")


def _profile_chunk(profile: Optional[str]) -> int | None:
    """The chunked-prefill size a profile's [server] sets (a positive value), else None."""
    if profile is None:
        return None
    from bcgtune.files.profile_file import load_profile

    value = load_profile(profile).server.get("chunked_prefill_size")
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _spec(engine: EngineOptions, profile: Optional[str] = None) -> EngineSpec:
    """The engine the options describe; with --profile, the profile's chunked-prefill size
    is the buckets' ceiling unless --chunked-prefill-size is given."""
    from bcgtune.engines.spec import EngineSpec

    chunk = engine.chunked_prefill_size if engine.chunked_prefill_size is not None else _profile_chunk(profile)
    return EngineSpec(
        model=engine.model,
        device=engine.device,
        dtype=engine.dtype.value,
        sdpa_backend=engine.sdpa_backend.value,
        seed=engine.seed,
        hf_attention=engine.hf_attention.value,
        random_weights=engine.random_weights,
        runner=engine.runner.value,
        chunked_prefill_size=chunk,
        graph_impl=engine.graph_impl.value,
        sim_calibration=engine.sim_calibration,
    )


@examples("bcgtune capture --buckets '256 512 1024 2048' --model qwen3-0.6b -o cap.json")
@options("engine", EngineOptions)
def capture_command(
    buckets: Buckets = None,
    profile: ProfileBuckets = None,
    warmup: Annotated[
        Optional[int],
        typer.Option(
            "--warmup",
            min=0,
            max=1000,
            help="Eager warm-up runs before each capture. Default: 2 on the breakable runner (as SGLang), 1 on full. "
            "Without a GPU the breakable runner runs each bucket's segments once instead.",
            show_default=False,
        ),
    ] = None,
    out_path: ReportOut = None,
    as_json: JsonFlag = False,
    quiet: Quiet = False,
    engine: EngineOptions = None,  # type: ignore[assignment]
) -> None:
    """Capture one prefill graph per bucket on the GPU: seconds, memory, errors.

    Largest bucket first, one shared memory pool, as SGLang captures them.
    """
    guard.outputs({"-o": out_path}, inputs=[profile] if profile else [])
    bl = _bucket_list(buckets, profile, quiet)
    require_torch(engine.device)
    from bcgtune.cli.render.engine import format_capture, text
    from bcgtune.services import capture

    progress = None if quiet else (lambda r: note(f"  bucket {r.bucket}: {'done' if r.ok else r.error}"))
    rep = capture.run_capture(bl, _spec(engine, profile), warmup=warmup, progress=progress)
    emit(rep.to_json, lambda: text(format_capture(rep)), as_json=as_json, out_path=out_path, quiet=quiet)
    if rep.failed:
        raise CheckFailed(f"{rep.failed} of {len(rep.buckets)} captures failed")


@examples(
    "bcgtune validate --buckets '256 512 1024' --model qwen3-0.6b",
    "bcgtune validate --buckets '512 1024' --model qwen3-vl-8b \\",
    "    --inject-fault drop-deepstack   # a negative control: must fail",
    "bcgtune validate --server --profile h200   # a live server, graphs on vs off",
)
@options("accuracy", AccuracyOptions)
@options("engine", EngineOptions)
def validate_command(
    buckets: Buckets = None,
    profile: ProfileBuckets = None,
    sizes_per_bucket: Annotated[
        int,
        typer.Option(
            "--sizes-per-bucket",
            min=1,
            max=1000,
            help="Sizes checked per bucket among those that replay in it (the ends included).",
        ),
    ] = 3,
    requests: Annotated[
        str,
        typer.Option(
            "--requests",
            help="Request counts each size is checked with: a batch of n tokens from r requests (the full runner checks 1).",
        ),
    ] = "1,4",
    images: Annotated[
        Optional[bool],
        typer.Option(
            "--images/--no-images",
            help="Also sweep image inputs (then a text batch after an image in each bucket). Default: on for VL models.",
            show_default=False,
        ),
    ] = None,
    inject_fault: Annotated[
        Optional[Fault],
        typer.Option(
            "--inject-fault",
            help="A negative control: replay with one side input broken on purpose, to see validation fail naming it "
            "(exit 1). drop-deepstack: no DeepStack slot, so replay ignores the per-layer visual embeddings (SGLang's "
            "breakable runner before its fix); stale-deepstack: the slot is filled but never zeroed, so a text batch "
            "replays a previous image's. Needs a model with DeepStack (qwen3-vl-tiny, qwen3-vl-8b).",
            show_default=False,
        ),
    ] = None,
    server: Annotated[
        bool,
        typer.Option(
            "--server",
            help="Validate a live SGLang server launched from --profile (graphs on vs off) instead of the torch engine.",
            rich_help_panel="Live server (--server)",
        ),
    ] = False,
    prompts: Annotated[
        Optional[str],
        typer.Option(
            "--prompts",
            help="With --server: a prompts file (JSON lines {text, image?} or one prompt per line).",
            rich_help_panel="Live server (--server)",
            show_default=False,
        ),
    ] = None,
    min_replay_share: Annotated[
        Optional[float],
        typer.Option(
            "--min-replay-share",
            min=0.0,
            max=1.0,
            help="With --server: least share of the batches a captured bucket serves that must replay (default 0.9).",
            rich_help_panel="Live server (--server)",
            show_default=False,
        ),
    ] = None,
    workdir: Annotated[
        Optional[str],
        typer.Option(
            "--workdir",
            help="With --server: folder for both servers' logs and the report (default: a new "
            "./bcgtune-validate-<profile>-<time>).",
            rich_help_panel="Live server (--server)",
            show_default=False,
        ),
    ] = None,
    out_path: ReportOut = None,
    as_json: JsonFlag = False,
    quiet: Quiet = False,
    engine: EngineOptions = None,  # type: ignore[assignment]
    accuracy: AccuracyOptions = None,  # type: ignore[assignment]
) -> None:
    """Check padded graph replay against eager, bucket by bucket. Exit 1 on a failure.

    Every batch also lists its side inputs (input embeddings, positions, DeepStack) with
    whether replay read them; VL models add image batches and, in each bucket, a text batch
    right after an image batch. --inject-fault breaks one side input on purpose: the run
    must fail naming it.
    """
    guard.outputs({"-o": out_path}, inputs=[p for p in (profile, prompts) if p])
    if workdir is not None:
        guard.workdir(workdir)
    if server and inject_fault is not None:
        raise InputError("--inject-fault applies to the torch engine, not --server")
    if server:
        _validate_server(profile, prompts, min_replay_share, workdir, out_path, as_json, quiet, accuracy)
        return
    if prompts is not None or min_replay_share is not None or workdir is not None:
        raise InputError("--prompts, --min-replay-share and --workdir apply with --server only")
    from bcgtune.core.sglang.replay import parse_bucket_list

    bl = _bucket_list(buckets, profile, quiet)
    request_counts = parse_bucket_list(requests, "--requests")
    require_torch(engine.device)
    from bcgtune.cli.render.engine import format_validation, text
    from bcgtune.services import validate

    progress = None if quiet else (lambda e: note(f"  bucket {e.bucket}: {'ok' if e.ok else 'FAIL'}"))
    spec = _spec(engine, profile)
    if inject_fault is not None:
        spec = dataclasses.replace(spec, fault=inject_fault.value)
    rep = validate.run_validate(
        bl,
        spec,
        sizes_per_bucket=sizes_per_bucket,
        requests=request_counts,
        gap_threshold=accuracy.gap_threshold,
        max_logprob_delta=accuracy.max_logprob_delta,
        images=images,
        progress=progress,
    )
    emit(rep.to_json, lambda: text(format_validation(rep)), as_json=as_json, out_path=out_path, quiet=quiet)
    if not rep.ok:
        raise CheckFailed("validation failed: " + "; ".join(rep.problems()))


def _validate_server(profile, prompts, min_replay_share, workdir, out_path, as_json, quiet, accuracy) -> None:
    from bcgtune.cli.render.server_validation import render_server_validation
    from bcgtune.services.server_validation import server_validation

    if not profile:
        raise InputError("--server needs --profile P (the launch to validate)")
    rep = server_validation(
        profile,
        prompts=prompts,
        min_replay_share=min_replay_share,
        gap_threshold=accuracy.gap_threshold,
        delta_tol=accuracy.max_logprob_delta,
        workdir=workdir,
        say=None if quiet else note,
    )
    emit(rep.to_json, lambda: render_server_validation(rep), as_json=as_json, out_path=out_path, quiet=quiet)
    if not rep.ok:
        raise CheckFailed("server validation failed: " + "; ".join(rep.failures or ["see the report"]))


@examples("bcgtune calibrate --sizes-from trace.json --grid 64 --model qwen3-0.6b \\", "    -o cal.json")
@options("engine", EngineOptions)
def calibrate_command(
    ctx: typer.Context,
    out_path: Annotated[
        Optional[str],
        typer.Option(
            "-o",
            "--out",
            help="Calibration file to write: versioned JSON, or CSV when the name ends in .csv. "
            "With --extend: default the calibration itself (in place).",
            show_default=False,
        ),
    ] = None,
    extend: Annotated[
        Optional[str],
        typer.Option(
            "--extend",
            help="Measure --sizes into this calibration (format 3) with its own engine, warm-up and rounds, a few of "
            "its rows timed again to put the new ones on its scale; written in place (atomic) unless -o is given. "
            "suggest-buckets prints this command for the sizes it wants measured.",
            show_default=False,
        ),
    ] = None,
    sizes: Annotated[
        Optional[str],
        typer.Option(
            "--sizes",
            help="Token sizes to measure. Default: 15 sizes from 16 to 8192. With --grid or --sizes-from: measured as well "
            "as the grid (the bucket list you run now, say, so suggest-buckets prices it at measured times).",
            show_default=False,
        ),
    ] = None,
    max_tokens: Annotated[
        Optional[int], typer.Option("--max-tokens", min=1, max=2**31 - 1, help="Drop sizes above this.", show_default=False)
    ] = None,
    grid: Annotated[
        Optional[int],
        typer.Option(
            "--grid",
            min=1,
            max=2**31 - 1,
            help="Measure every multiple of this (a bucket grid: suggest-buckets then picks buckets among the measured "
            "sizes), up to --max-tokens (default 8192) or the trace's range.",
            show_default=False,
        ),
    ] = None,
    sizes_from: Annotated[
        Optional[str],
        typer.Option(
            "--sizes-from",
            help="A trace: measure the grid (default --grid 64) over the sizes its batches can replay in, plus its smallest "
            "and largest size.",
            show_default=False,
        ),
    ] = None,
    padding_factor: Annotated[
        float,
        typer.Option(
            "--padding-factor",
            min=1.0,
            max=1e6,
            help="With --sizes-from: replay iff bucket <= factor x tokens (SGLang's rule: 2).",
        ),
    ] = DEFAULT_PADDING_FACTOR,
    # the measurement options, declared once with tune's (cli.options.measure_option)
    warmup: Annotated[Optional[int], measure_option("warmup")] = None,
    repeats: Annotated[Optional[int], measure_option("repeats")] = None,
    memory: Annotated[bool, measure_option("memory")] = True,
    mix_every: Annotated[int, measure_option("mix_every", lead="Breakable runner, with --sizes-from: ")] = 1,
    model_check: Annotated[
        bool,
        typer.Option(
            "--model-check/--no-model-check",
            help="With --sizes-from: after timing the sizes, replay a sample of the trace's batches in trace order under "
            "SGLang's ladder and the time optimum, and store how far measured lies from predicted; every interval "
            "suggest-buckets prints then covers that model error.",
        ),
    ] = True,
    check_batches: Annotated[Optional[int], measure_option("check_batches")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the calibration JSON on stdout too.")] = False,
    quiet: Quiet = False,
    engine: EngineOptions = None,  # type: ignore[assignment]
) -> None:
    """Measure eager time, replay time and graph memory: a calibration for the time objective.

    On the breakable runner: segment replay time per bucket, and eager and break (attention)
    time per batch of the trace's (tokens, requests) mix; on full: eager and replay time per
    size. The calibration feeds `suggest-buckets --objective time --calibration FILE`.
    """
    if extend is not None:
        _extend(ctx, extend, out_path, sizes, engine, as_json, quiet)
        return
    if out_path is None:
        raise InputError("give -o FILE (the calibration to write), or --extend CAL to add sizes to one", "-o")
    guard.outputs({"-o": out_path}, inputs=[sizes_from] if sizes_from else [])
    _refuse_csv_for_breakable(out_path, engine.runner.value)
    from bcgtune.cli.render.engine import format_calibration, text
    from bcgtune.core.sglang.replay import parse_bucket_list
    from bcgtune.services import calibrate

    if sizes_from is None and (_given(ctx, "check_batches") or (_given(ctx, "model_check") and model_check)):
        raise InputError("the model check replays a trace's batches: give --sizes-from TRACE", "--model-check")
    plan = calibrate.calibration_sizes(
        None if sizes is None else parse_bucket_list(sizes, "--sizes"), max_tokens, grid, sizes_from, padding_factor, mix_every
    )
    require_torch(engine.device)
    from bcgtune.files.calibration_file import save_calibration

    say = None if quiet else (lambda m: note("  " + m))
    result = calibrate.calibrate(
        plan,
        _spec(engine),
        warmup=warmup,
        repeats=repeats,
        memory=memory,
        progress=say,
        model_check=model_check,
        check_batches=check_batches,
    )
    save_calibration(result.calibration, out_path)
    note(f"wrote {out_path}", quiet)
    emit(result.to_json, lambda: text(format_calibration(result.calibration)), as_json=as_json)


def _refuse_csv_for_breakable(out_path: str, runner: str) -> None:
    """Before any measuring: a breakable-runner calibration has no CSV form
    (files.calibration_file.save_calibration)."""
    if runner != "full" and out_path.lower().removesuffix(".gz").endswith(".csv"):
        raise InputError(
            f"a {runner}-runner calibration is written as JSON only (its per-batch table does not fit "
            "tokens,eager_ms,graph_ms): name a .json file, or use --runner full",
            f"-o {out_path}",
        )


# What a new calibration measures, chosen by options that do not apply to an extension.
_NOT_WITH_EXTEND = {
    "grid": "--grid",
    "sizes_from": "--sizes-from",
    "max_tokens": "--max-tokens",
    "padding_factor": "--padding-factor",
    "warmup": "--warmup",
    "repeats": "--repeats",
    "memory": "--memory/--no-memory",
    "mix_every": "--mix-every",
    "model_check": "--model-check/--no-model-check",
    "check_batches": "--check-batches",
}


def _given(ctx: typer.Context, param: str) -> bool:
    """Whether the user gave this parameter on the command line (not its default)."""
    source = ctx.get_parameter_source(param)
    return source is not None and source.name not in ("DEFAULT", "DEFAULT_MAP")


def _extend(
    ctx: typer.Context, cal_path: str, out_path: str | None, sizes: str | None, engine: EngineOptions, as_json, quiet
) -> None:
    """`calibrate --extend CAL --sizes LIST`: the sizes measured into CAL with its own engine
    and rounds, written in place (or to -o). Options that choose what a new calibration
    measures do not apply, and engine options that differ from the recorded engine are
    refused rather than ignored."""
    from bcgtune.cli.render.engine import format_calibration, text
    from bcgtune.core.sglang.replay import parse_bucket_list
    from bcgtune.services import calibrate

    for param, flag in _NOT_WITH_EXTEND.items():
        if _given(ctx, param):
            raise InputError("does not apply with --extend (the calibration's own settings are used)", flag)
    if not sizes:
        raise InputError("--extend needs --sizes LIST (the sizes to measure into the calibration)", "--sizes")
    target = out_path or cal_path
    guard.outputs({"-o": target}, inputs=[cal_path] if out_path else [], in_place=[] if out_path else [cal_path])
    wanted = parse_bucket_list(sizes, "--sizes")
    if target.lower().removesuffix(".gz").endswith(".csv"):
        from bcgtune.files.calibration_file import load_calibration

        _refuse_csv_for_breakable(target, load_calibration(cal_path).runner)
    require_torch(engine.device)
    from bcgtune.files.calibration_file import save_calibration

    asked = _spec(engine)

    def check(recorded: EngineSpec) -> None:
        for name, flag in _SPEC_FLAGS.items():
            value = getattr(asked, name)
            if _given(ctx, f"engine__{name}") and value != getattr(recorded, name):
                raise InputError(
                    f"differs from the calibration's engine ({getattr(recorded, name)!r}): an extension measures with it", flag
                )

    say = None if quiet else (lambda m: note("  " + m))
    result = calibrate.extend(cal_path, wanted, progress=say, spec_check=check)
    save_calibration(result.calibration, target)
    scale = "" if result.scale_graph is None else f", scaled by {result.scale_graph:.4f} to its first run's times"
    note(f"added {len(result.added)} sizes to {target} ({len(result.anchors)} rows timed again{scale})", quiet)
    emit(result.to_json, lambda: text(format_calibration(result.calibration)), as_json=as_json)


_SPEC_FLAGS = {
    "model": "--model",
    "device": "--device",
    "dtype": "--dtype",
    "sdpa_backend": "--sdpa-backend",
    "seed": "--seed",
    "random_weights": "--random-weights",
    "runner": "--runner",
    "chunked_prefill_size": "--chunked-prefill-size",
    "graph_impl": "--graph-impl",
    "hf_attention": "--hf-attention",
    "sim_calibration": "--sim-calibration",
}
