"""Option sets shared by several commands, declared once.

An option set is a dataclass whose fields are `Annotated[type, typer.Option(...)]` with a
default; `@options("name", Cls)` on a command adds those options to it and hands the command
one `Cls` instance in its parameter `name`. Single shared options are Annotated aliases.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import math
import typing
from dataclasses import dataclass
from typing import Annotated, Any, Callable, Optional

import typer

from bcgtune.adapters.sglang.layout_flags import LAYOUT_FLAGS
from bcgtune.cli.schema_options import OptionSpec, option_set
from bcgtune.core.bench.accuracy import GAP_THRESHOLD, MAX_LOGPROB_DELTA
from bcgtune.core.plan.measure_defaults import CPU_ROUNDS, DEFAULT_CHECK_BATCHES, GPU_ROUNDS
from bcgtune.core.sglang.constants import DEFAULT_TOLERANCE_PCT
from bcgtune.engines.choices import DEVICE_HELP, Dtype, GraphImpl, HfAttention, Runner, SdpaBackend, device_name


def options(name: str, cls: type) -> Callable:
    """Add the fields of dataclass `cls` to a command as options; the command receives
    them as one `cls` instance in its parameter `name`."""
    hints = typing.get_type_hints(cls, include_extras=True)
    flds = dataclasses.fields(cls)

    def deco(func: Callable) -> Callable:
        sig = inspect.signature(func)
        resolved = typing.get_type_hints(func, include_extras=True)
        params = [p.replace(annotation=resolved.get(n, p.annotation)) for n, p in sig.parameters.items() if n != name]
        added = [
            inspect.Parameter(f"{name}__{f.name}", inspect.Parameter.KEYWORD_ONLY, default=f.default, annotation=hints[f.name])
            for f in flds
        ]

        @functools.wraps(func)
        def wrapper(*args, **kwargs):
            kwargs[name] = cls(**{f.name: kwargs.pop(f"{name}__{f.name}") for f in flds})
            return func(*args, **kwargs)

        new = sorted(params + added, key=lambda p: p.kind)
        wrapper.__signature__ = sig.replace(parameters=new)  # type: ignore[attr-defined]
        wrapper.__annotations__ = {p.name: p.annotation for p in new}
        del wrapper.__wrapped__  # typer must read the signature above, not func's
        return wrapper

    return deco


def resolved_callable(func: Callable, around: Callable[[Callable, tuple, dict], Any]) -> Callable:
    """`func` wrapped by `around(func, args, kwargs)`, with a signature whose annotations are
    resolved objects (typer reads them; string annotations would resolve in the wrong module)."""
    sig = inspect.signature(func)
    resolved = typing.get_type_hints(func, include_extras=True)
    params = [p.replace(annotation=resolved.get(n, p.annotation)) for n, p in sig.parameters.items()]

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        return around(func, args, kwargs)

    wrapper.__signature__ = sig.replace(parameters=params)  # type: ignore[attr-defined]
    wrapper.__annotations__ = {p.name: p.annotation for p in params}
    if hasattr(wrapper, "__wrapped__"):
        del wrapper.__wrapped__
    return wrapper


# ---- single options ------------------------------------------------------------------
JsonFlag = Annotated[
    bool, typer.Option("--json", help="Print one JSON object on stdout instead of text (progress and notes stay on stderr).")
]
Quiet = Annotated[bool, typer.Option("--quiet", "-q", help="No progress or notes on stderr (errors still go there).")]
Workdir = Annotated[
    Optional[str],
    typer.Option(
        "--workdir",
        help="Folder for the run's server logs, client output and results (default: a new ./bcgtune-<command>-<profile>-<time>).",
    ),
]
ProfileRef = Annotated[
    str, typer.Option("--profile", "-p", help="Built-in profile name (mi355x, h200) or a path to a profile .toml.")
]
# --write-profile's escape where SGLang did not check the launch (suggest-buckets, drift, tune)
Unchecked = Annotated[
    bool,
    typer.Option(
        "--unchecked",
        help="With --write-profile, when SGLang did not check the launch and bcgtune's model names rules it could not "
        'check: write anyway; the profile records [buckets].launch_check = "not checked: ...".',
    ),
]
ModelPath = Annotated[
    Optional[str],
    typer.Option("--model-path", help="The model the server loads (path or hub id); overrides [profile].model."),
]


def tolerance_option(value: Optional[float]) -> Optional[float]:
    """--tolerance checked at parse time: a finite percentage within 0..100."""
    if value is not None and not (math.isfinite(value) and 0.0 <= value <= 100.0):
        raise typer.BadParameter(f"must be a percentage within 0..100, got {value:g}")
    return value


TOLERANCE_HELP = (
    f"Margin for calling a list as good as the best, in % of the best's predicted time: a list with fewer graphs "
    f"(or a deployed list) counts only when the upper end of its paired 95% interval against the best is within it. "
    f"Wider noise then keeps more graphs, never fewer. Default: {DEFAULT_TOLERANCE_PCT:g}."
)


# ---- server logs (trace, tune) -------------------------------------------------------------
LOG_HELP = (
    "SGLang server log(s), one per rank or replica: files, folders, globs or URLs (http(s)://, s3://, gs:// "
    "through fsspec); .gz ok; '-' for stdin. Several may follow one --log."
)
LAUNCH_HELP = (
    "KEY=VALUE, repeatable: a launch setting of the logs that state none (rotated logs without their server_args and "
    "startup lines), named as SGLang's server flags are (chunked_prefill_size=8192, tp_size=8, enable_dp_attention=true, "
    "...; the chunk as launched). Settings a log states always win."
)
MIXED_CHUNK_HELP = "The logged server ran with --enable-mixed-chunk: add one token per running decode row."


# ---- what a calibration measures (calibrate, tune) -------------------------------------
# A calibration's measurement options: flag, bounds (min, max), help ({gpu} and {cpu}: the (untimed,
# timed) rounds on a GPU and on the CPU; {check}: the model check's default batches), and
# whether typer shows a default (the rounds' defaults depend on the device: the help says them).
_MEASURE_OPTIONS: dict[str, tuple[str, tuple[Optional[int], Optional[int]], str, bool]] = {
    "mix_every": (
        "--mix-every", (1, 1_000_000),
        "Calibrate every Nth distinct (tokens, requests) batch of the trace (the others interpolated), "
        "to save device time on large models.", True,
    ),
    "warmup": (
        "--warmup", (0, 1000),
        "Untimed rounds before the timed ones. Default: {gpu[0]} on a GPU, {cpu[0]} on the CPU (a dry run).", False,
    ),
    "repeats": (
        "--repeats", (1, 10000),
        "Timed rounds, each running every size once (the median is kept, and every round, for intervals). "
        "Default: {gpu[1]} on a GPU, {cpu[1]} on the CPU (a dry run: its times describe no GPU).", False,
    ),
    "memory": (
        "--memory/--no-memory", (None, None), "Also measure the graph pool's size with each size as the largest graph.", True,
    ),
    "check_batches": (
        "--check-batches", (1, 1_000_000),
        "The model check replays at most this many of the trace's batches (every Nth, in order). Default: {check}.", False,
    ),
}  # fmt: skip


PLANNED = "Default: planned to fit --budget (the plan is printed first)."


def measure_option(
    name: str, *, panel: Optional[str] = None, dry_run_rounds: tuple[int, int] = CPU_ROUNDS, lead: str = "", planned: bool = False
) -> Any:  # typer.models.OptionInfo
    """The one declaration of a calibration's measurement option `name` (mix_every, warmup,
    repeats, memory, check_batches): the typer.Option of a command's parameter
    `Annotated[T, measure_option(...)]`, the same flag, bounds and help wherever it appears.
    `dry_run_rounds`: the command's (untimed, timed) rounds on the CPU; `lead`: text before
    the help (when the option applies)."""
    if name not in _MEASURE_OPTIONS:
        raise ValueError(f"no measurement option {name!r}")
    flag, (low, high), text, show_default = _MEASURE_OPTIONS[name]
    kw: dict[str, Any] = {"rich_help_panel": panel} if panel else {}
    if not show_default:
        kw["show_default"] = False
    text = text.format(gpu=GPU_ROUNDS, cpu=dry_run_rounds, check=DEFAULT_CHECK_BATCHES)
    if planned:  # a tune plans it: the calibrate command's default does not apply
        text = text.split(" Default:")[0].rstrip(".") + ". " + PLANNED
        kw["show_default"] = False
    return typer.Option(flag, min=low, max=high, help=_lead(lead, text), **kw)


def _lead(lead: str, text: str) -> str:
    """`text` after `lead` (a condition such as "With --sizes-from: "), its first letter then in lower case."""
    return lead + text[0].lower() + text[1:] if lead else text


# ---- parallel layout (suggest-buckets) -------------------------------------------------
_LAYOUT_PANEL = "Server layout (SGLang's flags)"
_PARALLEL_MAX = 1 << 20


def _layout_flags(self: Any) -> dict[str, Any]:
    """The flags set away from SGLang's defaults, as SGLang launch flags (snake_case
    keys); {} when none is (the command may then take the layout a trace records)."""
    return {f.name: getattr(self, f.name) for f in LAYOUT_FLAGS if getattr(self, f.name) != f.default}


# The launch flags that change how SGLang aligns and caps the captured buckets, generated
# from SGLang's flag table (bcgtune/adapters/sglang/layout_flags.py); `.flags()` gives those set.
LayoutOptions: Any = option_set(
    "LayoutOptions",
    [
        OptionSpec(
            name=f.name,
            kind=f.kind,
            default=f.default,
            flags=f.spellings,
            help=f.help,
            panel=_LAYOUT_PANEL,
            show_default=f.name != "cuda_graph_backend_prefill",
            minimum=1 if f.kind is int else None,
            maximum=_PARALLEL_MAX if f.kind is int else None,
            choices=f.choices,
        )
        for f in LAYOUT_FLAGS
    ],
    namespace={"flags": _layout_flags},
)


# ---- the torch engine (capture, validate, calibrate) -----------------------------------
_ENGINE = "Engine"


def _device_option(value: str) -> str:
    """--device checked at parse time (engines/choices.py: no torch import)."""
    try:
        return device_name(value)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None


ENGINE_MODELS = "qwen3-8b, qwen3-0.6b, qwen3-vl-8b, tiny, qwen3-vl-tiny"


@dataclass
class EngineOptions:
    """Which model the torch engine builds and how it runs."""

    model: Annotated[
        str,
        typer.Option(
            "--model",
            help=f"Built-in random-weight model ({ENGINE_MODELS}) or a local Hugging Face checkpoint folder (hf:PATH or PATH).",
            rich_help_panel=_ENGINE,
        ),
    ] = "qwen3-8b"
    device: Annotated[str, typer.Option("--device", help=DEVICE_HELP + ".", callback=_device_option, rich_help_panel=_ENGINE)] = (
        "auto"
    )
    dtype: Annotated[
        Dtype, typer.Option("--dtype", help="auto (bf16 on GPU, fp32 on CPU), bf16, fp16, fp32.", rich_help_panel=_ENGINE)
    ] = Dtype.auto
    sdpa_backend: Annotated[
        SdpaBackend,
        typer.Option(
            "--sdpa-backend",
            help="SDPA backend pinned for eager and capture alike: auto (flash; on the CPU torch's tiled flash "
            "kernel), flash, efficient, cudnn, math, none.",
            rich_help_panel=_ENGINE,
        ),
    ] = SdpaBackend.auto
    hf_attention: Annotated[
        HfAttention,
        typer.Option(
            "--hf-attention",
            help="Checkpoint folders: causal (bcgtune's fixed causal SDPA, replay equals eager) or sdpa (transformers' own).",
            rich_help_panel=_ENGINE,
        ),
    ] = HfAttention.causal
    random_weights: Annotated[
        bool,
        typer.Option("--random-weights", help="Checkpoint folders: random weights from config.json.", rich_help_panel=_ENGINE),
    ] = False
    seed: Annotated[
        int, typer.Option("--seed", min=0, max=2**32 - 1, help="Seed for weights and inputs.", rich_help_panel=_ENGINE)
    ] = 0
    runner: Annotated[
        Runner,
        typer.Option(
            "--runner",
            help="Prefill graph runner: breakable (SGLang's default on CUDA: captured segments, attention eager between them "
            "on the real rows) or full (SGLang's `full` prefill backend with one request slot: one whole-forward graph "
            "per bucket).",
            rich_help_panel=_ENGINE,
        ),
    ] = Runner.breakable
    chunked_prefill_size: Annotated[
        Optional[int],
        typer.Option(
            "--chunked-prefill-size",
            min=1,
            max=2**31 - 1,
            help="The server's chunked prefill size: buckets above it are refused. Default: 16384, SGLang's largest default.",
            rich_help_panel=_ENGINE,
            show_default=False,
        ),
    ] = None
    graph_impl: Annotated[
        GraphImpl,
        typer.Option(
            "--graph-impl",
            help="Breakable capture machinery: auto (SGLang's own classes when they import, else bcgtune's copy), sglang, "
            "bcgtune.",
            rich_help_panel=_ENGINE,
        ),
    ] = GraphImpl.auto
    sim_calibration: Annotated[
        Optional[str],
        typer.Option(
            "--sim-calibration",
            help="With --device sim: a calibration recorded on a GPU (calibrate's JSON). The simulated device times that "
            "model on that GPU, with the noise a GPU shows, on a clock of simulated seconds, without torch; --seed sets "
            "its world and noise.",
            rich_help_panel=_ENGINE,
            show_default=False,
        ),
    ] = None


@dataclass
class AccuracyOptions:
    """When a replayed token counts as disagreeing with eager."""

    gap_threshold: Annotated[
        float,
        typer.Option(
            "--gap-threshold",
            min=0.0,
            max=1e6,
            help="Eager top-1/top-2 logit gap above which a top-1 flip or logprob change fails (below it bf16 noise flips "
            "tokens).",
            rich_help_panel="Accuracy",
        ),
    ] = GAP_THRESHOLD
    max_logprob_delta: Annotated[
        float,
        typer.Option(
            "--max-logprob-delta",
            min=0.0,
            max=1e6,
            help="Largest |logprob change| of eager's top-1 allowed where the gap is wide.",
            rich_help_panel="Accuracy",
        ),
    ] = MAX_LOGPROB_DELTA
