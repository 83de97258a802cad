"""Built-in random-initialized prefill models in plain torch: a Qwen3-style dense decoder
(RMSNorm, GQA attention with RoPE and q/k norm, SwiGLU MLP) and a Qwen3-VL-style variant whose
prefill consumes merged text+vision `input_embeds` with 3-axis (interleaved mRoPE) positions.

Every model exposes the one signature the graph engine captures:
    forward(inp, positions, last_index, deepstack=None) -> (hidden [T, H], last_logits [1, V])
with `inp` token ids [T] (text models, `input_kind == "ids"`) or embeddings [T, H]
(`input_kind == "embeds"`), `positions` [T] or [3, T], `last_index` a 1-element long
tensor holding the last real token's row, so padded replay picks the right row without a
host sync, and `deepstack` [T, H * deepstack_layers] or None (Qwen3-VL's DeepStack: zero
except on image tokens' rows; None for a text batch); and `body(inp, positions, deepstack)
-> hidden` without the LM head. `deepstack_layers` says how many decoder layers take
DeepStack embeddings (0: none). Attention is
`scaled_dot_product_attention(is_causal=True)` over one sequence (with padding at the end,
real tokens never attend to pads), or, inside `attention.varlen_attention(fn)`, `fn` over
a batch of several requests (the breakable engine).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from bcgtune.engines.attention import current_varlen_attention
from bcgtune.engines.presets import PRESETS, DecoderConfig, VisionConfig, preset  # noqa: F401  (re-exported)
from bcgtune.errors import InputError


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float, **fk):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim, **fk))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class Attention(nn.Module):
    def __init__(self, cfg: DecoderConfig, **fk):
        super().__init__()
        self.nh, self.nkv, self.hd = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        h = cfg.hidden_size
        self.q_proj = nn.Linear(h, self.nh * self.hd, bias=False, **fk)
        self.k_proj = nn.Linear(h, self.nkv * self.hd, bias=False, **fk)
        self.v_proj = nn.Linear(h, self.nkv * self.hd, bias=False, **fk)
        self.o_proj = nn.Linear(self.nh * self.hd, h, bias=False, **fk)
        self.q_norm = RMSNorm(self.hd, cfg.rms_eps, **fk)
        self.k_norm = RMSNorm(self.hd, cfg.rms_eps, **fk)
        # Set by the model after a probe: True when SDPA's pinned backend takes enable_gqa.
        self.native_gqa = True

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        t = x.shape[0]
        q = self.q_norm(self.q_proj(x).view(t, self.nh, self.hd))
        k = self.k_norm(self.k_proj(x).view(t, self.nkv, self.hd))
        v = self.v_proj(x).view(t, self.nkv, self.hd)
        c, s = cos[:, None, :], sin[:, None, :]
        q = q * c + _rotate_half(q) * s
        k = k * c + _rotate_half(k) * s
        varlen = current_varlen_attention()
        if varlen is not None:  # the breakable engine's batch of several requests
            return self.o_proj(varlen(q, k, v).reshape(t, self.nh * self.hd))
        q, k, v = (z.transpose(0, 1).unsqueeze(0) for z in (q, k, v))  # [1, heads, T, hd]
        if self.native_gqa or self.nh == self.nkv:
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.nh != self.nkv)
        else:
            rep = self.nh // self.nkv
            o = F.scaled_dot_product_attention(
                q, k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1), is_causal=True
            )
        return self.o_proj(o[0].transpose(0, 1).reshape(t, self.nh * self.hd))


class MLP(nn.Module):
    def __init__(self, cfg: DecoderConfig, **fk):
        super().__init__()
        h, i = cfg.hidden_size, cfg.intermediate_size
        self.gate_proj = nn.Linear(h, i, bias=False, **fk)
        self.up_proj = nn.Linear(h, i, bias=False, **fk)
        self.down_proj = nn.Linear(i, h, bias=False, **fk)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: DecoderConfig, **fk):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_eps, **fk)
        self.self_attn = Attention(cfg, **fk)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_eps, **fk)
        self.mlp = MLP(cfg, **fk)

    def forward(self, x, cos, sin):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class DeepStackMerger(nn.Module):
    """A merger with its norm after the 2x2 shuffle (Qwen3-VL's use_postshuffle_norm=True)."""

    def __init__(self, merged: int, text_hidden: int, **fk):
        super().__init__()
        self.norm = nn.LayerNorm(merged, **fk)
        self.fc1 = nn.Linear(merged, text_hidden, **fk)
        self.fc2 = nn.Linear(text_hidden, text_hidden, **fk)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(self.norm(x))))


class VisionStub(nn.Module):
    """Patches -> visual tokens, the shape of Qwen3-VL's vision tower without its depth:
    patch embedding, one MLP block, and the 2x2 merger into the text hidden size. Runs eagerly
    outside the graph, as image encoders do in SGLang."""

    def __init__(self, vc: VisionConfig, text_hidden: int, **fk):
        super().__init__()
        self.vc = vc
        p = vc.patch_size
        self.patch_embed = nn.Linear(vc.in_channels * p * p, vc.hidden_size, **fk)
        self.norm = RMSNorm(vc.hidden_size, 1e-6, **fk)
        self.fc1 = nn.Linear(vc.hidden_size, 2 * vc.hidden_size, **fk)
        self.fc2 = nn.Linear(2 * vc.hidden_size, vc.hidden_size, **fk)
        m = vc.merge_size
        self.merger = nn.Sequential(
            nn.Linear(m * m * vc.hidden_size, text_hidden, **fk), nn.GELU(), nn.Linear(text_hidden, text_hidden, **fk)
        )
        # Qwen3-VL's deepstack_merger_list: one merger (norm after the 2x2 shuffle) per tapped
        # feature map. The stub has one block, so every merger reads its output.
        self.deepstack_mergers = nn.ModuleList(
            DeepStackMerger(m * m * vc.hidden_size, text_hidden, **fk) for _ in range(vc.deepstack)
        )

    def grid(self, height: int, width: int) -> tuple[int, int]:
        """Merged token grid of an image resized to multiples of patch*merge (smart_resize's
        rounding, without its pixel-count limits)."""
        unit = self.vc.patch_size * self.vc.merge_size
        gh = max(1, round(height / unit))
        gw = max(1, round(width / unit))
        return gh, gw

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        """pixels [C, H, W] (already a multiple of patch*merge) -> visual tokens
        [gh*gw, text_hidden * (1 + deepstack)]: the embedding that replaces the image
        placeholders, then each DeepStack feature (the layout of SGLang's Qwen3-VL vision
        output, which separate_deepstack_embeds splits at text_hidden; srt/models/qwen3_vl.py)."""
        vc = self.vc
        p, m = vc.patch_size, vc.merge_size
        c, hh, ww = pixels.shape
        gh, gw = hh // (p * m), ww // (p * m)
        x = pixels.reshape(c, gh, m, p, gw, m, p).permute(1, 4, 2, 5, 0, 3, 6)  # gh, gw, m, m, C, p, p
        x = x.reshape(gh * gw * m * m, c * p * p)
        x = self.patch_embed(x)
        x = x + self.fc2(F.gelu(self.fc1(self.norm(x))))
        merged = x.reshape(gh * gw, m * m * vc.hidden_size)
        return torch.cat([self.merger(merged), *(ds(merged) for ds in self.deepstack_mergers)], dim=1)


class DecoderLM(nn.Module):
    inv_freq: torch.Tensor  # buffers (register_buffer), declared for the type checker
    mrope_axis: torch.Tensor

    def __init__(self, cfg: DecoderConfig, device=None, dtype=torch.bfloat16):
        super().__init__()
        fk = {"device": device, "dtype": dtype}
        self.cfg = cfg
        self.input_kind = cfg.input_kind
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size, **fk)
        self.layers = nn.ModuleList(DecoderLayer(cfg, **fk) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_eps, **fk)
        self.lm_head = None if cfg.tie_embeddings else nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False, **fk)
        self.visual = VisionStub(cfg.vision, cfg.hidden_size, **fk) if cfg.vision is not None else None
        self.deepstack_layers = cfg.vision.deepstack if cfg.vision is not None else 0
        if not 0 <= self.deepstack_layers <= cfg.num_layers:
            raise InputError(f"deepstack {self.deepstack_layers} must be between 0 and the {cfg.num_layers} decoder layers")
        half = cfg.head_dim // 2
        inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, half, device=device, dtype=torch.float32) / half))
        self.register_buffer("inv_freq", inv, persistent=False)
        if cfg.vision is not None:
            sec = cfg.mrope_section
            if sum(sec) != half:
                raise InputError(f"mrope_section {sec} must sum to head_dim/2 = {half}")
            axis = torch.zeros(half, dtype=torch.long)
            axis[1 : sec[1] * 3 : 3] = 1  # Qwen3-VL interleaves t/h/w frequencies
            axis[2 : sec[2] * 3 : 3] = 2
            self.register_buffer("mrope_axis", axis.to(device), persistent=False)

    @property
    def hidden_size(self) -> int:
        return self.cfg.hidden_size

    @property
    def vocab_size(self) -> int:
        return self.cfg.vocab_size

    def lm_weight(self) -> torch.Tensor:
        return self.embed_tokens.weight if self.lm_head is None else self.lm_head.weight

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return hidden @ self.lm_weight().t()

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens(ids)

    def _rope(self, positions: torch.Tensor, dtype) -> tuple[torch.Tensor, torch.Tensor]:
        if positions.dim() == 2:  # [3, T] mRoPE: pick each frequency's axis
            pos = positions.index_select(0, self.mrope_axis)  # [half, T]
            freqs = pos.t().float() * self.inv_freq[None, :]
        else:
            freqs = positions.float()[:, None] * self.inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(dtype), emb.sin().to(dtype)

    def body(self, inp: torch.Tensor, positions: torch.Tensor, deepstack: torch.Tensor | None = None) -> torch.Tensor:
        """The transformer body: final-norm hidden states [T, H], no LM head (what SGLang's
        breakable and full prefill runners capture; the logits tail runs eagerly). DeepStack,
        when given: its i-th slice added to the output of decoder layer i, for the first
        `deepstack_layers` layers, as SGLang's Qwen3-VL language model does on its inference
        path (srt/models/qwen3_vl.py, Qwen3LLMModel.forward)."""
        x = self.embed_tokens(inp) if self.input_kind == "ids" else inp
        cos, sin = self._rope(positions, x.dtype)
        h = self.cfg.hidden_size
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin)
            if deepstack is not None and i < self.deepstack_layers:
                x = x + deepstack[:, i * h : (i + 1) * h]
        return self.norm(x)

    def forward(
        self, inp: torch.Tensor, positions: torch.Tensor, last_index: torch.Tensor, deepstack: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        hidden = self.body(inp, positions, deepstack)
        return hidden, self.logits(hidden.index_select(0, last_index))


def init_random_(model: DecoderLM, seed: int, std: float = 0.02) -> None:
    """Deterministic random weights (normal, std 0.02 like HF's initializer_range); norms at 1."""
    gen_device = next(model.parameters()).device
    g = torch.Generator(device=gen_device)
    g.manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            elif p.dim() == 1:
                p.zero_()
            else:
                p.normal_(0.0, std, generator=g)
        # Sharper output distribution than std 0.02 gives (logit sd ~4 instead of ~1.3 at
        # hidden 4096), so top-1/top-2 gaps are often wide, as in trained models, and the
        # gap-gated checks of `validate` have tokens to bite on.
        weight = model.lm_weight()
        weight.normal_(0.0, 4.0 / weight.shape[1] ** 0.5, generator=g)


def build_model(cfg: DecoderConfig, device: torch.device, dtype=torch.bfloat16, seed: int = 0) -> DecoderLM:
    model = DecoderLM(cfg, device=device, dtype=dtype)
    init_random_(model, seed)
    model.eval()
    model.requires_grad_(False)
    return model


def image_token_count(model_or_cfg, height: int, width: int) -> int:
    """Visual tokens (without the 2 start/end markers) of an image of height x width pixels."""
    vc = model_or_cfg.vision if isinstance(model_or_cfg, DecoderConfig) else model_or_cfg.cfg.vision
    if vc is None:
        raise InputError("image inputs need a VL model (e.g. --model qwen3-vl-8b)")
    unit = vc.patch_size * vc.merge_size
    return max(1, round(height / unit)) * max(1, round(width / unit))


def mrope_positions(n_before: int, grid: tuple[int, int], n_after: int) -> torch.Tensor:
    """Qwen-VL 3-axis positions for text, one image (grid gh x gw) and more text:
    text tokens count on all axes; image tokens share t and spread over h and w; text after
    the image resumes at max + 1. Returns [3, n_before + gh*gw + n_after] (long, CPU)."""
    gh, gw = grid
    before = torch.arange(n_before).expand(3, -1)
    hh = torch.arange(gh).repeat_interleave(gw)
    ww = torch.arange(gw).repeat(gh)
    img = torch.stack((torch.zeros(gh * gw, dtype=torch.long), hh, ww)) + n_before
    start = int(img.max()) + 1 if gh * gw else n_before
    after = (torch.arange(n_after) + start).expand(3, -1)
    return torch.cat((before, img, after), dim=1).contiguous()
