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

from pathlib import Path

import torch
from torch import nn

from bcgtune.engines.attention import current_varlen_attention
from bcgtune.errors import ExternalError, InputError

ATTN_NAME = "bcgtune_causal_sdpa"
_STATE = {"native_gqa": True, "registered": False}


def _causal_sdpa(module, query, key, value, attention_mask=None, dropout=0.0, scaling=None, is_causal=None, **kwargs):
    nh, nkv = query.shape[1], key.shape[1]
    varlen = current_varlen_attention()
    if varlen is not None:  # the breakable engine: several requests, attention within each
        q, k, v = (z[0].transpose(0, 1).contiguous() for z in (query, key, value))  # [T, heads, hd]
        return varlen(q, k, v, scale=scaling).unsqueeze(0), None
    if nh != nkv and not _STATE["native_gqa"]:
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
    if _STATE["registered"]:
        return
    from transformers import AttentionInterface

    AttentionInterface.register(ATTN_NAME, _causal_sdpa)
    try:
        from transformers.masking_utils import AttentionMaskInterface

        AttentionMaskInterface.register(ATTN_NAME, _no_mask)
    except ImportError:  # older transformers: masks were built per model from config
        pass
    _STATE["registered"] = True


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


def _has_weights(path: Path) -> bool:
    return any(path.glob("*.safetensors")) or any(path.glob("*.bin")) or any(path.glob("*.safetensors.index.json"))


def load_hf_model(
    path: str,
    device: torch.device,
    dtype=torch.bfloat16,
    fix_attention: bool = True,
    random_weights: bool = False,
    seed: int = 0,
    config_overrides: dict | None = None,
) -> HFPrefillModel:
    p = Path(path)
    if not p.is_dir() or not (p / "config.json").is_file():
        raise InputError("not a Hugging Face checkpoint folder (needs config.json)", path)
    try:
        import transformers
        from transformers import AutoConfig, AutoModelForCausalLM
    except ImportError:
        raise ExternalError("loading a checkpoint needs transformers (pip install 'bcgtune[hf]')") from None
    try:
        config = AutoConfig.from_pretrained(str(p), local_files_only=True)
    except Exception as exc:
        raise InputError(f"cannot read config.json: {' '.join(str(exc).split())[:300]}", path) from None
    for k, v in (config_overrides or {}).items():
        setattr(config, k, v)
    if fix_attention:
        if getattr(config, "use_sliding_window", False) or getattr(config, "attention_chunk_size", None):
            raise InputError(
                "sliding-window/chunked attention: the causal-SDPA fix would be wrong; pass --hf-attention sdpa", path
            )
        register_attention()
    attn = ATTN_NAME if fix_attention else "sdpa"
    if not random_weights and not _has_weights(p):
        raise InputError("no weights (*.safetensors / *.bin) in the folder; pass --random-weights to use random ones", path)
    torch.manual_seed(seed)
    try:
        if random_weights:
            with torch.device(device):
                lm = AutoModelForCausalLM.from_config(config, attn_implementation=attn, dtype=dtype)
        else:
            try:
                lm = AutoModelForCausalLM.from_pretrained(
                    str(p), config=config, local_files_only=True, dtype=dtype, attn_implementation=attn
                )
            except TypeError:  # transformers 4.x spells it torch_dtype
                lm = AutoModelForCausalLM.from_pretrained(
                    str(p), config=config, local_files_only=True, torch_dtype=dtype, attn_implementation=attn
                )
            lm = lm.to(device)  # type: ignore[arg-type]  # transformers' stub of `to`
    except (OSError, ValueError, KeyError) as exc:
        raise InputError(f"transformers could not load it: {' '.join(str(exc).split())[:300]}", path) from None
    lm = lm.to(dtype=dtype)
    lm.eval()
    lm.requires_grad_(False)
    model = HFPrefillModel(lm, name=p.name, attention=attn)
    model.transformers_version = transformers.__version__
    return model
