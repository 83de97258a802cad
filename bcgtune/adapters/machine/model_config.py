"""A model's config.json, found on this machine without downloading anything: a local model
folder, or a Hugging Face hub id already in the local Hugging Face cache. What bcgtune reads
from it: whether the model uses multi-head latent attention (SGLang caps the prefill ladder
for those) and whether it is a Qwen4-Exp (Qwen3.8-Flash-Next) multimodal model (the
prefill runner's multimodal gate keys on it).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

QWEN4_EXP_ARCHS = ("Qwen4ExpForConditionalGeneration", "Qwen4ExpForCausalLMMTP")
_QWEN4_NAME_RE = re.compile(r"qwen3\.8-flash-next|qwen4[-_]?exp", re.IGNORECASE)
# A config.json larger than this is not a model config (it is read whole).
MAX_CONFIG_BYTES = 4 * 2**20


def hf_cache_dir() -> Path:
    """Where huggingface_hub keeps downloads (HF_HUB_CACHE, else HF_HOME/hub, else
    ~/.cache/huggingface/hub), without importing it."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    return Path(os.environ.get("XDG_CACHE_HOME", "~/.cache")).expanduser() / "huggingface" / "hub"


def locate_model_config(model: str | None) -> tuple[Path | None, str | None]:
    """(folder holding config.json, None) for a local model folder or a hub id present
    in the local Hugging Face cache; (None, why) otherwise. Never downloads. A relative
    folder is made absolute (SGLang is asked from another working directory)."""
    if not model:
        return None, "the profile names no model ([profile].model or --model-path)"
    local = Path(model).expanduser()
    try:
        if local.is_dir():
            if (local / "config.json").is_file():
                return local.resolve(), None
            return None, f"no config.json in {local}"
    except OSError:
        pass
    parts = model.strip("/").split("/")
    if len(parts) != 2 or not all(parts):
        return None, f"{model!r} is neither a local model folder nor a Hugging Face hub id"
    repo = hf_cache_dir() / ("models--" + "--".join(parts))
    snapshots = repo / "snapshots"
    try:
        ref = (repo / "refs" / "main").read_text(encoding="utf-8").strip()
    except OSError:
        ref = ""
    candidates = [snapshots / ref] if ref else []
    try:
        candidates += sorted(p for p in snapshots.iterdir() if p.is_dir())
    except OSError:
        pass
    for snap in candidates:
        if (snap / "config.json").is_file():
            return snap, None
    return None, f"{model} is not in the local Hugging Face cache ({hf_cache_dir()})"


def read_model_config(folder: Path | None) -> dict[str, Any]:
    """The folder's config.json as a dict ({} when there is none). One that is there but is
    no JSON object (binary, larger than MAX_CONFIG_BYTES, not UTF-8, NaN, nested too deeply)
    is an InputError naming it: read as {}, SGLang's defaults would stand in for the model's
    own limits."""
    from bcgtune.errors import InputError

    if folder is None:
        return {}
    path = folder / "config.json"
    try:
        if not path.is_file():
            return {}
        if path.stat().st_size > MAX_CONFIG_BYTES:
            raise InputError(f"larger than {MAX_CONFIG_BYTES >> 20} MiB: not a model's config.json", str(path))
        data = json.loads(path.read_text(encoding="utf-8"), parse_constant=_no_constant)
    except OSError as exc:
        raise InputError(f"cannot read: {exc.strerror or exc}", str(path)) from None
    except (ValueError, RecursionError) as exc:
        raise InputError(f"not a model's config.json: {' '.join(str(exc).split())[:100]}", str(path)) from None
    if not isinstance(data, dict):
        raise InputError("not a model's config.json: not a JSON object", str(path))
    return data


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number JSON allows")


def text_config(config: dict[str, Any]) -> dict[str, Any]:
    """The language model's part of a multimodal config (`text_config`), else the config."""
    sub = config.get("text_config")
    return sub if isinstance(sub, dict) else config


def is_mla(config: dict[str, Any]) -> bool:
    """Multi-head latent attention models (DeepSeek-V2/V3 family, Kimi, ...) carry
    kv_lora_rank in their config (SGLang: ModelConfig.attention_arch == MLA)."""
    return any(bool(cfg.get("kv_lora_rank")) for cfg in (config, text_config(config)))


def architectures(config: dict[str, Any]) -> list[str]:
    archs = config.get("architectures")
    return [a for a in archs if isinstance(a, str)] if isinstance(archs, list) else []


def model_is_qwen4_exp(model: str | None) -> bool | None:
    """True/False when it can tell (the model's config.json in a local folder or the local
    Hugging Face cache, or the checkpoint's name), None when it cannot."""
    if not model:
        return None
    folder, _ = locate_model_config(model)
    if folder is not None:
        data = read_model_config(folder)
        archs = architectures(data)
        if archs:
            return archs[0] in QWEN4_EXP_ARCHS
        if data.get("model_type"):
            return data["model_type"] == "qwen4_exp"
    if _QWEN4_NAME_RE.search(model):
        return True
    return None


def deepstack_indexes(config: dict[str, Any]) -> list[int] | None:
    """The layers a model adds DeepStack visual features to (Qwen3-VL's
    `deepstack_visual_indexes`, in its vision_config or at the top), or None."""
    for cfg in (config.get("vision_config"), config):
        if isinstance(cfg, dict):
            idx = cfg.get("deepstack_visual_indexes")
            if isinstance(idx, list) and idx and all(isinstance(i, int) and not isinstance(i, bool) for i in idx):
                return idx
    return None
