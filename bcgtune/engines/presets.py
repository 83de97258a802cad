"""The built-in model shapes, without torch: read before any model is built (to refuse a
run that cannot work, in well under a second) and by the torch models in models.py.

`max_context` is the model's context length (Hugging Face `max_position_embeddings`): a
prefill bucket larger than it is refused before capture."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace

from bcgtune.errors import InputError


@dataclass(frozen=True)
class VisionConfig:
    patch_size: int = 16
    merge_size: int = 2
    in_channels: int = 3
    hidden_size: int = 1024
    image_token_id: int = 151655
    vision_start_id: int = 151652
    vision_end_id: int = 151653
    # DeepStack: how many visual feature maps the vision tower taps (Qwen3-VL: the outputs of
    # its blocks deepstack_visual_indexes = [8, 16, 24], sglang srt/configs/qwen3_vl.py), each
    # added to the hidden states after one of the first `deepstack` decoder layers, on the
    # image tokens' rows. 0: a model without DeepStack.
    deepstack: int = 0


@dataclass(frozen=True)
class DecoderConfig:
    name: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float = 1_000_000.0
    rms_eps: float = 1e-6
    tie_embeddings: bool = False
    vision: VisionConfig | None = None
    mrope_section: tuple[int, int, int] = (24, 20, 20)
    max_context: int = 40960
    extra: dict = field(default_factory=dict)

    @property
    def input_kind(self) -> str:
        return "embeds" if self.vision is not None else "ids"

    def params(self) -> int:
        h, i, v = self.hidden_size, self.intermediate_size, self.vocab_size
        attn = h * self.head_dim * (self.num_heads * 2 + self.num_kv_heads * 2) + 2 * self.head_dim
        layer = attn + 3 * h * i + 2 * h
        emb = v * h * (1 if self.tie_embeddings else 2)
        return self.num_layers * layer + emb + h

    def to_dict(self) -> dict:
        d = asdict(self)
        d["params"] = self.params()
        d["input_kind"] = self.input_kind
        return d


_TINY_VISION = VisionConfig(hidden_size=32, image_token_id=500, vision_start_id=501, vision_end_id=502, deepstack=2)

PRESETS: dict[str, DecoderConfig] = {
    # For CPU tests: runs a forward in milliseconds.
    "tiny": DecoderConfig("tiny", 512, 64, 128, 2, 4, 2, 16, rope_theta=10_000.0, max_context=16384),
    "qwen3-0.6b": DecoderConfig("qwen3-0.6b", 151936, 1024, 3072, 28, 16, 8, 128, tie_embeddings=True),
    "qwen3-8b": DecoderConfig("qwen3-8b", 151936, 4096, 12288, 36, 32, 8, 128),
    "qwen3-vl-tiny": DecoderConfig(
        "qwen3-vl-tiny",
        512,
        64,
        128,
        2,
        4,
        2,
        16,
        rope_theta=10_000.0,
        vision=_TINY_VISION,
        mrope_section=(4, 2, 2),
        max_context=16384,
    ),
    "qwen3-vl-8b": DecoderConfig(
        "qwen3-vl-8b", 151936, 4096, 12288, 36, 32, 8, 128, vision=VisionConfig(deepstack=3), max_context=262144
    ),
}


def preset(name: str, **overrides) -> DecoderConfig:
    if name not in PRESETS:
        raise InputError(f"unknown built-in model {name!r} (one of {', '.join(PRESETS)})", "--model")
    cfg = PRESETS[name]
    return replace(cfg, **overrides) if overrides else cfg
