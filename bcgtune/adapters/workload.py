"""Workload: a benchmark client (SGLang's bench_serving) plus the server settings that shape
its prefill batches, as one validated value the simulator plays.

Sources, later ones winning: built-in defaults (bench_serving's and SGLang's own) <- a
workload TOML or shipped preset (`--workload`) <- a profile's `[server]` (`--profile`) <-
explicit CLI options. Names are bench_serving's / SGLang's, snake_case.

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
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np

from bcgtune.errors import InputError

DATASETS = ("random-ids", "random", "image")

# (patch, merge, min_pixels, max_pixels) from the models' preprocessor_config.json:
# Qwen2-VL / Qwen2.5-VL: min_pixels 3136, max_pixels 12845056; Qwen3-VL: size.shortest_edge
# 65536, size.longest_edge 16777216 (pixel counts, despite the names).
MODEL_FAMILIES: dict[str, tuple[int, int, int, int]] = {
    "qwen2-vl": (14, 2, 3136, 12845056),
    "qwen2.5-vl": (14, 2, 3136, 12845056),
    "qwen3-vl": (16, 2, 65536, 16777216),
}
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


@dataclass
class StepTimeModel:
    """How long the server's steps take, in milliseconds; orders arrivals and completions.

    Defaults come from /work/shared/docs/h200-measurements.md (Qwen3-8B-shaped decoder, one
    H200, eager): prefill_ms(n) = max(9.5, 0.99 + 0.02623 n + 6.85e-7 n^2) fits the lean
    eager column within 2.5% from 512 to 8192 tokens and its ~9.5 ms launch-bound floor
    below. Decode: the lean replay time at 16 tokens (5.6 ms) as the base, plus a KV-read
    term of 3.0e-5 ms per context token (that model's 144 KiB of KV per token at ~4.8 TB/s).
    Vision encoder and client costs are plausible guesses, not measurements. A calibration
    (issue 5's t_eager(n)) replaces the polynomial: pass `prefill_curve`, a callable taking
    an int array of forward sizes and returning milliseconds."""

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

    def prefill_table(self, max_tokens: int) -> list[float]:
        """Prefill forward time in seconds for every size 0..max_tokens (a list: O(1) lookups)."""
        n = np.arange(max_tokens + 1, dtype=np.int64)
        if self.prefill_curve is not None:
            ms = np.asarray(self.prefill_curve(n), dtype=np.float64)
            if ms.shape != n.shape or not np.all(np.isfinite(ms)) or (ms < 0).any():
                raise InputError("prefill_curve must return finite non-negative milliseconds per size")
        else:
            nf = n.astype(np.float64)
            ms = np.maximum(self.prefill_floor_ms, self.prefill_c0_ms + self.prefill_c1_ms * nf + self.prefill_c2_ms * nf * nf)
        return (ms / 1000.0).tolist()

    def to_dict(self) -> dict[str, Any]:
        d = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "prefill_curve"}
        d["prefill_curve"] = None if self.prefill_curve is None else getattr(self.prefill_curve, "__name__", "callable")
        return d


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
    def resolved_chunked_prefill_size(self) -> int:
        """Per scheduler (DP rank): SGLang divides by dp size under DP attention."""
        from bcgtune.core.ladder import default_chunked_prefill_size

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

    def validate(self, where: str | None = None) -> "Workload":
        def bad(what: str) -> InputError:
            return InputError(what, where)

        if self.dataset_name not in DATASETS:
            raise bad(f"unknown dataset {self.dataset_name!r} (choose {', '.join(DATASETS)})")
        if self.model_family not in MODEL_FAMILIES:
            raise bad(f"unknown model family {self.model_family!r} (choose {', '.join(MODEL_FAMILIES)})")
        for name in ("random_input_len", "random_output_len", "image_count", "warmup_requests", "prefill_decode_interval"):
            v = getattr(self, name)
            if v < 0:
                raise bad(f"--{_flag(name)} must not be negative, got {v}")
        if self.random_input_len == 0:
            raise bad("--random-input-len must be at least 1")
        if not (0.0 <= self.random_range_ratio <= 1.0):
            raise bad(f"--random-range-ratio must be in [0, 1], got {self.random_range_ratio:g}")
        if not self.num_prompts or any(n < 1 for n in self.num_prompts):
            raise bad(f"--num-prompts must be at least 1, got {','.join(map(str, self.num_prompts)) or 'nothing'}")
        if any(c < 1 for c in self.max_concurrency):
            raise bad(f"--max-concurrency must be at least 1, got {min(self.max_concurrency)}")
        if len(self.num_prompts) > 1 and len(self.num_prompts) != len(self.levels):
            raise bad(
                f"--num-prompts lists {len(self.num_prompts)} values for {len(self.levels)} concurrency levels"
            )
        if not (self.request_rate > 0):
            raise bad(f"--request-rate must be positive (inf for a closed loop), got {self.request_rate:g}")
        if self.tokens_per_image is not None and self.tokens_per_image < 0:
            raise bad(f"--tokens-per-image must not be negative, got {self.tokens_per_image}")
        if self.chat_template_tokens is not None and self.chat_template_tokens < 0:
            raise bad(f"--chat-template-tokens must not be negative, got {self.chat_template_tokens}")
        if self.dataset_name == "image":
            if parse_random_resolution(self.image_resolution) is None:
                parse_resolution(self.image_resolution)
        c = self.chunked_prefill_size
        if c is not None and c != -1 and c < 1:
            raise bad(f"--chunked-prefill-size must be positive or -1, got {c}")
        for name in ("max_prefill_tokens", "page_size", "dp_size", "tp_size"):
            if getattr(self, name) < 1:
                raise bad(f"--{_flag(name)} must be at least 1, got {getattr(self, name)}")
        for name in ("max_running_requests", "max_total_tokens", "context_length"):
            v = getattr(self, name)
            if v is not None and v < 1:
                raise bad(f"--{_flag(name)} must be at least 1, got {v}")
        if self.gpu_memory_gib <= 0:
            raise bad(f"gpu_memory_gib must be positive, got {self.gpu_memory_gib:g}")
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


def _flag(name: str) -> str:
    return name.replace("_", "-")


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
        f"bad image resolution {text!r} (use 4k, 1080p, 720p, 360p, HEIGHTxWIDTH such as 1080x1920, "
        "or random:HxW-HxW)"
    )


def parse_random_resolution(text: str) -> tuple[tuple[int, int], tuple[int, int]] | None:
    """`random:<min_h>x<min_w>-<max_h>x<max_w>` -> ((min_w, min_h), (max_w, max_h)); None if fixed."""
    prefix = "random:"
    if not text.strip().lower().startswith(prefix):
        return None
    bounds = text.strip()[len(prefix):].split("-", 1)
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

_CLIENT_KEYS = {
    "dataset_name", "num_prompts", "random_input_len", "random_output_len", "random_range_ratio",
    "image_count", "image_resolution", "max_concurrency", "request_rate", "warmup_requests", "seed",
    "model_family", "tokens_per_image", "chat_template_tokens",
}
_SERVER_KEYS = {
    "chunked_prefill_size", "max_prefill_tokens", "max_running_requests", "page_size",
    "enable_mixed_chunk", "prefill_decode_interval", "disable_radix_cache", "dp_size",
    "enable_dp_attention", "max_total_tokens", "context_length", "tp_size", "gpu_memory_gib",
}
_STEP_KEYS = {f.name for f in fields(StepTimeModel)} - {"prefill_curve"}
_INT_KEYS = {
    "random_input_len", "random_output_len", "image_count", "warmup_requests", "seed", "tokens_per_image",
    "chat_template_tokens", "chunked_prefill_size", "max_prefill_tokens", "max_running_requests", "page_size",
    "prefill_decode_interval", "dp_size", "max_total_tokens", "context_length", "tp_size",
}
_BOOL_KEYS = {"enable_mixed_chunk", "disable_radix_cache", "enable_dp_attention"}
_FLOAT_KEYS = {"random_range_ratio", "request_rate", "gpu_memory_gib"}
_STR_KEYS = {"dataset_name", "image_resolution", "model_family"}
_LIST_KEYS = {"num_prompts", "max_concurrency"}
# SGLang/profile flags the simulator reads under other names.
_SERVER_ALIASES = {"tp": "tp_size", "dp": "dp_size", "tensor_parallel_size": "tp_size", "data_parallel_size": "dp_size"}

PRESET_DIR = "workloads"


def _coerce(key: str, value: Any, where: str) -> Any:
    """One TOML/profile/CLI value into the field's type, or a one-line InputError."""
    def fail(expect: str) -> InputError:
        return InputError(f"{key} must be {expect}, got {value!r}", where)

    if value is None:
        return None
    if key in _BOOL_KEYS:
        if isinstance(value, bool):
            return value
        raise fail("true or false")
    if key in _INT_KEYS:
        if isinstance(value, bool):
            raise fail("an integer")
        if isinstance(value, int):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, str):
            try:
                return int(value.strip())
            except ValueError:
                pass
        raise fail("an integer")
    if key in _FLOAT_KEYS or key in _STEP_KEYS:
        if isinstance(value, bool):
            raise fail("a number")
        if isinstance(value, (int, float)):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value.strip())
            except ValueError:
                pass
        raise fail("a number")
    if key in _STR_KEYS:
        if isinstance(value, str):
            return value.strip()
        raise fail("a string")
    if key in _LIST_KEYS:
        return parse_int_list(value, key, where)
    raise InputError(f"unknown key {key!r}", where)


def parse_int_list(value: Any, key: str = "value", where: str | None = None) -> list[int]:
    """'4,16,32' / '4 16 32' / 4 / [4, 16] -> [4, 16, 32]."""
    if isinstance(value, bool):
        raise InputError(f"{key} must be an integer or a list of integers, got {value!r}", where)
    if isinstance(value, int):
        return [value]
    if isinstance(value, str):
        toks = value.replace(",", " ").split()
        if not toks:
            raise InputError(f"{key} is empty", where)
        out = []
        for t in toks:
            try:
                out.append(int(t))
            except ValueError:
                raise InputError(f"{key}: {t!r} is not an integer", where) from None
        return out
    if isinstance(value, (list, tuple)):
        out = []
        for v in value:
            if isinstance(v, bool) or not isinstance(v, int):
                raise InputError(f"{key}: {v!r} is not an integer", where)
            out.append(v)
        return out
    raise InputError(f"{key} must be an integer or a list of integers, got {value!r}", where)


def _norm(key: str) -> str:
    return key.strip().lstrip("-").replace("-", "_")


def apply_settings(w: Workload, settings: Mapping[str, Any], where: str, *, strict: bool = True) -> Workload:
    """A copy of `w` with client/server/step keys set. `strict`: unknown keys are errors
    (workload files); not strict: keys the simulator does not model are skipped (profiles)."""
    changes: dict[str, Any] = {}
    step_changes: dict[str, Any] = {}
    for raw_key, value in settings.items():
        key = _norm(raw_key)
        key = _SERVER_ALIASES.get(key, key)
        if key in _CLIENT_KEYS or key in _SERVER_KEYS:
            changes[key] = _coerce(key, value, where)
        elif key in _STEP_KEYS:
            step_changes[key] = _coerce(key, value, where)
        elif strict:
            raise InputError(f"unknown key {raw_key!r}", where)
    if step_changes:
        changes["step"] = replace(w.step, **step_changes)
    return replace(w, **changes)


def _read_toml(path: str) -> dict[str, Any]:
    import tomllib

    p = Path(path)
    if not p.is_file():
        raise InputError("no such file", path)
    try:
        with open(p, "rb") as fh:
            return tomllib.load(fh)
    except tomllib.TOMLDecodeError as exc:
        raise InputError(f"invalid TOML: {exc}", path) from None
    except OSError as exc:
        raise InputError(f"cannot read: {exc.strerror}", path) from None


def preset_names() -> list[str]:
    from importlib import resources

    base = resources.files("bcgtune") / "data" / PRESET_DIR
    try:
        return sorted(e.name[:-5] for e in base.iterdir() if e.name.endswith(".toml"))
    except (FileNotFoundError, NotADirectoryError):
        return []


def _preset_text(name: str) -> str | None:
    from importlib import resources

    res = resources.files("bcgtune") / "data" / PRESET_DIR / f"{name}.toml"
    try:
        return res.read_text(encoding="utf-8")
    except (FileNotFoundError, IsADirectoryError, OSError):
        return None


def load_workload_file(path_or_name: str, base: Workload | None = None) -> Workload:
    """A workload TOML (path) or a shipped preset (name). Layout:

        name = "..."              # optional
        description = "..."       # optional
        profile = "mi355x"        # optional: server settings from a profile, then [server] on top
        [client]  dataset_name, num_prompts, random_input_len, ... (bench_serving's names)
        [server]  chunked_prefill_size, max_running_requests, ... (SGLang's names)
        [step_time]  prefill_floor_ms, decode_base_ms, ...

    Strict: an unknown key is an error naming the file and the key."""
    import tomllib

    w = base if base is not None else Workload()
    if Path(path_or_name).is_file() or path_or_name.endswith(".toml") or "/" in path_or_name:
        where = path_or_name
        data = _read_toml(path_or_name)
        default_name = Path(path_or_name).stem
    else:
        text = _preset_text(path_or_name)
        if text is None:
            names = ", ".join(preset_names()) or "none"
            raise InputError(f"no workload file or preset named {path_or_name!r} (presets: {names})")
        where = f"preset {path_or_name}"
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise InputError(f"invalid TOML: {exc}", where) from None
        default_name = path_or_name
    for key in data:
        if key not in ("name", "description", "profile", "client", "server", "step_time"):
            raise InputError(f"unknown key {key!r}", where)
    for section in ("client", "server", "step_time"):
        if section in data and not isinstance(data[section], dict):
            raise InputError(f"[{section}] must be a table", where)
    if "profile" in data:
        if not isinstance(data["profile"], str):
            raise InputError("profile must be a string", where)
        w = apply_profile(w, data["profile"])
    allowed = {"client": _CLIENT_KEYS, "server": _SERVER_KEYS, "step_time": _STEP_KEYS}
    for section, keys in allowed.items():
        table = data.get(section, {})
        for k in table:
            if _SERVER_ALIASES.get(_norm(k), _norm(k)) not in keys:
                raise InputError(f"unknown key {section}.{k}", where)
        w = apply_settings(w, table, where)
    name = data.get("name", default_name)
    return replace(w, name=str(name)).validate(where)


# GPU memory per device by profile `hardware`, for SGLang's chunked_prefill_size default
# (arg_groups/memory_hook.py thresholds: <160 GiB -> 8192, larger -> 16384).
HARDWARE_GPU_MEMORY_GIB = {
    "a100": 80.0, "h100": 80.0, "h200": 141.0, "b200": 180.0, "gb200": 186.0,
    "mi300x": 192.0, "mi325x": 256.0, "mi350x": 288.0, "mi355x": 288.0,
}


def profile_server_settings(path_or_name: str) -> dict[str, Any]:
    """The `[server]` table of a profile (normalized snake_case SGLang flags) plus
    `gpu_memory_gib` when the profile names known hardware: through
    bcgtune.adapters.profiles when present, else read straight from the TOML file."""
    try:
        from bcgtune.adapters import profiles  # written alongside; optional here
    except ImportError:
        profiles = None
    if profiles is not None and hasattr(profiles, "load_profile"):
        prof = profiles.load_profile(path_or_name)
        server = getattr(prof, "server", None)
        if not isinstance(server, Mapping):
            raise InputError("profile has no [server] settings", str(path_or_name))
        out = dict(server)
        hardware = str(getattr(prof, "hardware", "") or "").lower()
    else:
        data = _read_toml(path_or_name)
        server = data.get("server", {})
        if not isinstance(server, dict):
            raise InputError("[server] must be a table", path_or_name)
        out = dict(server)
        meta = data.get("profile", {})
        hardware = str(meta.get("hardware", "") if isinstance(meta, dict) else "").lower()
    if hardware in HARDWARE_GPU_MEMORY_GIB and "gpu_memory_gib" not in out:
        out["gpu_memory_gib"] = HARDWARE_GPU_MEMORY_GIB[hardware]
    return out


def apply_profile(w: Workload, path_or_name: str) -> Workload:
    """Server settings the simulator models, from a profile; other flags are not its business."""
    server = profile_server_settings(path_or_name)
    keep = {k: v for k, v in server.items() if _norm(k) in _SERVER_KEYS or _norm(k) in _SERVER_ALIASES}
    return apply_settings(w, keep, str(path_or_name), strict=False)


def workload_from_options(
    workload: str | None = None,
    profile: str | None = None,
    **options: Any,
) -> Workload:
    """The CLI's mapping: defaults <- --workload (file or preset) <- --profile <- each option
    given (None = not given). Option values arrive as the CLI parsed them (strings for the
    comma lists, floats/ints/bools otherwise)."""
    w = Workload()
    if workload:
        w = load_workload_file(workload, w)
    if profile:
        w = apply_profile(w, profile)
    given = {k: v for k, v in options.items() if v is not None}
    if given:
        w = apply_settings(w, given, "command line")
    return w.validate()


def default_workload() -> Workload:
    """The seeds' benchmark on the mi355x profile's server settings (preset seeds-mi355x)."""
    return load_workload_file("mi355x-multimodal-pr")
