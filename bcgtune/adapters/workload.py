"""Workload: a benchmark client (SGLang's bench_serving) plus the server settings that shape
its prefill batches, as one validated value the simulator plays.

Sources, later ones winning: built-in defaults (bench_serving's and SGLang's own) <- a
workload TOML or shipped preset (`--workload`) <- a profile's `[server]` (`--profile`) <-
explicit CLI options. Names are bench_serving's / SGLang's, snake_case (kebab-case keys are
read as their snake_case form).

Every value is checked by the pydantic models below through `bcgtune.core.schema.validate`
(the project's one validation mechanism): types, bounds (token counts within SGLang's int32,
finite non-negative step times, seeds within numpy's legacy range, at most
`schema.REQUESTS_MAX` simulated requests), unknown keys. A workload file's errors name the
file and `[table].key`; option errors name the field (`num_prompts`), which the CLI turns
into its flag.

What is checked against SGLang 0.5.23 source (PyPI wheel):
  * lengths: sglang/benchmark/datasets/common.py `compute_random_lens`:
        np.random.randint(max(int(full_len * range_ratio), 1), full_len + 1, size=num)
    on numpy's legacy global RNG after `np.random.seed(args.seed)` (benchmark/serving.py,
    ImageDataset.load reseeds the same way); input lengths are drawn first, then outputs.
    `sample_lengths` replays exactly that with `np.random.RandomState(seed)`.
  * image resolutions: sglang/benchmark/datasets/image.py `parse_image_resolution`: presets
    4k/1080p/720p/360p are (width, height); a custom 'AxB' is HEIGHTxWIDTH ('1080x1920' =
    1080 high, 1920 wide); `random:hxw-HxW` draws width and height uniformly per image.
  * image tokens: transformers' Qwen2-VL image processor `smart_resize` (SGLang hands Qwen-VL
    images to the HF processor; its own smart_resize in srt/multimodal/processors/qwen_vl.py
    is the same rule): round each side to a multiple of patch*merge, rescale into
    [min_pixels, max_pixels] keeping the aspect ratio; tokens = (H/(p*m)) * (W/(p*m)) + 2
    (<|vision_start|>, <|vision_end|>).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, get_args

import numpy as np
import pydantic
from pydantic import BeforeValidator, Field

from bcgtune.adapters.profiles import snake
from bcgtune.core import schema
from bcgtune.core.ladder import default_chunked_prefill_size
from bcgtune.errors import InputError

if TYPE_CHECKING:
    from bcgtune.core.calibration import Calibration

DatasetName = Literal["random-ids", "random", "image"]
DATASETS: tuple[str, ...] = get_args(DatasetName)

# (patch, merge, min_pixels, max_pixels) from the models' preprocessor_config.json:
# Qwen2-VL / Qwen2.5-VL: min_pixels 3136, max_pixels 12845056; Qwen3-VL: size.shortest_edge
# 65536, size.longest_edge 16777216 (pixel counts, despite the names).
MODEL_FAMILIES: dict[str, tuple[int, int, int, int]] = {
    "qwen2-vl": (14, 2, 3136, 12845056),
    "qwen2.5-vl": (14, 2, 3136, 12845056),
    "qwen3-vl": (16, 2, 65536, 16777216),
}
ModelFamily = Literal["qwen2-vl", "qwen2.5-vl", "qwen3-vl"]  # the keys of MODEL_FAMILIES
VISION_EDGE_TOKENS = 2  # <|vision_start|> + <|vision_end|>

# bench_serving parse_image_resolution presets, (width, height).
RESOLUTION_PRESETS: dict[str, tuple[int, int]] = {
    "4k": (3840, 2160),
    "1080p": (1920, 1080),
    "720p": (1280, 720),
    "360p": (640, 360),
}

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

    dataset_name: DatasetName | None = pydantic.Field(None, description="bench_serving's dataset: random, random-ids or image.")
    num_prompts: PromptCounts | None = pydantic.Field(
        None, description="Prompts per run: one value, or one per concurrency level."
    )
    random_input_len: schema.Tokens | None = pydantic.Field(
        None, description="Longest prompt (tokens); lengths are uniform on [max(floor(L*r), 1), L]."
    )
    random_output_len: schema.NonNegativeInt | None = pydantic.Field(
        None, description="Longest output (tokens), drawn like the input."
    )
    random_range_ratio: RangeRatio | None = pydantic.Field(None, description="r in the length rule above.")
    image_count: ImageCount | None = pydantic.Field(None, description="Images per request (image dataset).")
    image_resolution: Text | None = pydantic.Field(None, description="4k, 1080p, 720p, 360p, HEIGHTxWIDTH, or random:hxw-HxW.")
    max_concurrency: Concurrencies | None = pydantic.Field(
        None, description="Concurrency levels, run one after another (empty: unbounded, one run)."
    )
    request_rate: RequestRate | None = pydantic.Field(
        None, description='Requests per second (Poisson arrivals), or "inf" for a closed loop.'
    )
    warmup_requests: WarmupRequests | None = pydantic.Field(None, description="Warm-up requests before each run.")
    seed: schema.Seed | None = pydantic.Field(
        None, description="bench_serving's --seed: the lengths are drawn exactly as it draws them."
    )
    model_family: ModelFamily | None = pydantic.Field(
        None, description="Image tokens by the resize rule of qwen2-vl, qwen2.5-vl or qwen3-vl."
    )
    tokens_per_image: schema.NonNegativeInt | None = pydantic.Field(
        None, description="Fixed tokens per image instead of the family's rule."
    )
    chat_template_tokens: schema.NonNegativeInt | None = pydantic.Field(
        None, description="Template tokens per prompt (default: 8 for images, 0 for text)."
    )


class ServerSettings(schema.StrictDocument):
    """The SGLang launch flags that shape prefill batches, under SGLang's names."""

    chunked_prefill_size: ChunkSize | None = pydantic.Field(
        None, description="SGLang's --chunked-prefill-size (-1: off); default: SGLang's for gpu_memory_gib."
    )
    max_prefill_tokens: schema.PositiveInt | None = pydantic.Field(None, description="SGLang's --max-prefill-tokens.")
    max_running_requests: schema.PositiveInt | None = pydantic.Field(
        None, description="SGLang's --max-running-requests (unset: no cap by count)."
    )
    page_size: schema.PositiveInt | None = pydantic.Field(None, description="SGLang's --page-size.")
    enable_mixed_chunk: pydantic.StrictBool | None = pydantic.Field(
        None, description="SGLang's --enable-mixed-chunk: decode rows join prefill batches."
    )
    prefill_decode_interval: schema.NonNegativeInt | None = pydantic.Field(
        None, description="SGLang's --prefill-decode-interval: decode steps forced after a prefill."
    )
    disable_radix_cache: pydantic.StrictBool | None = pydantic.Field(None, description="SGLang's --disable-radix-cache.")
    dp_size: Parallel | None = pydantic.Field(None, description="SGLang's --dp-size: data parallel schedulers.")
    enable_dp_attention: pydantic.StrictBool | None = pydantic.Field(None, description="SGLang's --enable-dp-attention.")
    max_total_tokens: schema.PositiveInt | None = pydantic.Field(
        None, description="KV cache room in tokens (unset: never the limit)."
    )
    context_length: schema.PositiveInt | None = pydantic.Field(
        None, description="SGLang's --context-length: longer requests are refused."
    )
    tp_size: Parallel | None = pydantic.Field(None, description="SGLang's --tp-size.")
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
# SGLang/profile flags the simulator reads under other names.
_SERVER_ALIASES = {"tp": "tp_size", "dp": "dp_size", "tensor_parallel_size": "tp_size", "data_parallel_size": "dp_size"}


def _field_error(what: str, name: str, where: str | None) -> InputError:
    """An error about one setting: in a file, named `[table].key`; else by its field name
    (the CLI turns it into the flag)."""
    if where:
        return InputError(f"[{_SECTION_OF.get(name, 'client')}].{name}: {what}", where)
    return InputError(what, None, field=name)


@dataclass
class Workload:
    # ---- client: bench_serving ----------------------------------------------------
    dataset_name: str = "random"
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
    model_family: str = "qwen3-vl"
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
    tp_size: int = 1
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
        return self

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name == "step":
                d["step"] = v.to_dict()
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


# ---- lengths: bench_serving's rule ---------------------------------------------------------


def compute_random_lens(rng: np.random.RandomState, full_len: int, range_ratio: float, num: int) -> np.ndarray:
    """sglang/benchmark/datasets/common.py compute_random_lens, on a given legacy RNG:
    uniform integers on [max(int(full_len * range_ratio), 1), full_len]."""
    if full_len <= 0:
        return np.zeros(num, dtype=np.int64)
    return rng.randint(max(int(full_len * range_ratio), 1), full_len + 1, size=num).astype(np.int64)


def sample_lengths(w: Workload, num: int) -> tuple[np.ndarray, np.ndarray]:
    """(input_lens, output_lens) exactly as bench_serving draws them for --seed: a fresh
    `np.random.seed(seed)` per run, input lengths first, then output lengths."""
    rng = np.random.RandomState(w.seed)
    inp = compute_random_lens(rng, w.random_input_len, w.random_range_ratio, num)
    out = compute_random_lens(rng, w.random_output_len, w.random_range_ratio, num)
    return inp, out


# ---- images --------------------------------------------------------------------------------

_HXW = re.compile(r"^\s*(\d+)\s*x\s*(\d+)\s*$")


def parse_resolution(text: str) -> tuple[int, int]:
    """bench_serving parse_image_resolution: a preset, or 'HEIGHTxWIDTH'. Returns (width, height)."""
    if text in RESOLUTION_PRESETS:
        return RESOLUTION_PRESETS[text]
    m = _HXW.match(text.strip().lower())
    if m:
        height, width = int(m.group(1)), int(m.group(2))
        if height > 0 and width > 0:
            return width, height
    raise InputError(
        f"bad image resolution {text!r} (use 4k, 1080p, 720p, 360p, HEIGHTxWIDTH such as 1080x1920, or random:HxW-HxW)"
    )


def parse_random_resolution(text: str) -> tuple[tuple[int, int], tuple[int, int]] | None:
    """`random:<min_h>x<min_w>-<max_h>x<max_w>` -> ((min_w, min_h), (max_w, max_h)); None if fixed."""
    prefix = "random:"
    if not text.strip().lower().startswith(prefix):
        return None
    bounds = text.strip()[len(prefix) :].split("-", 1)
    if len(bounds) != 2:
        raise InputError(f"bad image resolution {text!r} (random form is random:HxW-HxW, e.g. random:256x256-1024x1024)")
    lo, hi = parse_resolution(bounds[0]), parse_resolution(bounds[1])
    if lo[0] > hi[0] or lo[1] > hi[1]:
        raise InputError(f"bad image resolution {text!r}: minimum exceeds maximum")
    return lo, hi


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """transformers Qwen2-VL image processor's smart_resize (also used by Qwen2.5-VL and
    Qwen3-VL): (resized_height, resized_width), multiples of `factor`, pixels within
    [min_pixels, max_pixels], aspect ratio kept. Python's round (half to even), as there."""
    if height < 1 or width < 1:
        raise InputError(f"image size must be positive, got {height}x{width}")
    if max(height, width) / min(height, width) > 200:
        raise InputError(f"image aspect ratio must be under 200, got {height}x{width}")
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def image_tokens(width: int, height: int, model_family: str) -> int:
    """Prompt tokens one image adds for a Qwen-VL family: merged patches + start/end."""
    if model_family not in MODEL_FAMILIES:
        raise InputError(f"unknown model family {model_family!r} (choose {', '.join(MODEL_FAMILIES)})")
    patch, merge, lo, hi = MODEL_FAMILIES[model_family]
    factor = patch * merge
    h, w = smart_resize(height, width, factor, lo, hi)
    return (h // factor) * (w // factor) + VISION_EDGE_TOKENS


def request_prompt_tokens(w: Workload, input_lens: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Server-side prompt tokens per request (text + chat template + image tokens) and the
    number of images per request."""
    n = len(input_lens)
    tokens = input_lens.astype(np.int64) + w.resolved_chat_template_tokens
    if not w.has_images:
        return tokens, np.zeros(n, dtype=np.int64)
    images = np.full(n, w.image_count, dtype=np.int64)
    fixed = w.fixed_image_tokens()
    if fixed is not None:
        return tokens + fixed * w.image_count, images
    # random:hxw-HxW — bench_serving draws sizes from the same global RNG as the random
    # pixel contents, which cannot be replayed without generating the pixels; a separate
    # seeded generator gives the same distribution (uniform width, then height).
    (w0, h0), (w1, h1) = parse_random_resolution(w.image_resolution)  # type: ignore[misc]
    k = n * w.image_count
    widths = rng.integers(w0, w1 + 1, size=k)
    heights = rng.integers(h0, h1 + 1, size=k)
    cache: dict[tuple[int, int], int] = {}
    per = np.empty(k, dtype=np.int64)
    for i, (ww, hh) in enumerate(zip(widths.tolist(), heights.tolist())):
        t = cache.get((ww, hh))
        if t is None:
            t = cache[(ww, hh)] = image_tokens(ww, hh, w.model_family)
        per[i] = t
    return tokens + per.reshape(n, w.image_count).sum(axis=1), images


# ---- building a Workload -------------------------------------------------------------------

PRESET_DIR = "workloads"
DEFAULT_PRESET = "mi355x-multimodal-pr"

# GPU memory per device by profile `hardware`, for SGLang's chunked_prefill_size default
# (arg_groups/memory_hook.py thresholds: <160 GiB -> 8192, larger -> 16384).
HARDWARE_GPU_MEMORY_GIB = {
    "a100": 80.0,
    "h100": 80.0,
    "h200": 141.0,
    "b200": 180.0,
    "gb200": 186.0,
    "mi300x": 192.0,
    "mi325x": 256.0,
    "mi350x": 288.0,
    "mi355x": 288.0,
}


def _setting_name(key: str) -> str:
    """A key as written (kebab or snake case, an SGLang alias such as `tp`) -> its field name."""
    name = snake(key)
    return _SERVER_ALIASES.get(name, name)


def _normalize_table(table: Any, known: Mapping[str, Any], where: str, label: str) -> Any:
    """Keys of one table renamed to their field names; unknown keys stay as written so the
    schema's refusal names them. Two spellings of one setting are refused."""
    if not isinstance(table, Mapping):
        return table  # the schema says it must be a table
    out: dict[str, Any] = {}
    written: dict[str, str] = {}
    for key, value in table.items():
        name = _setting_name(key)
        name = name if name in known else key
        if name in out:
            raise InputError(f"{label}{key}: same setting as {label}{written[name]}", where)
        out[name] = value
        written[name] = key
    return out


def with_settings(w: Workload, settings: Mapping[str, Any]) -> Workload:
    """A copy of `w` with already validated settings (field name -> value) applied."""
    step_changes = {k: v for k, v in settings.items() if k in _STEP_FIELDS}
    changes = {k: v for k, v in settings.items() if k not in _STEP_FIELDS}
    if step_changes:
        changes["step"] = replace(w.step, **step_changes)
    return replace(w, **changes)


def _set_values(model: pydantic.BaseModel) -> dict[str, Any]:
    return model.model_dump(exclude_none=True)


def preset_names() -> list[str]:
    from importlib import resources

    base = resources.files("bcgtune") / "data" / PRESET_DIR
    try:
        return sorted(e.name[:-5] for e in base.iterdir() if e.name.endswith(".toml"))
    except (FileNotFoundError, NotADirectoryError):
        return []


def _preset_bytes(name: str) -> bytes | None:
    from importlib import resources

    if name not in preset_names():
        return None
    return (resources.files("bcgtune") / "data" / PRESET_DIR / f"{name}.toml").read_bytes()


def _is_path(path_or_name: str) -> bool:
    return Path(path_or_name).is_file() or path_or_name.endswith(".toml") or "/" in path_or_name


def read_workload_document(path_or_name: str) -> tuple[WorkloadFile, str, str]:
    """A workload TOML (path) or shipped preset (name), validated: (document, where, the
    name it goes by when it gives none)."""
    from bcgtune import fileio

    if _is_path(path_or_name):
        where = fileio.display_path(path_or_name)
        data = fileio.read_toml(path_or_name, "workload file")
        default_name = Path(path_or_name).stem
    else:
        raw = _preset_bytes(path_or_name)
        if raw is None:
            names = ", ".join(preset_names()) or "none"
            raise InputError(f"no workload file or preset named {path_or_name!r} (presets: {names})")
        where = f"preset {path_or_name}"
        data = fileio.parse_toml(raw, where)
        default_name = path_or_name
    data = {
        key: _normalize_table(value, SECTIONS[key].model_fields, where, f"[{key}].") if key in SECTIONS else value
        for key, value in data.items()
    }
    doc = schema.validate(WorkloadFile, data, where, style="toml")
    return doc, where, default_name


def load_workload_file(path_or_name: str, base: Workload | None = None) -> Workload:
    """A workload TOML (path) or a shipped preset (name) applied over `base`. Layout:

        name = "..."              # optional
        description = "..."       # optional
        profile = "mi355x"        # optional: server settings from a profile, then [server] on top
        [client]  dataset_name, num_prompts, random_input_len, ... (bench_serving's names)
        [server]  chunked_prefill_size, max_running_requests, ... (SGLang's names)
        [step_time]  prefill_floor_ms, decode_base_ms, ...

    Strict: an unknown key, a wrong type or a value out of bounds is an error naming the
    file and `[table].key` (WorkloadFile is the schema)."""
    doc, where, default_name = read_workload_document(path_or_name)
    w = base if base is not None else Workload()
    if doc.profile is not None:
        w = apply_profile(w, doc.profile)
    for section in SECTIONS:
        w = with_settings(w, _set_values(getattr(doc, section)))
    name = doc.name if doc.name is not None else default_name
    return replace(w, name=name).validate(where)


def profile_server_settings(path_or_name: str) -> dict[str, Any]:
    """The `[server]` table of a profile (snake_case SGLang flags) plus `gpu_memory_gib` when
    the profile names known hardware."""
    from bcgtune.adapters.profiles import load_profile

    prof = load_profile(path_or_name)
    out = dict(prof.server)
    hardware = str(prof.hardware or "").lower()
    if hardware in HARDWARE_GPU_MEMORY_GIB and "gpu_memory_gib" not in out:
        out["gpu_memory_gib"] = HARDWARE_GPU_MEMORY_GIB[hardware]
    return out


def apply_profile(w: Workload, path_or_name: str) -> Workload:
    """Server settings the simulator models, from a profile; other flags are not its business."""
    where = str(path_or_name)
    server = profile_server_settings(path_or_name)
    modelled = {k: v for k, v in server.items() if _setting_name(k) in ServerSettings.model_fields}
    table = _normalize_table(modelled, ServerSettings.model_fields, where, "[server].")
    return with_settings(w, _set_values(schema.validate(ServerSettings, table, where, style="toml", prefix=("server",))))


def check_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """Option values as the CLI parsed them (comma lists as strings; ints, floats, bools
    otherwise) -> validated settings by field name. Errors name the field."""
    given: dict[str, Any] = {}
    for key, value in options.items():
        name = _setting_name(key)
        if name in _LIST_FIELDS and isinstance(value, str):
            value = schema.parse_int_list(value, None, item=_LIST_FIELDS[name], field=name, max_items=LEVELS_MAX)
        given[name] = value
    return _set_values(schema.validate(WorkloadSettings, given, None, as_fields=True))


def workload_from_options(
    workload: str | None = None,
    profile: str | None = None,
    **options: Any,
) -> Workload:
    """The CLI's mapping: defaults <- `workload` (file or preset) <- `profile` <- each option
    given (None = not given). Option values arrive as the CLI parsed them (strings for the
    comma lists, floats/ints/bools otherwise); errors name the option's field."""
    w = Workload()
    if workload:
        w = load_workload_file(workload, w)
    if profile:
        w = apply_profile(w, profile)
    given = {k: v for k, v in options.items() if v is not None}
    if given:
        w = with_settings(w, check_options(given))
    return w.validate()


def default_workload() -> Workload:
    """The image benchmark of the Qwen multimodal breakable-prefill pull request (SGLang,
    MI355X) on the mi355x profile's server settings: the shipped preset of that name."""
    return load_workload_file(DEFAULT_PRESET)
