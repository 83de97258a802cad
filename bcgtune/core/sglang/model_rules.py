"""What SGLang 0.5.23 reads from a model's config.json when it decides a launch's prefill
graphs, as pure functions of the config (a dict) and the launch's own switches.

Must match SGLang (sglang 0.5.23, srt/configs/model_config.py unless said otherwise):
  * is_multimodal / is_multimodal_breakable_cuda_graph_supported (ModelConfig.__init__,
    is_multimodal_model, is_multimodal_breakable_cuda_graph_supported), with the lists in
    bcgtune.core.sglang.tables
  * uses_kda_attention, is_deepseek_v4
  * the context length: utils/hf_transformers/common.py, get_context_length, and
    ModelConfig._derive_context_length (a --context-length above it is refused)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from bcgtune.core.sglang.tables import (
    ARCH_SPECIFIC_RULES,
    MIMO_V2_MULTIMODAL_ARCHS,
    MULTIMODAL_ARCHS,
    MULTIMODAL_BREAKABLE_ARCHS,
    MULTIMODAL_OFF_BY_DEFAULT_ARCHS,
)

DEEPSEEK_V3_ARCH = "DeepseekV3ForCausalLM"
# model_hook.py, handle_model_specific_adjustments: the DeepSeek-family branch (its attention
# backend, and prefill context parallelism's effect on prefill graphs)
DEEPSEEK_FAMILY_ARCHS = (
    "DeepseekV3ForCausalLM",
    "DeepseekV32ForCausalLM",
    "KimiK25ForConditionalGeneration",
    "MistralLarge3ForCausalLM",
    "PixtralForConditionalGeneration",
    "GlmMoeDsaForCausalLM",
    "Glm5NextForConditionalGeneration",
    "HYV4ForCausalLM",
    "HYV4ForCausalLMNextN",
    "LongcatFlashForCausalLM",
    "Dots3NoteForCausalLM",
)
# srt/configs/model_config.py, is_deepseek_dsa: DeepSeek sparse attention (DSA) models, when
# their config sets index_topk
DSA_ARCHS = (
    "DeepseekV3ForCausalLM",
    "DeepseekV32ForCausalLM",
    "DeepseekV3ForCausalLMNextN",
    "MistralLarge3ForCausalLM",
    "PixtralForConditionalGeneration",
    "GlmMoeDsaForCausalLM",
    "GlmMoeDsaForCausalLMNextN",
    "Glm5NextForConditionalGenerationNextN",
    "Glm5NextForConditionalGeneration",
    "LongcatFlashForCausalLM",
    "LongcatFlashForCausalLMNextN",
    "Dots3NoteForCausalLM",
    "Dots3NoteForCausalLMNextN",
    "HYV4ForCausalLM",
    "HYV4ForCausalLMNextN",
)
DEEPSEEK_V4_ARCHS = ("DeepseekV4ForCausalLM", "DeepseekV4ForCausalLMNextN", "DeepseekV4ForCausalLMDSpark")
# cuda_graph_hook.py, disable_breakable_cudagraph_if_incompatible: KDA models stay off,
# except this one (validated with breakable graphs)
KDA_BREAKABLE_ARCH = "Glm5NextForConditionalGeneration"
# cuda_graph_hook.py, apply_inkling_prefill_cuda_graph_default: full prefill graphs by default
INKLING_ARCHS = ("InklingForConditionalGeneration", "InklingForConditionalGenerationMTP")
# cuda_graph_hook.py, apply_muse_glimmer_prefill_cuda_graph_max_bs_default: ladder max 512
MUSE_GLIMMER_ARCHS = ("MuseGlimmerForCausalLM", "MuseGlimmerForConditionalGeneration")
MUSE_GLIMMER_MAX_BS = 512
# utils/hf_transformers/common.py, CONTEXT_LENGTH_KEYS (the order is SGLang's preference)
CONTEXT_LENGTH_KEYS = ("max_sequence_length", "seq_length", "max_seq_len", "model_max_length", "max_position_embeddings")
DEFAULT_CONTEXT_LENGTH = 2048

# Places in SGLang's launch resolution that name an architecture (sglang_tables) whose
# effect on the prefill capture this model covers, or that act only with a launch flag
# whose rules the model names on its own (FLAG_RULES in bcgtune.core.sglang.capture). The value:
# the architectures it was reviewed for ("*": every one).
REVIEWED_ARCH_SITES: dict[str, tuple[str, ...]] = {
    # the DeepSeek-V3 trtllm_mla rule and its sm100 attention default are modelled
    "srt/arg_groups/cuda_graph_hook.py:disable_prefill_cuda_graph_for_deepseek_trtllm_mla": ("*",),
    "srt/arg_groups/model_overrides/deepseek_v2.py:_deepseek_family_overrides": (DEEPSEEK_V3_ARCH,),
    # DeepSeek-V3: only prefill context parallelism (--enable-prefill-cp, named on its own)
    "srt/arg_groups/model_hook.py:handle_model_specific_adjustments": (DEEPSEEK_V3_ARCH,),
    # MoE runner and quantization choices: no prefill graph setting
    "srt/arg_groups/overrides.py:_deepseek_moe_quant_resolution": ("*",),
    # modelled: the KDA exemption, the Inkling and MuseGlimmer defaults
    "srt/arg_groups/cuda_graph_hook.py:disable_breakable_cudagraph_if_incompatible": ("*",),
    "srt/arg_groups/cuda_graph_hook.py:apply_inkling_prefill_cuda_graph_default": ("*",),
    "srt/arg_groups/cuda_graph_hook.py:apply_muse_glimmer_prefill_cuda_graph_max_bs_default": ("*",),
    # act only with their flags (speculative decoding, deterministic inference, encoder
    # disaggregation), which the model names when present
    "srt/arg_groups/speculative_hook.py:_handle_eagle_family": ("*",),
    "srt/arg_groups/attention_hook.py:handle_deterministic_inference": ("*",),
    "srt/arg_groups/pd_disaggregation_hook.py:handle_encoder_disaggregation": ("*",),
}


@dataclass(frozen=True)
class ModelFacts:
    """What SGLang's launch resolution reads from the model's config. `multimodal` /
    `multimodal_breakable`: SGLang serves it as multimodal / lets it keep breakable prefill
    graphs; `kda`: KDA hybrid linear attention outside SGLang's exemption; `context_len`:
    the context length SGLang derives; `arch_rules`: places in SGLang's resolution that
    may change this model's capture and that bcgtune does not model."""

    architectures: tuple[str, ...]
    model_type: str | None
    multimodal: bool
    multimodal_breakable: bool
    kda: bool
    deepseek_v4: bool
    mla: bool
    context_len: int
    arch_rules: tuple[str, ...] = ()
    dsa: bool = False  # DeepSeek sparse attention (is_deepseek_dsa)

    @property
    def arch(self) -> str | None:
        return self.architectures[0] if self.architectures else None


def _sub(config: Mapping[str, Any], key: str) -> Mapping[str, Any] | None:
    v = config.get(key)
    return v if isinstance(v, Mapping) else None


def text_config(config: Mapping[str, Any]) -> Mapping[str, Any]:
    """The language model's part of a config (its `text_config`, else the config)."""
    return _sub(config, "text_config") or config


def uses_kda_attention(config: Mapping[str, Any]) -> bool:
    """model_config.py, uses_kda_attention: KDA layers in linear_attn_config, or linear
    attention layers with KDA's head settings, in the config or its text config."""
    for cfg in (config, text_config(config)):
        lin = _sub(cfg, "linear_attn_config")
        if lin is not None and lin.get("kda_layers"):
            return True
        layer_types = cfg.get("layer_types") or []
        if (
            isinstance(layer_types, list)
            and "linear_attention" in layer_types
            and cfg.get("linear_num_heads") is not None
            and cfg.get("linear_head_dim") is not None
        ):
            return True
    return False


def derived_context_length(config: Mapping[str, Any]) -> int:
    """utils/hf_transformers/common.py, get_context_length on the text config: the first of
    CONTEXT_LENGTH_KEYS, times the rope scaling factor (none for llama3 scaling or when the
    original length is given); 2048 when none is set."""
    cfg = text_config(config)
    rope = _sub(cfg, "rope_scaling")
    factor: float = 1
    if rope:
        f = rope.get("factor", 1)
        factor = f if isinstance(f, (int, float)) and not isinstance(f, bool) else 1
        if "original_max_position_embeddings" in rope or rope.get("rope_type") == "llama3":
            factor = 1
    for key in CONTEXT_LENGTH_KEYS:
        val = cfg.get(key)
        if isinstance(val, (int, float)) and not isinstance(val, bool):
            return int(factor * val)
    return DEFAULT_CONTEXT_LENGTH


def _multimodal_enabled(archs: tuple[str, ...], config: Mapping[str, Any], enable_multimodal: bool | None) -> bool:
    """ModelConfig.__init__: --enable-multimodal, else on unless the architecture keeps it
    off by default (or a MiMo-V2 config without both vision and audio configs)."""
    if enable_multimodal is not None:
        return enable_multimodal
    arch = archs[0] if archs else None
    if arch in MULTIMODAL_OFF_BY_DEFAULT_ARCHS:
        return False
    if arch in MIMO_V2_MULTIMODAL_ARCHS and not ("vision_config" in config and "audio_config" in config):
        return False
    return True


def unmodelled_arch_rules(archs: tuple[str, ...]) -> tuple[str, ...]:
    """The places in SGLang's resolution that name one of `archs`, may change its capture,
    and are not covered by this model."""
    out = []
    for arch in archs:
        for site in ARCH_SPECIFIC_RULES.get(arch, ()):
            reviewed = REVIEWED_ARCH_SITES.get(site, ())
            if "*" in reviewed or arch in reviewed:
                continue
            out.append(f"{arch}: {site}")
    return tuple(dict.fromkeys(out))


def model_facts(
    config: Mapping[str, Any], *, enable_multimodal: bool | None = None, language_model_only: bool = False
) -> ModelFacts:
    """The facts SGLang's launch resolution reads from a config.json."""
    raw = config.get("architectures")
    archs = tuple(a for a in raw if isinstance(a, str)) if isinstance(raw, list) else ()
    model_type = config.get("model_type") if isinstance(config.get("model_type"), str) else None
    mm_on = _multimodal_enabled(archs, config, enable_multimodal)
    lm_only = language_model_only or bool(config.get("language_model_only"))
    vision_layers = config.get("vision_n_layers")
    dsv41_vision = model_type == "deepseek_v41" and isinstance(vision_layers, int) and vision_layers > 0
    multimodal = mm_on and not lm_only and (any(a in MULTIMODAL_ARCHS for a in archs) or dsv41_vision)
    mla = any(bool(cfg.get("kv_lora_rank")) for cfg in (config, text_config(config)))
    return ModelFacts(
        architectures=archs,
        model_type=model_type,
        multimodal=multimodal,
        multimodal_breakable=mm_on and any(a in MULTIMODAL_BREAKABLE_ARCHS for a in archs),
        kda=uses_kda_attention(config) and KDA_BREAKABLE_ARCH not in archs,
        deepseek_v4=bool(archs) and archs[0] in DEEPSEEK_V4_ARCHS,
        mla=mla,
        context_len=derived_context_length(config),
        arch_rules=unmodelled_arch_rules(archs),
        dsa=bool(archs)
        and archs[0] in DSA_ARCHS
        and any(cfg.get("index_topk") is not None for cfg in (config, text_config(config))),
    )


def model_launch_defaults(
    facts: ModelFacts | None, *, backend_flag: str | None, disable_prefill_flag: bool, max_bs_flag: int | None
) -> tuple[str | None, int | None]:
    """cuda_graph_hook.py, apply_inkling_prefill_cuda_graph_default and
    apply_muse_glimmer_prefill_cuda_graph_max_bs_default (they run before the graph config
    is parsed, as if the flag had been given): Inkling defaults to full prefill graphs,
    MuseGlimmer to a ladder maximum of 512. Returns (backend flag, max_bs flag)."""
    arch = facts.arch if facts is not None else None
    if arch in INKLING_ARCHS and backend_flag is None and not disable_prefill_flag:
        backend_flag = "full"
    if arch in MUSE_GLIMMER_ARCHS and max_bs_flag is None:
        max_bs_flag = MUSE_GLIMMER_MAX_BS
    return backend_flag, max_bs_flag
