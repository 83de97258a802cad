"""`--model` resolution: a built-in random-initialized architecture or a local HF folder."""

from __future__ import annotations

import os
from typing import Any

import torch

from bcgtune.errors import InputError

DTYPES = {
    "bf16": torch.bfloat16,
    "bfloat16": torch.bfloat16,
    "fp16": torch.float16,
    "float16": torch.float16,
    "fp32": torch.float32,
    "float32": torch.float32,
}


def parse_dtype(name: str, device: torch.device):
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if name not in DTYPES:
        raise InputError(f"unknown dtype {name!r} (auto, bf16, fp16, fp32)", "--dtype")
    return DTYPES[name]


def probe_native_gqa(device: torch.device, dtype, sdpa_backend: str) -> bool:
    """Does the pinned SDPA backend take enable_gqa? (flash does on recent torch; if not,
    the models repeat K/V heads themselves, identically in eager and capture.)"""
    from bcgtune.engines.sdpa import sdpa_context

    q = torch.randn(1, 4, 8, 64, device=device, dtype=dtype)
    k = torch.randn(1, 2, 8, 64, device=device, dtype=dtype)
    try:
        with sdpa_context(sdpa_backend):
            torch.nn.functional.scaled_dot_product_attention(q, k, k, is_causal=True, enable_gqa=True)
        return True
    except RuntimeError:
        return False


def load_model(
    spec: str,
    device: torch.device,
    dtype,
    sdpa_backend: str = "auto",
    seed: int = 0,
    hf_fix_attention: bool = True,
    random_weights: bool = False,
) -> tuple[Any, dict[str, Any]]:
    """Returns (model, description dict): a built-in DecoderLM or a checkpoint's HFPrefillModel."""
    from bcgtune.engines import models as M

    model: Any

    native = probe_native_gqa(device, dtype, sdpa_backend)
    if spec.startswith("hf:") or os.path.isdir(spec):
        from bcgtune.engines import hf

        path = spec[3:] if spec.startswith("hf:") else spec
        hf._STATE["native_gqa"] = native
        model = hf.load_hf_model(path, device, dtype, fix_attention=hf_fix_attention, random_weights=random_weights, seed=seed)
        desc = model.describe()
        desc["transformers"] = getattr(model, "transformers_version", None)
        desc["random_weights"] = random_weights
    else:
        cfg = M.preset(spec)
        model = M.build_model(cfg, device, dtype=dtype, seed=seed)
        for layer in model.layers:
            layer.self_attn.native_gqa = native
        desc = {"source": "built-in", "name": cfg.name, "random_weights": True, "seed": seed, **cfg.to_dict()}
    desc["dtype"] = str(dtype).replace("torch.", "")
    desc["sdpa_native_gqa"] = native
    return model, desc
