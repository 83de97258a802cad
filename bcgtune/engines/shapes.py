"""A model's shape without torch: the built-in presets, and any Hugging Face config.json read
into the same shape (dense, MoE or vision-language; GQA or DeepSeek's multi-head latent
attention), with the slice of it one tensor-parallel rank runs. Read before any model is built
(to refuse a run that cannot work, in well under a second) and by the torch models in
models.py, which build exactly this shape.

`max_context` is the model's context length (Hugging Face `max_position_embeddings`): a
prefill bucket larger than it is refused before capture.

The slice of one rank divides the model as SGLang 0.5.23 shards it (`rank_dims`):
  * attention heads over TP; KV heads over TP, or, with fewer KV heads than ranks, one KV
    head per rank replicated over TP / kv_heads ranks (srt/layers/linear.py,
    QKVParallelLinear: num_kv_heads, num_kv_head_replicas);
  * the dense MLP's intermediate size over TP (MergedColumnParallelLinear,
    RowParallelLinear);
  * routed experts over EP, each expert's intermediate size over TP / EP
    (srt/layers/moe/fused_moe_triton/layer.py, FusedMoE: num_local_experts,
    intermediate_size_per_partition; moe_tp_size = tp_size // ep_size in
    model_executor/model_runner_components/moe_ep_setup.py); the router and a shared
    expert's gate replicated, a shared expert split like a dense MLP;
  * the vocabulary over TP after padding to a multiple of 64 (times TP when that does not
    divide; srt/layers/vocab_parallel_embedding.py, pad_vocab_size);
  * DeepSeek's latent attention: the down projections (q_a, kv_a) replicated, the up
    projections (q_b, kv_b) and o_proj split by heads (srt/models/deepseek_v2.py).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from bcgtune.errors import InputError

_CONFIG_MAX_BYTES = 4 << 20
# Bounds on a config's sizes: beyond them a value is a typo or a hostile file, not a model.
_MAX_DIM = 1 << 20
_MAX_LAYERS = 4096
_MAX_EXPERTS = 65536
_MAX_VOCAB = 1 << 24
VOCAB_PADDING = 64  # srt/layers/vocab_parallel_embedding.py DEFAULT_VOCAB_PADDING_SIZE


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
class MoeConfig:
    """Routed experts of an MoE layer: the router picks `top_k` of `num_experts` per token
    (softmax over the experts, or DeepSeek-V3's sigmoid scores with a correction bias and
    group-limited choice), each expert a SwiGLU MLP of `intermediate_size`; optionally a
    shared expert every token runs (Qwen2-MoE gates it with a sigmoid, DeepSeek does not)."""

    num_experts: int
    top_k: int
    intermediate_size: int
    shared_intermediate_size: int = 0  # 0: no shared expert
    shared_gate: bool = False  # Qwen2-MoE's sigmoid gate on the shared expert's output
    norm_topk_prob: bool = True  # the top-k weights renormalized to sum to 1
    scoring: str = "softmax"  # softmax | sigmoid (DeepSeek-V3)
    n_group: int = 1  # DeepSeek's group-limited routing: experts in n_group groups,
    topk_group: int = 1  # the top-k chosen within the best topk_group groups
    routed_scaling_factor: float = 1.0
    correction_bias: bool = False  # DeepSeek-V3's e_score_correction_bias (noaux_tc)
    dense_layers: tuple[int, ...] = ()  # layers that run a dense MLP instead


@dataclass(frozen=True)
class MlaConfig:
    """DeepSeek-V2/V3's multi-head latent attention: queries (optionally through a low-rank
    q_a/q_b pair) and keys/values decompressed from a `kv_lora_rank` latent, each head's key
    `qk_nope_head_dim` plus `qk_rope_head_dim` wide (the rotary part shared by all heads)."""

    q_lora_rank: int | None
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim


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
    moe: MoeConfig | None = None
    mla: MlaConfig | None = None
    qk_norm: bool = True  # Qwen3's RMSNorm on each head's q and k
    architecture: str = "bcgtune built-in"
    stands_for: str | None = None  # the Hugging Face model this shape is (when known)

    @property
    def input_kind(self) -> str:
        return "embeds" if self.vision is not None else "ids"

    def is_moe_layer(self, i: int) -> bool:
        return self.moe is not None and i not in self.moe.dense_layers

    @property
    def moe_layers(self) -> int:
        return sum(self.is_moe_layer(i) for i in range(self.num_layers))

    def params(self) -> int:
        """Parameters of the whole model (every expert), as built."""
        return self.rank_params(RankDims.whole(self))

    def rank_params(self, d: RankDims) -> int:
        """Parameters one rank holds (its slice)."""
        h = self.hidden_size
        if self.mla is not None:
            m = self.mla
            q = (
                h * m.q_lora_rank + m.q_lora_rank + m.q_lora_rank * d.heads * m.qk_head_dim
                if m.q_lora_rank
                else h * d.heads * m.qk_head_dim
            )
            kv = h * (m.kv_lora_rank + m.qk_rope_head_dim) + m.kv_lora_rank
            kv += m.kv_lora_rank * d.heads * (m.qk_nope_head_dim + m.v_head_dim)
            attn = q + kv + d.heads * m.v_head_dim * h
        else:
            attn = h * self.head_dim * (d.heads * 2 + d.kv_heads * 2) + (2 * self.head_dim if self.qk_norm else 0)
        dense = 3 * h * d.intermediate
        moe = 0
        if self.moe is not None:
            moe = h * self.moe.num_experts + d.experts * 3 * h * d.moe_intermediate + 3 * h * d.shared_intermediate
            moe += (h if self.moe.shared_gate else 0) + (self.moe.num_experts if self.moe.correction_bias else 0)
        body = sum(attn + 2 * h + (moe if self.is_moe_layer(i) else dense) for i in range(self.num_layers))
        emb = d.vocab * h * (1 if self.tie_embeddings else 2)
        return body + emb + h

    def to_dict(self) -> dict:
        d = asdict(self)
        d["params"] = self.params()
        d["input_kind"] = self.input_kind
        return d


@dataclass(frozen=True)
class RankDims:
    """What one tensor-parallel rank holds of a model (SGLang's sharding, module docstring)."""

    tp: int
    rank: int
    ep: int
    heads: int  # attention heads on this rank
    head_start: int
    kv_heads: int  # KV heads on this rank (1 when replicated)
    kv_head_start: int
    intermediate: int  # dense MLP
    moe_intermediate: int  # per routed expert
    experts: int  # routed experts on this rank
    expert_start: int
    shared_intermediate: int
    vocab: int  # padded vocabulary rows on this rank
    vocab_start: int

    @classmethod
    def whole(cls, cfg: DecoderConfig) -> RankDims:
        moe = cfg.moe
        return cls(
            1,
            0,
            1,
            cfg.num_heads,
            0,
            cfg.num_kv_heads,
            0,
            cfg.intermediate_size,
            moe.intermediate_size if moe else 0,
            moe.num_experts if moe else 0,
            0,
            moe.shared_intermediate_size if moe else 0,
            cfg.vocab_size,
            0,
        )


def padded_vocab(vocab: int, tp: int) -> int:
    """The vocabulary padded as SGLang pads it for `tp` ranks (VocabParallelEmbedding)."""
    pad = VOCAB_PADDING
    if -(-vocab // pad) * pad % tp:
        pad *= tp
    return -(-vocab // pad) * pad


def rank_dims(cfg: DecoderConfig, tp: int = 1, rank: int = 0, ep: int = 1) -> RankDims:
    """The slice rank `rank` of `tp` runs (experts over `ep`); a model SGLang would refuse to
    shard this way is refused (field tp or ep)."""
    if tp < 1 or not 0 <= rank < tp:
        raise InputError(f"rank {rank} of {tp} is not a tensor-parallel rank", field="tp")
    if tp == 1 and ep == 1:
        return RankDims.whole(cfg)
    if ep < 1 or tp % ep:
        raise InputError(f"tensor parallel size {tp} must be a multiple of the expert parallel size {ep}", field="ep")
    name = cfg.name

    def div(total: int, parts: int, what: str, flag: str) -> int:
        if total % parts:
            raise InputError(f"{name}'s {what} ({total}) do not divide over {parts} ranks", field=flag)
        return total // parts

    heads = div(cfg.num_heads, tp, "attention heads", "tp")
    if cfg.mla is not None or tp < cfg.num_kv_heads:
        kv = cfg.num_kv_heads if cfg.mla is not None else div(cfg.num_kv_heads, tp, "KV heads", "tp")
        kv_start = 0 if cfg.mla is not None else rank * kv
    else:  # fewer KV heads than ranks: each rank one KV head, replicated (QKVParallelLinear)
        replicas = div(tp, cfg.num_kv_heads, "ranks per KV head", "tp") if tp % cfg.num_kv_heads == 0 else 0
        if not replicas:
            raise InputError(f"{name}'s {cfg.num_kv_heads} KV heads cannot be replicated over {tp} ranks", field="tp")
        kv, kv_start = 1, rank // replicas
    inter = div(cfg.intermediate_size, tp, "MLP intermediate size", "tp") if cfg.moe is None or cfg.moe.dense_layers else 0
    moe_inter = experts = expert_start = shared = 0
    if cfg.moe is not None:
        moe_tp = tp // ep
        if ep > cfg.moe.num_experts:
            raise InputError(f"{name} has {cfg.moe.num_experts} experts, fewer than {ep} expert-parallel ranks", field="ep")
        experts = div(cfg.moe.num_experts, ep, "routed experts", "ep")
        expert_start = (rank // moe_tp) * experts
        moe_inter = div(cfg.moe.intermediate_size, moe_tp, "expert intermediate size", "tp")
        shared = div(cfg.moe.shared_intermediate_size, tp, "shared expert's intermediate size", "tp")
    vocab = padded_vocab(cfg.vocab_size, tp) // tp
    return RankDims(
        tp, rank, ep, heads, rank * heads, kv, kv_start, inter, moe_inter, experts, expert_start, shared, vocab, rank * vocab
    )


_TINY_VISION = VisionConfig(hidden_size=32, image_token_id=500, vision_start_id=501, vision_end_id=502, deepstack=2)
_QWEN3_MOE_128 = MoeConfig(num_experts=128, top_k=8, intermediate_size=768, norm_topk_prob=True)

PRESETS: dict[str, DecoderConfig] = {
    # For CPU tests: runs a forward in milliseconds.
    "tiny": DecoderConfig("tiny", 512, 64, 128, 2, 4, 2, 16, rope_theta=10_000.0, max_context=16384),
    # A Qwen3-MoE-shaped model for CPU tests: 8 experts, top 2.
    "tiny-moe": DecoderConfig(
        "tiny-moe",
        512,
        64,
        128,
        2,
        4,
        2,
        16,
        rope_theta=10_000.0,
        max_context=16384,
        moe=MoeConfig(num_experts=8, top_k=2, intermediate_size=32),
        architecture="Qwen3MoeForCausalLM",
    ),
    "qwen3-0.6b": DecoderConfig(
        "qwen3-0.6b", 151936, 1024, 3072, 28, 16, 8, 128, tie_embeddings=True, stands_for="Qwen/Qwen3-0.6B"
    ),
    "qwen3-8b": DecoderConfig("qwen3-8b", 151936, 4096, 12288, 36, 32, 8, 128, stands_for="Qwen/Qwen3-8B"),
    # Qwen/Qwen3-30B-A3B's config.json: 48 layers of 128 experts (top 8, 768 wide), 32 query
    # and 4 KV heads of 128.
    "qwen3-30b-a3b": DecoderConfig(
        "qwen3-30b-a3b",
        151936,
        2048,
        6144,
        48,
        32,
        4,
        128,
        moe=_QWEN3_MOE_128,
        architecture="Qwen3MoeForCausalLM",
        stands_for="Qwen/Qwen3-30B-A3B",
    ),
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
        "qwen3-vl-8b",
        151936,
        4096,
        12288,
        36,
        32,
        8,
        128,
        vision=VisionConfig(deepstack=3),
        max_context=262144,
        stands_for="Qwen/Qwen3-VL-8B-Instruct",
    ),
    # Qwen/Qwen3-VL-30B-A3B-Instruct's text model (the MoE of qwen3-30b-a3b, rope theta 5e6,
    # 262k context) behind Qwen3-VL's vision geometry with DeepStack at three layers.
    "qwen3-vl-30b-a3b": DecoderConfig(
        "qwen3-vl-30b-a3b",
        151936,
        2048,
        6144,
        48,
        32,
        4,
        128,
        rope_theta=5_000_000.0,
        vision=VisionConfig(hidden_size=1152, deepstack=3),
        max_context=262144,
        moe=_QWEN3_MOE_128,
        architecture="Qwen3VLMoeForConditionalGeneration",
        stands_for="Qwen/Qwen3-VL-30B-A3B-Instruct",
    ),
}


def preset(name: str, **overrides) -> DecoderConfig:
    if name not in PRESETS:
        raise InputError(f"unknown built-in model {name!r} (one of {', '.join(PRESETS)})", field="model")
    cfg = PRESETS[name]
    return replace(cfg, **overrides) if overrides else cfg


# ---------------------------------------------------------------------------------------
# a Hugging Face config.json
# ---------------------------------------------------------------------------------------
def read_config(path: str | Path, where: str) -> dict[str, Any]:
    """config.json read once, bounded (4 MiB, fileio.read_input), as a JSON object."""
    from bcgtune.fileio import read_input

    raw = read_input(str(path), "config.json", _CONFIG_MAX_BYTES)
    try:
        cfg = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise InputError("config.json is not valid JSON", where) from None
    if not isinstance(cfg, dict):
        raise InputError("config.json must hold an object", where)
    return cfg


class _Fields:
    """A config's fields as the shape reads them: the text model's (a vision-language config
    nests it in text_config) over the top level's, each checked for its type and bounds."""

    def __init__(self, raw: dict[str, Any], where: str):
        text = raw.get("text_config")
        self.top = raw
        self.cfg = {**raw, **text} if isinstance(text, dict) else dict(raw)
        self.where = where

    def has(self, key: str) -> bool:
        return self.cfg.get(key) is not None

    def num(self, key: str, default: int | None = None, *, lo: int = 1, hi: int = _MAX_DIM, needed: str = "") -> int:
        v = self.cfg.get(key)
        if v is None:
            if default is not None:
                return default
            raise InputError(f"config.json lacks {key}{needed}: bcgtune cannot build this model's shape", self.where)
        if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
            raise InputError(f"{key} must be an integer from {lo} to {hi}, got {str(v)[:40]!r}", self.where)
        return v

    def real(self, key: str, default: float) -> float:
        v = self.cfg.get(key)
        if v is None:
            return default
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < float(v) < 1e12:
            raise InputError(f"{key} must be a positive number, got {str(v)[:40]!r}", self.where)
        return float(v)

    def flag(self, key: str, default: bool) -> bool:
        v = self.cfg.get(key)
        return default if v is None else bool(v)

    def nums(self, key: str) -> tuple[int, ...]:
        v = self.cfg.get(key)
        if v is None:
            return ()
        if not isinstance(v, list) or not all(isinstance(x, int) and not isinstance(x, bool) for x in v) or len(v) > _MAX_LAYERS:
            raise InputError(f"{key} must be a list of integers", self.where)
        return tuple(int(x) for x in v)


# Features a config may declare that change the forward in ways bcgtune does not build: the
# field that declares it, and what it is.
def sliding_window(cfg: dict[str, Any]) -> str | None:
    """The field that puts a window on attention, when one does: use_sliding_window (Qwen),
    or a sliding_window smaller than the context without that switch (Mistral)."""
    if cfg.get("use_sliding_window"):
        return "use_sliding_window"
    sw, ctx = cfg.get("sliding_window"), cfg.get("max_position_embeddings")
    if "use_sliding_window" not in cfg and isinstance(sw, int) and not isinstance(sw, bool) and sw > 0:
        if not isinstance(ctx, int) or sw < ctx:
            return "sliding_window"
    return None


def _refuse_unbuilt(f: _Fields) -> None:
    cfg = f.cfg
    window = sliding_window(cfg)
    if window:
        raise InputError(f"sliding-window attention ({window}) is not built by bcgtune", f.where)
    kinds = cfg.get("layer_types")
    if isinstance(kinds, list) and any(k != "full_attention" for k in kinds):
        other = sorted({str(k)[:40] for k in kinds if k != "full_attention"})
        raise InputError(f"layer_types holds {', '.join(other)} layers: bcgtune builds full attention only", f.where)
    if cfg.get("attention_chunk_size"):
        raise InputError("chunked attention (attention_chunk_size) is not built by bcgtune", f.where)
    for key in ("linear_num_key_heads", "linear_conv_kernel_dim", "mamba_d_state", "ssm_cfg"):
        if cfg.get(key) is not None:
            raise InputError(f"{key}: linear-attention or state-space layers are not built by bcgtune", f.where)


def _moe_of(f: _Fields, layers: int) -> MoeConfig | None:
    experts_key = next((k for k in ("num_experts", "n_routed_experts", "num_local_experts") if f.has(k)), None)
    if experts_key is None or f.cfg.get(experts_key) in (0, None):
        return None
    need = " (an MoE config names its experts' width)"
    experts = f.num(experts_key, lo=1, hi=_MAX_EXPERTS)
    top_k = f.num("num_experts_per_tok", lo=1, hi=experts, needed=" (how many experts each token runs)")
    width = f.num("moe_intermediate_size", needed=need) if experts_key != "num_local_experts" else f.num("intermediate_size")
    if experts_key == "n_routed_experts":  # DeepSeek-V2/V3
        first = f.num("first_k_dense_replace", 0, lo=0, hi=layers)
        freq = f.num("moe_layer_freq", 1, hi=layers)
        dense = tuple(i for i in range(layers) if i < first or i % freq)
        method = str(f.cfg.get("topk_method") or "greedy")
        scoring = str(f.cfg.get("scoring_func") or "softmax")
        if scoring not in ("softmax", "sigmoid"):
            raise InputError(f"scoring_func {scoring[:40]!r} is not built (softmax or sigmoid)", f.where)
        n_group = f.num("n_group", 1, hi=experts) if method in ("group_limited_greedy", "noaux_tc") else 1
        topk_group = f.num("topk_group", 1, hi=n_group) if n_group > 1 else 1
        if experts % n_group:
            raise InputError(f"n_group {n_group} does not divide the {experts} experts", f.where)
        return MoeConfig(
            num_experts=experts,
            top_k=top_k,
            intermediate_size=width,
            shared_intermediate_size=width * f.num("n_shared_experts", 0, lo=0, hi=_MAX_EXPERTS),
            norm_topk_prob=f.flag("norm_topk_prob", False),
            scoring=scoring,
            n_group=n_group,
            topk_group=topk_group,
            routed_scaling_factor=f.real("routed_scaling_factor", 1.0),
            correction_bias=method == "noaux_tc",
            dense_layers=dense,
        )
    step = f.num("decoder_sparse_step", 1, hi=layers)
    only = set(f.nums("mlp_only_layers"))
    dense = tuple(i for i in range(layers) if i in only or (i + 1) % step)
    shared = f.num("shared_expert_intermediate_size", 0, lo=0)
    return MoeConfig(
        num_experts=experts,
        top_k=top_k,
        intermediate_size=width,
        shared_intermediate_size=shared,
        shared_gate=shared > 0,
        # Mixtral renormalizes the top-k (a softmax over them); Qwen's configs say
        norm_topk_prob=True if experts_key == "num_local_experts" else f.flag("norm_topk_prob", False),
        dense_layers=dense,
    )


def _mla_of(f: _Fields) -> MlaConfig | None:
    if f.cfg.get("kv_lora_rank") is None:
        return None
    q_rank = f.cfg.get("q_lora_rank")
    return MlaConfig(
        q_lora_rank=None if q_rank is None else f.num("q_lora_rank"),
        kv_lora_rank=f.num("kv_lora_rank"),
        qk_nope_head_dim=f.num("qk_nope_head_dim"),
        qk_rope_head_dim=f.num("qk_rope_head_dim"),
        v_head_dim=f.num("v_head_dim"),
    )


def _rope(f: _Fields) -> tuple[float, Any]:
    """(rope theta, the rope scaling table) wherever the config keeps them (transformers 5
    moved them into rope_parameters)."""
    params = f.cfg.get("rope_parameters")
    scaling = f.cfg.get("rope_scaling")
    theta = f.cfg.get("rope_theta")
    if isinstance(params, dict):
        theta = params.get("rope_theta", theta)
        scaling = scaling if isinstance(scaling, dict) else params
    if theta is None:
        theta = 10_000.0
    if isinstance(theta, bool) or not isinstance(theta, (int, float)) or not 0 < float(theta) < 1e15:
        raise InputError(f"rope_theta must be a positive number, got {str(theta)[:40]!r}", f.where)
    return float(theta), scaling if isinstance(scaling, dict) else None


def _vision_of(f: _Fields, head_dim: int, scaling: Any) -> tuple[VisionConfig | None, tuple[int, int, int]]:
    vcfg = f.top.get("vision_config")
    if not isinstance(vcfg, dict):
        return None, (24, 20, 20)
    v = _Fields(vcfg, f.where)
    section = scaling.get("mrope_section") if isinstance(scaling, dict) else None
    if not (isinstance(section, list) and len(section) == 3 and all(isinstance(x, int) and x >= 0 for x in section)):
        raise InputError("a vision-language config needs rope_scaling.mrope_section (three integers)", f.where)
    if sum(section) != head_dim // 2:
        raise InputError(f"mrope_section {section} must sum to head_dim/2 = {head_dim // 2}", f.where)
    indexes = vcfg.get("deepstack_visual_indexes")
    top = _Fields(f.top, f.where)
    vision = VisionConfig(
        patch_size=v.num("patch_size", 16),
        merge_size=v.num("spatial_merge_size", 2),
        in_channels=v.num("in_channels", 3, hi=64),
        hidden_size=v.num("hidden_size", 1024),
        image_token_id=top.num("image_token_id", 151655, lo=0, hi=_MAX_VOCAB),
        vision_start_id=top.num("vision_start_token_id", 151652, lo=0, hi=_MAX_VOCAB),
        vision_end_id=top.num("vision_end_token_id", 151653, lo=0, hi=_MAX_VOCAB),
        deepstack=len(indexes) if isinstance(indexes, list) else 0,
    )
    return vision, (int(section[0]), int(section[1]), int(section[2]))


def shape_from_config(raw: dict[str, Any], name: str, where: str) -> DecoderConfig:
    """The shape a Hugging Face config.json describes, as bcgtune builds it with random
    weights; a config it cannot build is refused naming the field (InputError, exit 2)."""
    f = _Fields(raw, where)
    _refuse_unbuilt(f)
    h = f.num("hidden_size")
    layers = f.num("num_hidden_layers", hi=_MAX_LAYERS)
    heads = f.num("num_attention_heads", hi=65536)
    kv = f.num("num_key_value_heads", heads, hi=heads)
    if heads % kv:
        raise InputError(f"num_key_value_heads {kv} does not divide num_attention_heads {heads}", where)
    vocab = f.num("vocab_size", hi=_MAX_VOCAB)
    mla = _mla_of(f)
    head_dim = f.num("head_dim", h // heads if h % heads == 0 else None, hi=4096) if mla is None else mla.qk_head_dim
    moe = _moe_of(f, layers)
    dense_needed = moe is None or bool(moe.dense_layers)
    inter = f.num("intermediate_size", needed=" (the dense MLP's width)") if dense_needed else f.num("intermediate_size", 0, lo=0)
    theta, scaling = _rope(f)
    vision, section = _vision_of(f, head_dim, scaling)
    model_type = str(f.cfg.get("model_type") or f.top.get("model_type") or "")
    archs = f.top.get("architectures")
    arch = str(archs[0])[:100] if isinstance(archs, list) and archs else (model_type or "unknown")
    return DecoderConfig(
        name=name,
        vocab_size=vocab,
        hidden_size=h,
        intermediate_size=inter,
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=kv if mla is None else heads,
        head_dim=head_dim,
        rope_theta=theta,
        rms_eps=f.real("rms_norm_eps", 1e-6),
        tie_embeddings=f.flag("tie_word_embeddings", False),
        vision=vision,
        mrope_section=section,
        max_context=f.num("max_position_embeddings", 40960, hi=1 << 31),
        moe=moe,
        mla=mla,
        qk_norm=model_type.startswith("qwen3"),
        architecture=arch,
        stands_for=str(f.top.get("_name_or_path"))[:200] if isinstance(f.top.get("_name_or_path"), str) else None,
    )


def config_path(model: str) -> Path | None:
    """The config.json a --model value names: PATH/config.json itself, or a folder holding
    one; None for anything else (a built-in name)."""
    if model.endswith(".json") or os.path.isfile(model):
        return Path(model)
    if os.path.isdir(model):
        return Path(model) / "config.json"
    return None


def has_weights(folder: Path) -> bool:
    """Does a checkpoint folder hold weights (safetensors or PyTorch bins)?"""
    return any(folder.glob("*.safetensors")) or any(folder.glob("*.bin")) or any(folder.glob("*.safetensors.index.json"))
