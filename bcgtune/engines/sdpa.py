"""SDPA (torch's scaled_dot_product_attention): pinning one backend around eager runs,
warm-up and capture alike, and recording which backend each call would take, so a graph
whose attention calls differ from eager's is flagged rather than timed blindly."""

from __future__ import annotations

import contextlib
from typing import Any, get_args

import torch
import torch.nn.functional as F

from bcgtune.engines.choices import SdpaBackendName
from bcgtune.errors import InputError

SDPA_BACKENDS: tuple[str, ...] = get_args(SdpaBackendName)


def resolved_sdpa_backend(name: str) -> str:
    """The backend 'auto' stands for: flash, on a GPU and on the CPU alike. On the CPU that is
    torch's tiled flash kernel, whose memory grows with the sequence, not its square as the
    math backend's score matrix does (8,192 tokens: 1 GiB of scores per head group and 15x
    the time with math)."""
    return "flash" if name == "auto" else name


def sdpa_context(name: str) -> contextlib.AbstractContextManager[Any]:
    """Context pinning SDPA to one backend (resolved_sdpa_backend for 'auto'). 'none': no
    pin (torch picks per call, as a plain transformers model does)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    if name not in SDPA_BACKENDS:
        raise InputError(f"unknown SDPA backend {name!r} ({', '.join(SDPA_BACKENDS)})", "--sdpa-backend")
    if name == "none":
        return contextlib.nullcontext()
    table = {
        "flash": SDPBackend.FLASH_ATTENTION,
        "efficient": SDPBackend.EFFICIENT_ATTENTION,
        "cudnn": SDPBackend.CUDNN_ATTENTION,
        "math": SDPBackend.MATH,
    }
    return sdpa_kernel([table[resolved_sdpa_backend(name)]])


def check_sdpa_backend(name: str, device: Any, dtype: Any) -> None:
    """Refuse, before any model runs, an SDPA backend torch has no kernel for on this device
    and dtype (efficient and cudnn have none on the CPU): one tiny causal attention call
    under the pin, the shapes a model's call has (batch, heads, tokens, head size)."""
    if name == "none":
        return
    q = torch.zeros(1, 2, 4, 16, device=device, dtype=dtype)
    try:
        with sdpa_context(name):
            F.scaled_dot_product_attention(q, q, q, is_causal=True)
    except RuntimeError:
        kind = getattr(device, "type", str(device))
        raise InputError(
            f"torch has no {resolved_sdpa_backend(name)} attention kernel for {str(dtype).removeprefix('torch.')} on {kind}"
            + (": use flash or math on the CPU" if kind == "cpu" else ""),
            "--sdpa-backend",
        ) from None


_BACKEND_NAMES = {0: "math", 1: "flash", 2: "efficient", 3: "cudnn", 4: "overrideable"}


class SdpaRecorder:
    """Records each scaled_dot_product_attention call's signature: mask kind, is_causal,
    GQA, shapes and the backend torch would choose under the current flags. Patches
    torch.nn.functional for the duration (models look the function up at call time)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, ...]] = []
        self._orig: Any = None

    def __enter__(self) -> SdpaRecorder:
        self._orig = F.scaled_dot_product_attention
        orig = self._orig
        calls = self.calls

        def recorded(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
            calls.append(_signature(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa))
            return orig(
                query,
                key,
                value,
                attn_mask=attn_mask,
                dropout_p=dropout_p,
                is_causal=is_causal,
                scale=scale,
                enable_gqa=enable_gqa,
            )

        F.scaled_dot_product_attention = recorded
        torch.nn.functional.scaled_dot_product_attention = recorded
        return self

    def __exit__(self, *exc: object) -> None:
        F.scaled_dot_product_attention = self._orig
        torch.nn.functional.scaled_dot_product_attention = self._orig

    def summary(self) -> list[str]:
        """Distinct call signatures with counts, shape-free (masks differ by size only)."""
        out: dict[str, int] = {}
        for c in self.calls:
            key = " ".join(x if not x.startswith("mask=") or x == "mask=none" else x.split("[")[0] for x in c)
            out[key] = out.get(key, 0) + 1
        return [f"{k} x{v}" for k, v in sorted(out.items())]


def _signature(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa) -> tuple[str, ...]:
    choice: str | None = None
    try:
        if query.is_cuda:
            code = torch._fused_sdp_choice(query, key, value, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa)
            choice = _BACKEND_NAMES.get(int(code), "?")
    except Exception:
        choice = "?"
    mask = None if attn_mask is None else f"{str(attn_mask.dtype).replace('torch.', '')}{list(attn_mask.shape)}"
    return (
        "mask=" + (mask or "none"),
        f"is_causal={bool(is_causal)}",
        f"enable_gqa={bool(enable_gqa)}",
        f"q_heads={query.shape[-3]}",
        f"kv_heads={key.shape[-3]}",
        f"backend={choice}",
    )


def maybe(ctx: contextlib.AbstractContextManager[Any] | None) -> contextlib.AbstractContextManager[Any]:
    """`ctx`, or a context that does nothing when it is None."""
    return ctx if ctx is not None else contextlib.nullcontext()
