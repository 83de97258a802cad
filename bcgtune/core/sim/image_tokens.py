"""How many prompt tokens an image adds, as SGLang's Qwen-VL processors count them, and how
bench_serving spells an image resolution.

Checked against SGLang 0.5.23 source (PyPI wheel):
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
from typing import Literal

from bcgtune.errors import InputError

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
