"""Workload: a benchmark client (SGLang's bench_serving) plus the server settings that shape
its prefill batches, as one validated value the simulator plays, and the schema of every
value it carries.

Sources, later ones winning: built-in defaults (bench_serving's and SGLang's own) <- a
workload TOML or shipped preset (`--workload`) <- a profile's `[server]` (`--profile`) <-
explicit CLI options (bcgtune/files/workload_file.py reads the files). Names are
bench_serving's / SGLang's, snake_case.

Every value is checked by the pydantic models below through `bcgtune.core.schema.validate`
(the project's one validation mechanism): types, bounds (token counts within SGLang's int32,
finite non-negative step times, seeds within numpy's legacy range, at most
`schema.REQUESTS_MAX` simulated requests), unknown keys. A workload file's errors name the
file and `[table].key`; option errors name the field (`num_prompts`), which the CLI turns
into its flag. The command line's simulation options are generated from these models: a
field with `cli=CliHelp(...)` metadata is an option of `trace --simulate`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import TYPE_CHECKING, Annotated, Any, Literal, get_args

import numpy as np
import pydantic
from pydantic import BeforeValidator, Field

from bcgtune.core import schema
from bcgtune.core.sglang.ladder import default_chunked_prefill_size
from bcgtune.core.sim.image_tokens import (
    MODEL_FAMILIES,
    VISION_EDGE_TOKENS,
    ModelFamily,
    image_tokens,
    parse_random_resolution,
    parse_resolution,
)
from bcgtune.errors import InputError

if TYPE_CHECKING:
    from bcgtune.core.plan.calibration import Calibration

DatasetName = Literal["random-ids", "random", "image"]
DATASETS: tuple[str, ...] = get_args(DatasetName)

# Qwen chat template around one user turn with images, minus the image span:
# <|im_start|> user \n ... <|im_end|> \n <|im_start|> assistant \n  -> 8 tokens. bench_serving's
# image dataset sends the templated prompt; its text datasets send raw text to /generate.
QWEN_CHAT_TEMPLATE_TOKENS = 8

# bench_serving defaults (benchmark/serving.py argparse).
BENCH_DEFAULT_SEED = 42

# Bounds of a simulated benchmark beyond those in bcgtune.core.schema: a sweep of more
# concurrency levels, more images per request or more DP/TP ranks than these describes no
# real benchmark, and each costs memory or time in the simulator.
LEVELS_MAX = 1000
IMAGES_PER_REQUEST_MAX = 1024
PARALLEL_MAX = 1024
SECONDS_MAX = schema.MS_MAX / 1000.0
# Poisson arrivals of one run may span this much simulated time: about three years. A
# tinier rate describes no benchmark, and at ~1e16 s float64 seconds no longer resolve a
# decode step.
ARRIVAL_SPAN_MAX_S = 1e8
# Image sizes drawn for `random:` resolutions over a whole simulation (each costs a resize
# rule evaluation and 16 bytes): far beyond what bench_serving generates in a run.
RANDOM_IMAGES_MAX = 1_000_000
TEXT_MAX = 200  # characters of a name, a resolution or a preset description line


@dataclass
class StepTimeModel:
    """How long the server's steps take, in milliseconds; orders arrivals and completions.

    Defaults are eager measurements of a Qwen3-8B-shaped decoder on one H200:
    prefill_ms(n) = max(9.5, 0.99 + 0.02623 n + 6.85e-7 n^2) fits the eager times within
    2.5% from 512 to 8192 tokens and their ~9.5 ms launch-bound floor below. Decode: the
    replay time at 16 tokens (5.6 ms) as the base, plus a KV-read term of 3.0e-5 ms per
    context token (that model's 144 KiB of KV per token at ~4.8 TB/s). Vision encoder and
    client costs are plausible guesses, not measurements. A calibration (measured eager
    prefill times, `bcgtune calibrate`) replaces the polynomial: `prefill_curve` takes an
    int array of forward sizes and returns milliseconds."""

    prefill_floor_ms: float = 9.5
    prefill_c0_ms: float = 0.99
    prefill_c1_ms: float = 0.02623
    prefill_c2_ms: float = 6.85e-7
    prefill_per_req_ms: float = 0.05
    vision_ms_per_image: float = 3.0
    decode_base_ms: float = 5.6
    decode_per_row_ms: float = 0.01
    decode_per_ctx_token_ms: float = 3.0e-5
    client_rtt_ms: float = 2.0  # request out + last token back, split evenly
    image_preprocess_ms: float = 6.0  # tokenizer manager: decode + resize + patchify, per image
    level_gap_s: float = 5.0  # between two bench_serving runs of a sweep
    prefill_curve: Callable[[np.ndarray], np.ndarray] | None = field(default=None, repr=False, compare=False)

    def prefill_ms(self, tokens) -> np.ndarray:
        """Eager prefill forward time (ms) for each forward size in `tokens` (an int array):
        the calibration curve when one is set, else max(floor, c0 + c1 n + c2 n^2)."""
        n = np.asarray(tokens, dtype=np.int64)
        if self.prefill_curve is not None:
            ms = np.asarray(self.prefill_curve(n), dtype=np.float64)
            if ms.shape != n.shape or not np.all(np.isfinite(ms)) or (ms < 0).any():
                raise InputError(
                    "the prefill time curve must return finite non-negative milliseconds per size", field="prefill_curve"
                )
            return ms
        nf = n.astype(np.float64)
        return np.maximum(self.prefill_floor_ms, self.prefill_c0_ms + self.prefill_c1_ms * nf + self.prefill_c2_ms * nf * nf)

    def prefill_table(self, max_tokens: int) -> list[float]:
        """Prefill forward time in seconds for every size 0..max_tokens (a list: O(1) lookups)."""
        return (self.prefill_ms(np.arange(max_tokens + 1, dtype=np.int64)) / 1000.0).tolist()

    def calibrated(self, calibration: Calibration) -> StepTimeModel:
        """This model with a calibration's measured eager prefill times in place of the
        polynomial (sizes between measured ones interpolated, as the optimizer prices them)."""

        def calibrated_eager_ms(n: np.ndarray) -> np.ndarray:
            return calibration.eager_time(n)

        return replace(self, prefill_curve=calibrated_eager_ms)

    def to_dict(self) -> dict[str, Any]:
        d = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "prefill_curve"}
        d["prefill_curve"] = None if self.prefill_curve is None else getattr(self.prefill_curve, "__name__", "callable")
        return d


# ---- the schema: every settable value, its type and bounds ----------------------------------


def _one_as_list(value: Any) -> Any:
    """`num_prompts = 1000` is the list [1000]; a value neither an integer nor a list is
    refused as such (not as "not a valid list": one integer is the usual form)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return [value]
    if isinstance(value, (list, tuple)) or value is None:
        return value
    raise ValueError("must be an integer or a list of integers")


def _inf_word(value: Any) -> Any:
    """request_rate may be written "inf" (bench_serving's spelling of a closed loop)."""
    return math.inf if isinstance(value, str) and value.strip().lower() in ("inf", "infinity") else value


def _chunk_size(value: int) -> int:
    if value == 0 or value < -1:
        raise ValueError("must be positive, or -1 to turn chunked prefill off")
    return value


Requests = Annotated[int, Field(strict=True, ge=1, le=schema.REQUESTS_MAX)]
PromptCounts = Annotated[list[Requests], BeforeValidator(_one_as_list), Field(min_length=1, max_length=LEVELS_MAX)]
Concurrencies = Annotated[list[Requests], BeforeValidator(_one_as_list), Field(max_length=LEVELS_MAX)]
WarmupRequests = Annotated[int, Field(strict=True, ge=0, le=schema.REQUESTS_MAX)]
RangeRatio = Annotated[float, Field(strict=True, ge=0.0, le=1.0, allow_inf_nan=False)]
RequestRate = Annotated[
    float, Field(strict=True, gt=0.0), BeforeValidator(_inf_word)
]  # order: pydantic 2.6 needs the constraint first
ImageCount = Annotated[int, Field(strict=True, ge=0, le=IMAGES_PER_REQUEST_MAX)]
Parallel = Annotated[int, Field(strict=True, ge=1, le=PARALLEL_MAX)]
ChunkSize = Annotated[int, Field(strict=True, ge=-1, le=schema.TOKENS_MAX), pydantic.AfterValidator(_chunk_size)]
PositiveGiB = Annotated[float, Field(strict=True, gt=0, le=schema.GIB_MAX, allow_inf_nan=False)]
PositiveMs = Annotated[float, Field(strict=True, gt=0, le=schema.MS_MAX, allow_inf_nan=False)]
Seconds = Annotated[float, Field(strict=True, ge=0, le=SECONDS_MAX, allow_inf_nan=False)]
Text = Annotated[str, Field(strict=True, max_length=TEXT_MAX)]
LongText = Annotated[str, Field(strict=True, max_length=10 * TEXT_MAX)]


class ClientSettings(schema.StrictDocument):
    """bench_serving's client options, under its own names."""

    dataset_name: Annotated[DatasetName | None, schema.CliOption("random (default), random-ids or image.")] = pydantic.Field(
        None, description="bench_serving's dataset: random, random-ids or image."
    )
    num_prompts: Annotated[
        PromptCounts | None, schema.CliOption("Prompts per run (default 1000); a comma list gives one per concurrency level.")
    ] = pydantic.Field(None, description="Prompts per run: one value, or one per concurrency level.")
    random_input_len: Annotated[schema.Tokens | None, schema.CliOption("Longest input (default 1024 tokens).")] = pydantic.Field(
        None, description="Longest prompt (tokens); lengths are uniform on [max(floor(L*r), 1), L]."
    )
    random_output_len: Annotated[schema.NonNegativeInt | None, schema.CliOption("Longest output (default 1024 tokens).")] = (
        pydantic.Field(None, description="Longest output (tokens), drawn like the input.")
    )
    random_range_ratio: Annotated[
        RangeRatio | None, schema.CliOption("Lengths uniform on [max(floor(L*r),1), L] (default 0).")
    ] = pydantic.Field(None, description="r in the length rule above.")
    image_count: Annotated[ImageCount | None, schema.CliOption("Images per request for --dataset-name image (default 1).")] = (
        pydantic.Field(None, description="Images per request (image dataset).")
    )
    image_resolution: Annotated[
        Text | None, schema.CliOption("4k, 1080p (default), 720p, 360p, HEIGHTxWIDTH or random:hxw-HxW.")
    ] = pydantic.Field(None, description="4k, 1080p, 720p, 360p, HEIGHTxWIDTH, or random:hxw-HxW.")
    max_concurrency: Annotated[
        Concurrencies | None, schema.CliOption("One value or a comma list (a sweep, run one after another). Default: unbounded.")
    ] = pydantic.Field(None, description="Concurrency levels, run one after another (empty: unbounded, one run).")
    request_rate: Annotated[
        RequestRate | None, schema.CliOption("inf (default: closed loop) or Poisson arrivals per second.")
    ] = pydantic.Field(None, description='Requests per second (Poisson arrivals), or "inf" for a closed loop.')
    warmup_requests: Annotated[WarmupRequests | None, schema.CliOption("Warm-up requests before each run (default 1).")] = (
        pydantic.Field(None, description="Warm-up requests before each run.")
    )
    seed: Annotated[schema.Seed | None, schema.CliOption("bench_serving's seed (default 42).")] = pydantic.Field(
        None, description="bench_serving's --seed: the lengths are drawn exactly as it draws them."
    )
    model_family: Annotated[
        ModelFamily | None, schema.CliOption("Image tokens by qwen2-vl, qwen2.5-vl or qwen3-vl (default) resizing.")
    ] = pydantic.Field(None, description="Image tokens by the resize rule of qwen2-vl, qwen2.5-vl or qwen3-vl.")
    tokens_per_image: Annotated[
        schema.NonNegativeInt | None, schema.CliOption("Fixed tokens per image instead of the family's resize rule.")
    ] = pydantic.Field(None, description="Fixed tokens per image instead of the family's rule.")
    chat_template_tokens: Annotated[
        schema.NonNegativeInt | None, schema.CliOption("Template tokens per prompt (default 8 for image, 0 for text).")
    ] = pydantic.Field(None, description="Template tokens per prompt (default: 8 for images, 0 for text).")


class ServerSettings(schema.StrictDocument):
    """The SGLang launch flags that shape prefill batches, under SGLang's names."""

    chunked_prefill_size: Annotated[
        ChunkSize | None, schema.CliOption("Default: SGLang's for the GPU memory (8192 on an H200).")
    ] = pydantic.Field(None, description="SGLang's --chunked-prefill-size (-1: off); default: SGLang's for gpu_memory_gib.")
    max_prefill_tokens: Annotated[schema.PositiveInt | None, schema.CliOption("Default 16384.")] = pydantic.Field(
        None, description="SGLang's --max-prefill-tokens."
    )
    max_running_requests: Annotated[schema.PositiveInt | None, schema.CliOption("Default: no cap by count.")] = pydantic.Field(
        None, description="SGLang's --max-running-requests (unset: no cap by count)."
    )
    page_size: Annotated[schema.PositiveInt | None, schema.CliOption("Default 1.")] = pydantic.Field(
        None, description="SGLang's --page-size."
    )
    enable_mixed_chunk: Annotated[
        pydantic.StrictBool | None, schema.CliOption("Mix decode rows into prefill batches (default off).")
    ] = pydantic.Field(None, description="SGLang's --enable-mixed-chunk: decode rows join prefill batches.")
    prefill_decode_interval: Annotated[
        schema.NonNegativeInt | None, schema.CliOption("Decode steps forced after each prefill (default 0).")
    ] = pydantic.Field(None, description="SGLang's --prefill-decode-interval: decode steps forced after a prefill.")
    disable_radix_cache: Annotated[pydantic.StrictBool | None, schema.CliOption("As the server flag (default off).")] = (
        pydantic.Field(None, description="SGLang's --disable-radix-cache.")
    )
    dp_size: Annotated[Parallel | None, schema.CliOption("Data parallel schedulers (default 1).")] = pydantic.Field(
        None, description="SGLang's --dp-size: data parallel schedulers."
    )
    enable_dp_attention: Annotated[
        pydantic.StrictBool | None,
        schema.CliOption(
            "DP attention: the --dp-size ranks share the chunk and run every iteration together; each batch records its step "
            "(default off).",
            ("--dp-attention",),
        ),
    ] = pydantic.Field(None, description="SGLang's --enable-dp-attention.")
    max_total_tokens: schema.PositiveInt | None = pydantic.Field(
        None, description="KV cache room in tokens (unset: never the limit)."
    )
    context_length: schema.PositiveInt | None = pydantic.Field(
        None, description="SGLang's --context-length: longer requests are refused."
    )
    tp_size: Annotated[
        Parallel | None, schema.CliOption("Tensor parallel size (default: --dp-size under DP attention, else 1).")
    ] = pydantic.Field(
        None,
        description="SGLang's --tp-size (default: the least SGLang accepts, dp_size under DP attention, else 1).",
    )
    gpu_memory_gib: PositiveGiB | None = pydantic.Field(
        None, description="GPU memory, which picks SGLang's default chunked prefill size."
    )


class StepTimeSettings(schema.StrictDocument):
    """The constants of the step-time model that drives the simulated clock."""

    prefill_floor_ms: schema.Milliseconds | None = pydantic.Field(
        None, description="Eager prefill time never below this (launch-bound floor)."
    )
    prefill_c0_ms: schema.Milliseconds | None = pydantic.Field(None, description="Eager prefill time: constant term.")
    prefill_c1_ms: schema.Milliseconds | None = pydantic.Field(None, description="Eager prefill time: per token.")
    prefill_c2_ms: schema.Milliseconds | None = pydantic.Field(
        None, description="Eager prefill time: per token squared (attention)."
    )
    prefill_per_req_ms: schema.Milliseconds | None = pydantic.Field(
        None, description="Extra prefill time per request in the batch."
    )
    vision_ms_per_image: schema.Milliseconds | None = pydantic.Field(None, description="Vision encoder time per image.")
    decode_base_ms: PositiveMs | None = pydantic.Field(None, description="One decode step: base time.")
    decode_per_row_ms: schema.Milliseconds | None = pydantic.Field(None, description="One decode step: per running request.")
    decode_per_ctx_token_ms: schema.Milliseconds | None = pydantic.Field(
        None, description="One decode step: per context token (KV reads)."
    )
    client_rtt_ms: schema.Milliseconds | None = pydantic.Field(
        None, description="Client round trip (request out, last token back)."
    )
    image_preprocess_ms: schema.Milliseconds | None = pydantic.Field(
        None, description="Server-side image preprocessing per image."
    )
    level_gap_s: Seconds | None = pydantic.Field(None, description="Pause between two runs of a sweep (seconds).")


class WorkloadSettings(ClientSettings, ServerSettings, StepTimeSettings):
    """Every settable value in one flat namespace: what options and a Workload carry."""


class WorkloadFile(schema.StrictDocument):
    """A workload TOML file or shipped preset."""

    name: Text | None = pydantic.Field(None, description="Workload name (default: the file name).")
    description: LongText | None = pydantic.Field(None, description="Free text.")
    profile: Text | None = pydantic.Field(
        None, description="Take the server settings from this profile first ([server] goes on top)."
    )
    client: ClientSettings = ClientSettings()
    server: ServerSettings = ServerSettings()
    step_time: StepTimeSettings = StepTimeSettings()


SECTIONS: dict[str, type[schema.StrictDocument]] = {
    "client": ClientSettings,
    "server": ServerSettings,
    "step_time": StepTimeSettings,
}
_SECTION_OF = {name: section for section, model in SECTIONS.items() for name in model.model_fields}
_STEP_FIELDS = frozenset(StepTimeSettings.model_fields)
_LIST_FIELDS = {"num_prompts": Requests, "max_concurrency": Requests}


def _field_error(what: str, name: str, where: str | None) -> InputError:
    """An error about one setting: in a file, named `[table].key`; else by its field name
    (the CLI turns it into the flag)."""
    if where:
        return InputError(f"[{_SECTION_OF.get(name, 'client')}].{name}: {what}", where)
    return InputError(what, None, field=name)


@dataclass
class Workload:
    # ---- client: bench_serving ----------------------------------------------------
    dataset_name: DatasetName = "random"
    num_prompts: list[int] = field(default_factory=lambda: [1000])  # one value, or one per concurrency level
    random_input_len: int = 1024
    random_output_len: int = 1024
    random_range_ratio: float = 0.0
    image_count: int = 1
    image_resolution: str = "1080p"
    max_concurrency: list[int] = field(default_factory=list)  # empty: unbounded, one run
    request_rate: float = math.inf  # inf = closed loop; else Poisson arrivals (req/s)
    warmup_requests: int = 1
    seed: int = BENCH_DEFAULT_SEED
    model_family: ModelFamily = "qwen3-vl"
    tokens_per_image: int | None = None  # overrides the family's resize rule
    chat_template_tokens: int | None = None  # None: 8 for the image dataset (Qwen template), else 0
    # ---- server: SGLang flags ------------------------------------------------------
    chunked_prefill_size: int | None = None  # None: SGLang's default for gpu_memory_gib
    max_prefill_tokens: int = 16384
    max_running_requests: int | None = None  # None: no cap by count (SGLang derives it from the KV pool)
    page_size: int = 1
    enable_mixed_chunk: bool = False
    prefill_decode_interval: int = 0
    disable_radix_cache: bool = False
    dp_size: int = 1
    enable_dp_attention: bool = False
    max_total_tokens: int | None = None  # KV room in tokens; None: never the limit
    context_length: int | None = None
    tp_size: int | None = None  # None: the least SGLang accepts (resolved_tp_size)
    gpu_memory_gib: float = 141.0  # H200; picks the chunked_prefill_size default
    # ---- step-time model ------------------------------------------------------------
    step: StepTimeModel = field(default_factory=StepTimeModel)
    name: str = ""

    # ---- resolved views ---------------------------------------------------------------
    @property
    def levels(self) -> list[int | None]:
        return list(self.max_concurrency) if self.max_concurrency else [None]

    def prompts_for_level(self, i: int) -> int:
        return self.num_prompts[0] if len(self.num_prompts) == 1 else self.num_prompts[i]

    @property
    def total_requests(self) -> int:
        """Requests the simulation plays: every level's prompts and warm-up requests."""
        return sum(self.prompts_for_level(i) + self.warmup_requests for i in range(len(self.levels)))

    @property
    def resolved_chunked_prefill_size(self) -> int:
        """Per scheduler (DP rank): SGLang divides by dp size under DP attention."""
        c = self.chunked_prefill_size
        if c is None:
            c = default_chunked_prefill_size(self.gpu_memory_gib)
        if c == -1:  # chunked prefill disabled: a request is never cut
            return 1 << 40
        if self.enable_dp_attention and self.dp_size > 1:
            c //= self.dp_size
        return c

    @property
    def resolved_max_running_requests(self) -> int:
        m = self.max_running_requests
        if m is None:
            return 1 << 40
        if self.enable_dp_attention and self.dp_size > 1:
            m = max(1, m // self.dp_size)
        return m

    @property
    def resolved_tp_size(self) -> int:
        """The tensor parallel size of the simulated launch: as set, else the least SGLang
        accepts. Under DP attention SGLang splits tp into attention-DP groups of tp / dp
        ranks (runtime_context.py, derive_attn_tp_size), so tp is at least dp_size there."""
        if self.tp_size is not None:
            return self.tp_size
        return self.dp_size if self.enable_dp_attention and self.dp_size > 1 else 1

    @property
    def resolved_chat_template_tokens(self) -> int:
        if self.chat_template_tokens is not None:
            return self.chat_template_tokens
        return QWEN_CHAT_TEMPLATE_TOKENS if self.dataset_name == "image" else 0

    @property
    def has_images(self) -> bool:
        return self.dataset_name == "image" and self.image_count > 0

    def fixed_image_tokens(self) -> int | None:
        """Tokens of one image when every image is the same size, else None (random:)."""
        if self.tokens_per_image is not None:
            return self.tokens_per_image
        if parse_random_resolution(self.image_resolution) is not None:
            return None
        w, h = parse_resolution(self.image_resolution)
        return image_tokens(w, h, self.model_family)

    def max_image_tokens(self) -> int:
        """The most tokens one image of this workload can add."""
        fixed = self.fixed_image_tokens()
        if fixed is not None:
            return fixed
        patch, merge, _, max_pixels = MODEL_FAMILIES[self.model_family]
        return max_pixels // (patch * merge) ** 2 + VISION_EDGE_TOKENS

    # ---- validation -------------------------------------------------------------------
    def settings(self) -> dict[str, Any]:
        """Every settable value (client, server, step time) by field name."""
        out = {name: getattr(self, name) for name in WorkloadSettings.model_fields if name not in _STEP_FIELDS}
        out.update({name: getattr(self.step, name) for name in _STEP_FIELDS})
        return out

    def validate(self, where: str | None = None) -> Workload:
        """Each value against the schema, then the rules that tie values together. A failure
        is one InputError naming `[table].key` in `where` (a workload file) or, without
        `where`, the field."""
        try:
            schema.validate(WorkloadSettings, self.settings(), None, as_fields=True)
        except InputError as exc:
            raise _field_error(exc.what, exc.field or "", where) from None
        levels = len(self.levels)
        if len(self.num_prompts) > 1 and len(self.num_prompts) != levels:
            raise _field_error(f"lists {len(self.num_prompts)} values for {levels} concurrency levels", "num_prompts", where)
        total = self.total_requests
        if total > schema.REQUESTS_MAX:
            over = "1 concurrency level" if levels == 1 else f"{levels} concurrency levels"
            raise _field_error(
                f"the simulation would play {total:,} requests (prompts and warm-ups over {over}), "
                f"above the limit of {schema.REQUESTS_MAX:,}",
                "num_prompts",
                where,
            )
        if self.has_images:
            try:
                image = self.max_image_tokens()
            except InputError as exc:
                raise _field_error(exc.what, "image_resolution", where) from None
        else:
            image = 0
        prompt = self.random_input_len + self.resolved_chat_template_tokens + self.image_count * image
        if prompt > schema.TOKENS_MAX:
            raise _field_error(
                f"a prompt may reach {prompt:,} tokens (text, template and images), above SGLang's "
                f"int32 token limit {schema.TOKENS_MAX:,}",
                "random_input_len",
                where,
            )
        self._check_layout(where)
        self._check_work(where)
        return self

    def _check_layout(self, where: str | None) -> None:
        """The launch must be one SGLang accepts: under DP attention, tp a multiple of dp."""
        from bcgtune.core.sglang.ladder import ParallelLayout

        tp = self.resolved_tp_size
        layout = ParallelLayout(tp=tp, dp=self.dp_size, enable_dp_attention=self.enable_dp_attention)
        try:
            _ = layout.attn_tp_size
        except InputError:
            dp = self.dp_size
            raise _field_error(
                f"tensor parallel size {tp} is not a multiple of the DP-attention size {dp}, which SGLang refuses "
                f"(attention runs on groups of tp / dp ranks): use tp_size {dp * max(1, -(-tp // dp))}",
                "tp_size",
                where,
            ) from None

    def _check_work(self, where: str | None) -> None:
        """Inputs that would make the simulation run away: arrivals spread over more simulated
        time than float seconds resolve, or more random image sizes than memory holds."""
        if not math.isinf(self.request_rate):
            n = max(self.num_prompts)
            span = n / self.request_rate
            if span > ARRIVAL_SPAN_MAX_S:
                raise _field_error(
                    f"{n:,} prompts at {self.request_rate:.3g} requests/s arrive over about {span:.3g} s of simulated "
                    f"time, above {ARRIVAL_SPAN_MAX_S:.0e} s (about 3 years): give at least "
                    f"{n / ARRIVAL_SPAN_MAX_S:.3g} requests/s",
                    "request_rate",
                    where,
                )
        if self.has_images and self.tokens_per_image is None and parse_random_resolution(self.image_resolution) is not None:
            drawn = self.image_count * sum(self.prompts_for_level(i) for i in range(len(self.levels)))
            if drawn > RANDOM_IMAGES_MAX:
                raise _field_error(
                    f"{drawn:,} random image sizes to draw (images per request x prompts), above the limit of "
                    f"{RANDOM_IMAGES_MAX:,}: fewer images or prompts, or a fixed resolution",
                    "image_count",
                    where,
                )

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name == "step":
                d["step"] = v.to_dict()
            elif f.name == "tp_size":
                d["tp_size"] = self.resolved_tp_size  # the launch simulated
            elif isinstance(v, float) and math.isinf(v):
                d[f.name] = "inf"
            elif isinstance(v, list):
                d[f.name] = list(v)
            else:
                d[f.name] = v
        d["resolved"] = {
            "chunked_prefill_size": self.resolved_chunked_prefill_size,
            "chat_template_tokens": self.resolved_chat_template_tokens,
            "tokens_per_image": self.fixed_image_tokens() if self.has_images else 0,
        }
        return d


def with_settings(w: Workload, settings: Mapping[str, Any]) -> Workload:
    """A copy of `w` with already validated settings (field name -> value) applied."""
    step_changes = {k: v for k, v in settings.items() if k in _STEP_FIELDS}
    changes = {k: v for k, v in settings.items() if k not in _STEP_FIELDS}
    if step_changes:
        changes["step"] = replace(w.step, **step_changes)
    return replace(w, **changes)
