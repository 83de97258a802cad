"""Built-in random-initialized prefill models in plain torch, built from a shape
(engines/shapes.py): a Qwen3-style decoder (RMSNorm, GQA attention with RoPE and q/k norm,
SwiGLU MLP), its MoE layers (engines/moe.py), DeepSeek's multi-head latent attention, and a
Qwen3-VL-style variant whose prefill consumes merged text+vision `input_embeds` with 3-axis
(interleaved mRoPE) positions; each the slice one tensor-parallel rank runs (shapes.rank_dims),
with the all-reduce after each block (`Comm`).

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

Random weights are drawn per parameter of the whole model, each from its own generator
seeded by the parameter's name, and a rank keeps its slice: the slices of every rank of a
TP-N model are the TP-1 model's weights, so N ranks all-reducing reproduce its forward
(tests/test_engine_tp.py checks it with gloo on the CPU).
"""

from __future__ import annotations

import time
import zlib

import torch
import torch.nn.functional as F
from torch import nn

from bcgtune.engines.allreduce import AllReduceCurve
from bcgtune.engines.attention import current_varlen_attention
from bcgtune.engines.mlp import MLP
from bcgtune.engines.moe import ExpertGemm, MoELayer
from bcgtune.engines.shapes import PRESETS, DecoderConfig, RankDims, VisionConfig, preset  # noqa: F401  (re-exported)
from bcgtune.errors import InputError


class Comm:
    """The all-reduce after a block of a tensor-parallel rank: none (TP 1), real
    (torch.distributed over the ranks' processes, in place), or modelled: the rank's stream
    held for the curve's time for the rows reduced (a spinning kernel on a GPU, inside the
    captured graph as the collective would be; a busy wait on the CPU)."""

    def __init__(self, mode: str = "none", curve: AllReduceCurve | None = None, hidden: int = 0, elem_bytes: int = 2):
        self.mode = mode
        self.curve = curve
        self.row_bytes = hidden * elem_bytes
        self.cycles_per_us = 0.0  # GPU clock, measured by calibrate_clock

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.mode == "real":
            torch.distributed.all_reduce(x)
        elif self.mode == "modelled":
            self.wait(x.shape[0], x.device)
        return x

    def wait(self, rows: int, device: torch.device) -> None:
        assert self.curve is not None  # modelled
        us = self.curve.us(rows * self.row_bytes)
        if device.type == "cuda":
            torch.cuda._sleep(max(1, int(us * self.cycles_per_us)))
        else:
            end = time.perf_counter() + us * 1e-6
            while time.perf_counter() < end:
                pass

    def calibrate_clock(self, device: torch.device) -> None:
        """The GPU clock cycles per microsecond that torch.cuda._sleep spins for (timed)."""
        if self.mode != "modelled" or device.type != "cuda":
            return
        cycles = 20_000_000
        torch.cuda._sleep(1000)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.cuda._sleep(cycles)
        end.record()
        torch.cuda.synchronize(device)
        self.cycles_per_us = cycles / (start.elapsed_time(end) * 1e3)


NO_COMM = Comm()


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


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, native_gqa: bool, scale: float | None = None) -> torch.Tensor:
    """Attention of one causal sequence, or the breakable engine's varlen attention over a
    batch: q [T, heads, d], k/v [T, kv_heads, d] -> [T, heads, d]."""
    varlen = current_varlen_attention()
    if varlen is not None:  # the breakable engine's batch of several requests
        return varlen(q, k, v, scale=scale)
    nh, nkv = q.shape[1], k.shape[1]
    q, k, v = (z.transpose(0, 1).unsqueeze(0) for z in (q, k, v))  # [1, heads, T, d]
    if native_gqa or nh == nkv:
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=nh != nkv)
    else:
        rep = nh // nkv
        o = F.scaled_dot_product_attention(
            q, k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1), is_causal=True, scale=scale
        )
    return o[0].transpose(0, 1)


class Attention(nn.Module):
    """GQA attention of one rank: its query heads and KV heads (shapes.rank_dims)."""

    def __init__(self, cfg: DecoderConfig, dims: RankDims, **fk):
        super().__init__()
        self.nh, self.nkv, self.hd = dims.heads, dims.kv_heads, cfg.head_dim
        h = cfg.hidden_size
        self.q_proj = nn.Linear(h, self.nh * self.hd, bias=False, **fk)
        self.k_proj = nn.Linear(h, self.nkv * self.hd, bias=False, **fk)
        self.v_proj = nn.Linear(h, self.nkv * self.hd, bias=False, **fk)
        self.o_proj = nn.Linear(self.nh * self.hd, h, bias=False, **fk)
        self.q_norm = RMSNorm(self.hd, cfg.rms_eps, **fk) if cfg.qk_norm else None
        self.k_norm = RMSNorm(self.hd, cfg.rms_eps, **fk) if cfg.qk_norm else None
        # Set by the model after a probe: True when SDPA's pinned backend takes enable_gqa.
        self.native_gqa = True

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        t = x.shape[0]
        q = self.q_proj(x).view(t, self.nh, self.hd)
        k = self.k_proj(x).view(t, self.nkv, self.hd)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        v = self.v_proj(x).view(t, self.nkv, self.hd)
        c, s = cos[:, None, :], sin[:, None, :]
        q = q * c + _rotate_half(q) * s
        k = k * c + _rotate_half(k) * s
        return self.o_proj(_attend(q, k, v, self.native_gqa).reshape(t, self.nh * self.hd))


class LatentAttention(nn.Module):
    """DeepSeek-V2/V3's multi-head latent attention on one rank, as a prefill runs it (keys
    and values decompressed from the latent, srt/models/deepseek_v2.py's MHA path for
    extend): each head's key is its own `qk_nope_head_dim` part and the rotary part shared by
    all heads; values are padded to the key's width so every attention kernel takes them,
    and the padding dropped after."""

    def __init__(self, cfg: DecoderConfig, dims: RankDims, **fk):
        super().__init__()
        m = cfg.mla
        assert m is not None
        self.m, self.nh, h = m, dims.heads, cfg.hidden_size
        self.q_a_proj = self.q_a_layernorm = self.q_b_proj = self.q_proj = None
        if m.q_lora_rank:
            self.q_a_proj = nn.Linear(h, m.q_lora_rank, bias=False, **fk)
            self.q_a_layernorm = RMSNorm(m.q_lora_rank, cfg.rms_eps, **fk)
            self.q_b_proj = nn.Linear(m.q_lora_rank, self.nh * m.qk_head_dim, bias=False, **fk)
        else:
            self.q_proj = nn.Linear(h, self.nh * m.qk_head_dim, bias=False, **fk)
        self.kv_a_proj_with_mqa = nn.Linear(h, m.kv_lora_rank + m.qk_rope_head_dim, bias=False, **fk)
        self.kv_a_layernorm = RMSNorm(m.kv_lora_rank, cfg.rms_eps, **fk)
        self.kv_b_proj = nn.Linear(m.kv_lora_rank, self.nh * (m.qk_nope_head_dim + m.v_head_dim), bias=False, **fk)
        self.o_proj = nn.Linear(self.nh * m.v_head_dim, h, bias=False, **fk)
        self.native_gqa = True

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        m, t, nh = self.m, x.shape[0], self.nh
        if self.q_a_proj is not None and self.q_a_layernorm is not None and self.q_b_proj is not None:
            q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x)))
        else:
            assert self.q_proj is not None
            q = self.q_proj(x)
        q = q.view(t, nh, m.qk_head_dim)
        latent, k_pe = self.kv_a_proj_with_mqa(x).split([m.kv_lora_rank, m.qk_rope_head_dim], dim=-1)
        kv = self.kv_b_proj(self.kv_a_layernorm(latent)).view(t, nh, m.qk_nope_head_dim + m.v_head_dim)
        k_nope, v = kv.split([m.qk_nope_head_dim, m.v_head_dim], dim=-1)
        c, s = cos[:, None, :], sin[:, None, :]
        q_nope, q_pe = q.split([m.qk_nope_head_dim, m.qk_rope_head_dim], dim=-1)
        q_pe = q_pe * c + _rotate_half(q_pe) * s
        k_pe = k_pe[:, None, :] * c + _rotate_half(k_pe[:, None, :]) * s
        q = torch.cat((q_nope, q_pe), dim=-1)
        k = torch.cat((k_nope, k_pe.expand(t, nh, m.qk_rope_head_dim)), dim=-1)
        v = F.pad(v, (0, m.qk_head_dim - m.v_head_dim))
        o = _attend(q, k, v, True, scale=m.qk_head_dim**-0.5)[..., : m.v_head_dim]
        return self.o_proj(o.reshape(t, nh * m.v_head_dim))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: DecoderConfig, dims: RankDims, index: int, comm: Comm, gemm: ExpertGemm, pad_rows: str, **fk):
        super().__init__()
        self.comm = comm
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_eps, **fk)
        self.self_attn: nn.Module = LatentAttention(cfg, dims, **fk) if cfg.mla is not None else Attention(cfg, dims, **fk)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_eps, **fk)
        self.mlp: nn.Module
        if cfg.moe is not None and cfg.is_moe_layer(index):
            self.mlp = MoELayer(cfg.hidden_size, cfg.moe, dims, gemm, pad_rows, **fk)
        else:
            self.mlp = MLP(cfg.hidden_size, dims.intermediate, **fk)

    def forward(self, x, cos, sin):
        x = x + self.comm(self.self_attn(self.input_layernorm(x), cos, sin))
        return x + self.comm(self.mlp(self.post_attention_layernorm(x)))


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

    def __init__(
        self,
        cfg: DecoderConfig,
        device=None,
        dtype=torch.bfloat16,
        dims: RankDims | None = None,
        comm: Comm = NO_COMM,
        gemm: ExpertGemm | None = None,
        pad_rows: str = "routed",
    ):
        super().__init__()
        fk = {"device": device, "dtype": dtype}
        self.cfg = cfg
        self.dims = dims or RankDims.whole(cfg)
        self.comm = comm
        self.gemm = gemm or ExpertGemm(False, "not probed")
        self.input_kind = cfg.input_kind
        d = self.dims
        self.embed_tokens = nn.Embedding(d.vocab, cfg.hidden_size, **fk)
        self.layers = nn.ModuleList(DecoderLayer(cfg, d, i, comm, self.gemm, pad_rows, **fk) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_eps, **fk)
        self.lm_head = None if cfg.tie_embeddings else nn.Linear(cfg.hidden_size, d.vocab, bias=False, **fk)
        self.visual = VisionStub(cfg.vision, cfg.hidden_size, **fk) if cfg.vision is not None else None
        self.deepstack_layers = cfg.vision.deepstack if cfg.vision is not None else 0
        if not 0 <= self.deepstack_layers <= cfg.num_layers:
            raise InputError(f"deepstack {self.deepstack_layers} must be between 0 and the {cfg.num_layers} decoder layers")
        rotary = cfg.mla.qk_rope_head_dim if cfg.mla is not None else cfg.head_dim
        half = rotary // 2
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
        """This rank's vocabulary shard of the logits; with a real all-reduce, every rank's
        gathered (the eager tail, as SGLang's logits processor gathers them)."""
        local = hidden @ self.lm_weight().t()
        if self.comm.mode != "real":
            return local
        parts = [torch.empty_like(local) for _ in range(self.dims.tp)]
        torch.distributed.all_gather(parts, local.contiguous())
        return torch.cat(parts, dim=-1)[..., : self.cfg.vocab_size]

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """Token embeddings; on a TP rank its vocabulary shard's rows, the others zero, then
        the all-reduce (VocabParallelEmbedding)."""
        d = self.dims
        if d.tp == 1:
            return self.embed_tokens(ids)
        local = ids - d.vocab_start
        outside = (local < 0) | (local >= d.vocab)
        out = self.embed_tokens(local.clamp(0, d.vocab - 1)).masked_fill(outside[:, None], 0.0)
        return self.comm(out)

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
        x = self.embed(inp) if self.input_kind == "ids" else inp
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

    def moe_layers(self) -> list[MoELayer]:
        return [m for m in self.modules() if isinstance(m, MoELayer)]


# ---- random weights -------------------------------------------------------------------
def _generator(device: torch.device, seed: int, name: str) -> torch.Generator:
    g = torch.Generator(device=device)
    g.manual_seed((int(seed) * 1_000_003 + zlib.crc32(name.encode())) % (2**63))
    return g


def _draw(shape: tuple[int, ...], std: float, g: torch.Generator, like: torch.Tensor) -> torch.Tensor:
    return torch.empty(shape, dtype=like.dtype, device=like.device).normal_(0.0, std, generator=g)


def _shard(model: DecoderLM, name: str, p: torch.Tensor) -> tuple[tuple[int, ...], int, int] | None:
    """How parameter `name` of this rank slices the whole model's: (the whole shape, the
    sliced dimension, the slice's start), None when the rank holds it whole."""
    cfg, d = model.cfg, model.dims
    if d.tp == 1:
        return None
    part = name.split(".")
    leaf = ".".join(part[-2:])
    if name in ("embed_tokens.weight", "lm_head.weight"):
        return (cfg.vocab_size, cfg.hidden_size), 0, d.vocab_start
    if "self_attn" in part:
        if cfg.mla is not None:
            m = cfg.mla
            per = {
                "q_b_proj.weight": m.qk_head_dim,
                "q_proj.weight": m.qk_head_dim,
                "kv_b_proj.weight": m.qk_nope_head_dim + m.v_head_dim,
            }
            if leaf in per:
                return (cfg.num_heads * per[leaf], p.shape[1]), 0, d.head_start * per[leaf]
            if leaf == "o_proj.weight":
                return (cfg.hidden_size, cfg.num_heads * m.v_head_dim), 1, d.head_start * m.v_head_dim
            return None
        hd = cfg.head_dim
        if leaf == "q_proj.weight":
            return (cfg.num_heads * hd, cfg.hidden_size), 0, d.head_start * hd
        if leaf in ("k_proj.weight", "v_proj.weight"):
            return (cfg.num_kv_heads * hd, cfg.hidden_size), 0, d.kv_head_start * hd
        if leaf == "o_proj.weight":
            return (cfg.hidden_size, cfg.num_heads * hd), 1, d.head_start * hd
        return None
    if leaf in ("gate_proj.weight", "up_proj.weight", "down_proj.weight"):
        shared = "shared" in part
        whole = cfg.moe.shared_intermediate_size if shared and cfg.moe is not None else cfg.intermediate_size
        width = p.shape[1] if leaf == "down_proj.weight" else p.shape[0]
        start = d.rank * width
        if leaf == "down_proj.weight":
            return (cfg.hidden_size, whole), 1, start
        return (whole, cfg.hidden_size), 0, start
    return None


def _init_experts(model: DecoderLM, name: str, layer: MoELayer, seed: int, std: float) -> None:
    """Each routed expert this rank holds drawn whole (its gate, up and down projections,
    each from its own generator) and sliced to this rank's share of its width."""
    d, moe = model.dims, model.cfg.moe
    assert moe is not None
    w = layer.width
    moe_tp = d.tp // d.ep
    start = (d.rank % moe_tp) * w
    h = model.cfg.hidden_size
    dev = layer.w13.device
    for j in range(layer.local):
        e = layer.start + j
        gate = _draw((moe.intermediate_size, h), std, _generator(dev, seed, f"{name}.w13[{e}].gate"), layer.w13)
        up = _draw((moe.intermediate_size, h), std, _generator(dev, seed, f"{name}.w13[{e}].up"), layer.w13)
        down = _draw((h, moe.intermediate_size), std, _generator(dev, seed, f"{name}.w2[{e}]"), layer.w2)
        layer.w13[j].copy_(torch.cat((gate[start : start + w], up[start : start + w])))
        layer.w2[j].copy_(down[:, start : start + w])


def init_random_(model: DecoderLM, seed: int, std: float = 0.02, routing: str = "uniform") -> None:
    """Deterministic random weights (normal, std 0.02 like HF's initializer_range); norms at 1;
    each parameter drawn whole from its own generator and sliced to this rank (module
    docstring); the MoE routers' bias for `routing` (engines/moe.py)."""
    experts = {f"{n}.": m for n, m in model.named_modules() if isinstance(m, MoELayer)}
    lm_name = "embed_tokens.weight" if model.lm_head is None else "lm_head.weight"
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
                continue
            if p.dim() == 1:
                p.zero_()
                continue
            owner = next((k for k in experts if name.startswith(k) and name[len(k) :] in ("w13", "w2")), None)
            if owner is not None:
                if name.endswith("w13"):  # both expert tensors drawn together, once
                    _init_experts(model, owner[:-1], experts[owner], seed, std)
                continue
            # Sharper output distribution than std 0.02 gives (logit sd ~4 instead of ~1.3 at
            # hidden 4096), so top-1/top-2 gaps are often wide, as in trained models, and the
            # gap-gated checks of `validate` have tokens to bite on.
            sd = 4.0 / p.shape[1] ** 0.5 if name == lm_name else std
            if name.endswith("mlp.gate.weight"):  # an MoE router: logits that spread by about 1 (engines/moe.py)
                sd = 1.0 / p.shape[1] ** 0.5
            g = _generator(p.device, seed, name)
            cut = _shard(model, name, p)
            if cut is None:
                p.normal_(0.0, sd, generator=g)
                continue
            whole, dim, start = cut
            full = _draw(whole, sd, g, p)
            piece = full.narrow(dim, start, min(p.shape[dim], max(0, whole[dim] - start)))
            p.zero_()  # the vocabulary's padded rows stay zero
            p.narrow(dim, 0, piece.shape[dim]).copy_(piece)
        for i, layer in enumerate(model.layers):
            if isinstance(layer.mlp, MoELayer):
                layer.mlp.set_routing(routing, seed, i)


def build_model(
    cfg: DecoderConfig,
    device: torch.device,
    dtype=torch.bfloat16,
    seed: int = 0,
    *,
    dims: RankDims | None = None,
    comm: Comm = NO_COMM,
    gemm: ExpertGemm | None = None,
    pad_rows: str = "routed",
    routing: str = "uniform",
) -> DecoderLM:
    model = DecoderLM(cfg, device=device, dtype=dtype, dims=dims, comm=comm, gemm=gemm, pad_rows=pad_rows)
    init_random_(model, seed, routing=routing)
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
