"""A local Hugging Face checkpoint (transformers, local files only) as a prefill model.

The capture artifact and its fix. transformers' SDPA path decides per call whether it may
skip the attention mask and use `is_causal=True`: `masking_utils._ignore_causal_mask_sdpa`
skips it only when not "tracing", and transformers' `is_tracing()` counts CUDA stream
capture as tracing (`torch.cuda.is_current_stream_capturing()`). So in eager mode the model
calls SDPA with no mask and `is_causal=True` (flash attention, GQA in-kernel), while under
capture it materializes a [1, 1, N, N] boolean mask and calls SDPA with it: flash attention
cannot take a mask, torch falls back to the memory-efficient kernel, and `use_gqa_in_sdpa`
also turns GQA off, so K/V are copied to all query heads first. The captured graph then runs
different, slower kernels than eager (quadratic mask traffic: slower above ~2k tokens) and
differs numerically.

`fix_attention=True` registers an attention function (and a no-mask mask function) under
the name `bcgtune_causal_sdpa`: always `is_causal=True` with in-kernel GQA and no mask, in
eager and capture alike. That is exact for what the whole-forward engine runs: one sequence,
no KV cache, padding only at the end (real tokens never attend to pads). Under the breakable
engine the same registered function hands q/k/v to the engine's varlen attention instead
(attention within each request of the batch, on the real rows only). Models with sliding-window or
chunked attention are refused, since a plain causal mask would be wrong for them.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from bcgtune.engines.attention import current_varlen_attention
from bcgtune.errors import ExternalError, InputError

ATTN_NAME = "bcgtune_causal_sdpa"
_REGISTERED: list[bool] = []  # transformers' registries are process-wide: register once


def _causal_sdpa(module, query, key, value, attention_mask=None, dropout=0.0, scaling=None, is_causal=None, **kwargs):
    nh, nkv = query.shape[1], key.shape[1]
    varlen = current_varlen_attention()
    if varlen is not None:  # the breakable engine: several requests, attention within each
        q, k, v = (z[0].transpose(0, 1).contiguous() for z in (query, key, value))  # [T, heads, hd]
        return varlen(q, k, v, scale=scaling).unsqueeze(0), None
    if nh != nkv and not getattr(module, "bcgtune_native_gqa", True):
        key = key.repeat_interleave(nh // nkv, dim=1)
        value = value.repeat_interleave(nh // nkv, dim=1)
    out = torch.nn.functional.scaled_dot_product_attention(
        query,
        key,
        value,
        is_causal=query.shape[2] > 1,
        scale=scaling,
        enable_gqa=nh != key.shape[1],
    )
    return out.transpose(1, 2).contiguous(), None


def _no_mask(*args, **kwargs):
    return None


def register_attention() -> None:
    if _REGISTERED:
        return
    from transformers import AttentionInterface

    AttentionInterface.register(ATTN_NAME, _causal_sdpa)
    try:
        from transformers.masking_utils import AttentionMaskInterface

        AttentionMaskInterface.register(ATTN_NAME, _no_mask)
    except ImportError:  # older transformers: masks were built per model from config
        pass
    _REGISTERED.append(True)


class HFPrefillModel(nn.Module):
    """transformers causal LM behind the engine's signature forward(ids, positions, last_index)."""

    input_kind = "ids"
    deepstack_layers = 0
    transformers_version: str | None = None

    def __init__(self, lm, name: str, attention: str):
        super().__init__()
        self.lm = lm
        self.base = lm.get_decoder() if hasattr(lm, "get_decoder") else lm.model
        self.head = lm.get_output_embeddings()
        self.name = name
        self.attention_impl = attention
        cfg = lm.config
        self.hidden_size = int(cfg.hidden_size)
        self.vocab_size = int(cfg.vocab_size)
        self.cfg = cfg

    def embed(self, ids):
        return self.base.get_input_embeddings()(ids)

    def logits(self, hidden):
        return self.head(hidden)

    def body(self, ids, positions, deepstack=None):
        if deepstack is not None:
            raise InputError(f"{self.name} takes no DeepStack embeddings (a text model)")
        return self.base(input_ids=ids[None], position_ids=positions[None], use_cache=False)[0][0]

    def forward(self, ids, positions, last_index, deepstack=None):
        hidden = self.body(ids, positions, deepstack)
        return hidden, self.head(hidden.index_select(0, last_index))

    def describe(self) -> dict:
        c = self.cfg
        return {
            "source": "transformers",
            "name": self.name,
            "architecture": (getattr(c, "architectures", None) or [type(self.lm).__name__])[0],
            "attention_implementation": self.attention_impl,
            "hidden_size": self.hidden_size,
            "vocab_size": self.vocab_size,
            "num_layers": getattr(c, "num_hidden_layers", None),
            "num_heads": getattr(c, "num_attention_heads", None),
            "num_kv_heads": getattr(c, "num_key_value_heads", None),
            "params": sum(p.numel() for p in self.lm.parameters()),
        }


@dataclass(frozen=True)
class _TextShape:
    """What the engines read of a vision-language checkpoint's language model."""

    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vision: Any  # engines.shapes.VisionConfig: the image geometry and token ids
    architectures: tuple[str, ...] = ()


class _HFVision(nn.Module):
    """A Qwen3-VL checkpoint's vision tower behind the interface of the built-in models'
    vision stub: `grid(h, w)` and `forward(pixels [C, H, W]) -> [tokens, H * (1 +
    deepstack)]`, the merged embedding then each DeepStack feature (the layout SGLang's
    separate_deepstack_embeds splits, srt/models/qwen3_vl.py)."""

    def __init__(self, tower: nn.Module, vision: Any, temporal_patch_size: int):
        super().__init__()
        self.tower = tower
        self.vc = vision
        self.temporal = int(temporal_patch_size)

    def grid(self, height: int, width: int) -> tuple[int, int]:
        unit = self.vc.patch_size * self.vc.merge_size
        return max(1, round(height / unit)), max(1, round(width / unit))

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        """pixels [C, H, W], H and W multiples of patch * merge. Patches in the order of
        transformers' Qwen2-VL image processor (models/qwen2_vl/image_processing_qwen2_vl.py,
        `patchify`): merge windows row by row, the frame repeated over the temporal patch."""
        c, hh, ww = pixels.shape
        p, m, t = self.vc.patch_size, self.vc.merge_size, self.temporal
        gh, gw = hh // p, ww // p
        patches = pixels.reshape(c, gh // m, m, p, gw // m, m, p).permute(1, 4, 2, 5, 0, 3, 6)
        flat = patches.unsqueeze(5).expand(-1, -1, -1, -1, -1, t, -1, -1).reshape(gh * gw, c * t * p * p)
        out = self.tower(flat, grid_thw=torch.tensor([[1, gh, gw]], device=pixels.device))
        return torch.cat([out.pooler_output, *out.deepstack_features], dim=1)


class HFVisionLanguageModel(nn.Module):
    """A Qwen3-VL-style checkpoint (transformers' image-text-to-text model whose vision config
    declares deepstack_visual_indexes) behind the engines' signature: merged input
    embeddings, 3-axis positions, and DeepStack. The language model runs as transformers
    builds it; DeepStack slice i is added to decoder layer i's output by a forward hook, on
    every row of a tensor that is zero off the image tokens. That is the sums of transformers'
    own `Qwen3VLTextModel._deepstack_process` (an add at the visual positions after layer i,
    models/qwen3_vl/modeling_qwen3_vl.py) and of SGLang's Qwen3LLMModel.forward, without its
    boolean indexing (a host sync, which no CUDA graph can hold)."""

    input_kind = "embeds"
    transformers_version: str | None = None

    def __init__(self, lm, name: str, attention: str):
        super().__init__()
        from bcgtune.engines.shapes import VisionConfig

        self.lm = lm
        core = lm.model
        self.language = core.language_model
        self.head = lm.get_output_embeddings()
        self.name = name
        self.attention_impl = attention
        top, text, vcfg = lm.config, lm.config.text_config, lm.config.vision_config
        self.hidden_size = int(text.hidden_size)
        self.vocab_size = int(text.vocab_size)
        self.deepstack_layers = len(vcfg.deepstack_visual_indexes)
        vision = VisionConfig(
            patch_size=int(vcfg.patch_size),
            merge_size=int(vcfg.spatial_merge_size),
            in_channels=int(vcfg.in_channels),
            hidden_size=int(vcfg.hidden_size),
            image_token_id=int(top.image_token_id),
            vision_start_id=int(top.vision_start_token_id),
            vision_end_id=int(top.vision_end_token_id),
            deepstack=self.deepstack_layers,
        )
        heads = int(text.num_attention_heads)
        self.cfg = _TextShape(
            int(text.num_hidden_layers),
            heads,
            int(getattr(text, "num_key_value_heads", None) or heads),
            int(getattr(text, "head_dim", None) or self.hidden_size // heads),
            vision,
            tuple(getattr(top, "architectures", None) or [type(lm).__name__]),
        )
        self.visual = _HFVision(core.visual, vision, int(getattr(vcfg, "temporal_patch_size", 2)))
        self.embed_tokens = self.language.embed_tokens
        self._deepstack: torch.Tensor | None = None
        for i in range(self.deepstack_layers):
            self.language.layers[i].register_forward_hook(functools.partial(self._add_deepstack, i))

    def _add_deepstack(self, i: int, module, args, output):
        ds = self._deepstack
        if ds is None:
            return None
        h = self.hidden_size
        if isinstance(output, tuple):
            return (output[0] + ds[:, i * h : (i + 1) * h], *output[1:])
        return output + ds[:, i * h : (i + 1) * h]

    def embed(self, ids):
        return self.embed_tokens(ids)

    def logits(self, hidden):
        return self.head(hidden)

    def body(self, embeds, positions, deepstack=None):
        pos = positions[:, None, :] if positions.dim() == 2 else positions[None]
        self._deepstack = deepstack
        try:
            out = self.language(inputs_embeds=embeds[None], position_ids=pos, use_cache=False)
        finally:
            self._deepstack = None
        return out[0][0]

    def forward(self, embeds, positions, last_index, deepstack=None):
        hidden = self.body(embeds, positions, deepstack)
        return hidden, self.head(hidden.index_select(0, last_index))

    def describe(self) -> dict:
        c = self.cfg
        return {
            "source": "transformers",
            "name": self.name,
            "architecture": c.architectures[0] if c.architectures else type(self.lm).__name__,
            "attention_implementation": self.attention_impl,
            "hidden_size": self.hidden_size,
            "vocab_size": self.vocab_size,
            "num_layers": c.num_hidden_layers,
            "num_heads": c.num_attention_heads,
            "num_kv_heads": c.num_key_value_heads,
            "deepstack_layers": self.deepstack_layers,
            "vision": {"patch_size": c.vision.patch_size, "merge_size": c.vision.merge_size},
            "params": sum(p.numel() for p in self.lm.parameters()),
        }


def declares_deepstack(config) -> bool:
    """Does a checkpoint's config declare Qwen3-VL's DeepStack (its vision config's
    deepstack_visual_indexes)?"""
    vision = getattr(config, "vision_config", None)
    return vision is not None and isinstance(getattr(vision, "deepstack_visual_indexes", None), (list, tuple))


def load_hf_model(
    path: str,
    device: torch.device,
    dtype=torch.bfloat16,
    fix_attention: bool = True,
    random_weights: bool = False,
    seed: int = 0,
    config_overrides: dict | None = None,
    native_gqa: bool = True,
) -> HFPrefillModel | HFVisionLanguageModel:
    """A causal LM, or a vision-language model whose config declares DeepStack (then its
    language model runs the attention fix and its vision tower transformers' SDPA: the
    fix's causal mask would be wrong for an image's bidirectional attention). The folder,
    the config's attention window and the weights' presence were checked when the run was
    resolved (engines/config.py); `native_gqa`: whether SDPA's pinned backend takes
    enable_gqa (the session's probe)."""
    p = Path(path)
    try:
        import transformers
        from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText
    except ImportError:
        raise ExternalError("loading a checkpoint needs transformers (pip install 'bcgtune[hf]')") from None
    try:
        config = AutoConfig.from_pretrained(str(p), local_files_only=True)
    except Exception as exc:
        raise InputError(f"cannot read config.json: {' '.join(str(exc).split())[:300]}", path) from None
    for k, v in (config_overrides or {}).items():
        setattr(config, k, v)
    vl = declares_deepstack(config)
    if fix_attention:
        register_attention()
    attn = ATTN_NAME if fix_attention else "sdpa"
    attn_arg: Any = {"text_config": attn, "vision_config": "sdpa"} if vl else attn
    auto = AutoModelForImageTextToText if vl else AutoModelForCausalLM
    torch.manual_seed(seed)
    try:
        if random_weights:
            with torch.device(device):
                lm = auto.from_config(config, attn_implementation=attn_arg, dtype=dtype)
        else:
            try:
                lm = auto.from_pretrained(str(p), config=config, local_files_only=True, dtype=dtype, attn_implementation=attn_arg)
            except TypeError:  # transformers 4.x spells it torch_dtype
                lm = auto.from_pretrained(
                    str(p), config=config, local_files_only=True, torch_dtype=dtype, attn_implementation=attn_arg
                )
            lm = lm.to(device)  # type: ignore[arg-type]  # transformers' stub of `to`
    except (OSError, ValueError, KeyError) as exc:
        raise InputError(f"transformers could not load it: {' '.join(str(exc).split())[:300]}", path) from None
    lm = lm.to(dtype=dtype)
    lm.eval()
    lm.requires_grad_(False)
    model: HFPrefillModel | HFVisionLanguageModel
    model = HFVisionLanguageModel(lm, name=p.name, attention=attn) if vl else HFPrefillModel(lm, name=p.name, attention=attn)
    model.transformers_version = transformers.__version__
    for module in lm.modules():  # read by the registered attention function
        module.bcgtune_native_gqa = native_gqa
    return model
